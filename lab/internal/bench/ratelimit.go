// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/record"
)

// What limits the highest event rate: the same small-message transfer with
// nothing loaded, with magnet's programs loaded but the rings never read,
// and recorded, interleaved. If the unobserved workload cannot make the
// events, no recorder can record them; if loading the programs alone slows
// it, the kernel side is the limit; if only recording slows it, the reader.
const (
	LimitUnobserved = "unobserved"
	LimitLoaded     = "loaded, not read"
	LimitRecorded   = "recorded"
)

// RateLimitRow is one configuration of one small-message workload over the
// repetitions.
type RateLimitRow struct {
	Workload string `json:"workload"`
	Config   string `json:"config"`
	// MessagesPerS is the sender's messages over its wall time.
	MessagesPerS Stat `json:"messages_per_s"`
	Mbit         Stat `json:"mbit"`
	// EventsPerS is events produced (the BPF counters) over the wall time;
	// for the unobserved runs an estimate: their bytes per second times
	// the events per byte of the loaded runs of the same repetition.
	EventsPerS  Stat   `json:"events_per_s"`
	Estimated   bool   `json:"estimated,omitempty"`
	SenderCPU   Stat   `json:"sender_cpu_pct"`   // % of one CPU
	ReceiverCPU Stat   `json:"receiver_cpu_pct"` // % of one CPU
	RecorderCPU Stat   `json:"recorder_cpu_pct,omitempty"`
	Lost        uint64 `json:"lost"` // summed over the repetitions
	Repetitions int    `json:"repetitions"`
}

type limitTrial struct {
	x        *Xfer
	produced uint64
	lost     uint64
	cpuS     float64
}

// rateLimit runs the small-message workloads reps times under each of the
// three configurations, in rounds, with the workload's port as the filter.
func (b *bencher) rateLimit(ctx context.Context, lab *netlab.Lab) ([]RateLimitRow, error) {
	var out []RateLimitRow
	for _, proto := range []string{"tcp", "udp"} {
		workload := fmt.Sprintf("%s %d B", proto, SmallSize)
		trials := map[string][]limitTrial{}
		for rep := 1; rep <= b.opts.Reps; rep++ {
			for _, cfg := range []string{LimitUnobserved, LimitLoaded, LimitRecorded} {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				t, err := b.limitTrial(ctx, lab, cfg, proto)
				if err != nil {
					return nil, fmt.Errorf("%s, %s: %w", workload, cfg, err)
				}
				b.logf("limit %-8s %-16s %.0f messages/s, %.0f events/s produced, %d lost", workload, cfg,
					float64(t.x.Messages)/t.x.WallS, float64(t.produced)/t.x.WallS, t.lost)
				trials[cfg] = append(trials[cfg], t)
			}
		}
		for _, cfg := range []string{LimitUnobserved, LimitLoaded, LimitRecorded} {
			out = append(out, summarizeLimit(workload, cfg, trials[cfg], trials[LimitLoaded]))
		}
	}
	return out, nil
}

func (b *bencher) limitTrial(ctx context.Context, lab *netlab.Lab, cfg, proto string) (limitTrial, error) {
	port := b.nextPort()
	var stop func() (Traced, error)
	switch cfg {
	case LimitLoaded:
		t, err := startLoaded(record.DefaultBufferBytes, probe.Filters{Port: uint16(port)})
		if err != nil {
			return limitTrial{}, err
		}
		stop = t.stop
	case LimitRecorded:
		t, err := b.startRecord(ctx, record.Filters{Port: port}, record.DefaultBufferBytes, nil)
		if err != nil {
			return limitTrial{}, err
		}
		stop = t.stop
	default:
		stop = nopTracer{}.stop
	}
	x, xerr := b.transfer(ctx, lab, proto, SmallSize, b.opts.SweepDuration, port)
	tr, err := stop()
	if xerr != nil {
		return limitTrial{}, xerr
	}
	if err != nil {
		return limitTrial{}, err
	}
	if x.WallS <= 0 {
		return limitTrial{}, fmt.Errorf("transfer took no time")
	}
	return limitTrial{x: x, produced: tr.Produced, lost: tr.Lost, cpuS: tr.CPUS}, nil
}

func summarizeLimit(workload, cfg string, ts, loaded []limitTrial) RateLimitRow {
	row := RateLimitRow{Workload: workload, Config: cfg, Repetitions: len(ts), Estimated: cfg == LimitUnobserved}
	var msgs, mbit, events, snd, rcv, rec []float64
	for i, t := range ts {
		wall := t.x.WallS
		msgs = append(msgs, float64(t.x.Messages)/wall)
		mbit = append(mbit, float64(t.x.RecvBytes)*8/wall/1e6)
		snd = append(snd, 100*t.x.SenderCPUS/wall)
		rcv = append(rcv, 100*t.x.ReceiverCPUS/wall)
		row.Lost += t.lost
		switch {
		case cfg != LimitUnobserved:
			events = append(events, float64(t.produced)/wall)
		case i < len(loaded) && loaded[i].x.RecvBytes > 0:
			perByte := float64(loaded[i].produced) / float64(loaded[i].x.RecvBytes)
			events = append(events, perByte*float64(t.x.RecvBytes)/wall)
		}
		if cfg == LimitRecorded {
			rec = append(rec, 100*t.cpuS/wall)
		}
	}
	row.MessagesPerS, row.Mbit, row.EventsPerS = Summarize(msgs), Summarize(mbit), Summarize(events)
	row.SenderCPU, row.ReceiverCPU, row.RecorderCPU = Summarize(snd), Summarize(rcv), Summarize(rec)
	return row
}
