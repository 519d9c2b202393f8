// SPDX-License-Identifier: Apache-2.0

package analyze

import "sort"

// SchedStats is what the scheduler did on one host while its trace was
// recorded (the opt-in sched events): how often each CPU switched tasks
// and how regularly (the time between switches), how long the kernel took
// to switch (MAGNET 2.0's context-switch time, on kernels with the
// sched_entry_tp and sched_exit_tp tracepoints: docs/REPORT.md), and how
// long a woken task waited before it ran.
type SchedStats struct {
	Trace string      `json:"trace"`
	SpanS float64     `json:"span_s"` // first to last event of the trace
	CPUs  []*CPUSched `json:"cpus"`
	All   *CPUSched   `json:"all"` // every CPU together
	// Lost is how many sched_switch and sched_wakeup events were lost:
	// the switch counts of the CPUs that lost them are short, and gaps and
	// wakeups across a loss are left out.
	Lost uint64 `json:"lost,omitempty"`
}

// CPUSched is one CPU's context switches. A task's wakeup-to-run latency
// counts on the CPU it then ran on.
type CPUSched struct {
	CPU         int       `json:"cpu"` // -1 for every CPU together
	Switches    uint64    `json:"switches"`
	PerSecond   float64   `json:"switches_per_s"`
	Between     Durations `json:"between_switches_us"`
	WakeupToRun Durations `json:"wakeup_to_run_us"` // sched_wakeup to the sched_switch that runs the task
	// ContextSwitch is the time in __schedule() of the switches that
	// switched, from sched_entry_tp to sched_exit_tp: deactivating the
	// task, picking the next and switching to it. Pick is its part up to
	// sched_switch (deactivate and pick). Empty on kernels without those
	// tracepoints and in traces recorded before they were.
	ContextSwitch Durations `json:"context_switch_us"`
	Pick          Durations `json:"pick_us"`
	Lost          uint64    `json:"lost,omitempty"` // sched events this CPU lost
	between       Dist
	wake          Dist
	cswitch       Dist
	pick          Dist
	last          uint64 // time of its latest switch
	haveLast      bool
	lossEnd       uint64 // end of its latest loss of sched events
	lossy         bool   // it lost some
}

// Durations is a distribution of durations in microseconds.
type Durations struct {
	Count  uint64  `json:"count"`
	Mean   float64 `json:"mean"`
	Median float64 `json:"median"`
	P99    float64 `json:"p99"`
	Max    float64 `json:"max"`
	CV     float64 `json:"cv"`
}

func durations(d *Dist) Durations {
	return Durations{Count: d.N, Mean: d.Mean(), Median: d.Quantile(0.5), P99: d.Quantile(0.99), Max: d.Max, CV: d.CV()}
}

// schedEvent is a scheduler event, or a loss of some, in time order.
type schedEvent struct {
	t         uint64
	kind      schedKind
	cpu       uint16
	tid, next uint32 // switch: the task leaving and the one arriving; wakeup: tid is the woken task
	prevState uint32 // switch: the leaving task's state, 0 = still runnable (preempted)
	// switch: ns from sched_entry_tp to it, and the whole of the CPU's
	// previous switch (entry to exit); 0 = not measured
	pick, lastSwitch uint32
	end              uint64 // loss: time of the last event lost (t is the first)
}

type schedKind uint8

const (
	schedSwitch schedKind = iota + 1
	schedWakeup
	schedLoss
)

// schedTracker follows one trace's scheduler events, which the stream puts
// in time order before it hands them over, in memory bounded by the CPUs
// and the tasks waiting to run.
type schedTracker struct {
	cpus    map[uint16]*CPUSched
	all     CPUSched
	woken   map[uint32]uint64 // task → when it was woken, until it runs
	lossEnd uint64            // end of the latest loss, any CPU
	lossy   bool
	lost    uint64
	seen    bool
	// onGap, if set, is told of every time between two switches of a CPU.
	onGap func(cpu uint16, t, gap uint64)
}

func newSchedTracker() *schedTracker {
	return &schedTracker{cpus: map[uint16]*CPUSched{}, woken: map[uint32]uint64{}, all: CPUSched{CPU: -1}}
}

func (s *schedTracker) cpu(n uint16) *CPUSched {
	c := s.cpus[n]
	if c == nil {
		c = &CPUSched{CPU: int(n)}
		s.cpus[n] = c
	}
	return c
}

func (s *schedTracker) step(e schedEvent) {
	c := s.cpu(e.cpu)
	switch e.kind {
	case schedLoss:
		// Gaps of this CPU and wakeups anywhere that span the loss are
		// left out: the switch that ended them may be among the lost.
		c.Lost += uint64(e.next)
		s.lost += uint64(e.next)
		c.lossEnd, c.lossy = max(c.lossEnd, e.end), true
		s.lossEnd, s.lossy = max(s.lossEnd, e.end), true
	case schedWakeup:
		s.seen = true
		if _, ok := s.woken[e.tid]; !ok {
			s.woken[e.tid] = e.t // woken twice before it ran: it waited since the first
		}
	case schedSwitch:
		s.seen = true
		c.Switches++
		s.all.Switches++
		// Events further out of order than the window holds are too late
		// to measure from: their gap or wait would be negative.
		if c.haveLast && e.t >= c.last && !(c.lossy && c.lossEnd >= c.last) {
			gap := e.t - c.last
			c.between.Add(float64(gap) / 1e3)
			s.all.between.Add(float64(gap) / 1e3)
			if s.onGap != nil {
				s.onGap(e.cpu, e.t, gap)
			}
		}
		c.last, c.haveLast = max(c.last, e.t), true
		if e.pick > 0 {
			c.pick.Add(float64(e.pick) / 1e3)
			s.all.pick.Add(float64(e.pick) / 1e3)
		}
		// It belongs to the CPU's previous switch, which ran there too.
		if e.lastSwitch > 0 {
			c.cswitch.Add(float64(e.lastSwitch) / 1e3)
			s.all.cswitch.Add(float64(e.lastSwitch) / 1e3)
		}
		// A wakeup of a task that was still running (it had not gone to
		// sleep yet) ends when it leaves the CPU, not when it next runs.
		delete(s.woken, e.tid)
		if w, ok := s.woken[e.next]; ok {
			delete(s.woken, e.next)
			if e.t >= w && !(s.lossy && s.lossEnd >= w) {
				c.wake.Add(float64(e.t-w) / 1e3)
				s.all.wake.Add(float64(e.t-w) / 1e3)
			}
		}
	}
}

// finish returns the statistics, or nil when the trace had no sched
// events; span is the trace's duration in ns.
func (s *schedTracker) finish(path string, span uint64) *SchedStats {
	if !s.seen {
		return nil
	}
	st := &SchedStats{Trace: path, SpanS: float64(span) / 1e9, Lost: s.lost, All: &s.all}
	for _, c := range s.cpus {
		st.CPUs = append(st.CPUs, c)
	}
	sort.Slice(st.CPUs, func(i, j int) bool { return st.CPUs[i].CPU < st.CPUs[j].CPU })
	for _, c := range append(st.CPUs, &s.all) {
		if span > 0 {
			c.PerSecond = float64(c.Switches) / st.SpanS
		}
		c.Between = durations(&c.between)
		c.WakeupToRun = durations(&c.wake)
		c.ContextSwitch = durations(&c.cswitch)
		c.Pick = durations(&c.pick)
	}
	s.all.Lost = s.lost
	return st
}
