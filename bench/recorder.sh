#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What the recorder PROCESS costs: the CPU time of every thread of
# `magnet record` (/proc/PID/task/*/schedstat: run time in ns, measured by
# the scheduler at each switch, not sampled at ticks) per GB of iperf3
# traffic through a 4 Gbit/s tbf between two network namespaces, and per
# second while no traffic flows, for each mode:
#   default    magnet record --port P
#   flight     magnet record --flight 30s --trigger 'rtt>10s' --port P
#   summary    magnet record --summary=1s --port P
#   conn       magnet record --events conn --port P
#   hooks      magnet record --hooks-only --port P (programs attached, no event)
# With --before OLD, each mode runs under both binaries in one repetition,
# in an order that alternates (A/B under the same load). Writes a markdown
# report to stdout (bench/RECORDER.md is its output):
#
#   bench/recorder.sh [--reps N] [--duration S] [--idle S] [--rate MBIT]
#                     [--magnet NEW] [--before OLD] [--modes a,b,...]
#
# The process's CPU time does not include the BPF programs (they run in the
# context of the threads that send and receive) nor softirq time taken
# while a recorder thread ran, except by chance: it is the recorder's own
# work (reading the rings, writing the trace, its timers). The rest of the
# machine matters only through cache and frequency effects, so this figure
# is far steadier than whole-machine CPU; the load average is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench/recorder.sh: run as root (network namespaces and BPF)" >&2; exit 1; }
command -v iperf3 >/dev/null || { echo "bench/recorder.sh: needs iperf3" >&2; exit 1; }

reps=5 duration=4 idle=5 rate=4000 magnet="" before="" modes="default,flight,summary,conn,hooks"
while [ $# -gt 0 ]; do
	case "$1" in
	--reps) reps=$2; shift 2 ;;
	--duration) duration=$2; shift 2 ;;
	--idle) idle=$2; shift 2 ;;
	--rate) rate=$2; shift 2 ;;
	--magnet) magnet=$(realpath "$2"); shift 2 ;;
	--before) before=$(realpath "$2"); shift 2 ;;
	--modes) modes=$2; shift 2 ;;
	*) echo "bench/recorder.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
for v in "$reps" "$duration" "$idle" "$rate"; do
	case "$v" in '' | *[!0-9]*) echo "bench/recorder.sh: $v: want a whole number" >&2; exit 2 ;; esac
done
work=$(mktemp -d /tmp/magnet-recorder.XXXXXX)
ns=mgrc$$
cleanup() {
	ip netns del "${ns}c" 2>/dev/null || true
	ip netns del "${ns}s" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
if [ -z "$magnet" ]; then
	go build -o "$work/magnet" ./cmd/magnet
	magnet=$work/magnet
fi

. bench/lab.sh
lab_pair "${ns}c" "${ns}s" veth0 veth1 10.204.0 30
burst=$((rate * 1000 * 1000 / 8 * 4 / 1000))
[ "$burst" -ge 65536 ] || burst=65536
tc -n "${ns}c" qdisc replace dev veth0 root tbf rate "${rate}mbit" burst "$burst" latency 50ms

port=5401

# cpuns PID: run time of all of PID's threads, in ns.
cpuns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%d\n", s }'; }

# run BUILD MODE: prints "build mode idle_ns idle_s xfer_ns gb".
run() {
	local build=$1 mode=$2 bin out="$work/trace.mgt" ready="$work/ready" log="$work/rec.log"
	bin=$magnet
	[ "$build" = before ] && bin=$before
	port=$((port + 1))
	rm -f "$ready" "$work"/trace*.mgt
	local args=(record -o "$out" --port "$port" --ready-file "$ready")
	case "$mode" in
	default) ;;
	flight) args+=(--flight 30s --trigger 'rtt>10s') ;;
	summary) args+=(--summary=1s) ;;
	conn) args+=(--events conn) ;;
	hooks) args+=(--hooks-only) ;;
	*) echo "bench/recorder.sh: unknown mode $mode" >&2; exit 2 ;;
	esac
	"$bin" "${args[@]}" 2>"$log" &
	local pid=$!
	for _ in $(seq 600); do [ -e "$ready" ] && break; sleep 0.05; done
	[ -e "$ready" ] || { echo "bench/recorder.sh: $mode: recorder not ready: $(cat "$log")" >&2; exit 1; }
	ip netns exec "${ns}s" iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
	local srv=$!
	sleep 1 # the start-up's one-off work (learning sockets, first status) is over
	local i0 i1 t0 t1 s0 s1 json
	s0=$(date +%s%N)
	i0=$(cpuns "$pid")
	sleep "$idle"
	i1=$(cpuns "$pid")
	s1=$(date +%s%N)
	t0=$(cpuns "$pid")
	json=$(ip netns exec "${ns}c" iperf3 -c 10.204.0.2 -p "$port" -t "$duration" -J)
	t1=$(cpuns "$pid")
	wait "$srv" || true
	kill -INT "$pid"
	wait "$pid" || { echo "bench/recorder.sh: $mode: recorder failed: $(cat "$log")" >&2; exit 1; }
	local sent
	sent=$(printf '%s' "$json" | sed -n 's/.*"bytes":[[:space:]]*\([0-9]*\).*/\1/p' | tail -1)
	echo "$build $mode $((i1 - i0)) $(((s1 - s0) / 1000000)) $((t1 - t0)) $sent"
}

IFS=, read -ra ms <<<"$modes"
builds=(after)
[ -z "$before" ] || builds=(before after)
results="$work/results"
: >"$results"
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for rep in $(seq "$reps"); do
	for m in "${ms[@]}"; do
		if [ "${#builds[@]}" -eq 2 ] && [ $((rep % 2)) -eq 0 ]; then
			order=(after before)
		else
			order=("${builds[@]}")
		fi
		for b in "${order[@]}"; do run "$b" "$m" | tee -a "$results" >&2; done
	done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)

echo "# Recorder process CPU"
echo
echo "Generated by \`bench/recorder.sh --reps $reps --duration $duration --idle $idle --rate $rate\`$([ -z "$before" ] || echo " --before OLD") on $(date -u +%Y-%m-%d), $(uname -r), $(nproc) CPUs; load average $load0 before, $load1 after."
echo "CPU time of every thread of \`magnet record\` (schedstat); per GB over iperf3 transfers of ${duration} s at ${rate} Mbit/s (tbf), and per second over ${idle} s without traffic. Mean ± 95 % interval (t) over $reps runs."
echo
echo "| build | mode | ms per GB | ms CPU per s idle | GB per run |"
echo "|---|---|---:|---:|---:|"
awk '
function t(n) { return n <= 1 ? 0 : n == 2 ? 12.71 : n == 3 ? 4.30 : n == 4 ? 3.18 : n == 5 ? 2.78 : n == 6 ? 2.57 : n == 7 ? 2.45 : n == 8 ? 2.36 : n == 9 ? 2.31 : n <= 11 ? 2.23 : 2.0 }
function ci(s, ss, n,   m, v) { m = s / n; v = n > 1 ? (ss - n * m * m) / (n - 1) : 0; if (v < 0) v = 0; return t(n) * sqrt(v / n) }
{ k = $1 " " $2; if (!(k in n)) order[++K] = k
  n[k]++; g = $6 / 1e9; x = $5 / 1e6 / g; y = $3 / 1e6 / ($4 / 1e3)
  sx[k] += x; sxx[k] += x * x; sy[k] += y; syy[k] += y * y; gb[k] += g }
END {
	for (i = 1; i <= K; i++) {
		k = order[i]; split(k, p, " ")
		printf "| %s | %s | %.2f ± %.2f | %.3f ± %.3f | %.2f |\n", p[1], p[2], sx[k] / n[k], ci(sx[k], sxx[k], n[k]), sy[k] / n[k], ci(sy[k], syy[k], n[k]), gb[k] / n[k]
	}
}' "$results"
