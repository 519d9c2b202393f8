#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the documented full accuracy grid of `magnet probe` and writes
# bench/PROBE.md: 100 Mbit/s and 1 Gbit/s bottlenecks, 10/30/60/90 %
# available, constant-rate and bursty cross traffic, 5 estimates per cell,
# each with a recorded TCP transfer for comparison, and 5 estimates on an
# unlimited path. Needs root. Extra arguments go to `magnet bench probe`
# (e.g. --reps 2, or --note "what else ran on the machine").
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench/probe.sh: run as root (network namespaces and BPF)" >&2; exit 1; }
./scripts/deps.sh
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
mkdir -p bin
go build -o bin/magnet ./cmd/magnet
exec ./bin/magnet bench probe --full -o bench/PROBE.md "$@"
