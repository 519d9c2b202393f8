// SPDX-License-Identifier: Apache-2.0

package overhead

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/magnet-tracer/magnet/internal/benchstat"
)

// num formats an interval with prec decimals: "mean ± half".
func num(s benchstat.Interval, prec int) string {
	if s.N == 0 || math.IsNaN(s.Mean) {
		return "–"
	}
	if s.N < 2 {
		return fmt.Sprintf("%.*f", prec, s.Mean)
	}
	return fmt.Sprintf("%.*f ± %.*f", prec, s.Mean, prec, s.Half)
}

// WriteMarkdown writes the report as bench/RESULTS.md holds it.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	rate := fmt.Sprintf("%g Gbit/s", float64(r.RateMbit)/1000)

	p("# What recording costs\n\n")
	p("Measured by `magnet bench` on %s, %s – %s UTC", r.Host, r.Started.Format("2006-01-02 15:04"), r.Ended.Format("15:04"))
	if r.Command != "" {
		p(":\n\n```\n%s\n```\n\n", r.Command)
	} else {
		p(".\n\n")
	}
	work := fmt.Sprintf("iperf3 (one TCP stream, `iperf3 -c … -t %g -J`)", r.Duration)
	counter := "iperf3's receiver"
	if r.Workload == MagnetFlood {
		work = fmt.Sprintf("`magnet workload send --flood %gs --size 65536` (one TCP connection)", r.Duration)
		counter = "`magnet workload serve`"
	}
	phases := fmt.Sprintf("at a fixed rate below saturation (%s, tc tbf on both veth ends)", rate)
	if len(r.SatConfigs) > 0 {
		phases += " and at saturation (the veth unlimited)"
	}
	reps := "repetitions"
	if r.Reps == 1 {
		reps = "repetition"
	}
	if r.GoalReps > 0 {
		reps += fmt.Sprintf(", then %d more of only the configurations the goals compare (%s), so that the goals' intervals are narrower than the other rows' (the count fixed before the run)", r.GoalReps, strings.Join(GoalConfigs, ", "))
	}
	p("The workload is %s from one network namespace to another over a veth pair, %s. "+
		"Each repetition runs every configuration once, in an order drawn for each repetition (interleaved; seed %d, `--seed`), unpinned; "+
		"%d %s; each transfer %gs. CPU is the busy time of all CPUs over each transfer: their elapsed time less /proc/stat's idle, iowait and steal, "+
		"which the kernel measures at each entry and exit of the idle loop (NO_HZ), to the microsecond; the busy columns (user, system, softirq) "+
		"are only sampled at each tick and miss most of the interrupt and softirq time taken from idle, about a third of this workload's. "+
		"Whatever ran is in it: the workload, the tracer, softirq, kernel threads, BPF programs. **CPU per GB** is that over the GB (10⁹ bytes) %s counted; "+
		"**more CPU per GB** is the ratio to the same repetition's baseline, less 1. Figures are the mean ± the half-width "+
		"of the 95 %% confidence interval (Student t) over the repetitions; a goal is met only when the whole interval is on its side. "+
		"Before each tracer starts, and again before its transfer begins, the bench waits (up to 5 s) for the machine to be quiet "+
		"(at most 4 %% of all CPUs busy over 250 ms), so what one tracer leaves behind, or does while starting, does not land in the next transfer; "+
		"`baseline-again` runs nothing a second time in each repetition, and its difference from the baseline is what this run's noise alone makes of a figure.\n\n",
		work, phases, r.Seed, r.Reps, reps, r.Duration, counter)
	if n := r.unsettled(); n > 0 {
		p("**%d of %d runs began before the machine was quiet** (something else was running): their figures carry its CPU.\n\n", n, len(r.Runs))
	}
	if r.BPFStatsOn {
		p("**bpf_stats was on when this run began** (kernel.bpf_stats_enabled): every BPF program run, magnet's and bpftrace's, also read the clock twice. Figures are dearer than on a host without it.\n\n")
	}

	p("## Against the goals\n\n| goal | measured | verdict |\n|---|---|---|\n")
	for _, g := range r.Goals {
		p("| %s | %s | **%s** |\n", g.Goal, g.Measured, g.Verdict)
	}

	p("\n## CPU per GB at %s\n\n", rate)
	p("| configuration | what | Gbit/s | CPU s/GB | more CPU per GB than the baseline | events per GB | added CPU per event (ns) | tracer process CPU s/GB | lost | runs |\n")
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range r.Fixed {
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", row.Config, row.What, num(row.Gbps, 2), num(row.CPUPerGB, 3),
			dash(row.Config, pct(row.MoreCPU)), tracerCol(row.Config, num(row.EventsPerGB, 0)), tracerCol(row.Config, num(row.NsPerEvent, 0)),
			tracerCol(row.Config, num(row.TracerPerGB, 3)), tracerCol(row.Config, fmt.Sprint(row.Lost)), runs(row))
	}
	if slow := r.belowRate(); len(slow) > 0 {
		p("\nDid not keep the fixed rate (throughput 5 %% or more below the baseline's, same repetition, on average): %s; the tracer bounds the transfer there, and its CPU per GB is that of a saturated link.\n", strings.Join(slow, ", "))
	}
	p("\n")
	if r.WorkDir != "" {
		p("The tracers wrote their files under %s. ", r.WorkDir)
	}
	p("Events: magnet's records (task, interface and lost records are not events); tcpdump's packets received by its filter; perf's samples; bpftrace's lines. " +
		"Lost: events the recorder lost (tcpdump: dropped by kernel; perf: lost chunks). Added CPU per event: the CPU per GB above the same repetition's baseline, over the events per GB. " +
		"Tracer process: the tracer's threads' run time over the transfer (schedstat), a part of the CPU per GB; the rest of what it adds is in the kernel (hooks, programs, the paths they turn on, wake-ups).\n")
	acc := false
	for _, row := range r.Fixed {
		acc = acc || row.Accounting != ""
	}
	if acc {
		p("\nByte accounting (the trace's sock_send and sock_recv bytes on the workload's data connection against the workload's own counts; iperf3's less the 37-byte cookie it sends first):")
		for _, row := range r.Fixed {
			if row.Accounting != "" {
				p(" %s %s;", row.Config, row.Accounting)
			}
		}
		p("\n")
	}
	r.writeMadeOf(p)

	if len(r.Saturation) > 0 {
		p("\n## Throughput at saturation (veth unlimited)\n\n")
		p("| configuration | Gbit/s | throughput loss | CPU s/GB | more CPU per GB than the baseline | events per GB | lost | runs |\n")
		p("|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, row := range r.Saturation {
			p("| %s | %s | %s | %s | %s | %s | %s | %s |\n", row.Config, num(row.Gbps, 2), dash(row.Config, pct(row.Loss)), num(row.CPUPerGB, 3),
				dash(row.Config, pct(row.MoreCPU)), tracerCol(row.Config, num(row.EventsPerGB, 0)), tracerCol(row.Config, fmt.Sprint(row.Lost)), runs(row))
		}
		p("\nThroughput loss: 1 − the configuration's throughput over the same repetition's baseline's.\n")
	}

	if d := r.Diagnostic; d != nil {
		p("\n## Diagnostic: program bodies only (bpf_stats), not what the system pays\n\n")
		p("One transfer at %s recorded with the default groups, bpf_stats on (which itself adds two clock reads per run: this run is in no figure above). "+
			"Run time is the time inside each program's body as the kernel counts it; the hook's entry, trampolines, the kernel paths a hook turns on, cache misses and wake-ups are not in it.\n\n", rate)
		total := programTable(p, d.Programs, 2)
		p("\nProgram bodies together: **%.1f ms per GB**", total/1e6)
		if rec, base := r.row(r.Fixed, Record), r.row(r.Fixed, Baseline); rec != nil && base != nil && rec.CPUPerGB.N > 0 && base.CPUPerGB.N > 0 {
			added := (rec.CPUPerGB.Mean - base.CPUPerGB.Mean) * 1e3
			p("; what the system paid for recording, from the table above: **%.1f ms per GB** (record's CPU per GB less the baseline's, means)", added)
		}
		p(".\n")
	}
	if d := r.SummaryDiagnostic; d != nil {
		p("\nSummary mode's programs, one transfer at %s recorded with `--summary=1s`, bpf_stats on (its goal by parts above counts these):\n\n", rate)
		total := programTable(p, d.Programs, 3)
		p("\nProgram bodies together: **%.3f ms per GB**.\n", total/1e6)
	}

	if len(r.Unavailable) > 0 {
		p("\n## Not run\n\n")
		var names []string
		for n := range r.Unavailable {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			p("- %s: %s\n", n, r.Unavailable[n])
		}
	}
	var failed []Run
	for _, run := range r.Runs {
		if run.Err != "" {
			failed = append(failed, run)
		}
	}
	if len(failed) > 0 {
		p("\n## Failed runs (left out of the figures)\n\n")
		for _, run := range failed {
			p("- %s, repetition %d, %s: %s\n", run.Phase, run.Rep, run.Config, run.Err)
		}
	}
	for _, n := range r.Notes {
		p("\n%s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeMadeOf says what the default groups' added CPU is made of: each
// group alone, and how much of it is the recorder's process.
func (r *Report) writeMadeOf(p func(string, ...any)) {
	rec, base := r.row(r.Fixed, Record), r.row(r.Fixed, Baseline)
	if rec == nil || base == nil || rec.CPUPerGB.N == 0 || base.CPUPerGB.N == 0 {
		return
	}
	var parts []string
	for _, row := range r.Fixed {
		if strings.HasPrefix(row.Config, "record-") && row.MoreCPU.N > 0 && r.isMagnet(row.Config) && len(strings.Fields(row.What)) > 0 {
			parts = append(parts, fmt.Sprintf("%s %s", strings.TrimPrefix(row.Config, "record-"), pct(row.MoreCPU)))
		}
	}
	added := rec.CPUPerGB.Mean - base.CPUPerGB.Mean
	p("\nWhat the default groups' cost is made of: %s more CPU per GB (%.1f ms per GB)", pct(rec.MoreCPU), added*1e3)
	if rec.TracerPerGB.N > 0 {
		p(", of which the recorder process %.1f ms per GB (reading the rings, writing the file) and the rest, %.1f ms per GB, in the kernel",
			rec.TracerPerGB.Mean*1e3, (added-rec.TracerPerGB.Mean)*1e3)
	}
	if len(parts) > 0 {
		p("; each group alone (conn alone, then each with conn): %s", strings.Join(parts, ", "))
	}
	p(".\n")
}

// belowRate names the configurations whose fixed-rate throughput fell
// short of the baseline's by 5 % or more.
func (r *Report) belowRate() []string {
	var out []string
	for _, row := range r.Fixed {
		if row.Config != Baseline && row.Loss.N > 0 && row.Loss.Mean >= 5 {
			out = append(out, fmt.Sprintf("%s (%s)", row.Config, pct(row.Loss)))
		}
	}
	return out
}

func dash(config, s string) string {
	if config == Baseline {
		return "–"
	}
	return s
}

// tracerCol is s for a configuration that runs a tracer, a dash for the
// baseline and its second run.
func tracerCol(config, s string) string {
	if config == Baseline || config == BaselineAgain {
		return "–"
	}
	return s
}

func runs(row Row) string {
	if row.Failed > 0 {
		return fmt.Sprintf("%d (%d failed)", row.Runs, row.Failed)
	}
	return fmt.Sprint(row.Runs)
}

// unsettled counts the runs that began on a machine that was not quiet.
func (r *Report) unsettled() int {
	n := 0
	for _, run := range r.Runs {
		if run.Unsettled && run.Err == "" {
			n++
		}
	}
	return n
}

// programTable writes a diagnostic's programs, ms per GB to decimals
// places, and returns their run time per GB (ns) together.
func programTable(p func(string, ...any), progs []ProgStat, decimals int) float64 {
	p("| program | type | runs | ns per run | ms per GB |\n|---|---|---:|---:|---:|\n")
	var total float64
	for _, pr := range progs {
		p("| %s | %s | %d | %.0f | %.*f |\n", pr.Name, pr.Type, pr.Runs, pr.NsPerRun, decimals, pr.NsPerGB/1e6)
		total += pr.NsPerGB
	}
	return total
}
