// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"math"
	"sort"
)

// Diff sets the same figures of two runs side by side: the busiest
// sending connection of each (its verdict, throughput, TCP state) and the
// distributions of each of its layers' sizes and spacings.
type Diff struct {
	A       string       `json:"a"` // the runs' first traces
	B       string       `json:"b"`
	ConnA   uint64       `json:"conn_a"`
	ConnB   uint64       `json:"conn_b"`
	Figures []FigureDiff `json:"figures"`
	Dists   []DistDiff   `json:"distributions"`
	// Significant counts the rows whose difference exceeds the noise.
	Significant int `json:"significant"`
}

// FigureDiff is one number of both runs. A single number per run has no
// spread of its own to judge noise by, so a difference counts as
// significant only beyond a floor: Floor, relative (|B-A| / max(|A|,|B|))
// for rates and times, absolute for shares and counts (which must also
// differ by the relative floor).
type FigureDiff struct {
	Name        string  `json:"name"`
	A           float64 `json:"a"`
	B           float64 `json:"b"`
	Delta       float64 `json:"delta"` // B - A
	Floor       float64 `json:"floor"`
	Relative    bool    `json:"relative"`
	Significant bool    `json:"significant"`
}

// DistDiff compares one distribution of both runs with the two-sample
// Kolmogorov-Smirnov distance KS (the largest gap between their
// cumulative distributions, read off the histograms' shared buckets). It
// is significant when KS exceeds the test's critical value at alpha =
// 0.001 and NoiseFloor, and the medians differ by more than medianFloor:
// KS is blind to scale, so two runs of a paced workload whose narrow
// spacing moved by 2% (timer slack) differ in KS by up to 0.71.
type DistDiff struct {
	Layer       string  `json:"layer"`
	What        string  `json:"what"` // "spacing_us" or "size_bytes"
	NA          uint64  `json:"count_a"`
	NB          uint64  `json:"count_b"`
	MedianA     float64 `json:"median_a"`
	MedianB     float64 `json:"median_b"`
	P99A        float64 `json:"p99_a"`
	P99B        float64 `json:"p99_b"`
	KS          float64 `json:"ks"`
	Critical    float64 `json:"critical"`
	Significant bool    `json:"significant"`
}

// NoiseFloor is the KS distance below which two runs count as the same;
// see DistDiff.
const NoiseFloor = 0.5

// medianFloor is the relative shift of the median a significant
// distribution difference must also have.
const medianFloor = 0.25

// Floors of the single figures: see FigureDiff.
// The same two runs differed by 27% in transfer time, with one
// retransmission against none.
const (
	rateFloor  = 0.5  // relative
	countFloor = 10   // absolute, for counts (and 50% relative)
	shareFloor = 0.15 // absolute
	// srttFloorUs: two runs of one paced workload on an idle veth had
	// srtt medians of 27 and 67 µs (means 38 and 95): wake-up latency of
	// the host, not the path. A smaller difference is not the network's.
	srttFloorUs = 100
)

// mainConn is a run's busiest connection that wrote data, else its
// busiest.
func mainConn(r *Report) *ConnReport {
	for _, c := range r.Conns {
		if c.Verdict != nil {
			return c
		}
	}
	if len(r.Conns) > 0 {
		return r.Conns[0]
	}
	return nil
}

// Compare sets two reports' main connections side by side.
func Compare(a, b *Report) *Diff {
	d := &Diff{}
	if len(a.Traces) > 0 {
		d.A = a.Traces[0]
	}
	if len(b.Traces) > 0 {
		d.B = b.Traces[0]
	}
	ca, cb := mainConn(a), mainConn(b)
	if ca == nil || cb == nil {
		return d
	}
	d.ConnA, d.ConnB = ca.Conn.ID, cb.Conn.ID
	rel := func(name string, x, y float64) {
		f := FigureDiff{Name: name, A: x, B: y, Delta: y - x, Floor: rateFloor, Relative: true}
		if m := math.Max(math.Abs(x), math.Abs(y)); m > 0 {
			f.Significant = math.Abs(y-x)/m > rateFloor
		}
		d.Figures = append(d.Figures, f)
	}
	abs := func(name string, x, y float64) {
		d.Figures = append(d.Figures, FigureDiff{Name: name, A: x, B: y, Delta: y - x, Floor: shareFloor, Significant: math.Abs(y-x) > shareFloor})
	}
	if ca.Throughput != nil && cb.Throughput != nil {
		rel("app_bps_first_to_last", ca.Throughput.AppFirstLast, cb.Throughput.AppFirstLast)
	}
	if ca.TCP != nil && cb.TCP != nil {
		// srtt snapshots are an EWMA (gain 1/8), so consecutive ones are
		// not independent samples and a KS test on them would see noise
		// as signal. Its median is judged like a time, with an absolute
		// floor as well; cwnd, a count, as a distribution.
		sa, sb := ca.TCP.srtt.Quantile(0.5), cb.TCP.srtt.Quantile(0.5)
		f := FigureDiff{Name: "srtt_median_us", A: sa, B: sb, Delta: sb - sa, Floor: rateFloor, Relative: true}
		if m := math.Max(sa, sb); m > 0 {
			f.Significant = math.Abs(sb-sa)/m > rateFloor && math.Abs(sb-sa) > srttFloorUs
		}
		d.Figures = append(d.Figures, f)
		d.Dists = append(d.Dists, distDiff("tcp_state", "cwnd_segments", &ca.TCP.cwnd, &cb.TCP.cwnd))
		x, y := float64(ca.TCP.RetransSegs), float64(cb.TCP.RetransSegs)
		d.Figures = append(d.Figures, FigureDiff{Name: "retransmitted_segments", A: x, B: y, Delta: y - x, Floor: countFloor,
			Significant: math.Abs(y-x) > countFloor && math.Abs(y-x) > rateFloor*math.Max(x, y)})
	}
	if va, vb := ca.Verdict, cb.Verdict; va != nil && vb != nil {
		rel("transfer_s", va.TransferS, vb.TransferS)
		for _, n := range verdictNames[1:] {
			abs("share "+n, va.Shares[n], vb.Shares[n])
		}
	}
	for _, la := range ca.Layers {
		for _, lb := range cb.Layers {
			if la.Layer != lb.Layer {
				continue
			}
			d.Dists = append(d.Dists, distDiff(la.Layer, "spacing_us", &la.gap, &lb.gap), distDiff(la.Layer, "size_bytes", &la.size, &lb.size))
		}
	}
	for _, f := range d.Figures {
		if f.Significant {
			d.Significant++
		}
	}
	for _, x := range d.Dists {
		if x.Significant {
			d.Significant++
		}
	}
	return d
}

func distDiff(layer, what string, a, b *Dist) DistDiff {
	x := DistDiff{Layer: layer, What: what, NA: a.N, NB: b.N, MedianA: a.Quantile(0.5), MedianB: b.Quantile(0.5), P99A: a.Quantile(0.99), P99B: b.Quantile(0.99)}
	if a.N == 0 || b.N == 0 {
		return x
	}
	x.KS = ksDistance(a, b)
	n, m := float64(a.N), float64(b.N)
	x.Critical = 1.949 * math.Sqrt((n+m)/(n*m)) // c(alpha) = sqrt(-ln(alpha/2)/2), alpha 0.001
	shift := 0.0
	if m := math.Max(x.MedianA, x.MedianB); m > 0 {
		shift = math.Abs(x.MedianB-x.MedianA) / m
	}
	x.Significant = x.KS > x.Critical && x.KS > NoiseFloor && shift > medianFloor
	return x
}

// ksDistance is the largest gap between the cumulative distributions of a
// and b at their histograms' bucket edges (both use the same buckets).
func ksDistance(a, b *Dist) float64 {
	type key struct{ o, sub int }
	ca := map[key]uint64{}
	var keys []key
	a.each(func(o, sub int, n uint64) bool { ca[key{o, sub}] += n; keys = append(keys, key{o, sub}); return true })
	cb := map[key]uint64{}
	b.each(func(o, sub int, n uint64) bool {
		if _, ok := ca[key{o, sub}]; !ok {
			keys = append(keys, key{o, sub})
		}
		cb[key{o, sub}] += n
		return true
	})
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].o < keys[j].o || keys[i].o == keys[j].o && keys[i].sub < keys[j].sub
	})
	fa, fb := float64(a.zeros)/float64(a.N), float64(b.zeros)/float64(b.N)
	d := math.Abs(fa - fb)
	var sa, sb = a.zeros, b.zeros
	for _, k := range keys {
		sa += ca[k]
		sb += cb[k]
		d = math.Max(d, math.Abs(float64(sa)/float64(a.N)-float64(sb)/float64(b.N)))
	}
	return d
}
