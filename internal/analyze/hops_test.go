// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"sort"
	"testing"
)

func TestHopTracker(t *testing.T) {
	h := newHopTracker(&connState{})
	us := uint64(1000)
	evs := []ev{
		// Active open: the SYN-ACK reaches IP but never tcp_rcv.
		{t: 0, kind: kTCPXmit, flags: 0x02},
		{t: 1 * us, kind: kIPSend, size: 60}, {t: 2 * us, kind: kDevQueue, size: 74}, {t: 3 * us, kind: kDevXmit, size: 74},
		{t: 10 * us, kind: kDevRecv}, {t: 11 * us, kind: kIPRecv},
		{t: 12 * us, kind: kTCPXmit, flags: 0x10},
		{t: 13 * us, kind: kIPSend, size: 52}, {t: 15 * us, kind: kDevQueue, size: 66}, {t: 18 * us, kind: kDevXmit, size: 66},
		// Two data segments arrive while the socket is owned; one coalesced
		// tcp_rcv carries both (1000 + 1000 bytes).
		{t: 20 * us, kind: kDevRecv}, {t: 21 * us, kind: kIPRecv},
		{t: 22 * us, kind: kDevRecv}, {t: 24 * us, kind: kIPRecv},
		{t: 30 * us, kind: kTCPRcv, a: 500, size: 2000, flags: 0x18},
		// The reader takes 1500 bytes, then the rest.
		{t: 40 * us, kind: kSockRecv, size: 1500},
		{t: 50 * us, kind: kSockRecv, size: 500},
	}
	for i := range evs {
		h.step(&evs[i])
	}
	hops, share := h.finish(false)
	got := map[string][2]float64{}
	for _, s := range hops {
		got[s.Hop] = [2]float64{float64(s.Count), s.d.Sum}
	}
	want := map[string][2]float64{
		"tcp_xmit→ip_send":   {2, 1 + 1},
		"ip_send→dev_queue":  {2, 1 + 2},
		"dev_queue→dev_xmit": {2, 1 + 3},
		"dev_recv→ip_recv":   {2, 1 + 2}, // the SYN-ACK is left out
		"ip_recv→tcp_rcv":    {2, 9 + 6}, // both coalesced packets end at the tcp_rcv
		"tcp_rcv→sock_recv":  {1, 20},    // the segment's last byte is read at 50 µs
	}
	for hop, w := range want {
		if got[hop] != w {
			t.Errorf("%s: count, sum µs = %v, want %v", hop, got[hop], w)
		}
	}
	// Receive: from the first packet's device arrival (20) to the read (50).
	if share == nil || share.ReceiveUs != 30 || share.SocketWaitUs != 20 {
		t.Fatalf("receive time share %+v, want 30 µs with 20 µs in the socket", share)
	}
}

// TestHopTrackerNoQueue: a device without a qdisc writes no dev_queue;
// dev_xmit then follows ip_send, and the queue's hops are absent, not zero.
func TestHopTrackerNoQueue(t *testing.T) {
	h := newHopTracker(&connState{})
	us := uint64(1000)
	evs := []ev{
		{t: 0, kind: kTCPXmit, flags: 0x10},
		{t: 1 * us, kind: kIPSend, size: 52}, {t: 4 * us, kind: kDevXmit, size: 66},
		{t: 10 * us, kind: kTCPXmit, flags: 0x18, size: 100},
		{t: 12 * us, kind: kIPSend, size: 152}, {t: 13 * us, kind: kDevXmit, size: 166},
	}
	for i := range evs {
		h.step(&evs[i])
	}
	hops, _ := h.finish(false)
	got := map[string][2]float64{}
	for _, s := range hops {
		got[s.Hop] = [2]float64{float64(s.Count), s.d.Sum}
	}
	want := map[string][2]float64{
		"tcp_xmit→ip_send": {2, 1 + 2},
		"ip_send→dev_xmit": {2, 3 + 1},
	}
	if len(got) != len(want) {
		t.Errorf("hops %v, want only %v", got, want)
	}
	for hop, w := range want {
		if got[hop] != w {
			t.Errorf("%s: count, sum µs = %v, want %v", hop, got[hop], w)
		}
	}
}

func TestFifoBounded(t *testing.T) {
	var f fifo[pending]
	dropped := 0
	for i := range maxQueue + 100 {
		if f.push(pending{seg: uint64(i)}) {
			dropped++
		}
		if i%3 == 0 {
			f.drop(0)
		}
	}
	if f.len() != maxQueue || dropped != 100 || f.at(0).seg != 100 || f.at(f.len()-1).seg != maxQueue+99 {
		t.Fatalf("len %d, dropped %d, oldest %d, newest %d", f.len(), dropped, f.at(0).seg, f.at(f.len()-1).seg)
	}
	f.drop(f.len())
	if f.len() != 0 || len(f.buf) != 0 {
		t.Fatalf("emptied queue holds %d (%d in its buffer)", f.len(), len(f.buf))
	}
}

// TestWireMatch: a packet is found among the peer's departures by its IPv4
// id, also when it starts inside a departed GSO packet (segmented on the
// way, coalesced again); not when it would have arrived before it left on
// one clock, or long after.
func TestWireMatch(t *testing.T) {
	ps := newPathStats(&connState{}, true)
	ms := uint64(1e6)
	ps.depart(&pending{t: 10 * ms, seg: 1, ipid: 100, hasID: true, gso: 4, size: 5792}, false)
	ps.depart(&pending{t: 11 * ms, seg: 2, ipid: 104, hasID: true, gso: 1, size: 1448}, false)
	if _, ok := ps.takeID(104, 10*ms); ok {
		t.Errorf("matched a packet arriving before it left, on one clock")
	}
	if d, ok := ps.takeID(102, 12*ms); !ok || d.seg != 1 {
		t.Errorf("id 102 inside the GSO packet 100-103: %+v %v", d, ok)
	}
	if d, ok := ps.takeID(100, 12*ms); !ok || d.seg != 1 {
		t.Errorf("id 100: %+v %v", d, ok)
	}
	if _, ok := ps.takeID(103, 12*ms); ok {
		t.Errorf("id 103 matched after its packet was taken whole")
	}
	if _, ok := ps.takeID(104, 11*ms+maxWireNs); ok {
		t.Errorf("matched a departure older than %v ns", maxWireNs)
	}
	other := newPathStats(&connState{}, false)
	other.depart(&pending{t: 10 * ms, seg: 7, ipid: 9, hasID: true, gso: 1, size: 1}, false)
	if d, ok := other.takeID(9, 9*ms); !ok || d.seg != 7 {
		t.Errorf("on two clocks an arrival may read earlier than its departure: %+v %v", d, ok)
	}
}

// TestHopTrackerMissingEvents: a bulk stream of identical 64 KiB GSO
// packets, one every 500 µs, where the device event of one packet and the
// ip_send of another are missing (lost, or not attributed). Each hop is
// one kernel call: tcp_xmit→ip_send takes 1 µs, ip_send→dev_xmit 2 µs
// (no qdisc); through a qdisc, ip_send→dev_queue 1 µs and
// dev_queue→dev_xmit 3 µs, the packets' sizes varying. The medians must
// be the true ones: a missing event must not shift the later pairs.
func TestHopTrackerMissingEvents(t *testing.T) {
	us := uint64(1000)
	for _, qdisc := range []bool{false, true} {
		h := newHopTracker(&connState{})
		var evs []ev
		for i := uint64(0); i < 40; i++ {
			at := 1000*us + i*500*us
			payload, segs := int32(65160), uint32(45)
			if qdisc && i%3 == 1 {
				payload, segs = 1448*int32(i%7+1), uint32(i%7+1)
			}
			cpu := uint16(i % 2)
			evs = append(evs, ev{t: at, kind: kTCPXmit, flags: 0x10, size: payload, b: segs, a: uint32(i) * 65160, cpu: cpu, tid: 7})
			if i != 35 {
				evs = append(evs, ev{t: at + us, kind: kIPSend, size: payload + 52, a: 1000 + uint32(i)*45, b: 4, cpu: cpu, tid: 7})
			}
			switch {
			case i == 5:
			case qdisc:
				evs = append(evs, ev{t: at + 2*us, kind: kDevQueue, size: payload + 66, a: segs, cpu: cpu, tid: 7},
					ev{t: at + 5*us, kind: kDevXmit, size: payload + 66, a: segs, cpu: 3, tid: 0})
			default:
				evs = append(evs, ev{t: at + 3*us, kind: kDevXmit, size: payload + 66, a: segs, cpu: cpu, tid: 7})
			}
		}
		for i := range evs {
			h.step(&evs[i])
		}
		hops, _ := h.finish(false)
		want := map[string]float64{"tcp_xmit→ip_send": 1, "ip_send→dev_xmit": 2}
		if qdisc {
			want = map[string]float64{"tcp_xmit→ip_send": 1, "ip_send→dev_queue": 1, "dev_queue→dev_xmit": 3}
		}
		for _, s := range hops {
			// Quantiles come from 1/128-octave buckets: within 0.8 %.
			if w, ok := want[s.Hop]; !ok || s.Delay.Median < w*0.992 || s.Delay.Median > w*1.008 || s.Delay.P99 > w*1.008 {
				t.Errorf("qdisc %v: %s median %.2f µs, p99 %.2f over %d segments; want %v µs", qdisc, s.Hop, s.Delay.Median, s.Delay.P99, s.Count, w)
			}
			delete(want, s.Hop)
		}
		if len(want) > 0 {
			t.Errorf("qdisc %v: hops %v missing", qdisc, want)
		}
	}
}

// TestHopTrackerQdiscDrop: identical packets queue in a qdisc, each
// leaving 100 µs after it was queued, behind the one before; the qdisc
// drops one at enqueue (a drop event in the same call as its dev_queue).
// The queue's delay must stay 100 µs for every packet that left: the
// dropped one must not take the next one's dev_xmit.
func TestHopTrackerQdiscDrop(t *testing.T) {
	us := uint64(1000)
	h := newHopTracker(&connState{})
	var evs []ev
	for i := uint64(0); i < 20; i++ {
		at := 1000*us + i*50*us
		evs = append(evs, ev{t: at, kind: kTCPXmit, flags: 0x10, size: 65160, b: 45, cpu: 1, tid: 7},
			ev{t: at + us, kind: kIPSend, size: 65212, a: uint32(i) * 45, b: 4, cpu: 1, tid: 7},
			ev{t: at + 2*us, kind: kDevQueue, size: 65226, a: 45, cpu: 1, tid: 7})
		if i == 6 {
			evs = append(evs, ev{t: at + 2*us + 100, kind: kDrop, size: 65226, cpu: 1, tid: 7})
			continue
		}
		evs = append(evs, ev{t: at + 102*us, kind: kDevXmit, size: 65226, a: 45, cpu: 0})
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].t < evs[j].t })
	for i := range evs {
		h.step(&evs[i])
	}
	hops, _ := h.finish(false)
	for _, s := range hops {
		if s.Hop == "dev_queue→dev_xmit" {
			if s.Count != 19 || s.d.Min < 99.9 || s.d.Max > 100.1 {
				t.Errorf("%s: %d segments, %.1f to %.1f µs; want 19, all 100 µs", s.Hop, s.Count, s.d.Min, s.d.Max)
			}
			return
		}
	}
	t.Errorf("no dev_queue→dev_xmit in %v", hops)
}

// TestHopTrackerQueueSkipped: three equal packets wait in a qdisc, the
// kernel having run no dev_queue program for the second. Matched by the
// IPv4 id the device records carry, the third's dev_queue pairs with its
// own ip_send, the second's dev_xmit with nothing, and the third's dev_xmit
// with its own dev_queue, not the second's place in line.
func TestHopTrackerQueueSkipped(t *testing.T) {
	h := newHopTracker(&connState{})
	us := uint64(1000)
	var evs []ev
	for i := range 3 {
		at := uint64(i) * 100 * us
		id := uint32(10 + i)
		evs = append(evs,
			ev{t: at, kind: kTCPXmit, flags: 0x10, a: uint32(1000 * i), size: 1000, b: 1},
			ev{t: at + us, kind: kIPSend, size: 1052, a: id, b: 4})
		if i != 1 {
			evs = append(evs, ev{t: at + 2*us, kind: kDevQueue, size: 1066, a: 1, b: id, c: 4})
		}
	}
	for i := range 3 {
		evs = append(evs, ev{t: uint64(300+100*i) * us, kind: kDevXmit, size: 1066, a: 1, b: uint32(10 + i), c: 4})
	}
	for i := range evs {
		h.step(&evs[i])
	}
	hops, _ := h.finish(false)
	want := map[string][2]float64{
		"ip_send→dev_queue":  {2, 1 + 1},
		"dev_queue→dev_xmit": {2, 298 + 298},
	}
	for _, s := range hops {
		if w, ok := want[s.Hop]; ok && (float64(s.Count) != w[0] || s.d.Sum != w[1]) {
			t.Errorf("%s: %d pairs, %v µs; want %v", s.Hop, s.Count, s.d.Sum, w)
		}
	}
}

// TestPathIPv6Coalesced: without the IP layer, IPv6 data packets are
// matched to their departures by the TCP sequence number their dev_recv
// carries, each of them, also when the receiver's socket backlog coalesces
// several into one tcp_rcv (which carries the first one's sequence number
// only). A pure ACK whose sequence number is that of a departed data
// packet (the sender's next byte) is not taken for it: its length cannot
// hold the data.
func TestPathIPv6Coalesced(t *testing.T) {
	snd, rcv := &connState{id: 1}, &connState{id: 2}
	snd.peer, rcv.peer = rcv, snd
	snd.path, rcv.path = newPathStats(snd, true), newPathStats(rcv, true)
	hs, hr := newHopTracker(snd), newHopTracker(rcv)
	hs.noIP, hr.noIP = true, true
	snd.hops, rcv.hops = hs, hr
	us := uint64(1000)
	const n, size = 4, 1000
	for i := range n {
		seq := uint32(1000 + size*i)
		at := uint64(i) * 10 * us
		hs.step(&ev{t: at, kind: kTCPXmit, flags: 0x18, a: seq, size: size, b: 1})
		// The IPv6 packet: 40 + 32 (TCP with timestamps) + the data, and
		// the Ethernet header at the sender's device.
		hs.step(&ev{t: at + us, kind: kDevXmit, size: 14 + 72 + size, a: 1, c: 6, d: seq})
	}
	// A pure ACK of the sender's with the next data packet's sequence
	// number arrives first.
	hr.step(&ev{t: 50 * us, kind: kDevRecv, size: 72, a: 1, c: 6, d: 1000 + size*(n-1)})
	for i := range n {
		hr.step(&ev{t: uint64(60+i) * us, kind: kDevRecv, size: 72 + size, a: 1, c: 6, d: uint32(1000 + size*i)})
	}
	// The socket was owned: the four come out of the backlog as one.
	hr.step(&ev{t: 70 * us, kind: kTCPRcv, a: 1000, size: n * size})
	hr.step(&ev{t: 80 * us, kind: kSockRecv, size: n * size})
	// A GSO packet of 3 segments that a qdisc on the way segmented: it
	// arrives as 3 packets, the first of which is its departure's.
	const seq, mss = 1000 + n*size, 1428
	hs.step(&ev{t: 90 * us, kind: kTCPXmit, flags: 0x18, a: seq, size: 3 * mss, b: 3})
	hs.step(&ev{t: 91 * us, kind: kDevXmit, size: 14 + 72 + 3*mss, a: 3, c: 6, d: seq})
	for i := range 3 {
		hr.step(&ev{t: uint64(100+i) * us, kind: kDevRecv, size: 72 + mss, a: 1, c: 6, d: uint32(seq + i*mss)})
	}
	hr.step(&ev{t: 110 * us, kind: kTCPRcv, a: seq, size: 3 * mss})
	hr.step(&ev{t: 120 * us, kind: kSockRecv, size: 3 * mss})
	p := snd.path.report()
	if p == nil || p.DataDeparted != n+1 || p.Matched != n+1 || p.Segments != n+1 {
		t.Fatalf("path %+v: want %d data packets departed, matched and followed to the reader", p, n+1)
	}
}

// TestPathIPv6DevXmitSkipped: the kernel ran no net_dev_start_xmit
// program for one of two queued IPv6 packets of the same length and GSO
// segments. The other's dev_xmit is paired with its own dev_queue, by the
// TCP sequence number both device events carry, not with the first queued
// one: that would depart it under the wrong sequence number, so that its
// arrival (matched by sequence number) found no departure.
func TestPathIPv6DevXmitSkipped(t *testing.T) {
	snd, rcv := &connState{id: 1}, &connState{id: 2}
	snd.peer, rcv.peer = rcv, snd
	snd.path, rcv.path = newPathStats(snd, true), newPathStats(rcv, true)
	hs, hr := newHopTracker(snd), newHopTracker(rcv)
	hs.noIP, hr.noIP = true, true
	us := uint64(1000)
	const size, segs = 20 * 1428, 20
	for i := range 2 {
		seq := uint32(1000 + size*i)
		at := uint64(i) * 10 * us
		hs.step(&ev{t: at, kind: kTCPXmit, flags: 0x10, a: seq, size: size, b: segs})
		hs.step(&ev{t: at + us, kind: kDevQueue, size: 14 + 72 + size, a: segs, c: 6, d: seq})
	}
	// Only the second packet's dev_xmit: the first one's run was skipped
	// (and so was its netif_receive_skb at the receiver).
	const second = 1000 + size
	hs.step(&ev{t: 30 * us, kind: kDevXmit, size: 14 + 72 + size, a: segs, c: 6, d: second})
	hr.step(&ev{t: 31 * us, kind: kDevRecv, size: 72 + size, a: segs, c: 6, d: second})
	hr.step(&ev{t: 32 * us, kind: kTCPRcv, a: second, size: size})
	hr.step(&ev{t: 33 * us, kind: kSockRecv, size: size})
	p := snd.path.report()
	if p == nil || p.DataDeparted != 1 || p.Matched != 1 || p.Segments != 1 {
		t.Fatalf("path %+v: want the second packet departed, matched and followed to the reader", p)
	}
}
