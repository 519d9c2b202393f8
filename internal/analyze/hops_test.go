// SPDX-License-Identifier: Apache-2.0

package analyze

import "testing"

func TestHopTracker(t *testing.T) {
	h := newHopTracker(&connState{})
	us := uint64(1000)
	evs := []ev{
		// Active open: the SYN-ACK reaches IP but never tcp_rcv.
		{t: 0, kind: kTCPXmit, flags: 0x02},
		{t: 1 * us, kind: kIPSend}, {t: 2 * us, kind: kDevQueue}, {t: 3 * us, kind: kDevXmit},
		{t: 10 * us, kind: kDevRecv}, {t: 11 * us, kind: kIPRecv},
		{t: 12 * us, kind: kTCPXmit, flags: 0x10},
		{t: 13 * us, kind: kIPSend}, {t: 15 * us, kind: kDevQueue}, {t: 18 * us, kind: kDevXmit},
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
		{t: 1 * us, kind: kIPSend}, {t: 4 * us, kind: kDevXmit},
		{t: 10 * us, kind: kTCPXmit, flags: 0x18, size: 100},
		{t: 12 * us, kind: kIPSend}, {t: 13 * us, kind: kDevXmit},
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
	ps.depart(&pending{t: 10 * ms, seg: 1, ipid: 100, hasID: true, gso: 4, size: 5792})
	ps.depart(&pending{t: 11 * ms, seg: 2, ipid: 104, hasID: true, gso: 1, size: 1448})
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
	other.depart(&pending{t: 10 * ms, seg: 7, ipid: 9, hasID: true, gso: 1, size: 1})
	if d, ok := other.takeID(9, 9*ms); !ok || d.seg != 7 {
		t.Errorf("on two clocks an arrival may read earlier than its departure: %+v %v", d, ok)
	}
}
