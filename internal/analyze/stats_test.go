// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"fmt"
	"math"
	"testing"
)

func TestDist(t *testing.T) {
	var d Dist
	for i := 1; i <= 1000; i++ {
		d.Add(float64(i))
	}
	d.Add(0)
	d.Add(-3) // counts as zero
	if d.N != 1002 || d.Sum != 500500 || d.Min != 0 || d.Max != 1000 {
		t.Fatalf("count/sum/min/max = %d %v %v %v", d.N, d.Sum, d.Min, d.Max)
	}
	if want := 500500.0 / 1002; math.Abs(d.Mean()-want) > 1e-9 {
		t.Fatalf("mean %v, want %v", d.Mean(), want)
	}
	for _, c := range []struct{ q, want float64 }{{0.5, 500}, {0.99, 990}, {0.1, 99}} {
		if got := d.Quantile(c.q); math.Abs(got-c.want)/c.want > 0.011 {
			t.Errorf("q%.2f = %v, want %v within 1%%", c.q, got, c.want)
		}
	}
	if d.Quantile(0.001) != 0 {
		t.Errorf("lowest quantile %v, want 0 (two zeros)", d.Quantile(0.001))
	}
	var c Dist
	for i := 0; i < 10; i++ {
		c.Add(20000)
	}
	if c.CV() != 0 || c.Quantile(0.5) != 20000 || c.Stddev() != 0 {
		t.Errorf("constant series: cv %v median %v", c.CV(), c.Quantile(0.5))
	}
	var e Dist
	if e.Quantile(0.5) != 0 || e.Mean() != 0 || e.CV() != 0 {
		t.Errorf("empty dist not zero")
	}
}

func TestReorder(t *testing.T) {
	var r reorder
	// Times slightly out of order, as two CPUs' records come from the ring;
	// equal times keep their order.
	in := []uint64{1000, 3000, 2000, 4000, 6000, 5000, 5000}
	for i, tm := range in {
		r.insert(ev{t: tm, size: int32(i)})
	}
	var got []uint64
	var sizes []int32
	for r.n > 0 {
		got = append(got, r.at(0).t)
		sizes = append(sizes, r.at(0).size)
		r.dropFront()
	}
	want := []uint64{1000, 2000, 3000, 4000, 5000, 5000, 6000}
	if fmt.Sprint(got) != fmt.Sprint(want) || sizes[4] != 5 || sizes[5] != 6 {
		t.Fatalf("popped %v (sizes %v), want %v", got, sizes, want)
	}
}

func TestSeriesSpacing(t *testing.T) {
	s := newSeries(kDevXmit)
	for _, tm := range []uint64{1000, 2000, 3000, 2500} { // the last came too late to sort
		s.add(tm, 10)
	}
	s.finish()
	if s.st.Count != 4 || s.st.Bytes != 40 || s.st.gap.N != 3 || s.st.gap.Min != 0 || s.st.gap.Max != 1 {
		t.Fatalf("spacing: n %d min %v max %v (µs)", s.st.gap.N, s.st.gap.Min, s.st.gap.Max)
	}
}

func TestHostWarnings(t *testing.T) {
	src := &source{path: "a.mgt", step: 21}
	close, far := newSeries(kDevXmit), newSeries(kSockSend)
	for _, tm := range []uint64{1000, 1010, 5000} {
		close.add(tm, 100)
	}
	for _, tm := range []uint64{1000, 9000} {
		far.add(tm, 100)
	}
	cs := &connState{src: src}
	cs.layers[kDevXmit-kSockSend] = close
	cs.layers[0] = far
	src.order = []*connState{cs}
	got := hostWarnings([]*source{src})
	if len(got) != 1 || got[0] != "a.mgt: dev_xmit events as close as 10 ns, below this host's clock step of 21 ns: their spacing is the clock's, not the network's" {
		t.Fatalf("warnings %q", got)
	}
	src.step = 0
	if got := hostWarnings([]*source{src}); len(got) != 0 {
		t.Fatalf("unknown clock step must not warn: %q", got)
	}
}

// Received data after quiet periods, on a host whose idle CPUs wake
// slowly, is warned about; sends, busy receive layers and fast hosts are
// not.
func TestWakeWarning(t *testing.T) {
	src := &source{path: "b.mgt", wake: 44800}
	recv, busy, send := newSeries(kDevRecv), newSeries(kTCPRcv), newSeries(kSockSend)
	for _, tm := range []uint64{1000, 2000, 2_502_000} { // ns: a 2.5 ms quiet period
		recv.add(tm, 1448)
	}
	for _, tm := range []uint64{1000, 50_000, 99_000} { // never quiet for 1 ms
		busy.add(tm, 1448)
	}
	for _, tm := range []uint64{1000, 900_000_000} {
		send.add(tm, 100)
	}
	cs := &connState{src: src}
	cs.layers[kDevRecv-kSockSend] = recv
	cs.layers[kTCPRcv-kSockSend] = busy
	cs.layers[0] = send
	src.order = []*connState{cs}
	want := "b.mgt: dev_recv events follow quiet periods (up to 2.5 ms) on a host whose idle CPUs took 45 µs to wake (magnet hostcheck): the first packet after each quiet period may be timestamped up to that late"
	if got := hostWarnings([]*source{src}); len(got) != 1 || got[0] != want {
		t.Fatalf("warnings %q, want %q", got, want)
	}
	src.wake = 6000
	if got := hostWarnings([]*source{src}); len(got) != 0 {
		t.Fatalf("a 6 µs wake-up must not warn: %q", got)
	}
	src.wake = 0
	if got := hostWarnings([]*source{src}); len(got) != 0 {
		t.Fatalf("an unknown wake-up must not warn: %q", got)
	}
}

func TestEventWindowRate(t *testing.T) {
	// 1000 bytes every ms: 8 Mbit/s whatever the window.
	var ts []uint64
	var bs []int64
	for i := 0; i < 10; i++ {
		ts = append(ts, uint64(i)*1e6)
		bs = append(bs, 1000)
	}
	xs, ys := eventWindowRate(ts, bs, 4, 0)
	if len(xs) != 7 {
		t.Fatalf("%d points, want 7 (from the 4th event on)", len(xs))
	}
	for i, y := range ys {
		if math.Abs(y-8) > 1e-9 {
			t.Fatalf("point %d: %v Mbit/s, want 8", i, y)
		}
	}
}
