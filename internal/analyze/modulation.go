// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"fmt"
	"sort"
	"strings"

	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/trace"
)

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
	// DropClasses splits Drops into those that lose data and those at
	// teardown or of duplicates (DropLosesData).
	DropClasses *DropClasses `json:"drop_classes,omitempty"`
	Hops        []*HopStats  `json:"hops,omitempty"`
	Receive     *TimeShare   `json:"receive_time,omitempty"`
	// Path follows the segments this end sent to the peer's application,
	// when both ends are in the traces.
	Path *Path `json:"path,omitempty"`
	// Verdict: why the transfer went no faster (verdict.go).
	Verdict *Verdict `json:"verdict,omitempty"`
}

// Report is the modulation of every connection and of the host.
type Report struct {
	Traces []string          `json:"traces"`
	Conns  []*ConnReport     `json:"connections"`
	Host   []*LayerStats     `json:"host"`
	Lost   uint64            `json:"lost"`
	Drops  map[string]uint64 `json:"drops,omitempty"` // host-wide, by kernel reason
	// DropClasses splits Drops as ConnReport's does.
	DropClasses *DropClasses  `json:"drop_classes,omitempty"`
	Sched       []*SchedStats `json:"sched,omitempty"` // per trace that recorded sched events
	// ReceivePath: per trace recorded with the irq or napi groups.
	ReceivePath []*RxPath `json:"receive_path,omitempty"`
	// KernelEvents: per trace recorded with kernel events chosen at run
	// time (--tracepoint, --uprobe, --usdt, --kprobe, irq, napi), how
	// many of each it holds.
	KernelEvents []*KernelEventCounts `json:"kernel_events,omitempty"`
	// Summaries: the connections of traces recorded in summary mode,
	// their conn_summary records added up (Summaries).
	Summaries []*SummaryConn `json:"summary_connections,omitempty"`
	Warnings  []string       `json:"warnings,omitempty"`
}

// series accumulates one (connection, layer) or host layer, from events in
// time order.
type series struct {
	st      *LayerStats
	last    uint64
	started bool
}

func (s *series) add(t uint64, size int32) {
	s.st.Count++
	if size > 0 {
		s.st.Bytes += int64(size)
	}
	s.st.size.Add(float64(size))
	if s.started {
		if t >= s.last {
			s.st.gap.Add(float64(t-s.last) / 1e3)
		} else {
			s.st.gap.Add(0) // later than the stream could sort it
		}
	}
	if !s.started || t > s.last {
		s.last = t
	}
	s.started = true
}

func (s *series) finish() {
	s.st.Size = summarise(&s.st.size)
	s.st.Spacing = summarise(&s.st.gap)
}

func newSeries(k kind) *series {
	return &series{st: &LayerStats{Layer: kindNames[k]}}
}

// Modulation reads the traces and builds the report. onlyConn, if not 0,
// keeps one connection. The error, if any, comes with what was read.
func Modulation(paths []string, onlyConn uint64) (*Report, error) {
	return ModulationOf(trace.Sources(paths), onlyConn)
}

// ModulationOf is Modulation of sources: single files or chains of rotated
// files, each read as one trace.
func ModulationOf(ins []trace.Source, onlyConn uint64) (*Report, error) {
	rep := &Report{Drops: map[string]uint64{}}
	for _, in := range ins {
		rep.Traces = append(rep.Traces, in.Name)
	}
	s, err := openStream(ins)
	if err != nil {
		return rep, err
	}
	defer s.close()
	var host [numLayers]*series
	// Per trace: its scheduler, and the threads that read each connection,
	// whose sched events go to the connection's hop tracker too, to tell
	// where the reader was while data waited for it.
	scheds := make([]*schedTracker, len(s.srcs))
	readers := make([]map[uint32][]*hopTracker, len(s.srcs))
	following := make([][]*hopTracker, len(s.srcs))
	for i := range s.srcs {
		scheds[i], readers[i] = newSchedTracker(), map[uint32][]*hopTracker{}
	}
	s.newConn = func(cs *connState) {
		cs.detail = newConnDetail(cs.src.dec)
		cs.hops = newHopTracker(cs)
		cs.verdict = &verdictTracker{}
	}
	rx := make([]*rxTracker, len(s.srcs))
	for i, src := range s.srcs {
		rx[i] = newRxTracker(src.h, src.offset)
	}
	kev := make([]map[string]uint64, len(s.srcs))
	s.onOther = func(i int, id uint64, rec trace.Record) {
		if rx[i] != nil {
			rx[i].other(id, rec)
		}
		if rec.Type != nil && rec.Type.ID >= firstKernelID {
			if kev[i] == nil {
				kev[i] = map[string]uint64{}
			}
			kev[i][rec.Type.Name]++
		}
	}
	s.onEvent = func(e *ev) {
		if e.kind == kDevRecv && rx[e.src] != nil && e.cs != nil {
			rx[e.src].dev(e.t, e.cs.id, e.cpu)
		}
		if se, ok := schedOf(e); ok {
			scheds[e.src].step(se)
			routeSched(se, readers[e.src], following[e.src])
			return
		}
		cs := e.cs
		if cs != nil {
			cs.detail.observe(e)
			if !cs.notTCP {
				cs.verdict.observe(e)
				ht := cs.hops
				ht.step(e)
				if e.kind == kSockRecv && e.size > 0 && !ht.reads(e.tid) {
					if len(ht.readers) == 0 {
						following[e.src] = append(following[e.src], ht)
					}
					ht.addReader(e.tid)
					readers[e.src][e.tid] = append(readers[e.src][e.tid], ht)
				}
			}
		}
		li, ok := e.kind.layer()
		if !ok || e.kind.dataOnly() && e.size <= 0 {
			return
		}
		if cs != nil && onlyConn != 0 && cs.id != onlyConn {
			return
		}
		if onlyConn != 0 && cs == nil {
			return
		}
		if cs != nil {
			sr := cs.layers[li]
			if sr == nil {
				sr = newSeries(e.kind)
				cs.layers[li] = sr
			}
			sr.add(e.t, e.size)
		}
		hs := host[li]
		if hs == nil {
			hs = newSeries(e.kind)
			host[li] = hs
		}
		hs.add(e.t, e.size)
	}
	err = s.run()
	rep.Drops = s.drops
	rep.DropClasses = classifyDrops(s.drops)
	rep.Lost = s.lost
	withSched := make([]bool, len(s.srcs))
	for i, src := range s.srcs {
		if rp := rx[i].finish(src.path, src.last-src.first, nil); rp != nil {
			rep.ReceivePath = append(rep.ReceivePath, rp)
		}
	}
	for i, src := range s.srcs {
		if kev[i] != nil {
			rep.KernelEvents = append(rep.KernelEvents, kernelEventCounts(src.path, src.h, kev[i]))
		}
	}
	for i, src := range s.srcs {
		if st := scheds[i].finish(src.path, src.last-src.first); st != nil {
			rep.Sched = append(rep.Sched, st)
			withSched[i] = true
		}
	}
	rep.Warnings = append(rep.Warnings, s.warnings()...)
	for _, sr := range host {
		if sr != nil {
			sr.finish()
		}
	}
	for _, src := range s.srcs {
		for _, cs := range src.order {
			for _, sr := range cs.layers {
				if sr != nil {
					sr.finish()
				}
			}
		}
	}
	rep.Warnings = append(rep.Warnings, hostWarnings(s.srcs)...)
	if s.late > 0 {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("%d events came more than %d records out of time order: spacing and per-hop figures around them may be off", s.late, reorderWindow))
	}
	crossClock := false
	for _, src := range s.srcs {
		for _, cs := range src.order {
			c := cs.conn
			if onlyConn != 0 && c.ID != onlyConn {
				continue
			}
			cr := &ConnReport{Trace: src.path, Conn: c}
			d := cs.detail
			off := src.offset
			d.finish(shift(c.OpenNs, off), shift(c.CloseNs, off))
			if d.sbStarted {
				cr.SendBuffer = &d.sb
			}
			if d.tp.AppBytes > 0 || d.tp.WireBytes > 0 {
				cr.Throughput = &d.tp
			}
			if d.tcp.Snapshots > 0 || d.tcp.RetransSegs > 0 || d.tcp.RetransEvents > 0 || d.tcp.haveKernelRetrans || d.tcp.DataBytes > 0 {
				cr.TCP = &d.tcp
			}
			if len(d.drops) > 0 {
				cr.Drops = d.drops
				cr.DropClasses = classifyDrops(d.drops)
			}
			if !cs.notTCP {
				cr.Hops, cr.Receive = cs.hops.finish(withSched[src.index])
				if cr.TCP != nil {
					cr.TCP.localDrops(cs.hops.dropBytes, cs.hops.droppedOut)
				}
			}
			if cs.path != nil {
				cr.Path = cs.path.report()
				if cr.Path != nil && !cr.Path.SameClock {
					crossClock = true
				}
			}
			for li, sr := range cs.layers {
				if sr != nil {
					sr.st.LostNear = s.lostBy[Layers[li]]
					cr.Layers = append(cr.Layers, sr.st)
				}
			}
			if !cs.notTCP {
				cr.Verdict = cs.verdict.finish(src.dec.snap.ok, d.tcp.RetransSegs)
			}
			if len(cr.Layers) > 0 {
				rep.Conns = append(rep.Conns, cr)
			}
		}
	}
	if crossClock {
		rep.Warnings = append(rep.Warnings, "traces of different machines were placed on one timeline by their wall clocks: one-way figures across them (the wire hop, end to end) are only as good as the machines' clock synchronisation (NTP: ~1 ms, PTP: ~1 µs)")
	}
	attachReceivers(rep.Conns)
	// Busiest connections first.
	sort.SliceStable(rep.Conns, func(i, j int) bool { return busiest(rep.Conns[i]) > busiest(rep.Conns[j]) })
	for li, sr := range host {
		if sr != nil {
			sr.st.LostNear = s.lostBy[Layers[li]]
			rep.Host = append(rep.Host, sr.st)
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
	return rep, err
}

// routeSched hands a scheduler event to the hop trackers of the connections
// its threads read (a loss, to every tracker following a reader).
func routeSched(e schedEvent, readers map[uint32][]*hopTracker, following []*hopTracker) {
	switch e.kind {
	case schedLoss:
		for _, ht := range following {
			ht.schedStep(e)
		}
	case schedWakeup:
		for _, ht := range readers[e.tid] {
			ht.schedStep(e)
		}
	case schedSwitch:
		for _, ht := range readers[e.tid] {
			ht.schedStep(e)
		}
		for _, ht := range readers[e.next] {
			if !ht.reads(e.tid) { // already has it
				ht.schedStep(e)
			}
		}
	}
}

// shift places a time of a trace's own clock on the common timeline; 0
// stays 0 (unknown).
func shift(t uint64, off int64) uint64 {
	if t == 0 {
		return 0
	}
	return uint64(max(int64(t)+off, 0))
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

// slowWakeUpNs is the idle wake-up above which a host's receive timestamps
// are worth a warning: hostcheck's DeepIdleLatencyUs, under the 12 µs gap
// of 1500-byte packets at 1 Gb/s.
const slowWakeUpNs = 10e3

// quietUs is a gap, in µs, long enough for a CPU to have gone idle
// between two events of a layer.
const quietUs = 1000

// hostWarnings says when a trace asks more of its host than the host can
// give: events closer together than the recording host's clock step, whose
// spacing is then the clock's, not the network's; and received data that
// came after quiet periods on a host whose idle CPUs are slow to wake (a VM
// guest that halts at once), whose first packet after each quiet period is
// then timestamped late by about that wake-up.
func hostWarnings(srcs []*source) []string {
	var out []string
	for _, src := range srcs {
		out = append(out, wakeWarning(src)...)
		if src.step <= 0 {
			continue
		}
		var min [numLayers]float64
		var seen [numLayers]bool
		for _, cs := range src.order {
			for li, sr := range cs.layers {
				if sr == nil || sr.st.gap.N == 0 {
					continue
				}
				if !seen[li] || sr.st.gap.Min < min[li] {
					min[li], seen[li] = sr.st.gap.Min, true
				}
			}
		}
		for li := range min {
			if seen[li] && min[li]*1e3 < src.step {
				out = append(out, fmt.Sprintf("%s: %s events as close as %.0f ns, below this host's clock step of %.0f ns: their spacing is the clock's, not the network's", src.path, Layers[li], min[li]*1e3, src.step))
			}
		}
	}
	sort.Strings(out)
	return out
}

// wakeWarning is hostWarnings' warning about slow wake-ups for src, if
// any: the receive layers whose events had quiet periods between them.
func wakeWarning(src *source) []string {
	if src.wake <= slowWakeUpNs {
		return nil
	}
	var layers []string
	longest := 0.0
	for li := int(kDevRecv - kSockSend); li < numLayers; li++ {
		quiet := 0.0
		for _, cs := range src.order {
			if sr := cs.layers[li]; sr != nil && sr.st.gap.N > 0 {
				quiet = max(quiet, sr.st.gap.Max)
			}
		}
		if quiet >= quietUs {
			layers = append(layers, Layers[li])
			longest = max(longest, quiet)
		}
	}
	if len(layers) == 0 {
		return nil
	}
	return []string{fmt.Sprintf("%s: %s events follow quiet periods (up to %.3g ms) on a host whose idle CPUs took %.0f µs to wake (magnet hostcheck): the first packet after each quiet period may be timestamped up to that late",
		src.path, strings.Join(layers, ", "), longest/1e3, src.wake/1e3)}
}

// warnings says what was wrong with the traces read: cut short, files
// of a chain missing, damage skipped.
func (s *stream) warnings() []string {
	var ws []string
	for _, src := range s.srcs {
		if cut, off := src.r.Truncated(); cut {
			ws = append(ws, fmt.Sprintf("%s was cut short at offset %d: figures cover what was recorded before", src.path, off))
		}
		for _, w := range src.r.Warnings() {
			ws = append(ws, src.path+": "+w)
		}
	}
	return ws
}
