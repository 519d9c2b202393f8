// SPDX-License-Identifier: Apache-2.0

package plot

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"

	"golang.org/x/image/font"
	"golang.org/x/image/math/fixed"
	"golang.org/x/image/vector"
)

// PNGScale is how many PNG pixels one chart pixel becomes: two, so the
// picture stays sharp on high-density screens, in slides and in print.
const PNGScale = 2

// WritePNG draws the chart as a PNG image of PNGScale × its size.
func (c *Chart) WritePNG(w io.Writer) error {
	img, err := c.Render(PNGScale)
	if err != nil {
		return err
	}
	if err := png.Encode(w, img); err != nil {
		return fmt.Errorf("encode png: %w", err)
	}
	return nil
}

// Render draws the chart into an image, scale pixels per chart pixel, with
// anti-aliased shapes and the Go fonts.
func (c *Chart) Render(scale float64) (*image.RGBA, error) {
	sc := c.layout()
	k := scale
	img := image.NewRGBA(image.Rect(0, 0, int(math.Round(float64(sc.w)*k)), int(math.Round(float64(sc.h)*k))))
	r := &raster{dst: img, k: k, faces: faces{}}
	for _, s := range sc.shapes {
		var err error
		switch s := s.(type) {
		case rectShape:
			r.rect(s)
		case lineShape:
			r.fill([][]point{r.segment(s.a, s.b, s.width)}, s.stroke, 1)
		case polylineShape:
			r.polyline(s)
		case markersShape:
			for _, p := range s.pts {
				// One at a time, so overlapping markers darken as in SVG.
				r.fill([][]point{circle(r.at(p), s.radius*k)}, s.fill, s.opacity)
			}
		case textShape:
			err = r.text(s)
		}
		if err != nil {
			return nil, err
		}
	}
	return img, nil
}

// raster draws scene shapes into an image, k image pixels per chart pixel.
type raster struct {
	dst   *image.RGBA
	k     float64
	faces faces
	rz    vector.Rasterizer
}

func (r *raster) at(p point) point { return point{p.x * r.k, p.y * r.k} }

func (r *raster) rect(s rectShape) {
	a, b := r.at(point{s.x, s.y}), r.at(point{s.x + s.w, s.y + s.h})
	if s.fill != nil {
		r.fill([][]point{{a, {b.x, a.y}, b, {a.x, b.y}}}, *s.fill, s.fillOpacity)
	}
	if s.stroke != nil {
		// A 1-pixel outline centred on the edge, as SVG strokes it.
		h := r.k / 2
		outer := []point{{a.x - h, a.y - h}, {b.x + h, a.y - h}, {b.x + h, b.y + h}, {a.x - h, b.y + h}}
		inner := []point{{a.x + h, a.y + h}, {a.x + h, b.y - h}, {b.x - h, b.y - h}, {b.x - h, a.y + h}}
		r.fillRaw([][]point{oriented(outer, true), oriented(inner, false)}, *s.stroke, 1)
	}
}

// segment is the quadrilateral a stroke of width (chart pixels) covers
// from a to b, with butt ends.
func (r *raster) segment(a, b point, width float64) []point {
	a, b = r.at(a), r.at(b)
	dx, dy := b.x-a.x, b.y-a.y
	l := math.Hypot(dx, dy)
	if l == 0 {
		return nil
	}
	h := width * r.k / 2
	nx, ny := -dy/l*h, dx/l*h
	return []point{{a.x + nx, a.y + ny}, {b.x + nx, b.y + ny}, {b.x - nx, b.y - ny}, {a.x - nx, a.y - ny}}
}

// polyline strokes a series with round joins: a quadrilateral per segment
// and a disc at each inner vertex, all one path so they do not blend.
func (r *raster) polyline(s polylineShape) {
	var polys [][]point
	for i := 1; i < len(s.pts); i++ {
		if q := r.segment(s.pts[i-1], s.pts[i], s.width); q != nil {
			polys = append(polys, q)
		}
		if i < len(s.pts)-1 {
			polys = append(polys, circle(r.at(s.pts[i]), s.width*r.k/2))
		}
	}
	if len(s.pts) == 1 {
		polys = append(polys, circle(r.at(s.pts[0]), s.width*r.k/2))
	}
	r.fill(polys, s.stroke, 1)
}

// fill paints polygons (image pixels) in col at opacity, anti-aliased.
// Every polygon is turned the same way round: the rasterizer adds up
// signed coverage, so opposite turns would cancel where they overlap.
func (r *raster) fill(polys [][]point, col color.RGBA, opacity float64) {
	for i, p := range polys {
		polys[i] = oriented(p, true)
	}
	r.fillRaw(polys, col, opacity)
}

// fillRaw paints polygons as they turn (holes turn the other way).
func (r *raster) fillRaw(polys [][]point, col color.RGBA, opacity float64) {
	// Rasterize only the polygons' bounding box, clipped to the image.
	lo, hi := point{math.Inf(1), math.Inf(1)}, point{math.Inf(-1), math.Inf(-1)}
	for _, p := range polys {
		for _, q := range p {
			lo.x, lo.y = math.Min(lo.x, q.x), math.Min(lo.y, q.y)
			hi.x, hi.y = math.Max(hi.x, q.x), math.Max(hi.y, q.y)
		}
	}
	if math.IsInf(lo.x, 1) {
		return
	}
	box := image.Rect(int(math.Floor(lo.x)), int(math.Floor(lo.y)), int(math.Ceil(hi.x))+1, int(math.Ceil(hi.y))+1).Intersect(r.dst.Bounds())
	if box.Empty() {
		return
	}
	r.rz.Reset(box.Dx(), box.Dy())
	ox, oy := float64(box.Min.X), float64(box.Min.Y)
	for _, p := range polys {
		if len(p) < 3 {
			continue
		}
		r.rz.MoveTo(float32(p[0].x-ox), float32(p[0].y-oy))
		for _, q := range p[1:] {
			r.rz.LineTo(float32(q.x-ox), float32(q.y-oy))
		}
		r.rz.ClosePath()
	}
	src := image.NewUniform(color.NRGBA{col.R, col.G, col.B, uint8(math.Round(255 * math.Max(0, math.Min(1, opacity))))})
	r.rz.Draw(r.dst, box, src, image.Point{})
}

// text draws a label with its anchor at the baseline, as SVG places it.
func (r *raster) text(s textShape) error {
	face, err := r.faces.get(s.size*r.k, s.bold)
	if err != nil {
		return err
	}
	width := float64(font.MeasureString(face, s.s)) / 64
	shift := 0.0
	switch s.anchor {
	case anchorMiddle:
		shift = -width / 2
	case anchorEnd:
		shift = -width
	}
	at := r.at(s.at)
	src := image.NewUniform(s.fill)
	if !s.vertical {
		d := font.Drawer{Dst: r.dst, Src: src, Face: face, Dot: fixed.Point26_6{X: fix(at.x + shift), Y: fix(at.y)}}
		d.DrawString(s.s)
		return nil
	}
	// Rotated −90°: draw it level into a mask, turn the mask, paint through it.
	m := face.Metrics()
	asc, desc := m.Ascent.Ceil(), m.Descent.Ceil()
	w := int(math.Ceil(width)) + 1
	level := image.NewAlpha(image.Rect(0, 0, w, asc+desc))
	d := font.Drawer{Dst: level, Src: image.Opaque, Face: face, Dot: fixed.P(0, asc)}
	d.DrawString(s.s)
	turned := image.NewAlpha(image.Rect(0, 0, asc+desc, w))
	for v := 0; v < asc+desc; v++ {
		for u := 0; u < w; u++ {
			turned.Pix[(w-1-u)*turned.Stride+v] = level.Pix[v*level.Stride+u]
		}
	}
	// Level pixel (u, v) lands at (x + v − ascent, y − shift − u).
	x0 := int(math.Round(at.x)) - asc
	y0 := int(math.Round(at.y-shift)) - w + 1
	draw.DrawMask(r.dst, image.Rect(x0, y0, x0+asc+desc, y0+w), src, image.Point{}, turned, image.Point{}, draw.Over)
	return nil
}

func fix(v float64) fixed.Int26_6 { return fixed.Int26_6(math.Round(v * 64)) }

// circle is a polygon close enough to a circle at its size.
func circle(c point, radius float64) []point {
	n := max(12, int(math.Ceil(2*math.Pi*radius/1.5)))
	pts := make([]point, n)
	for i := range pts {
		a := 2 * math.Pi * float64(i) / float64(n)
		pts[i] = point{c.x + radius*math.Cos(a), c.y + radius*math.Sin(a)}
	}
	return pts
}

// oriented returns p turning clockwise on screen (positive shoelace area
// with y down) when cw, else anticlockwise.
func oriented(p []point, cw bool) []point {
	area := 0.0
	for i := range p {
		j := (i + 1) % len(p)
		area += p[i].x*p[j].y - p[j].x*p[i].y
	}
	if area > 0 == cw || area == 0 {
		return p
	}
	out := make([]point, len(p))
	for i := range p {
		out[i] = p[len(p)-1-i]
	}
	return out
}
