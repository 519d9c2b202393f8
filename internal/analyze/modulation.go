// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"container/heap"
	"fmt"
	"sort"
	"strconv"

	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// Layers are the events of the modulation table, in the order data passes
// them: down the sender's stack, then up the receiver's.
var Layers = []string{"sock_send", "tcp_send", "tcp_xmit", "ip_send", "dev_queue", "dev_xmit", "dev_recv", "ip_recv", "tcp_rcv", "sock_recv"}

// dataOnly marks layers where events without payload (pure ACKs, failed
// calls) are left out, so sizes and spacing describe the data.
var dataOnly = map[string]bool{"sock_send": true, "sock_recv": true, "tcp_send": true, "tcp_xmit": true, "tcp_rcv": true}

// hopTypes are the events "where time goes" follows.
var hopTypes = map[string]bool{"tcp_xmit": true, "ip_send": true, "dev_queue": true, "dev_xmit": true,
	"dev_recv": true, "ip_recv": true, "tcp_rcv": true, "sock_recv": true}

// Summary is a distribution as reported.
type Summary struct {
	Mean   float64 `json:"mean"`
	Median float64 `json:"median"`
	P99    float64 `json:"p99"`
	CV     float64 `json:"cv"`
}

func summarise(d *Dist) Summary {
	return Summary{Mean: d.Mean(), Median: d.Quantile(0.5), P99: d.Quantile(0.99), CV: d.CV()}
}

// LayerStats is one row of the modulation table: how many events a layer
// saw, their sizes (bytes) and the spacing between them (microseconds).
type LayerStats struct {
	Layer     string  `json:"layer"`
	Count     uint64  `json:"count"`
	Bytes     int64   `json:"bytes"`
	Size      Summary `json:"size_bytes"`
	Spacing   Summary `json:"spacing_us"`
	LostNear  uint64  `json:"lost,omitempty"` // events of this type lost in the trace: figures may be off
	size, gap Dist
}

// ConnReport is the modulation of one connection.
type ConnReport struct {
	Trace      string            `json:"trace"`
	Conn       *export.Conn      `json:"conn"`
	Layers     []*LayerStats     `json:"layers"`
	SendBuffer *SendBuffer       `json:"send_buffer,omitempty"`
	Throughput *Throughput       `json:"throughput,omitempty"`
	TCP        *TCPStats         `json:"tcp,omitempty"`
	Drops      map[string]uint64 `json:"drops,omitempty"`
	Hops       []*HopStats       `json:"hops,omitempty"`
	Receive    *TimeShare        `json:"receive_time,omitempty"`
}

// Report is the modulation of every connection and of the host.
type Report struct {
	Traces   []string          `json:"traces"`
	Conns    []*ConnReport     `json:"connections"`
	Host     []*LayerStats     `json:"host"`
	Lost     uint64            `json:"lost"`
	Drops    map[string]uint64 `json:"drops,omitempty"` // host-wide, by kernel reason
	Sched    []*SchedStats     `json:"sched,omitempty"` // per trace that recorded sched events
	Warnings []string          `json:"warnings,omitempty"`
}

// reorderWindow re-sorts events this far apart in file order: the recorder
// writes rings in drain order, so events of different CPUs can be slightly
// out of time order.
const reorderWindow = 256

type key struct {
	src  int
	conn uint64
	typ  string
}

type timeHeap []uint64

func (h timeHeap) Len() int           { return len(h) }
func (h timeHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h timeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timeHeap) Push(x any)        { *h = append(*h, x.(uint64)) }
func (h *timeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// series accumulates one (connection, layer): sizes directly, spacing
// through a small reorder window.
type series struct {
	st      *LayerStats
	pending timeHeap
	last    uint64
	started bool
}

func (s *series) add(t uint64, size int32) {
	s.st.Count++
	if size > 0 {
		s.st.Bytes += int64(size)
	}
	s.st.size.Add(float64(size))
	heap.Push(&s.pending, t)
	if len(s.pending) > reorderWindow {
		s.emit(heap.Pop(&s.pending).(uint64))
	}
}

func (s *series) emit(t uint64) {
	if s.started {
		s.st.gap.Add(float64(t-s.last) / 1e3)
	}
	s.last, s.started = t, true
}

func (s *series) finish() {
	for len(s.pending) > 0 {
		s.emit(heap.Pop(&s.pending).(uint64))
	}
	s.st.Size = summarise(&s.st.size)
	s.st.Spacing = summarise(&s.st.gap)
}

// Modulation reads the traces and builds the report. onlyConn, if not 0,
// keeps one connection. The error, if any, comes with what was read.
func Modulation(paths []string, onlyConn uint64) (*Report, error) {
	return ModulationOf(trace.Sources(paths), onlyConn)
}

// ModulationOf is Modulation of sources: single files or chains of rotated
// files, each read as one trace.
func ModulationOf(srcs []trace.Source, onlyConn uint64) (*Report, error) {
	rep := &Report{}
	paths := make([]string, len(srcs))
	for i, src := range srcs {
		paths[i] = src.Name
	}
	perConn := map[key]*series{}
	details := map[key]*connDetail{}
	hops := map[key]*hopTracker{}
	rep.Drops = map[string]uint64{}
	host := map[string]*series{}
	lostBy := map[string]uint64{}
	layer := map[string]bool{}
	for _, l := range Layers {
		layer[l] = true
	}
	var conns [][]*export.Conn
	var steps []float64 // per trace: the recording host's clock step, ns
	var withSched []bool
	for si, src := range srcs {
		path := src.Name
		rep.Traces = append(rep.Traces, path)
		cs, err := connTable(src)
		conns = append(conns, cs)
		if err != nil {
			return rep, err
		}
		tcp := map[uint64]bool{}
		for _, c := range cs {
			tcp[c.ID] = c.Proto == "tcp"
		}
		r, err := src.Open()
		if err != nil {
			return rep, err
		}
		h := r.Header()
		sched := newSchedTracker()
		var first, last uint64
		began := false
		// The threads that read each connection: their sched events go to
		// the connection's hop tracker too, to tell where the reader was
		// while data waited for it.
		readers := map[uint32][]*hopTracker{}
		var following []*hopTracker
		err = export.Walk(path, r, func(_ *export.Resolver, rec trace.Record) error {
			name := rec.Type.Name
			if t := rec.Time(); !began || t < first {
				first, began = t, true
			}
			last = max(last, rec.Time())
			if e, ok := schedEventOf(rec); ok {
				sched.add(e)
				routeSched(e, readers, following)
				if e.kind != schedLoss {
					return nil
				}
			}
			if name == "drop" {
				f, _ := rec.Type.Field("reason")
				v, _ := rec.Uint("reason")
				reason, ok := h.EnumName(f, v)
				if !ok {
					reason = "reason " + strconv.FormatUint(v, 10)
				}
				rep.Drops[reason]++
			}
			if c := rec.Conn(); c != 0 && (onlyConn == 0 || c == onlyConn) {
				dk := key{si, c, ""}
				d := details[dk]
				if d == nil {
					d = newConnDetail()
					details[dk] = d
				}
				d.observe(h, rec)
				if tcp[c] && hopTypes[name] {
					ht := hops[dk]
					if ht == nil {
						ht = newHopTracker()
						hops[dk] = ht
					}
					seq, _ := rec.Uint("seq")
					ht.add(hopEvent{t: rec.Time(), typ: name, size: rec.Size(), seq: uint32(seq), flags: rec.Flags(), tid: rec.TID()})
					if name == "sock_recv" && rec.Size() > 0 && !ht.reads(rec.TID()) {
						if len(ht.readers) == 0 {
							following = append(following, ht)
						}
						ht.addReader(rec.TID())
						readers[rec.TID()] = append(readers[rec.TID()], ht)
					}
				}
			}
			if name == "lost" {
				for _, f := range rec.Type.Fields {
					if n, ok := rec.Uint(f.Name); ok && len(f.Name) > 2 && f.Name[:2] == "n_" {
						lostBy[f.Name[2:]] += n
						rep.Lost += n
					}
				}
				return nil
			}
			if !layer[name] || dataOnly[name] && rec.Size() <= 0 {
				return nil
			}
			c := rec.Conn()
			if onlyConn != 0 && c != onlyConn {
				return nil
			}
			if c != 0 {
				k := key{si, c, name}
				s := perConn[k]
				if s == nil {
					s = &series{st: &LayerStats{Layer: name}}
					perConn[k] = s
				}
				s.add(rec.Time(), rec.Size())
			}
			hs := host[name]
			if hs == nil {
				hs = &series{st: &LayerStats{Layer: name}}
				host[name] = hs
			}
			hs.add(rec.Time(), rec.Size())
			return nil
		})
		if err != nil {
			r.Close()
			return rep, err
		}
		steps = append(steps, clockStep(h))
		if st := sched.finish(path, last-first); st != nil {
			rep.Sched = append(rep.Sched, st)
			withSched = append(withSched, true)
		} else {
			withSched = append(withSched, false)
		}
		if cut, off := r.Truncated(); cut {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s was cut short at offset %d: figures cover what was recorded before", path, off))
		}
		for _, w := range r.Warnings() {
			rep.Warnings = append(rep.Warnings, path+": "+w)
		}
		r.Close()
	}
	for _, s := range perConn {
		s.finish()
	}
	for _, s := range host {
		s.finish()
	}
	rep.Warnings = append(rep.Warnings, hostWarnings(paths, steps, perConn)...)
	for si, cs := range conns {
		for _, c := range cs {
			if onlyConn != 0 && c.ID != onlyConn {
				continue
			}
			cr := &ConnReport{Trace: paths[si], Conn: c}
			if d := details[key{si, c.ID, ""}]; d != nil {
				d.finish(c.OpenNs, c.CloseNs)
				if d.sbStarted {
					cr.SendBuffer = &d.sb
				}
				if d.tp.AppBytes > 0 || d.tp.WireBytes > 0 {
					cr.Throughput = &d.tp
				}
				if d.tcp.Snapshots > 0 || d.tcp.RetransSegs > 0 || d.tcp.RetransEvents > 0 {
					cr.TCP = &d.tcp
				}
				if len(d.drops) > 0 {
					cr.Drops = d.drops
				}
			}
			if ht := hops[key{si, c.ID, ""}]; ht != nil {
				cr.Hops, cr.Receive = ht.finish(withSched[si])
			}
			for _, l := range Layers {
				if s := perConn[key{si, c.ID, l}]; s != nil {
					s.st.LostNear = lostBy[l]
					cr.Layers = append(cr.Layers, s.st)
				}
			}
			if len(cr.Layers) > 0 {
				rep.Conns = append(rep.Conns, cr)
			}
		}
	}
	// Busiest connections first.
	sort.SliceStable(rep.Conns, func(i, j int) bool { return busiest(rep.Conns[i]) > busiest(rep.Conns[j]) })
	for _, l := range Layers {
		if s := host[l]; s != nil {
			s.st.LostNear = lostBy[l]
			rep.Host = append(rep.Host, s.st)
		}
	}
	if rep.Lost > 0 {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("%d events were lost (ring buffer full): counts, bytes and spacing of the layers marked lost may be off", rep.Lost))
	}
	for _, st := range rep.Sched {
		if st.Lost > 0 {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s: %d sched events were lost: switch counts of the CPUs marked lost are short; gaps between switches, wakeups and reader states across a loss are left out", st.Trace, st.Lost))
		}
	}
	return rep, nil
}

// routeSched hands a scheduler event to the hop trackers of the connections
// its threads read (a loss, to every tracker following a reader).
func routeSched(e schedEvent, readers map[uint32][]*hopTracker, following []*hopTracker) {
	he := hopEvent{t: e.t, typ: hopSched, sched: e}
	switch e.kind {
	case schedLoss:
		for _, ht := range following {
			ht.add(he)
		}
	case schedWakeup:
		for _, ht := range readers[e.tid] {
			ht.add(he)
		}
	case schedSwitch:
		for _, ht := range readers[e.tid] {
			ht.add(he)
		}
		for _, ht := range readers[e.next] {
			if !ht.reads(e.tid) { // already has it
				ht.add(he)
			}
		}
	}
}

func busiest(c *ConnReport) int64 {
	var b int64
	for _, l := range c.Layers {
		if l.Bytes > b {
			b = l.Bytes
		}
	}
	return b
}

func connTable(src trace.Source) ([]*export.Conn, error) {
	r, err := src.Open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cs, _, err := export.Conns(r)
	if err != nil {
		return cs, fmt.Errorf("%s: %w", src.Name, err)
	}
	return cs, nil
}

// clockStep is the clock step the recording host measured (magnet
// hostcheck, in the trace header), or 0 when unknown.
func clockStep(h *trace.Header) float64 {
	lim, ok := h.Extra["host_limits"].(map[string]any)
	if !ok {
		return 0
	}
	step, _ := lim["clock_step_ns"].(float64)
	return step
}

// hostWarnings says when a trace asks more of its host than the host can
// give: events closer together than the recording host's clock step, whose
// spacing is then the clock's, not the network's.
func hostWarnings(paths []string, steps []float64, perConn map[key]*series) []string {
	var out []string
	seen := map[key]bool{}
	for k, s := range perConn {
		step := steps[k.src]
		sk := key{src: k.src, typ: k.typ}
		if step <= 0 || seen[sk] || s.st.gap.N == 0 || s.st.gap.Min*1e3 >= step {
			continue
		}
		seen[sk] = true
		out = append(out, fmt.Sprintf("%s: %s events as close as %.0f ns, below this host's clock step of %.0f ns: their spacing is the clock's, not the network's", paths[k.src], k.typ, s.st.gap.Min*1e3, step))
	}
	sort.Strings(out)
	return out
}
