// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/record"
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
	TargetPerS  float64 `json:"target_per_s"`
	Runs        uint64  `json:"runs"` // synth_event runs: events made
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

// synthStep records while one thread produces synthetic events at rate for
// d, in test runs of synthBatch each, paced against the clock.
func (b *bencher) synthStep(ctx context.Context, rate float64, d time.Duration) (*SynthStep, float64, error) {
	var p *probe.Probe
	// A port nothing uses: no real traffic is recorded beside the
	// synthetic events, which no filter applies to.
	t, err := b.startRecordWith(ctx, record.Filters{Port: b.nextPort()}, record.DefaultBufferBytes, nil, func(c *record.Config) {
		c.Synthetic = true
		c.Loaded = func(lp *probe.Probe) { p = lp }
	})
	if err != nil {
		return nil, 0, err
	}
	if p == nil || p.Synthetic == nil || p.SyntheticEmpty == nil {
		_, _ = t.stop()
		return nil, 0, errNoSynth
	}
	x, perr := produce(p.Synthetic, p.SyntheticEmpty, rate, d)
	tr, err := t.stop()
	if perr != nil {
		return nil, 0, perr
	}
	if err != nil {
		return nil, 0, err
	}
	st := &SynthStep{TargetPerS: rate, Runs: x.runs, Produced: tr.Produced, Recorded: tr.Events, Lost: tr.Lost,
		Unaccounted: int64(tr.Produced) - int64(tr.Events) - int64(tr.Lost), NsPerEvent: x.nsPerRun - x.emptyNs}
	if x.wall > 0 {
		st.EventsPerS = float64(tr.Produced) / x.wall.Seconds()
		st.RecorderCPU = 100 * tr.CPUS / x.wall.Seconds()
	}
	return st, x.emptyNs, nil
}

type produced struct {
	runs     uint64
	wall     time.Duration
	nsPerRun float64 // synth_event, mean over the batches
	emptyNs  float64
}

// produce runs prog in batches on one locked thread so that events arrive
// at rate on average, for d.
func produce(prog, empty *ebpf.Program, rate float64, d time.Duration) (produced, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// tc programs are run on a packet: the smallest Ethernet frame.
	pkt := make([]byte, 64)
	batch := int(rate * synthBatch.Seconds())
	_, emptyPer, err := empty.Benchmark(pkt, 100000, nil)
	if err != nil {
		return produced{}, fmt.Errorf("run synth_empty: %w", err)
	}
	var out produced
	out.emptyNs = float64(emptyPer.Nanoseconds())
	var sum time.Duration
	var batches int
	start := time.Now()
	for i := 1; ; i++ {
		_, per, err := prog.Benchmark(pkt, batch, nil)
		if err != nil {
			return produced{}, fmt.Errorf("run synth_event: %w", err)
		}
		sum += per
		batches++
		out.runs += uint64(batch)
		due := start.Add(time.Duration(float64(i*batch) / rate * float64(time.Second)))
		if due.Sub(start) >= d {
			break
		}
		if w := time.Until(due); w > 0 {
			_ = unix.Nanosleep(&unix.Timespec{Nsec: w.Nanoseconds()}, nil)
		}
	}
	out.wall = time.Since(start)
	out.nsPerRun = float64(sum.Nanoseconds()) / float64(batches)
	return out, nil
}
