// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
)

// Goal is one of the recorder's overhead goals (docs/BENCH.md) and what was measured against it.
type Goal struct {
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	Verdict  string `json:"verdict"` // met, missed, undecided, not measured
}

const (
	met         = "met"
	missed      = "missed"
	undecided   = "undecided (the 95 % interval spans the goal)"
	notMeasured = "not measured"
	// noneReached: no run lost, and none reached the rate to judge.
	noneReached = "undecided (no run reached the rate, and none lost events)"
)

func verdict(ok bool) string {
	if ok {
		return met
	}
	return missed
}

// atMost judges "s ≤ limit" by the whole 95 % interval, not the mean
// alone: on a noisy machine a mean can fall on either side by chance.
func atMost(s Stat, limit float64) string {
	switch {
	case s.Mean+s.CI95 <= limit:
		return met
	case s.Mean-s.CI95 > limit:
		return missed
	}
	return undecided
}

// all combines verdicts of parts: missed if any part missed, met if all met.
func all(vs ...string) string {
	v := met
	for _, x := range vs {
		switch {
		case x == missed:
			return missed
		case x != met:
			v = undecided
		}
	}
	return v
}

func (lr *LinkResult) config(name string) *ConfigResult {
	for i := range lr.Configs {
		if lr.Configs[i].Name == name && lr.Configs[i].Skipped == "" && len(lr.Configs[i].Runs) > 0 {
			return &lr.Configs[i]
		}
	}
	return nil
}

// cpuBoundPct is how busy the baseline's sender CPU must be for the link
// to count as bounded by it: below, the sender waits part of the time, and
// work a tracer adds can fill those waits instead of costing throughput.
const cpuBoundPct = 97

// qualifyByCPU adds to a throughput-loss goal what the machine's CPUs say:
// the configuration's CPU per byte against the baseline's, and how busy the
// baseline's sender CPU was.
func qualifyByCPU(lr *LinkResult, rec *ConfigResult, measured string) string {
	if rec.CPUCostPct.N > 0 {
		measured += fmt.Sprintf("; CPU per byte, all CPUs: %s against the baseline", signedPct(rec.CPUCostPct))
	}
	if base := lr.config(Baseline); base != nil && base.SenderVCPUPct.N > 0 {
		measured += fmt.Sprintf("; the baseline's sender CPU was %.1f %% busy", base.SenderVCPUPct.Mean)
	}
	return measured
}

// unboundVerdict is v, said to be on a link the sender's CPU did not bound
// when it is met and the baseline's sender CPU was under cpuBoundPct busy:
// a loss within a throughput goal there is not the same result as on a link
// the CPU bounds.
func unboundVerdict(lr *LinkResult, v string) string {
	base := lr.config(Baseline)
	if v != met || base == nil || base.SenderVCPUPct.N == 0 || base.SenderVCPUPct.Mean >= cpuBoundPct {
		return v
	}
	return fmt.Sprintf("met, on a link the sender's CPU did not bound (%.1f %% busy at baseline, < %d %%)", base.SenderVCPUPct.Mean, cpuBoundPct)
}

func signedPct(s Stat) string {
	return fmt.Sprintf("%+.2f ± %.2f %%", s.Mean, s.CI95)
}

// evaluate states each result against the recorder's overhead goals.
func evaluate(r *Report) []Goal {
	var goals []Goal
	var unlimited *LinkResult
	for i := range r.Links {
		if r.Links[i].RateMbit == 0 {
			unlimited = &r.Links[i]
		}
	}
	for _, side := range []struct{ rec, dump, name string }{
		{RecordSender, TcpdumpSender, "sender"},
		{RecordReceiver, TcpdumpReceiver, "receiver"},
	} {
		g1 := Goal{Goal: fmt.Sprintf("throughput loss with record on the %s's side, unlimited veth, ≤ 1 %%", side.name), Verdict: notMeasured, Measured: "-"}
		g2 := Goal{Goal: fmt.Sprintf("that loss ≥ 10× smaller than tcpdump's on the %s's veth", side.name), Verdict: notMeasured, Measured: "-"}
		if unlimited != nil {
			if rec := unlimited.config(side.rec); rec != nil && rec.ReductionPct.N > 0 {
				g1.Measured = pct(rec.ReductionPct)
				// Beside it, what the same programs cost doing nothing
				// (hooks) and building every event but writing none
				// (loaded): where the loss comes from.
				var floors []string
				for _, name := range []string{Hooks, Loaded} {
					if c := unlimited.config(name); c != nil && c.ReductionPct.N > 0 {
						floors = append(floors, fmt.Sprintf("%s %s", name, pct(c.ReductionPct)))
					}
				}
				if len(floors) > 0 {
					g1.Measured += " (" + strings.Join(floors, ", ") + ")"
				}
				g1.Verdict = unboundVerdict(unlimited, atMost(rec.ReductionPct, 1))
				g1.Measured = qualifyByCPU(unlimited, rec, g1.Measured)
				if dump := unlimited.config(side.dump); dump != nil && dump.ReductionPct.N > 0 {
					r, d := rec.ReductionPct, dump.ReductionPct
					switch {
					case r.Mean <= 0:
						g2.Measured = fmt.Sprintf("record %s vs tcpdump %s (record lost nothing measurable)", pct(r), pct(d))
					default:
						g2.Measured = fmt.Sprintf("record %s vs tcpdump %s: %.1f×", pct(r), pct(d), d.Mean/r.Mean)
					}
					// ≥ 10× smaller, judged on the intervals: met when
					// tcpdump's smallest plausible loss is ten times
					// record's largest (or more than nothing, if that
					// is ≤ 0); missed when even the most favourable ends
					// fall short.
					hiRec, loRec := r.Mean+r.CI95, r.Mean-r.CI95
					hiDump, loDump := d.Mean+d.CI95, d.Mean-d.CI95
					switch {
					case loDump > 0 && loDump >= 10*max(hiRec, 0):
						g2.Verdict = met
					case hiDump <= 0 || (loRec > 0 && hiDump < 10*loRec):
						g2.Verdict = missed
					default:
						g2.Verdict = undecided
					}
					g2.Verdict = unboundVerdict(unlimited, g2.Verdict)
				}
			}
		}
		goals = append(goals, g1, g2)
	}

	g := Goal{Goal: "zero events lost at the default buffer (8 MiB) on every link, record on either side", Verdict: notMeasured, Measured: "-"}
	var lost, runs uint64
	var where []string
	for _, lr := range r.Links {
		for _, name := range []string{RecordSender, RecordReceiver} {
			c := lr.config(name)
			if c == nil {
				continue
			}
			for _, run := range c.Runs {
				runs++
				lost += run.Tracer.Lost
				if run.Tracer.Lost > 0 {
					where = append(where, fmt.Sprintf("%s %s rep %d: %d", linkName(lr.RateMbit), name, run.Rep, run.Tracer.Lost))
				}
			}
		}
	}
	if runs > 0 {
		g.Measured = fmt.Sprintf("%d lost over %d recorded transfers", lost, runs)
		if len(where) > 0 {
			g.Measured += " (" + strings.Join(where, "; ") + ")"
		}
		g.Verdict = verdict(lost == 0)
	}
	goals = append(goals, g)

	gk := Goal{Goal: "kernel cost ≤ 60 ns per event, averaged over all programs (bpf_stats, less its own cost: an empty program's figure in the same run)", Verdict: notMeasured, Measured: "-"}
	gd := Goal{Goal: "drain ≤ 30 ns per event", Verdict: notMeasured, Measured: "-"}
	if r.Cost != nil && len(r.Cost.Runs) > 0 {
		var km, dm, kv, dv []string
		for _, c := range r.Cost.Summaries() {
			if c.KernelNetNsPerRun.N > 0 {
				km = append(km, fmt.Sprintf("%s: %s ns per program run (bpf_stats %s, empty program %s), %s ns per event produced",
					c.Workload, fmtStat(c.KernelNetNsPerRun, 1), fmtStat(c.KernelNsPerRun, 1), fmtStat(c.FloorNsPerRun, 1), fmtStat(c.KernelNsPerEvent, 1)))
				kv = append(kv, atMost(c.KernelNetNsPerRun, 60))
			} else {
				km = append(km, fmt.Sprintf("%s: %s ns per program run (bpf_stats, its own cost included), %s ns per event produced", c.Workload, fmtStat(c.KernelNsPerRun, 1), fmtStat(c.KernelNsPerEvent, 1)))
				kv = append(kv, atMost(c.KernelNsPerRun, 60))
			}
			dm = append(dm, fmt.Sprintf("%s: %s ns", c.Workload, fmtStat(c.UserNsPerEvent, 1)))
			dv = append(dv, atMost(c.UserNsPerEvent, 30))
		}
		gk.Measured, gk.Verdict = strings.Join(km, "; "), all(kv...)
		gd.Measured, gd.Verdict = strings.Join(dm, "; "), all(dv...)
	}
	goals = append(goals, gk, gd)

	goals = append(goals, rateGoal(r))
	return goals
}

// rateGoal judges "≥ 5 M events/s with zero loss while the workload runs"
// by the synthetic events recorded while the 64 KiB transfer runs when that
// was measured, else by the small-message workloads of the sweep. Both are
// shown with the idle synthetic ceiling, which is not the goal's condition.
func rateGoal(r *Report) Goal {
	gr := Goal{Goal: "≥ 5 M events/s sustained with zero loss (default buffer) while the workload runs", Verdict: notMeasured}
	var parts []string
	if sl := r.SynthLoad; sl != nil && len(sl.Runs) > 0 {
		parts = append(parts, "while the 64 KiB transfer runs: "+sl.verdictText())
		switch {
		case sl.MaxZeroLossRate >= GoalEventRate:
			gr.Verdict = met
		case !sl.AnyLoss:
			gr.Verdict = noneReached
		default:
			gr.Verdict = missed
		}
	}
	if s := r.Sweep; s != nil {
		small := "every small-message run at the default buffer lost events"
		if s.MaxZeroLossRate > 0 {
			small = fmt.Sprintf("%.2f M events/s (%s)", s.MaxZeroLossRate/1e6, s.MaxZeroLossWorkload)
		}
		if s.MaxZeroLossAnyBuffer > 0 {
			small += fmt.Sprintf("; any buffer: %.2f M events/s (%s)", s.MaxZeroLossAnyBuffer/1e6, s.MaxZeroLossAnyBufferDesc)
		}
		var best RateLimitRow
		for _, row := range s.Limit {
			if row.Config == LimitUnobserved && row.EventsPerS.Mean > best.EventsPerS.Mean {
				best = row
			}
		}
		if best.EventsPerS.N > 0 {
			small += fmt.Sprintf("; the same workloads unobserved would make at most ≈ %.2f M events/s (%s, estimate)", best.EventsPerS.Mean/1e6, best.Workload)
		}
		if gr.Verdict == notMeasured {
			gr.Verdict = verdict(s.MaxZeroLossRate >= 5e6)
		} else {
			small = "small messages: " + small
		}
		parts = append(parts, small)
	}
	if sy := r.Synth; sy != nil && sy.MaxZeroLossRate > 0 {
		parts = append(parts, fmt.Sprintf("synthetic events, no network workload: %.2f M events/s (not the goal's condition)", sy.MaxZeroLossRate/1e6))
	}
	gr.Measured = strings.Join(parts, "; ")
	if gr.Measured == "" {
		gr.Measured = "-"
	}
	return gr
}

// quietEmptyNs is synth_empty's test run on this VM with nothing else
// running (lab/results/RESULTS.md: 15.9 ± 1.0 ns).
const quietEmptyNs = 16.0

// producersName says who runs the synthetic events.
func producersName(n int) string {
	if n <= 1 {
		return "one thread runs"
	}
	return fmt.Sprintf("%d threads, each paced to 1/%d of the rate, run", n, n)
}

// producingProgram names the synthetic-event program by its events per
// test run.
func producingProgram(perRun int) string {
	if perRun <= 1 {
		return "synth_event (one event per test run)"
	}
	return fmt.Sprintf("synth_burst (%d events per test run, bpf_loop, so that the test run's own cost is shared)", perRun)
}

// roundsName is "1 round" or "N rounds".
func roundsName(n int) string {
	if n == 1 {
		return "1 round"
	}
	return fmt.Sprintf("%d rounds", n)
}

func pct(s Stat) string {
	return fmtStat(s, 2) + " %"
}

// fmtStat prints mean ± CI95 half-width.
func fmtStat(s Stat, prec int) string {
	if s.N == 0 {
		return "-"
	}
	if s.N < 2 || math.IsNaN(s.CI95) {
		return fmt.Sprintf("%.*f", prec, s.Mean)
	}
	return fmt.Sprintf("%.*f ± %.*f", prec, s.Mean, prec, s.CI95)
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteMarkdown writes the report as the markdown of lab/results/RESULTS.md.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# magnet-lab bench results\n\n")
	p("Generated by `magnet-lab bench`; do not edit by hand, run the command again.\n\n")
	p("- **Command:** `%s`\n", r.Command)
	p("- **Date:** %s\n", r.Date.Format("2006-01-02 15:04 MST"))
	idle := ""
	if r.Machine.Idle != "" {
		idle = "; " + r.Machine.Idle
	}
	if r.Machine.WakeUpNs > 0 {
		idle += fmt.Sprintf("; an idle CPU took %.1f µs to wake (median of 100, as magnet hostcheck measures it)", float64(r.Machine.WakeUpNs)/1e3)
	}
	p("- **Machine:** %s, %d cores (cpu MHz %.0f), %s%s\n", r.Machine.CPU, r.Machine.Cores, r.Machine.MHz, r.Machine.Kernel, idle)
	if r.Note != "" {
		p("- **Note:** %s\n", r.Note)
	}
	s := r.Settings
	reps := fmt.Sprintf("%d repetitions", s.Reps)
	if s.UnlimitedReps > 0 && s.UnlimitedReps != s.Reps {
		reps = fmt.Sprintf("%d repetitions (%d on the unlimited link, where the goals are judged)", s.Reps, s.UnlimitedReps)
	}
	p("- **Settings:** %s of %gs transfers per configuration and link, interleaved (A B C … A B C …); mean ± 95 %% confidence interval (Student t)\n", reps, s.DurationS)
	p("- **Workload:** magnet's own generator: %s, in two network namespaces joined by a veth pair (tc tbf for the rate-limited links)\n", s.Workload)
	p("- **Throughput:** bytes the receiver got × 8 / the sender process's wall time (start to the receiver's close); **reduction** is against the baseline of the same repetition\n")
	p("- **CPU:** %s; %% of one CPU over the transfer's wall time\n", s.CPUSource)
	p("- **Events:** magnet: events written to the trace (hooks: none is produced; loaded: none is drained, so the ring fills and the rest are lost); tcpdump: packets captured; bpftrace: lines printed. **Lost:** magnet: ring full; tcpdump: \"dropped by kernel\"; bpftrace: \"Lost N events\"\n")
	p("- **Trace bytes per packet:** trace file size / packets on the link in both directions (veth tx counters inside each namespace, a GSO packet counts once)\n")
	if s.TcpdumpSnaplen > 0 {
		p("- **tcpdump:** `-s %d`\n", s.TcpdumpSnaplen)
	} else {
		p("- **tcpdump:** `tcpdump -w` with its default snap length (whole packets)\n")
	}
	if s.Pinned != "" {
		p("- **Pinned** (two hosts, a CPU each): %s; bpftrace and softirq work are not pinned\n", s.Pinned)
	}
	if s.ProcBuilds != "" {
		p("- **Recorder as a process** (unlimited link only): `magnet record -q --netns <sender's namespace>` run as a process of each build, stopped with SIGINT; tracer CPU: the process's (all threads, schedstat) from the moment its probes were attached to the end of the transfer. %s\n", s.ProcBuilds)
	}
	p("- **bpftrace:** tracepoints only (no kprobes here): sock_send/recv_length, tcp_probe, tcp_retransmit_skb, inet_sock_set_state, net_dev_queue (where the qdisc can queue, as magnet), net_dev_start_xmit, netif_receive_skb, kfree_skb, one printf line each, all namespaces, `-o FILE`; magnet's tcp_xmit (sockops) and ip_send/ip_recv (cgroup_skb) have no tracepoint equivalent\n")

	if len(r.Goals) > 0 {
		p("\n## Goals\n\n| goal | measured | verdict |\n|---|---|---|\n")
		for _, g := range r.Goals {
			v := g.Verdict
			if v == missed {
				v = "**missed**"
			}
			p("| %s | %s | %s |\n", g.Goal, g.Measured, v)
		}
	}

	for _, lr := range r.Links {
		p("\n## Overhead, %s link\n\n", linkName(lr.RateMbit))
		p("| configuration | throughput Mbit/s | reduction %% | sender CPU %% | receiver CPU %% | tracer CPU %% | events | lost (tcpdump: dropped) | trace bytes/packet |\n")
		p("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range lr.Configs {
			if c.Skipped != "" {
				p("| %s | %s | | | | | | | |\n", c.Name, c.Skipped)
				continue
			}
			p("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c.Name,
				fmtStat(c.ThroughputMbit, 1), fmtStat(c.ReductionPct, 2),
				fmtStat(c.SenderCPUPct, 1), fmtStat(c.ReceiverCPUPct, 1), fmtStat(c.TracerCPUPct, 1),
				fmtStat(c.Events, 0), fmtStat(c.Lost, 0), fmtStat(c.BytesPerPacket, 1))
		}
		writeCPUTable(p, lr)
	}
	if c := r.Churn; c != nil {
		writeChurn(p, c)
	}

	if c := r.Cost; c != nil {
		sums := c.Summaries()
		p("\n## Per-event cost\n\n%s. Kernel: bpf_stats run time (BPF_STATS_RUN_TIME) of every magnet program over their runs, and the same for an empty program attached to net_dev_queue during the run: what measuring and calling a program costs, which every figure includes; **net** is the difference. Per event produced: all programs' run time / events produced (runs that produce nothing, such as filtered packets, cost too). Drain: the CPU time (user + system, so writing the trace included, and the system-call part apart) of the `magnet record` process from the transfer's start to its last event drained / events drained: its own account in its trace summary (`recorder_cpu_ns`: probes attached to last event drained, detaching left out) less what it spent before the transfer started; stopping (detaching, unloading) is a fixed cost left out. Mean ± 95 %% CI over %d repetitions of %gs transfers. Cycles = ns × %.0f MHz.\n\n",
			capital(c.Note), maxReps(sums), r.Settings.DurationS, c.MHz)
		p("| workload | kernel ns/run | empty program ns/run | net ns/run (cycles) | kernel ns/event produced | drain ns/event (cycles) | of which system calls | events produced | lost |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, s := range sums {
			p("| %s | %s | %s | %s (%.0f) | %s | %s (%.0f) | %s | %s | %d |\n", s.Workload,
				fmtStat(s.KernelNsPerRun, 1), fmtStat(s.FloorNsPerRun, 1),
				fmtStat(s.KernelNetNsPerRun, 1), s.KernelNetNsPerRun.Mean*c.MHz/1000,
				fmtStat(s.KernelNsPerEvent, 1),
				fmtStat(s.UserNsPerEvent, 1), s.UserNsPerEvent.Mean*c.MHz/1000,
				fmtStat(s.UserSysNsPerEvent, 1),
				fmtStat(s.Produced, 0), s.Lost)
		}
		for _, s := range sums {
			p("\n%s, per program (all repetitions):\n\n| program | runs | run time ns | ns/run | cycles/run |\n|---|---:|---:|---:|---:|\n", s.Workload)
			for _, pc := range s.Programs {
				p("| %s | %d | %d | %.1f | %.0f |\n", pc.Name, pc.RunCount, pc.RuntimeNs, pc.NsPerRun, pc.NsPerRun*c.MHz/1000)
			}
		}
	}

	if pr := r.Paired; pr != nil && len(pr.Runs) > 0 {
		sums := pr.Summaries()
		p("\n## Per-event cost, two builds at once\n\n")
		p("%s. This: %s; other: %s. Each workload %d times in each order (the recorder started second attaches second and finds caches warmed by the first), %gs transfers; mean ± 95 %% CI. The ratio is this build's figure over the other's in the same run, averaged over runs. Drain: each recorder process's CPU time (user + system) / events it wrote; %s.\n\n",
			capital(pr.Note), pr.This, pr.Other, len(pr.Runs)/max(2*len(sums), 1), r.Settings.DurationS, pr.cpuFrom())
		p("| workload | figure | other | this | this / other |\n|---|---|---:|---:|---:|\n")
		for _, s := range sums {
			p("| %s | kernel ns/run (bpf_stats) | %s | %s | %s |\n", s.Workload, fmtStat(s.OtherNsPerRun, 1), fmtStat(s.ThisNsPerRun, 1), fmtStat(s.RunRatio, 2))
			p("| %s | empty program ns/run (both) | %s | %s | |\n", s.Workload, fmtStat(s.Floor, 1), fmtStat(s.Floor, 1))
			p("| %s | kernel ns/event produced | %s | %s | |\n", s.Workload, fmtStat(s.OtherNsPerEvent, 1), fmtStat(s.ThisNsPerEvent, 1))
			p("| %s | drain ns/event | %s | %s | %s |\n", s.Workload, fmtStat(s.OtherDrainNsPerEvent, 1), fmtStat(s.ThisDrainNsPerEvent, 1), fmtStat(s.DrainRatio, 2))
			p("| %s | events produced | %s | %s | |\n", s.Workload, fmtStat(s.OtherProduced, 0), fmtStat(s.Produced, 0))
			p("| %s | kernel run time, same transfers | | | %s |\n", s.Workload, fmtStat(s.KernelRatio, 2))
			p("| %s | recorder CPU time, same transfers | | | %s |\n", s.Workload, fmtStat(s.CPURatio, 2))
		}
	}

	if b := r.Before; b != nil && b.Cost != nil && r.Cost != nil {
		p("\n## Per-event cost, before and after\n\n")
		p("Before: %s — `%s`, %s, %d repetitions of %gs", b.Label, b.Command, b.Date.Format("2006-01-02 15:04 MST"), maxReps(b.Cost.Summaries()), b.DurationS)
		if b.Note != "" {
			p(" (%s)", b.Note)
		}
		p(". After: %s, this report. Same harness and workloads; the machine is shared, so compare the intervals, not single digits.\n\n", labelOr(r.Label, "this build"))
		p("| workload | figure | before | after | change |\n|---|---|---:|---:|---:|\n")
		before := map[string]CostSummary{}
		for _, s := range b.Cost.Summaries() {
			before[s.Workload] = s
		}
		for _, a := range r.Cost.Summaries() {
			bs, ok := before[a.Workload]
			if !ok {
				continue
			}
			for _, row := range []struct {
				name   string
				bv, av Stat
			}{
				{"kernel ns/run (bpf_stats)", bs.KernelNsPerRun, a.KernelNsPerRun},
				{"kernel net ns/run", bs.KernelNetNsPerRun, a.KernelNetNsPerRun},
				{"kernel ns/event produced", bs.KernelNsPerEvent, a.KernelNsPerEvent},
				{"drain ns/event", bs.UserNsPerEvent, a.UserNsPerEvent},
				{"drain ns/event in system calls", bs.UserSysNsPerEvent, a.UserSysNsPerEvent},
				{"events produced", bs.Produced, a.Produced},
			} {
				p("| %s | %s | %s | %s | %s |\n", a.Workload, row.name, fmtStat(row.bv, 1), fmtStat(row.av, 1), change(row.bv, row.av))
			}
		}
	}

	if sw := r.Sweep; sw != nil {
		p("\n## Loss against ring-buffer size\n\n")
		p("One %gs transfer per row, recorded with %s; the bulk transfer on the 1 Gbit/s and the unlimited link, the 64-byte ones on the unlimited link (they make far less than 1 Gbit/s). Events/s = events produced / transfer wall time. Unaccounted = produced − recorded − lost (events neither written nor counted as lost). Recorder CPU: its CPU time (user + system) over the transfer, per cent of one CPU.\n\n", sw.DurationS, sw.Filter)
		p("| workload | link | buffer | produced | recorded | lost | unaccounted | loss %% | events/s | throughput Mbit/s | recorder CPU %% |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, row := range sw.Rows {
			mark := ""
			if row.BufferBytes == sw.DefaultBuffer {
				mark = " (default)"
			}
			link := row.Link
			if link == "" {
				link = linkName(0)
			}
			p("| %s | %s | %s%s | %d | %d | %d | %d | %.2f | %.0f | %.1f | %.1f |\n", row.Workload, link, sizeName(row.BufferBytes), mark,
				row.Produced, row.Recorded, row.Lost, row.Unaccounted, row.LossPct, row.EventsPerSec, row.ThroughputMbit, row.RecorderCPUPct)
		}
		if sw.MaxZeroLossRate > 0 {
			p("\nMaximum event rate with zero loss at the default buffer: **%.0f events/s** (%s).\n", sw.MaxZeroLossRate, sw.MaxZeroLossWorkload)
		} else {
			p("\nMaximum event rate with zero loss at the default buffer: none of the small-message runs was loss-free.\n")
		}
		if sw.MaxZeroLossAnyBuffer > 0 {
			p("Over every buffer size: %.0f events/s (%s).\n", sw.MaxZeroLossAnyBuffer, sw.MaxZeroLossAnyBufferDesc)
		}
		if len(sw.Policy) > 0 {
			p("\n## Loss and CPU against the drain policy\n\n")
			p("How soon and how often the recorder reads the rings (`magnet record --wakeup-fill`, `--poll-interval`): BPF wakes it when a CPU's ring is filled past the wake-up fill, and it reads them at least every poll interval anyway; a ring that fills before the reader comes back loses events (counted). \"Never woken\" is MAGNeT's reader, which slept a fixed time between drains (the papers' Figures 9 and 10). The last policy writes the trace from the drain loop, which then waits whenever the file system does, instead of from a goroutine behind a queue. Buffer %s (all CPUs), the policies interleaved, %d runs each of %gs, recorded with %s; mean ± 95 %% CI over runs. CPU: per cent of one CPU over the transfer; sender: the sending workload process.\n\n",
				sizeName(sw.Policy[0].BufferBytes), maxRuns(sw.Policy), sw.DurationS, sw.Filter)
			p("| workload | link | policy | runs | runs with loss | produced | lost | unaccounted | loss %% | events/s | recorder CPU %% | sender CPU %% |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
			for _, row := range sw.Policy {
				p("| %s | %s | %s | %d | %d | %d | %d | %d | %s | %s | %s | %s |\n", row.Workload, row.Link, row.Policy, row.Runs, row.LossyRuns,
					row.Produced, row.Lost, row.Unaccounted, fmtStat(row.LossPct, 3), fmtStat(row.EventsPerS, 0), fmtStat(row.CPUPct, 1), fmtStat(row.SenderCPUPct, 1))
			}
		}
		if len(sw.Limit) > 0 {
			p("\n## What limits the event rate\n\n")
			p("The small-message workloads with nothing loaded, with magnet's programs loaded and their rings never read (once full, every event is counted lost), and recorded, default buffer, --port of the workload, interleaved, %d repetitions of %gs; mean ± 95 %% CI. Events/s: events produced (the programs' counters) / wall time; for the unobserved runs *estimated* as their bytes/s × the events per byte of the loaded run of the same repetition. CPU: %% of one CPU; the machine has %d.\n\n", sw.Limit[0].Repetitions, sw.DurationS, r.Machine.Cores)
			p("| workload | configuration | messages/s | Mbit/s | events/s | sender CPU %% | receiver CPU %% | recorder CPU %% | lost |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
			for _, row := range sw.Limit {
				ev := fmtStat(row.EventsPerS, 0)
				if row.Estimated {
					ev += " (estimate)"
				}
				rec := "-"
				if row.RecorderCPU.N > 0 {
					rec = fmtStat(row.RecorderCPU, 1)
				}
				p("| %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", row.Workload, row.Config, fmtStat(row.MessagesPerS, 0), fmtStat(row.Mbit, 1), ev,
					fmtStat(row.SenderCPU, 1), fmtStat(row.ReceiverCPU, 1), rec, row.Lost)
			}
		}
	}
	if sy := r.Synth; sy != nil {
		p("\n## The recorder's ceiling, synthetic events\n\n")
		p("No network traffic: %s %s (bpf/synthevent.bpf.c) with BPF_PROG_TEST_RUN in batches of 1 ms, paced to each target rate, for %gs per row (a producer that falls behind makes fewer events, not more time), while record.Run drains the rings and writes the trace as `magnet record` does, filtered to the bench's own process, which makes no traffic. Each event is a 40-byte dev_xmit put in the ring of its CPU through the hooks' path (clock, counters, per-CPU ring, task). ns/event: the test run's own time per run (preemption excluded) less an empty program's, over the events per run; it includes the cache traffic of a reader taking the records on the other CPU. Recorder CPU: the bench process's CPU time less the producing threads', %% of one CPU over the run; producer CPU: theirs. Produced can exceed the runs by the events of a test run a signal interrupted, which is made again.\n\n", producersName(sy.Producers), producingProgram(sy.EventsPerRun), sy.DurationS)
		p("| target events/s | produced events/s | produced | recorded | lost | unaccounted | ns/event | recorder CPU %% | producer CPU %% |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, st := range sy.Steps {
			p("| %.0f | %.0f | %d | %d | %d | %d | %.1f | %.0f | %.0f |\n", st.TargetPerS, st.EventsPerS, st.Produced, st.Recorded, st.Lost, st.Unaccounted, st.NsPerEvent, st.RecorderCPU, st.ProducerCPU)
		}
		who := "the producer paced on one CPU, the recorder free to use both"
		if sy.Producers > 1 {
			who = fmt.Sprintf("%d producing threads, the recorder free to use every CPU", sy.Producers)
		}
		empty := fmtStat(sy.EmptyNs, 1) + " ns"
		if sy.EmptyNs.Mean > 2*quietEmptyNs {
			// bpf_stats is global: any process can turn it on.
			empty += fmt.Sprintf(", far above the ~%.0f ns of a quiet host: run statistics were probably on (BPF_ENABLE_STATS, e.g. another `magnet-lab bench --cost`), which add ~40 ns to every program run, these included", quietEmptyNs)
		}
		p("\nHighest synthetic rate recorded without loss: **%.0f events/s** (%s; empty test run %s).\n", sy.MaxZeroLossRate, who, empty)
	}
	if sl := r.SynthLoad; sl != nil && len(sl.Steps) > 0 {
		writeSynthLoad(p, sl)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// verdictText says the highest zero-loss rate of the loaded measurement,
// and what bounds it.
func (sl *SynthLoadResult) verdictText() string {
	if sl.MaxZeroLossRate == 0 {
		return "none: even the slowest run lost events"
	}
	t := fmt.Sprintf("%.2f M events/s (synthetic %.2f M/s paced at %.0f M/s, the rest the transfer's; no run at that rate or below lost events, %d of %d runs reached %.0f M/s)",
		sl.MaxZeroLossRate/1e6, sl.MaxZeroLossSynthetic/1e6, sl.MaxZeroLossTarget/1e6, sl.RunsAtGoal, len(sl.Runs), GoalEventRate/1e6)
	if !sl.AnyLoss {
		t += "; no run lost events: bounded by what the producer made beside the transfer (compare the synthetic rate with the target), not by the recorder"
	}
	return t
}

// writeSynthLoad writes the table of synthetic events while the transfer
// runs.
func writeSynthLoad(p func(string, ...any), sl *SynthLoadResult) {
	p("\n## Event rate while the workload runs: synthetic events beside the 64 KiB transfer\n\n")
	pinned := "unpinned: the scheduler places the producer, the recorder and both workload processes on the 2 CPUs"
	if sl.PinIgnored {
		pinned += " (even under --pin: the goal is the VM's rate, and pinned, the producer would share the sender's CPU with the sending workload and be the bound)"
	}
	p("The saturating transfer of the overhead table (%s) runs for %gs while %s %s (threads of the bench process) with BPF_PROG_TEST_RUN paced to the target rate for the same time (target 0: the transfer alone), and one recorder (record.Run, %s) records both: the transfer's events and the synthetic ones (the synthetic programs ask no filter). Rates climb until two in a row lose events; %s, interleaved (every rate once per round); %s. Total events/s: every event the programs produced / wall time (both started to both ended), of which synthetic: synthetic events made / wall. Produced, recorded, lost and unaccounted (= produced − recorded − lost) are summed over the runs. Recorder CPU: the bench process's CPU time less the producing threads', %% of one CPU; producer CPU: theirs (running the programs included). Throughput: the transfer's; reduction against the transfer alone of the same round. Mean ± 95 %% CI over rounds.\n\n",
		sl.Workload, sl.DurationS, producersName(sl.Producers), producingProgram(sl.EventsPerRun), sl.Filter, roundsName(sl.Rounds), pinned)
	p("| synthetic target/s | runs | runs with loss | total events/s | of which synthetic/s | produced | recorded | lost | unaccounted | recorder CPU %% | producer CPU %% | throughput Mbit/s | reduction %% |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range sl.Steps {
		p("| %.0f | %d | %d | %s | %s | %d | %d | %d | %d | %s | %s | %s | %s |\n", s.TargetPerS, s.Runs, s.LossyRuns,
			fmtStat(s.EventsPerS, 0), fmtStat(s.SyntheticPerS, 0), s.Produced, s.Recorded, s.Lost, s.Unaccounted,
			fmtStat(s.RecorderCPU, 1), fmtStat(s.ProducerCPU, 1), fmtStat(s.ThroughputMbit, 1), fmtStat(s.ReductionPct, 2))
	}
	p("\nHighest total event rate recorded without loss while the transfer runs: %s.\n", sl.verdictText())
}

func capital(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func maxRuns(rows []PolicyRow) int {
	n := 0
	for _, r := range rows {
		n = max(n, r.Runs)
	}
	return n
}

func maxReps(sums []CostSummary) int {
	n := 0
	for _, s := range sums {
		n = max(n, s.KernelNsPerRun.N)
	}
	return n
}

// change is after against before in per cent, or "-" when either is missing.
func change(before, after Stat) string {
	if before.N == 0 || after.N == 0 || before.Mean == 0 {
		return "-"
	}
	return fmt.Sprintf("%+.0f %%", 100*(after.Mean/before.Mean-1))
}

func labelOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// writeCPUTable writes what the machine's CPUs did over the transfers of
// one link, if that was measured (not in reports of earlier builds).
func writeCPUTable(p func(string, ...any), lr LinkResult) {
	measured, pinned := false, false
	for _, c := range lr.Configs {
		measured = measured || c.CPUPerGB.N > 0
		pinned = pinned || c.SenderVCPUPct.N > 0
	}
	if !measured {
		return
	}
	p("\nThe machine's CPUs over the same transfers (/proc/stat: everything that ran, softirq, kernel threads and tracers included; steal left out): ")
	if pinned {
		p("how busy each host's CPU was and how often it went to sleep (entries into an idle state other than polling, cpuidle; on a VM each is a halt and a wake-up) per GB received, ")
	}
	p("CPU time of all CPUs per GB received, and how much more that is than the baseline's of the same repetition: what the configuration costs in CPU whether or not the CPU bounds the link.\n\n")
	p("| configuration | sender's CPU busy %% | receiver's CPU busy %% | sender's CPU sleeps per GB | receiver's CPU sleeps per GB | CPU s per GB, all CPUs | more CPU per byte than baseline %% |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range lr.Configs {
		if c.Skipped != "" || c.CPUPerGB.N == 0 {
			continue
		}
		s, r, ss, rs := "-", "-", "-", "-"
		if c.SenderVCPUPct.N > 0 {
			s, r = fmtStat(c.SenderVCPUPct, 1), fmtStat(c.ReceiverVCPUPct, 1)
		}
		if c.SenderSleepsPerGB.N > 0 {
			ss, rs = fmtStat(c.SenderSleepsPerGB, 0), fmtStat(c.ReceiverSleepsPerGB, 0)
		}
		p("| %s | %s | %s | %s | %s | %s | %s |\n", c.Name, s, r, ss, rs, fmtStat(c.CPUPerGB, 3), fmtStat(c.CPUCostPct, 2))
	}
}

// writeChurn writes the connection churn section: what ran, the table, and
// what recording one side, and recording another port, cost a connection.
func writeChurn(p func(string, ...any), c *ChurnResult) {
	p("\n## Connection churn\n\n")
	p("Short TCP connections, one after another, where recording costs most: each makes and frees two sockets, which the programs see for the first time (the filters' verdict, kept in their maps) and announce (conn_open, conn_close), and a handful of packets. %s: the sender connects, sends one %d-byte request in one send call, reads until the server closes and closes; the server closes first, so TIME_WAIT stays on its side and the sender never runs out of ephemeral ports. On an unlimited veth link of its own; the configurations interleaved, %s of %gs each; mean ± 95 %% CI. record-other-port is `magnet record --port %d` (a port no run uses) with the recorder on the sender's side: what every other connection on a host pays while magnet records one service. Connections/s: the sender's connections / its wall time; **reduction** against the baseline of the same round. CPU per connection: the busy time of all CPUs (/proc/stat: tracers, softirq and kernel threads included) over the run / connections. Events: recorded per connection; lost: ring full (tcpdump: dropped by kernel). Connections exact: for the configurations that record the sender's namespace alone, the runs whose trace announced and closed each connection the sender made once: a conn_close per connection (the bench waits up to 2 s for the last ones to close before it stops the tracer; one still open is left out), and a conn_open per connection.\n\n",
		c.Workload, c.Size, roundsName(c.Reps), c.DurationS, c.OtherPort)
	p("| configuration | connections/s | reduction %% | CPU µs per connection, all CPUs | more CPU per connection than baseline %% | events per connection | lost (tcpdump: dropped) | connections exact |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, cc := range c.Configs {
		if cc.Skipped != "" {
			p("| %s | %s | | | | | | |\n", cc.Name, cc.Skipped)
			continue
		}
		exact := "-"
		if cc.ConnsExact >= 0 {
			exact = fmt.Sprintf("%d of %d runs", cc.ConnsExact, len(cc.Runs))
		}
		p("| %s | %s | %s | %s | %s | %s | %s | %s |\n", cc.Name, fmtStat(cc.ConnsPerS, 0), fmtStat(cc.ReductionPct, 2),
			fmtStat(cc.CPUUsPerConn, 2), fmtStat(cc.CPUCostPct, 2), fmtStat(cc.EventsPerConn, 2), fmtStat(cc.Lost, 0), exact)
	}
	if text := c.summary(); text != "" {
		p("\n%s\n", text)
	}
}

// summary says, from the numbers, what recording the sender's side and
// recording another port cost a connection; "" when neither ran beside
// the baseline.
func (c *ChurnResult) summary() string {
	var parts []string
	for _, s := range []struct{ name, what string }{
		{RecordSender, "Recording the sender's namespace (record-sender) costs"},
		{RecordOtherPort, "recording another port (record-other-port) costs every other connection"},
		{RecordOtherExpr, "recording with an expression that excludes the traffic (record-other-expr) costs"},
	} {
		cc := c.config(s.name)
		if cc == nil || cc.ReductionPct.N == 0 {
			continue
		}
		part := fmt.Sprintf("%s **%s** of the connection rate", s.what, pct(cc.ReductionPct))
		if cc.CPUCostPct.N > 0 {
			part += fmt.Sprintf(" and %s CPU per connection", signedPct(cc.CPUCostPct))
		}
		parts = append(parts, part)
	}
	if len(parts) == 0 {
		return ""
	}
	return capital(strings.Join(parts, "; ")) + " (against the baseline of the same round)."
}
