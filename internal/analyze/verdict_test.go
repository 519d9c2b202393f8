// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"math"
	"testing"
)

// vseq builds one sender's events for the verdict, times in µs.
type vseq struct {
	v    verdictTracker
	snap tcpSnap
}

const vmss = 1000

func (s *vseq) write(us float64, n int32) {
	s.v.observe(&ev{t: uint64(us * 1e3), kind: kSockSend, size: n})
}

func (s *vseq) xmit(us float64, seq uint32, n int32) {
	s.v.observe(&ev{t: uint64(us * 1e3), kind: kTCPXmit, a: seq, size: n})
}

func (s *vseq) ack(us float64, seq uint32) {
	s.v.observe(&ev{t: uint64(us * 1e3), kind: kTCPRcv, flags: 0x10, b: seq})
}

func (s *vseq) state(us float64, una, nxt, cwnd, wnd uint32) {
	s.snap = tcpSnap{cwnd: cwnd, sndWnd: wnd, sndUna: una, sndNxt: nxt, mss: vmss}
	sn := s.snap
	s.v.observe(&ev{t: uint64(us * 1e3), kind: kTCPState, snap: &sn})
}

func near(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol {
		t.Errorf("%s = %.4f, want %.4f ± %g", what, got, want, tol)
	}
}

// Three writes 10 ms apart, each sent at once and acknowledged 100 µs
// later: the transfer lasts from the first write to the last ACK (20.1 ms)
// and TCP had data for 3 × 100 µs of it.
func TestVerdictSyntheticAppLimited(t *testing.T) {
	var s vseq
	const base = 5000
	for i := range 3 {
		t0 := float64(i) * 10000
		seq := uint32(base + i*vmss)
		s.xmit(t0, seq, vmss) // a synchronous send: the segment before the call returns
		s.write(t0+1, vmss)
		s.state(t0+100, seq, seq+vmss, 10, 65535)
		s.ack(t0+100, seq+vmss)
	}
	s.write(40000, 0) // a failed call counts for nothing
	vd := s.v.finish(true, 0)
	if vd.Limit != "app_limited" {
		t.Fatalf("limit %s, want app_limited: %+v", vd.Limit, vd)
	}
	near(t, "transfer s", vd.TransferS, 0.0201, 1e-9)
	// Each segment went out 1 µs before its call returned: that µs a
	// call was under way with nothing unsent (sndbuf); the 99 µs to the
	// ACK, nothing more written: the application's.
	near(t, "app_limited", vd.Shares["app_limited"], 20097.0/20100, 1e-9)
	if len(vd.Missing) != 0 {
		t.Errorf("missing %v, want none", vd.Missing)
	}
}

// 10 segments written at once; the peer's window holds 2 and opens by one
// segment per ms; cwnd is far larger: receive-window-limited until the
// last two segments are in flight with nothing left to send.
func TestVerdictSyntheticRwndLimited(t *testing.T) {
	var s vseq
	s.write(0, 10*vmss)
	s.state(0, 0, 0, 100, 2*vmss)
	s.xmit(0, 0, vmss)
	s.xmit(0, vmss, vmss)
	for i := 1; i <= 10; i++ {
		una := uint32(i * vmss)
		s.state(float64(i)*1000, una, uint32(min(i+1, 10)*vmss), 100, 2*vmss)
		s.ack(float64(i)*1000, una)
		if i+1 < 10 {
			s.xmit(float64(i)*1000, uint32((i+1)*vmss), vmss)
		}
	}
	vd := s.v.finish(true, 0)
	if vd.Limit != "rwnd_limited" {
		t.Fatalf("limit %s, want rwnd_limited: %+v", vd.Limit, vd)
	}
	// From 0 to 8 ms unsent data waited behind the window; from 8 ms to
	// the last ACK at 10 ms, everything written was in flight.
	near(t, "rwnd_limited", vd.Shares["rwnd_limited"], 0.8, 1e-9)
	near(t, "transfer s", vd.TransferS, 0.010, 1e-9)
}

// The same, but cwnd (2 segments) is the smaller window, and the episode
// is in loss recovery half of the time.
func TestVerdictSyntheticCwndLimited(t *testing.T) {
	var s vseq
	s.write(0, 10*vmss)
	s.state(0, 0, 0, 2, 1<<20)
	s.xmit(0, 0, vmss)
	s.xmit(0, vmss, vmss)
	for i := 1; i <= 10; i++ {
		una := uint32(i * vmss)
		sn := tcpSnap{cwnd: 2, sndWnd: 1 << 20, sndUna: una, sndNxt: uint32(min(i+1, 10) * vmss), mss: vmss}
		if i <= 5 {
			sn.caState = caRecovery
		}
		s.v.observe(&ev{t: uint64(i) * 1e6, kind: kTCPState, snap: &sn})
		s.ack(float64(i)*1000, una)
		if i+1 < 10 {
			s.xmit(float64(i)*1000, uint32((i+1)*vmss), vmss)
		}
	}
	vd := s.v.finish(true, 3)
	if vd.Limit != "cwnd_limited" {
		t.Fatalf("limit %s, want cwnd_limited: %+v", vd.Limit, vd)
	}
	near(t, "cwnd_limited", vd.Shares["cwnd_limited"], 0.8, 1e-9)
	near(t, "cwnd full", vd.CwndFullShare, 0.8, 1e-9)
	// Recovery from the first snapshot in it (1 ms) to the first out of it
	// (6 ms).
	near(t, "recovery", vd.RecoveryShare, 0.5, 1e-9)
	if vd.RetransSegs != 3 {
		t.Errorf("retransmitted %d, want 3", vd.RetransSegs)
	}
}

// A writer held to 4 segments of buffer: every write is sent at once and
// the next comes only when an ACK frees room, so nothing is ever unsent
// and the buffer stays full.
func TestVerdictSyntheticSndbufLimited(t *testing.T) {
	var s vseq
	s.state(0, 0, 0, 100, 1<<20)
	s.write(0, 4*vmss)
	for i := range 4 {
		s.xmit(0, uint32(i*vmss), vmss)
	}
	for i := 1; i <= 6; i++ {
		una := uint32(i * vmss)
		s.ack(float64(i)*1000, una)
		s.xmit(float64(i)*1000, uint32((i+3)*vmss), vmss)
		s.write(float64(i)*1000+1, vmss)
	}
	for i := 7; i <= 10; i++ {
		s.ack(float64(i)*1000, uint32(i*vmss))
	}
	vd := s.v.finish(true, 0)
	if vd.Limit != "sndbuf_limited" {
		t.Fatalf("limit %s, want sndbuf_limited: %+v", vd.Limit, vd)
	}
	// The writer waited on the buffer until its last write (6 ms); then
	// it had nothing more to write while the rest drained.
	near(t, "sndbuf_limited", vd.Shares["sndbuf_limited"], 0.6, 1e-3)
	near(t, "app_limited", vd.Shares["app_limited"], 0.4, 1e-3)
}

// A non-blocking writer (Go's): each call fills the buffer and returns,
// the next fails with EAGAIN and the writer waits for the socket to turn
// writable. ACKs processed in a burst free the whole buffer at once, so
// everything is acknowledged before the writer's next call: the time was
// still the buffer's, the failed call says so. Only the pause after the
// burst, nothing unacknowledged, is the application's.
func TestVerdictSyntheticSndbufEagain(t *testing.T) {
	var s vseq
	s.state(0, 0, 0, 100, 1<<20)
	for i := range 3 {
		t0 := float64(i) * 10000
		seq := uint32(i * 4 * vmss)
		s.xmit(t0, seq, 4*vmss)
		s.write(t0+1, 4*vmss)
		s.write(t0+2, -eagain)
		// The burst: all four segments acknowledged 9.9 ms later, the
		// writer back 100 µs after it.
		s.ack(t0+9900, seq+4*vmss)
	}
	vd := s.v.finish(true, 0)
	if vd.Limit != "sndbuf_limited" {
		t.Fatalf("limit %s, want sndbuf_limited: %+v", vd.Limit, vd)
	}
	// 29.9 ms in all: three waits of 9.9 ms on the buffer, two pauses of
	// 100 µs with nothing unacknowledged.
	near(t, "transfer_s", vd.TransferS, 0.0299, 1e-9)
	near(t, "sndbuf_limited", vd.Shares["sndbuf_limited"], 3*9.9/29.9, 1e-3)
	near(t, "app_limited", vd.Shares["app_limited"], 0.2/29.9, 1e-3)
}

// Without tcp_state the windows are unknown: no verdict, and the report
// says which group would make one.
func TestVerdictSyntheticMissing(t *testing.T) {
	var s vseq
	s.write(0, 10*vmss)
	s.xmit(0, 0, vmss)
	s.ack(1000, vmss)
	s.xmit(1000, vmss, vmss)
	vd := s.v.finish(false, 0)
	if vd.Limit != "unknown" || len(vd.Missing) != 1 {
		t.Fatalf("limit %s, missing %v; want unknown, tcpstate missing", vd.Limit, vd.Missing)
	}
	var none verdictTracker
	if none.finish(true, 0) != nil {
		t.Error("a verdict for an end that wrote nothing")
	}
}

func (s *vseq) ackWnd(us float64, seq, wnd uint32) {
	s.v.observe(&ev{t: uint64(us * 1e3), kind: kTCPRcv, flags: 0x10, b: seq, c: wnd, d: 1})
}

// The only snapshot says the peer's window ends at byte 3000, but every
// ACK opens it to 1 MiB (tcp_rcv's wnd): cwnd, 2 segments, is what holds
// the 10 back, never the edge the stale snapshot shows.
func TestVerdictSyntheticAckWindow(t *testing.T) {
	var s vseq
	s.write(0, 10*vmss)
	s.state(0, 0, 0, 2, 3*vmss)
	s.xmit(0, 0, vmss)
	s.xmit(0, vmss, vmss)
	for i := 1; i <= 10; i++ {
		s.ackWnd(float64(i)*1000, uint32(i*vmss), 1<<20)
		if i+1 < 10 {
			s.xmit(float64(i)*1000, uint32((i+1)*vmss), vmss)
		}
	}
	vd := s.v.finish(true, 0)
	if vd.Limit != "cwnd_limited" {
		t.Fatalf("limit %s, want cwnd_limited: %+v", vd.Limit, vd)
	}
	near(t, "rwnd_limited", vd.Shares["rwnd_limited"], 0, 0)
	near(t, "cwnd_limited", vd.Shares["cwnd_limited"], 0.8, 1e-9)
}

// A sender seen sending past the last edge known (ACKs it took passed no
// hook: after close()) makes that edge unknown until an ACK shows a new
// one: 1 ms of 10 is neither window's.
func TestVerdictSyntheticStaleEdge(t *testing.T) {
	var s vseq
	s.write(0, 10*vmss)
	s.state(0, 0, 0, 100, 2*vmss)
	s.xmit(0, 0, vmss)
	s.xmit(0, vmss, vmss)
	s.xmit(1000, 2*vmss, vmss) // past the edge at 2000: it moved unseen
	s.ackWnd(2000, 2*vmss, 8*vmss)
	for i := 3; i < 10; i++ {
		s.xmit(2000, uint32(i*vmss), vmss)
	}
	s.ackWnd(10000, 10*vmss, 8*vmss)
	vd := s.v.finish(true, 0)
	near(t, "unknown", vd.Shares["unknown"], 0.1, 1e-9)
	near(t, "rwnd_limited", vd.Shares["rwnd_limited"], 0.1, 1e-9)
}
