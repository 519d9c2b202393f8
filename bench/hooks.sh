#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Where magnet's cost is, per event group and per BPF program: iperf3
# between two network namespaces over veth (tbf at RATE on the sender's
# side, or unlimited with RATE=0), each configuration in turn within one
# round so that the machine's other load falls on all alike: a baseline (no
# tracer), `magnet record` with the default groups and with each group
# alone, and tcpdump -s 96 on the sender's veth. For each run it prints the
# bytes moved, CPU seconds per GB from /proc/stat (user+nice+system+irq+
# softirq, all CPUs), and with the tracer, per BPF program runs per packet
# (packets: both veth ends' tx_packets, a GSO packet counting once)
# and ns per run (kernel.bpf_stats_enabled), events per GB and trace bytes
# per GB. Needs root, iperf3, tcpdump, bpftool.
#   bench/hooks.sh [REPS] [SECONDS]; RATE=4gbit (default) or RATE=0;
#   CONFIGS="base default ip dev tcpdump" to choose ("old:default" with
#   MAGNET_OLD=path: another build, for before/after in one run;
#   "xad:default" with --xmit-at-device, "sop:default" with tcp_xmit
#   from sockops' per-segment callback (--disable-hook ip_egress),
#   "floor:default" with --hooks-only (every program returns at once),
#   "noemit:default" with --no-emit (every program does its work but
#   writes no record), "idle:default" records with no transfer: the
#   programs' runs for the host's other traffic, per second (on a shared
#   machine, to take them out of the others' figures: bench/hooksown.py),
#   "summary" records in summary mode at 1 s with its default groups,
#   "summary:GROUPS" with those).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench/hooks.sh: run as root" >&2; exit 1; }
REPS=${1:-3}
SECS=${2:-5}
RATE=${RATE:-4gbit}
PORT=${PORT:-5391} # recorded alone: other helpers' traffic stays out
# REC_PORT: the port magnet records (another one: every hook runs, none emits)
CONFIGS=${CONFIGS:-"base default sock tcp,tcpstate ip dev tcpdump"}
MAGNET=${MAGNET:-bin/magnet}
[ -x "$MAGNET" ] || { mkdir -p bin; go build -o bin/magnet ./cmd/magnet; }
tmp=$(mktemp -d /tmp/hooks.XXXXXX)
A=hooksa$$ B=hooksb$$
tracer=""
cleanup() {
	# A tracer still running (the script interrupted) ends with it.
	if [ -n "$tracer" ]; then kill -INT "$tracer" 2>/dev/null && wait "$tracer" 2>/dev/null; fi
	ip netns del $A 2>/dev/null || true
	ip netns del $B 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
trap "exit 1" INT TERM
. bench/lab.sh
lab_pair $A $B va vb 10.77.0 24
if [ "$RATE" != 0 ]; then
	ip netns exec $A tc qdisc add dev va root tbf rate "$RATE" burst 1mb latency 50ms
fi
ip netns exec $B iperf3 -s -p $PORT -D -1 >/dev/null 2>&1 || true
sysctl -qw kernel.bpf_stats_enabled=1

cpu() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
hz=$(getconf CLK_TCK)
# The programs one process holds (other tracers may run on the machine),
# by their ids in its file descriptors' fdinfo.
progs() { bpftool prog show -j 2>/dev/null | python3 -c '
import glob,json,sys
mine = set()
for f in glob.glob("/proc/%s/fdinfo/*" % sys.argv[1]):
    try:
        for l in open(f):
            if l.startswith("prog_id:"):
                mine.add(int(l.split()[1]))
    except OSError:
        pass
for p in json.load(sys.stdin):
    if p.get("id") in mine:
        print(p.get("id"), p.get("name",""), p.get("run_cnt",0), p.get("run_time_ns",0))' "${1:-none}"; }
# A process's own CPU time (user+system, ticks): the tracer's user space.
tcpu() { [ -n "$1" ] && awk '{print $14+$15}' /proc/$1/stat 2>/dev/null || echo 0; }
pkts() { echo $(( $(ip netns exec $A cat /sys/class/net/va/statistics/tx_packets) + $(ip netns exec $B cat /sys/class/net/vb/statistics/tx_packets) )); }

printf "%-10s %3s %8s %8s %9s %9s %9s %9s\n" config rep GB Gbit/s cpu_s/GB ev/GB traceMB/GB user_s/GB
for rep in $(seq 1 "$REPS"); do
	for cfg in $CONFIGS; do
		tracer=""
		rm -f "$tmp/t.mgt" "$tmp/ready"
		case $cfg in
		base) ;;
		tcpdump)
			ip netns exec $A tcpdump -i va -s 96 -w "$tmp/t.pcap" -q 2>/dev/null &
			tracer=$!; sleep 1 ;;
		*)
			# old:GROUPS records with $MAGNET_OLD (a build of another
			# commit), for a before/after comparison in one run.
			# xad:GROUPS records with --xmit-at-device (tcp_xmit read at
			# net_dev_queue instead of at IP egress); sop:GROUPS with
			# sockops' per-segment callback serving tcp_xmit;
			# floor:GROUPS attaches the groups' programs, which return at
			# once.
			bin=$MAGNET ev=$cfg extra=()
			case $cfg in
			old:*) bin=${MAGNET_OLD:?set MAGNET_OLD} ev=${cfg#old:} ;;
			xad:*) ev=${cfg#xad:} extra=(--xmit-at-device) ;;
			sop:*) ev=${cfg#sop:} extra=(--disable-hook ip_egress) ;;
			floor:*) ev=${cfg#floor:} extra=(--hooks-only) ;;
			noemit:*) ev=${cfg#noemit:} extra=(--no-emit) ;;
			idle:*) ev=${cfg#idle:} ;;
			esac
			sel=(-e "$ev")
			case $ev in
			summary) sel=(--summary=1s) ;;
			summary:*) sel=(--summary=1s -e "${ev#summary:}") ;;
			esac
			"$bin" record -q "${sel[@]}" "${extra[@]}" --port ${REC_PORT:-$PORT} -o "$tmp/t.mgt" --ready-file "$tmp/ready" >"$tmp/rec.out" 2>&1 &
			tracer=$!
			for _ in $(seq 100); do [ -e "$tmp/ready" ] && break; sleep 0.1; done ;;
		esac
		progs "$tracer" >"$tmp/p0"
		r0=$(tcpu "$tracer")
		p0=$(pkts); c0=$(cpu)
		if [ "${cfg%%:*}" = idle ]; then
			# No transfer: what the programs cost for the host's
			# other traffic alone (per second; "GB" is a second).
			sleep "$SECS"
			echo '{"end":{"sum_sent":{"bytes":'$((SECS * 125000000))'}}}' >"$tmp/ip.json"
		else
			ip netns exec $B iperf3 -s -p $PORT -D -1 >/dev/null 2>&1 || true
			sleep 0.2
			ip netns exec $A iperf3 -c 10.77.0.2 -p $PORT -t "$SECS" -J >"$tmp/ip.json"
		fi
		c1=$(cpu); p1=$(pkts)
		r1=$(tcpu "$tracer")
		progs "$tracer" >"$tmp/p1"
		if [ -n "$tracer" ]; then kill -INT "$tracer"; wait "$tracer" || true; tracer=""; fi
		bytes=$(python3 -c 'import json;print(json.load(open("'"$tmp/ip.json"'"))["end"]["sum_sent"]["bytes"])')
		gb=$(python3 -c "print($bytes/1e9)")
		evs=0; tb=0
		if [ -e "$tmp/t.mgt" ]; then
			tb=$(stat -c %s "$tmp/t.mgt")
			"$bin" parse "$tmp/t.mgt" 2>/dev/null | awk 'NR>1{n[$8]++}END{for(t in n)print t, n[t]}' >"$tmp/types"
			evs=$(awk '{s+=$2}END{print s+0}' "$tmp/types")
		fi
		python3 - "$cfg" "$rep" "$bytes" "$SECS" "$c0" "$c1" "$hz" "$evs" "$tb" "$((p1-p0))" "$((r1-r0))" "$tmp/p0" "$tmp/p1" <<'PY'
import sys
cfg, rep, b, secs, c0, c1, hz, evs, tb, pk, rc, f0, f1 = sys.argv[1:]
gb = int(b) / 1e9
cpu = (int(c1) - int(c0)) / int(hz)
print("%-10s %3s %8.2f %8.2f %9.3f %9.0f %9.2f %9.3f" % (cfg, rep, gb, int(b) * 8 / float(secs) / 1e9, cpu / gb, int(evs) / gb, int(tb) / 1e6 / gb, int(rc) / int(hz) / gb))
tot = 0
def load(f):
    d = {}
    for l in open(f):
        i, n, c, t = l.split()
        d[i] = (n, int(c), int(t))
    return d
a, z = load(f0), load(f1)
pk = max(int(pk), 1)
if int(evs):
    print("    events/GB: " + ", ".join("%s %.0f" % (t, int(n) / gb) for t, n in sorted((l.split() for l in open(f0.rsplit("/", 1)[0] + "/types")), key=lambda x: -int(x[1]))))
for i, (n, c, t) in sorted(z.items(), key=lambda x: x[1][0]):
    c0_, t0_ = a.get(i, (n, 0, 0))[1:]
    dc, dt = c - c0_, t - t0_
    if dc > 0 and cfg not in ("base", "tcpdump"):
        if cfg.startswith("idle:"):
            print("    %-22s runs/s %8.0f  ns/run %6.0f" % (n, dc / float(secs), dt / dc))
        else:
            print("    %-22s runs/pkt %6.2f  ns/run %6.0f  ms/GB %7.1f  runs %d  ns %d" % (n, dc / pk, dt / dc, dt / 1e6 / gb, dc, dt))
        tot += dt
if tot:
    print("    %-22s %33s %7.1f" % ("all programs", "ms/GB", tot / 1e6 / gb))
PY
	done
done
