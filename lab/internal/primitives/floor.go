// SPDX-License-Identifier: Apache-2.0

package primitives

// GoalPct is the recorder's overhead goal (docs/BENCH.md): recording costs
// at most 1 % of the throughput.
const GoalPct = 1.0

// Floor is the least share of the bottleneck CPU that stamping and
// recording every event takes at EventsPerS: each event's primitives
// times the rate.
type Floor struct {
	EventsPerS float64 `json:"events_per_s"`
	EventsFrom string  `json:"events_from"`
	// BudgetNs is what the goal leaves each event: GoalPct of one CPU
	// over EventsPerS.
	BudgetNs float64    `json:"budget_ns"`
	Rows     []FloorRow `json:"rows"`
}

// FloorRow is the share one way of recording an event takes.
type FloorRow struct {
	What     string  `json:"what"`
	Program  string  `json:"program"` // whose net median it is
	Ns       float64 `json:"ns"`
	SharePct float64 `json:"share_pct"` // of one CPU
	// TimesGoal is SharePct over GoalPct: above 1, the goal is out of
	// reach before the tracer does anything else.
	TimesGoal float64 `json:"times_goal"`
	// GoalEventsPerS is the rate at which this way takes GoalPct of the
	// CPU: the most events per second the goal allows it.
	GoalEventsPerS float64 `json:"goal_events_per_s"`
}

// floorWays are the floor's rows: what each event does at least, and the
// program that does exactly that.
var floorWays = []struct{ what, program string }{
	{"the clock alone (bpf_ktime_get_ns)", "ktime_get_ns"},
	{"clock + BPF ring buffer record (reserve, 40 bytes, submit)", "ktime_ringbuf"},
	{"clock + array ring record (48 bytes at a per-CPU head, as magnet records its events)", "ktime_array_ring"},
}

// SharePct is the share of one CPU, in per cent, that ns per event take at
// eventsPerS.
func SharePct(eventsPerS, ns float64) float64 {
	return eventsPerS * ns / 1e9 * 100
}

// BudgetNs is what GoalPct of one CPU leaves each of eventsPerS events.
func BudgetNs(eventsPerS float64) float64 {
	return GoalPct / 100 * 1e9 / eventsPerS
}

// floorOf takes the floor's rows from the results' net medians.
func floorOf(results []Result, eventsPerS float64, from string) Floor {
	f := Floor{EventsPerS: eventsPerS, EventsFrom: from, BudgetNs: BudgetNs(eventsPerS)}
	for _, w := range floorWays {
		for _, r := range results {
			if r.Name != w.program {
				continue
			}
			share := SharePct(eventsPerS, r.Net.Median)
			row := FloorRow{What: w.what, Program: w.program, Ns: r.Net.Median, SharePct: share, TimesGoal: share / GoalPct}
			if r.Net.Median > 0 {
				row.GoalEventsPerS = BudgetNs(1) / r.Net.Median
			}
			f.Rows = append(f.Rows, row)
		}
	}
	return f
}
