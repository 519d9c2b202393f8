// SPDX-License-Identifier: Apache-2.0

package plot

import (
	"fmt"
	"sync"

	"golang.org/x/image/font"
	"golang.org/x/image/font/gofont/gobold"
	"golang.org/x/image/font/gofont/goregular"
	"golang.org/x/image/font/opentype"
)

// The Go fonts are built into magnet, so a PNG looks the same on every
// machine and needs no font installed.
var goFonts = sync.OnceValues(func() ([2]*opentype.Font, error) {
	var out [2]*opentype.Font
	for i, ttf := range [][]byte{goregular.TTF, gobold.TTF} {
		f, err := opentype.Parse(ttf)
		if err != nil {
			return out, fmt.Errorf("parse built-in font: %w", err)
		}
		out[i] = f
	}
	return out, nil
})

// faces hands out font faces by size and weight. A face is not safe for
// concurrent use, so each drawing has its own faces.
type faces map[[2]float64]font.Face

func (fs faces) get(size float64, bold bool) (font.Face, error) {
	k := [2]float64{size, 0}
	if bold {
		k[1] = 1
	}
	if f, ok := fs[k]; ok {
		return f, nil
	}
	fonts, err := goFonts()
	if err != nil {
		return nil, err
	}
	f, err := opentype.NewFace(fonts[int(k[1])], &opentype.FaceOptions{Size: size, DPI: 72, Hinting: font.HintingNone})
	if err != nil {
		return nil, fmt.Errorf("font face: %w", err)
	}
	fs[k] = f
	return f, nil
}

// textWidth is the advance of s in pixels, in the Go font at size. The
// layout sizes the legend with it; an SVG viewer's sans-serif is about as
// wide.
func textWidth(s string, size float64, bold bool) float64 {
	f, err := faces{}.get(size, bold)
	if err != nil {
		return 0.6 * size * float64(len([]rune(s))) // a typical sans-serif's average advance
	}
	return float64(font.MeasureString(f, s)) / 64
}
