// SPDX-License-Identifier: Apache-2.0

// Package analyze computes what a trace means: how each layer of the stack
// reshapes what the application asked for (MAGNeT's modulation, Table II),
// streaming over the records in bounded memory.
package analyze

import (
	"math"
	"sort"
)

// Dist summarises a distribution in bounded memory: exact count, sum, min,
// max, mean and variance (Welford), and quantiles from a log-bucketed
// histogram with 1% relative precision (values are non-negative).
type Dist struct {
	N        uint64  `json:"count"`
	Sum      float64 `json:"sum"`
	Min      float64 `json:"min"`
	Max      float64 `json:"max"`
	mean, m2 float64
	zeros    uint64
	buckets  map[int32]uint64
}

// bucketBase gives 1% relative precision: bucket i holds [b^i, b^(i+1)).
var logBase = math.Log(1.01)

// Add records one value; negative values count as zero.
func (d *Dist) Add(v float64) {
	if v < 0 {
		v = 0
	}
	if d.N == 0 || v < d.Min {
		d.Min = v
	}
	if d.N == 0 || v > d.Max {
		d.Max = v
	}
	d.N++
	d.Sum += v
	delta := v - d.mean
	d.mean += delta / float64(d.N)
	d.m2 += delta * (v - d.mean)
	if v == 0 {
		d.zeros++
		return
	}
	if d.buckets == nil {
		d.buckets = map[int32]uint64{}
	}
	d.buckets[int32(math.Floor(math.Log(v)/logBase))]++
}

// Mean is the arithmetic mean (0 when empty).
func (d *Dist) Mean() float64 { return d.mean }

// Stddev is the population standard deviation.
func (d *Dist) Stddev() float64 {
	if d.N == 0 {
		return 0
	}
	return math.Sqrt(d.m2 / float64(d.N))
}

// CV is the coefficient of variation, stddev / mean.
func (d *Dist) CV() float64 {
	if d.mean == 0 {
		return 0
	}
	return d.Stddev() / d.mean
}

// Quantile returns the q-quantile (0..1) within 1%, clamped to [Min, Max].
func (d *Dist) Quantile(q float64) float64 {
	if d.N == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(d.N)))
	if rank == 0 {
		rank = 1
	}
	if rank <= d.zeros {
		return 0
	}
	keys := make([]int32, 0, len(d.buckets))
	for k := range d.buckets {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	seen := d.zeros
	for _, k := range keys {
		seen += d.buckets[k]
		if seen >= rank {
			// The bucket's geometric middle.
			v := math.Exp((float64(k) + 0.5) * logBase)
			return math.Min(math.Max(v, d.Min), d.Max)
		}
	}
	return d.Max
}
