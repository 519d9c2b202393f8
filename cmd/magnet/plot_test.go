// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"testing"

	"github.com/magnet-tracer/magnet/internal/plot"
)

// checkPNG decodes a plot written as PNG and checks that it is the default
// chart at twice its size and that each of its first n series' colours
// covers more pixels than a legend sample could: lines in their colour,
// markers (when scatter) as tints of it, darker where they overlap.
func checkPNG(t *testing.T, path string, n int, scatter bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: not a PNG: %v", path, err)
	}
	if got := img.Bounds().Size(); got != image.Pt(900*plot.PNGScale, 420*plot.PNGScale) {
		t.Fatalf("%s: size %v", path, got)
	}
	for i := 0; i < n; i++ {
		minAlpha := 0.97
		if scatter {
			minAlpha = plot.MarkerOpacity - 0.03
		}
		if got := tinted(img, plot.Palette[i%len(plot.Palette)], minAlpha); got < 150 {
			t.Errorf("%s: series %d: %d pixels of its colour %v", path, i, got, plot.Palette[i])
		}
	}
}

// tinted counts the pixels that are c laid over white at an opacity of at
// least minAlpha.
func tinted(img image.Image, c color.RGBA, minAlpha float64) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			p := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			lo, hi, ok := 1.0, 0.0, true
			for _, ch := range [][2]uint8{{p.R, c.R}, {p.G, c.G}, {p.B, c.B}} {
				if 255-int(ch[1]) < 40 { // a channel the colour saturates stays near white
					ok = ok && int(ch[0]) >= 255-40
					continue
				}
				a := float64(255-int(ch[0])) / float64(255-int(ch[1]))
				lo, hi = math.Min(lo, a), math.Max(hi, a)
			}
			if ok && hi-lo < 0.06 && lo >= minAlpha && hi <= 1.03 {
				n++
			}
		}
	}
	return n
}
