#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What leaving magnet on costs: iperf3 through a 4 Gbit/s tbf between two
# network namespaces, CPU of all CPUs from /proc/stat per GB sent, under
#   baseline  no tracer
#   default   magnet record -o FILE --port P (the default groups, every event)
#   summary   magnet record --summary=1s -o FILE --port P (figures in the kernel)
#   flight    magnet record --flight 30s --trigger rtt>10s -o FILE --port P
#             (events kept in memory; the trigger never fires: the cost
#             between triggers)
#   flight2s  the same with a 2 s window (not in the default list): its
#             memory is reused after 2 s, the steady state within a run
# interleaved, in an order that rotates between repetitions. Prints a
# markdown table (mean ± sd over repetitions), the recorder's own CPU time
# per GB (its process: user space only, unaffected by the rest of the
# machine), what each recorder wrote (records per GB, trace bytes per GB)
# and, when kernel.bpf_stats_enabled is 1 (the script does not change it:
# it slows every BPF program on the host), its BPF programs' runs and run
# time per GB (bpftool, the programs its process holds). Needs root,
# iperf3; bpftool and jq for the program figures.
#
#   bench/alwayson.sh [--reps N] [--duration SECONDS] [--rate MBIT]
#                     [--magnet BINARY] [--configs a,b,...]
#
# /proc/stat counts every CPU's busy time (user+nice+system+irq+softirq+
# steal), so anything else running on the machine is in the figures: run it
# on a quiet machine, and read the baseline's spread as the noise floor.
# The BPF programs run for every socket and packet of the host (the port
# filter is applied in them), so their runs count other traffic too; their
# time per run is the steadier figure. The flight recorder allocates its
# memory during its first window (30 s): a run shorter than that measures
# its warm-up (pages touched for the first time), longer ones its steady
# state, in which chunks are reused.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench/alwayson.sh: run as root (network namespaces and BPF)" >&2; exit 1; }
command -v iperf3 >/dev/null || { echo "bench/alwayson.sh: needs iperf3" >&2; exit 1; }

reps=5 duration=10 rate=4000 magnet="" configs="baseline,default,summary,flight"
while [ $# -gt 0 ]; do
	case "$1" in
	--reps) reps=$2; shift 2 ;;
	--duration) duration=$2; shift 2 ;;
	--rate) rate=$2; shift 2 ;;
	--magnet) magnet=$(realpath "$2"); shift 2 ;;
	--configs) configs=$2; shift 2 ;;
	*) echo "bench/alwayson.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
for v in "$reps" "$duration" "$rate"; do
	case "$v" in '' | *[!0-9]*) echo "bench/alwayson.sh: $v: want a whole number" >&2; exit 2 ;; esac
done
work=$(mktemp -d /tmp/magnet-alwayson.XXXXXX)
ns=mgao$$
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
lab_pair "${ns}c" "${ns}s" veth0 veth1 10.203.0 30
# As netlab does: a bucket of 4 ms (at least 64 KiB, so GSO packets pass
# whole), a queue of 50 ms.
burst=$((rate * 1000 * 1000 / 8 * 4 / 1000))
[ "$burst" -ge 65536 ] || burst=65536
tc -n "${ns}c" qdisc replace dev veth0 root tbf rate "${rate}mbit" burst "$burst" latency 50ms

busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
hz=$(getconf CLK_TCK)
port=5301

stats=0
if [ "$(sysctl -n kernel.bpf_stats_enabled 2>/dev/null)" = 1 ] && command -v bpftool >/dev/null && command -v jq >/dev/null; then
	stats=1
fi

# progstats PID: "runs run_ns" of the BPF programs PID holds (the
# prog_id of each of its bpf-prog file descriptors).
progstats() {
	[ "$stats" = 1 ] || { echo "0 0"; return; }
	local ids
	ids=$(for fd in /proc/"$1"/fd/*; do
		[ "$(readlink "$fd" 2>/dev/null)" = "anon_inode:bpf-prog" ] &&
			sed -n 's/^prog_id:[[:space:]]*//p' /proc/"$1"/fdinfo/"${fd##*/}"
	done | sort -un | paste -sd, -)
	[ -n "$ids" ] || { echo "0 0"; return; }
	bpftool prog show -j | jq -r --argjson ids "[$ids]" \
		'[.[] | select(.id as $i | $ids | index($i))] | "\(map(.run_cnt // 0) | add // 0) \(map(.run_time_ns // 0) | add // 0)"'
}

# run CONFIG: one transfer under CONFIG; prints
# "config cpu_s gb records bytes recorder_cpu_s runs run_ns".
run() {
	local cfg=$1 out="$work/trace.mgt" pid="" ready="$work/ready" log="$work/rec.log"
	port=$((port + 1))
	rm -f "$ready" "$work"/trace*.mgt
	ip netns exec "${ns}s" iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
	local srv=$!
	case "$cfg" in
	baseline) ;;
	default) "$magnet" record -o "$out" --port "$port" --ready-file "$ready" 2>"$log" & pid=$! ;;
	summary) "$magnet" record --summary=1s -o "$out" --port "$port" --ready-file "$ready" 2>"$log" & pid=$! ;;
	flight) "$magnet" record --flight 30s --trigger 'rtt>10s' -o "$out" --port "$port" --ready-file "$ready" 2>"$log" & pid=$! ;;
	flight2s) "$magnet" record --flight 2s --trigger 'rtt>10s' -o "$out" --port "$port" --ready-file "$ready" 2>"$log" & pid=$! ;;
	*) echo "bench/alwayson.sh: unknown config $cfg" >&2; exit 2 ;;
	esac
	if [ -n "$pid" ]; then
		for _ in $(seq 600); do [ -e "$ready" ] && break; sleep 0.05; done
		[ -e "$ready" ] || { echo "bench/alwayson.sh: $cfg: recorder not ready: $(cat "$log")" >&2; exit 1; }
	fi
	sleep 0.3 # the server listens
	local b0 b1 json p0="0 0" p1="0 0"
	[ -z "$pid" ] || p0=$(progstats "$pid")
	b0=$(busy)
	json=$(ip netns exec "${ns}c" iperf3 -c 10.203.0.2 -p "$port" -t "$duration" -J)
	b1=$(busy)
	[ -z "$pid" ] || p1=$(progstats "$pid")
	wait "$srv" || true
	local records=0 bytes=0 rcpu=0
	if [ -n "$pid" ]; then
		kill -INT "$pid"
		wait "$pid" || true
		records=$(sed -n 's/^  events: \([0-9]*\).*/\1/p' "$log" | head -1)
		bytes=$(sed -n 's/^  file: *\([0-9]*\) bytes.*/\1/p' "$log" | head -1)
		# "CPU: 45ms getting ready, 1.2345s recording": the recording part.
		rcpu=$(sed -n 's/^  CPU: .* ready, \([0-9.]*\)\([mµu]*\)s recording.*/\1 \2/p' "$log" | head -1 |
			awk '{ v = $1; if ($2 == "m") v /= 1e3; else if ($2 == "µ" || $2 == "u") v /= 1e6; print v }')
	fi
	local sent
	sent=$(printf '%s' "$json" | sed -n 's/.*"bytes":[[:space:]]*\([0-9]*\).*/\1/p' | tail -1)
	read -r r0 t0 <<<"$p0"
	read -r r1 t1 <<<"$p1"
	awk -v c="$cfg" -v j=$((b1 - b0)) -v hz="$hz" -v b="$sent" -v r="${records:-0}" -v fb="${bytes:-0}" \
		-v rc="${rcpu:-0}" -v runs=$((r1 - r0)) -v rns=$((t1 - t0)) \
		'BEGIN { printf "%s %.3f %.3f %d %d %.4f %d %d\n", c, j / hz, b / 1e9, r, fb, rc, runs, rns }'
}

IFS=, read -ra cfgs <<<"$configs"
results="$work/results"
: >"$results"
for rep in $(seq "$reps"); do
	n=${#cfgs[@]}
	for i in $(seq 0 $((n - 1))); do
		run "${cfgs[$(((i + rep) % n))]}" | tee -a "$results" >&2
	done
done

echo "bench/alwayson.sh --reps $reps --duration $duration --rate $rate ($(uname -r), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
echo
echo "| config | CPU s per GB (all CPUs) | vs baseline | GB per run | recorder CPU ms per GB | records per GB | trace bytes per GB | BPF runs per GB | BPF ms per GB | BPF ns per run |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
awk -v stats="$stats" '
{ c = $1; v = $2 / $3; n[c]++; s[c] += v; ss[c] += v * v; gb[c] += $3; r[c] += $4 / $3; fb[c] += $5 / $3
  rc[c] += 1e3 * $6 / $3; runs[c] += $7 / $3; rns[c] += $8 / 1e6 / $3; rn[c] += $8; rr[c] += $7
  if (!(c in seen)) { seen[c] = 1; order[++k] = c } }
END {
	base = ("baseline" in n) ? s["baseline"] / n["baseline"] : 0
	for (i = 1; i <= k; i++) {
		c = order[i]; m = s[c] / n[c]; sd = sqrt(ss[c] / n[c] - m * m); if (sd != sd) sd = 0
		rel = base > 0 ? sprintf("%+.1f %%", 100 * (m - base) / base) : "-"
		bpf = stats == 1 && rr[c] > 0 ? sprintf("%.0f | %.1f | %.0f", runs[c] / n[c], rns[c] / n[c], rn[c] / rr[c]) : "- | - | -"
		printf "| %s | %.3f ± %.3f | %s | %.2f | %.1f | %.0f | %.0f | %s |\n", c, m, sd, rel, gb[c] / n[c], rc[c] / n[c], r[c] / n[c], fb[c] / n[c], bpf
	}
}' "$results"
