// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"image"
	"image/color"
	"image/png"
	"os"
	"testing"

	"github.com/magnet-tracer/magnet/internal/plot"
)

// checkPNG decodes a plot written as PNG and checks that it is the default
// chart at twice its size and that each of its n series' colours covers
// more pixels than a legend sample could (markers, when scatter, at their
// opacity over white).
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
		want := plot.Palette[i]
		if scatter {
			want = overWhite(want, plot.MarkerOpacity)
		}
		if got := pixelsNear(img, want); got < 150 {
			t.Errorf("%s: series %d: %d pixels of its colour %v", path, i, got, want)
		}
	}
}

func overWhite(c color.RGBA, opacity float64) color.RGBA {
	mix := func(v uint8) uint8 { return uint8(float64(v)*opacity + 255*(1-opacity) + 0.5) }
	return color.RGBA{mix(c.R), mix(c.G), mix(c.B), 0xff}
}

// pixelsNear counts the pixels within 4 of c in every channel.
func pixelsNear(img image.Image, c color.RGBA) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			p := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			d := func(a, b uint8) bool { return int(a)-int(b) <= 4 && int(b)-int(a) <= 4 }
			if d(p.R, c.R) && d(p.G, c.G) && d(p.B, c.B) {
				n++
			}
		}
	}
	return n
}
