// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"container/heap"
	"math"
)

// Hops are the steps a TCP segment takes, down the sender's stack and up the
// receiver's, in the order "where time goes" reports them.
var Hops = []string{
	"tcp_xmit→ip_send", "ip_send→dev_queue", "dev_queue→dev_xmit",
	"dev_recv→ip_recv", "ip_recv→tcp_rcv", "tcp_rcv→sock_recv",
}

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

// hopEvent is one event of a connection's path, kept in time order.
type hopEvent struct {
	t     uint64
	typ   string
	size  int32
	seq   uint32
	flags uint8  // TCP flags of tcp_xmit and tcp_rcv
	tid   uint32 // sock_recv: the reader
	sched schedEvent
}

// hopSched is the type of a scheduler event about a reader (or a loss of
// some) in a connection's stream.
const hopSched = "sched"

type hopHeap []hopEvent

func (h hopHeap) Len() int           { return len(h) }
func (h hopHeap) Less(i, j int) bool { return h[i].t < h[j].t }
func (h hopHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *hopHeap) Push(x any)        { *h = append(*h, x.(hopEvent)) }
func (h *hopHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// pending is a segment on its way: when it entered the current hop and,
// on the receiver, when it reached the device.
type pending struct {
	t, devT uint64
	end     int64  // receiver: stream offset just past the segment's data
	seg     uint64 // which segment: numbered where it enters a side
	// In the socket: the reader expected then (0: none yet) and its time
	// in each state at that moment.
	reader uint32
	spent  [nStates]uint64
}

// hopTracker matches one TCP connection's segments across layers. Each
// segment passes every layer of its side once and in order, so the layers
// pair first in, first out: the n-th ip_send is the n-th tcp_xmit.
type hopTracker struct {
	win      hopHeap
	queues   map[string][]pending
	stats    map[string]*HopStats
	share    TimeShare
	consumed int64 // bytes the application read
	isn      uint32
	haveISN  bool
	// An active open receives its SYN-ACK in SYN_SENT, where tcp_rcv
	// (tcp_probe) does not fire: packets before the handshake's ACK are
	// not queued for it.
	synSent, established bool
	// OnHop, if set, is told of every matched hop of every segment.
	OnHop func(hop string, from, to uint64, seg uint64)
	segs  uint64
	// The threads that read the connection, and which one read last.
	readers map[uint32]*readerState
	reader  uint32
	wait    ReaderWait
}

func newHopTracker() *hopTracker {
	h := &hopTracker{queues: map[string][]pending{}, stats: map[string]*HopStats{}, readers: map[uint32]*readerState{}}
	for _, n := range Hops {
		h.stats[n] = &HopStats{Hop: n}
	}
	return h
}

var hopNext = map[string]struct{ from, hop string }{
	"ip_send":   {"tcp_xmit", "tcp_xmit→ip_send"},
	"dev_queue": {"ip_send", "ip_send→dev_queue"},
	"dev_xmit":  {"dev_queue", "dev_queue→dev_xmit"},
	"ip_recv":   {"dev_recv", "dev_recv→ip_recv"},
}

func (h *hopTracker) add(e hopEvent) {
	heap.Push(&h.win, e)
	if len(h.win) > reorderWindow {
		h.step(heap.Pop(&h.win).(hopEvent))
	}
}

// reads says whether the thread tid has read the connection.
func (h *hopTracker) reads(tid uint32) bool { return h.readers[tid] != nil }

// addReader starts following the thread tid, which reads the connection:
// from now on, its sched events are added too.
func (h *hopTracker) addReader(tid uint32) {
	if h.readers[tid] == nil {
		h.readers[tid] = &readerState{}
	}
}

func (h *hopTracker) step(e hopEvent) {
	switch e.typ {
	case hopSched:
		h.schedStep(e.sched)
		return
	case "tcp_xmit":
		if e.flags&0x02 != 0 && e.flags&0x10 == 0 {
			h.synSent = true
		} else if e.flags&0x02 == 0 {
			h.established = true
		}
	case "ip_recv":
		if h.synSent && !h.established {
			// The SYN-ACK: drop it from the device queue too.
			if q := h.queues["dev_recv"]; len(q) > 0 {
				h.queues["dev_recv"] = q[1:]
			}
			return
		}
	}
	switch e.typ {
	case "tcp_xmit", "dev_recv":
		h.segs++
		h.queues[e.typ] = append(h.queues[e.typ], pending{t: e.t, devT: e.t, seg: h.segs})
		return
	case "sock_recv":
		if e.size <= 0 {
			return
		}
		h.consumed += int64(e.size)
		q := h.queues["sock"]
		for len(q) > 0 && q[0].end <= h.consumed {
			h.record("tcp_rcv→sock_recv", e.t, q[0].t, q[0].seg)
			h.share.SocketWaitUs += float64(e.t-q[0].t) / 1e3
			h.share.ReceiveUs += float64(e.t-q[0].devT) / 1e3
			h.readerWait(q[0], e)
			q = q[1:]
		}
		h.queues["sock"] = q
		if r := h.readers[e.tid]; r != nil {
			r.set(e.t, stateOnCPU) // it is running its read
		}
		h.reader = e.tid
		return
	}
	if e.typ == "tcp_rcv" {
		h.tcpRcv(e)
		return
	}
	nx, ok := hopNext[e.typ]
	if !ok {
		return
	}
	q := h.queues[nx.from]
	if len(q) == 0 {
		return // its earlier layer was not seen (lost, or before recording)
	}
	p := q[0]
	h.queues[nx.from] = q[1:]
	h.record(nx.hop, e.t, p.t, p.seg)
	p.t = e.t
	if e.typ != "dev_xmit" {
		h.queues[e.typ] = append(h.queues[e.typ], p)
	}
}

// tcpRcv ends the IP hop of every packet that reached the socket before it:
// while the application holds the socket, arriving segments wait in its
// backlog, where the kernel coalesces them, so one tcp_rcv can stand for
// several ip_recv.
func (h *hopTracker) tcpRcv(e hopEvent) {
	q := h.queues["ip_recv"]
	n := 0
	devT := e.t
	var seg uint64
	for n < len(q) && q[n].t <= e.t {
		h.record("ip_recv→tcp_rcv", e.t, q[n].t, q[n].seg)
		devT = min(devT, q[n].devT)
		seg = q[n].seg // the coalesced segment goes on as the last one
		n++
	}
	h.queues["ip_recv"] = q[n:]
	if n == 0 || e.size <= 0 {
		return
	}
	if !h.haveISN {
		// The first data segment seen starts the stream.
		h.isn, h.haveISN = e.seq, true
	}
	end := int64(e.seq-h.isn) + int64(e.size)
	p := pending{t: e.t, devT: devT, end: end, seg: seg}
	if r := h.readers[h.reader]; r != nil {
		p.reader, p.spent = h.reader, r.at(e.t)
	}
	h.queues["sock"] = append(h.queues["sock"], p)
}

// readerWait splits a segment's wait in the socket, from its tcp_rcv p to
// the read e that took it, by what the reader did meanwhile.
func (h *hopTracker) readerWait(p pending, e hopEvent) {
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

func (h *hopTracker) record(hop string, to, from, seg uint64) {
	if to < from {
		to = from
	}
	if h.OnHop != nil {
		h.OnHop(hop, from, to, seg)
	}
	s := h.stats[hop]
	s.Count++
	s.d.Add(float64(to-from) / 1e3)
}

// finish drains the window and returns the hops that saw segments; with
// sched, the trace had sched events, so the reader's wait is told.
func (h *hopTracker) finish(sched bool) ([]*HopStats, *TimeShare) {
	for len(h.win) > 0 {
		h.step(heap.Pop(&h.win).(hopEvent))
	}
	var out []*HopStats
	for _, n := range Hops {
		if s := h.stats[n]; s.Count > 0 {
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
