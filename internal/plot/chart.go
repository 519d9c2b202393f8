// SPDX-License-Identifier: Apache-2.0

// Package plot draws magnet's charts, without external tools, as
// self-contained SVG or as PNG: axes with units, ticks at round numbers, a
// legend, lines or points. A chart is laid out once into a scene of shapes
// in pixels; the SVG and PNG renderers only draw that scene, so both
// outputs look the same.
package plot

import (
	"fmt"
	"image/color"
	"math"
	"strconv"
	"strings"
)

// Series is one named set of points.
type Series struct {
	Name   string
	X, Y   []float64
	Points bool // draw markers instead of a line
	// Steps draws a step function: each value holds until the next point,
	// for a quantity that changes only at its points (a count, an
	// occupancy), where a line between points would show ramps that never
	// happened.
	Steps bool
}

// Chart is a 2-D chart.
type Chart struct {
	Title          string
	XLabel, YLabel string // with units, e.g. "time (s)"
	Series         []Series
	Width, Height  int    // pixels (SVG user units); 900 × 420 when 0
	NoData         string // shown when no series has points; "no data in this trace" when empty
	// LogX and LogY put an axis on a log scale, for values spread over
	// decades. Values at or below 0 are drawn at the smallest positive one.
	LogX, LogY bool
}

// Palette is the series colours, in order.
var Palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}, {0xff, 0x7f, 0x0e, 0xff},
	{0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff}, {0x17, 0xbe, 0xcf, 0xff},
}

// MarkerOpacity is how opaque a point marker is: overlapping points
// darken, so dense regions show.
const MarkerOpacity = 0.7

var (
	white     = color.RGBA{0xff, 0xff, 0xff, 0xff}
	black     = color.RGBA{0, 0, 0, 0xff} // SVG's default text colour
	gridGrey  = color.RGBA{0xe5, 0xe5, 0xe5, 0xff}
	frameGrey = color.RGBA{0x33, 0x33, 0x33, 0xff}
	boxGrey   = color.RGBA{0xcc, 0xcc, 0xcc, 0xff}
	noteGrey  = color.RGBA{0x88, 0x88, 0x88, 0xff}
)

const (
	marginLeft   = 80
	marginRight  = 20
	marginTop    = 40
	marginBottom = 55
	fontSize     = 12
	titleSize    = 15
)

type point struct{ x, y float64 }

type anchor int

const (
	anchorStart anchor = iota
	anchorMiddle
	anchorEnd
)

// The shapes of a scene, in pixels with y down.
type (
	rectShape struct {
		x, y, w, h  float64
		fill        *color.RGBA // nil: not filled
		fillOpacity float64
		stroke      *color.RGBA // nil: no outline (1 px when set)
	}
	lineShape struct {
		a, b   point
		stroke color.RGBA
		width  float64
	}
	polylineShape struct {
		series string
		pts    []point
		stroke color.RGBA
		width  float64
	}
	markersShape struct {
		series  string // "" for the legend's sample
		pts     []point
		radius  float64
		fill    color.RGBA
		opacity float64
	}
	textShape struct {
		at       point // baseline of the anchor
		s        string
		size     float64
		bold     bool
		anchor   anchor
		vertical bool // rotated −90°, reading upwards
		fill     color.RGBA
	}
)

// scene is a chart laid out: shapes drawn in order over a white page.
type scene struct {
	w, h   int
	shapes []any
}

func (s *scene) add(shape any) { s.shapes = append(s.shapes, shape) }

// layout places every part of the chart. A chart without points says so
// instead of failing, so a report can always show it.
func (c *Chart) layout() *scene {
	w, h := c.Width, c.Height
	if w == 0 || h == 0 {
		w, h = 900, 420
	}
	sc := &scene{w: w, h: h}
	fx, fy := c.scale(c.LogX, func(s Series) []float64 { return s.X }), c.scale(c.LogY, func(s Series) []float64 { return s.Y })
	xmin, xmax, ymin, ymax := c.bounds(fx, fy)
	pw := float64(w - marginLeft - marginRight)
	ph := float64(h - marginTop - marginBottom)
	sx := func(x float64) float64 { return marginLeft + (fx(x)-xmin)/(xmax-xmin)*pw }
	sy := func(y float64) float64 { return marginTop + ph - (fy(y)-ymin)/(ymax-ymin)*ph }
	bottom := float64(marginTop) + ph

	sc.add(rectShape{w: float64(w), h: float64(h), fill: &white, fillOpacity: 1})
	sc.add(textShape{at: point{marginLeft, 22}, s: c.Title, size: titleSize, bold: true, fill: black})
	// Ticks are placed in axis space (log10 of the value on a log axis)
	// and labelled with the value.
	for _, t := range axisTicks(xmin, xmax, 8, c.LogX) {
		x := marginLeft + (t-xmin)/(xmax-xmin)*pw
		sc.add(lineShape{a: point{x, marginTop}, b: point{x, bottom}, stroke: gridGrey, width: 1})
		sc.add(textShape{at: point{x, bottom + 16}, s: tickLabel(t, c.LogX), size: fontSize, anchor: anchorMiddle, fill: black})
	}
	for _, t := range axisTicks(ymin, ymax, 6, c.LogY) {
		y := marginTop + ph - (t-ymin)/(ymax-ymin)*ph
		sc.add(lineShape{a: point{marginLeft, y}, b: point{marginLeft + pw, y}, stroke: gridGrey, width: 1})
		sc.add(textShape{at: point{marginLeft - 6, y + 4}, s: tickLabel(t, c.LogY), size: fontSize, anchor: anchorEnd, fill: black})
	}
	sc.add(rectShape{x: marginLeft, y: marginTop, w: pw, h: ph, stroke: &frameGrey})
	sc.add(textShape{at: point{marginLeft + pw/2, float64(h - 12)}, s: c.XLabel, size: fontSize, anchor: anchorMiddle, fill: black})
	sc.add(textShape{at: point{18, marginTop + ph/2}, s: c.YLabel, size: fontSize, anchor: anchorMiddle, vertical: true, fill: black})

	var drawn []int // series with points, in legend order
	for i, s := range c.Series {
		var pts []point
		for j := range min(len(s.X), len(s.Y)) {
			if finite(fx(s.X[j])) && finite(fy(s.Y[j])) {
				p := point{sx(s.X[j]), sy(s.Y[j])}
				if s.Steps && len(pts) > 0 && !s.Points {
					pts = append(pts, point{p.x, pts[len(pts)-1].y})
				}
				pts = append(pts, p)
			}
		}
		if len(pts) == 0 {
			continue
		}
		drawn = append(drawn, i)
		col := Palette[i%len(Palette)]
		if s.Points {
			sc.add(markersShape{series: s.Name, pts: pts, radius: 2, fill: col, opacity: MarkerOpacity})
		} else {
			sc.add(polylineShape{series: s.Name, pts: pts, stroke: col, width: 1.5})
		}
	}
	if len(drawn) == 0 {
		note := c.NoData
		if note == "" {
			note = "no data in this trace"
		}
		sc.add(textShape{at: point{marginLeft + pw/2, marginTop + ph/2}, s: note, size: fontSize, anchor: anchorMiddle, fill: noteGrey})
		return sc
	}
	// The legend, as wide as its longest name, in the corner of the plot
	// area where it hides the least data (top right when all are alike).
	widest := 0.0
	for _, i := range drawn {
		widest = math.Max(widest, textWidth(c.Series[i].Name, fontSize, false))
	}
	bw, bh := math.Ceil(widest)+36, float64(16*len(drawn)+6)
	box := legendCorner(sc.shapes, bw, bh, marginLeft+2, marginTop+2, marginLeft+pw-2-bw, marginTop+ph-2-bh)
	sc.add(rectShape{x: box.x, y: box.y, w: bw, h: bh, fill: &white, fillOpacity: 0.85, stroke: &boxGrey})
	for k, i := range drawn {
		ly := box.y + float64(12+16*k)
		col := Palette[i%len(Palette)]
		if c.Series[i].Points {
			sc.add(markersShape{pts: []point{{box.x + 14, ly - 4}}, radius: 3, fill: col, opacity: 1})
		} else {
			sc.add(rectShape{x: box.x + 8, y: ly - 5, w: 12, h: 3, fill: &col, fillOpacity: 1})
		}
		sc.add(textShape{at: point{box.x + 26, ly}, s: c.Series[i].Name, size: fontSize, fill: black})
	}
	return sc
}

// legendCorner picks the top-left corner of a w × h legend among the plot
// area's four corners (left, top, right and bottom are the extreme corner
// positions): the one covering the fewest data points, lines sampled
// every few pixels.
func legendCorner(shapes []any, w, h, left, top, right, bottom float64) point {
	corners := []point{{right, top}, {left, top}, {right, bottom}, {left, bottom}}
	hidden := make([]int, len(corners))
	count := func(p point) {
		for i, c := range corners {
			if p.x >= c.x-4 && p.x <= c.x+w+4 && p.y >= c.y-4 && p.y <= c.y+h+4 {
				hidden[i]++
			}
		}
	}
	for _, s := range shapes {
		switch s := s.(type) {
		case markersShape:
			for _, p := range s.pts {
				count(p)
			}
		case polylineShape:
			for j, p := range s.pts {
				count(p)
				if j == 0 {
					continue
				}
				q := s.pts[j-1]
				n := int(math.Hypot(p.x-q.x, p.y-q.y) / 4)
				for k := 1; k < n; k++ {
					f := float64(k) / float64(n)
					count(point{q.x + f*(p.x-q.x), q.y + f*(p.y-q.y)})
				}
			}
		}
	}
	best := 0
	for i := range corners {
		if hidden[i] < hidden[best] {
			best = i
		}
	}
	return corners[best]
}

// scale returns the map from a value to axis space: itself, or on a log
// axis its log10, with values at or below 0 raised to the smallest
// positive value of the axis.
func (c *Chart) scale(logScale bool, values func(Series) []float64) func(float64) float64 {
	if !logScale {
		return func(v float64) float64 { return v }
	}
	floor := math.Inf(1)
	for _, s := range c.Series {
		for _, v := range values(s) {
			if v > 0 {
				floor = math.Min(floor, v)
			}
		}
	}
	if math.IsInf(floor, 1) {
		floor = 1
	}
	return func(v float64) float64 { return math.Log10(math.Max(v, floor)) }
}

// bounds is the data's extent in axis space. A linear y axis starts at 0
// and leaves 5% headroom; a log axis spans whole decades.
func (c *Chart) bounds(fx, fy func(float64) float64) (xmin, xmax, ymin, ymax float64) {
	xmin, ymin = math.Inf(1), math.Inf(1)
	xmax, ymax = math.Inf(-1), math.Inf(-1)
	for _, s := range c.Series {
		for i := range min(len(s.X), len(s.Y)) {
			x, y := fx(s.X[i]), fy(s.Y[i])
			if !finite(x) || !finite(y) {
				continue // not drawable: left out
			}
			xmin, xmax = math.Min(xmin, x), math.Max(xmax, x)
			ymin, ymax = math.Min(ymin, y), math.Max(ymax, y)
		}
	}
	if math.IsInf(xmin, 1) {
		return 0, 1, 0, 1
	}
	if c.LogX {
		xmin, xmax = math.Floor(xmin), math.Ceil(xmax)
	}
	if xmax == xmin {
		xmax = xmin + 1
	}
	if c.LogY {
		ymin, ymax = math.Floor(ymin), math.Ceil(ymax)
		if ymax == ymin {
			ymax = ymin + 1
		}
		return xmin, xmax, ymin, ymax
	}
	ymin = math.Min(ymin, 0)
	if ymax <= ymin {
		ymax = ymin + 1
	}
	ymax += (ymax - ymin) * 0.05
	return xmin, xmax, ymin, ymax
}

// finite says whether v can be drawn: not NaN, and small enough that
// differences of two such values do not overflow (no measurement comes near).
func finite(v float64) bool { return math.Abs(v) <= 1e150 }

// axisTicks are the ticks of an axis spanning [lo, hi] in axis space: round
// numbers, or on a log axis each decade (and 2 and 5 times it when the axis
// spans few decades).
func axisTicks(lo, hi float64, n int, logScale bool) []float64 {
	if !logScale {
		return ticks(lo, hi, n)
	}
	var out []float64
	for d := math.Ceil(lo); d <= hi; d++ {
		out = append(out, d)
		if hi-lo <= 3 {
			for _, m := range []float64{2, 5} {
				if t := d + math.Log10(m); t <= hi {
					out = append(out, t)
				}
			}
		}
	}
	return out
}

func tickLabel(t float64, logScale bool) string {
	if logScale {
		return num(math.Pow(10, t))
	}
	return num(t)
}

// ticks returns round-numbered ticks (1, 2, 5 × 10^k) covering [lo, hi].
func ticks(lo, hi float64, n int) []float64 {
	span := hi - lo
	raw := span / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for t := math.Ceil(lo/step) * step; t <= hi+step*1e-9; t += step {
		out = append(out, t)
	}
	return out
}

func num(v float64) string {
	a := math.Abs(v)
	switch {
	case a == 0:
		return "0"
	case a >= 1e9:
		return trim(fmt.Sprintf("%.2fG", v/1e9))
	case a >= 1e6:
		return trim(fmt.Sprintf("%.2fM", v/1e6))
	case a >= 1e4:
		return trim(fmt.Sprintf("%.1fk", v/1e3))
	case a >= 1:
		return trim(fmt.Sprintf("%.2f", v))
	case a < 0.001:
		return strconv.FormatFloat(v, 'g', 2, 64)
	}
	return trim(fmt.Sprintf("%.4f", v))
}

func trim(s string) string {
	unit := ""
	if n := len(s); n > 0 && (s[n-1] == 'G' || s[n-1] == 'M' || s[n-1] == 'k') {
		s, unit = s[:n-1], s[n-1:]
	}
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s + unit
}
