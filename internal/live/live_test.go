// SPDX-License-Identifier: Apache-2.0

package live

import (
	"math"
	"net/netip"
	"testing"
	"time"
)

const ms = uint64(time.Millisecond)

func near(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol*math.Abs(want)+1e-9 {
		t.Errorf("%s = %g, want %g (±%g%%)", what, got, want, tol*100)
	}
}

func newConn(t *testing.T) (*Table, *Conn) {
	t.Helper()
	cfg := DefaultConfig
	if err := cfg.Check(); err != nil {
		t.Fatal(err)
	}
	tb := NewTable(cfg)
	info := Info{Proto: 6, Local: netip.MustParseAddrPort("10.0.0.1:5201"), Remote: netip.MustParseAddrPort("10.0.0.2:40000")}
	return tb, tb.Open(42, 1*ms, info)
}

// TestEventWindow is MAGNET 2.0's figure: over the last 1000 receive
// events, the bytes of all but the oldest over the time they span.
func TestEventWindow(t *testing.T) {
	tb, c := newConn(t)
	start := 1000 * ms
	for i := range 1500 {
		// 1000 bytes every ms, then the last 500 at 2000 bytes.
		n := int64(1000)
		if i >= 1000 {
			n = 2000
		}
		c.Traffic(App, Recv, start+uint64(i)*ms, n)
	}
	now := start + 1499*ms
	w, err := tb.Resolve(Window{})
	if err != nil {
		t.Fatal(err)
	}
	r := c.Rate(App, Recv, 1000, 0, now)
	// Events 500..1499: the oldest (1000 bytes) opens the window; 499 of
	// 1000 bytes and 500 of 2000 bytes over 999 ms.
	if r.Events != 1000 || r.SpanNs != int64(999*ms) || r.Bytes != 499*1000+500*2000 {
		t.Fatalf("window of 1000 events: %+v", r)
	}
	near(t, "bps", r.BPS, float64(499*1000+500*2000)*8/0.999, 1e-9)
	if r := c.Rate(App, Recv, 10, 0, now); r.Bytes != 9*2000 || r.SpanNs != int64(9*ms) {
		t.Fatalf("window of 10 events: %+v", r)
	}
	snap := c.Snapshot(w, now)
	if snap.App.Recv.ByEvents != c.Rate(App, Recv, 1000, 0, now) {
		t.Errorf("snapshot by_events %+v differs from Rate", snap.App.Recv.ByEvents)
	}
	if snap.App.Recv.Bytes != 1000*1000+500*2000 || snap.App.Recv.Events != 1500 {
		t.Errorf("totals %+v", snap.App.Recv)
	}
	near(t, "average", snap.App.Recv.AverageBPS, float64(1000*1000+500*2000)*8/1.499, 1e-9)
	if snap.App.Send.Events != 0 || snap.Wire.Recv.Events != 0 {
		t.Errorf("other streams should be empty: %+v %+v", snap.App.Send, snap.Wire.Recv)
	}
	if c.MainDir(App) != Recv {
		t.Error("main direction should be recv")
	}
	// Quiet: the event window keeps its value, the time window falls to 0.
	later := now + 5000*ms
	if r := c.Rate(App, Recv, 1000, 0, later); r.BPS == 0 {
		t.Error("event window should keep its value when quiet")
	}
	if r := c.Rate(App, Recv, 0, time.Second, later); r.BPS != 0 || r.Events != 0 {
		t.Errorf("time window when quiet: %+v", r)
	}
}

func TestEventWindowOutOfOrder(t *testing.T) {
	var w eventWindow
	w.max = 4
	// Drain order differs from time order across CPUs.
	for _, s := range []sample{{10, 1}, {30, 3}, {20, 2}, {50, 5}, {40, 4}} {
		w.add(s.t, s.n)
	}
	// Kept: 30, 20, 50, 40; the oldest by time (20) opens the window.
	bytes, n, span := w.rate(4)
	if bytes != 3+5+4 || n != 4 || span != 30 {
		t.Fatalf("got %d bytes, %d events, span %d", bytes, n, span)
	}
	if bytes, n, _ := w.rate(100); n != 4 || bytes != 12 {
		t.Fatalf("k beyond what is kept: %d bytes, %d events", bytes, n)
	}
	var one eventWindow
	one.max = 10
	one.add(5, 100)
	if bytes, n, span := one.rate(10); bytes != 0 || n != 1 || span != 0 {
		t.Fatal("one event is no rate")
	}
}

func TestTimeWindow(t *testing.T) {
	_, c := newConn(t)
	start := 100_000 * ms
	// 1000 bytes every 10 ms for 3 s: 800 kbit/s.
	for i := range 300 {
		c.Traffic(Wire, Send, start+uint64(i)*10*ms, 1000)
	}
	now := start + 2999*ms
	r := c.Rate(Wire, Send, 0, time.Second, now)
	near(t, "bps over 1 s", r.BPS, 800e3, 0.02)
	if r.SpanNs != int64(time.Second) {
		t.Errorf("span %d", r.SpanNs)
	}
	r = c.Rate(Wire, Send, 0, 2*time.Second, now)
	near(t, "bps over 2 s", r.BPS, 800e3, 0.02)
	// History is 10 s: a sample older than that is forgotten.
	c.Traffic(Wire, Send, start+20_000*ms, 1000)
	if r := c.Rate(Wire, Send, 0, 10*time.Second, start+20_000*ms); r.Events != 1 {
		t.Errorf("after 17 s of silence, the 10 s window holds %d events, want 1", r.Events)
	}
	// Late samples land in their bucket, or the oldest kept.
	var tw timeWindow
	tw.res, tw.history = 10, 100
	tw.add(1000, 1)
	tw.add(1050, 1)
	tw.add(1020, 1) // late, between the two
	tw.add(5, 1)    // far too late: counted in the oldest bucket kept
	if b, n := tw.sum(1059, 100); b != 4 || n != 4 {
		t.Errorf("sum = %d bytes %d events, want 4 4", b, n)
	}
	if b, _ := tw.sum(1059, 30); b != 1 {
		t.Errorf("last 30 ns: %d bytes, want 1 (the bucket of 1050)", b)
	}
}

func TestTCPAndCounters(t *testing.T) {
	tb, c := newConn(t)
	c.State(TCPSample{TimeNs: 10 * ms, Cwnd: 10, SrttUs: 100, MSS: 1448, RateDelivered: 10, RateIntervalUs: 1000, AppLimited: true, State: "ESTABLISHED"})
	c.State(TCPSample{TimeNs: 5 * ms, Cwnd: 99}) // older: ignored
	for i := range 5 {
		c.Retransmit(uint64(1000+i)*ms, 1448)
	}
	c.Drop(1002*ms, "TCP_OLD_DATA")
	c.Drop(1003*ms, "TCP_OLD_DATA")
	c.Drop(1003*ms, "NO_SOCKET")
	w, _ := tb.Resolve(Window{})
	s := c.Snapshot(w, 1500*ms)
	if s.State == nil || s.State.Cwnd != 10 || !s.State.DeliveryAppLimited || s.State.State != "ESTABLISHED" {
		t.Fatalf("tcp_state %+v", s.State)
	}
	near(t, "delivery rate", s.State.DeliveryRateBPS, 10*1448*8/0.001, 1e-12)
	if s.Retransmits.Count != 5 || s.Retransmits.Bytes != 5*1448 {
		t.Errorf("retransmits %+v", s.Retransmits)
	}
	near(t, "retransmits/s", s.Retransmits.PerSecond, 5, 1e-9)
	if s.Drops.Count != 3 || s.Drops.ByReason["TCP_OLD_DATA"] != 2 || s.Drops.ByReason["NO_SOCKET"] != 1 {
		t.Errorf("drops %+v", s.Drops)
	}
	if s.Local != "10.0.0.1:5201" || s.Proto != "tcp" {
		t.Errorf("identity %s %s", s.Proto, s.Local)
	}
	if DeliveryRate(1, 1, 0) != 0 {
		t.Error("no interval, no rate")
	}
}

func TestSendBuffer(t *testing.T) {
	tb, c := newConn(t)
	w, _ := tb.Resolve(Window{})
	if c.Snapshot(w, 0).SendBuffer != nil {
		t.Fatal("no SYN, no send buffer")
	}
	c.Segment(1000, 0, true)
	c.Traffic(App, Send, 2*ms, 5000)
	c.Ack(1001 + 2000)
	sb := c.Snapshot(w, 3*ms).SendBuffer
	if sb == nil || sb.Bytes != 3000 || sb.MaxBytes != 5000 {
		t.Fatalf("send buffer %+v", sb)
	}
}

func TestExpire(t *testing.T) {
	cfg := DefaultConfig
	cfg.MaxConns = 10
	cfg.Grace = time.Second
	tb := NewTable(cfg)
	for id := uint64(1); id <= 5; id++ {
		tb.Open(id, id*ms, Info{})
	}
	tb.Close(2, 10*ms)
	tb.Expire(500 * ms)
	if tb.Get(2) == nil {
		t.Fatal("closed within the grace period: kept")
	}
	tb.Expire(1011 * ms)
	if tb.Get(2) != nil {
		t.Fatal("closed past the grace period: forgotten")
	}
	if n, open := tb.Len(); n != 4 || open != 4 {
		t.Fatalf("len %d open %d", n, open)
	}
	// Over the cap: closed ones first, then the least recently active.
	for id := uint64(6); id <= 12; id++ {
		tb.Track(id, 2000*ms+id)
	}
	tb.Close(12, 2100*ms)
	tb.Track(1, 3000*ms) // 1 is active again
	tb.Expire(2200 * ms)
	n, open := tb.Len()
	if n != 9 || tb.Evicted() != 2 || tb.Get(12) != nil || tb.Get(3) != nil || tb.Get(1) == nil {
		t.Fatalf("after eviction: %d tracked, %d evicted, 12:%v 3:%v 1:%v", n, tb.Evicted(), tb.Get(12), tb.Get(3), tb.Get(1))
	}
	if open != 9 {
		t.Fatalf("open %d, want 9", open)
	}
}

func TestResolve(t *testing.T) {
	tb := NewTable(DefaultConfig)
	w, err := tb.Resolve(Window{})
	if err != nil || w.Events != 1000 || w.Span != time.Second {
		t.Fatalf("defaults: %+v %v", w, err)
	}
	for _, bad := range []Window{{Events: 1}, {Events: 1001}, {Span: time.Microsecond}, {Span: time.Minute}} {
		if _, err := tb.Resolve(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	bad := DefaultConfig
	bad.Window = time.Hour
	if bad.Check() == nil {
		t.Error("a window longer than the history accepted")
	}
}
