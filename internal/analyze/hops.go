// SPDX-License-Identifier: Apache-2.0

package analyze

import "math"

// The hops a TCP segment takes, down the sender's stack, over the wire and
// up the receiver's, in order. A device whose tx queue has no qdisc
// (noqueue: veth, lo) writes no dev_queue: its segments take ip_send→dev_xmit
// instead of ip_send→dev_queue and dev_queue→dev_xmit. A trace without the
// ip group (the default: the device events carry the IP facts) has no IP
// layer: its segments take tcp_xmit→dev_queue or tcp_xmit→dev_xmit down and
// dev_recv→tcp_rcv up.
const (
	hopXmitIP    = iota // tcp_xmit→ip_send
	hopIPQueue          // ip_send→dev_queue
	hopXmitQueue        // tcp_xmit→dev_queue: no IP layer recorded
	hopQueueXmit        // dev_queue→dev_xmit
	hopIPXmit           // ip_send→dev_xmit: no qdisc on the way
	hopXmitDev          // tcp_xmit→dev_xmit: no IP layer recorded, no qdisc
	hopWire             // dev_xmit→dev_recv: from one end's device to the other's
	hopRecvIP           // dev_recv→ip_recv
	hopIPTCP            // ip_recv→tcp_rcv
	hopRecvTCP          // dev_recv→tcp_rcv: no IP layer recorded
	hopTCPSock          // tcp_rcv→sock_recv
	numHops
)

var hopNames = [numHops]string{
	"tcp_xmit→ip_send", "ip_send→dev_queue", "tcp_xmit→dev_queue", "dev_queue→dev_xmit", "ip_send→dev_xmit",
	"tcp_xmit→dev_xmit", "dev_xmit→dev_recv",
	"dev_recv→ip_recv", "ip_recv→tcp_rcv", "dev_recv→tcp_rcv", "tcp_rcv→sock_recv",
}

// hopSpan is, for each hop, the layers it goes from and to, as indexes of
// a path's times (pathSeg.times).
var hopSpan = [numHops][2]int{{0, 1}, {1, 2}, {0, 2}, {2, 3}, {1, 3}, {0, 3}, {3, 4}, {4, 5}, {5, 6}, {4, 6}, {6, 7}}

// ipHop says which hops pass through the IP layer (true) and which skip it
// (false, a trace without it); the wire and the hops at both ends of the
// stack are in both.
var ipHop = [numHops]int8{1, 1, -1, 0, 1, -1, 0, 1, 1, -1, 0}

// WireHop is the hop from the sender's device to the receiver's, which a
// report shows when both ends of a connection are in its traces.
const WireHop = "dev_xmit→dev_recv"

// Hops are the steps a TCP segment takes inside one host, down the
// sender's stack and up the receiver's, in the order "where time goes"
// reports them.
var Hops = []string{
	"tcp_xmit→ip_send", "ip_send→dev_queue", "tcp_xmit→dev_queue", "dev_queue→dev_xmit", "ip_send→dev_xmit",
	"tcp_xmit→dev_xmit",
	"dev_recv→ip_recv", "ip_recv→tcp_rcv", "dev_recv→tcp_rcv", "tcp_rcv→sock_recv",
}

// PathHops are the steps of a segment from the sender's TCP to the
// receiver's application, the wire between the two ends included: a
// segment takes either ip_send→dev_queue and dev_queue→dev_xmit (its
// device has a qdisc) or ip_send→dev_xmit (it has none); without the IP
// layer, tcp_xmit→dev_queue or tcp_xmit→dev_xmit, and dev_recv→tcp_rcv.
var PathHops = hopNames[:]

// HopStats is the delay distribution of one hop, in microseconds.
type HopStats struct {
	Hop   string  `json:"hop"`
	Count uint64  `json:"count"`
	Delay Summary `json:"delay_us"`
	d     Dist
}

// TimeShare splits the receive path's time: of the delay from the device to
// the application, how much the data waited in the socket for the reader.
type TimeShare struct {
	ReceiveUs    float64 `json:"receive_us"`     // sum over segments, dev_recv to sock_recv
	SocketWaitUs float64 `json:"socket_wait_us"` // sum over segments, tcp_rcv to sock_recv
	SocketShare  float64 `json:"socket_share"`   // SocketWaitUs / ReceiveUs
	// Reader, when the trace has sched events, is where the reading thread
	// was while the data waited.
	Reader *ReaderWait `json:"reader,omitempty"`
}

// ReaderWait splits the socket wait (sum over segments, µs) by what the
// reading thread was doing, from the scheduler's events. The reader is the
// thread whose read took the data; the wait is followed only where its
// state was known: not before its first read of the connection, and not
// across a loss of sched events.
type ReaderWait struct {
	FollowedUs  float64 `json:"followed_us"`
	OnCPUUs     float64 `json:"on_cpu_us"`
	RunnableUs  float64 `json:"runnable_us"`    // off-CPU but ready to run: waiting for a CPU
	AsleepUs    float64 `json:"asleep_us"`      // off-CPU and blocked (sleeping, or waiting on something else)
	OffCPUShare float64 `json:"off_cpu_share"`  // (RunnableUs + AsleepUs) / FollowedUs
	Followed    float64 `json:"followed_share"` // FollowedUs / the socket wait
}

// Reader states, indexes of readerState.spent.
const (
	stateUnknown = iota
	stateOnCPU
	stateRunnable
	stateAsleep
	nStates
)

// readerState is what a reading thread is doing, from its sched events, and
// how long it has spent in each state so far.
type readerState struct {
	state int
	since uint64
	until uint64 // unknown until then: sched events were lost
	spent [nStates]uint64
}

// at is the time spent in each state up to t.
func (r *readerState) at(t uint64) [nStates]uint64 {
	s := r.spent
	if t > r.since {
		s[r.state] += t - r.since
	}
	return s
}

func (r *readerState) set(t uint64, state int) {
	r.spent = r.at(t)
	r.since = max(r.since, t)
	if t <= r.until {
		state = stateUnknown
	}
	r.state = state
}

// segRef names a segment by the connection end that numbered it and its
// number there: where it entered TCP on the sender, or where it reached the
// device on the receiver when its sender is not in the traces.
type segRef struct {
	cs  *connState
	seg uint64
}

// pending is a segment on its way through one end's stack.
type pending struct {
	t   uint64 // when it reached its current layer (never before the previous)
	seg uint64 // numbered where it entered this end
	// sender: when it passed tcp_xmit, ip_send, dev_queue (if viaQueue:
	// its device has a qdisc); what it carries
	times    [3]uint64
	viaQueue bool
	seq      uint32
	size     int32
	ipSize   int32 // the IP packet's length, once past ip_send / dev_recv
	cpu      uint16
	tid      uint32 // where its last event ran (cpu, tid)
	ipid     uint16
	gso      uint16
	hasID    bool // ipid is an IPv4 id (IPv6 has none)
	// devSeq: seq is the TCP sequence number its IPv6 dev_recv carried,
	// by which it was looked up among the peer's departures
	devSeq bool
	// receiver
	devT   uint64 // when it reached the device
	end    int64  // chunk waiting for the reader: stream offset past its data
	lo     uint64 // chunk: its first segment (several coalesce into one tcp_rcv)
	origin segRef // the sender's segment, once matched across the wire
	// chunk: the reader expected when it reached the socket (0: none yet)
	// and that reader's time in each state then
	reader uint32
	spent  [nStates]uint64
	// st: the events of each layer it passed (journeyLayers), for the
	// journeys table
	st [numJourneyLayers]stamp
}

// maxQueue bounds every queue of segments between two layers: a chain
// broken for good (a layer not recorded, events lost) must not hold a
// trace's worth of segments. The oldest is dropped.
const maxQueue = 4096

// fifo is a queue of segments between two layers.
type fifo[T any] struct {
	buf  []T
	head int
}

func (f *fifo[T]) len() int    { return len(f.buf) - f.head }
func (f *fifo[T]) at(i int) *T { return &f.buf[f.head+i] }

func (f *fifo[T]) push(p T) (dropped bool) {
	if f.len() >= maxQueue {
		f.head++
		dropped = true
	}
	if f.head > 0 && f.head >= len(f.buf)/2 && len(f.buf) == cap(f.buf) {
		// Reuse the room the consumed head leaves rather than grow.
		n := copy(f.buf, f.buf[f.head:])
		f.buf, f.head = f.buf[:n], 0
	}
	f.buf = append(f.buf, p)
	return dropped
}

// remove takes the i-th element out, keeping the others in order.
func (f *fifo[T]) remove(i int) {
	copy(f.buf[f.head+1:f.head+i+1], f.buf[f.head:f.head+i])
	f.drop(1)
}

func (f *fifo[T]) drop(n int) {
	f.head += n
	if f.head == len(f.buf) {
		f.buf, f.head = f.buf[:0], 0
	}
}

// hopTracker matches one TCP connection end's segments across layers. Each
// segment passes every layer of its side once and in order, but an event
// can be missing (lost, not attributed to the connection, a packet dropped
// in the qdisc), so the layers do not simply pair first in, first out,
// where one missing event would shift every later pair. An event is paired
// with the segment that is the same packet by what both layers see of it,
// and the segments it skips are given up on. Most hops are one kernel
// call (tcp_xmit to ip_send to dev_queue, or to dev_xmit without a qdisc;
// dev_recv to ip_recv): there, the packet is the latest of the same CPU
// and thread whose length fits. Otherwise it is the oldest that fits: by
// the IPv4 id the socket's counter gives it, its length, its GSO
// segments. Events come in time order (the stream sorts them).
type hopTracker struct {
	cs *connState
	// noIP: the trace has no IP layer (recorded without the ip group):
	// tcp_xmit hands its segments straight to the device events, which
	// carry the IP id and the TCP sequence number, and dev_recv to tcp_rcv.
	noIP bool
	// sender: segments past tcp_xmit, ip_send, dev_queue
	qXmit, qIP, qQueue fifo[pending]
	// queued: a dev_queue was seen, so this end's device has a qdisc and
	// dev_xmit follows dev_queue; until then dev_xmit follows ip_send.
	queued bool
	// receiver: packets past dev_recv and ip_recv, chunks waiting for the
	// reader
	qDev, qIPr, qSock fifo[pending]
	// inflight: received segments matched to their sender's, by number,
	// until the reader takes them
	inflight fifo[pathSeg]
	stats    [numHops]HopStats
	share    TimeShare
	consumed int64 // bytes the application read
	isn      uint32
	haveISN  bool
	// An active open receives its SYN-ACK in SYN_SENT, where tcp_rcv
	// (tcp_probe) does not fire: packets before the handshake's ACK are
	// not queued for it.
	synSent, established bool
	segs                 uint64
	dropped              uint64 // segments given up on (queue full)
	// skipped: segments given up on because a later one was matched (their
	// event at the next layer is missing)
	skipped uint64
	// droppedOut: segments taken out of a queue by a drop event;
	// dropBytes: their TCP payload
	droppedOut uint64
	dropBytes  int64
	// nextID: the IPv4 id the socket's next packet gets (haveID: known).
	// The kernel numbers a TCP socket's packets from a per-socket counter
	// that each packet advances by its GSO segments.
	nextID uint16
	haveID bool
	// l2: bytes a device event's length has beyond the IP packet's (the
	// link-layer header on egress), learned from the first device event
	// matched by its GSO segments and a plausible length; -1: unknown.
	l2 [2]int32
	// onHop, if set, is told of every matched hop: the connection end whose
	// layer the segment left, the hop, its times and the segment.
	onHop func(at *connState, hop int, from, to uint64, ref segRef)
	// onJourney, if set, is given every received data segment matched to
	// its sender's, once its way up ends (read, given up on, or the end of
	// the traces); to is this, the receiving end.
	onJourney func(ps *pathSeg, to *connState)
	// The threads that read the connection, and which one read last.
	readers map[uint32]*readerState
	reader  uint32
	wait    ReaderWait
}

func newHopTracker(cs *connState) *hopTracker {
	h := &hopTracker{cs: cs, l2: [2]int32{-1, -1}}
	if cs.src != nil {
		h.noIP = cs.src.dec.noIP
	}
	for i := range h.stats {
		h.stats[i].Hop = hopNames[i]
	}
	return h
}

func (h *hopTracker) ref(p *pending) segRef {
	if p.origin.cs != nil {
		return p.origin
	}
	return segRef{h.cs, p.seg}
}

// hop records one hop of a segment and returns when the segment reached
// the next layer: never before it left the previous one, so that a
// segment's hops add up to its whole journey.
func (h *hopTracker) hop(i int, from, to uint64, ref segRef) uint64 {
	if to < from {
		to = from
	}
	s := &h.stats[i]
	s.Count++
	s.d.Add(float64(to-from) / 1e3)
	if h.onHop != nil {
		h.onHop(h.cs, i, from, to, ref)
	}
	return to
}

func (h *hopTracker) queue(f *fifo[pending], p pending) {
	if f.push(p) {
		h.dropped++
	}
}

func (h *hopTracker) step(e *ev) {
	switch e.kind {
	case kTCPXmit:
		if e.flags&0x02 != 0 && e.flags&0x10 == 0 {
			h.synSent = true
		} else if e.flags&0x02 == 0 {
			h.established = true
		}
		h.segs++
		p := pending{t: e.t, seg: h.segs, times: [3]uint64{e.t}, seq: e.a, size: e.size, gso: uint16(e.b), cpu: e.cpu, tid: e.tid}
		p.st[jTCPXmit] = stampOf(e)
		h.queue(&h.qXmit, p)
	case kIPSend:
		i, ok := h.matchIP(e)
		if !ok {
			return // its earlier layer was not seen (lost, or before recording)
		}
		p := h.takeIn(&h.qXmit, i, e)
		p.t = h.hop(hopXmitIP, p.t, e.t, segRef{h.cs, p.seg})
		p.times[1] = p.t
		p.ipid, p.hasID, p.ipSize, p.cpu, p.tid = uint16(e.a), e.b == 4, e.size, e.cpu, e.tid
		p.st[jIPSend] = stampOf(e)
		if p.hasID {
			h.nextID, h.haveID = p.ipid+max(p.gso, 1), true
		}
		h.queue(&h.qIP, p)
	case kDevQueue:
		h.queued = true
		var p pending
		if h.noIP {
			i, ok := h.matchTCPDev(e)
			if !ok {
				return
			}
			p = h.takeIn(&h.qXmit, i, e)
			h.devFacts(&p, e)
			p.t = h.hop(hopXmitQueue, p.t, e.t, segRef{h.cs, p.seg})
			p.times[1] = p.times[0]
		} else {
			i, ok := h.matchDev(&h.qIP, e, 0, true)
			if !ok {
				return
			}
			p = h.takeIn(&h.qIP, i, e)
			p.t = h.hop(hopIPQueue, p.t, e.t, segRef{h.cs, p.seg})
		}
		p.cpu, p.tid = e.cpu, e.tid
		p.times[2], p.viaQueue = p.t, true
		p.st[jDevQueue] = stampOf(e)
		h.queue(&h.qQueue, p)
	case kDevXmit:
		var p pending
		if i, ok := h.matchDev(&h.qQueue, e, 1, false); ok {
			p = h.take(&h.qQueue, i)
			p.t = h.hop(hopQueueXmit, p.t, e.t, segRef{h.cs, p.seg})
		} else if h.noIP && !h.queued {
			// No IP layer and no qdisc: the device's transmit follows TCP
			// in the same call.
			i, ok := h.matchTCPDev(e)
			if !ok {
				return
			}
			p = h.takeIn(&h.qXmit, i, e)
			h.devFacts(&p, e)
			p.t = h.hop(hopXmitDev, p.t, e.t, segRef{h.cs, p.seg})
			p.times[1] = p.times[0]
		} else if i, ok := h.matchDev(&h.qIP, e, 1, true); ok && !h.queued {
			// No qdisc: the device's transmit follows IP directly.
			p = h.takeIn(&h.qIP, i, e)
			p.t = h.hop(hopIPXmit, p.t, e.t, segRef{h.cs, p.seg})
		} else {
			return
		}
		p.st[jDevXmit] = stampOf(e)
		if h.cs.path != nil {
			h.cs.path.depart(&p, h.noIP)
		}
	case kDrop:
		h.dropOut(e)
	case kDevRecv:
		h.segs++
		p := pending{t: e.t, devT: e.t, seg: h.segs, ipSize: e.size, cpu: e.cpu, tid: e.tid}
		p.st[jDevRecv] = stampOf(e)
		if e.c == 6 {
			// IPv6 has no packet id: the TCP sequence number the device
			// event carries (traces since it does: family set) is each
			// packet's own, where tcp_rcv has only the first of those the
			// socket's backlog coalesced.
			p.seq, p.devSeq = e.d, true
		}
		if !h.noIP {
			h.queue(&h.qDev, p)
			return
		}
		// No IP layer: the device event carries what ip_recv would.
		if h.synSent && !h.established {
			return // the SYN-ACK
		}
		if e.c == 4 {
			p.ipid, p.hasID = uint16(e.b), true
			h.matchWire(&p, e.t)
		} else if p.devSeq {
			h.matchWire(&p, e.t)
		}
		h.queue(&h.qIPr, p)
	case kIPRecv:
		// dev_recv's length is the IP packet's: the link-layer header is
		// pulled before it.
		i, ok := h.match(&h.qDev, e, func(p *pending) bool { return p.ipSize == e.size })
		if !ok {
			return
		}
		p := h.takeIn(&h.qDev, i, e)
		if h.synSent && !h.established {
			return // the SYN-ACK
		}
		p.st[jIPRecv] = stampOf(e)
		p.ipSize = e.size
		if e.b == 4 {
			p.ipid, p.hasID = uint16(e.a), true
			h.matchWire(&p, e.t)
		} else if p.devSeq {
			h.matchWire(&p, e.t)
		}
		p.t = h.hop(hopRecvIP, p.t, e.t, h.ref(&p))
		h.queue(&h.qIPr, p)
	case kTCPRcv:
		h.tcpRcv(e)
	case kSockRecv:
		h.read(e)
	}
}

// matchWindow is how far into a queue an event looks for its segment: a
// gap of more missing events than this is not bridged.
const matchWindow = 64

// find returns the index of the oldest segment of q, within matchWindow,
// that same says is the event's.
func (h *hopTracker) find(q *fifo[pending], same func(p *pending) bool) (int, bool) {
	for i := 0; i < q.len() && i < matchWindow; i++ {
		if same(q.at(i)) {
			return i, true
		}
	}
	return 0, false
}

// match returns the index of the segment of q that the event e, which ends
// a hop made in one kernel call, belongs to: the latest that the same CPU
// and thread passed, and that same says is the event's; else the oldest
// that same says is.
func (h *hopTracker) match(q *fifo[pending], e *ev, same func(p *pending) bool) (int, bool) {
	for i := q.len() - 1; i >= 0 && i >= q.len()-matchWindow; i-- {
		if p := q.at(i); p.cpu == e.cpu && p.tid == e.tid && p.t <= e.t && same(p) {
			return i, true
		}
	}
	return h.find(q, same)
}

// take removes and returns the i-th segment of q, giving up on the i
// before it: their event at this layer is missing.
func (h *hopTracker) take(q *fifo[pending], i int) pending {
	p := *q.at(i)
	h.skipped += uint64(i)
	q.drop(i + 1)
	return p
}

// takeIn is take for a hop made in one kernel call, ended by the event e.
// When the segment is the latest the same CPU and thread passed, only the
// earlier ones of that CPU and thread are given up on: their event at this
// layer, made in the same call, is missing. Another CPU's are on their way
// up at the same time (veth hands each packet to the backlog of the CPU
// that sent it, and the two CPUs' backlogs are taken up in parallel), and
// stay.
func (h *hopTracker) takeIn(q *fifo[pending], i int, e *ev) pending {
	p := *q.at(i)
	if p.cpu != e.cpu || p.tid != e.tid {
		return h.take(q, i)
	}
	// Keep the others in order, moved up to just before i+1.
	w := i
	for j := i - 1; j >= 0; j-- {
		o := q.at(j)
		if o.cpu == p.cpu && o.tid == p.tid {
			h.skipped++
			continue
		}
		*q.at(w) = *o
		w--
	}
	q.drop(w + 1)
	return p
}

// ipHeaders bounds the IP and TCP headers between a segment's payload
// (tcp_xmit) and its IP packet (ip_send): 20 to 60 bytes each over IPv4,
// 40 plus 20 to 60 over IPv6.
const minHeaders, maxHeaders = 40, 120

// matchIP finds the tcp_xmit of an ip_send: by the IPv4 id the socket's
// counter gives it, once one packet fixed the counter, and a length that
// fits; otherwise (IPv6, the first packet) by the length alone.
func (h *hopTracker) matchIP(e *ev) (int, bool) {
	fits := func(p *pending) bool {
		hdr := e.size - max(p.size, 0)
		return hdr >= minHeaders && hdr <= maxHeaders
	}
	for i := h.qXmit.len() - 1; i >= 0 && i >= h.qXmit.len()-matchWindow; i-- {
		if p := h.qXmit.at(i); p.cpu == e.cpu && p.tid == e.tid && p.t <= e.t && fits(p) {
			return i, true
		}
	}
	if e.b == 4 && h.haveID {
		id := h.nextID
		for i := 0; i < h.qXmit.len() && i < matchWindow; i++ {
			p := h.qXmit.at(i)
			if id == uint16(e.a) && fits(p) {
				return i, true
			}
			id += max(p.gso, 1)
		}
	}
	return h.find(&h.qXmit, fits)
}

// matchDev finds the segment of a device event (side 0: dev_queue, 1:
// dev_xmit) in q: the same GSO segments and, once learned, the same
// link-layer overhead over its IP length; oneCall: the hop is made in one
// kernel call (from ip_send).
func (h *hopTracker) matchDev(q *fifo[pending], e *ev, side int, oneCall bool) (int, bool) {
	segs := uint16(max(e.a, 1))
	l2 := h.l2[side]
	same := func(p *pending) bool {
		if max(p.gso, 1) != segs {
			return false
		}
		// Device records carry the IPv4 id: a packet whose earlier
		// device event the kernel skipped must not take the next one's.
		if p.hasID && e.c == 4 && uint16(e.b) != p.ipid {
			return false
		}
		// IPv6 has no id: the TCP sequence number device records carry
		// (family set) does the same.
		if e.c == 6 && e.d != p.seq {
			return false
		}
		d := e.size - p.ipSize
		if l2 >= 0 {
			return d == l2
		}
		return d >= 0 && d <= maxL2
	}
	var i int
	var ok bool
	if oneCall {
		i, ok = h.match(q, e, same)
	} else {
		i, ok = h.find(q, same)
	}
	if ok {
		h.l2[side] = e.size - q.at(i).ipSize
	}
	return i, ok
}

// devFacts takes, on a trace without the IP layer, what ip_send would have
// told of a segment from its first device event: the IPv4 id and the packet's
// length there (with its link-layer header: what a drop at the device
// counts too).
func (h *hopTracker) devFacts(p *pending, e *ev) {
	p.ipSize = e.size
	if e.c == 4 {
		p.ipid, p.hasID = uint16(e.b), true
		h.nextID, h.haveID = p.ipid+max(p.gso, 1), true
	}
	p.st[jIPSend] = stamp{}
}

// matchTCPDev finds the tcp_xmit of a device event on a trace without the
// IP layer: the same TCP sequence number and GSO segments when the device
// event carries them (family set), else a length that fits the headers
// between. tcp_xmit to the first device event is one kernel call, unless
// TCP Small Queues deferred the send to a later softirq or thread.
func (h *hopTracker) matchTCPDev(e *ev) (int, bool) {
	segs := uint16(max(e.a, 1))
	same := func(p *pending) bool {
		if max(p.gso, 1) != segs {
			return false
		}
		if e.c != 0 {
			return p.seq == e.d
		}
		hdr := e.size - max(p.size, 0)
		return hdr >= minHeaders && hdr <= maxHeaders+maxL2
	}
	return h.match(&h.qXmit, e, same)
}

// maxL2 bounds a link-layer header (Ethernet with two VLAN tags: 22).
const maxL2 = 32

// dropOut takes a packet dropped on its way down (the qdisc was full, a
// filter refused it) out of the queue it waited in, so that the next
// layer's events pair with the packets that reach it. The drop happens in
// the call that handed the packet on (qdisc enqueue, IP output): it is the
// latest packet of the same CPU and thread with the dropped length, which
// counts the link-layer header from the device on.
func (h *hopTracker) dropOut(e *ev) {
	for _, q := range []struct {
		f  *fifo[pending]
		l2 int32
	}{{&h.qQueue, h.l2[0]}, {&h.qIP, h.l2[0]}} {
		for i := q.f.len() - 1; i >= 0 && i >= q.f.len()-matchWindow; i-- {
			p := q.f.at(i)
			if p.cpu == e.cpu && p.tid == e.tid && p.t <= e.t && (e.size == p.ipSize || q.l2 >= 0 && e.size == p.ipSize+q.l2) {
				h.dropBytes += int64(max(p.size, 0))
				q.f.remove(i)
				h.droppedOut++
				return
			}
		}
	}
}

// matchWire finds the departure, on the other end, of a packet that reached
// this end's IP layer at ipT, and starts following it to the application.
func (h *hopTracker) matchWire(p *pending, ipT uint64) {
	peer := h.cs.peer
	if peer == nil || peer.path == nil {
		return
	}
	var d departure
	var ok bool
	switch {
	case p.hasID:
		d, ok = peer.path.takeID(p.ipid, p.devT)
	case p.devSeq:
		// A pure ACK carries the sender's next sequence number, which a
		// data packet departed since may start at: the departure is
		// this packet only if the IP length holds its data.
		d, ok = peer.path.takeSeqFits(p.seq, p.ipSize, p.devT)
	default:
		d, ok = peer.path.takeSeq(p.seq, p.devT)
	}
	if !ok {
		peer.path.unmatched++
		return
	}
	p.origin = segRef{peer, d.seg}
	if h.onHop != nil {
		h.onHop(peer, hopWire, d.times[3], max(p.devT, d.times[3]), p.origin)
	}
	if d.size <= 0 {
		return // a pure ACK: no reader takes it
	}
	ps := pathSeg{seg: p.seg, from: peer.path, viaQueue: d.viaQueue, noIP: d.noIP, noIPr: h.noIP, seq: d.seq, size: d.size, gso: d.gso,
		ipid: p.ipid, hasID: p.hasID, ipLen: p.ipSize}
	copy(ps.times[:4], d.times[:])
	ps.times[4], ps.times[5] = p.devT, ipT
	copy(ps.st[:jDevRecv], d.st[:])
	ps.st[jDevRecv], ps.st[jIPRecv] = p.st[jDevRecv], p.st[jIPRecv]
	if h.inflight.len() >= maxQueue && h.onJourney != nil {
		h.onJourney(h.inflight.at(0), h.cs) // given up on: its way up is not known
	}
	if h.inflight.push(ps) {
		h.dropped++
	}
}

// tcpRcv ends the IP hop of every packet that reached the socket before it:
// while the application holds the socket, arriving segments wait in its
// backlog, where the kernel coalesces them, so one tcp_rcv can stand for
// several ip_recv.
func (h *hopTracker) tcpRcv(e *ev) {
	n := 0
	devT := e.t
	var last *pending
	var lo uint64
	for n < h.qIPr.len() && h.qIPr.at(n).t <= e.t {
		p := h.qIPr.at(n)
		if n == 0 {
			lo = p.seg
			if !p.hasID && !p.devSeq && p.origin.cs == nil && e.size > 0 {
				// IPv6 has no packet id: the first packet of the chunk is
				// matched by its sequence number.
				p.seq = e.a
				h.matchWire(p, p.t)
			}
		}
		if h.noIP {
			h.hop(hopRecvTCP, p.t, e.t, h.ref(p))
		} else {
			h.hop(hopIPTCP, p.t, e.t, h.ref(p))
		}
		devT = min(devT, p.devT)
		last = p // the coalesced segment goes on as the last one
		n++
	}
	var chunk pending
	if last != nil {
		chunk = pending{t: e.t, devT: devT, seg: last.seg, lo: lo, origin: last.origin}
		chunk.st[jTCPRcv] = stampOf(e)
	}
	h.qIPr.drop(n)
	if n == 0 || e.size <= 0 {
		return
	}
	if !h.haveISN {
		// The first data segment seen starts the stream.
		h.isn, h.haveISN = e.a, true
	}
	chunk.end = int64(e.a-h.isn) + int64(e.size)
	if r := h.readers[h.reader]; r != nil {
		chunk.reader, chunk.spent = h.reader, r.at(e.t)
	}
	h.queue(&h.qSock, chunk)
}

// read takes an application read: every chunk whose data it completes has
// waited in the socket until now.
func (h *hopTracker) read(e *ev) {
	if e.size <= 0 {
		return
	}
	h.consumed += int64(e.size)
	for h.qSock.len() > 0 && h.qSock.at(0).end <= h.consumed {
		p := h.qSock.at(0)
		t := h.hop(hopTCPSock, p.t, e.t, h.ref(p))
		h.share.SocketWaitUs += float64(t-p.t) / 1e3
		h.share.ReceiveUs += float64(t-min(p.devT, p.t)) / 1e3
		h.readerWait(p, e)
		h.deliver(p.lo, p.seg, p.t, t, p.st[jTCPRcv], stampOf(e))
		h.qSock.drop(1)
	}
	if r := h.readers[e.tid]; r != nil {
		r.set(e.t, stateOnCPU) // it is running its read
	}
	h.reader = e.tid
}

// reads says whether the thread tid has read the connection.
func (h *hopTracker) reads(tid uint32) bool { return h.readers[tid] != nil }

// addReader starts following the thread tid, which reads the connection:
// from now on, its sched events are added too.
func (h *hopTracker) addReader(tid uint32) {
	if h.readers == nil {
		h.readers = map[uint32]*readerState{}
	}
	if h.readers[tid] == nil {
		h.readers[tid] = &readerState{}
	}
}

// readerWait splits a chunk's wait in the socket, from its tcp_rcv to the
// read e that took it, by what the reader did meanwhile.
func (h *hopTracker) readerWait(p *pending, e *ev) {
	r := h.readers[e.tid]
	if r == nil || p.reader != e.tid {
		return // another thread was expected to read, or none yet: not followed
	}
	now := r.at(e.t)
	var d [nStates]float64
	for i := range d {
		if now[i] > p.spent[i] {
			d[i] = float64(now[i]-p.spent[i]) / 1e3
		}
	}
	h.wait.OnCPUUs += d[stateOnCPU]
	h.wait.RunnableUs += d[stateRunnable]
	h.wait.AsleepUs += d[stateAsleep]
	h.wait.FollowedUs += d[stateOnCPU] + d[stateRunnable] + d[stateAsleep]
}

// schedStep follows the readers through a scheduler event.
func (h *hopTracker) schedStep(e schedEvent) {
	switch e.kind {
	case schedSwitch:
		if r := h.readers[e.tid]; r != nil {
			if e.prevState == 0 {
				r.set(e.t, stateRunnable) // preempted
			} else {
				r.set(e.t, stateAsleep)
			}
		}
		if r := h.readers[e.next]; r != nil {
			r.set(e.t, stateOnCPU)
		}
	case schedWakeup:
		// A wakeup makes a sleeping thread runnable; one that was running
		// (it had not gone to sleep yet) stays on its CPU.
		if r := h.readers[e.tid]; r != nil && r.state == stateAsleep {
			r.set(e.t, stateRunnable)
		}
	case schedLoss:
		for _, r := range h.readers {
			r.until = max(r.until, e.end)
			r.set(e.t, stateUnknown)
		}
	}
}

// deliver completes the journeys of the received segments lo…hi, which
// reached TCP at tcpT (its event tcpE) and the application at sockT (sockE).
func (h *hopTracker) deliver(lo, hi, tcpT, sockT uint64, tcpE, sockE stamp) {
	n := 0
	for n < h.inflight.len() && h.inflight.at(n).seg <= hi {
		ps := h.inflight.at(n)
		if ps.seg >= lo {
			ps.times[6], ps.times[7] = tcpT, sockT
			ps.st[jTCPRcv], ps.st[jSockRecv] = tcpE, sockE
			ps.from.complete(ps)
		} else {
			ps.from.lostOnTheWay++ // never reached the application as such
		}
		if h.onJourney != nil {
			h.onJourney(ps, h.cs)
		}
		n++
	}
	h.inflight.drop(n)
}

// flushJourneys hands on the segments still on their way up at the end of
// the traces: they reached the receiver's IP layer, not its application.
func (h *hopTracker) flushJourneys() {
	for i := 0; i < h.inflight.len(); i++ {
		h.onJourney(h.inflight.at(i), h.cs)
	}
	h.inflight.drop(h.inflight.len())
}

// finish returns the hops that saw segments and the receive time share;
// with sched, the trace had sched events, so the reader's wait is told.
func (h *hopTracker) finish(sched bool) ([]*HopStats, *TimeShare) {
	var out []*HopStats
	for i := range h.stats {
		if s := &h.stats[i]; s.Count > 0 && i != hopWire {
			s.Delay = summarise(&s.d)
			out = append(out, s)
		}
	}
	if h.share.ReceiveUs == 0 {
		return out, nil
	}
	h.share.SocketShare = h.share.SocketWaitUs / h.share.ReceiveUs
	if sched {
		w := h.wait
		if w.FollowedUs > 0 {
			w.OffCPUShare = (w.RunnableUs + w.AsleepUs) / w.FollowedUs
		}
		if h.share.SocketWaitUs > 0 {
			w.Followed = math.Min(1, w.FollowedUs/h.share.SocketWaitUs)
		}
		h.share.Reader = &w
	}
	return out, &h.share
}
