#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs magnet's documented full bench and writes lab/results/RESULTS.md. Needs root.
# Installs what the comparison needs (tcpdump, bpftrace) with apt when
# missing; a tool that still cannot run is reported as "not available" in
# the results, not an error. Extra arguments go to `magnet-lab bench` (e.g.
# --reps 3 --duration 3s for a shorter run).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "lab/scripts/run.sh: run as root (network namespaces and BPF)" >&2; exit 1; }
./scripts/deps.sh
need=()
command -v tcpdump >/dev/null || need+=(tcpdump)
command -v bpftrace >/dev/null || need+=(bpftrace)
if [ ${#need[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq || true
	# Best effort: a missing package is reported by the bench itself.
	apt-get install -y -qq "${need[@]}" >/dev/null || echo "lab/scripts/run.sh: could not install ${need[*]}; those configurations will be skipped" >&2
fi
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
mkdir -p bin
go build -o bin/magnet ./cmd/magnet
go build -o bin/magnet-lab ./lab/cmd/magnet-lab
exec ./bin/magnet-lab bench --full -o lab/results/RESULTS.md "$@"
