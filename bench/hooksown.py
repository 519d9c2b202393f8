#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ns per run of the benchmark's own packets, per program and configuration,
from bench/hooks.sh output whose rounds include idle:GROUPS.

On a shared machine the host's other traffic runs the same programs (they
leave it out at their filters), and bpf_stats counts those runs with the
transfer's. For the programs that run exactly once per packet of the
transfer (ONCE: 1.00 runs per packet on a quiet host), a run's runs beyond
one per packet are the others', each taken at the cost the idle run of the
same round measured for that program (the recorder up, no transfer):
    own ns/run = (ns - (runs - packets) * idle ns/run) / packets
Prints a markdown table: median (range) over the rounds.
    bench/hooksown.py FILE..."""
import re
import statistics
import sys

ONCE = ("ip_egress", "tcp_probe", "net_dev_queue", "net_dev_start_xmit", "netif_receive_skb")
runs = []  # (round index, cfg, prog, runs/pkt, runs, ns) ; idle: (round, cfg, prog, None, runs, ns/run)
rnd = 0
cur = None
for f in sys.argv[1:]:
    rnd += 1000
    for line in open(f):
        m = re.match(r"^(\S+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+", line)
        if m and not line.startswith(" "):
            cur = (m.group(1), rnd + int(m.group(2)))
            continue
        if not cur:
            continue
        m = re.match(r"^\s+(\w+)\s+runs/s\s+(\d+)\s+ns/run\s+(\d+)", line)
        if m:
            runs.append((cur[1], cur[0], m.group(1), None, float(m.group(2)), float(m.group(3))))
            continue
        m = re.match(r"^\s+(\w+)\s+runs/pkt\s+([\d.]+)\s+ns/run\s+\d+\s+ms/GB\s+[\d.]+\s+runs (\d+)\s+ns (\d+)", line)
        if m:
            runs.append((cur[1], cur[0], m.group(1), float(m.group(2)), float(m.group(3)), float(m.group(4))))
idle = {(r, p): ns for r, c, p, rpp, n, ns in runs if rpp is None}
own = {}
for r, c, p, rpp, n, t in runs:
    if rpp is None or p not in ONCE or (r, p) not in idle or rpp <= 0:
        continue
    pk = n / rpp
    other = max(0.0, n - pk)
    own.setdefault((c, p), []).append((t - other * idle[(r, p)]) / pk)
cfgs = sorted({c for c, _ in own}, key=lambda c: ("floor" in c, "noemit" in c, c))
print("| program | " + " | ".join(cfgs) + " |")
print("|---|" + "---|" * len(cfgs))
for p in ONCE:
    cells = []
    for c in cfgs:
        v = own.get((c, p))
        cells.append("%.0f (%.0f-%.0f)" % (statistics.median(v), min(v), max(v)) if v else "-")
    print("| %s | %s |" % (p, " | ".join(cells)))
