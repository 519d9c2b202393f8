#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Regenerates bench/RESULTS.md: what recording costs on this host, the way
# users measure it (magnet bench; docs/BENCH.md, "The users' figure").
# Needs root. Installs iperf3, tcpdump, bpftrace and perf with apt when
# missing; a comparison tool that still cannot run is listed under "Not
# run" in the results, not an error. Run it on a quiet machine: the figures
# are the whole machine's CPU. Extra arguments go to `magnet bench` (e.g.
# --reps 2 --duration 2s for a quick look, which is not the documented run).
#
# By default 5 repetitions of 4 s: every configuration at 4 Gbit/s, the
# saturation configurations (docs/BENCH.md), and the bpf_stats diagnostics
# (the default groups, summary mode); about 2.5 minutes per repetition on
# 2 vCPUs. The figures in RESULTS.md come from
# `bench/cost.sh --reps 8 --goal-reps 20` (about 45 minutes): 20 more
# repetitions of only the configurations the goals compare, whose
# differences are smaller than what 10 repetitions resolve. bench/GOALS.md
# comes from the goals' configurations alone in drawn orders (the command
# is in its first lines and in docs/BENCH.md).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench/cost.sh: run as root (network namespaces and BPF)" >&2; exit 1; }
./scripts/deps.sh
need=()
command -v iperf3 >/dev/null || need+=(iperf3)
command -v tcpdump >/dev/null || need+=(tcpdump)
command -v bpftrace >/dev/null || need+=(bpftrace)
command -v perf >/dev/null || need+=(linux-perf)
if [ ${#need[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq || true
	# Best effort: a missing tool is reported by the bench itself.
	apt-get install -y -qq "${need[@]}" >/dev/null || echo "bench/cost.sh: could not install ${need[*]}; those configurations will be skipped" >&2
fi
# bpf_stats adds two clock reads to every BPF program run: the report says
# so when it is on, but the figures are then not the users'.
if [ "$(cat /proc/sys/kernel/bpf_stats_enabled 2>/dev/null || echo 0)" != 0 ]; then
	echo "bench/cost.sh: kernel.bpf_stats_enabled is on (every BPF program run is dearer); sysctl -w kernel.bpf_stats_enabled=0 first for the users' figure" >&2
fi
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
mkdir -p bin
go build -o bin/magnet ./cmd/magnet
exec ./bin/magnet bench -o bench/RESULTS.md "$@"
