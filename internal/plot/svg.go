// SPDX-License-Identifier: Apache-2.0

// Package plot draws magnet's charts as self-contained SVG: axes with units,
// ticks at round numbers, a legend, lines or points. No external tools.
package plot

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// Series is one named set of points.
type Series struct {
	Name   string
	X, Y   []float64
	Points bool // draw markers instead of a line
}

// Chart is a 2-D chart.
type Chart struct {
	Title          string
	XLabel, YLabel string // with units, e.g. "time (s)"
	Series         []Series
	Width, Height  int
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"}

const (
	marginLeft   = 80
	marginRight  = 20
	marginTop    = 40
	marginBottom = 55
)

// WriteSVG draws the chart. A chart without points says so instead of
// failing, so a report can always embed it.
func (c *Chart) WriteSVG(w io.Writer) error {
	if c.Width == 0 {
		c.Width, c.Height = 900, 420
	}
	xmin, xmax, ymin, ymax := c.bounds()
	pw := float64(c.Width - marginLeft - marginRight)
	ph := float64(c.Height - marginTop - marginBottom)
	sx := func(x float64) float64 { return marginLeft + (x-xmin)/(xmax-xmin)*pw }
	sy := func(y float64) float64 { return marginTop + ph - (y-ymin)/(ymax-ymin)*ph }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", c.Width, c.Height, c.Width, c.Height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", marginLeft, esc(c.Title))
	// Grid and ticks.
	for _, t := range ticks(xmin, xmax, 8) {
		x := sx(t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#e5e5e5"/>`+"\n", x, marginTop, x, marginTop+ph)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, marginTop+ph+16, num(t))
	}
	for _, t := range ticks(ymin, ymax, 6) {
		y := sy(t)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e5e5e5"/>`+"\n", marginLeft, y, marginLeft+pw, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", marginLeft-6, y+4, num(t))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%.1f" fill="none" stroke="#333"/>`+"\n", marginLeft, marginTop, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", marginLeft+pw/2, c.Height-12, esc(c.XLabel))
	fmt.Fprintf(&b, `<text transform="translate(18,%.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", marginTop+ph/2, esc(c.YLabel))

	if len(c.Series) > 0 {
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="176" height="%d" fill="white" fill-opacity="0.85" stroke="#ccc"/>`+"\n",
			marginLeft+pw-178, marginTop+2, 16*len(c.Series)+6)
	}
	empty := true
	for i, s := range c.Series {
		color := palette[i%len(palette)]
		if len(s.X) == 0 {
			continue
		}
		empty = false
		if s.Points {
			fmt.Fprintf(&b, `<g fill="%s" fill-opacity="0.7" class="series" data-name="%s">`, color, esc(s.Name))
			for j := range s.X {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2"/>`, sx(s.X[j]), sy(s.Y[j]))
			}
			b.WriteString("</g>\n")
		} else {
			fmt.Fprintf(&b, `<polyline class="series" data-name="%s" fill="none" stroke="%s" stroke-width="1.5" points="`, esc(s.Name), color)
			for j := range s.X {
				fmt.Fprintf(&b, "%.1f,%.1f ", sx(s.X[j]), sy(s.Y[j]))
			}
			b.WriteString(`"/>` + "\n")
		}
		// Legend entry.
		ly := marginTop + 14 + 16*i
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="12" height="3" fill="%s"/><text x="%.1f" y="%d">%s</text>`+"\n",
			marginLeft+pw-170, ly-4, color, marginLeft+pw-152, ly, esc(s.Name))
	}
	if empty {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#888">no data in this trace</text>`+"\n", marginLeft+pw/2, marginTop+ph/2)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func (c *Chart) bounds() (xmin, xmax, ymin, ymax float64) {
	xmin, ymin = math.Inf(1), 0
	xmax, ymax = math.Inf(-1), math.Inf(-1)
	for _, s := range c.Series {
		for i := range s.X {
			xmin, xmax = math.Min(xmin, s.X[i]), math.Max(xmax, s.X[i])
			ymin, ymax = math.Min(ymin, s.Y[i]), math.Max(ymax, s.Y[i])
		}
	}
	if math.IsInf(xmin, 1) {
		return 0, 1, 0, 1
	}
	if xmax == xmin {
		xmax = xmin + 1
	}
	if ymax <= ymin {
		ymax = ymin + 1
	}
	ymax += (ymax - ymin) * 0.05
	return xmin, xmax, ymin, ymax
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

func esc(s string) string { return html.EscapeString(s) }
