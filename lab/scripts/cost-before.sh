#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Measures the per-event cost of an earlier recording path with today's
# bench harness, for the "before and after" tables of lab/results/RESULTS.md:
# builds this tree with bpf/, internal/probe and internal/record taken from
# BASE (a commit) into bin/magnet-before and bin/magnet-lab-before, runs
# `magnet-lab bench --cost --links none` with them and writes
# lab/results/cost-before.json. Needs root. Extra
# arguments go to `magnet-lab bench` (e.g. --reps 5 --duration 3s).
#
#   sudo lab/scripts/cost-before.sh 6d25c66 --reps 5 --duration 3s
#   sudo lab/scripts/run.sh --before lab/results/cost-before.json --label "this branch" \
#        --compare-with bin/magnet-before --compare-label "recording path of 6d25c66"
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "lab/scripts/cost-before.sh: run as root (network namespaces and BPF)" >&2; exit 1; }
[ $# -ge 1 ] || { echo "usage: lab/scripts/cost-before.sh BASE [magnet-lab bench flags]" >&2; exit 2; }
base=$(git rev-parse --short "$1")
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git archive HEAD | tar -x -C "$work"
rm -rf "$work/bpf" "$work/internal/probe" "$work/internal/record" "$work/internal/ring"
# internal/ring exists from the in-place reader on; older bases read rings in internal/record.
git archive "$base" bpf internal/probe internal/record $(git ls-tree -d --name-only "$base" internal/ring) | tar -x -C "$work"
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
mkdir -p bin
# magnet_nosynth: an earlier recording path cannot load the lab's
# synthetic-event programs beside its own.
(cd "$work" && go build -o "$OLDPWD/bin/magnet-before" ./cmd/magnet &&
	go build -tags magnet_nosynth -o "$OLDPWD/bin/magnet-lab-before" ./lab/cmd/magnet-lab)
bin/magnet-lab-before bench --magnet bin/magnet-before --cost --links none --json --label "recording path of $base" -o lab/results/cost-before.json "$@"
