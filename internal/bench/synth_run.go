// SPDX-License-Identifier: Apache-2.0

//go:build !magnet_nosynth

package bench

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/record"
)

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
	st := &SynthStep{TargetPerS: rate, Runs: x.runs, Retried: x.retried * uint64(rate*synthBatch.Seconds()), Produced: tr.Produced, Recorded: tr.Events, Lost: tr.Lost,
		Unaccounted: int64(tr.Produced) - int64(tr.Events) - int64(tr.Lost), NsPerEvent: x.nsPerRun - x.emptyNs}
	if x.wall > 0 {
		st.EventsPerS = float64(tr.Produced) / x.wall.Seconds()
		st.RecorderCPU = 100 * tr.CPUS / x.wall.Seconds()
	}
	return st, x.emptyNs, nil
}

type produced struct {
	runs uint64
	// retried counts test runs a signal interrupted: the kernel does not
	// say how many runs (events) it made before, and they are made again.
	retried  uint64
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
	// The least of three: another task's work on this CPU only adds.
	var out produced
	for i := 0; i < 3; i++ {
		_, per, err := empty.Benchmark(pkt, 100000, nil)
		if err != nil {
			return produced{}, fmt.Errorf("run synth_empty: %w", err)
		}
		if ns := float64(per.Nanoseconds()); i == 0 || ns < out.emptyNs {
			out.emptyNs = ns
		}
	}
	var sum time.Duration
	var batches int
	start := time.Now()
	for i := 1; ; i++ {
		_, per, err := prog.Benchmark(pkt, batch, func() { out.retried++ })
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
