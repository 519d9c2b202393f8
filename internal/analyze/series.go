// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// Kinds are the time series `magnet plot` draws.
var Kinds = []string{"modulation", "sendbuf", "bandwidth", "cwnd", "srtt", "layers", "sched"}

// Named is one series of points.
type Named struct {
	Name    string
	X, Y    []float64
	Scatter bool
	// Steps: the quantity holds its value until the next point.
	Steps bool
}

// Figure is what a plot shows: series and their axis labels.
type Figure struct {
	Title, XLabel, YLabel string
	Series                []Named
	Conn                  uint64
	NoData                string // what to say when no series has points ("" for a general note)
	LogX, LogY            bool   // axes on a log scale
	// Warnings says what was wrong with the trace read (cut short, files
	// of a chain missing, damage skipped), as the report says it.
	Warnings []string
}

// connSeries collects one connection's raw points (times in ns).
type connSeries struct {
	appT, wireT        []uint64
	appB, wireB        []int64
	sendT, sendB       []float64 // sock_send time (s), size
	xmitT, xmitB       []float64 // dev_xmit time (s), size
	stateT, cwnd, ss   []float64
	srtt               []float64
	detail             *connDetail
	hops               *hopTracker
	appIsRecv, haveApp bool
	appBytes           int64
	sbT, sbY           []float64
	// path: the segments this end sent, followed to its peer's reader.
	path []pathPoint
}

// PlotOptions choose what a figure shows.
type PlotOptions struct {
	// Conn is the connection (0: the one that moved the most application
	// bytes).
	Conn uint64
	// Window is the bandwidth series' sliding time window; WindowEvents,
	// if set, slides over that many events instead (MAGNET 2.0 used 1000
	// receive events).
	Window       time.Duration
	WindowEvents int
}

// Plot builds the figure of kind for the first trace in paths.
func Plot(paths []string, kind string, opts PlotOptions) (*Figure, error) {
	return PlotOf(trace.Sources(paths)[0], kind, opts)
}

// PlotOf builds the figure of kind for one source: a file or a chain of
// rotated files.
func PlotOf(in trace.Source, kind string, opts PlotOptions) (fig *Figure, err error) {
	conn, window := opts.Conn, opts.Window
	if !contains(Kinds, kind) {
		return nil, fmt.Errorf("unknown plot kind %q (want %v)", kind, Kinds)
	}
	st, err := openStream([]trace.Source{in})
	if err != nil {
		return nil, err
	}
	defer st.close()
	defer func() {
		if fig != nil {
			fig.Warnings = st.warnings()
		}
	}()
	var start uint64
	started := false
	// sched: the time between switches of each CPU, in time order, leaving
	// out gaps across a loss of events as the report does.
	perCPU := map[uint16]*Named{}
	sched := newSchedTracker()
	sched.onGap = func(cpu uint16, t, gap uint64) {
		n := perCPU[cpu]
		if n == nil {
			n = &Named{Name: "cpu " + strconv.Itoa(int(cpu)), Scatter: true}
			perCPU[cpu] = n
		}
		n.X = append(n.X, float64(int64(t)-int64(start))/1e9)
		n.Y = append(n.Y, float64(gap)/1e3)
	}
	var ends []*connState
	st.newConn = func(cs *connState) {
		cs.plot = &connSeries{detail: newConnDetail(cs.src.dec), hops: newHopTracker(cs)}
		cs.plot.detail.sbTrace = &cs.plot.sbT
		cs.plot.detail.sbTraceY = &cs.plot.sbY
		ends = append(ends, cs)
	}
	st.onEvent = func(e *ev) {
		if !started {
			start, started = e.t, true
		}
		t := e.t
		ts := float64(int64(t)-int64(start)) / 1e9
		if se, ok := schedOf(e); ok {
			if kind == "sched" {
				sched.step(se)
			}
			return
		}
		cs := e.cs
		if cs == nil || conn != 0 && cs.id != conn {
			return
		}
		p := cs.plot
		p.detail.start = start
		p.detail.observe(e)
		if !cs.notTCP {
			p.hops.step(e)
		}
		size := int64(e.size)
		switch e.kind {
		case kSockSend, kSockRecv:
			if size <= 0 {
				break
			}
			recv := e.kind == kSockRecv
			if !p.haveApp {
				p.appIsRecv, p.haveApp = recv, true
			}
			if recv == p.appIsRecv {
				p.appT, p.appB = append(p.appT, t), append(p.appB, size)
				p.appBytes += size
			}
			if !recv {
				p.sendT, p.sendB = append(p.sendT, ts), append(p.sendB, float64(size))
			}
		case kDevXmit, kDevRecv:
			p.wireT, p.wireB = append(p.wireT, t), append(p.wireB, size)
			if e.kind == kDevXmit {
				p.xmitT, p.xmitB = append(p.xmitT, ts), append(p.xmitB, float64(size))
			}
		case kTCPState:
			p.stateT = append(p.stateT, ts)
			p.cwnd = append(p.cwnd, float64(e.a))
			p.ss = append(p.ss, float64(e.c))
			p.srtt = append(p.srtt, float64(e.b)/1e3)
		}
	}
	if err := st.run(); err != nil {
		return nil, err
	}
	per := map[uint64]*connSeries{}
	for _, cs := range ends {
		per[cs.id] = cs.plot
	}
	path := in.Name
	fig = &Figure{XLabel: "time since the trace began (s)"}
	if kind == "sched" {
		fig.Title = "context switches: time between switches per CPU"
		fig.YLabel = "time since the previous switch on this CPU (µs, log scale)"
		fig.LogY = true
		fig.NoData = "no sched events in this trace (record with --groups default,sched)"
		cpus := make([]int, 0, len(perCPU))
		for c := range perCPU {
			cpus = append(cpus, int(c))
		}
		sort.Ints(cpus)
		for _, c := range cpus {
			fig.Series = append(fig.Series, *perCPU[uint16(c)])
		}
		return fig, nil
	}
	if conn == 0 {
		for id, s := range per {
			if conn == 0 || s.appBytes > per[conn].appBytes || s.appBytes == per[conn].appBytes && id < conn {
				conn = id
			}
		}
	}
	s := per[conn]
	if s == nil && conn == 0 {
		// No connection: none recorded, or none the selection kept.
		return nil, fmt.Errorf("no connection's events in %s (with the selection, if one was given)", path)
	}
	if s == nil {
		return nil, fmt.Errorf("connection %d has no events in %s", conn, path)
	}
	fig.Conn = conn
	label := fmt.Sprintf("connection %d", conn)
	switch kind {
	case "modulation":
		fig.Title = label + ": what the application sent vs what reached the wire"
		fig.YLabel = "size (bytes)"
		fig.Series = []Named{{Name: "application sends", X: s.sendT, Y: s.sendB, Scatter: true},
			{Name: "device transmits", X: s.xmitT, Y: s.xmitB, Scatter: true}}
	case "sendbuf":
		fig.Title = label + ": send-buffer occupancy (written − acknowledged)"
		fig.YLabel = "bytes"
		xs := make([]float64, len(s.sbT))
		copy(xs, s.sbT)
		fig.Series = []Named{{Name: "occupancy", X: xs, Y: s.sbY, Steps: true}}
	case "bandwidth":
		if opts.WindowEvents > 0 {
			fig.Title = fmt.Sprintf("%s: throughput over a sliding window of %d events", label, opts.WindowEvents)
			fig.YLabel = "rate (Mbit/s)"
			ax, ay := eventWindowRate(s.appT, s.appB, opts.WindowEvents, start)
			wx, wy := eventWindowRate(s.wireT, s.wireB, opts.WindowEvents, start)
			fig.Series = []Named{{Name: "application", X: ax, Y: ay}, {Name: "wire (device)", X: wx, Y: wy}}
			break
		}
		if window <= 0 {
			window = defaultWindow(s.appT, s.wireT)
		}
		fig.Title = fmt.Sprintf("%s: throughput over a sliding window of %v", label, window)
		fig.YLabel = "rate (Mbit/s)"
		ax, ay := slidingRate(s.appT, s.appB, window, start)
		wx, wy := slidingRate(s.wireT, s.wireB, window, start)
		fig.Series = []Named{{Name: "application", X: ax, Y: ay}, {Name: "wire (device)", X: wx, Y: wy}}
	case "cwnd":
		fig.Title = label + ": congestion window and slow-start threshold"
		fig.YLabel = "segments"
		ss := make([]float64, len(s.ss))
		for i, v := range s.ss {
			ss[i] = math.Min(v, 2*maxOf(s.cwnd)+10) // "infinite" ssthresh stays on the chart
		}
		fig.Series = []Named{{Name: "cwnd", X: s.stateT, Y: s.cwnd}, {Name: "ssthresh (clipped)", X: s.stateT, Y: ss}}
	case "srtt":
		fig.Title = label + ": smoothed round-trip time"
		fig.YLabel = "srtt (ms)"
		fig.Series = []Named{{Name: "srtt", X: s.stateT, Y: s.srtt}}
	case "layers":
		fig.Title = label + ": per-hop delay (cumulative distribution)"
		fig.XLabel = "delay (µs, log scale)"
		fig.YLabel = "fraction of segments"
		fig.LogX = true
		hops, _ := s.hops.finish(false)
		for _, hs := range hops {
			x, y := hs.d.CDF()
			for i := range x {
				x[i] = math.Max(x[i], 0.01) // 10 ns: the zeros stay on a log axis
			}
			fig.Series = append(fig.Series, Named{Name: hs.Hop, X: x, Y: y})
		}
	}
	return fig, nil
}

// slidingRate gives, at each event, the bytes of the events within the
// window ending there, as Mbit/s (x in seconds since start).
func slidingRate(ts []uint64, bs []int64, window time.Duration, start uint64) ([]float64, []float64) {
	idx := make([]int, len(ts))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return ts[idx[a]] < ts[idx[b]] })
	var xs, ys []float64
	var sum int64
	lo := 0
	w := uint64(window)
	for _, i := range idx {
		sum += bs[i]
		for ts[idx[lo]]+w < ts[i] {
			sum -= bs[idx[lo]]
			lo++
		}
		if ts[i]-ts[idx[0]] < w {
			continue // the first window is not full yet
		}
		xs = append(xs, float64(ts[i]-start)/1e9)
		ys = append(ys, float64(sum)*8/window.Seconds()/1e6)
	}
	return xs, ys
}

// eventWindowRate gives, at each event from the n-th on, the rate over the
// last n events: the bytes of the n−1 newest over the time they span.
func eventWindowRate(ts []uint64, bs []int64, n int, start uint64) ([]float64, []float64) {
	idx := make([]int, len(ts))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return ts[idx[a]] < ts[idx[b]] })
	var xs, ys []float64
	var sum int64
	for k, i := range idx {
		sum += bs[i]
		if k >= n {
			sum -= bs[idx[k-n]]
		}
		if k < n-1 || n < 2 {
			continue
		}
		first := idx[k-n+1]
		span := ts[i] - ts[first]
		if span == 0 {
			continue
		}
		// The first event of the window opens it: its bytes arrived before.
		xs = append(xs, float64(ts[i]-start)/1e9)
		ys = append(ys, float64(sum-bs[first])*8/(float64(span)/1e9)/1e6)
	}
	return xs, ys
}

func defaultWindow(a, b []uint64) time.Duration {
	var lo, hi uint64
	for _, ts := range [][]uint64{a, b} {
		for _, t := range ts {
			if lo == 0 || t < lo {
				lo = t
			}
			if t > hi {
				hi = t
			}
		}
	}
	w := time.Duration(hi-lo) / 50
	return max(w.Round(time.Millisecond), 10*time.Millisecond)
}

func maxOf(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = math.Max(m, x)
	}
	return m
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// CDF returns the distribution's cumulative curve from its histogram:
// bucket upper bounds and the fraction of values at or below them.
func (d *Dist) CDF() ([]float64, []float64) {
	if d.N == 0 {
		return nil, nil
	}
	var xs, ys []float64
	seen := d.zeros
	if seen > 0 {
		xs, ys = append(xs, 0), append(ys, float64(seen)/float64(d.N))
	}
	d.each(func(o, sub int, n uint64) bool {
		seen += n
		xs = append(xs, bucketBound(o, sub, 1))
		ys = append(ys, float64(seen)/float64(d.N))
		return true
	})
	return xs, ys
}
