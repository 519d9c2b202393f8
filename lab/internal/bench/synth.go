// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// Synthetic events: the recording path without a network stack around it.
// synth_event (bpf/synthevent.bpf.c), run with BPF_PROG_TEST_RUN, puts one
// dev_xmit event in the events ring of the CPU it runs on through the path
// every hook takes (clock, counters, per-CPU ring, task). The bench runs it
// from one thread (Options.SynthProducers: more, sharing the rate) at a
// paced rate while record.Run drains the rings and writes the trace, as
// `magnet record` does, in two ways:
//   - alone (SynthResult): the highest rate without loss is the recorder's
//     ceiling when the producer costs only the recording path and the host
//     does nothing else, which no real workload on this machine reaches;
//   - while the saturating 64 KiB transfer runs on the unlimited link and
//     is recorded too (SynthLoadResult): the highest total rate without
//     loss while the host is busy with real traffic, which is what the event-rate
//     goal's "while the workload also runs" asks.

// SynthRates are the paced rates tried alone, events/s.
var SynthRates = []float64{1e6, 2e6, 3e6, 4e6, 5e6, 6e6, 8e6, 10e6, 12e6, 16e6, 20e6, 24e6}

// SynthLoadRates are the paced rates tried while the transfer runs,
// events/s; 0 is the transfer alone, recorded: what the others' throughput
// is compared with.
var SynthLoadRates = []float64{0, 1e6, 2e6, 3e6, 4e6, 5e6, 6e6, 8e6, 10e6, 12e6, 16e6}

// SynthLoadReps bounds the rounds of the loaded measurement (the full
// run's machine time), as PolicyReps does the policy sweep's.
const SynthLoadReps = 3

// synthBatch is how long one BPF_PROG_TEST_RUN call produces for: the
// pacing step.
const synthBatch = time.Millisecond

// SynthResult is the synthetic-event measurement with nothing else running.
type SynthResult struct {
	DurationS float64 `json:"duration_s"`
	Producers int     `json:"producers"` // threads making the events
	// EventsPerRun is how many events one test run of the producing
	// program made (synth_burst's, or synth_event's 1).
	EventsPerRun int `json:"events_per_run"`
	// NsPerEvent is the producing program's time per run as the test run
	// measures it (preemption excluded) less synth_empty's, over the events
	// per run, while the recorder drains: what producing an event costs on
	// the hooks' path, warm.
	NsPerEvent Stat        `json:"ns_per_event"`
	EmptyNs    Stat        `json:"empty_ns"`
	Steps      []SynthStep `json:"steps"`
	// MaxZeroLossRate is the highest produced rate of a step that lost
	// nothing.
	MaxZeroLossRate float64 `json:"max_zero_loss_rate"`
}

// SynthStep is one paced run.
type SynthStep struct {
	TargetPerS float64 `json:"target_per_s"`
	Rep        int     `json:"rep,omitempty"` // the loaded measurement's round
	Runs       uint64  `json:"runs"`          // synthetic events made: test runs × EventsPerRun
	// Retried bounds the extra events of test runs a signal interrupted
	// (made again from the start): Runs <= synthetic events <= Runs + Retried.
	Retried uint64 `json:"retried,omitempty"`
	// Produced counts every event the programs produced, the synthetic
	// ones and, while a transfer runs, the workload's.
	Produced    uint64  `json:"produced"`
	Recorded    uint64  `json:"recorded"`
	Lost        uint64  `json:"lost"`
	Unaccounted int64   `json:"unaccounted"`
	WallS       float64 `json:"wall_s"`       // producer and transfer started to both ended
	EventsPerS  float64 `json:"events_per_s"` // produced / wall time
	// SyntheticPerS is Runs / wall time.
	SyntheticPerS float64 `json:"synthetic_per_s"`
	// RecorderCPU is the bench process's CPU time over the run less the
	// producing threads', per cent of one CPU.
	RecorderCPU float64 `json:"recorder_cpu_pct"`
	ProducerCPU float64 `json:"producer_cpu_pct"`
	NsPerEvent  float64 `json:"ns_per_event"` // test run's figure, less synth_empty's, per event
	// EventsPerRun is what one test run of the producing program made (0
	// when nothing was produced).
	EventsPerRun int `json:"events_per_run,omitempty"`
	// The transfer beside the producer (loaded measurement only).
	Transfer       *Xfer   `json:"transfer,omitempty"`
	ThroughputMbit float64 `json:"throughput_mbit,omitempty"`
}

// lossless says the step lost nothing and accounted for every event.
func (st *SynthStep) lossless() bool { return st.Lost == 0 && st.Unaccounted == 0 }

// errNoSynth says this kernel refused the synthetic programs.
var errNoSynth = errors.New("the synthetic-event programs did not load")

// synthRates is the ladder of one measurement: Options.SynthRates when
// set (the transfer alone still first beside the transfer), else def.
func (b *bencher) synthRates(def []float64, loaded bool) []float64 {
	if len(b.opts.SynthRates) == 0 {
		return def
	}
	if loaded {
		return append([]float64{0}, b.opts.SynthRates...)
	}
	return b.opts.SynthRates
}

func (b *bencher) synth(ctx context.Context) (*SynthResult, error) {
	sr := &SynthResult{DurationS: b.opts.SweepDuration.Seconds(), Producers: max(b.opts.SynthProducers, 1)}
	var per, empty []float64
	for _, rate := range b.synthRates(SynthRates, false) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		st, emptyNs, err := b.synthStep(ctx, nil, rate, b.opts.SweepDuration)
		if err != nil {
			return nil, err
		}
		b.logf("synth %5.1f M events/s: produced %.2f M/s, lost %d, unaccounted %d, %.1f ns/event (empty %.1f), recorder %.0f %% CPU, producer %.0f %%",
			rate/1e6, st.EventsPerS/1e6, st.Lost, st.Unaccounted, st.NsPerEvent, emptyNs, st.RecorderCPU, st.ProducerCPU)
		sr.Steps = append(sr.Steps, *st)
		sr.EventsPerRun = max(sr.EventsPerRun, st.EventsPerRun)
		per, empty = append(per, st.NsPerEvent), append(empty, emptyNs)
		if st.lossless() && st.EventsPerS > sr.MaxZeroLossRate {
			sr.MaxZeroLossRate = st.EventsPerS
		}
	}
	sr.NsPerEvent, sr.EmptyNs = Summarize(per), Summarize(empty)
	return sr, nil
}

// SynthLoadResult is synthetic events at paced rates while the saturating
// 64 KiB transfer runs on the unlimited link, recorded as record-sender
// records it.
type SynthLoadResult struct {
	DurationS    float64 `json:"duration_s"`
	Filter       string  `json:"filter"`
	Workload     string  `json:"workload"`
	Rounds       int     `json:"rounds"`
	Producers    int     `json:"producers"` // threads making the synthetic events
	EventsPerRun int     `json:"events_per_run"`
	// PinIgnored says --pin was given and this measurement ran unpinned
	// all the same.
	PinIgnored bool `json:"pin_ignored,omitempty"`
	// Steps summarize Runs per paced rate, in the ladder's order.
	Steps []SynthLoadStep `json:"steps"`
	Runs  []SynthStep     `json:"runs"`
	// MaxZeroLossRate is the highest total rate (events produced / wall)
	// of a run such that no run at that rate or below lost an event (so a
	// lossy run caps it, whatever its step); 0 if none.
	// MaxZeroLossTarget and MaxZeroLossSynthetic are that run's synthetic
	// target and synthetic rate. AnyLoss says some run lost events: when
	// none did, the figure is what the producer could make beside the
	// transfer, not the recorder's limit.
	MaxZeroLossRate      float64 `json:"max_zero_loss_rate"`
	MaxZeroLossTarget    float64 `json:"max_zero_loss_target"`
	MaxZeroLossSynthetic float64 `json:"max_zero_loss_synthetic"`
	AnyLoss              bool    `json:"any_loss"`
	// RunsAtGoal counts the runs of at least GoalEventRate events/s, all
	// lossless when MaxZeroLossRate reaches it.
	RunsAtGoal int `json:"runs_at_goal"`
}

// GoalEventRate is the overhead goals' event rate to sustain without loss while the
// workload runs, events/s.
const GoalEventRate = 5e6

// SynthLoadStep is one paced rate over the rounds.
type SynthLoadStep struct {
	TargetPerS     float64 `json:"target_per_s"`
	Runs           int     `json:"runs"`
	LossyRuns      int     `json:"lossy_runs"`
	SynthRuns      uint64  `json:"synth_runs"` // summed over the runs
	Produced       uint64  `json:"produced"`   // summed over the runs
	Recorded       uint64  `json:"recorded"`   // summed over the runs
	Lost           uint64  `json:"lost"`       // summed over the runs
	Unaccounted    int64   `json:"unaccounted"`
	EventsPerS     Stat    `json:"events_per_s"`
	SyntheticPerS  Stat    `json:"synthetic_per_s"`
	RecorderCPU    Stat    `json:"recorder_cpu_pct"`
	ProducerCPU    Stat    `json:"producer_cpu_pct"`
	ThroughputMbit Stat    `json:"throughput_mbit"`
	// ReductionPct is the throughput against the transfer alone (target
	// 0) of the same round.
	ReductionPct Stat `json:"reduction_pct"`
}

// synthLoad runs the loaded measurement on lab (the unlimited link) in
// rounds. The first round climbs the ladder and stops once two steps in a
// row lost events; later rounds run the rates the first one ran, so each
// has the same number of runs and every round has its own transfer alone
// to compare with.
func (b *bencher) synthLoad(ctx context.Context, lab *netlab.Lab) (*SynthLoadResult, error) {
	rounds := max(min(b.opts.Reps, SynthLoadReps), 1)
	res := &SynthLoadResult{
		DurationS: b.opts.SweepDuration.Seconds(),
		Filter:    "--netns <sender's namespace>, default buffer (as record-sender)",
		Workload:  fmt.Sprintf("magnet workload send --flood %v --size %d (TCP), unlimited link", b.opts.SweepDuration, BulkSize),
		Rounds:    rounds,
		Producers: max(b.opts.SynthProducers, 1),
	}
	// The goal is the VM's event rate: the scheduler places the producer,
	// the recorder and the workload on both CPUs even under --pin, which
	// would put the producer and the recorder on the sender's CPU beside
	// the sending workload (a full run pinned that way measured it: the
	// producer then made at most 4.3 M/s there, lost nothing, and was the
	// bound).
	if b.pin != nil {
		res.PinIgnored = true
		defer func(p *pinning) { b.pin = p }(b.pin)
		b.pin = nil
	}
	rates := b.synthRates(SynthLoadRates, true)
	for rep := 1; rep <= rounds; rep++ {
		lossy := 0
		for i, rate := range rates {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			st, _, err := b.synthStep(ctx, lab, rate, b.opts.SweepDuration)
			if err != nil {
				return nil, fmt.Errorf("%.0f events/s: %w", rate, err)
			}
			st.Rep = rep
			res.Runs = append(res.Runs, *st)
			res.EventsPerRun = max(res.EventsPerRun, st.EventsPerRun)
			b.logf("synth+transfer rep %d %5.1f M events/s: produced %.2f M/s (synthetic %.2f M/s), lost %d, unaccounted %d, recorder %.0f %% CPU, producer %.0f %%, transfer %.0f Mbit/s",
				rep, rate/1e6, st.EventsPerS/1e6, st.SyntheticPerS/1e6, st.Lost, st.Unaccounted, st.RecorderCPU, st.ProducerCPU, st.ThroughputMbit)
			if rep > 1 {
				continue
			}
			if st.lossless() {
				lossy = 0
			} else if lossy++; lossy == 2 {
				rates = rates[:i+1]
				break
			}
		}
	}
	res.summarize()
	return res, nil
}

// summarize fills Steps and the zero-loss maximum from Runs.
func (res *SynthLoadResult) summarize() {
	base := map[int]float64{}
	var order []float64
	byRate := map[float64][]SynthStep{}
	for _, r := range res.Runs {
		if r.TargetPerS == 0 && r.ThroughputMbit > 0 {
			base[r.Rep] = r.ThroughputMbit
		}
		if _, ok := byRate[r.TargetPerS]; !ok {
			order = append(order, r.TargetPerS)
		}
		byRate[r.TargetPerS] = append(byRate[r.TargetPerS], r)
	}
	res.Steps = nil
	for _, rate := range order {
		s := SynthLoadStep{TargetPerS: rate}
		var ev, syn, rec, prod, thr, red []float64
		for _, r := range byRate[rate] {
			s.Runs++
			if !r.lossless() {
				s.LossyRuns++
			}
			s.SynthRuns += r.Runs
			s.Produced += r.Produced
			s.Recorded += r.Recorded
			s.Lost += r.Lost
			s.Unaccounted += r.Unaccounted
			ev, syn = append(ev, r.EventsPerS), append(syn, r.SyntheticPerS)
			rec, prod = append(rec, r.RecorderCPU), append(prod, r.ProducerCPU)
			thr = append(thr, r.ThroughputMbit)
			if b, ok := base[r.Rep]; ok {
				red = append(red, 100*(1-r.ThroughputMbit/b))
			}
		}
		s.EventsPerS, s.SyntheticPerS = Summarize(ev), Summarize(syn)
		s.RecorderCPU, s.ProducerCPU = Summarize(rec), Summarize(prod)
		s.ThroughputMbit, s.ReductionPct = Summarize(thr), Summarize(red)
		res.Steps = append(res.Steps, s)
	}

	// The zero-loss maximum: below the slowest lossy run, the fastest run.
	lossyAt := math.Inf(1)
	for _, r := range res.Runs {
		if !r.lossless() {
			lossyAt = min(lossyAt, r.EventsPerS)
		}
	}
	res.AnyLoss = !math.IsInf(lossyAt, 1)
	res.MaxZeroLossRate, res.MaxZeroLossTarget, res.MaxZeroLossSynthetic, res.RunsAtGoal = 0, 0, 0, 0
	for _, r := range res.Runs {
		if r.lossless() && r.EventsPerS < lossyAt && r.EventsPerS > res.MaxZeroLossRate {
			res.MaxZeroLossRate, res.MaxZeroLossTarget, res.MaxZeroLossSynthetic = r.EventsPerS, r.TargetPerS, r.SyntheticPerS
		}
		if r.EventsPerS >= GoalEventRate {
			res.RunsAtGoal++
		}
	}
}
