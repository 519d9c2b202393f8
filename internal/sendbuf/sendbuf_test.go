// SPDX-License-Identifier: Apache-2.0

package sendbuf

import "testing"

func TestTracker(t *testing.T) {
	var tr Tracker
	if tr.Known() || tr.Sent(100, 10, false) || tr.Acked(200) {
		t.Fatal("before the SYN nothing is known")
	}
	// The SYN near the wrap of the sequence space: data starts after it.
	isn := uint32(0xffffff00)
	tr.Sent(isn, 0, true)
	if !tr.Known() {
		t.Fatal("SYN seen: the occupancy is known")
	}
	check := func(want int64) {
		t.Helper()
		if got := tr.Occupancy(); got != want {
			t.Fatalf("occupancy %d, want %d", got, want)
		}
	}
	// TCP sends 1000 bytes before the send call returns.
	if !tr.Sent(isn+1, 1000, false) {
		t.Fatal("data sent grows what is written")
	}
	check(1000)
	if tr.AppWrote(1000) {
		t.Fatal("the send call's 1000 bytes were already counted")
	}
	if !tr.AppWrote(3000) {
		t.Fatal("a later send call grows what is written")
	}
	check(4000)
	// Crossing 2^32 in sequence space.
	if !tr.Acked(isn + 1 + 1500) {
		t.Fatal("an ACK for new data")
	}
	check(2500)
	if tr.Acked(isn + 1 + 1000) {
		t.Fatal("an old ACK changes nothing")
	}
	if tr.Sent(isn+1, 1000, false) {
		t.Fatal("a retransmission below what was written changes nothing")
	}
	tr.Acked(isn + 1 + 4000)
	check(0)
	// An ACK beyond what is known written (the sock_send not yet seen)
	// never makes the occupancy negative.
	tr.Acked(isn + 1 + 5000)
	check(0)
	if tr.AppWrote(0) || tr.AppWrote(-11) {
		t.Fatal("failed or empty sends write nothing")
	}
}

// TestTrackerBeyond4GiB sends 5 GiB with the peer's ACKs 1 MiB behind:
// the occupancy stays 1 MiB all the way, across two wraps of the 32-bit
// sequence space (the first 256 bytes after the SYN).
func TestTrackerBeyond4GiB(t *testing.T) {
	var tr Tracker
	isn := uint32(0xffffff00)
	tr.Sent(isn, 0, true)
	const seg, lag = 64 << 10, 1 << 20
	var total, off int64 = 5 << 30, 0
	for off = 0; off < total; off += seg {
		tr.AppWrote(seg)
		tr.Sent(isn+1+uint32(off), seg, false)
		if off+seg >= lag {
			tr.Acked(isn + 1 + uint32(off+seg-lag))
		}
		if got := tr.Occupancy(); got != min(off+seg, lag) {
			t.Fatalf("at %d B written: occupancy %d, want %d", off+seg, got, min(off+seg, lag))
		}
	}
	tr.Acked(isn + 1 + uint32(total))
	if got := tr.Occupancy(); got != 0 {
		t.Fatalf("everything acknowledged: occupancy %d", got)
	}
	// A late, older ACK from before the last wrap changes nothing.
	if tr.Acked(isn + 1 + uint32(total-seg)) {
		t.Fatal("an old ACK moved what is acknowledged")
	}
}

// TestTrackerAckedBytes: the connection's own count of acknowledged bytes
// (conn_close) covers ACKs the trace has no tcp_rcv for.
func TestTrackerAckedBytes(t *testing.T) {
	var tr Tracker
	if tr.AckedBytes(10) {
		t.Fatal("before the SYN nothing is known")
	}
	tr.Sent(7, 0, true)
	tr.AppWrote(3000)
	tr.Acked(8 + 1000)
	// The connection sent its SYN: the kernel's count includes it.
	if !tr.AckedBytes(1+2500) || tr.Occupancy() != 500 {
		t.Fatalf("occupancy %d after 2500 B (and the SYN) acknowledged, want 500", tr.Occupancy())
	}
	if !tr.AckedBytes(1+3000) || tr.Occupancy() != 0 {
		t.Fatalf("occupancy %d after all 3000 B acknowledged", tr.Occupancy())
	}
	if tr.AckedBytes(2000) {
		t.Fatal("a smaller count acknowledges nothing new")
	}
}

// TestTrackerAccepted: an accepted connection's SYN-ACK is never seen; its
// data starts at its first segment, or at the peer's first acknowledgment
// if that comes first (a server that reads a request before it answers).
func TestTrackerAccepted(t *testing.T) {
	start := uint32(0xfffffff0) // the data crosses the wrap
	// The answer is sent first (a server that speaks first).
	var tr Tracker
	tr.Accepted()
	tr.AppWrote(100)
	if tr.Sent(start, 0, false) || !tr.Known() {
		t.Fatal("the first segment fixes where the data starts")
	}
	tr.Sent(start, 100, false)
	if !tr.Acked(start+60) || tr.Occupancy() != 40 {
		t.Fatalf("occupancy %d after 60 of 100 bytes acknowledged, want 40", tr.Occupancy())
	}
	tr.Acked(start + 100)
	if tr.Occupancy() != 0 {
		t.Fatalf("occupancy %d after all acknowledged", tr.Occupancy())
	}

	// The request comes first, acknowledging the SYN-ACK.
	tr = Tracker{}
	tr.Accepted()
	if tr.Acked(start) || !tr.Known() {
		t.Fatal("the first acknowledgment fixes where the data starts, and acknowledges no data")
	}
	tr.AppWrote(5000)
	tr.Sent(start, 1448, false)
	tr.Acked(start + 1448)
	if tr.Occupancy() != 5000-1448 {
		t.Fatalf("occupancy %d, want %d", tr.Occupancy(), 5000-1448)
	}
	if !tr.AckedBytes(5000) || tr.Occupancy() != 0 {
		t.Fatalf("occupancy %d after conn_close's bytes_acked covers all", tr.Occupancy())
	}

	// Not accepted: nothing but a SYN fixes the start.
	tr = Tracker{}
	if tr.Acked(start) || tr.Sent(start, 10, false) || tr.Known() {
		t.Fatal("without a SYN or Accepted the start is unknown")
	}
}

func TestAcknowledges(t *testing.T) {
	for flags, want := range map[uint8]bool{0x10: true, 0x18: true, 0x11: true, 0x14: false, 0x04: false, 0x02: false, 0x12: true} {
		if Acknowledges(flags) != want {
			t.Errorf("Acknowledges(%#x) = %v", flags, !want)
		}
	}
}
