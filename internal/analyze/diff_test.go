// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"math"
	"testing"

	"github.com/magnet-tracer/magnet/internal/export"
)

func distOf(vals ...float64) *Dist {
	var d Dist
	for _, v := range vals {
		d.Add(v)
	}
	return &d
}

// The KS distance of two samples, read off the shared buckets, is the
// exact two-sample statistic when no bucket holds values of both.
func TestKSDistance(t *testing.T) {
	a := distOf(0, 1, 2, 3, 4)
	b := distOf(0, 1, 2, 3, 4)
	if d := ksDistance(a, b); d != 0 {
		t.Errorf("same samples: KS %g, want 0", d)
	}
	c := distOf(10, 20, 30, 40)
	if d := ksDistance(a, c); d != 1 {
		t.Errorf("disjoint samples: KS %g, want 1", d)
	}
	// a: 1,2,3,4 (n 4); b: 3,4,5,6: F_a(2) = 0.5, F_b(2) = 0: 0.5.
	if d := ksDistance(distOf(1, 2, 3, 4), distOf(3, 4, 5, 6)); math.Abs(d-0.5) > 1e-12 {
		t.Errorf("overlapping samples: KS %g, want 0.5", d)
	}
}

func layer(name string, gaps ...float64) *LayerStats {
	l := &LayerStats{Layer: name}
	for _, g := range gaps {
		l.gap.Add(g)
		l.size.Add(1000)
	}
	return l
}

// Two runs whose spacing shifted by 10x differ significantly; the same run
// against itself does not, in any row.
func TestCompare(t *testing.T) {
	var slow, fast []float64
	for i := range 200 {
		slow = append(slow, 1000+float64(i%10))
		fast = append(fast, 100+float64(i%10))
	}
	rep := func(gaps []float64, share float64) *Report {
		return &Report{Traces: []string{"x.mgt"}, Conns: []*ConnReport{{
			Conn:       &export.Conn{ID: 7},
			Layers:     []*LayerStats{layer("sock_send", gaps...)},
			Throughput: &Throughput{AppFirstLast: 8e6 * 1000 / gaps[0]},
			Verdict:    &Verdict{TransferS: 1, Shares: map[string]float64{"app_limited": share, "cwnd_limited": 1 - share}},
		}}}
	}
	same := Compare(rep(slow, 0.9), rep(slow, 0.9))
	if same.Significant != 0 {
		t.Errorf("a run against itself: %d significant differences: %+v", same.Significant, same)
	}
	d := Compare(rep(slow, 0.9), rep(fast, 0.1))
	var spacing *DistDiff
	for i := range d.Dists {
		if d.Dists[i].What == "spacing_us" {
			spacing = &d.Dists[i]
		}
	}
	if spacing == nil || !spacing.Significant || spacing.KS != 1 {
		t.Errorf("spacing 10x apart: %+v, want KS 1, significant", spacing)
	}
	sig := map[string]bool{}
	for _, f := range d.Figures {
		sig[f.Name] = f.Significant
	}
	if !sig["app_bps_first_to_last"] || !sig["share app_limited"] || !sig["share cwnd_limited"] || sig["share rwnd_limited"] {
		t.Errorf("figures: %+v", d.Figures)
	}
}
