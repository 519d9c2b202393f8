// SPDX-License-Identifier: Apache-2.0

// Package analyze computes what a trace means: how each layer of the stack
// reshapes what the application asked for (MAGNeT's modulation, Table II),
// streaming over the records in bounded memory.
package analyze

import (
	"math"
)

// Dist summarises a distribution in bounded memory: exact count, sum, min,
// max, mean, and variance (from sums shifted by the first value, which
// keeps it exact enough without a division per value), and quantiles from a histogram with
// 1/128 of an octave per bucket (under 0.8 % relative width; values are
// non-negative). The bucket of a value is read off its floating-point
// exponent and top mantissa bits, which costs a shift instead of a
// logarithm: Add runs once or twice per event of a trace.
type Dist struct {
	N       uint64  `json:"count"`
	Sum     float64 `json:"sum"`
	Min     float64 `json:"min"`
	Max     float64 `json:"max"`
	shift   float64 // the first value
	s1, s2  float64 // sums of (v - shift) and of its square
	zeros   uint64
	octaves *[numOctaves]*[subBuckets]uint64 // allocated at the first value > 0
}

const (
	subBits    = 7
	subBuckets = 1 << subBits
	// Octaves 2^-64 … 2^63 cover every delay in ns or µs and every size;
	// values beyond are counted in the first or last octave.
	numOctaves  = 128
	octaveFirst = -64
)

// bucketOf returns the octave and sub-bucket of v > 0.
func bucketOf(v float64) (int, int) {
	bits := math.Float64bits(v)
	exp := int(bits>>52&0x7ff) - 1023
	sub := int(bits >> (52 - subBits) & (subBuckets - 1))
	o := exp - octaveFirst
	if o < 0 {
		return 0, 0
	}
	if o >= numOctaves {
		return numOctaves - 1, subBuckets - 1
	}
	return o, sub
}

// bucketBound returns the lower bound of bucket (o, sub) plus frac of its width.
func bucketBound(o, sub int, frac float64) float64 {
	return math.Ldexp(1+(float64(sub)+frac)/subBuckets, o+octaveFirst)
}

// Add records one value; negative values count as zero.
func (d *Dist) Add(v float64) {
	if v < 0 {
		v = 0
	}
	switch {
	case d.N == 0:
		d.Min, d.Max, d.shift = v, v, v
	case v < d.Min:
		d.Min = v
	case v > d.Max:
		d.Max = v
	}
	d.N++
	d.Sum += v
	x := v - d.shift
	d.s1 += x
	d.s2 += x * x
	if v == 0 {
		d.zeros++
		return
	}
	if d.octaves == nil {
		d.octaves = new([numOctaves]*[subBuckets]uint64)
	}
	o, sub := bucketOf(v)
	oct := d.octaves[o]
	if oct == nil {
		oct = new([subBuckets]uint64)
		d.octaves[o] = oct
	}
	oct[sub]++
}

// Mean is the arithmetic mean (0 when empty).
func (d *Dist) Mean() float64 {
	if d.N == 0 {
		return 0
	}
	return d.Sum / float64(d.N)
}

// Stddev is the population standard deviation.
func (d *Dist) Stddev() float64 {
	if d.N == 0 {
		return 0
	}
	n := float64(d.N)
	return math.Sqrt(max(d.s2-d.s1*d.s1/n, 0) / n)
}

// CV is the coefficient of variation, stddev / mean.
func (d *Dist) CV() float64 {
	m := d.Mean()
	if m == 0 {
		return 0
	}
	return d.Stddev() / m
}

// each calls fn for every non-empty bucket, smallest first.
func (d *Dist) each(fn func(o, sub int, n uint64) bool) {
	if d.octaves == nil {
		return
	}
	for o, oct := range d.octaves {
		if oct == nil {
			continue
		}
		for sub, n := range oct {
			if n > 0 && !fn(o, sub, n) {
				return
			}
		}
	}
}

// Quantile returns the q-quantile (0..1) within 0.4 %, clamped to [Min, Max].
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
	seen := d.zeros
	v := d.Max
	d.each(func(o, sub int, n uint64) bool {
		seen += n
		if seen >= rank {
			// The bucket's middle.
			v = math.Min(math.Max(bucketBound(o, sub, 0.5), d.Min), d.Max)
			return false
		}
		return true
	})
	return v
}
