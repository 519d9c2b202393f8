// SPDX-License-Identifier: Apache-2.0

package analyze_test

import (
	"math"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/analyze"
)

const us = uint64(1000)

// sw is a context switch on cpu at t µs from prev (leaving in state) to next.
func sw(t uint64, cpu uint16, prev uint32, state uint32, next uint32) rec {
	return rec{typ: "sched_switch", t: t * us, cpu: cpu, tid: prev, u32: map[string]uint32{"next_tid": next, "next_pid": next, "prev_state": state}}
}

// wake is a wakeup of tid at t µs, seen on cpu.
func wake(t uint64, cpu uint16, tid uint32) rec {
	return rec{typ: "sched_wakeup", t: t * us, cpu: cpu, u32: map[string]uint32{"target_tid": tid, "target_cpu": uint32(cpu)}}
}

// loss is a lost record on cpu at t µs for n sched_switch events lost
// between first and last µs.
func loss(t uint64, cpu uint16, n uint32, first, last uint64) rec {
	return rec{typ: "lost", t: t * us, cpu: cpu, size: int32(n),
		u32: map[string]uint32{"n_sched_switch": n, "total": n}, u64: map[string]uint64{"first_ns": first * us, "last_ns": last * us}}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

// schedRecs: two CPUs switching, wakeups, and a loss of events.
func schedRecs() []rec {
	return []rec{
		sw(0, 0, 0, 0, 100),    // cpu 0: idle → 100
		sw(10, 0, 100, 1, 0),   // 100 sleeps
		wake(15, 1, 100),       // … is woken on cpu 1
		sw(19, 1, 0, 0, 100),   // … and runs there 4 µs later
		sw(30, 0, 0, 0, 101),   // cpu 0: idle → 101
		wake(40, 0, 101),       // a wakeup of a task still running: not a wait
		sw(60, 0, 101, 1, 0),   // 101 sleeps: the early wakeup is void
		wake(70, 1, 102),       // woken twice before it runs: waits since the first
		wake(75, 1, 102),       //
		sw(80, 1, 100, 0, 102), // 100 preempted, 102 runs: 10 µs
		sw(100, 0, 0, 0, 101),  // 101 runs without a wakeup seen: no latency
		// cpu 1 loses a switch between 200 and 210 µs (reported at 220).
		sw(190, 1, 102, 1, 0),
		wake(195, 0, 103), // woken before the loss …
		loss(220, 1, 1, 200, 210),
		sw(230, 1, 0, 0, 104),   // the gap 190 → 230 spans the loss: left out
		sw(240, 0, 101, 0, 103), // … runs after it: left out
		wake(245, 1, 105),
		sw(250, 1, 104, 1, 105), // 5 µs, after the loss: counted
	}
}

// TestSchedStats: switches per CPU, the time between them, wakeup-to-run
// latencies, and what a loss of events leaves out.
func TestSchedStats(t *testing.T) {
	recs := schedRecs()
	rep, err := analyze.Modulation([]string{writeTrace(t, recs)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Sched) != 1 {
		t.Fatalf("%d sched sections, want 1", len(rep.Sched))
	}
	st := rep.Sched[0]
	if len(st.CPUs) != 2 || st.Lost != 1 || !near(st.SpanS, 250e-6) {
		t.Fatalf("sched %+v: want 2 CPUs, 1 lost, over 250 µs", st)
	}
	c0, c1 := st.CPUs[0], st.CPUs[1]
	// cpu 0 switches at 0, 10, 30, 60, 100, 240: gaps 10, 20, 30, 40, 140.
	if c0.Switches != 6 || c0.Between.Count != 5 || !near(c0.Between.Mean, 48) || c0.Between.Max != 140 || c0.Lost != 0 {
		t.Errorf("cpu 0: %+v", c0)
	}
	if !near(c0.PerSecond, 6/250e-6) {
		t.Errorf("cpu 0: %v switches/s, want %v", c0.PerSecond, 6/250e-6)
	}
	// cpu 1 switches at 19, 80, 190, 230, 250: gaps 61, 110, (40 across the loss), 20.
	if c1.Switches != 5 || c1.Between.Count != 3 || !near(c1.Between.Mean, 191.0/3) || c1.Lost != 1 {
		t.Errorf("cpu 1: %+v", c1)
	}
	// Wakeup to run: 4 and 10 µs and 5 µs on cpu 1; none on cpu 0
	// (101 woke while running, 103's wait spans the loss).
	if k := c1.WakeupToRun; k.Count != 3 || k.Max != 10 || !near(k.Mean, 19.0/3) {
		t.Errorf("cpu 1 wakeup to run %+v, want 4, 10 and 5 µs", k)
	}
	if k := c0.WakeupToRun; k.Count != 0 {
		t.Errorf("cpu 0 wakeup to run %+v, want none", k)
	}
	if a := st.All; a.CPU != -1 || a.Switches != 11 || a.Between.Count != 8 || a.WakeupToRun.Count != 3 || a.Lost != 1 {
		t.Errorf("all CPUs %+v", a)
	}
	warned := false
	for _, w := range rep.Warnings {
		warned = warned || strings.Contains(w, "1 sched events were lost")
	}
	if !warned {
		t.Errorf("no warning about the lost sched events: %q", rep.Warnings)
	}
	// The plot draws the same gaps.
	fig, err := analyze.Plot([]string{writeTrace(t, recs)}, "sched", analyze.PlotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(fig.Series) != 2 || len(fig.Series[0].X) != 5 || len(fig.Series[1].X) != 3 || fig.Series[1].Y[2] != 20 {
		t.Errorf("sched plot %+v", fig.Series)
	}
}

// readerRecs: a receiving connection whose reader sleeps, is woken, is
// preempted, and a loss of sched events in between.
func readerRecs() []rec {
	const reader = 50
	seg := func(at uint64, seq uint32) []rec {
		return []rec{
			{typ: "dev_recv", t: at * us, conn: 1, size: 1052},
			{typ: "ip_recv", t: (at + 1) * us, conn: 1, size: 1052},
			{typ: "tcp_rcv", t: (at + 2) * us, conn: 1, size: 1000, flags: 0x18, u32: map[string]uint32{"seq": seq}},
		}
	}
	read := func(at uint64) rec { return rec{typ: "sock_recv", t: at * us, conn: 1, size: 1000, tid: reader} }
	recs := []rec{{typ: "conn_open", t: 0, conn: 1, lp: 5201, rp: 40000, laddr: [4]byte{10, 0, 0, 2}, raddr: [4]byte{10, 0, 0, 1}}}
	// Segment 1 waits 12 → 20 µs: its reader is not known yet.
	recs = append(recs, seg(10, 1000)...)
	recs = append(recs, read(20), sw(25, 0, reader, 1, 0))
	// Segment 2 waits 102 → 150: asleep 8, runnable 20, on CPU 20.
	recs = append(recs, seg(100, 2000)...)
	recs = append(recs, wake(110, 0, reader), sw(130, 1, 0, 0, reader), read(150))
	// Segment 3 waits 202 → 250: on CPU 3, unknown 25 (a loss of 205 to
	// 210; the state is known again at the reader's next switch), runnable
	// 10 (preempted), on CPU 10.
	recs = append(recs, seg(200, 3000)...)
	recs = append(recs, loss(212, 1, 1, 205, 210), sw(230, 1, reader, 0, 0), sw(240, 1, 0, 0, reader), read(250))
	return recs
}

// TestReaderOffCPU: the socket wait of a receiving connection split by
// what its reader did: asleep, runnable (woken, waiting for a CPU), on
// CPU, or not followed (before its first read, across a loss).
func TestReaderOffCPU(t *testing.T) {
	recs := readerRecs()
	rep, err := analyze.Modulation([]string{writeTrace(t, recs)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Conns) != 1 || rep.Conns[0].Receive == nil {
		t.Fatalf("no receive path: %+v", rep.Conns)
	}
	r := rep.Conns[0].Receive
	if !near(r.SocketWaitUs, 8+48+48) {
		t.Errorf("socket wait %v µs, want 104", r.SocketWaitUs)
	}
	w := r.Reader
	if w == nil {
		t.Fatalf("no reader split with sched events in the trace")
	}
	want := analyze.ReaderWait{FollowedUs: 48 + 23, OnCPUUs: 20 + 3 + 10, RunnableUs: 20 + 10, AsleepUs: 8,
		OffCPUShare: 38.0 / 71, Followed: 71.0 / 104}
	if !near(w.FollowedUs, want.FollowedUs) || !near(w.OnCPUUs, want.OnCPUUs) || !near(w.RunnableUs, want.RunnableUs) ||
		!near(w.AsleepUs, want.AsleepUs) || !near(w.OffCPUShare, want.OffCPUShare) || !near(w.Followed, want.Followed) {
		t.Errorf("reader wait\n got %+v\nwant %+v", *w, want)
	}

	// Without sched events there is no split, and no sched section.
	var plain []rec
	for _, rc := range recs {
		if rc.typ != "sched_switch" && rc.typ != "sched_wakeup" && rc.typ != "lost" {
			plain = append(plain, rc)
		}
	}
	rep, err = analyze.Modulation([]string{writeTrace(t, plain)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Sched) != 0 || rep.Conns[0].Receive == nil || rep.Conns[0].Receive.Reader != nil {
		t.Errorf("a trace without sched events: sched %v, receive %+v", rep.Sched, rep.Conns[0].Receive)
	}
}

// TestSchedContextSwitchTime: the time in the scheduler that sched_switch
// records carry counts on their CPU, and a record without it (0: not
// measured) counts nowhere.
func TestSchedContextSwitchTime(t *testing.T) {
	timed := func(r rec, pick, last uint32) rec {
		r.u32["pick_ns"], r.u32["last_switch_ns"] = pick, last
		return r
	}
	recs := []rec{
		timed(sw(0, 0, 0, 0, 100), 800, 0), // the CPU's first: no previous switch
		timed(sw(10, 0, 100, 1, 0), 900, 2000),
		timed(sw(20, 0, 0, 0, 100), 1000, 1500),
		sw(30, 0, 100, 1, 0), // not measured at all
		timed(sw(40, 1, 0, 0, 101), 0, 4000),
		timed(sw(50, 1, 101, 1, 0), 2000, 0),
	}
	rep, err := analyze.Modulation([]string{writeTrace(t, recs)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	st := rep.Sched[0]
	c0, c1, all := st.CPUs[0], st.CPUs[1], st.All
	if x := c0.ContextSwitch; x.Count != 2 || !near(x.Mean, 1.75) || x.Max != 2 {
		t.Errorf("cpu 0 context switch %+v, want 2 of mean 1.75 µs, max 2", x)
	}
	if p := c0.Pick; p.Count != 3 || !near(p.Mean, 0.9) {
		t.Errorf("cpu 0 pick %+v, want 3 of mean 0.9 µs", p)
	}
	if x, p := c1.ContextSwitch, c1.Pick; x.Count != 1 || x.Max != 4 || p.Count != 1 || p.Max != 2 {
		t.Errorf("cpu 1: context switch %+v, pick %+v", x, p)
	}
	if x := all.ContextSwitch; x.Count != 3 || !near(x.Mean, 2.5) || x.Max != 4 {
		t.Errorf("all: context switch %+v, want 3 of mean 2.5 µs", x)
	}
	// Records without the fields (as before they were added) measure nothing.
	old, err := analyze.Modulation([]string{writeTrace(t, schedRecs())}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n := old.Sched[0].All.ContextSwitch.Count + old.Sched[0].All.Pick.Count; n != 0 {
		t.Errorf("%d times from records that carry none", n)
	}
}
