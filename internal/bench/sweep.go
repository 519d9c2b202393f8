// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"

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

// Drain policies of the policy sweep.
const (
	PolicyQueued = "writer goroutine (default)"
	PolicyInLoop = "write in the drain loop"
)

// PolicyBuffers are the ring sizes of the policy sweep: the small ones,
// where a late reader loses events.
var PolicyBuffers = []int{256 << 10, 1 << 20}

// PolicyRow is one workload, buffer and drain policy over the repetitions.
type PolicyRow struct {
	Workload    string `json:"workload"`
	BufferBytes int    `json:"buffer_bytes"`
	Policy      string `json:"policy"`
	Runs        int    `json:"runs"`
	LossyRuns   int    `json:"lossy_runs"`
	Produced    uint64 `json:"produced"`
	Lost        uint64 `json:"lost"`
	Unaccounted int64  `json:"unaccounted"`
	LossPct     Stat   `json:"loss_pct"`
	EventsPerS  Stat   `json:"events_per_s"`
	CPUPct      Stat   `json:"recorder_cpu_pct"`

	lossPcts, rates, cpus []float64
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
}

// sweep records the workload port (both namespaces) with every buffer size,
// for a bulk TCP transfer and for small messages over TCP and UDP.
func (b *bencher) sweep(ctx context.Context, lab *netlab.Lab) (*SweepResult, error) {
	sr := &SweepResult{DurationS: b.opts.SweepDuration.Seconds(), Filter: "--port of the workload (both namespaces)", DefaultBuffer: record.DefaultBufferBytes}
	workloads := []struct {
		proto string
		size  int
	}{{"tcp", BulkSize}, {"tcp", SmallSize}, {"udp", SmallSize}}
	for _, w := range workloads {
		for _, buf := range SweepBuffers {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			port := b.nextPort()
			t, err := b.startRecord(ctx, record.Filters{Port: port}, buf, nil)
			if err != nil {
				return nil, err
			}
			x, xerr := b.transfer(ctx, lab, w.proto, w.size, b.opts.SweepDuration, port)
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
			}
			if tr.Produced > 0 {
				row.LossPct = 100 * float64(tr.Lost) / float64(tr.Produced)
			}
			if x.WallS > 0 {
				row.EventsPerSec = float64(tr.Produced) / x.WallS
				row.ThroughputMbit = float64(x.RecvBytes) * 8 / x.WallS / 1e6
			}
			b.logf("sweep %-10s buffer %-8s produced %d lost %d (%.2f%%) %.0f events/s", row.Workload, sizeName(buf), row.Produced, row.Lost, row.LossPct, row.EventsPerSec)
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
	b.logf("limit: the small-message workloads unobserved, loaded and recorded")
	limit, err := b.rateLimit(ctx, lab)
	if err != nil {
		return nil, fmt.Errorf("rate limit: %w", err)
	}
	sr.Limit = limit
	return sr, nil
}

// policySweep records small messages at small buffers under each drain
// policy, --reps times, the policies interleaved: whether writing the trace
// from a goroutine of its own keeps a small ring from overflowing while the
// file system makes writes wait.
func (b *bencher) policySweep(ctx context.Context, lab *netlab.Lab) ([]PolicyRow, error) {
	policies := []struct {
		name   string
		inLoop bool
	}{{PolicyQueued, false}, {PolicyInLoop, true}}
	var rows []*PolicyRow
	for _, w := range []string{"udp", "tcp"} {
		for _, buf := range PolicyBuffers {
			for _, pol := range policies {
				rows = append(rows, &PolicyRow{Workload: fmt.Sprintf("%s %d B", w, SmallSize), BufferBytes: buf, Policy: pol.name})
			}
		}
	}
	for rep := 1; rep <= b.opts.Reps; rep++ {
		i := 0
		for _, w := range []string{"udp", "tcp"} {
			for _, buf := range PolicyBuffers {
				for _, pol := range policies {
					row := rows[i]
					i++
					if err := ctx.Err(); err != nil {
						return nil, err
					}
					port := b.nextPort()
					inLoop := pol.inLoop
					t, err := b.startRecord(ctx, record.Filters{Port: port}, buf, nil, func(c *record.Config) { c.WriteInLoop = inLoop })
					if err != nil {
						return nil, err
					}
					x, xerr := b.transfer(ctx, lab, w, SmallSize, b.opts.SweepDuration, port)
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
					}
					b.logf("policy rep %d %-9s buffer %-8s %-27s produced %d lost %d", rep, row.Workload, sizeName(buf), pol.name, tr.Produced, tr.Lost)
				}
			}
		}
	}
	out := make([]PolicyRow, len(rows))
	for i, r := range rows {
		r.LossPct, r.EventsPerS, r.CPUPct = Summarize(r.lossPcts), Summarize(r.rates), Summarize(r.cpus)
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
