// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/filter"
	"github.com/magnet-tracer/magnet/internal/kevent"
	"github.com/magnet-tracer/magnet/internal/live"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/sendbuf"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// batchBytes is how much the recorder hands over at once; the recorder
// also hands over what it has at every flush (each round of its loop).
const batchBytes = 256 << 10

// batch is a run of raw records, in drain order, and the time up to which
// the recorder had written every record when it handed them over.
type batch struct {
	buf        []byte
	completeNs uint64
	// pending counts the batch's records the hub keeps back; handed is
	// set while the hub has the batch, kept while it keeps records of it.
	pending      int
	handed, kept bool
}

// monotonicNs reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns.
func monotonicNs() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// task is what the recorder's task records say about a thread.
type task struct {
	pid  uint32
	uid  int64 // real uid; -1 unknown (a trace without uids)
	comm string
}

// recorderLoss is one `lost` record: events a kernel ring could not take.
type recorderLoss struct {
	count   uint64
	byType  map[string]uint64
	cpu     int
	firstNs uint64
	lastNs  uint64
}

// hub takes the recorder's records, keeps the connection table and hands
// each event to the subscriptions that want it. One goroutine (run) does
// all of it; the mutex lets the API read the table between batches.
type hub struct {
	batches   chan *batch
	free      chan *batch
	done      chan struct{}
	closeOnce sync.Once

	mu          sync.Mutex
	hdr         *trace.Header
	types       [256]*trace.EventType
	codecs      [256]*typeCodec
	xmitSeq     *fieldCodec // tcp_xmit's seq, tcp_rcv's ack: read for every segment
	rcvAck      *fieldCodec
	dropReason  *fieldCodec
	named       [256]map[string]*fieldCodec // fieldsOf's, once a type's first record comes
	lastTID     uint32                      // h.tasks[lastTID] is lastTask (tid 0: none)
	lastTask    task
	wallOff     int64
	tasks       map[uint32]task
	table       *live.Table
	self        map[uint64]uint64 // the daemon's own TCP connections → when they closed (0: open)
	nowNs       uint64            // events up to here are processed
	order       reorder           // records kept back until the recorder wrote every older one
	keptBatches int               // batches order keeps records of
	held        []heldEvent       // events kept back for clients that do not see all
	lastExp     uint64
	counts      [256]uint64
	events      uint64
	lost        uint64
	lostBy      map[string]uint64
	selfPID     uint32
	selfNS      uint32
	listen      netip.AddrPort // the TCP listener, to recognise its traffic
	recorded    atomic.Bool    // a header arrived: the recorder runs

	subs    atomic.Pointer[subSet]
	enabled atomic.Uint32 // event.Group enabled in BPF
}

func newHub(table *live.Table) *hub {
	h := &hub{
		batches: make(chan *batch, 4),
		free:    make(chan *batch, 8),
		done:    make(chan struct{}),
		tasks:   map[uint32]task{},
		table:   table,
		self:    map[uint64]uint64{},
		lostBy:  map[string]uint64{},
		selfPID: uint32(os.Getpid()),
	}
	h.subs.Store(&subSet{})
	var st unix.Stat_t
	if unix.Stat("/proc/self/ns/net", &st) == nil {
		h.selfNS = uint32(st.Ino)
	}
	return h
}

// groupOf is each event type's group (0 for an unknown type).
var groupOf = func() (g [256]event.Group) {
	for _, in := range event.Catalogue {
		g[in.Type] = in.Group
	}
	return g
}()

// sink is the record.Sink the daemon gives the recorder.
type sink struct {
	h     *hub
	cur   *batch
	bytes int64
	// complete is the recorder's last record.DrainedSink time: until it
	// says, nothing is complete (the records it writes before its first
	// pass, of the sockets it learned at start, wait for that pass).
	complete uint64
}

// Drained is record.DrainedSink: the recorder wrote every record up to
// completeNs.
func (s *sink) Drained(completeNs uint64) {
	s.complete = completeNs
}

// newSink is record.Config.NewSink: it learns the recording's dictionary.
func (h *hub) newSink(hdr *trace.Header) (record.Sink, error) {
	h.mu.Lock()
	h.hdr = hdr
	enums := enumTables(hdr)
	for i := range hdr.Types {
		et := &hdr.Types[i]
		h.types[et.ID] = et
		h.codecs[et.ID] = newTypeCodec(et, enums)
	}
	kernel := map[string]event.Type{}
	for _, et := range hdr.Types {
		if et.ID >= kevent.FirstID {
			kernel[et.Name] = event.Type(et.ID)
		}
	}
	kernelTypes.Store(&kernel)
	fields := map[string]bool{}
	for _, et := range hdr.Types {
		for _, f := range et.Fields {
			fields[f.Name] = true
		}
	}
	eventFields.Store(&fields)
	h.xmitSeq, h.rcvAck = h.codecs[event.TCPXmit].field("seq"), h.codecs[event.TCPRcv].field("ack")
	h.dropReason, h.named = h.codecs[event.Drop].field("reason"), [256]map[string]*fieldCodec{}
	h.wallOff = hdr.Clock.WallOffsetNs
	h.mu.Unlock()
	h.recorded.Store(true)
	return &sink{h: h, cur: &batch{buf: make([]byte, 0, batchBytes)}}, nil
}

func (s *sink) Write(rec []byte) error {
	if len(s.cur.buf)+len(rec) > cap(s.cur.buf) {
		s.handOff()
	}
	s.cur.buf = append(s.cur.buf, rec...)
	s.bytes += int64(len(rec))
	return nil
}

// Flush hands over what the recorder drained so far, even nothing: the
// time still advances.
func (s *sink) Flush() error {
	s.handOff()
	return nil
}

func (s *sink) Close(*trace.Summary) error {
	s.handOff()
	s.h.finish()
	return nil
}

// finish ends the hub once the recorder is done (or failed), after it has
// processed every batch.
func (h *hub) finish() {
	h.closeOnce.Do(func() { close(h.batches) })
	<-h.done
}

func (s *sink) Bytes() int64 { return s.bytes }

// handOff passes the batch to the hub. It blocks when the hub is behind, so
// that the kernel ring, whose losses are counted exactly, absorbs the
// backlog.
func (s *sink) handOff() {
	s.cur.completeNs = s.complete
	s.cur.handed = true
	s.h.batches <- s.cur
	select {
	case s.cur = <-s.h.free:
	default:
		s.cur = &batch{buf: make([]byte, 0, batchBytes)}
	}
}

// run processes batches until the recorder closes the channel.
func (h *hub) run() {
	defer close(h.done)
	for b := range h.batches {
		h.mu.Lock()
		h.add(b)
		if b.completeNs > reorderSlack {
			h.release(b.completeNs - reorderSlack)
			h.nowNs = max(h.nowNs, b.completeNs-reorderSlack)
		}
		if h.nowNs-h.lastExp > uint64(time.Second) {
			h.table.Expire(h.nowNs)
			for id, closed := range h.self {
				if closed != 0 && h.nowNs-closed > uint64(2*time.Minute) {
					delete(h.self, id)
				}
			}
			h.lastExp = h.nowNs
		}
		h.mu.Unlock()
	}
	// The recording ended: everything it wrote is complete.
	h.mu.Lock()
	h.release(^uint64(0))
	h.releaseHeld(^uint64(0), false)
	h.mu.Unlock()
}

func (h *hub) badRecord(buf []byte) {
	fmt.Fprintf(os.Stderr, "magnet daemon: record of unknown type %d or size; %d bytes skipped\n", buf[30], len(buf))
}

// kernelTypes names the kernel events chosen at start (a daemon has one
// recording), for subscriptions that ask for them by name.
var kernelTypes atomic.Pointer[map[string]event.Type]

// eventFields holds the names of every field of the recording's events
// (its dictionary, kernel events included), so that an expression naming
// a field no event has is refused rather than matching nothing.
var eventFields atomic.Pointer[map[string]bool]

// hasField reports whether an event of the recording has the field; before
// the recording's dictionary is known, any name passes.
func hasField(name string) bool {
	m := eventFields.Load()
	return m == nil || (*m)[name]
}

func kernelType(name string) (event.Type, bool) {
	m := kernelTypes.Load()
	if m == nil {
		return 0, false
	}
	t, ok := (*m)[name]
	return t, ok
}

// record takes one record: metadata, the connection table, then the
// subscriptions.
func (h *hub) record(rec trace.Record) {
	typ := event.Type(rec.TypeID())
	switch typ {
	case event.Task:
		pid, _ := rec.Uint("pid")
		comm, _ := rec.Str("comm")
		uid := int64(-1)
		if u, ok := rec.Uint("uid"); ok {
			uid = int64(u)
		}
		h.tasks[rec.TID()] = task{uint32(pid), uid, comm}
		h.lastTID = 0
		return
	case event.Iface:
		return
	case event.Lost, kevent.LostID:
		h.recorderLost(rec)
		return
	}
	// Events of a group not enabled (still in the ring after it was
	// switched off, or from the moment between loading and enabling) are
	// not the daemon's to show. Kernel events chosen at start are always
	// enabled.
	if typ < kevent.FirstID && groupOf[typ]&event.Group(h.enabled.Load()) == 0 {
		return
	}
	conn := rec.Conn()
	if _, self := h.self[conn]; self && conn != 0 {
		// Kept after the close: late ACKs and TIME_WAIT still carry it.
		if typ == event.ConnClose {
			h.self[conn] = rec.Time()
		}
		return
	}
	t := rec.Time()
	tid := rec.TID()
	tk := h.task(tid)
	if typ >= event.SchedSwitch && typ <= event.SchedExit && tk.pid == h.selfPID {
		return
	}
	h.events++
	h.counts[typ]++
	var c *live.Conn
	if conn != 0 {
		if typ == event.ConnOpen {
			info := connInfo(rec)
			if h.isSelf(info) {
				h.self[conn] = 0
				return
			}
			c = h.table.Open(conn, t, info)
		} else {
			c = h.table.Track(conn, t)
			if typ != event.ConnClose {
				c.Events++
			}
		}
		h.compute(c, typ, rec, tk)
	}
	h.dispatch(typ, rec, tk, c)
	if typ == event.ConnClose && c != nil {
		h.table.Close(conn, t)
	}
}

func (h *hub) task(tid uint32) task {
	if tid == 0 {
		return task{0, 0, "swapper"}
	}
	// Events come in runs from one thread: remember the last one.
	if tid == h.lastTID {
		return h.lastTask
	}
	if t, ok := h.tasks[tid]; ok {
		h.lastTID, h.lastTask = tid, t
		return t
	}
	return task{0, -1, ""}
}

func connInfo(rec trace.Record) live.Info {
	fam, _ := rec.Uint("family")
	proto, _ := rec.Uint("proto")
	la, _ := rec.Addr("laddr", fam != 6)
	ra, _ := rec.Addr("raddr", fam != 6)
	lp, _ := rec.Uint("lport")
	rp, _ := rec.Uint("rport")
	state, _ := rec.Uint("state")
	const tcpSynRecv = 3 // an accepted child's state when first seen
	return live.Info{Proto: uint8(proto), Local: netip.AddrPortFrom(la, uint16(lp)), Remote: netip.AddrPortFrom(ra, uint16(rp)), NetNS: rec.NetNS(),
		Accepted: proto == 6 && state == tcpSynRecv}
}

// isSelf recognises both ends of a connection to the daemon's TCP
// listener: its traffic would otherwise feed its own streams.
func (h *hub) isSelf(info live.Info) bool {
	if !h.listen.IsValid() || info.NetNS != h.selfNS || info.Proto != 6 {
		return false
	}
	port := h.listen.Port()
	match := func(ap netip.AddrPort) bool {
		return ap.Port() == port && (h.listen.Addr().IsUnspecified() || ap.Addr().Unmap() == h.listen.Addr().Unmap())
	}
	return match(info.Local) || match(info.Remote)
}

// compute feeds the connection's figures.
func (h *hub) compute(c *live.Conn, typ event.Type, rec trace.Record, tk task) {
	t, size := rec.Time(), int64(rec.Size())
	switch typ {
	case event.ConnOpen:
		// A conn_open that names a task was made in a system call of the
		// socket's user (connect, listen, bind), or names the process the
		// recorder found holding the socket: that is its owner from the
		// start, so that its user gets the connection's first events.
		if c.Owner == nil && rec.TID() != 0 && tk.pid != 0 {
			c.Owner = &live.Owner{PID: tk.pid, Comm: tk.comm, UID: tk.uid}
		}
	case event.SockSend, event.SockRecv, event.TCPSend:
		if c.Owner == nil && rec.TID() != 0 {
			// Socket calls run in the calling process: it owns the socket.
			c.Owner = &live.Owner{PID: tk.pid, Comm: tk.comm, UID: tk.uid}
		}
		switch typ {
		case event.SockSend:
			c.Traffic(live.App, live.Send, t, size)
		case event.SockRecv:
			c.Traffic(live.App, live.Recv, t, size)
		}
	case event.TCPXmit:
		c.Traffic(live.TCP, live.Send, t, size)
		if h.xmitSeq != nil {
			c.Segment(uint32(h.xmitSeq.uint(rec.Data)), size, rec.Flags()&0x02 != 0)
		}
	case event.TCPRcv:
		c.Traffic(live.TCP, live.Recv, t, size)
		if sendbuf.Acknowledges(rec.Flags()) && h.rcvAck != nil {
			c.Ack(uint32(h.rcvAck.uint(rec.Data)))
		}
	case event.DevXmit:
		c.Traffic(live.Wire, live.Send, t, size)
	case event.DevRecv:
		c.Traffic(live.Wire, live.Recv, t, size)
	case event.TCPRetrans:
		c.Retransmit(t, size)
	case event.Drop:
		c.Drop(t, h.dropReason.enumName(rec.Data))
	case event.TCPState:
		c.State(h.tcpState(t, rec.Data))
	case event.ConnSummary:
		c.Summarized(t, h.summaryOf(rec.Data))
	case event.TCPRate:
		f := h.fieldsOf(event.TCPRate)
		u := func(name string) uint32 { return uint32(f[name].uint(rec.Data)) }
		c.Sampled(live.RateSample{
			TimeNs: t, AckNs: f["ack_ns"].uint(rec.Data), Delivered: u("delivered"), Lost: u("lost"), MSS: u("mss"),
			RateDelivered: u("rate_delivered"), IntervalUs: u("rate_interval_us"),
			AppLimited: u("app_limited") == 1, Repeat: rec.Flags()&1 != 0,
		})
	}
}

// summaryOf reads a conn_summary record as the events it counts would
// have fed the connection: sock_* at the application layer, tcp_xmit and
// tcp_rcv at TCP's, dev_xmit and dev_recv on the wire.
func (h *hub) summaryOf(data []byte) live.Summary {
	f := h.fieldsOf(event.ConnSummary)
	u := func(name string) uint64 { return f[name].uint(data) }
	var s live.Summary
	for _, x := range []struct {
		l            live.Layer
		d            live.Dir
		bytes, count string
	}{
		{live.App, live.Send, "sock_send_bytes", "sock_send_calls"},
		{live.App, live.Recv, "sock_recv_bytes", "sock_recv_calls"},
		{live.TCP, live.Send, "tcp_xmit_bytes", "tcp_xmit_skbs"},
		{live.TCP, live.Recv, "tcp_rcv_bytes", "tcp_rcv_skbs"},
		{live.Wire, live.Send, "dev_xmit_bytes", "dev_xmit_skbs"},
		{live.Wire, live.Recv, "dev_recv_bytes", "dev_recv_skbs"},
	} {
		s.Bytes[x.l][x.d], s.Events[x.l][x.d] = int64(u(x.bytes)), u(x.count)
	}
	s.RetransSegs, s.RetransBytes = u("retrans_segs"), int64(u("retrans_bytes"))
	s.Drops = u("drop_packets")
	return s
}

// enumName is an enum field's name in the recording, or its number.
func (fc *fieldCodec) enumName(data []byte) string {
	if fc == nil {
		return ""
	}
	v := fc.uint(data)
	if name, ok := fc.enum[v]; ok {
		return name
	}
	return strconv.FormatUint(v, 10)
}

// fieldsOf is the fields of a type by name, resolved once per recording
// (a field the recording lacks is nil, which reads as 0).
func (h *hub) fieldsOf(typ event.Type) map[string]*fieldCodec {
	if m := h.named[typ]; m != nil {
		return m
	}
	m := map[string]*fieldCodec{}
	if c := h.codecs[typ]; c != nil {
		for i := range c.fields {
			m[c.fields[i].name] = &c.fields[i]
		}
	}
	h.named[typ] = m
	return m
}

// tcpState reads a tcp_state record through fields resolved once.
func (h *hub) tcpState(t uint64, data []byte) live.TCPSample {
	f := h.fieldsOf(event.TCPState)
	u := func(name string) uint32 { return uint32(f[name].uint(data)) }
	return live.TCPSample{
		TimeNs: t, State: f["state"].enumName(data), CAState: f["ca_state"].enumName(data),
		Cwnd: u("cwnd"), Ssthresh: u("ssthresh"), SrttUs: u("srtt_us"), MSS: u("mss"),
		SndWnd: u("snd_wnd"), RcvWnd: u("rcv_wnd"), PacketsOut: u("packets_out"), RetransOut: u("retrans_out"),
		TotalRetrans: u("total_retrans"), Delivered: u("delivered"), Lost: u("lost"),
		RateDelivered: u("rate_delivered"), RateIntervalUs: u("rate_interval_us"), AppLimited: u("rate_app_limited") == 1,
	}
}

func (h *hub) recorderLost(rec trace.Record) {
	total, _ := rec.Uint("total")
	l := recorderLoss{count: total, byType: map[string]uint64{}, cpu: int(rec.CPU())}
	l.firstNs, _ = rec.Uint("first_ns")
	l.lastNs, _ = rec.Uint("last_ns")
	for _, f := range rec.Type.Fields {
		if name, ok := strings.CutPrefix(f.Name, "n_"); ok {
			if n, _ := rec.Uint(f.Name); n > 0 {
				l.byType[name] += n
				h.lostBy[name] += n
			}
		}
	}
	h.lost += total
	for _, s := range h.subs.Load().all {
		s.recorderLost(l)
	}
}

// offer hands an event to every subscription of candidates that may see
// it and whose filter (but for its expression) matches: those that see all
// (seeAll), the others (users), or both.
func (h *hub) offer(candidates []*sub, typ event.Type, rec trace.Record, tk task, c *live.Conn, seeAll, users bool) {
	if len(candidates) == 0 {
		return
	}
	var fe filter.Event
	var ev *liveEvent
	var variants [4]*liveEvent // by masking
	for _, s := range candidates {
		if s.who.seesAll && !seeAll || !s.who.seesAll && !users {
			continue
		}
		// The connection's address tests first: most subscriptions of a
		// busy host want other connections, and this needs no Event.
		if c != nil {
			if !s.f.MatchConnKeys(c.Opened, c.Info.Proto, c.Info.Local, c.Info.Remote) {
				continue
			}
		} else if !s.f.MatchConnKeys(false, 0, netip.AddrPort{}, netip.AddrPort{}) {
			continue
		}
		if fe.Name == "" {
			fe = filter.Event{
				Type: typ, Name: rec.Type.Name, TimeNs: rec.Time(), CPU: rec.CPU(), TID: rec.TID(),
				PID: tk.pid, Comm: tk.comm, UID: tk.uid, NetNS: rec.NetNS(), Conn: rec.Conn(),
				Size: rec.Size(), Flags: rec.Flags(),
			}
			if c != nil {
				fe.HasConn, fe.Proto, fe.Local, fe.Remote = c.Opened, c.Info.Proto, c.Info.Local, c.Info.Remote
				if c.Owner != nil {
					fe.HasOwner, fe.OwnerPID, fe.OwnerUID, fe.OwnerComm = true, c.Owner.PID, c.Owner.UID, c.Owner.Comm
				}
			}
		}
		if !s.who.canSee(&fe) {
			continue
		}
		var m masking
		if !s.who.seesAll {
			m = h.masking(typ, &fe, rec, s.who.uid)
		}
		if m != 0 {
			if variants[m] == nil {
				variants[m] = h.masked(typ, rec, fe, m)
			}
			if mv := variants[m]; s.f.Match(&mv.fe) {
				s.offer(mv)
			}
			continue
		}
		if !s.f.Match(&fe) {
			continue
		}
		if ev == nil {
			ev = &liveEvent{raw: bytes.Clone(rec.Data), et: rec.Type, codec: h.codecs[typ], wallOff: h.wallOff, fe: fe}
			ev.fe.Fields = ev.fields
		}
		s.offer(ev)
	}
}

// masking says which tasks of an event a client may not see: a user sees
// the events of its own connections, but the task they ran in is whatever
// the CPU was running (a softirq interrupts anyone's process), and a
// scheduler event names a second task. Each is masked unless it is one of
// the user's.
type masking uint8

const (
	maskTask  masking = 1 << iota // the event's task: pid, tid, comm, uid
	maskOther                     // the other task of a scheduler event
)

// otherTask names the fields of the second task of scheduler events.
var otherTask = map[event.Type]struct {
	tid    string
	fields []string
}{
	event.SchedSwitch: {"next_tid", []string{"next_tid", "next_pid", "next_comm"}},
	event.SchedWakeup: {"target_tid", []string{"target_tid", "target_comm"}},
	event.SchedFork:   {"child_tid", []string{"child_tid", "child_pid", "child_comm"}},
}

func (h *hub) masking(typ event.Type, fe *filter.Event, rec trace.Record, uid uint32) masking {
	var m masking
	if fe.UID != int64(uid) {
		m |= maskTask
	}
	if o, ok := otherTask[typ]; ok {
		tid, _ := rec.Uint(o.tid)
		if h.task(uint32(tid)).uid != int64(uid) {
			m |= maskOther
		}
	}
	return m
}

// masked is the event as a client that may not see the tasks m names gets
// it, for its filter, expression and JSON: pid and tid 0, comm "", uid -1,
// and the second task's fields zero.
func (h *hub) masked(typ event.Type, rec trace.Record, fe filter.Event, m masking) *liveEvent {
	ev := &liveEvent{raw: bytes.Clone(rec.Data), et: rec.Type, codec: h.codecs[typ], wallOff: h.wallOff, fe: fe}
	if m&maskTask != 0 {
		ev.fe.PID, ev.fe.TID, ev.fe.Comm, ev.fe.UID = 0, 0, "", -1
	}
	if m&maskOther != 0 {
		for _, name := range otherTask[typ].fields {
			if f, ok := rec.Type.Field(name); ok {
				clear(ev.raw[f.Offset : f.Offset+f.Size])
			}
		}
	}
	ev.fe.Fields = ev.fields
	return ev
}

// liveEvent is one event on its way to subscriptions; it is shared by
// all of them and never changed. What they need of it beyond the filter's
// fields is computed once, by the first that asks: its fields as values
// (expressions) and its JSON (streams).
type liveEvent struct {
	raw     []byte
	et      *trace.EventType
	codec   *typeCodec
	wallOff int64
	fe      filter.Event
	once    sync.Once
	fmap    map[string]any
	encOnce sync.Once
	enc     []byte
	exprs   filter.ExprMemo
}

// fields decodes the event's own fields (for expressions): enums by name,
// addresses as text, bytes as hex.
func (ev *liveEvent) fields() map[string]any {
	ev.once.Do(func() {
		ev.fmap = make(map[string]any, len(ev.codec.fields))
		for i := range ev.codec.fields {
			ev.fmap[ev.codec.fields[i].name] = ev.codec.value(i, ev.raw)
		}
	})
	return ev.fmap
}

// json is the event as the API's Event object, encoded once for every
// stream that delivers it.
func (ev *liveEvent) json() []byte {
	ev.encOnce.Do(func() { ev.enc = appendEvent(make([]byte, 0, 256+16*len(ev.codec.fields)), ev) })
	return ev.enc
}

// status fills the recorder part of /v1/status.
func (h *hub) status() magnetclient.RecorderStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := magnetclient.RecorderStatus{Events: h.events, EventsByType: map[string]uint64{}, Lost: h.lost, LostByType: map[string]uint64{}, ProcessedNs: h.nowNs, OutOfOrder: h.order.late}
	for _, in := range event.Catalogue {
		if n := h.counts[in.Type]; n > 0 && in.Type != event.Task && in.Type != event.Iface && in.Type != event.Lost {
			st.EventsByType[in.Name] = n
		}
	}
	for k, v := range h.lostBy {
		st.LostByType[k] = v
	}
	return st
}
