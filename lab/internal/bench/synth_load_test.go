// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"strings"
	"testing"
)

// loadRun is one run of the loaded synthetic measurement.
func loadRun(rep int, target, perS, synthPerS float64, produced, lost uint64, mbit float64) SynthStep {
	return SynthStep{Rep: rep, TargetPerS: target, Runs: uint64(synthPerS), Produced: produced, Recorded: produced - lost, Lost: lost,
		WallS: 1, EventsPerS: perS, SyntheticPerS: synthPerS, RecorderCPU: 10, ProducerCPU: 20, ThroughputMbit: mbit}
}

// TestSynthLoadSummary: steps in the ladder's order, sums and the
// reduction against the transfer alone of the same round, and the highest
// zero-loss rate: the fastest run below the slowest run that lost events.
func TestSynthLoadSummary(t *testing.T) {
	res := &SynthLoadResult{Rounds: 2, DurationS: 1, Filter: "--netns x", Workload: "bulk", Runs: []SynthStep{
		loadRun(1, 0, 0.2e6, 0, 200000, 0, 10000),
		loadRun(1, 5e6, 5.3e6, 5.1e6, 5300000, 0, 8000),
		loadRun(1, 6e6, 6.2e6, 6.0e6, 6200000, 10, 7000),
		loadRun(2, 0, 0.2e6, 0, 200000, 0, 20000),
		loadRun(2, 5e6, 5.2e6, 5.0e6, 5200000, 0, 15000),
		loadRun(2, 6e6, 6.3e6, 6.1e6, 6300000, 0, 14000),
	}}
	res.summarize()
	if len(res.Steps) != 3 || res.Steps[0].TargetPerS != 0 || res.Steps[1].TargetPerS != 5e6 || res.Steps[2].TargetPerS != 6e6 {
		t.Fatalf("steps %+v", res.Steps)
	}
	s := res.Steps[1]
	// Reductions 20 % and 25 % against each round's transfer alone.
	if s.Runs != 2 || s.LossyRuns != 0 || s.Produced != 10500000 || s.Recorded != 10500000 || s.SynthRuns != 10100000 ||
		s.EventsPerS.Mean != 5.25e6 || s.ReductionPct.Mean != 22.5 || s.ThroughputMbit.Mean != 11500 {
		t.Fatalf("5 M step %+v", s)
	}
	if s := res.Steps[2]; s.LossyRuns != 1 || s.Lost != 10 || s.Recorded+s.Lost != s.Produced {
		t.Fatalf("6 M step %+v", s)
	}
	// The 6 M step lost at 6.2 M/s in one round: 6.3 M/s in the other
	// does not count, the fastest run below 6.2 M/s does.
	if res.MaxZeroLossRate != 5.3e6 || res.MaxZeroLossTarget != 5e6 || res.MaxZeroLossSynthetic != 5.1e6 || !res.AnyLoss || res.RunsAtGoal != 4 {
		t.Fatalf("max zero loss %v at %v (synthetic %v), any loss %v, %d runs at the goal", res.MaxZeroLossRate, res.MaxZeroLossTarget, res.MaxZeroLossSynthetic, res.AnyLoss, res.RunsAtGoal)
	}

	r := &Report{SynthLoad: res, Synth: &SynthResult{MaxZeroLossRate: 12.7e6}}
	r.Goals = evaluate(r)
	g := lastGoal(r)
	if !strings.Contains(g.Goal, "while the workload runs") || g.Verdict != met ||
		!strings.HasPrefix(g.Measured, "while the 64 KiB transfer runs: 5.30 M events/s (synthetic 5.10 M/s paced at 5 M/s, the rest the transfer's; no run at that rate or below lost events, 4 of 6 runs reached 5 M/s)") ||
		!strings.Contains(g.Measured, "no network workload: 12.70 M events/s") || strings.Contains(g.Measured, "no run lost") {
		t.Fatalf("goal %+v", g)
	}
	var buf bytes.Buffer
	if err := r.WriteMarkdown(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## Event rate while the workload runs: synthetic events beside the 64 KiB transfer",
		"| 0 | 2 | 0 | 200000 ± 0 | 0 ± 0 | 400000 | 400000 | 0 | 0 | 10.0 ± 0.0 | 20.0 ± 0.0 | 15000.0 ± 63530.0 | 0.00 ± 0.00 |",
		"| 5000000 | 2 | 0 | 5250000 ± 635300 | 5050000 ± 635300 | 10500000 | 10500000 | 0 | 0 |",
		"| 6000000 | 2 | 1 |",
		"recorded without loss while the transfer runs: 5.30 M events/s (synthetic 5.10 M/s paced at 5 M/s",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, buf.String())
		}
	}

	// The idle ceiling says how many threads made the events, and when its
	// empty test run says run statistics were on.
	buf.Reset()
	r = &Report{Synth: &SynthResult{MaxZeroLossRate: 5e6, Producers: 2, EmptyNs: Stat{Mean: 60, N: 3}}}
	if err := r.WriteMarkdown(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"No network traffic: 2 threads, each paced to 1/2 of the rate, run synth_event", "(2 producing threads, the recorder free to use every CPU; empty test run 60.0 ± 0.0 ns, far above the ~16 ns of a quiet host: run statistics were probably on"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, buf.String())
		}
	}

	// Below the goal and nothing lost: undecided, and said to be the
	// producer's bound.
	low := &SynthLoadResult{Rounds: 1, Runs: []SynthStep{loadRun(1, 0, 0.2e6, 0, 200000, 0, 9000), loadRun(1, 4e6, 3.1e6, 2.9e6, 3100000, 0, 6000)}}
	low.summarize()
	r = &Report{SynthLoad: low, Sweep: &SweepResult{MaxZeroLossRate: 2.24e6, MaxZeroLossWorkload: "tcp 64 B"}}
	g = lastGoal(r)
	if g.Verdict != noneReached || !strings.Contains(g.Measured, "3.10 M events/s") || !strings.Contains(g.Measured, "no run lost events") ||
		!strings.Contains(g.Measured, "small messages: 2.24 M events/s (tcp 64 B)") {
		t.Fatalf("goal %+v", g)
	}
	// Below the goal with a loss: missed.
	low.Runs = append(low.Runs, loadRun(1, 5e6, 3.5e6, 3.4e6, 3500000, 1, 5000))
	low.summarize()
	if g := lastGoal(&Report{SynthLoad: low}); g.Verdict != missed || !strings.Contains(g.Measured, "3.10 M events/s") {
		t.Fatalf("goal with a loss %+v", g)
	}
	// Every run lost.
	lossy := &SynthLoadResult{Rounds: 1, Runs: []SynthStep{loadRun(1, 0, 0.2e6, 0, 200000, 3, 9000)}}
	lossy.summarize()
	if g := lastGoal(&Report{SynthLoad: lossy}); g.Verdict != missed || !strings.Contains(g.Measured, "none: even the slowest run lost") {
		t.Fatalf("goal, every run lossy %+v", g)
	}
	// Without the loaded measurement the small messages judge, as before.
	r = &Report{Sweep: &SweepResult{MaxZeroLossRate: 2.24e6, MaxZeroLossWorkload: "tcp 64 B"}}
	if g := lastGoal(r); g.Verdict != missed || !strings.HasPrefix(g.Measured, "2.24 M events/s (tcp 64 B)") {
		t.Fatalf("goal without the loaded measurement %+v", g)
	}
}

// lastGoal is the event-rate goal, the last of evaluate's.
func lastGoal(r *Report) Goal {
	g := evaluate(r)
	return g[len(g)-1]
}
