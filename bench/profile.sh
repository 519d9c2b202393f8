#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Where the kernel's time goes while magnet records: iperf3 between two
# network namespaces over veth (tbf at RATE on the sender's side), the same
# transfer with nothing recording, with `record --hooks-only` (every program
# attached, each returning at once), `record --no-emit` (every program doing
# all its work but writing no record) and `record` (the default groups),
# each profiled by `perf record -a -g` (cpu-clock: this VM has no hardware
# counters, so no cache-miss figures), configurations interleaved in each
# round. For each run it prints the CPU milliseconds per GB the samples put
# in each part of the cost (self time of the sampled function):
#   bodies    the JITed programs (bpf_prog_<tag>_<name>), per program too
#   dispatch  what runs a program: tracepoint trampolines (bpf_trace_run*,
#             __bpf_trace_*), cgroup_skb's __cgroup_bpf_run_filter_skb,
#             migrate_disable/enable, RCU read side, bpf_prog_run's own
#   helpers   what programs call: sk storage, socket cookie, the clock,
#             skc_to_tcp_sock, ring buffers (the doorbell) and irq_work
#   recorder  magnet's own process (user and kernel)
#   other     the rest (the transfer itself)
#   foreign   programs of other tracers on the machine (not the recorder's
#             tags); their dispatch cannot be told from ours
# Only the samples of iperf3, the softirq threads, the idle task's
# interrupts and the recorder count: the machine's other load (and another
# recorder's programs run by other processes' traffic) stays out.
# Needs root, iperf3, perf.
#   bench/profile.sh [REPS] [SECONDS]; RATE=4gbit (default);
#   CONFIGS="base floor noemit default" to choose; FREQ=2999 (Hz per CPU).
#   KEEP=dir keeps each run's perf report there.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench/profile.sh: run as root" >&2; exit 1; }
REPS=${1:-2}
SECS=${2:-5}
RATE=${RATE:-4gbit}
FREQ=${FREQ:-2999}
PORT=${PORT:-5393}
CONFIGS=${CONFIGS:-"base floor noemit default"}
MAGNET=${MAGNET:-bin/magnet}
[ -x "$MAGNET" ] || { mkdir -p bin; go build -o bin/magnet ./cmd/magnet; }
tmp=$(mktemp -d /tmp/profile.XXXXXX)
A=profa$$ B=profb$$
tracer=""
: >"$tmp/tags"
cleanup() {
	if [ -n "$tracer" ]; then kill -INT "$tracer" 2>/dev/null && wait "$tracer" 2>/dev/null; fi
	ip netns del $A 2>/dev/null || true
	ip netns del $B 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
trap "exit 1" INT TERM
. bench/lab.sh
lab_pair $A $B va vb 10.78.0 24
ip netns exec $A tc qdisc add dev va root tbf rate "$RATE" burst 1mb latency 50ms
# JITed programs by name in the profile.
sysctl -qw net.core.bpf_jit_kallsyms=1

# The tags of the recorder's programs: a JITed function's symbol is
# bpf_prog_<tag>_<name> (each subprogram's own tag, which bpftool does not
# show), and another recorder on the machine runs programs of the same
# names. Ours are the symbols that appeared while it loaded, in this run or
# an earlier one: every configuration loads the same programs (the tags are
# of the instructions before the verifier sees the settings), and a
# program just unloaded may keep its symbol while the next one loads.
bpfsyms() { awk '$3 ~ /^bpf_prog_/ {print $3}' /proc/kallsyms | sort -u; }

# Another tracer's programs on the same hooks double the dispatch and run
# on this transfer's packets too: the figures are then not this recorder's.
if bpfsyms | grep -qE '_(tcp_probe|net_dev_queue|kevent_tp)$'; then
	echo "bench/profile.sh: warning: other BPF tracers are loaded (their programs and dispatch count here, as 'foreign' and in 'dispatch')" >&2
fi
printf "%-8s %3s %6s %8s %9s %9s %9s %9s %9s %9s\n" config rep GB busy_ms/GB bodies dispatch helpers recorder other foreign
for rep in $(seq 1 "$REPS"); do
	for cfg in $CONFIGS; do
		tracer=""
		rm -f "$tmp/ready"
		case $cfg in
		base) ;;
		floor|noemit|default)
			extra=()
			[ "$cfg" = floor ] && extra=(--hooks-only)
			[ "$cfg" = noemit ] && extra=(--no-emit)
			bpfsyms >"$tmp/syms0"
			"$MAGNET" record -q "${extra[@]}" --port $PORT -o "$tmp/t.mgt" --ready-file "$tmp/ready" >"$tmp/rec.out" 2>&1 &
			tracer=$!
			for _ in $(seq 100); do [ -e "$tmp/ready" ] && break; sleep 0.1; done
			bpfsyms | comm -13 "$tmp/syms0" - | cut -d_ -f3 >>"$tmp/tags" ;;
		*) echo "bench/profile.sh: unknown configuration $cfg" >&2; exit 1 ;;
		esac
		ip netns exec $B iperf3 -s -p $PORT -D -1 >/dev/null 2>&1 || true
		sleep 0.3
		perf record -q -F "$FREQ" -a -g -o "$tmp/perf.data" -- \
			ip netns exec $A iperf3 -c 10.78.0.2 -p $PORT -t "$SECS" -J >"$tmp/ip.json" 2>/dev/null
		tids="" tags=""
		if [ -n "$tracer" ]; then
			tids=$(ls /proc/$tracer/task | tr '\n' ,)
			tags=$(sort -u "$tmp/tags" | tr '\n' ,)
			kill -INT "$tracer"; wait "$tracer" || true; tracer=""
		fi
		bytes=$(python3 -c 'import json;print(json.load(open("'"$tmp/ip.json"'"))["end"]["sum_sent"]["bytes"])')
		perf report -i "$tmp/perf.data" --no-children --sort pid,sym -g none -n --stdio 2>/dev/null >"$tmp/report"
		[ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp "$tmp/report" "$KEEP/$cfg.$rep.txt"
		python3 - "$cfg" "$rep" "$bytes" "$FREQ" "$tids" "$tags" "$tmp/report" <<'PY'
import re, sys
cfg, rep, b, freq, tids, tags, path = sys.argv[1:]
tags = set(t for t in tags.split(",") if t)
tids = set(t for t in tids.split(",") if t)
gb = int(b) / 1e9
ms = lambda n: n / float(freq) * 1e3 / gb
idle = re.compile(r"(^|_)(idle|safe_halt|halt|mwait|cpuidle|poll_idle)|do_idle|default_idle")
dispatch = re.compile(r"^(bpf_trace_run\d+|__bpf_trace_\w+|__cgroup_bpf_run_filter_\w+|bpf_prog_run\w*|"
                      r"migrate_(dis|en)able|__rcu_read_(un)?lock|rcu_read_(un)?lock\w*|__bpf_prog_(enter|exit)\w*|"
                      r"bpf_cgroup_\w+|__bpf_prog_run\w*|cgroup_bpf_\w+|bpf_prog_\w+_(enter|exit))$")
helpers = re.compile(r"^(bpf_sk_storage_get\w*|bpf_local_storage_\w+|bpf_selem_\w+|bpf_get_socket\w*|"
                     r"__sock_gen_cookie|sock_gen_cookie|bpf_ktime\w*|ktime_get\w*|bpf_skc_to_\w+|"
                     r"bpf_ringbuf_\w+|__bpf_ringbuf_\w+|irq_work_\w+|bpf_get_current_\w+|bpf_get_smp\w*|"
                     r"htab_\w+|__htab_\w+|bpf_lru_\w+|array_map_\w+|percpu_array_\w+|bpf_map_\w+|"
                     r"bpf_probe_read\w*|copy_from_kernel_nofault\w*|bpf_rdonly_cast|bpf_cast_to_kern_ctx|"
                     r"kvm_clock_\w+|pvclock_\w+|read_tsc|native_sched_clock)$")
tot = {"bodies": 0, "dispatch": 0, "helpers": 0, "recorder": 0, "other": 0, "foreign": 0}
progs = {}
for l in open(path):
    m = re.match(r"\s*[\d.]+%\s+(\d+)\s+(\d+):(\S+)\s+\[(.)\]\s+(\S+)", l)
    if not m:
        continue
    n, p, comm, where, sym = int(m.group(1)), m.group(2), m.group(3), m.group(4), m.group(5)
    if idle.search(sym) or comm == "swapper" and sym.startswith("pv_"):
        continue
    if p in tids:
        tot["recorder"] += n
    elif not re.match(r"(iperf3|swapper|ksoftirqd)", comm):
        continue
    elif sym.startswith("bpf_prog_") and sym.split("_")[2] not in tags:
        tot["foreign"] += n
    elif sym.startswith("bpf_prog_"):
        tot["bodies"] += n
        name = sym.split("_", 3)[-1]
        progs[name] = progs.get(name, 0) + n
    elif dispatch.match(sym):
        tot["dispatch"] += n
    elif helpers.match(sym):
        tot["helpers"] += n
    else:
        tot["other"] += n
busy = sum(tot.values())
print("%-8s %3s %6.2f %8.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f" % (cfg, rep, gb, ms(busy), ms(tot["bodies"]), ms(tot["dispatch"]), ms(tot["helpers"]), ms(tot["recorder"]), ms(tot["other"]), ms(tot["foreign"])))
if progs:
    print("    bodies: " + ", ".join("%s %.1f" % (k, ms(v)) for k, v in sorted(progs.items(), key=lambda x: -x[1])))
PY
	done
done
