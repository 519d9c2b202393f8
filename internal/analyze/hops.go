// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"container/heap"
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
}

// hopEvent is one event of a connection's path, kept in time order.
type hopEvent struct {
	t     uint64
	typ   string
	size  int32
	seq   uint32
	flags uint8 // TCP flags of tcp_xmit and tcp_rcv
}

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
}

func newHopTracker() *hopTracker {
	h := &hopTracker{queues: map[string][]pending{}, stats: map[string]*HopStats{}}
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

func (h *hopTracker) step(e hopEvent) {
	switch e.typ {
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
			q = q[1:]
		}
		h.queues["sock"] = q
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
	h.queues["sock"] = append(h.queues["sock"], pending{t: e.t, devT: devT, end: end, seg: seg})
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

// finish drains the window and returns the hops that saw segments.
func (h *hopTracker) finish() ([]*HopStats, *TimeShare) {
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
	return out, &h.share
}
