// SPDX-License-Identifier: Apache-2.0

//go:build !magnet_nosynth

package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/lab/internal/synthevent"
)

// synthStep records while one thread (Options.SynthProducers: more, each at
// its share) produces synthetic events at rate for d, in test runs of
// synthBatch each, paced against the clock (rate 0: no synthetic event).
//
// Without a lab nothing else runs: the recorder records this process,
// which makes no traffic (and whose own events a recorder never traces), so
// it sees the synthetic events alone. (A port "nothing uses" was not: other
// benches on the same host take the same port numbers.) With one, the saturating
// 64 KiB transfer runs on it for the same d and the recorder records as
// record-sender does (--netns of the sender's namespace, on the sender's
// CPU under --pin, where the producer then runs too): the workload's events
// are recorded beside the synthetic ones. synth_event reserves its event
// without asking any filter (bpf/synthevent.bpf.c), so its events are
// produced and recorded under either filter. The programs are loaded
// beside the recorder's, on its maps (synthevent.Load), once it has loaded.
func (b *bencher) synthStep(ctx context.Context, lab *netlab.Lab, rate float64, d time.Duration) (*SynthStep, float64, error) {
	var p *synthevent.Programs
	var loadErr error
	synthetic := func(c *record.Config) {
		c.Loaded = func(lp *probe.Probe) { p, loadErr = synthevent.Load(lp) }
	}
	port := b.nextPort()
	var t tracer
	var err error
	if lab == nil {
		t, err = b.startRecordWith(ctx, record.Filters{PID: os.Getpid()}, record.DefaultBufferBytes, nil, synthetic)
	} else {
		t, err = b.startPinned(lab, lab.Client, func() (tracer, error) {
			return b.startRecordWith(ctx, record.Filters{NetNS: lab.Client.NS}, record.DefaultBufferBytes, nil, synthetic)
		})
	}
	if err != nil {
		return nil, 0, err
	}
	if p != nil {
		defer p.Close()
	}
	if p == nil || p.Event == nil || p.Empty == nil {
		_, _ = t.stop()
		if loadErr != nil {
			b.logf("synthetic events: %v", loadErr)
		}
		return nil, 0, errNoSynth
	}
	emptyNs, err := emptyRunNs(p.Empty)
	if err != nil {
		_, _ = t.stop()
		return nil, 0, err
	}

	type xferDone struct {
		x   *Xfer
		err error
	}
	var done chan xferDone
	if lab != nil {
		started := make(chan struct{})
		done = make(chan xferDone, 1)
		go func() {
			x, err := b.transferWith(ctx, lab, flood("tcp", BulkSize), d, port, func() { close(started) })
			done <- xferDone{x, err}
		}()
		select {
		case <-started:
		case xd := <-done:
			_, _ = t.stop()
			if xd.err == nil {
				xd.err = fmt.Errorf("transfer ended before it started")
			}
			return nil, 0, xd.err
		}
	}
	start := time.Now()
	var x produced
	var perr error
	if rate > 0 {
		x, perr = produceOn(b.opts.SynthProducers, synthProducer(p), rate, d)
	}
	var xd xferDone
	if done != nil {
		xd = <-done
	}
	wall := time.Since(start)
	tr, err := t.stop()
	for _, e := range []error{perr, xd.err, err} {
		if e != nil {
			return nil, 0, e
		}
	}
	st := &SynthStep{TargetPerS: rate, Runs: x.runs, Retried: x.retried * uint64(rate*synthBatch.Seconds()), Produced: tr.Produced, Recorded: tr.Events, Lost: tr.Lost,
		Unaccounted: int64(tr.Produced) - int64(tr.Events) - int64(tr.Lost), WallS: wall.Seconds()}
	if x.runs > 0 {
		st.NsPerEvent = (x.nsPerRun - emptyNs) / float64(x.perRun)
		st.EventsPerRun = x.perRun
	}
	if wall > 0 {
		st.EventsPerS = float64(tr.Produced) / wall.Seconds()
		st.SyntheticPerS = float64(x.runs) / wall.Seconds()
		// The producer is a thread of this process too: its time is its
		// own column, not the recorder's.
		st.RecorderCPU = 100 * (tr.CPUS - x.cpuS) / wall.Seconds()
		st.ProducerCPU = 100 * x.cpuS / wall.Seconds()
	}
	if xd.x != nil {
		st.Transfer = xd.x
		if xd.x.WallS > 0 {
			st.ThroughputMbit = float64(xd.x.RecvBytes) * 8 / xd.x.WallS / 1e6
		}
	}
	return st, emptyNs, nil
}

type produced struct {
	runs   uint64 // events made: test runs × perRun
	perRun int
	// retried counts test runs a signal interrupted: the kernel does not
	// say how many runs (events) it made before, and they are made again.
	retried  uint64
	nsPerRun float64 // the producing program's time per test run, mean over the batches
	cpuS     float64 // the producing thread's CPU time (user + system)
}

// emptyRunNs is synth_empty's time per test run: the least of three
// measurements, as another task's work on this CPU only adds.
func emptyRunNs(empty *ebpf.Program) (float64, error) {
	// tc programs are run on a packet: the smallest Ethernet frame.
	pkt := make([]byte, 64)
	var least float64
	for i := 0; i < 3; i++ {
		_, per, err := empty.Benchmark(pkt, 100000, nil)
		if err != nil {
			return 0, fmt.Errorf("run synth_empty: %w", err)
		}
		if ns := float64(per.Nanoseconds()); i == 0 || ns < least {
			least = ns
		}
	}
	return least, nil
}

// producer is the program that makes synthetic events, perRun of them per
// test run.
type producer struct {
	prog   *ebpf.Program
	perRun int
}

// synthProducer is synth_burst where the kernel loaded it, whose runs make
// synthevent.BurstEvents events each (a test run's own cost, ~16 ns and
// ~60 while any process has run statistics on, then no longer bounds the
// producer below the recorder), else synth_event, one per run.
func synthProducer(p *synthevent.Programs) producer {
	if p.Burst != nil {
		return producer{p.Burst, synthevent.BurstEvents}
	}
	return producer{p.Event, 1}
}

// produceOn runs produce on n threads at once (at least one), each at
// rate/n, and adds up what they made.
func produceOn(n int, prog producer, rate float64, d time.Duration) (produced, error) {
	n = max(n, 1)
	if n == 1 {
		return produce(prog, rate, d)
	}
	type res struct {
		x   produced
		err error
	}
	out := make(chan res, n)
	for i := 0; i < n; i++ {
		go func() {
			x, err := produce(prog, rate/float64(n), d)
			out <- res{x, err}
		}()
	}
	sum := produced{perRun: prog.perRun}
	var firstErr error
	for i := 0; i < n; i++ {
		r := <-out
		if r.err != nil && firstErr == nil {
			firstErr = r.err
		}
		sum.runs += r.x.runs
		sum.retried += r.x.retried
		sum.cpuS += r.x.cpuS
		sum.nsPerRun += r.x.nsPerRun / float64(n)
	}
	return sum, firstErr
}

// produce runs prog in batches on one locked thread so that events arrive
// at rate on average, for d (a batch makes about synthBatch's worth). A producer that falls behind (its CPU taken by
// other work) makes fewer events, never more time: beside a transfer its
// events are made while the transfer runs.
func produce(prog producer, rate float64, d time.Duration) (produced, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var ru0, ru1 unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru0); err != nil {
		return produced{}, fmt.Errorf("producer CPU time: %w", err)
	}
	pkt := make([]byte, 64)
	batch := max(int(rate*synthBatch.Seconds())/prog.perRun, 1) // test runs
	events := batch * prog.perRun
	out := produced{perRun: prog.perRun}
	var sum time.Duration
	var batches int
	start := time.Now()
	for i := 1; ; i++ {
		_, per, err := prog.prog.Benchmark(pkt, batch, func() { out.retried++ })
		if err != nil {
			return produced{}, fmt.Errorf("run the synthetic-event program: %w", err)
		}
		sum += per
		batches++
		out.runs += uint64(events)
		due := start.Add(time.Duration(float64(i*events) / rate * float64(time.Second)))
		if due.Sub(start) >= d || time.Since(start) >= d {
			break
		}
		if w := time.Until(due); w > 0 {
			_ = unix.Nanosleep(&unix.Timespec{Nsec: w.Nanoseconds()}, nil)
		}
	}
	out.nsPerRun = float64(sum.Nanoseconds()) / float64(batches)
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru1); err != nil {
		return produced{}, fmt.Errorf("producer CPU time: %w", err)
	}
	out.cpuS = rusageSeconds(ru1) - rusageSeconds(ru0)
	return out, nil
}
