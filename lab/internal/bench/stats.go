// SPDX-License-Identifier: Apache-2.0

package bench

import "math"

// Stat is the mean of repeated measurements with the half-width of its 95 %
// confidence interval (Student t, n-1 degrees of freedom).
type Stat struct {
	Mean float64 `json:"mean"`
	CI95 float64 `json:"ci95"` // half-width; 0 when n < 2
	N    int     `json:"n"`
}

// tQuantile975 holds t(0.975, df) for df = 1..30; beyond, the normal 1.96 is
// within 2 % and used instead.
var tQuantile975 = [...]float64{
	12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
	2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
	2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
}

func tValue(df int) float64 {
	if df <= 0 {
		return math.NaN()
	}
	if df <= len(tQuantile975) {
		return tQuantile975[df-1]
	}
	return 1.96
}

// Summarize returns the mean and 95 % confidence interval of xs.
func Summarize(xs []float64) Stat {
	n := len(xs)
	if n == 0 {
		return Stat{}
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	mean := sum / float64(n)
	if n < 2 {
		return Stat{Mean: mean, N: n}
	}
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	sd := math.Sqrt(ss / float64(n-1))
	return Stat{Mean: mean, CI95: tValue(n-1) * sd / math.Sqrt(float64(n)), N: n}
}
