// SPDX-License-Identifier: Apache-2.0

package availbw

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// StreamSpec is one periodic stream: Count packets of Size bytes (IP
// packet, headers included) whose starts are GapNs apart.
type StreamSpec struct {
	ID    uint32 `json:"id"`
	Count int    `json:"count"`
	Size  int    `json:"size"`
	GapNs int64  `json:"gap_ns"`
}

// Rate is the stream's rate in IP bits per second.
func (s StreamSpec) Rate() float64 {
	if s.GapNs <= 0 {
		return math.Inf(1)
	}
	return float64(s.Size) * 8 * 1e9 / float64(s.GapNs)
}

// Bytes is what the stream puts on the wire, IP headers included.
func (s StreamSpec) Bytes() int64 { return int64(s.Count) * int64(s.Size) }

// gapFor returns the gap between packets of size bytes at rate bit/s.
func gapFor(size int, rate float64) int64 {
	return int64(math.Round(float64(size) * 8 * 1e9 / rate))
}

// SendReport is what the sender says it did for one stream: how many
// packets it sent and when, on its own clock, it sent the first and last.
type SendReport struct {
	ID    uint32 `json:"id"`
	Sent  int    `json:"sent"`
	First int64  `json:"first_ns"`
	Last  int64  `json:"last_ns"`
	// Refused, when set, says why the sender did not send the stream.
	Refused string `json:"refused,omitempty"`
}

// Sample is one received probe packet.
type Sample struct {
	Seq  uint32
	Sent int64 // when it was sent, on the sender's clock (ns)
	Recv int64 // when it arrived, on the receiver's clock (ns)
}

// Trend is a stream's verdict on its one-way delays.
type Trend int

const (
	// Unclear: the test could not tell.
	Unclear Trend = iota
	// Increasing: delays grew and the stream left slower than it was sent:
	// its rate exceeded the available bandwidth.
	Increasing
	// Flat: delays did not grow: the rate was within the available
	// bandwidth.
	Flat
	// Rejected: the stream does not count (see Stream.Rejected).
	Rejected
)

func (t Trend) String() string {
	switch t {
	case Increasing:
		return "increasing"
	case Flat:
		return "flat"
	case Rejected:
		return "rejected"
	}
	return "unclear"
}

// MarshalText makes a Trend read as its name in JSON.
func (t Trend) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalText reads a Trend's name back.
func (t *Trend) UnmarshalText(b []byte) error {
	for _, c := range []Trend{Unclear, Increasing, Flat, Rejected} {
		if string(b) == c.String() {
			*t = c
			return nil
		}
	}
	return fmt.Errorf("unknown trend %q", b)
}

// Thresholds of the stream tests.
const (
	// PDTIncreasing and PDTFlat are pathload's thresholds on the
	// pairwise-difference test: above the first, delays increase; below
	// the second, they do not; between, the stream is unclear.
	PDTIncreasing = 0.55
	PDTFlat       = 0.45
	// MaxRateError is how far a stream's actual send rate may differ from
	// the requested one before the stream is rejected.
	MaxRateError = 0.02
	// MaxLoss is the fraction of a stream that may be lost before the loss
	// alone says the rate was too high.
	MaxLoss = 0.10
	// CoalescedShare is the share of near-zero arrival gaps above which
	// the receiver's timestamps are taken to be coalesced.
	CoalescedShare = 0.5
)

// Stream is the analysis of one received stream.
type Stream struct {
	Spec StreamSpec `json:"spec"`
	// SendRate is the rate the sender achieved (bit/s, first to last).
	SendRate float64 `json:"send_bps"`
	// RecvRate is the rate the stream arrived at (bit/s, first to last
	// received packet).
	RecvRate float64 `json:"recv_bps"`
	Sent     int     `json:"sent"`
	Received int     `json:"received"`
	// PDT is pathload's pairwise-difference test on the medians of
	// sqrt(n) groups of one-way delays: +1 when they rise steadily, near
	// 0 when flat.
	PDT float64 `json:"pdt"`
	// Slope is the least-squares slope of the one-way delay against the
	// send time over the last two thirds of the stream, outliers left out:
	// seconds of delay gained per second of stream, which is also the
	// send rate over the arrival rate, less one. A fluid model of a link
	// of capacity C with available bandwidth A below the send rate R gives
	// (R-A)/C. The first third is left out because a token bucket on the
	// path (a shaper, tbf) lets the start of a stream through on credit
	// before the delay starts to grow. Least squares, not a median of
	// pairwise slopes: bursty cross traffic gives the delays a sawtooth,
	// and most pairs of packets fall within one tooth, whose slope is not
	// the trend.
	Slope float64 `json:"slope"`
	// GapRate is the packet size over the median gap between consecutive
	// arrivals: for a train sent faster than the narrow link, that link's
	// capacity, unbiased by cross traffic between a few of its packets or
	// by a token bucket letting its first packets through at once.
	GapRate float64 `json:"gap_bps"`
	// DelayRiseNs is the difference between the median delays of the last
	// and first groups.
	DelayRiseNs float64 `json:"delay_rise_ns"`
	// Coalesced is set when most arrival gaps are near zero: the
	// receiver's timestamps are batched (interrupt coalescing).
	Coalesced bool   `json:"coalesced,omitempty"`
	Trend     Trend  `json:"trend"`
	Rejected  string `json:"rejected,omitempty"`
}

// Analyze judges one stream from what the sender reported and the packets
// that arrived. Samples may be in any order and contain duplicates; only
// Seq below spec.Count counts.
func Analyze(spec StreamSpec, rep SendReport, samples []Sample) Stream {
	return analyze(spec, rep, samples, false)
}

// analyze computes a stream's figures and then judges it. A train (sent
// as fast as the sender can, to time the narrow link) is not held to its
// requested rate.
func analyze(spec StreamSpec, rep SendReport, samples []Sample, train bool) Stream {
	st := Stream{Spec: spec, Sent: rep.Sent}
	ss := clean(samples, spec.Count)
	st.Received = len(ss)
	bits := float64(spec.Size) * 8
	if rep.Sent >= 2 && rep.Last > rep.First {
		st.SendRate = float64(rep.Sent-1) * bits * 1e9 / float64(rep.Last-rep.First)
	}
	if n := len(ss); n >= 2 && ss[n-1].Recv > ss[0].Recv {
		// Packets lost between the first and last received still took
		// their time on the bottleneck, so count by sequence numbers.
		span := float64(ss[n-1].Seq - ss[0].Seq)
		st.RecvRate = span * bits * 1e9 / float64(ss[n-1].Recv-ss[0].Recv)
	}
	if len(ss) >= 8 {
		sendGap := spec.GapNs
		if rep.Sent >= 2 && rep.Last > rep.First {
			// What the sender achieved: a train asks for more than it gets.
			sendGap = max(sendGap, (rep.Last-rep.First)/int64(rep.Sent-1))
		}
		st.Coalesced = coalesced(ss, sendGap)
		st.PDT, st.DelayRiseNs = pdt(ss)
		st.Slope = robustSlope(ss[len(ss)/3:])
		st.GapRate = gapRate(ss, bits)
	}
	switch {
	case rep.Refused != "":
		return st.reject("refused by the server: " + rep.Refused)
	case rep.Sent < spec.Count:
		return st.reject(fmt.Sprintf("sender sent %d of %d packets", rep.Sent, spec.Count))
	case st.SendRate == 0:
		return st.reject("sender's timestamps do not span the stream")
	}
	if want := spec.Rate(); !train && math.Abs(st.SendRate/want-1) > MaxRateError {
		return st.reject(fmt.Sprintf("sent at %s instead of %s", FormatRate(st.SendRate), FormatRate(want)))
	}
	if lost := rep.Sent - st.Received; float64(lost) > MaxLoss*float64(rep.Sent) {
		// Losses this heavy mean a queue overflowed: the rate was too high.
		st.Trend = Increasing
		return st
	}
	if len(ss) < 8 {
		return st.reject(fmt.Sprintf("only %d packets arrived", len(ss)))
	}
	st.Trend = st.judge()
	return st
}

func (st Stream) reject(why string) Stream {
	st.Trend = Rejected
	st.Rejected = why
	return st
}

// judge combines the delay trend with the output rate: a stream is
// increasing when pathload's PDT says so and it arrived slower than it
// was sent (a positive slope), flat when the PDT says so. The fleet
// pools the slopes of its streams too (see search.rising), which bursty
// cross traffic does not fool as it fools the PDT. With coalesced
// timestamps the delays of single packets
// mean nothing, so only the output rate of the whole stream, which
// coalescing blurs by at most one batch at each end, is used.
func (st Stream) judge() Trend {
	if st.Coalesced {
		if st.RecvRate > 0 && st.RecvRate < st.SendRate*(1-2*MaxRateError) {
			return Increasing
		}
		return Flat
	}
	switch {
	case st.PDT >= PDTIncreasing && st.Slope > 0:
		return Increasing
	case st.PDT <= PDTFlat:
		return Flat
	}
	return Unclear
}

// clean returns the samples of sequence numbers below count, sorted by
// sequence number, without duplicates.
func clean(samples []Sample, count int) []Sample {
	ss := make([]Sample, 0, len(samples))
	for _, s := range samples {
		if int64(s.Seq) < int64(count) {
			ss = append(ss, s)
		}
	}
	slices.SortFunc(ss, func(a, b Sample) int { return cmp.Compare(a.Seq, b.Seq) })
	return slices.CompactFunc(ss, func(a, b Sample) bool { return a.Seq == b.Seq })
}

// owd returns a sample's one-way delay. Sender and receiver clocks differ
// by an unknown offset, so only differences of delays mean anything.
func owd(s Sample) float64 { return float64(s.Recv - s.Sent) }

// pdt returns pathload's pairwise-difference test statistic over the
// medians of sqrt(n) consecutive groups of delays, and the rise from the
// first group's median to the last's. Medians keep a single delayed
// packet (a context switch on either host) from deciding the test.
func pdt(ss []Sample) (stat, rise float64) {
	meds := groupMedians(ss)
	var total float64
	for i := 1; i < len(meds); i++ {
		total += math.Abs(meds[i] - meds[i-1])
	}
	rise = meds[len(meds)-1] - meds[0]
	if total == 0 {
		return 0, rise
	}
	return rise / total, rise
}

// groupMedians splits the delays into floor(sqrt(n)) groups of
// consecutive packets and returns each group's median.
func groupMedians(ss []Sample) []float64 {
	g := max(int(math.Sqrt(float64(len(ss)))), 2)
	meds := make([]float64, 0, g)
	buf := make([]float64, 0, len(ss)/g+1)
	for i := range g {
		lo, hi := i*len(ss)/g, (i+1)*len(ss)/g
		buf = buf[:0]
		for _, s := range ss[lo:hi] {
			buf = append(buf, owd(s))
		}
		meds = append(meds, median(buf))
	}
	return meds
}

// gapRate returns bits over the median gap between consecutive arrivals.
func gapRate(ss []Sample, bits float64) float64 {
	gaps := make([]float64, 0, len(ss))
	for i := 1; i < len(ss); i++ {
		if ss[i].Seq == ss[i-1].Seq+1 {
			gaps = append(gaps, float64(ss[i].Recv-ss[i-1].Recv))
		}
	}
	g := median(gaps)
	if g <= 0 {
		return 0
	}
	return bits * 1e9 / g
}

// robustSlope returns the least-squares slope of the delays against the
// send times, fitted twice: the second fit leaves out the packets more
// than outlierMADs median absolute deviations off the first, such as one
// that a context switch on the sender delayed between its timestamp and
// its send.
func robustSlope(ss []Sample) float64 {
	if len(ss) < 3 {
		return 0
	}
	x := make([]float64, len(ss))
	y := make([]float64, len(ss))
	for i, s := range ss {
		x[i] = float64(s.Sent - ss[0].Sent)
		y[i] = owd(s) - owd(ss[0])
	}
	slope, icept := leastSquares(x, y, nil)
	res := make([]float64, len(ss))
	for i := range x {
		res[i] = math.Abs(y[i] - icept - slope*x[i])
	}
	mad := median(slices.Clone(res))
	limit := max(outlierMADs*mad, 1000) // never below 1 µs
	keep := make([]bool, len(ss))
	kept := 0
	for i, r := range res {
		if keep[i] = r <= limit; keep[i] {
			kept++
		}
	}
	if kept < 3 || kept == len(ss) {
		return slope
	}
	slope, _ = leastSquares(x, y, keep)
	return slope
}

// outlierMADs is how far from the first fit a delay may lie, in median
// absolute deviations, and still count in the second.
const outlierMADs = 6

// leastSquares fits y = icept + slope·x over the points keep allows (all
// when keep is nil).
func leastSquares(x, y []float64, keep []bool) (slope, icept float64) {
	var n, mx, my float64
	for i := range x {
		if keep == nil || keep[i] {
			n++
			mx += x[i]
			my += y[i]
		}
	}
	mx /= n
	my /= n
	var sxx, sxy float64
	for i := range x {
		if keep == nil || keep[i] {
			sxx += (x[i] - mx) * (x[i] - mx)
			sxy += (x[i] - mx) * (y[i] - my)
		}
	}
	if sxx == 0 {
		return 0, my
	}
	slope = sxy / sxx
	return slope, my - slope*mx
}

// coalesced reports whether most gaps between arrivals are near zero
// although the packets were sent gapNs apart: the receiving host handed
// them up in batches with one time for the batch. "Near zero" is a tenth
// of the send gap, and never more than 2 µs.
func coalesced(ss []Sample, gapNs int64) bool {
	if len(ss) < 3 || gapNs <= 0 {
		return false
	}
	near := min(float64(gapNs)/10, 2000)
	var zero int
	for i := 1; i < len(ss); i++ {
		if float64(ss[i].Recv-ss[i-1].Recv) < near {
			zero++
		}
	}
	return float64(zero) > CoalescedShare*float64(len(ss)-1)
}

// median returns the median of v, reordering v; 0 for an empty slice.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// FormatRate writes a bit rate with a unit: "94.2 Mb/s".
func FormatRate(bps float64) string {
	switch {
	case math.IsInf(bps, 1):
		return "unbounded"
	case bps >= 1e9:
		return fmt.Sprintf("%.3g Gb/s", bps/1e9)
	case bps >= 1e6:
		return fmt.Sprintf("%.3g Mb/s", bps/1e6)
	case bps >= 1e3:
		return fmt.Sprintf("%.3g kb/s", bps/1e3)
	}
	return fmt.Sprintf("%.0f b/s", bps)
}
