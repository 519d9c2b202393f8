// SPDX-License-Identifier: Apache-2.0

package plot

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"strings"
	"testing"
)

// near says whether c is within tol of want in every channel.
func near(c, want color.RGBA, tol int) bool {
	d := func(a, b uint8) bool { return int(a)-int(b) <= tol && int(b)-int(a) <= tol }
	return d(c.R, want.R) && d(c.G, want.G) && d(c.B, want.B)
}

// overWhite is col at opacity over a white page.
func overWhite(col color.RGBA, opacity float64) color.RGBA {
	mix := func(v uint8) uint8 { return uint8(float64(v)*opacity + 255*(1-opacity) + 0.5) }
	return color.RGBA{mix(col.R), mix(col.G), mix(col.B), 0xff}
}

// countColour counts the pixels of img inside r, outside skip, near want.
func countColour(img image.Image, r, skip image.Rectangle, want color.RGBA) int {
	n := 0
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if !image.Pt(x, y).In(skip) && near(color.RGBAModel.Convert(img.At(x, y)).(color.RGBA), want, 4) {
				n++
			}
		}
	}
	return n
}

// plotArea is the chart's plot area in PNG pixels, less the frame, and
// its legend.
func plotArea(c *Chart) (area, legend image.Rectangle) {
	for _, s := range c.layout().shapes {
		if r, ok := s.(rectShape); ok && r.stroke != nil && *r.stroke == boxGrey {
			legend = scaled(int(r.x)-1, int(r.y)-1, int(r.x+r.w)+2, int(r.y+r.h)+2)
		}
	}
	return scaled(marginLeft+2, marginTop+2, c.Width-marginRight-2, c.Height-marginBottom-2), legend
}

// scaled is a rectangle of chart pixels in PNG pixels.
func scaled(x0, y0, x1, y1 int) image.Rectangle {
	return image.Rect(x0*PNGScale, y0*PNGScale, x1*PNGScale, y1*PNGScale)
}

// TestWritePNG decodes the PNG: its size, a white page, and each series'
// colour inside the plot area (a line in its colour, markers in their
// colour over white at the marker opacity).
func TestWritePNG(t *testing.T) {
	c := &Chart{Title: "a < b", XLabel: "time (s)", YLabel: "size (bytes)", Width: 600, Height: 300, Series: []Series{
		{Name: "app", X: []float64{0, 1, 2, 3}, Y: []float64{1, 4, 2, 3}},
		{Name: "wire", X: []float64{0.5, 1.5, 2.5}, Y: []float64{1.5, 2.5, 1.5}, Points: true}, // clear of grid lines
	}}
	var b bytes.Buffer
	if err := c.WritePNG(&b); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if got := img.Bounds().Size(); got != image.Pt(1200, 600) {
		t.Fatalf("size %v, want 1200x600 (twice the chart)", got)
	}
	if got := color.RGBAModel.Convert(img.At(3, 3)).(color.RGBA); got != white {
		t.Errorf("page corner %v, want white", got)
	}
	area, legend := plotArea(c)
	if legend.Empty() {
		t.Fatalf("no legend")
	}
	if n := countColour(img, area, legend, Palette[0]); n < 200 {
		t.Errorf("line series: %d pixels in its colour in the plot area", n)
	}
	if n := countColour(img, area, legend, overWhite(Palette[1], MarkerOpacity)); n < 3*20 {
		t.Errorf("marker series: %d pixels in its colour in the plot area, want >= 20 per marker", n)
	}
	// Text is drawn: dark pixels under the x axis (tick labels, label).
	below := scaled(marginLeft, c.Height-marginBottom+4, c.Width-marginRight, c.Height)
	if n := countColour(img, below, image.Rectangle{}, black); n < 100 {
		t.Errorf("%d black pixels below the axis: labels not drawn", n)
	}
	// The vertical y label is drawn left of the tick labels.
	left := scaled(0, marginTop, 30, c.Height-marginBottom)
	if n := countColour(img, left, image.Rectangle{}, black); n < 50 {
		t.Errorf("%d black pixels left of the axis: y label not drawn", n)
	}
}

// TestPNGEmptyChart: a chart without points is a page with a note, not
// an error.
func TestPNGEmptyChart(t *testing.T) {
	c := &Chart{Title: "x", Width: 400, Height: 200, Series: []Series{{Name: "none"}}}
	img, err := c.Render(1)
	if err != nil {
		t.Fatal(err)
	}
	mid := image.Rect(marginLeft+2, marginTop+2, 400-marginRight-2, 200-marginBottom-2)
	for _, col := range Palette {
		if n := countColour(img, mid, image.Rectangle{}, col); n != 0 {
			t.Errorf("series colour %v in an empty chart", col)
		}
	}
	if n := countColour(img, mid, image.Rectangle{}, noteGrey); n == 0 {
		t.Errorf("empty chart does not say so")
	}
}

func BenchmarkWritePNG(b *testing.B) {
	c := &Chart{Title: "dense", Series: []Series{{Name: "points", Points: true}, {Name: "line"}}}
	for i := 0; i < 20000; i++ {
		c.Series[0].X = append(c.Series[0].X, float64(i))
		c.Series[0].Y = append(c.Series[0].Y, float64(i%977))
		c.Series[1].X = append(c.Series[1].X, float64(i))
		c.Series[1].Y = append(c.Series[1].Y, float64(i%313))
	}
	for b.Loop() {
		if err := c.WritePNG(&bytes.Buffer{}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestOddValues: NaN, infinities, huge values, a lone point and series of
// unequal lengths draw (what is drawable) without failing, in both formats.
func TestOddValues(t *testing.T) {
	inf := math.Inf(1)
	for _, c := range []*Chart{
		{Series: []Series{{Name: "nan", X: []float64{0, math.NaN(), 2}, Y: []float64{1, 2, inf}}}},
		{LogX: true, LogY: true, Series: []Series{{Name: "log", Points: true, X: []float64{-1, 0, 1e-300, 1e300}, Y: []float64{0, -5, 1, inf}}}},
		{Series: []Series{{Name: "one", X: []float64{5}, Y: []float64{5}}, {Name: "short", X: []float64{1, 2, 3}, Y: []float64{1}}}},
		{Series: []Series{{Name: "huge", X: []float64{-1e308, 1e308}, Y: []float64{-1e308, 1e308}}}},
	} {
		if err := c.WriteSVG(io.Discard); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		c.WriteSVG(&b)
		if strings.Contains(b.String(), "NaN") {
			t.Errorf("%s: NaN in the SVG", c.Series[0].Name)
		}
		if _, err := c.Render(1); err != nil {
			t.Fatal(err)
		}
	}
}
