// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"errors"
	"time"
)

// Synthetic events: the recording path without a network stack around it.
// synth_event (bpf/magnet.bpf.c), run with BPF_PROG_TEST_RUN, puts one
// dev_xmit event in the events ring of the CPU it runs on through the path
// every hook takes (clock, counters, per-CPU ring, task). The bench runs it
// from one thread at a paced rate while record.Run drains the rings and
// writes the trace, as `magnet record` does: the highest rate without loss
// is the recorder's ceiling when the producer costs only the recording
// path, which no real workload on this machine reaches.

// SynthRates are the paced rates tried, events/s.
var SynthRates = []float64{1e6, 2e6, 3e6, 4e6, 5e6, 6e6, 8e6, 10e6, 12e6, 16e6}

// synthBatch is how long one BPF_PROG_TEST_RUN call produces for: the
// pacing step.
const synthBatch = time.Millisecond

// SynthResult is the synthetic-event measurement.
type SynthResult struct {
	DurationS float64 `json:"duration_s"`
	// NsPerEvent is synth_event's time per run as the test run measures it
	// (preemption excluded) less synth_empty's, while the recorder drains:
	// what producing an event costs on the hooks' path, warm.
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
	Runs       uint64  `json:"runs"` // synth_event runs: events made
	// Retried bounds the extra events of test runs a signal interrupted
	// (made again from the start): Runs <= Produced <= Runs + Retried.
	Retried     uint64  `json:"retried,omitempty"`
	Produced    uint64  `json:"produced"`
	Recorded    uint64  `json:"recorded"`
	Lost        uint64  `json:"lost"`
	Unaccounted int64   `json:"unaccounted"`
	EventsPerS  float64 `json:"events_per_s"` // produced / wall time
	RecorderCPU float64 `json:"recorder_cpu_pct"`
	NsPerEvent  float64 `json:"ns_per_event"` // test run's figure, less synth_empty's
}

// errNoSynth says this kernel refused the synthetic programs.
var errNoSynth = errors.New("the synthetic-event programs did not load")

func (b *bencher) synth(ctx context.Context) (*SynthResult, error) {
	sr := &SynthResult{DurationS: b.opts.SweepDuration.Seconds()}
	var per, empty []float64
	for _, rate := range SynthRates {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		st, emptyNs, err := b.synthStep(ctx, rate, b.opts.SweepDuration)
		if err != nil {
			return nil, err
		}
		b.logf("synth %5.1f M events/s: produced %.2f M/s, lost %d, unaccounted %d, %.1f ns/event (empty %.1f), recorder %.0f %% CPU",
			rate/1e6, st.EventsPerS/1e6, st.Lost, st.Unaccounted, st.NsPerEvent, emptyNs, st.RecorderCPU)
		sr.Steps = append(sr.Steps, *st)
		per, empty = append(per, st.NsPerEvent), append(empty, emptyNs)
		if st.Lost == 0 && st.Unaccounted == 0 && st.EventsPerS > sr.MaxZeroLossRate {
			sr.MaxZeroLossRate = st.EventsPerS
		}
	}
	sr.NsPerEvent, sr.EmptyNs = Summarize(per), Summarize(empty)
	return sr, nil
}
