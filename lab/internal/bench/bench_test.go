// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/benchstat"
	"github.com/magnet-tracer/magnet/internal/netlab"
)

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{10, 12, 14})
	// sd = 2, t(0.975, 2) = 4.303, half-width = 4.303*2/sqrt(3).
	if s.Mean != 12 || math.Abs(s.CI95-4.303*2/math.Sqrt(3)) > 1e-9 || s.N != 3 {
		t.Fatalf("Summarize = %+v", s)
	}
	if s := Summarize([]float64{5}); s.Mean != 5 || s.CI95 != 0 {
		t.Fatalf("one value: %+v", s)
	}
	if s := Summarize(nil); s.N != 0 {
		t.Fatalf("no value: %+v", s)
	}
	if benchstat.T975(100) != 1.96 || benchstat.T975(1) != 12.706 {
		t.Fatal("t table")
	}
}

func TestEvaluateGoals(t *testing.T) {
	r := &Report{Links: []LinkResult{{RateMbit: 0, Configs: []ConfigResult{
		{Name: RecordSender, Runs: []Trial{{Rep: 1}}, ReductionPct: Stat{Mean: 0.5, N: 1}},
		{Name: TcpdumpSender, Runs: []Trial{{Rep: 1}}, ReductionPct: Stat{Mean: 40, N: 1}},
		{Name: RecordReceiver, Runs: []Trial{{Rep: 1, Tracer: Traced{Lost: 3}}}, ReductionPct: Stat{Mean: 2, N: 1}},
		{Name: Hooks, Runs: []Trial{{Rep: 1}}, ReductionPct: Stat{Mean: 0.25, N: 1}},
	}}}}
	g := evaluate(r)
	r.Goals = g
	// The hooks' own loss stands beside each side's (loaded did not run).
	if m := g[0].Measured; !strings.HasSuffix(m, "(hooks 0.25 %)") {
		t.Errorf("sender's loss: %q, want the hooks' beside it", m)
	}
	want := []string{met, met, missed, notMeasured, missed, notMeasured, notMeasured, notMeasured}
	if len(g) != len(want) {
		t.Fatalf("%d goals, want %d", len(g), len(want))
	}
	for i := range want {
		if g[i].Verdict != want[i] {
			t.Errorf("goal %q: %s, want %s (%s)", g[i].Goal, g[i].Verdict, want[i], g[i].Measured)
		}
	}
	var buf bytes.Buffer
	if err := r.WriteMarkdown(&buf); err != nil || !strings.Contains(buf.String(), "**missed**") {
		t.Fatalf("markdown: %v\n%s", err, buf.String())
	}
}

// TestCPUQualifiesThroughputGoal: a throughput loss within the goal on a
// link whose baseline left the sender's CPU idle part of the time is said
// to be that, with the CPU per byte beside it, and so is its comparison
// with tcpdump's; on a CPU-bound baseline the verdicts stay plain.
func TestCPUQualifiesThroughputGoal(t *testing.T) {
	for _, c := range []struct {
		busy       float64
		wantPrefix string
	}{
		{88, "met, on a link the sender's CPU did not bound (88.0 % busy"},
		{99, met},
	} {
		r := &Report{Links: []LinkResult{{RateMbit: 0, Configs: []ConfigResult{
			{Name: Baseline, Runs: []Trial{{Rep: 1}}, SenderVCPUPct: Stat{Mean: c.busy, N: 1}, CPUPerGB: Stat{Mean: 0.5, N: 1}, CPUCostPct: Stat{N: 1}},
			{Name: RecordSender, Runs: []Trial{{Rep: 1}}, ReductionPct: Stat{Mean: -5, CI95: 2, N: 3},
				CPUPerGB: Stat{Mean: 0.52, N: 3}, CPUCostPct: Stat{Mean: 4, CI95: 1.5, N: 3}, SenderVCPUPct: Stat{Mean: 99, N: 3}, ReceiverVCPUPct: Stat{Mean: 50, N: 3}},
		}}}}
		g := evaluate(r)[0]
		if !strings.HasPrefix(g.Verdict, c.wantPrefix) || (c.wantPrefix == met && g.Verdict != met) {
			t.Errorf("baseline sender CPU %.0f %% busy: verdict %q, want %q", c.busy, g.Verdict, c.wantPrefix)
		}
		// The comparison with tcpdump on that link says the same.
		r.Links[0].Configs = append(r.Links[0].Configs, ConfigResult{Name: TcpdumpSender, Runs: []Trial{{Rep: 1}}, ReductionPct: Stat{Mean: 30, CI95: 2, N: 3}})
		if v := evaluate(r)[1].Verdict; !strings.HasPrefix(v, c.wantPrefix) || (c.wantPrefix == met && v != met) {
			t.Errorf("baseline sender CPU %.0f %% busy: tcpdump comparison %q, want %q", c.busy, v, c.wantPrefix)
		}
		if !strings.Contains(g.Measured, "CPU per byte, all CPUs: +4.00 ± 1.50 % against the baseline") ||
			!strings.Contains(g.Measured, fmt.Sprintf("sender CPU was %.1f %% busy", c.busy)) {
			t.Errorf("measured %q lacks the CPU figures", g.Measured)
		}
		r.Goals = evaluate(r)
		var buf bytes.Buffer
		if err := r.WriteMarkdown(&buf); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(buf.String(), "| record-sender | 99.0 ± 0.0 | 50.0 ± 0.0 | - | - | 0.520 ± 0.000 | 4.00 ± 1.50 |") {
			t.Errorf("no CPU table row for record-sender:\n%s", buf.String())
		}
	}
}

// TestSummarizeCPU: CPU per GB comes from the machine's busy time and the
// bytes received, and its cost from the baseline of the same repetition.
func TestSummarizeCPU(t *testing.T) {
	base := map[int]Trial{
		1: {Rep: 1, ThroughputMbit: 100, Transfer: Xfer{RecvBytes: 2e9, CPUBusyS: 1, CPUWindowS: 1}},
		2: {Rep: 2, ThroughputMbit: 100, Transfer: Xfer{RecvBytes: 1e9, CPUBusyS: 1, CPUWindowS: 1}},
	}
	cr := ConfigResult{Name: RecordSender, Runs: []Trial{
		{Rep: 1, ThroughputMbit: 90, Transfer: Xfer{RecvBytes: 2e9, CPUBusyS: 1.1, CPUWindowS: 2, SenderVCPUBusyS: 2, ReceiverVCPUBusyS: 1,
			SenderVCPUSleeps: ptr(uint64(100)), ReceiverVCPUSleeps: ptr(uint64(3000))}},
		{Rep: 2, ThroughputMbit: 90, Transfer: Xfer{RecvBytes: 1e9, CPUBusyS: 1.1, CPUWindowS: 2, SenderVCPUBusyS: 2, ReceiverVCPUBusyS: 1}},
		{Rep: 3, ThroughputMbit: 90, Transfer: Xfer{RecvBytes: 1e9}}, // no CPU reading, no baseline
	}}
	cr.summarize(base)
	if cr.CPUPerGB.N != 2 || math.Abs(cr.CPUPerGB.Mean-0.825) > 1e-9 {
		t.Errorf("CPU per GB %+v, want 0.55 and 1.1 averaged", cr.CPUPerGB)
	}
	if cr.CPUCostPct.N != 2 || math.Abs(cr.CPUCostPct.Mean-10) > 1e-9 {
		t.Errorf("CPU cost %+v, want +10 %% in both repetitions", cr.CPUCostPct)
	}
	if cr.SenderVCPUPct.Mean != 100 || cr.ReceiverVCPUPct.Mean != 50 {
		t.Errorf("per-host CPU busy %+v / %+v, want 100 / 50", cr.SenderVCPUPct, cr.ReceiverVCPUPct)
	}
	// Sleeps only where counted (repetition 1): per GB received.
	if cr.SenderSleepsPerGB.N != 1 || cr.SenderSleepsPerGB.Mean != 50 || cr.ReceiverSleepsPerGB.Mean != 1500 {
		t.Errorf("sleeps per GB %+v / %+v, want 50 / 1500 from repetition 1 alone", cr.SenderSleepsPerGB, cr.ReceiverSleepsPerGB)
	}
	if cr.ReductionPct.N != 2 || math.Abs(cr.ReductionPct.Mean-10) > 1e-9 {
		t.Errorf("reduction %+v, want 10 %% against each repetition's baseline", cr.ReductionPct)
	}
}

func ptr[T any](v T) *T { return &v }

// TestVerdictsUseIntervals: a mean on the right side of a goal is not
// enough when the 95 % interval reaches across it.
func TestVerdictsUseIntervals(t *testing.T) {
	for _, c := range []struct {
		s    Stat
		want string
	}{
		{Stat{Mean: 0.5, CI95: 0.4, N: 3}, met},
		{Stat{Mean: -12.8, CI95: 57.9, N: 3}, undecided},
		{Stat{Mean: 2, CI95: 0.5, N: 3}, missed},
		{Stat{Mean: 1, N: 1}, met},
	} {
		if got := atMost(c.s, 1); got != c.want {
			t.Errorf("atMost(%+v, 1) = %s, want %s", c.s, got, c.want)
		}
	}
	if all(met, met) != met || all(met, undecided) != undecided || all(undecided, missed) != missed {
		t.Error("all() combines wrongly")
	}
	for _, c := range []struct {
		rec, dump Stat
		want      string
	}{
		{Stat{Mean: 0.5, CI95: 0.5, N: 3}, Stat{Mean: 30, CI95: 5, N: 3}, met}, // 25 ≥ 10 × 1
		{Stat{Mean: -12.8, CI95: 57.9, N: 3}, Stat{Mean: 25, CI95: 35, N: 3}, undecided},
		{Stat{Mean: 5, CI95: 1, N: 3}, Stat{Mean: 20, CI95: 5, N: 3}, missed},   // 25 < 10 × 4
		{Stat{Mean: -0.2, CI95: 0.1, N: 3}, Stat{Mean: 30, CI95: 2, N: 3}, met}, // record lost nothing
	} {
		r := &Report{Links: []LinkResult{{RateMbit: 0, Configs: []ConfigResult{
			{Name: RecordSender, Runs: []Trial{{Rep: 1}}, ReductionPct: c.rec},
			{Name: TcpdumpSender, Runs: []Trial{{Rep: 1}}, ReductionPct: c.dump},
		}}}}
		if got := evaluate(r)[1].Verdict; got != c.want {
			t.Errorf("record %+v vs tcpdump %+v: %s, want %s", c.rec, c.dump, got, c.want)
		}
	}
}

// smokeMagnet skips a test that cannot build namespaces and load BPF here,
// and builds the magnet binary whose workloads it runs.
func smokeMagnet(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and BPF")
	}
	if err := netlab.Available(); err != nil {
		t.Skip(err)
	}
	if testing.Short() {
		t.Skip("builds magnet and runs transfers")
	}
	bin := filepath.Join(t.TempDir(), "magnet")
	build := exec.Command("go", "build", "-o", bin, "github.com/magnet-tracer/magnet/cmd/magnet")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build magnet: %v\n%s", err, out)
	}
	return bin
}

// TestSmoke is the CI run of the bench: one repetition of 1-second
// transfers, baseline, loaded, record-sender and record-sender-sock,
// unlimited link, and the synthetic events at 1 M/s alone and beside the
// transfer (after the transfer alone). It keeps the bench code from
// rotting; its numbers mean little, but its accounting must be exact.
func TestSmoke(t *testing.T) {
	bin := smokeMagnet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var log bytes.Buffer
	r, err := Run(ctx, Options{
		Magnet: bin, Reps: 1, Duration: time.Second, Links: []int{0},
		Configs: []string{Baseline, Hooks, Loaded, RecordSender, RecordSenderSock}, Log: &log,
		Synth: true, SynthRates: []float64{1e6}, Cost: true,
	})
	t.Log(log.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Links) != 1 || len(r.Links[0].Configs) != 5 {
		t.Fatalf("report has %d links", len(r.Links))
	}
	for _, c := range r.Links[0].Configs {
		if c.Skipped != "" || c.ThroughputMbit.Mean <= 0 {
			t.Errorf("%s: throughput %v Mbit/s, skipped %q", c.Name, c.ThroughputMbit.Mean, c.Skipped)
		}
		// The machine's CPUs were busy with the transfer, never more
		// than all of them for its whole length.
		for _, run := range c.Runs {
			x := run.Transfer
			if x.CPUBusyS <= 0 || x.CPUWindowS < x.WallS || x.CPUBusyS > float64(runtime.NumCPU())*x.CPUWindowS {
				t.Errorf("%s: %.3f s of CPU busy over a %.3f s window (transfer %.3f s)", c.Name, x.CPUBusyS, x.CPUWindowS, x.WallS)
			}
		}
		if c.CPUPerGB.N == 0 {
			t.Errorf("%s: no CPU per GB", c.Name)
		}
		if c.Name == Hooks {
			// Every program attached, none producing: no event is
			// made, written or lost (other traffic on the host
			// included: the mask is the programs' own).
			for _, run := range c.Runs {
				if tr := run.Tracer; tr.Events != 0 || tr.Lost != 0 || tr.Produced != 0 {
					t.Errorf("hooks: %d events, %d lost, %d produced", tr.Events, tr.Lost, tr.Produced)
				}
			}
		}
		if c.Name == RecordSender && c.Events.Mean <= 0 {
			t.Errorf("record-sender recorded no events")
		}
		if c.Name == RecordSenderSock {
			// Socket calls only: a sock_send per write call at least (a
			// 64 KiB write may take several), and fewer events than
			// packets on the link, which every other layer would add.
			for _, run := range c.Runs {
				x, tr := run.Transfer, run.Tracer
				if tr.Lost != 0 || tr.Events < uint64(x.Messages) || tr.Events >= x.LinkPackets {
					t.Errorf("record-sender-sock: %d events (%d lost) for %d messages and %d packets", tr.Events, tr.Lost, x.Messages, x.LinkPackets)
				}
			}
		}
	}
	checkSynthLoad(t, r)
	checkCost(t, r)
	var md bytes.Buffer
	if err := r.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "## Event rate while the workload runs") {
		t.Errorf("markdown lacks the loaded synthetic table:\n%s", md.String())
	}
	if err := r.WriteJSON(&bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
}

// TestSweepSmoke runs the loss sweep (every ring size and drain policy of
// the full run, on every workload, one short transfer each), so that the
// code behind the full run's sweep tables cannot rot unnoticed. Losses at
// the small sizes depend on the machine; what must hold anywhere is that
// every event produced is either recorded or counted lost.
func TestSweepSmoke(t *testing.T) {
	bin := smokeMagnet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var log bytes.Buffer
	r, err := Run(ctx, Options{Magnet: bin, Reps: 1, Duration: 500 * time.Millisecond, Sweep: true, Log: &log})
	t.Log(log.String())
	if err != nil {
		t.Fatal(err)
	}
	sw := r.Sweep
	if sw == nil {
		t.Fatal("no sweep in the report")
	}
	workloads := map[string]int{}
	for _, row := range sw.Rows {
		workloads[row.Workload+" "+row.Link]++
		if row.Produced == 0 || row.Unaccounted != 0 || row.Recorded+row.Lost != row.Produced {
			t.Errorf("%s %s at %d B: produced %d, recorded %d, lost %d, unaccounted %d", row.Workload, row.Link, row.BufferBytes, row.Produced, row.Recorded, row.Lost, row.Unaccounted)
		}
	}
	if len(workloads) != len(sweepWorkloads) {
		t.Errorf("ring-size sweep over %d workloads, want %d: %v", len(workloads), len(sweepWorkloads), workloads)
	}
	for w, n := range workloads {
		if n != len(SweepBuffers) {
			t.Errorf("%s: %d ring sizes, want %d", w, n, len(SweepBuffers))
		}
	}
	if len(sw.Policy) != len(sweepWorkloads)*len(DrainPolicies) {
		t.Errorf("%d policy rows, want %d", len(sw.Policy), len(sweepWorkloads)*len(DrainPolicies))
	}
	policySeen := map[string]bool{}
	for _, row := range sw.Policy {
		policySeen[row.Workload+" "+row.Link] = true
		if row.Runs != 1 || row.Produced == 0 || row.Unaccounted != 0 || row.Lost > row.Produced {
			t.Errorf("policy %q, %s %s: %d runs, produced %d, lost %d, unaccounted %d", row.Policy, row.Workload, row.Link, row.Runs, row.Produced, row.Lost, row.Unaccounted)
		}
	}
	if !policySeen["udp 64 B unlimited"] || !policySeen["tcp 64 B unlimited"] {
		t.Errorf("policy sweep workloads %v lack the 64-byte TCP or UDP sends", policySeen)
	}
	if len(sw.Limit) == 0 {
		t.Error("no event-rate limit rows")
	}
	var md bytes.Buffer
	if err := r.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, section := range []string{"## Loss against ring-buffer size", "## Loss and CPU against the drain policy", "## What limits the event rate", "| udp 64 B | unlimited | woken at 1/2 full"} {
		if !strings.Contains(md.String(), section) {
			t.Errorf("markdown lacks %q", section)
		}
	}
}

// TestChurnSmoke is the CI run of the churn measurement: one round of 1 s
// under baseline, record-sender and record-other-port. Its rates mean
// little; its accounting must be exact: both workload processes count the
// same connections and bytes, record-sender announces and closes each
// connection the sender made once (exactConns) and loses nothing, and
// record-other-port, whose port no socket has, writes no event at all,
// nor does record-other-expr, whose expression no socket matches.
func TestChurnSmoke(t *testing.T) {
	bin := smokeMagnet(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var log bytes.Buffer
	r, err := Run(ctx, Options{
		Magnet: bin, Reps: 1, Duration: time.Second, Churn: true,
		ChurnConfigs: []string{Baseline, RecordSender, RecordOtherPort, RecordOtherExpr}, Log: &log,
	})
	t.Log(log.String())
	if err != nil {
		t.Fatal(err)
	}
	if r.Churn == nil || len(r.Churn.Configs) != 4 || len(r.Links) != 0 {
		t.Fatalf("churn %+v, %d links", r.Churn, len(r.Links))
	}
	for _, c := range r.Churn.Configs {
		if c.Skipped != "" || len(c.Runs) != 1 {
			t.Fatalf("%s: %d runs, skipped %q", c.Name, len(c.Runs), c.Skipped)
		}
		run := c.Runs[0]
		x, tr := run.Transfer, run.Tracer
		if x.Connections <= 0 || x.Accepted != x.Connections || x.SentBytes != ChurnSize*x.Connections || x.RecvBytes != x.SentBytes {
			t.Errorf("%s: sender %d bytes in %d connections, receiver %d in %d", c.Name, x.SentBytes, x.Connections, x.RecvBytes, x.Accepted)
		}
		if x.CPUBusyS <= 0 || c.CPUUsPerConn.N != 1 {
			t.Errorf("%s: %.3f s of CPU busy, %v µs per connection", c.Name, x.CPUBusyS, c.CPUUsPerConn)
		}
		switch c.Name {
		case RecordSender:
			if tr.Events == 0 || tr.Lost != 0 || !exactConns(run) || c.ConnsExact != 1 {
				t.Errorf("record-sender: %d events, %d lost, %d conn_open and %d conn_close for %d connections", tr.Events, tr.Lost, tr.ConnOpens, tr.ConnCloses, x.Connections)
			}
		case RecordOtherPort, RecordOtherExpr:
			if tr.Events != 0 || tr.Produced != 0 || tr.Lost != 0 || tr.ConnOpens != 0 || tr.ConnCloses != 0 {
				t.Errorf("%s: %d events (%d produced, %d lost, %d conn_open, %d conn_close), want none", c.Name, tr.Events, tr.Produced, tr.Lost, tr.ConnOpens, tr.ConnCloses)
			}
		}
	}
	var md bytes.Buffer
	if err := r.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Connection churn", "| record-other-port | ", "Recording the sender's namespace (record-sender) costs"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	if err := r.WriteJSON(&bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
}

// checkSynthLoad checks the smoke run's synthetic events beside the
// transfer: the transfer alone, then 1 M/s, each recorded exactly (every
// event produced was recorded or counted lost), the synthetic runs counted
// among the events produced under the sender's --netns filter beside the
// transfer's own.
func checkSynthLoad(t *testing.T, r *Report) {
	t.Helper()
	if r.Synth == nil || len(r.Synth.Steps) != 1 {
		t.Fatalf("synthetic ceiling: %+v", r.Synth)
	}
	if st := r.Synth.Steps[0]; st.Runs == 0 || st.Produced < st.Runs || st.Produced > st.Runs+st.Retried || st.Recorded+st.Lost != st.Produced || st.Unaccounted != 0 {
		t.Errorf("synthetic ceiling at 1 M/s: runs %d (+ at most %d), produced %d, recorded %d, lost %d", st.Runs, st.Retried, st.Produced, st.Recorded, st.Lost)
	}
	sl := r.SynthLoad
	if sl == nil || len(sl.Runs) != 2 || len(sl.Steps) != 2 {
		t.Fatalf("synthetic events beside the transfer: %+v", sl)
	}
	for _, st := range sl.Runs {
		if st.Recorded+st.Lost != st.Produced || st.Unaccounted != 0 {
			t.Errorf("target %.0f: produced %d, recorded %d, lost %d, unaccounted %d", st.TargetPerS, st.Produced, st.Recorded, st.Lost, st.Unaccounted)
		}
		if st.Transfer == nil || st.ThroughputMbit <= 0 || st.EventsPerS <= 0 {
			t.Errorf("target %.0f: transfer %+v, %v Mbit/s, %v events/s", st.TargetPerS, st.Transfer, st.ThroughputMbit, st.EventsPerS)
		}
	}
	alone, synth := sl.Runs[0], sl.Runs[1]
	if alone.TargetPerS != 0 || alone.Runs != 0 || alone.Produced == 0 {
		t.Errorf("the transfer alone: target %.0f, synthetic runs %d, produced %d", alone.TargetPerS, alone.Runs, alone.Produced)
	}
	// Whole batches of 1 ms (in whole test runs of EventsPerRun events),
	// and the transfer's events beside them.
	batch := uint64(1000 / max(synth.EventsPerRun, 1) * synth.EventsPerRun)
	if synth.TargetPerS != 1e6 || synth.EventsPerRun < 1 || synth.Runs == 0 || synth.Runs%batch != 0 || synth.Produced <= synth.Runs+synth.Retried {
		t.Errorf("1 M/s beside the transfer: %d synthetic events (%d per test run; + at most %d), produced %d", synth.Runs, synth.EventsPerRun, synth.Retried, synth.Produced)
	}
	if s := sl.Steps[1]; s.ReductionPct.N != 1 || s.SynthRuns != synth.Runs {
		t.Errorf("1 M/s step %+v", s)
	}
}

// checkCost checks the per-event cost runs: a `magnet record` process
// whose trace accounts for every event its programs produced, its own CPU
// time in its summary, and bpf_stats of its programs.
func checkCost(t *testing.T, r *Report) {
	t.Helper()
	if r.Cost == nil || len(r.Cost.Runs) != 2 {
		t.Fatalf("cost: %+v", r.Cost)
	}
	for _, run := range r.Cost.Runs {
		if run.Drained == 0 || run.Drained+run.Lost != run.Produced {
			t.Errorf("%s: %d drained + %d lost, %d produced", run.Workload, run.Drained, run.Lost, run.Produced)
		}
		if run.UserNsPerEvent <= 0 || run.UserSysNsPerEvent > run.UserNsPerEvent {
			t.Errorf("%s: drain %.1f ns/event, %.1f of it in system calls", run.Workload, run.UserNsPerEvent, run.UserSysNsPerEvent)
		}
		var runs uint64
		for _, pc := range run.Programs {
			runs += pc.RunCount
		}
		if runs == 0 || run.KernelNsPerRun <= 0 {
			t.Errorf("%s: %d program runs, %.1f ns/run", run.Workload, runs, run.KernelNsPerRun)
		}
	}
}

func TestCostSummariesAndBefore(t *testing.T) {
	run := func(w string, rep int, perRun, floor, user float64) CostRun {
		return CostRun{Workload: w, Rep: rep, KernelNsPerRun: perRun, FloorNsPerRun: floor, FloorRuns: 10,
			KernelNsPerEvent: 2 * perRun, UserNsPerEvent: user, Produced: 1000,
			Programs: []ProgCost{{Name: "p", RunCount: 10, RuntimeNs: uint64(10 * perRun)}}}
	}
	after := &CostResult{MHz: 2600, Runs: []CostRun{
		run("bulk", 1, 100, 40, 30), run("small", 1, 80, 40, 20),
		run("bulk", 2, 110, 40, 32), run("small", 2, 90, 40, 22),
	}}
	sums := after.Summaries()
	if len(sums) != 2 || sums[0].Workload != "bulk" || sums[1].Workload != "small" {
		t.Fatalf("summaries %+v", sums)
	}
	if b := sums[0]; b.KernelNsPerRun.Mean != 105 || b.KernelNetNsPerRun.Mean != 65 || b.KernelNsPerRun.N != 2 ||
		b.Programs[0].RunCount != 20 || b.Programs[0].NsPerRun != 105 {
		t.Fatalf("bulk summary %+v", b)
	}
	// An earlier report without the empty program: no net figure.
	old := &CostResult{Runs: []CostRun{{Workload: "bulk", KernelNsPerRun: 200, KernelNsPerEvent: 400, UserNsPerEvent: 130}}}
	dir := t.TempDir()
	path := filepath.Join(dir, "before.json")
	var buf bytes.Buffer
	if err := (&Report{Command: "magnet-lab bench --cost", Label: "main", Cost: old}).WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	before, err := ReadBefore(path)
	if err != nil {
		t.Fatal(err)
	}
	r := &Report{Cost: after, Before: before, Label: "perf"}
	r.Goals = evaluate(r)
	buf.Reset()
	if err := r.WriteMarkdown(&buf); err != nil {
		t.Fatal(err)
	}
	md := buf.String()
	for _, want := range []string{
		"## Per-event cost, before and after",
		"Before: main",
		"| bulk | kernel ns/run (bpf_stats) | 200.0 | 105.0 ± 63.5 | -48 % |",
		"| bulk | kernel net ns/run | - | 65.0 ± 63.5 | - |",
		"| bulk | drain ns/event | 130.0 | 31.0 ± 12.7 | -76 % |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if _, err := ReadBefore(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("a missing file was accepted")
	}
	os.WriteFile(path, []byte(`{"command":"x"}`), 0o644)
	if _, err := ReadBefore(path); err == nil || !strings.Contains(err.Error(), "no per-event cost") {
		t.Errorf("a report without cost: %v", err)
	}
}

func TestPairedSummaries(t *testing.T) {
	side := func(perRun, drain float64, produced, runtime, cpu uint64) PairSide {
		return PairSide{NsPerRun: perRun, DrainNsPerEvent: drain, Produced: produced, RuntimeNs: runtime, CPUNs: cpu}
	}
	// The new build makes half the events of the old for the same
	// transfers: its totals, not its per-event figures, compare.
	pr := &PairedResult{This: "new", Other: "old", Note: "both at once", Runs: []PairedRun{
		{Workload: "bulk", Rep: 1, ThisFirst: true, This: side(100, 30, 50, 6000, 1500), Other: side(200, 60, 100, 10000, 2000), FloorNsPerRun: 40},
		{Workload: "bulk", Rep: 1, ThisFirst: false, This: side(90, 30, 50, 6000, 1500), Other: side(180, 60, 100, 10000, 2000), FloorNsPerRun: 40},
	}}
	sums := pr.Summaries()
	if len(sums) != 1 || sums[0].ThisNsPerRun.Mean != 95 || sums[0].OtherNsPerRun.Mean != 190 ||
		sums[0].RunRatio.Mean != 0.5 || sums[0].DrainRatio.Mean != 0.5 || sums[0].Floor.Mean != 40 ||
		sums[0].KernelRatio.Mean != 0.6 || sums[0].CPURatio.Mean != 0.75 || sums[0].Produced.Mean != 50 || sums[0].OtherProduced.Mean != 100 {
		t.Fatalf("summaries %+v", sums)
	}
	var buf bytes.Buffer
	if err := (&Report{Paired: pr, Settings: Settings{DurationS: 3}}).WriteMarkdown(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| bulk | kernel ns/run (bpf_stats) | 190.0 ± 127.1 | 95.0 ± 63.5 | 0.50 ± 0.00 |",
		"| bulk | events produced | 100 ± 0 | 50 ± 0 | |",
		"| bulk | kernel run time, same transfers | | | 0.60 ± 0.00 |",
		"| bulk | recorder CPU time, same transfers | | | 0.75 ± 0.00 |",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Fatalf("markdown lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestSummarizeLimit(t *testing.T) {
	loaded := []limitTrial{
		{x: &Xfer{Messages: 1000, RecvBytes: 64000, WallS: 2, SenderCPUS: 1, ReceiverCPUS: 0.5}, produced: 10000, lost: 7},
		{x: &Xfer{Messages: 1000, RecvBytes: 64000, WallS: 2, SenderCPUS: 1, ReceiverCPUS: 0.5}, produced: 20000},
	}
	un := []limitTrial{
		{x: &Xfer{Messages: 4000, RecvBytes: 256000, WallS: 2}},
		{x: &Xfer{Messages: 2000, RecvBytes: 128000, WallS: 2}},
	}
	row := summarizeLimit("tcp 64 B", LimitUnobserved, un, loaded)
	// 10000/64000 events per byte × 128000 bytes/s, and 20000/64000 × 64000.
	if !row.Estimated || row.EventsPerS.N != 2 || row.EventsPerS.Mean != (20000+20000)/2 || row.MessagesPerS.Mean != 1500 {
		t.Fatalf("unobserved: %+v", row)
	}
	row = summarizeLimit("tcp 64 B", LimitLoaded, loaded, loaded)
	if row.Estimated || row.EventsPerS.Mean != 7500 || row.Lost != 7 || row.SenderCPU.Mean != 50 || row.ReceiverCPU.Mean != 25 || row.RecorderCPU.N != 0 {
		t.Fatalf("loaded: %+v", row)
	}
	row = summarizeLimit("tcp 64 B", LimitRecorded, []limitTrial{{x: &Xfer{Messages: 10, RecvBytes: 640, WallS: 1}, produced: 100, cpuS: 0.25}}, loaded)
	if row.RecorderCPU.Mean != 25 || row.EventsPerS.Mean != 100 || row.Mbit.Mean != 640*8/1e6 {
		t.Fatalf("recorded: %+v", row)
	}
}

// TestPairedCPUFrom checks that the paired table says where its CPU times
// come from, and that a side without its own account makes both sides use
// the transfer's.
func TestPairedCPUFrom(t *testing.T) {
	for _, c := range []struct {
		this, other uint64 // own accounts, ns
		from        string
		want        float64 // this side's drain, ns per event
	}{{2000, 3000, "summary", 20}, {2000, 0, "transfer", 10}, {0, 3000, "transfer", 10}} {
		this := PairSide{Drained: 100, windowNs: 1000, ownNs: c.this}
		other := PairSide{Drained: 100, windowNs: 1000, ownNs: c.other}
		if from := useCPUs(&this, &other); from != c.from || this.DrainNsPerEvent != c.want || this.CPUNs != uint64(c.want*100) {
			t.Errorf("own %d/%d: %s, drain %.1f ns/event, want %s, %.1f", c.this, c.other, from, this.DrainNsPerEvent, c.from, c.want)
		}
	}
	p := &PairedResult{Runs: []PairedRun{{CPUFrom: "summary"}, {CPUFrom: "transfer"}}}
	if got := p.cpuFrom(); !strings.HasPrefix(got, "1 runs each recorder's CPU time from the transfer's start") || !strings.Contains(got, "1 measured over the transfer") {
		t.Errorf("cpuFrom = %q", got)
	}
}

// TestChurnSummary: connections/s, reduction and CPU per connection against
// the baseline of the same round, events per connection, the conn_open
// check for sender-side recordings only, and the section's text.
func TestChurnSummary(t *testing.T) {
	trial := func(rep int, conns int64, wall, busy float64, events, connOpens, connCloses uint64) Trial {
		return Trial{Rep: rep, Transfer: Xfer{Connections: conns, Accepted: conns, WallS: wall, CPUBusyS: busy},
			Tracer: Traced{Events: events, ConnOpens: connOpens, ConnCloses: connCloses}}
	}
	base := []Trial{trial(1, 30000, 1, 1.5, 0, 0, 0), trial(2, 20000, 1, 1.0, 0, 0, 0)}
	c := &ChurnResult{Reps: 2, DurationS: 1, Size: ChurnSize, OtherPort: OtherPort, Workload: "churn", Configs: []ChurnConfigResult{
		{Name: Baseline, Runs: base, ConnsExact: -1},
		// 20 % fewer connections, 25 % more CPU each, 10 events each;
		// round 1 exact, round 2 announced a connection twice.
		{Name: RecordSender, Runs: []Trial{trial(1, 24000, 1, 1.5, 240000, 24000, 24000), trial(2, 16000, 1, 1.0, 160000, 16001, 16000)}, ConnsExact: -1},
		{Name: RecordOtherPort, Runs: []Trial{trial(1, 27000, 1, 1.5, 0, 0, 0), trial(2, 18000, 1, 1.0, 0, 0, 0)}, ConnsExact: -1},
		{Name: TcpdumpSender, Skipped: "not available: tcpdump not installed", ConnsExact: -1},
	}}
	byRep := baselines(map[string][]Trial{Baseline: base})
	for i := range c.Configs {
		if c.Configs[i].Skipped == "" {
			c.Configs[i].summarize(byRep)
		}
	}
	rs := c.config(RecordSender)
	if rs.ConnsPerS.Mean != 20000 || math.Abs(rs.ReductionPct.Mean-20) > 1e-9 || rs.ReductionPct.CI95 > 1e-9 ||
		rs.CPUUsPerConn.Mean != 62.5 || math.Abs(rs.CPUCostPct.Mean-25) > 1e-9 || rs.EventsPerConn.Mean != 10 || rs.ConnsExact != 1 {
		t.Errorf("record-sender: %+v", rs)
	}
	for _, tc := range []struct {
		opens, closes uint64
		want          bool
	}{{100, 100, true}, {101, 100, false}, {99, 100, false}, {100, 99, false}} {
		if got := exactConns(trial(1, 100, 1, 1, 0, tc.opens, tc.closes)); got != tc.want {
			t.Errorf("100 connections, %d conn_open, %d conn_close: exact %v, want %v", tc.opens, tc.closes, got, tc.want)
		}
	}
	// A connection still closing when the tracer stopped has no
	// conn_close, and is not counted against the trace.
	unclosed := trial(1, 100, 1, 1, 0, 100, 99)
	unclosed.Transfer.Unclosed = 1
	if !exactConns(unclosed) {
		t.Error("one connection left unclosed: not exact")
	}
	if o := c.config(RecordOtherPort); o.ConnsExact != -1 || math.Abs(o.ReductionPct.Mean-10) > 1e-9 || o.EventsPerConn.Mean != 0 {
		t.Errorf("record-other-port: %+v", o)
	}
	if c.config(TcpdumpSender) != nil {
		t.Error("a skipped configuration has a result")
	}
	var buf bytes.Buffer
	if err := (&Report{Churn: c}).WriteMarkdown(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## Connection churn",
		"| record-sender | 20000 ± 50824 | 20.00 ± 0.00 | 62.50 ± 0.00 | 25.00 ± 0.00 | 10.00 ± 0.00 | 0 ± 0 | 1 of 2 runs |",
		"| record-other-port | 22500 ± 57177 | 10.00 ± 0.00 | 55.56 ± 0.00 | 11.11 ± 0.00 | 0.00 ± 0.00 | 0 ± 0 | - |",
		"| tcpdump-sender | not available: tcpdump not installed | | | | | | |",
		"Recording the sender's namespace (record-sender) costs **20.00 ± 0.00 %** of the connection rate and +25.00 ± 0.00 % CPU per connection; recording another port (record-other-port) costs every other connection **10.00 ± 0.00 %** of the connection rate and +11.11 ± 0.00 % CPU per connection",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, buf.String())
		}
	}
}
