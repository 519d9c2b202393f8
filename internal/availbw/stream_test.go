// SPDX-License-Identifier: Apache-2.0

package availbw

import (
	"math"
	"strings"
	"testing"
)

// synth makes a stream of n packets sent gap ns apart whose one-way delay
// is delay(i) ns.
func synth(n int, gap int64, delay func(i int) float64) (StreamSpec, SendReport, []Sample) {
	spec := StreamSpec{ID: 7, Count: n, Size: 1000, GapNs: gap}
	const t0 = 1_000_000_000
	var ss []Sample
	for i := range n {
		sent := t0 + int64(i)*gap
		ss = append(ss, Sample{Seq: uint32(i), Sent: sent, Recv: sent + 5_000_000 + int64(delay(i))})
	}
	rep := SendReport{ID: 7, Sent: n, First: t0, Last: t0 + int64(n-1)*gap}
	return spec, rep, ss
}

func TestAnalyzeFlat(t *testing.T) {
	// 100 µs gaps, delays jittering by ±3 µs without a trend.
	spec, rep, ss := synth(100, 100_000, func(i int) float64 { return float64((i*7919)%7-3) * 1000 })
	st := Analyze(spec, rep, ss)
	if st.Trend != Flat {
		t.Fatalf("trend %v (pdt %.2f, slope %g), want flat", st.Trend, st.PDT, st.Slope)
	}
	if math.Abs(st.SendRate-80e6) > 1 {
		t.Errorf("send rate %v, want 80 Mb/s (1000-byte packets every 100 µs)", st.SendRate)
	}
	if st.Received != 100 || st.Coalesced {
		t.Errorf("received %d, coalesced %v", st.Received, st.Coalesced)
	}
}

func TestAnalyzeIncreasing(t *testing.T) {
	// The delay grows by 5 µs a packet: arrivals 105 µs apart instead of
	// 100, a slope of 0.05 and an arrival rate 1/1.05 of the send rate.
	spec, rep, ss := synth(100, 100_000, func(i int) float64 { return float64(i) * 5000 })
	st := Analyze(spec, rep, ss)
	if st.Trend != Increasing || st.PDT < 0.99 {
		t.Fatalf("trend %v, pdt %.2f; want increasing, pdt 1", st.Trend, st.PDT)
	}
	if math.Abs(st.Slope-0.05) > 1e-9 {
		t.Errorf("slope %g, want 0.05", st.Slope)
	}
	if want := 80e6 / 1.05; math.Abs(st.RecvRate-want) > 1 {
		t.Errorf("recv rate %v, want %v", st.RecvRate, want)
	}
	if want := 80e6 / 1.05; math.Abs(st.GapRate-want) > 1 {
		t.Errorf("gap rate %v, want %v", st.GapRate, want)
	}
}

func TestAnalyzeOutlierDoesNotMakeATrend(t *testing.T) {
	// One packet delayed by 2 ms (a context switch between timestamp and
	// send) in a flat stream: the medians of the PDT and the refit of the
	// slope both ignore it.
	spec, rep, ss := synth(100, 100_000, func(i int) float64 {
		if i == 97 {
			return 2e6
		}
		return float64(i%3) * 500
	})
	st := Analyze(spec, rep, ss)
	if st.Trend != Flat || math.Abs(st.Slope) > 1e-4 {
		t.Fatalf("trend %v, slope %g; want flat, slope about 0", st.Trend, st.Slope)
	}
}

func TestAnalyzeRejectsOffRate(t *testing.T) {
	// The sender took 3 % longer than asked.
	spec, rep, ss := synth(100, 100_000, func(int) float64 { return 0 })
	rep.Last = rep.First + int64(float64(rep.Last-rep.First)*1.03)
	st := Analyze(spec, rep, ss)
	if st.Trend != Rejected || !strings.Contains(st.Rejected, "instead of") {
		t.Fatalf("trend %v (%q), want rejected for its rate", st.Trend, st.Rejected)
	}
	// 1.5 % is within the 2 % allowed.
	rep.Last = rep.First + 99*100_000*1015/1000
	if st := Analyze(spec, rep, ss); st.Trend == Rejected {
		t.Fatalf("rejected at 1.5 %% off: %s", st.Rejected)
	}
	// A train is not held to its rate.
	rep.Last = rep.First + 3*int64(99*100_000)
	if st := analyze(spec, rep, ss, true); st.Trend == Rejected {
		t.Fatalf("train rejected: %s", st.Rejected)
	}
}

func TestAnalyzeRejectsIncomplete(t *testing.T) {
	spec, rep, ss := synth(100, 100_000, func(int) float64 { return 0 })
	rep.Sent = 60
	if st := Analyze(spec, rep, ss); st.Trend != Rejected || !strings.Contains(st.Rejected, "60 of 100") {
		t.Fatalf("trend %v (%q), want rejected: sent 60 of 100", st.Trend, st.Rejected)
	}
	rep.Sent, rep.Refused = 0, "rate above the limit"
	if st := Analyze(spec, rep, ss); st.Trend != Rejected || !strings.Contains(st.Rejected, "refused") {
		t.Fatalf("trend %v (%q), want refused", st.Trend, st.Rejected)
	}
}

func TestAnalyzeHeavyLossIsIncreasing(t *testing.T) {
	spec, rep, ss := synth(100, 100_000, func(int) float64 { return 0 })
	// Every fifth packet lost: 20 % > MaxLoss.
	var kept []Sample
	for _, s := range ss {
		if s.Seq%5 != 0 {
			kept = append(kept, s)
		}
	}
	if st := Analyze(spec, rep, kept); st.Trend != Increasing {
		t.Fatalf("trend %v with 20 %% loss, want increasing", st.Trend)
	}
}

func TestAnalyzeCoalesced(t *testing.T) {
	// The receiver hands packets up 8 at a time with one time per batch:
	// most gaps are zero. A flat stream is flat on its output rate alone.
	spec, rep, ss := synth(96, 100_000, func(int) float64 { return 0 })
	for i := range ss {
		batchEnd := ss[i-i%8+7].Sent
		ss[i].Recv = batchEnd + 5_000_000
	}
	st := Analyze(spec, rep, ss)
	if !st.Coalesced || st.Trend != Flat {
		t.Fatalf("coalesced %v trend %v, want coalesced and flat", st.Coalesced, st.Trend)
	}
}

func TestAnalyzeDuplicatesAndStrays(t *testing.T) {
	spec, rep, ss := synth(50, 100_000, func(i int) float64 { return float64(i) * 5000 })
	ss = append(ss, ss[3], Sample{Seq: 4000, Sent: 1, Recv: 2})
	st := Analyze(spec, rep, ss)
	if st.Received != 50 || st.Trend != Increasing {
		t.Fatalf("received %d trend %v, want 50 and increasing", st.Received, st.Trend)
	}
}

func TestPDT(t *testing.T) {
	mk := func(d ...float64) []Sample {
		var ss []Sample
		for i, v := range d {
			ss = append(ss, Sample{Seq: uint32(i), Sent: int64(i) * 1000, Recv: int64(i)*1000 + int64(v)})
		}
		return ss
	}
	// Four groups of one sample (sqrt(4) = 2 groups of 2, medians 1.5
	// and 3.5): a steady rise.
	if got, _ := pdt(mk(1, 2, 3, 4)); got != 1 {
		t.Errorf("rising: pdt %v, want 1", got)
	}
	if got, _ := pdt(mk(4, 3, 2, 1)); got != -1 {
		t.Errorf("falling: pdt %v, want -1", got)
	}
	// Nine samples, three groups with medians 10, 30, 10: no net rise.
	if got, rise := pdt(mk(0, 10, 20, 20, 30, 40, 0, 10, 20)); got != 0 || rise != 0 {
		t.Errorf("up and down: pdt %v rise %v, want 0 and 0", got, rise)
	}
}

func TestPacketHeaderRoundTrip(t *testing.T) {
	h := probeHeader{Session: 0x0102030405060708, Stream: 9, Seq: 77, SentNs: 1_700_000_000_123_456_789}
	b := make([]byte, 64)
	h.put(b)
	got, err := parseProbe(b)
	if err != nil || got != h {
		t.Fatalf("parsed %+v, %v; want %+v", got, err, h)
	}
	if _, err := parseProbe(b[:probeHeaderLen-1]); err == nil {
		t.Error("short datagram parsed")
	}
	b[0] = 'X'
	if _, err := parseProbe(b); err == nil {
		t.Error("datagram without the magic parsed")
	}
}

func FuzzParseProbe(f *testing.F) {
	b := make([]byte, probeHeaderLen)
	probeHeader{Session: 1, Stream: 2, Seq: 3, SentNs: 4}.put(b)
	f.Add(b)
	f.Add([]byte("MGBP"))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := parseProbe(data)
		if err != nil {
			return
		}
		out := make([]byte, probeHeaderLen)
		h.put(out)
		if string(out) != string(data[:probeHeaderLen]) {
			t.Fatalf("header %+v does not round-trip", h)
		}
	})
}

func TestFormatRate(t *testing.T) {
	for _, tc := range []struct {
		bps  float64
		want string
	}{
		{94.2e6, "94.2 Mb/s"}, {1.5e9, "1.5 Gb/s"}, {800, "800 b/s"}, {12.5e3, "12.5 kb/s"}, {math.Inf(1), "unbounded"},
	} {
		if got := FormatRate(tc.bps); got != tc.want {
			t.Errorf("FormatRate(%v) = %q, want %q", tc.bps, got, tc.want)
		}
	}
}
