// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"

	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// kind is an event type an analysis knows, whatever its id in a trace's
// dictionary: records are matched to kinds by name once per trace, so the
// per-event work is an array index, not a string comparison.
type kind uint8

const (
	kOther kind = iota
	kSockSend
	kTCPSend
	kTCPXmit
	kIPSend
	kDevQueue
	kDevXmit
	kDevRecv
	kIPRecv
	kTCPRcv
	kSockRecv
	kTCPState
	kTCPRetrans
	kDrop
	kConnOpen
	kConnClose
	kLost
	kTask
	kIface
	kSchedSwitch
	kSchedWakeup
	kSchedLoss // a lost record that lost sched events, placed at its first loss
	numKinds
)

var kindNames = [numKinds]string{
	kSockSend: "sock_send", kTCPSend: "tcp_send", kTCPXmit: "tcp_xmit", kIPSend: "ip_send",
	kDevQueue: "dev_queue", kDevXmit: "dev_xmit", kDevRecv: "dev_recv", kIPRecv: "ip_recv",
	kTCPRcv: "tcp_rcv", kSockRecv: "sock_recv", kTCPState: "tcp_state", kTCPRetrans: "tcp_retrans",
	kDrop: "drop", kConnOpen: "conn_open", kConnClose: "conn_close", kLost: "lost",
	kTask: "task", kIface: "iface", kSchedSwitch: "sched_switch", kSchedWakeup: "sched_wakeup",
}

// Layers are the events of the modulation table, in the order data passes
// them: down the sender's stack, then up the receiver's.
var Layers = []string{"sock_send", "tcp_send", "tcp_xmit", "ip_send", "dev_queue", "dev_xmit", "dev_recv", "ip_recv", "tcp_rcv", "sock_recv"}

// numLayers is len(Layers); the layer kinds are kSockSend … kSockRecv, in
// the same order.
const numLayers = int(kSockRecv-kSockSend) + 1

func (k kind) layer() (int, bool) {
	if k >= kSockSend && k <= kSockRecv {
		return int(k - kSockSend), true
	}
	return 0, false
}

// dataOnly marks layers where events without payload (pure ACKs, failed
// calls) are left out, so sizes and spacing describe the data.
func (k kind) dataOnly() bool {
	return k == kSockSend || k == kSockRecv || k == kTCPSend || k == kTCPXmit || k == kTCPRcv
}

var ne = binary.NativeEndian

// fld is a field's place in a record; size 0 when the trace lacks it.
type fld struct{ off, size int }

func (f fld) get(b []byte) uint64 {
	switch f.size {
	case 1:
		return uint64(b[f.off])
	case 2:
		return uint64(ne.Uint16(b[f.off:]))
	case 4:
		return uint64(ne.Uint32(b[f.off:]))
	case 8:
		return ne.Uint64(b[f.off:])
	}
	return 0
}

// ev is one record as the analyses see it: decoded once, with its time on
// the common timeline and its connection resolved.
type ev struct {
	t    uint64
	cs   *connState // nil: not attributed to a connection
	size int32
	tid  uint32
	// Per kind: tcp_xmit seq, gso_segs, retrans; tcp_rcv seq, ack, wnd
	// (and d = 1 when the trace has wnd); ip_*
	// ip_id, family; dev_* gso_segs, ip_id, family (0: not in the trace),
	// TCP seq; tcp_state cwnd, srtt_us, ssthresh,
	// snd_una, total_retrans; conn_close total_retrans, bytes_acked
	// (b<<32 | c); sched_switch next_tid, prev_state, pick_ns,
	// last_switch_ns; sched_wakeup
	// target_tid; a loss of sched events: how many, and when the last was
	// (b<<32 | c).
	a, b, c, d, e uint32
	cpu           uint16
	kind          kind
	flags         uint8
	src           uint16 // index of the trace
	// id is the record's place in its trace: how many records (metadata
	// included) the reader returned before it. Journeys name events by it.
	id uint64

	snap *tcpSnap // tcp_state: the windows (verdict.go)
}

// decoder turns one trace's records into evs.
type decoder struct {
	kinds [256]kind
	// fields read, by kind
	a, b, c, d, e [numKinds]fld
	// conn_close's bytes_acked, a u64 split into b and c
	bytesAcked fld
	snap       snapFields
	// noIP: the trace was recorded without the ip group, so its segments
	// go from TCP to the device and back with no IP layer between.
	noIP bool
}

// noIPLayer says whether a trace was recorded without the ip group. A
// trace that does not say which groups it has is taken to have them all,
// as before the ip group became opt-in.
func noIPLayer(h *trace.Header) bool {
	ev := h.Settings.Events
	if len(ev) == 0 {
		return false
	}
	for _, g := range ev {
		if g == "ip" || g == "all" || g == "ip_send" || g == "ip_recv" {
			return false
		}
	}
	return true
}

func newDecoder(h *trace.Header) *decoder {
	d := &decoder{snap: newSnapFields(h), noIP: noIPLayer(h)}
	byName := map[string]kind{}
	for k, n := range kindNames {
		if n != "" {
			byName[n] = kind(k)
		}
	}
	want := map[kind][5]string{
		kTCPXmit: {"seq", "gso_segs", "retrans"}, kTCPRcv: {"seq", "ack", "wnd"},
		kIPSend: {"ip_id", "family"}, kIPRecv: {"ip_id", "family"},
		kDevQueue: {"gso_segs", "ip_id", "family", "seq"}, kDevXmit: {"gso_segs", "ip_id", "family", "seq"},
		kDevRecv:  {"gso_segs", "ip_id", "family", "seq"},
		kTCPState: {"cwnd", "srtt_us", "ssthresh", "snd_una", "total_retrans"}, kTCPRetrans: {"seq"},
		kConnClose:   {"total_retrans"},
		kSchedSwitch: {"next_tid", "prev_state", "pick_ns", "last_switch_ns"}, kSchedWakeup: {"target_tid"},
	}
	for i := range h.Types {
		t := &h.Types[i]
		k := byName[t.Name]
		d.kinds[t.ID] = k
		if k == kConnClose {
			if f, ok := t.Field("bytes_acked"); ok && f.Kind == trace.KindUint {
				d.bytesAcked = fld{f.Offset, f.Size}
			}
		}
		for j, name := range want[k] {
			if name == "" {
				continue
			}
			f, ok := t.Field(name)
			if !ok || f.Kind != trace.KindUint {
				continue
			}
			[]*[numKinds]fld{&d.a, &d.b, &d.c, &d.d, &d.e}[j][k] = fld{f.Offset, f.Size}
		}
	}
	return d
}

// connState is one end of a connection in one trace, with what each
// analysis keeps about it.
type connState struct {
	src  *source
	id   uint64
	conn *export.Conn
	// notTCP: announced as another protocol (UDP); hops are TCP's.
	notTCP bool
	peer   *connState

	detail *connDetail
	hops   *hopTracker
	layers [numLayers]*series
	plot   *connSeries
	// path: segments this end sent, followed to the peer's application.
	path    *pathStats
	verdict *verdictTracker
	pf      *perfettoConn // the Perfetto export's counters
}

// source is one trace being read.
type source struct {
	index  int
	path   string
	r      *trace.Reader
	h      *trace.Header
	dec    *decoder
	rs     *export.Resolver
	offset int64
	conns  map[uint64]*connState
	order  []*connState
	recent *connState // the connection of the previous record
	head   ev
	ok     bool
	step   float64 // the recording host's clock step, ns (0: unknown)
	wake   float64 // how long its idle CPUs took to wake, ns (0: unknown)
	// first and last record times, on the trace's own clock
	first, last uint64
	seen        bool
	nrec        uint64 // records read so far
	// lost records' fields that place a loss of sched events
	nSwitch, nWakeup, firstNs, lastNs trace.Field
}

// stream reads traces merged on one timeline, in time order: each trace in
// file order, which the recorder leaves slightly out of time order across
// CPUs, merged with the others by time, and re-sorted through a window of
// reorderWindow records. Records that need no time order (connection
// lifecycle, metadata, losses, drops) are taken as they are read.
type stream struct {
	srcs  []*source
	tl    *export.Timeline
	peers *export.PeerIndex
	buf   reorder
	// late counts records that came more than the window out of order.
	late uint64
	// newConn, if set, is called for every connection end first seen.
	newConn func(cs *connState)
	// onEvent is called for every record, in time order.
	onEvent func(e *ev)
	// onOther, if set, is called with every record of no kind the stream
	// knows (kernel events chosen at run time), in file order, with its place
	// in its trace.
	onOther func(src int, id uint64, rec trace.Record)

	lost   uint64
	lostBy map[string]uint64
	drops  map[string]uint64
}

// openStream opens the traces (files, or chains of a rotated recording's
// files). The caller must call close.
func openStream(ins []trace.Source) (*stream, error) {
	s := &stream{lostBy: map[string]uint64{}, drops: map[string]uint64{}}
	var hs []*trace.Header
	var names []string
	for i, in := range ins {
		r, err := in.Open()
		if err != nil {
			s.close()
			return nil, err
		}
		h := r.Header()
		src := &source{index: i, path: in.Name, r: r, h: h, dec: newDecoder(h), rs: export.NewResolver(h),
			conns: map[uint64]*connState{}, step: h.HostLimit("clock_step_ns"), wake: h.HostLimit("idle_wakeup_ns")}
		if lt := h.TypeByName("lost"); lt != nil {
			src.nSwitch, _ = lt.Field("n_sched_switch")
			src.nWakeup, _ = lt.Field("n_sched_wakeup")
			src.firstNs, _ = lt.Field("first_ns")
			src.lastNs, _ = lt.Field("last_ns")
		}
		s.srcs = append(s.srcs, src)
		hs = append(hs, h)
		names = append(names, filepath.Base(in.Name))
	}
	s.tl = export.NewTimeline(hs)
	for i, src := range s.srcs {
		src.offset = s.tl.Offsets[i]
	}
	s.peers = export.NewPeerIndex(names)
	return s, nil
}

func (s *stream) close() {
	for _, src := range s.srcs {
		src.r.Close()
	}
}

// run reads every trace to its end, calling onEvent in time order. The
// error, if any, names the trace; what was read before it was passed on.
func (s *stream) run() error {
	var err error
	for _, src := range s.srcs {
		if e := s.advance(src); e != nil && err == nil {
			err = e
		}
	}
	for err == nil {
		var next *source
		for _, src := range s.srcs {
			if src.ok && (next == nil || src.head.t < next.head.t) {
				next = src
			}
		}
		if next == nil {
			break
		}
		s.push(next.head)
		err = s.advance(next)
	}
	for s.buf.n > 0 {
		s.emitFront()
	}
	for _, src := range s.srcs {
		var cs []*export.Conn
		for _, c := range src.order {
			cs = append(cs, c.conn)
		}
		export.PairConns(cs) // what is left: unconnected UDP servers
	}
	return err
}

func (s *stream) push(e ev) {
	if last, ok := s.buf.lastOut(); ok && e.t < last {
		s.late++ // too late to sort: analyses see it out of order
	}
	s.buf.insert(e)
	if s.buf.n > reorderWindow {
		s.emitFront()
	}
}

// emitFront passes the earliest record held on, in place, and drops it.
func (s *stream) emitFront() {
	s.onEvent(s.buf.at(0))
	s.buf.dropFront()
}

// advance reads src's next record that goes through the time order into
// src.head, taking every record before it on the way.
func (s *stream) advance(src *source) error {
	src.ok = false
	for {
		rec, err := src.r.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", src.path, err)
		}
		id := src.nrec
		src.nrec++
		t := rec.Time()
		if !src.seen || t < src.first {
			src.first, src.seen = t, true
		}
		src.last = max(src.last, t)
		k := src.dec.kinds[rec.Data[30]]
		switch k {
		case kTask, kIface:
			src.rs.Observe(rec)
			continue
		case kLost:
			s.takeLost(rec)
			if e, ok := src.schedLoss(rec); ok {
				src.head, src.ok = e, true
				return nil
			}
			continue
		}
		var cs *connState
		if conn := rec.Conn(); conn != 0 {
			cs = src.connOf(s, conn, t)
			switch k {
			case kConnOpen, kConnClose, kSockSend, kSockRecv:
				cs.conn.Observe(src.rs, rec)
				if k == kConnOpen {
					s.opened(cs)
					if isAccepted(rec) {
						cs.accepted()
					}
				}
			default:
				cs.conn.Events++ // all Observe does for the others
			}
		}
		switch k {
		case kConnOpen:
			continue
		case kConnClose:
			if cs == nil || cs.notTCP {
				continue
			}
			// On in time order: what the kernel counted for the whole
			// connection, ACKs after the application's close included.
		case kDrop:
			s.takeDrop(src, cs, rec)
			if cs == nil || cs.notTCP {
				continue
			}
			// On in time order too: a packet dropped on its way down
			// never reaches the next layer, which the hops must know.
		case kOther:
			if s.onOther != nil {
				s.onOther(src.index, id, rec)
			}
			continue
		}
		d := src.dec
		b := rec.Data
		ct := int64(t) + src.offset
		if ct < 0 {
			ct = 0
		}
		src.head = ev{t: uint64(ct), cs: cs, size: rec.Size(), tid: rec.TID(), kind: k, flags: b[31], cpu: ne.Uint16(b[28:]),
			a: uint32(d.a[k].get(b)), b: uint32(d.b[k].get(b)), c: uint32(d.c[k].get(b)),
			d: uint32(d.d[k].get(b)), e: uint32(d.e[k].get(b)), src: uint16(src.index), id: id}
		if k == kTCPState && cs != nil {
			src.head.snap = d.snap.read(b)
		}
		if k == kTCPRcv && d.c[k].size > 0 {
			src.head.d = 1
		}
		if k == kConnClose {
			n := d.bytesAcked.get(b)
			src.head.b, src.head.c = uint32(n>>32), uint32(n)
		}
		src.ok = true
		return nil
	}
}

// schedLoss reads a lost record as a loss of sched events, if it lost
// any: placed at the time of the first event it lost, so that whatever came
// after is known to be uncertain when it is reached in time order.
func (src *source) schedLoss(rec trace.Record) (ev, bool) {
	sw, _ := rec.FieldUint(src.nSwitch)
	wk, _ := rec.FieldUint(src.nWakeup)
	if sw+wk == 0 {
		return ev{}, false
	}
	t := rec.Time()
	if first, _ := rec.FieldUint(src.firstNs); first > 0 && first <= t {
		t = first
	}
	last, _ := rec.FieldUint(src.lastNs)
	end := uint64(max(int64(max(last, t))+src.offset, 0))
	return ev{t: uint64(max(int64(t)+src.offset, 0)), kind: kSchedLoss, cpu: rec.CPU(), a: uint32(sw + wk),
		b: uint32(end >> 32), c: uint32(end), src: uint16(src.index)}, true
}

// schedOf is a sched event (or a loss of some) for the sched tracker.
func schedOf(e *ev) (schedEvent, bool) {
	se := schedEvent{t: e.t, cpu: e.cpu, tid: e.tid}
	switch e.kind {
	case kSchedSwitch:
		se.kind, se.next, se.prevState = schedSwitch, e.a, e.b
		se.pick, se.lastSwitch = e.c, e.d
	case kSchedWakeup:
		se.kind, se.tid = schedWakeup, e.a
	case kSchedLoss:
		se.kind, se.next, se.end = schedLoss, e.a, uint64(e.b)<<32|uint64(e.c)
	default:
		return se, false
	}
	return se, true
}

func (src *source) connOf(s *stream, id, t uint64) *connState {
	if src.recent != nil && src.recent.id == id {
		return src.recent
	}
	cs := src.conns[id]
	if cs == nil {
		cs = &connState{src: src, id: id, conn: &export.Conn{ID: id, OpenNs: t}}
		src.conns[id] = cs
		src.order = append(src.order, cs)
		if s.newConn != nil {
			s.newConn(cs)
		}
	}
	src.recent = cs
	return cs
}

// isAccepted says whether conn_open rec announces a TCP connection first
// seen as its handshake completed: an accepted one (its state then still
// reads SYN_RECV, see docs/EVENTS.md).
func isAccepted(rec trace.Record) bool {
	const tcpSynRecv = 3
	proto, _ := rec.Uint("proto")
	state, _ := rec.Uint("state")
	return proto == 6 && state == tcpSynRecv && rec.Flags()&export.ConnUpdate == 0
}

// accepted tells the connection's send-buffer trackers that it is an
// accepted one (sendbuf.Tracker.Accepted).
func (cs *connState) accepted() {
	// A plot of two traces builds its ends without a detail (nor tracker).
	if cs.detail != nil {
		cs.detail.sbuf.Accepted()
	}
	if cs.plot != nil && cs.plot.detail != nil {
		cs.plot.detail.sbuf.Accepted()
	}
}

// opened pairs a connection end with its peer once its addresses are known.
func (s *stream) opened(cs *connState) {
	if cs.conn.Proto != "tcp" && cs.conn.Proto != "" {
		cs.notTCP = true
	}
	ps, pc := s.peers.Add(cs.src.index, cs.conn)
	if pc == nil {
		return
	}
	peer := s.srcs[ps].conns[pc.ID]
	if peer == nil {
		return
	}
	cs.peer, peer.peer = peer, cs
	if !cs.notTCP && !peer.notTCP {
		cs.path = newPathStats(cs, s.tl.SameClock(cs.src.index, peer.src.index))
		peer.path = newPathStats(peer, cs.path.sameClock)
	}
}

func (s *stream) takeLost(rec trace.Record) {
	for _, f := range rec.Type.Fields {
		if len(f.Name) > 2 && f.Name[:2] == "n_" {
			if n, ok := rec.Uint(f.Name); ok && n > 0 {
				s.lostBy[f.Name[2:]] += n
				s.lost += n
			}
		}
	}
}

func (s *stream) takeDrop(src *source, cs *connState, rec trace.Record) {
	f, _ := rec.Type.Field("reason")
	v, _ := rec.Uint("reason")
	reason, ok := src.h.EnumName(f, v)
	if !ok {
		reason = "reason " + strconv.FormatUint(v, 10)
	}
	s.drops[reason]++
	if cs != nil && cs.detail != nil {
		cs.detail.drops[reason]++
	}
}

// reorderWindow is how many records the stream holds back to put them in
// time order: the recorder writes rings in drain order, so events of
// different CPUs can be slightly out of time order.
const reorderWindow = 1024

// reorder is a ring of records sorted by time. Records come nearly sorted,
// so inserting one costs a comparison or two.
type reorder struct {
	ring    [2 * reorderWindow]ev // a power of two above the window
	head, n int
	last    uint64
	anyOut  bool
}

func (r *reorder) at(i int) *ev { return &r.ring[(r.head+i)&(len(r.ring)-1)] }

func (r *reorder) insert(e ev) {
	i := r.n
	for i > 0 && r.at(i-1).t > e.t {
		*r.at(i) = *r.at(i - 1)
		i--
	}
	*r.at(i) = e
	r.n++
}

// dropFront drops the earliest record held, at(0), once it was used.
func (r *reorder) dropFront() {
	r.last, r.anyOut = r.at(0).t, true
	r.head = (r.head + 1) & (len(r.ring) - 1)
	r.n--
}

func (r *reorder) lastOut() (uint64, bool) { return r.last, r.anyOut }
