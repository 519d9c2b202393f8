// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"math"

	"github.com/magnet-tracer/magnet/internal/benchstat"
)

// Stat is the mean of repeated measurements with the half-width of its 95 %
// confidence interval (Student t, n-1 degrees of freedom).
type Stat struct {
	Mean float64 `json:"mean"`
	CI95 float64 `json:"ci95"` // half-width; 0 when n < 2
	N    int     `json:"n"`
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
	return Stat{Mean: mean, CI95: benchstat.T975(n-1) * sd / math.Sqrt(float64(n)), N: n}
}
