// SPDX-License-Identifier: Apache-2.0

// Package benchstat summarizes repeated measurements: the mean and the
// half-width of its 95 % confidence interval (Student t), and whether that
// interval lies on one side of a goal.
package benchstat

import "math"

// Interval is the mean of repeated measurements with the half-width of its
// 95 % confidence interval (Student t, n-1 degrees of freedom).
type Interval struct {
	Mean float64 `json:"mean"`
	Half float64 `json:"ci95"` // half-width; 0 when N < 2
	N    int     `json:"n"`
}

// Lo and Hi are the interval's ends.
func (s Interval) Lo() float64 { return s.Mean - s.Half }

// Hi is the interval's upper end.
func (s Interval) Hi() float64 { return s.Mean + s.Half }

// tQuantile975 holds t(0.975, df) for df = 1..30; beyond, the normal 1.96 is
// within 2 % and used instead.
var tQuantile975 = [...]float64{
	12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
	2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
	2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
}

// T975 is the 97.5 % quantile of Student's t with df degrees of freedom
// (NaN for df < 1).
func T975(df int) float64 {
	if df <= 0 {
		return math.NaN()
	}
	if df <= len(tQuantile975) {
		return tQuantile975[df-1]
	}
	return 1.96
}

// Summarize returns the mean of xs and its 95 % confidence interval; NaN
// values (a repetition that could not be measured) are left out.
func Summarize(xs []float64) Interval {
	var sum float64
	n := 0
	for _, x := range xs {
		if !math.IsNaN(x) {
			sum += x
			n++
		}
	}
	if n == 0 {
		return Interval{Mean: math.NaN()}
	}
	mean := sum / float64(n)
	if n < 2 {
		return Interval{Mean: mean, N: n}
	}
	var ss float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			ss += (x - mean) * (x - mean)
		}
	}
	sd := math.Sqrt(ss / float64(n-1))
	return Interval{Mean: mean, Half: T975(n-1) * sd / math.Sqrt(float64(n)), N: n}
}

// Verdict says where an interval lies against an upper bound.
type Verdict string

// An interval wholly at or below the bound meets it, one wholly above it
// does not, and one that spans it leaves the question open. With one
// measurement (no interval) the verdict is always undecided.
const (
	Met       Verdict = "met"
	NotMet    Verdict = "not met"
	Undecided Verdict = "undecided"
)

// AtMost judges "the true mean is at most bound".
func (s Interval) AtMost(bound float64) Verdict {
	switch {
	case s.N < 2 || math.IsNaN(s.Mean):
		return Undecided
	case s.Hi() <= bound:
		return Met
	case s.Lo() > bound:
		return NotMet
	}
	return Undecided
}
