// SPDX-License-Identifier: Apache-2.0

package benchstat

import (
	"math"
	"testing"
)

func TestSummarize(t *testing.T) {
	// Mean 2, sample sd 1, n 3: half-width t(2) * 1 / sqrt(3).
	s := Summarize([]float64{1, 2, 3})
	if s.Mean != 2 || s.N != 3 {
		t.Fatalf("Summarize = %+v", s)
	}
	if want := 4.303 / math.Sqrt(3); math.Abs(s.Half-want) > 1e-12 {
		t.Errorf("half-width %v, want %v", s.Half, want)
	}
	if s := Summarize([]float64{5}); s.Mean != 5 || s.Half != 0 || s.N != 1 {
		t.Errorf("one value: %+v", s)
	}
	if s := Summarize(nil); !math.IsNaN(s.Mean) || s.N != 0 {
		t.Errorf("no value: %+v", s)
	}
	// A repetition that could not be measured is left out, not counted as 0.
	if s := Summarize([]float64{1, math.NaN(), 3}); s.Mean != 2 || s.N != 2 {
		t.Errorf("with NaN: %+v", s)
	}
	if T975(40) != 1.96 || !math.IsNaN(T975(0)) {
		t.Error("T975 outside the table")
	}
}

func TestAtMost(t *testing.T) {
	for _, c := range []struct {
		s     Interval
		bound float64
		want  Verdict
	}{
		{Interval{Mean: 3, Half: 1, N: 5}, 5, Met},
		{Interval{Mean: 4, Half: 1, N: 5}, 5, Met}, // the upper end on the bound
		{Interval{Mean: 4.5, Half: 1, N: 5}, 5, Undecided},
		{Interval{Mean: 7, Half: 1, N: 5}, 5, NotMet},
		{Interval{Mean: 1, N: 1}, 5, Undecided},
		{Interval{Mean: math.NaN()}, 5, Undecided},
	} {
		if got := c.s.AtMost(c.bound); got != c.want {
			t.Errorf("%+v AtMost(%v) = %s, want %s", c.s, c.bound, got, c.want)
		}
	}
}
