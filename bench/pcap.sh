#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What recording with a pcap-filter expression that excludes the traffic
# costs that traffic, beside --port and no recorder, and writes
# bench/PCAP.md. Needs root (namespaces, BPF), iperf3, bpftool and jq.
#
#   bench/pcap.sh [REPS]          (default 5)
#
# Each repetition runs, in an order that rotates, two workloads between a
# client and a server namespace joined by a veth pair, under each
# configuration:
#   none   no recorder
#   port   magnet record --port 19999 (a port no workload uses)
#   expr   magnet record 'tcp port 19999 and net 10.99.0.0/16'
# The workloads: an iperf3 transfer of 2 GB (long flows: every packet is
# looked at and turned down), and 3 s of magnet workload send --churn (short
# connections: each socket's first sight is judged). The solid figures are
# the counts: events recorded (0 expected) and the recorder's program runs,
# and the programs' run time from the kernel's bpf_stats (run_time_ns of
# the recorder's own programs, so other tracers on the machine do not
# count). CPU time of all CPUs (/proc/stat) is noisy on a shared machine:
# it is reported with its spread.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench/pcap.sh: run as root (network namespaces and BPF)" >&2; exit 1; }
for t in iperf3 bpftool jq; do
	command -v "$t" >/dev/null || { echo "bench/pcap.sh: $t is needed" >&2; exit 1; }
done
REPS=${1:-5}
OUT=${OUT:-bench/PCAP.md}
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
mkdir -p bin
go build -o bin/magnet ./cmd/magnet
M=$PWD/bin/magnet
EXPR='tcp port 19999 and net 10.99.0.0/16'

stats_was=$(sysctl -n kernel.bpf_stats_enabled)
A=mgpcapb-a-$$ B=mgpcapb-b-$$
SUB=10.201.$(($$ % 250)).
TMP=$(mktemp -d)
cleanup() {
	[ -n "${SRV:-}" ] && kill "$SRV" 2>/dev/null || true
	[ -n "${CHURN:-}" ] && kill "$CHURN" 2>/dev/null || true
	ip netns del "$A" 2>/dev/null || true
	ip netns del "$B" 2>/dev/null || true
	sysctl -qw kernel.bpf_stats_enabled="$stats_was"
	rm -rf "$TMP"
}
trap cleanup EXIT
sysctl -qw kernel.bpf_stats_enabled=1
ip netns add "$A"
ip netns add "$B"
ip link add veth0 netns "$A" type veth peer name veth1 netns "$B"
ip -n "$A" addr add "${SUB}1/30" dev veth0
ip -n "$B" addr add "${SUB}2/30" dev veth1
ip -n "$A" link set veth0 up
ip -n "$B" link set veth1 up
ip -n "$A" link set lo up
ip -n "$B" link set lo up
ip netns exec "$B" iperf3 -s -p 5299 >/dev/null 2>&1 &
SRV=$!
ip netns exec "$B" "$M" workload serve --churn --listen "${SUB}2:5298" >/dev/null 2>&1 &
CHURN=$!
sleep 1 # both servers listen (iperf3 says nothing on a pipe)

# busy: CPU seconds of all CPUs so far (user+nice+system+irq+softirq).
busy() { awk '/^cpu /{printf "%.3f\n", ($2+$3+$4+$7+$8)/100}' /proc/stat; }
# progids: the ids of every loaded program, one a line.
progids() { bpftool prog show --json | jq -r '.[].id' | sort; }
# progstats IDS-FILE: "runs ns" of those programs. (bpftool here may not
# name the process that holds a program: a recorder's programs are those
# that appeared while it started.)
progstats() {
	bpftool prog show --json | jq -r --slurpfile ids <(jq -s . "$1") \
		'[.[] | select(.id as $i | $ids[0] | index($i))] | "\(map(.run_cnt // 0) | add // 0) \(map(.run_time_ns // 0) | add // 0)"'
}

one() { # config workload rep
	local cfg=$1 wl=$2 rep=$3 pid=0 r0=0 n0=0 r1=0 n1=0 events=0 c0 c1 amount
	rm -f "$TMP/ready" "$TMP/x.mgt"
	progids >"$TMP/before"
	case $cfg in
	port) "$M" record -q -o "$TMP/x.mgt" --ready-file "$TMP/ready" --port 19999 & pid=$! ;;
	expr) "$M" record -q -o "$TMP/x.mgt" --ready-file "$TMP/ready" "$EXPR" & pid=$! ;;
	esac
	if [ "$pid" -ne 0 ]; then
		for _ in $(seq 200); do [ -e "$TMP/ready" ] && break; sleep 0.05; done
		[ -e "$TMP/ready" ] || { echo "recorder did not start" >&2; exit 1; }
		progids | comm -13 "$TMP/before" - >"$TMP/ours"
		read -r r0 n0 < <(progstats "$TMP/ours")
	fi
	c0=$(busy)
	if [ "$wl" = bulk ]; then
		amount=$(ip netns exec "$A" iperf3 -c "${SUB}2" -p 5299 -n 2G -J | jq '.end.sum_received.bytes')
	else
		amount=$(ip netns exec "$A" "$M" workload send --churn 3s --size 100 --to "${SUB}2:5298" | sed -n 's/.* \([0-9]*\) connections.*/\1/p' | head -1)
	fi
	c1=$(busy)
	if [ "$pid" -ne 0 ]; then
		read -r r1 n1 < <(progstats "$TMP/ours")
		kill -INT "$pid"
		wait "$pid"
		events=$("$M" parse "$TMP/x.mgt" | tail -n +2 | wc -l)
	fi
	echo "$cfg $wl $rep $amount $(echo "$c1 - $c0" | bc) $((r1 - r0)) $((n1 - n0)) $events" >>"$TMP/rows"
	echo "rep $rep $wl $cfg: $amount, runs $((r1 - r0)), $((n1 - n0)) ns in programs, events $events" >&2
}

cfgs=(none port expr)
for rep in $(seq "$REPS"); do
	for wl in bulk churn; do
		for i in 0 1 2; do
			one "${cfgs[$(((i + rep) % 3))]}" "$wl" "$rep"
		done
	done
done

{
	echo "# Recording with an expression that excludes the traffic"
	echo
	echo "bench/pcap.sh $REPS on $(uname -r), $(nproc) CPUs, $(date -u +%Y-%m-%d). Configurations interleaved"
	echo "(rotating order), $REPS rounds. none: no recorder; port: \`magnet record --port 19999\`; expr:"
	echo "\`magnet record '$EXPR'\`. bulk: iperf3 -n 2G over a veth pair; churn:"
	echo "magnet workload send --churn 3s (one 100-byte request per TCP connection). Program runs and ns:"
	echo "the recorder's own programs (bpf_stats run_cnt, run_time_ns) during the workload; CPU: all CPUs'"
	echo "busy time (/proc/stat) over the workload, mean ± sd (the machine was shared: noisy)."
	echo
	echo "Program runs count every packet and socket event on the host, other tracers' and tests'"
	echo "traffic included, so they vary between rounds; ns per run (all rounds' ns / all rounds' runs)"
	echo "is what a run of the recorder's programs costs under the configuration."
	echo
	echo "| workload | config | per | events | program runs per | program ns per | ns per run | CPU ms per |"
	echo "|---|---|---|---:|---:|---:|---:|---:|"
	for wl in bulk churn; do
		for cfg in "${cfgs[@]}"; do
			awk -v c="$cfg" -v w="$wl" '$1==c && $2==w {
				k = (w == "bulk") ? $4 / 1e9 : $4 / 1000; n++
				ev += $8; runs += $6 / k; ns += $7 / k; tr += $6; tn += $7; cpu[n] = $5 * 1000 / k; s += cpu[n] }
				END { m = s / n; for (i = 1; i <= n; i++) v += (cpu[i] - m)^2
				printf "| %s | %s | %s | %d | %.0f | %.0f | %s | %.1f ± %.1f |\n", w, c, (w == "bulk") ? "GB" : "1000 connections", ev, runs / n, ns / n, tr ? sprintf("%.1f", tn / tr) : "-", m, sqrt(v / (n > 1 ? n - 1 : 1)) }' "$TMP/rows"
		done
	done
	echo
	echo "Each run (amount: bytes, or connections; CPU s of all CPUs; the recorder's program runs and ns):"
	echo
	echo "| config | workload | round | amount | CPU s | program runs | program ns | events |"
	echo "|---|---|---:|---:|---:|---:|---:|---:|"
	awk '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8 }' "$TMP/rows"
} >"$OUT"
cat "$OUT"
