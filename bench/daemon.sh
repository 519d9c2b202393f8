#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Measures the CPU the magnet daemon costs at a steady high-rate transfer
# over a veth pair, with 10 subscribers, against what `magnet record` costs
# recording the same event groups to a file in the same run, and writes
# bench/DAEMON.md. Needs root (namespaces, BPF) and curl.
#
#   bench/daemon.sh [--reps N] [--duration SECONDS] [--size BYTES]
#                   [--compare-with OLD-MAGNET-BINARY] [--rate MBIT] [-o FILE]
#
# --rate limits the client's veth egress with tc tbf (e.g. --rate 9000 for
# the issue's steady 9 Gbit/s); without it the flood runs unlimited.
#
# Each repetition runs, in an order that rotates between repetitions, one
# unlimited-rate TCP flood (magnet workload send --flood) from a client to a
# server namespace under each configuration:
#   none             no tracer: the link's rate on this machine
#   record           magnet record -o FILE --events sock,tcp,tcpstate,dev,drop
#                    --port (the flood's; every tracer records it only)
#   daemon-idle      magnet daemon loading the same programs
#                    (events.available), no subscriber
#   daemon-figures   the same with 4 figure streams pushed every 100 ms
#   daemon-events    the same with 6 event streams: 3 of the flow's tcp_state
#                    events, 3 of every sock, tcp and dev event of a port
#                    nobody uses (every event filtered, none delivered)
#   daemon           the same with all 10 subscribers
#   daemon-all       the daemon as configured by default (every group's
#                    programs loaded, so subscriptions may enable more), with
#                    the 10 subscribers
#   daemon-unused    every group's programs loaded, only conn enabled
#                    (--events conn), no subscriber: what groups nobody
#                    wants cost the traffic
# With --compare-with, daemon, daemon-all and daemon-unused also run with
# the other binary (named CONFIG@old), interleaved with the rest.
# The tracer's CPU is utime+stime of its process (/proc/PID/stat) over the
# flood; its event rate comes from its status file (magnet status), which
# both record and the daemon's recorder update every second. The BPF
# programs run in the traffic's own contexts and cost the same under both
# tracers: the difference is the daemon's own user-space work.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench/daemon.sh: run as root (network namespaces and BPF)" >&2; exit 1; }
command -v curl >/dev/null || { echo "bench/daemon.sh: needs curl" >&2; exit 1; }

reps=3 duration=10 size=65536 out=bench/DAEMON.md old="" rate=0
while [ $# -gt 0 ]; do
	case "$1" in
	--reps) reps=$2; shift 2 ;;
	--duration) duration=$2; shift 2 ;;
	--size) size=$2; shift 2 ;;
	--compare-with) old=$(realpath "$2"); shift 2 ;;
	--rate) rate=$2; shift 2 ;;
	-o) out=$2; shift 2 ;;
	*) echo "bench/daemon.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
case "$rate" in '' | *[!0-9]*) echo "bench/daemon.sh: --rate $rate: want whole Mbit/s" >&2; exit 2 ;; esac
cmdline="bench/daemon.sh --reps $reps --duration $duration --size $size${old:+ --compare-with OLD}"
[ "$rate" = 0 ] || cmdline="$cmdline --rate $rate"
[ -z "$old" ] || [ -x "$old" ] || { echo "bench/daemon.sh: --compare-with $old: not an executable" >&2; exit 2; }

export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
mkdir -p bin
go build -o bin/magnet ./cmd/magnet
magnet=$PWD/bin/magnet

work=$(mktemp -d /tmp/magnet-dbench.XXXXXX)
ns=magnet-dbench-$$
cns=$ns-c sns=$ns-s
caddr=10.200.254.1 saddr=10.200.254.2
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	ip netns delete "$cns" 2>/dev/null || true
	ip netns delete "$sns" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$cns"
ip netns add "$sns"
ip -n "$cns" link add veth0 type veth peer name veth1 netns "$sns"
ip -n "$cns" addr add $caddr/30 dev veth0
ip -n "$sns" addr add $saddr/30 dev veth1
for n in "$cns" "$sns"; do ip -n "$n" link set lo up; done
ip -n "$cns" link set veth0 up
ip -n "$sns" link set veth1 up
if [ "$rate" != 0 ]; then
	# A bucket of 4 ms at the rate (at least 64 KiB: one GSO packet).
	burst=$((rate * 1000 * 1000 / 8 * 4 / 1000))
	[ "$burst" -ge 65536 ] || burst=65536
	tc -n "$cns" qdisc add dev veth0 root tbf rate "${rate}mbit" burst "$burst" latency 50ms
fi

# cpu_ticks PID: utime+stime of the whole process, in clock ticks.
cpu_ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# recorder PID: "recorded lost updated" of the recorder of process PID, from
# its status file (updated is in seconds since the epoch).
recorder() {
	"$magnet" status --json | python3 -c '
import datetime, json, sys
for r in json.load(sys.stdin)["recorders"]:
    if r["pid"] == int(sys.argv[1]):
        u = datetime.datetime.fromisoformat(r["updated"].replace("Z", "+00:00")).timestamp()
        print(r["recorded"], r["lost"], "%.6f" % u)
        break
else:
    print("0 0 0")' "$1"
}

# fresh_recorder PID: recorder PID, once its status file was updated after now.
fresh_recorder() {
	local now st i=0
	now=$(date +%s.%N)
	while :; do
		st=$(recorder "$1")
		awk -v u="${st##* }" -v n="$now" 'BEGIN { exit !(u > n) }' && break
		sleep 0.1; i=$((i + 1))
		[ $i -lt 50 ] || { echo "bench/daemon.sh: the status file of $1 is not updated" >&2; exit 1; }
	done
	echo "$st"
}

# json_get KEY...: the value at KEY... of the JSON on stdin ("" if absent).
json_get() {
	python3 -c 'import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1:]:
    v = v.get(k, "") if isinstance(v, dict) else ""
print(v)' "$@" 2>/dev/null || true
}

wait_file() { # wait_file PATH SECONDS
	local i=0
	while [ ! -s "$1" ]; do
		sleep 0.05; i=$((i + 1))
		[ $i -lt $(($2 * 20)) ] || { echo "bench/daemon.sh: $1 did not appear" >&2; return 1; }
	done
}

port=6000
results=$work/results.tsv
: >"$results"

# run CONFIG REP: one flood with CONFIG's tracer; appends a line to results.
run() {
	local config=${1%@old} label=$1 rep=$2 tpid="" bin=$magnet
	[ "$label" = "$config" ] || bin=$old
	local ready=$work/ready.$config.$rep sock=$work/magnet.$config.$rep.sock
	port=$((port + 1))
	# Both tracers record the flood's port only (record --port, the daemon's
	# filter.port): the host is shared, and other work must not count.
	local cfg=$work/daemon.$config.$rep.yaml
	printf 'filter:\n  port: %d\n' "$port" >"$cfg"
	case "$config" in
	record)
		"$bin" record -q -o "$work/trace.mgt" --events sock,tcp,tcpstate,dev,drop --port "$port" --ready-file "$ready" &
		tpid=$!
		;;
	daemon-all) ;;
	daemon-unused) printf 'events:\n  baseline: conn\n' >>"$cfg" ;;
	daemon*) printf 'events:\n  available: sock,tcp,tcpstate,dev,drop\n' >>"$cfg" ;;
	esac
	if [ "${config#daemon}" != "$config" ]; then
		"$bin" daemon --config "$cfg" --socket "$sock" --ready-file "$ready" 2>"$work/daemon.log" &
		tpid=$!
	fi
	if [ -n "$tpid" ]; then
		pids+=("$tpid")
		wait_file "$ready" 60
	fi

	local subs=() figures=0 events=0 i
	case "$config" in
	daemon-figures) figures=4 ;;
	daemon-events) events=3 ;;
	daemon | daemon-all) figures=4 events=3 ;;
	esac
	for ((i = 0; i < figures; i++)); do
		curl -sN --unix-socket "$sock" "http://magnet/v1/figures?every=100ms" >/dev/null &
		subs+=($!)
	done
	for ((i = 0; i < events; i++)); do
		curl -sN --unix-socket "$sock" "http://magnet/v1/events?types=tcp_state&ports=$port" >/dev/null &
		subs+=($!)
		curl -sN --unix-socket "$sock" "http://magnet/v1/events?groups=sock,tcp,dev&ports=9" >/dev/null &
		subs+=($!)
	done
	if [ ${#subs[@]} -gt 0 ]; then
		pids+=("${subs[@]}")
		local n=0
		i=0
		while [ "$n" != ${#subs[@]} ]; do
			n=$(curl -s --unix-socket "$sock" http://magnet/v1/status | json_get subscribers)
			sleep 0.05; i=$((i + 1))
			[ $i -lt 200 ] || { echo "bench/daemon.sh: subscribers did not register" >&2; exit 1; }
		done
	fi

	local serve=$work/serve.$config.$rep
	ip netns exec "$sns" "$magnet" workload serve --listen $saddr:$port >"$serve" &
	local spid=$!
	pids+=("$spid")
	wait_file "$serve" 10
	local c0=0 c1=0 t0 t1 s0="0 0 0" s1="0 0 0" tracked=""
	[ -z "$tpid" ] || { s0=$(fresh_recorder "$tpid"); c0=$(cpu_ticks "$tpid"); }
	t0=$(date +%s.%N)
	ip netns exec "$cns" "$magnet" workload send --to $saddr:$port --flood "${duration}s" --size "$size" >/dev/null
	wait "$spid"
	t1=$(date +%s.%N)
	[ -z "$tpid" ] || { c1=$(cpu_ticks "$tpid"); s1=$(fresh_recorder "$tpid"); }
	local bytes
	bytes=$(sed -n 's/^received \([0-9]*\) bytes.*/\1/p' "$serve")
	if [ "${config#daemon}" != "$config" ]; then
		tracked=$(curl -s --unix-socket "$sock" http://magnet/v1/status | json_get connections tracked)
	fi
	if [ ${#subs[@]} -gt 0 ]; then # (a bare wait would wait for the tracer too)
		kill "${subs[@]}" 2>/dev/null || true
		wait "${subs[@]}" 2>/dev/null || true
	fi
	if [ -n "$tpid" ]; then
		kill -TERM "$tpid" 2>/dev/null || true
		wait "$tpid" || true
	fi
	rm -f "$work/trace.mgt" "$ready"
	# config, rep, Gbit/s, CPU %, events/s, lost/s, connections tracked
	awk -v c="$label" -v r="$rep" -v b="$bytes" -v t0="$t0" -v t1="$t1" -v c0="$c0" -v c1="$c1" -v hz="$hz" \
		-v s0="$s0" -v s1="$s1" -v tracked="$tracked" 'BEGIN {
		wall = t1 - t0
		split(s0, a, " "); split(s1, z, " ")
		span = z[3] - a[3]
		evs = span > 0 ? (z[1] - a[1]) / span : 0
		lost = span > 0 ? (z[2] - a[2]) / span : 0
		printf "%s\t%d\t%.3f\t%.2f\t%.0f\t%.0f\t%s\n", c, r, b * 8 / wall / 1e9, 100 * (c1 - c0) / hz / wall, evs, lost, tracked
	}' >>"$results"
	tail -n 1 "$results" >&2
}

configs=(none record daemon-idle daemon-figures daemon-events daemon daemon-all daemon-unused)
[ -z "$old" ] || configs+=(daemon@old daemon-all@old daemon-unused@old)
for rep in $(seq 1 "$reps"); do
	# Rotate the order so no configuration always runs first.
	for k in "${!configs[@]}"; do
		run "${configs[$(((k + rep) % ${#configs[@]}))]}" "$rep"
	done
done

cpu_model=$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n 1)
{
	echo "# magnet daemon: CPU cost at a steady veth transfer"
	echo
	echo "Generated by \`$cmdline\` on $(date -u '+%Y-%m-%d %H:%M UTC')."
	echo
	linkdesc="One unlimited TCP flood"
	[ "$rate" = 0 ] || linkdesc="One TCP flood limited to $rate Mbit/s (tc tbf on the client's veth)"
	echo "Machine: $(nproc) CPUs ($cpu_model), Linux $(uname -r). $linkdesc"
	echo "(\`magnet workload send --flood ${duration}s --size $size\`) over a veth pair between two"
	echo "namespaces per run; $reps repetitions of each configuration, interleaved."
	echo
	echo "- **none**: no tracer."
	echo "- **record**: \`magnet record --events sock,tcp,tcpstate,dev,drop\` writing a trace file."
	echo "- **daemon-idle**: \`magnet daemon\` loading the programs record loads (\`events.available:"
	echo "  sock,tcp,tcpstate,dev,drop\`; the same groups enabled: the daemon's default baseline), no subscriber."
	echo "- **daemon-figures**: the same with 4 figure streams (\`/v1/figures?every=100ms\`, every connection)."
	echo "- **daemon-events**: the same with 6 event streams: 3 of the flow's \`tcp_state\` events, 3 of the"
	echo "  sock, tcp and dev groups of an unused port (every event goes through their filters, none matches)."
	echo "- **daemon**: the same with all 10 subscribers (the issue's configuration)."
	echo "- **daemon-all**: the daemon as configured by default, which *loads* every group's programs"
	echo "  (\`events.available: all\`) so that subscriptions can enable more at run time (groups disabled"
	echo "  cost nothing: their programs are detached until a subscription enables them), with the same"
	echo "  10 subscribers."
	echo "- **daemon-unused**: every group's programs loaded, only \`conn\` enabled (\`--events conn\`),"
	echo "  no subscriber: what groups nobody wants cost the traffic."
	if [ -n "$old" ]; then
		echo "- **CONFIG@old**: the same configuration run with the binary given to \`--compare-with\`"
		echo "  (${OLD_DESC:-the previous build}), interleaved with the others."
	fi
	echo
	echo "Both tracers record the flood's port only (\`record --port\`, the daemon's \`filter.port\`): the"
	echo "host is shared with other work, which must not count. CPU is the tracer process's utime+stime"
	echo "over the flood, in % of one core. Events/s is the rate at which the tracer's recorder took events"
	echo "from the kernel over the same time (its status file)."
	echo
	echo "| config | throughput Gbit/s | tracer CPU % of one core | events/s (k) | CPU ns per event | lost/s | runs |"
	echo "|---|---|---|---|---|---|---|"
	for c in "${configs[@]}"; do
		awk -F'\t' -v c="$c" '$1 == c { n++; t += $3; tt += $3 * $3; u += $4; uu += $4 * $4; e += $5; l += $6
			if ($5 > 0) { k++; ns += $4 / 100 * 1e9 / $5 } }
		END {
			if (!n) exit
			mt = t / n; mu = u / n
			st = n > 1 ? sqrt((tt - n * mt * mt) / (n - 1)) : 0
			su = n > 1 ? sqrt((uu - n * mu * mu) / (n - 1)) : 0
			if (st != st) st = 0; if (su != su) su = 0
			if (c == "none") { printf "| none | %.2f ± %.2f | – | – | – | – | %d |\n", mt, st, n; exit }
			printf "| %s | %.2f ± %.2f | %.1f ± %.1f | %.0f | %.0f | %.0f | %d |\n", c, mt, st, mu, su, e / n / 1e3, (k ? ns / k : 0), l / n, n
		}' "$results"
	done
	echo
	echo "Beyond record, per event and at the daemon's own event rate (the CPU ns per event of each run,"
	echo "averaged, minus record's):"
	echo
	for c in daemon-idle daemon-figures daemon-events daemon daemon-all daemon-unused daemon@old daemon-all@old daemon-unused@old; do
		awk -F'\t' -v c="$c" '
		$1 == "record" && $5 > 0 { nr++; r += $4 / 100 * 1e9 / $5 }
		$1 == c && $5 > 0 { nd++; d += $4 / 100 * 1e9 / $5; ev += $5; cpu += $4; gb += $3 }
		END {
			if (!nr || !nd) exit
			extra = d / nd - r / nr
			printf "- **%s**: %+.0f ns per event (%.0f against %.0f): **%+.1f %% of one core** at its %.0fk events/s", c, extra, d / nd, r / nr, extra * (ev / nd) / 1e7, ev / nd / 1e3
			printf " (%+.1f %% at 1M events/s", extra * 1e6 / 1e7
			# Events per Gbit/s of this configuration, scaled to 9 Gbit/s.
			if (gb > 0) printf "; %+.1f %% at 9 Gbit/s, %.0fk events/s", extra * 9 * ev / gb / 1e7, 9 * ev / gb / 1e3
			printf ").\n"
		}' "$results"
	done
	echo
	echo "Throughput with every group loaded and none wanted (the kernel cost of unused groups):"
	echo
	for c in none daemon-unused daemon-unused@old; do
		awk -F'\t' -v c="$c" '$1 == c { n++; t += $3 } END { if (n) printf "- **%s**: %.2f Gbit/s (mean of %d)\n", c, t / n, n }' "$results"
	done
	echo
	echo "Target: the daemon under 5 % of one core beyond record."
	echo
	echo "The host is shared: other work competes for the CPUs, which the spread of the throughput shows."
	echo
	echo "Runs (config, repetition, Gbit/s, tracer CPU %, events/s, lost/s, connections tracked):"
	echo
	echo '```'
	cat "$results"
	echo '```'
} >"$out"
echo "wrote $out" >&2
