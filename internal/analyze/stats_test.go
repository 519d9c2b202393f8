// SPDX-License-Identifier: Apache-2.0

package analyze

import (
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

func TestSeriesReordersWithinWindow(t *testing.T) {
	s := &series{st: &LayerStats{Layer: "x"}}
	// Times slightly out of order, as two CPUs' records come from the ring.
	for _, tm := range []uint64{1000, 3000, 2000, 4000, 6000, 5000} {
		s.add(tm, 10)
	}
	s.finish()
	if s.st.Count != 6 || s.st.Bytes != 60 || s.st.gap.N != 5 || s.st.gap.Min != 1 || s.st.gap.Max != 1 {
		t.Fatalf("spacing after reordering: n %d min %v max %v (µs)", s.st.gap.N, s.st.gap.Min, s.st.gap.Max)
	}
}

func TestHostWarnings(t *testing.T) {
	close := &series{st: &LayerStats{Layer: "dev_xmit"}}
	for _, tm := range []uint64{1000, 1010, 5000} {
		close.add(tm, 100)
	}
	close.finish()
	far := &series{st: &LayerStats{Layer: "sock_send"}}
	for _, tm := range []uint64{1000, 9000} {
		far.add(tm, 100)
	}
	far.finish()
	per := map[key]*series{{0, 1, "dev_xmit"}: close, {0, 1, "sock_send"}: far}
	got := hostWarnings([]string{"a.mgt"}, []float64{21}, per)
	if len(got) != 1 || got[0] != "a.mgt: dev_xmit events as close as 10 ns, below this host's clock step of 21 ns: their spacing is the clock's, not the network's" {
		t.Fatalf("warnings %q", got)
	}
	if got := hostWarnings([]string{"a.mgt"}, []float64{0}, per); len(got) != 0 {
		t.Fatalf("unknown clock step must not warn: %q", got)
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
