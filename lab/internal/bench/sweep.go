// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/record"
)

// SweepResult is events lost against the ring-buffer size.
type SweepResult struct {
	DurationS     float64    `json:"duration_s"`
	Filter        string     `json:"filter"`
	DefaultBuffer int        `json:"default_buffer"`
	Rows          []SweepRow `json:"rows"`
	// MaxZeroLossRate is the highest event rate of a small-message run at
	// the default buffer that lost nothing; 0 if every such run lost.
	MaxZeroLossRate     float64 `json:"max_zero_loss_rate"`
	MaxZeroLossWorkload string  `json:"max_zero_loss_workload,omitempty"`
	// MaxZeroLossAnyBuffer is the same over every buffer size.
	MaxZeroLossAnyBuffer     float64 `json:"max_zero_loss_any_buffer"`
	MaxZeroLossAnyBufferDesc string  `json:"max_zero_loss_any_buffer_desc,omitempty"`
	// Policy is loss against the drain policy at small buffers.
	Policy []PolicyRow `json:"policy,omitempty"`
	// Limit is the small-message workloads unobserved, loaded and
	// recorded: what bounds the event rate.
	Limit []RateLimitRow `json:"limit,omitempty"`
}

// DrainPolicy is how the recorder is told to read its rings: when BPF
// wakes it (a ring's fill), how long it sleeps at most without a wake-up,
// and where the trace is written from.
type DrainPolicy struct {
	Name         string
	WakeupFill   float64       // record.Config.WakeupFill; 0 = the default
	PollInterval time.Duration // record.Config.PollInterval; 0 = the default
	WriteInLoop  bool
}

// DrainPolicies are the policies of the policy sweep: the default (half
// full); woken sooner (1/64, and 1/8, the earlier default); never woken,
// reading the rings every 1, 10 and 100 ms (MAGNeT's reader slept a fixed
// time between drains: the papers' Figures 9 and 10); and the default
// wake-up with the trace written from the drain loop.
var DrainPolicies = []DrainPolicy{
	{Name: "woken at 1/2 full, poll 1 s (default)"},
	{Name: "woken at 1/64 full", WakeupFill: 1.0 / 64},
	{Name: "woken at 1/8 full (the earlier default)", WakeupFill: 1.0 / 8},
	{Name: "never woken, read every 1 ms", WakeupFill: 1, PollInterval: time.Millisecond},
	{Name: "never woken, read every 10 ms", WakeupFill: 1, PollInterval: 10 * time.Millisecond},
	{Name: "never woken, read every 100 ms", WakeupFill: 1, PollInterval: 100 * time.Millisecond},
	{Name: "default wake-up, trace written in the drain loop", WriteInLoop: true},
}

// PolicyBuffer is the ring size of the policy sweep: a small one (the
// papers' default), where a late reader loses events.
const PolicyBuffer = 256 << 10

// PolicyReps bounds the repetitions of the policy sweep (the full run's
// machine time).
const PolicyReps = 3

// sweepWorkload is a workload of the ring-size and policy sweeps and its
// link: 1000 Mbit/s or unlimited (0).
type sweepWorkload struct {
	proto    string
	size     int
	rateMbit int
}

// sweepWorkloads, for both sweeps (the overhead goals ask each for all of them): the
// bulk transfer on the 1 Gbit/s and unlimited links, and 64-byte TCP and
// UDP sends, which make the most events per second (on the unlimited link:
// they make far less than 1 Gbit/s).
var sweepWorkloads = []sweepWorkload{{"tcp", BulkSize, 1000}, {"tcp", BulkSize, 0}, {"tcp", SmallSize, 0}, {"udp", SmallSize, 0}}

// on returns the lab of w's link: gig for 1 Gbit/s, else unlimited.
func (w sweepWorkload) on(gig, unlimited *netlab.Lab) *netlab.Lab {
	if w.rateMbit == 1000 {
		return gig
	}
	return unlimited
}

// PolicyRow is one workload, link and drain policy over the repetitions.
type PolicyRow struct {
	Workload     string `json:"workload"`
	Link         string `json:"link"`
	BufferBytes  int    `json:"buffer_bytes"`
	Policy       string `json:"policy"`
	Runs         int    `json:"runs"`
	LossyRuns    int    `json:"lossy_runs"`
	Produced     uint64 `json:"produced"`
	Lost         uint64 `json:"lost"`
	Unaccounted  int64  `json:"unaccounted"`
	LossPct      Stat   `json:"loss_pct"`
	EventsPerS   Stat   `json:"events_per_s"`
	CPUPct       Stat   `json:"recorder_cpu_pct"`
	SenderCPUPct Stat   `json:"sender_cpu_pct"`

	lossPcts, rates, cpus, senderCPUs []float64
}

// SweepRow is one recorded transfer of the sweep.
type SweepRow struct {
	Workload    string `json:"workload"`
	Proto       string `json:"proto"`
	Size        int    `json:"size"`
	BufferBytes int    `json:"buffer_bytes"`
	Produced    uint64 `json:"produced"`
	Recorded    uint64 `json:"recorded"`
	Lost        uint64 `json:"lost"`
	// Unaccounted is produced - recorded - lost: events neither written
	// nor counted as lost (should be 0).
	Unaccounted    int64   `json:"unaccounted"`
	LossPct        float64 `json:"loss_pct"`
	EventsPerSec   float64 `json:"events_per_s"`
	ThroughputMbit float64 `json:"throughput_mbit"`
	Link           string  `json:"link,omitempty"`
	// RecorderCPUPct is the recorder's CPU time over the transfer, in
	// per cent of one CPU.
	RecorderCPUPct float64 `json:"recorder_cpu_pct"`
}

// sweep records the workload port (both namespaces) with every buffer size,
// for a bulk TCP transfer on the unlimited link (lab) and on a 1 Gbit/s
// one, and for small messages over TCP and UDP (on the unlimited link:
// they make far less than 1 Gbit/s).
func (b *bencher) sweep(ctx context.Context, lab *netlab.Lab) (*SweepResult, error) {
	sr := &SweepResult{DurationS: b.opts.SweepDuration.Seconds(), Filter: "--port of the workload (both namespaces)", DefaultBuffer: record.DefaultBufferBytes}
	gig, err := netlab.New(netlab.Options{Name: "magnet-bench", RateMbit: 1000})
	if err != nil {
		return nil, err
	}
	defer gig.Close()
	for _, w := range sweepWorkloads {
		for _, buf := range SweepBuffers {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			port := b.nextPort()
			t, err := b.startRecord(ctx, record.Filters{Port: port}, buf, nil)
			if err != nil {
				return nil, err
			}
			x, xerr := b.transfer(ctx, w.on(gig, lab), w.proto, w.size, b.opts.SweepDuration, port)
			tr, err := t.stop()
			if xerr != nil {
				return nil, xerr
			}
			if err != nil {
				return nil, err
			}
			row := SweepRow{
				Workload: fmt.Sprintf("%s %d B", w.proto, w.size), Proto: w.proto, Size: w.size, BufferBytes: buf,
				Produced: tr.Produced, Recorded: tr.Events, Lost: tr.Lost,
				Unaccounted: int64(tr.Produced) - int64(tr.Events) - int64(tr.Lost),
				Link:        linkName(w.rateMbit),
			}
			if tr.Produced > 0 {
				row.LossPct = 100 * float64(tr.Lost) / float64(tr.Produced)
			}
			if x.WallS > 0 {
				row.EventsPerSec = float64(tr.Produced) / x.WallS
				row.ThroughputMbit = float64(x.RecvBytes) * 8 / x.WallS / 1e6
				row.RecorderCPUPct = 100 * tr.CPUS / x.WallS
			}
			b.logf("sweep %-10s %-13s buffer %-8s produced %d lost %d (%.2f%%) %.0f events/s", row.Workload, row.Link, sizeName(buf), row.Produced, row.Lost, row.LossPct, row.EventsPerSec)
			sr.Rows = append(sr.Rows, row)
			if w.size == SmallSize && row.Lost == 0 {
				if buf == record.DefaultBufferBytes && row.EventsPerSec > sr.MaxZeroLossRate {
					sr.MaxZeroLossRate, sr.MaxZeroLossWorkload = row.EventsPerSec, row.Workload
				}
				if row.EventsPerSec > sr.MaxZeroLossAnyBuffer {
					sr.MaxZeroLossAnyBuffer = row.EventsPerSec
					sr.MaxZeroLossAnyBufferDesc = row.Workload + ", " + sizeName(buf)
				}
			}
		}
	}
	if err := gig.Close(); err != nil {
		return nil, err
	}
	b.logf("limit: the small-message workloads unobserved, loaded and recorded")
	limit, err := b.rateLimit(ctx, lab)
	if err != nil {
		return nil, fmt.Errorf("rate limit: %w", err)
	}
	sr.Limit = limit
	return sr, nil
}

// policySweep records each policy workload at the policy buffer under
// every drain policy, the policies interleaved, min(--reps, PolicyReps)
// times: events lost and CPU used against how soon and how often the
// recorder reads the rings (the papers' Figures 9 and 10, with wake-ups).
func (b *bencher) policySweep(ctx context.Context, lab *netlab.Lab) ([]PolicyRow, error) {
	gig, err := netlab.New(netlab.Options{Name: "magnet-bench", RateMbit: 1000})
	if err != nil {
		return nil, err
	}
	defer gig.Close()
	var rows []*PolicyRow
	for _, w := range sweepWorkloads {
		for _, pol := range DrainPolicies {
			rows = append(rows, &PolicyRow{Workload: fmt.Sprintf("%s %d B", w.proto, w.size), Link: linkName(w.rateMbit), BufferBytes: PolicyBuffer, Policy: pol.Name})
		}
	}
	reps := min(b.opts.Reps, PolicyReps)
	for rep := 1; rep <= reps; rep++ {
		i := 0
		for _, w := range sweepWorkloads {
			for _, pol := range DrainPolicies {
				row := rows[i]
				i++
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				port := b.nextPort()
				t, err := b.startRecord(ctx, record.Filters{Port: port}, PolicyBuffer, nil, func(c *record.Config) {
					c.WakeupFill, c.PollInterval, c.WriteInLoop = pol.WakeupFill, pol.PollInterval, pol.WriteInLoop
				})
				if err != nil {
					return nil, err
				}
				x, xerr := b.transfer(ctx, w.on(gig, lab), w.proto, w.size, b.opts.SweepDuration, port)
				tr, err := t.stop()
				if xerr != nil {
					return nil, xerr
				}
				if err != nil {
					return nil, err
				}
				row.Runs++
				if tr.Lost > 0 {
					row.LossyRuns++
				}
				row.Produced += tr.Produced
				row.Lost += tr.Lost
				row.Unaccounted += int64(tr.Produced) - int64(tr.Events) - int64(tr.Lost)
				if tr.Produced > 0 {
					row.lossPcts = append(row.lossPcts, 100*float64(tr.Lost)/float64(tr.Produced))
				}
				if x.WallS > 0 {
					row.rates = append(row.rates, float64(tr.Produced)/x.WallS)
					row.cpus = append(row.cpus, 100*tr.CPUS/x.WallS)
					row.senderCPUs = append(row.senderCPUs, 100*x.SenderCPUS/x.WallS)
				}
				b.logf("policy rep %d %-9s %-13s %-48s produced %d lost %d", rep, row.Workload, row.Link, pol.Name, tr.Produced, tr.Lost)
			}
		}
	}
	if err := gig.Close(); err != nil {
		return nil, err
	}
	out := make([]PolicyRow, len(rows))
	for i, r := range rows {
		r.LossPct, r.EventsPerS, r.CPUPct, r.SenderCPUPct = Summarize(r.lossPcts), Summarize(r.rates), Summarize(r.cpus), Summarize(r.senderCPUs)
		out[i] = *r
	}
	return out, nil
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
