// SPDX-License-Identifier: Apache-2.0

package overhead

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"
)

// synthetic builds a report from made-up runs whose figures are known:
// 1 GB received per run, the baseline 1 CPU s/GB and 8 Gbit/s.
func synthetic(t *testing.T) *Report {
	t.Helper()
	fixed, err := Select("record,tcpdump,perf")
	if err != nil {
		t.Fatal(err)
	}
	sat, err := Select("record,record-floor,tcpdump")
	if err != nil {
		t.Fatal(err)
	}
	r := &Report{Workload: Iperf3, RateMbit: 4000, Reps: 3, Duration: 4, Configs: fixed, SatConfigs: sat,
		Unavailable: map[string]string{PerfName: "perf not installed"}}
	run := func(phase, config string, rep int, recv uint64, busy float64, events, lost uint64) Run {
		x := Run{Phase: phase, Rep: rep, Config: config, Sent: recv + 1000, Received: recv, Seconds: 1, BusyS: busy,
			TracerS: busy / 10, Events: events, Lost: lost, TraceSent: -1, TraceRecv: -1}
		if config == Record {
			x.TraceSent, x.TraceRecv = int64(x.Sent)+iperf3Cookie, int64(recv)+iperf3Cookie
		}
		return x
	}
	for rep := 1; rep <= 3; rep++ {
		f := float64(rep)
		r.Runs = append(r.Runs,
			run(PhaseFixed, Baseline, rep, 1e9, 1, 0, 0),
			run(PhaseFixed, Record, rep, 1e9, 1+0.01*f, 200000, 0), // +1, +2, +3 %
			run(PhaseSaturation, Baseline, rep, 1e9, 1, 0, 0),
			run(PhaseSaturation, Record, rep, 0.98e9, 1, 200000, 0),   // 2 % lost
			run(PhaseSaturation, TcpdumpName, rep, 0.7e9, 1, 1000, 0), // 30 % lost
			run(PhaseSaturation, RecordFloor, rep, 0.9e9, 1, 0, 0),    // 10 % lost
		)
		if rep < 3 {
			r.Runs = append(r.Runs, run(PhaseFixed, TcpdumpName, rep, 1e9, 1.1+0.01*f, 1000, 0))
		}
	}
	// A failed run is reported and left out.
	r.Runs = append(r.Runs, Run{Phase: PhaseFixed, Rep: 3, Config: TcpdumpName, Err: "tcpdump: boom"})
	// tcpdump's second repetition could not keep the rate: 20 % less.
	for i := range r.Runs {
		if x := &r.Runs[i]; x.Phase == PhaseFixed && x.Config == TcpdumpName && x.Rep == 2 {
			x.Seconds = 1 / 0.8
		}
	}
	r.summarize()
	return r
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestSummarizeRows(t *testing.T) {
	r := synthetic(t)
	if len(r.Fixed) != 3 { // perf was unavailable
		t.Fatalf("fixed rows: %+v", r.Fixed)
	}
	rec := r.row(r.Fixed, Record)
	if rec.Runs != 3 || !near(rec.MoreCPU.Mean, 2) || !near(rec.MoreCPU.Half, 4.303/math.Sqrt(3)) {
		t.Errorf("record more CPU: %+v", rec.MoreCPU)
	}
	// 2 % more of 1 s/GB over 200,000 events per GB: 100 ns per event.
	if !near(rec.NsPerEvent.Mean, 100) || !near(rec.EventsPerGB.Mean, 200000) || !near(rec.Gbps.Mean, 8) {
		t.Errorf("record: %+v", rec)
	}
	if rec.Accounting != "3 of 3 exact" {
		t.Errorf("accounting %q", rec.Accounting)
	}
	td := r.row(r.Fixed, TcpdumpName)
	if td.Runs != 2 || td.Failed != 1 || !near(td.MoreCPU.Mean, 11.5) {
		t.Errorf("tcpdump: %+v", td)
	}
	if l := r.row(r.Saturation, TcpdumpName).Loss; !near(l.Mean, 30) || !near(l.Half, 0) {
		t.Errorf("tcpdump loss %+v", l)
	}
}

func TestGoals(t *testing.T) {
	r := synthetic(t)
	want := []string{"met", "met", "not measured", "not measured", "met", "met", "met"}
	if len(r.Goals) != len(want) {
		t.Fatalf("goals: %+v", r.Goals)
	}
	for i, g := range r.Goals {
		if g.Verdict != want[i] {
			t.Errorf("goal %q: %s (%s), want %s", g.Goal, g.Verdict, g.Measured, want[i])
		}
	}
	// One lost event fails "nothing lost"; a byte off fails the accounting.
	r.Runs[1].Lost = 1
	r.Runs[1].TraceRecv++
	r.summarize()
	if g := r.Goals[5]; g.Verdict != "not met" || !strings.Contains(g.Measured, "1 events lost") {
		t.Errorf("lost: %+v", g)
	}
	if g := r.Goals[6]; g.Verdict != "not met" || g.Measured != "exact in 5 of 6 transfers" {
		t.Errorf("accounting: %+v", g)
	}
	// An interval over the 5 % bound leaves the first goal open.
	for i := range r.Runs {
		if r.Runs[i].Phase == PhaseFixed && r.Runs[i].Config == Record {
			r.Runs[i].BusyS += 0.03
		}
	}
	r.summarize()
	if g := r.Goals[0]; g.Verdict != "undecided" {
		t.Errorf("+5 ± 2.5 %%: %+v", g)
	}
}

// The saturation goal says what the hooks alone lose against the goal's
// bound: 10 % lost against half of tcpdump's 30 %, so -5 points.
func TestGoalsFloor(t *testing.T) {
	r := synthetic(t)
	g := r.Goals[4]
	if !strings.Contains(g.Measured, "the hooks alone (record-floor) lose +10.0 ± 0.0 %, − half of tcpdump's -5.0 ± 0.0 %") {
		t.Errorf("saturation goal: %q", g.Measured)
	}
	if strings.Contains(r.Goals[0].Measured, "record-floor") {
		t.Errorf("no fixed-rate floor was run, yet: %q", r.Goals[0].Measured)
	}
}

func TestWriteMarkdown(t *testing.T) {
	r := synthetic(t)
	r.Diagnostic = &Diagnostic{Programs: []ProgStat{{Name: "mg_sock_send", Type: "tracing", Runs: 1000, NsPerRun: 50, NsPerGB: 5e6}}}
	r.SummaryDiagnostic = &Diagnostic{Programs: []ProgStat{{Name: "tcp_segments", Type: "SockOps", Runs: 10, NsPerRun: 500, NsPerGB: 5e3}}}
	var b bytes.Buffer
	if err := r.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, s := range []string{
		"## Against the goals",
		"| default groups at 4 Gbit/s: ≤ 5 % more CPU per GB than the baseline | +2.0 ± 2.5 % | **met** |",
		"## CPU per GB at 4 Gbit/s",
		"| record | `magnet record`, default groups | 8.00 ± 0.00 | 1.020 ± 0.025 | +2.0 ± 2.5 % | 200000 ± 0 | 100 ± 124 | 0.102 ± 0.002 | 0 | 3 |",
		"| tcpdump |", "2 (1 failed)",
		"## Throughput at saturation",
		"| tcpdump | 5.60 ± 0.00 | +30.0 ± 0.0 % |",
		"## Diagnostic: program bodies only (bpf_stats), not what the system pays",
		"| mg_sock_send | tracing | 1000 | 50 | 5.00 |",
		"Program bodies together: **5.0 ms per GB**; what the system paid for recording, from the table above: **20.0 ms per GB**",
		"| tcp_segments | SockOps | 10 | 500 | 0.005 |",
		"Program bodies together: **0.005 ms per GB**.",
		"- perf: perf not installed",
		"- fixed, repetition 3, tcpdump: tcpdump: boom",
		"record 3 of 3 exact",
		"Did not keep the fixed rate (throughput 5 % or more below the baseline's, same repetition, on average): tcpdump (+10.0 ± 127.1 %)",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q", s)
		}
	}
	if t.Failed() {
		t.Log(md)
	}
}

// TestNoiseReference: the baseline run again in each repetition is the
// run's own noise, reported beside the goals with no verdict of its own.
func TestNoiseReference(t *testing.T) {
	r := synthetic(t)
	r.Configs = append(r.Configs, again)
	for rep := 1; rep <= 3; rep++ {
		// 0.99, 1.00, 1.01 CPU s/GB against the baseline's 1: -1, 0, +1 %.
		r.Runs = append(r.Runs, Run{Phase: PhaseFixed, Rep: rep, Config: BaselineAgain, Sent: 1e9, Received: 1e9,
			Seconds: 1, BusyS: 0.99 + 0.01*float64(rep-1), TraceSent: -1, TraceRecv: -1})
	}
	r.summarize()
	g := r.Goals[len(r.Goals)-1]
	if g.Verdict != "reference" || g.Measured != "+0.0 ± 2.5 %" {
		t.Errorf("noise: %+v", g)
	}
	var b bytes.Buffer
	if err := r.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	if row := "| baseline-again | nothing recording, again, later in the repetition: the run's own noise | 8.00 ± 0.00 | 1.000 ± 0.025 | +0.0 ± 2.5 % | – | – | – | – | 3 |"; !strings.Contains(b.String(), row) {
		t.Errorf("markdown lacks %q:\n%s", row, b.String())
	}
}

// Summary mode by its parts: 2 ± ~0 ms per GB of recorder, 0.5 ms of
// program bodies and 1,000 runs (at 1 µs each, 1 ms) over a 1 s/GB
// baseline: 0.35 %, met; a recorder of 12 ms per GB is not.
func TestSummaryByParts(t *testing.T) {
	r := synthetic(t)
	r.Configs = append(r.Configs, *configNamed(Configs(), RecordSummary))
	for rep := 1; rep <= 3; rep++ {
		r.Runs = append(r.Runs, Run{Phase: PhaseFixed, Rep: rep, Config: RecordSummary, Sent: 1e9, Received: 1e9,
			Seconds: 1, BusyS: 1, TracerS: 0.002, Events: 8, TraceSent: -1, TraceRecv: -1})
	}
	r.SummaryDiagnostic = &Diagnostic{Run: Run{Received: 2e9}, Programs: []ProgStat{
		{Name: "sockops", Runs: 1500, NsPerGB: 0.4e6}, {Name: "kfree_skb", Runs: 500, NsPerGB: 0.1e6}}}
	r.summarize()
	g := r.summaryByParts()
	if g == nil || g.Verdict != "met" || !strings.HasPrefix(g.Measured, "+0.4 ± 0.0 %") ||
		!strings.Contains(g.Measured, "1000 runs per GB counted at 1000 ns each") {
		t.Fatalf("by parts: %+v", g)
	}
	for i := range r.Runs {
		if r.Runs[i].Config == RecordSummary {
			r.Runs[i].TracerS = 0.012
		}
	}
	r.summarize()
	if g := r.summaryByParts(); g.Verdict != "not met" {
		t.Errorf("12 ms per GB of recorder: %+v", g)
	}
	// Without its diagnostic there is nothing to judge the parts by.
	r.SummaryDiagnostic = nil
	r.summarize()
	if g := r.summaryByParts(); g != nil {
		t.Errorf("no diagnostic: %+v", g)
	}
}

// The flight recorder by its parts: its recorder process against the
// default's, paired by repetition.
func TestFlightByParts(t *testing.T) {
	r := synthetic(t)
	r.Configs = append(r.Configs, *configNamed(Configs(), RecordFlight))
	for rep := 1; rep <= 3; rep++ {
		// The record runs' recorder: 0.101-0.103 s per GB (synthetic's busy/10).
		r.Runs = append(r.Runs, Run{Phase: PhaseFixed, Rep: rep, Config: RecordFlight, Sent: 1e9, Received: 1e9,
			Seconds: 1, BusyS: 1.02, TracerS: 0.09 + 0.001*float64(rep), TraceSent: -1, TraceRecv: -1})
	}
	r.summarize()
	var g *Goal
	for i := range r.Goals {
		if strings.Contains(r.Goals[i].Goal, "by its parts (the same programs") {
			g = &r.Goals[i]
		}
	}
	if g == nil || g.Verdict != "met" || !strings.Contains(g.Measured, "paired difference -10.00 ± 0.00 ms per GB") {
		t.Fatalf("flight by parts: %+v", r.Goals)
	}
}

// Goal repetitions run only the goals' configurations, and the figures
// pair every repetition, the extra ones too.
func TestGoalReps(t *testing.T) {
	all := Configs()
	var names []string
	for _, c := range goalConfigs(all) {
		names = append(names, c.Name)
	}
	if strings.Join(names, ",") != "baseline,record,record-summary,record-flight,record-floor,record-noemit,baseline-again,tcpdump" {
		t.Errorf("goal configurations: %v", names)
	}
	r := synthetic(t)
	r.GoalReps = 2
	for rep := 4; rep <= 5; rep++ {
		r.Runs = append(r.Runs,
			Run{Phase: PhaseFixed, Rep: rep, Config: Baseline, Sent: 1e9, Received: 1e9, Seconds: 1, BusyS: 1, TraceSent: -1, TraceRecv: -1},
			Run{Phase: PhaseFixed, Rep: rep, Config: Record, Sent: 1e9, Received: 1e9, Seconds: 1, BusyS: 1.02, TraceSent: -1, TraceRecv: -1})
	}
	r.summarize()
	if rec := r.row(r.Fixed, Record); rec.MoreCPU.N != 5 || !near(rec.MoreCPU.Mean, 2) {
		t.Errorf("record over 3 + 2 repetitions: %+v", rec.MoreCPU)
	}
}

// Each repetition runs its configurations in an order of its own, drawn
// from the seed: the same seed, the same orders.
func TestRepOrders(t *testing.T) {
	all := Configs()
	a := repOrders(all, 6, 4, 7, PhaseFixed)
	if len(a) != 10 {
		t.Fatalf("%d repetitions", len(a))
	}
	names := func(cs []Config) string {
		var n []string
		for _, c := range cs {
			n = append(n, c.Name)
		}
		return strings.Join(n, ",")
	}
	firsts := map[string]bool{}
	for i, cs := range a {
		want := all
		if i >= 6 {
			want = goalConfigs(all)
		}
		got := slices.Clone(cs)
		slices.SortFunc(got, func(x, y Config) int { return strings.Compare(x.Name, y.Name) })
		w := slices.Clone(want)
		slices.SortFunc(w, func(x, y Config) int { return strings.Compare(x.Name, y.Name) })
		if names(got) != names(w) {
			t.Errorf("repetition %d runs %s, want %s", i+1, names(cs), names(want))
		}
		firsts[cs[0].Name] = true
	}
	if len(firsts) < 3 {
		t.Errorf("10 shuffled repetitions began with only %v", firsts)
	}
	b := repOrders(all, 6, 4, 7, PhaseFixed)
	for i := range a {
		if names(a[i]) != names(b[i]) {
			t.Errorf("seed 7, repetition %d: %s then %s", i+1, names(a[i]), names(b[i]))
		}
	}
	if c := repOrders(all, 6, 4, 8, PhaseFixed); names(c[0]) == names(a[0]) && names(c[1]) == names(a[1]) {
		t.Errorf("seeds 7 and 8 drew the same orders")
	}
}
