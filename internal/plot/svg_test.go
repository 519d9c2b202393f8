// SPDX-License-Identifier: Apache-2.0

package plot

import (
	"encoding/xml"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestTicksAndNumbers(t *testing.T) {
	if got := ticks(0, 1, 5); !reflect.DeepEqual(got, []float64{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}) {
		t.Errorf("ticks(0,1) = %v", got)
	}
	if got := ticks(3, 97, 8); !reflect.DeepEqual(got, []float64{20, 40, 60, 80}) {
		t.Errorf("ticks(3,97) = %v", got)
	}
	for v, want := range map[float64]string{0: "0", 1.5: "1.5", 20000: "20k", 2.5e6: "2.5M", 1e9: "1G", 0.25: "0.25"} {
		if got := num(v); got != want {
			t.Errorf("num(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestWriteSVG: well-formed XML, one element per series, labels escaped.
func TestWriteSVG(t *testing.T) {
	c := &Chart{Title: "a < b", XLabel: "time (s)", YLabel: "bytes", Series: []Series{
		{Name: "app", X: []float64{0, 1, 2}, Y: []float64{1, 4, 2}},
		{Name: "wire", X: []float64{0.5, 1.5}, Y: []float64{3, 3}, Points: true},
	}}
	var b strings.Builder
	if err := c.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(strings.NewReader(b.String()))
	names := []string{}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed SVG: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			for _, a := range se.Attr {
				if a.Name.Local == "data-name" {
					names = append(names, a.Value)
				}
			}
		}
	}
	if !reflect.DeepEqual(names, []string{"app", "wire"}) {
		t.Errorf("series %v", names)
	}
	if !strings.Contains(b.String(), "a &lt; b") || strings.Count(b.String(), "<circle") != 2+1 { // and the legend's sample
		t.Errorf("title not escaped or markers missing")
	}
	var empty strings.Builder
	(&Chart{Title: "x"}).WriteSVG(&empty)
	if !strings.Contains(empty.String(), "no data") {
		t.Errorf("empty chart does not say so")
	}
}

// TestLogAxis: a log axis spans whole decades, ticks each one with its
// value, and draws values at or below 0 at the smallest positive value.
func TestLogAxis(t *testing.T) {
	c := &Chart{LogY: true, Series: []Series{{Name: "gaps", Points: true, X: []float64{0, 1, 2, 3}, Y: []float64{0, 3, 250, 8000}}}}
	var yTicks []string
	var markers []point
	for _, s := range c.layout().shapes {
		switch s := s.(type) {
		case textShape:
			if s.anchor == anchorEnd {
				yTicks = append(yTicks, s.s)
			}
		case markersShape:
			if s.series != "" {
				markers = s.pts
			}
		}
	}
	if !reflect.DeepEqual(yTicks, []string{"1", "10", "100", "1000", "10k"}) {
		t.Errorf("log y ticks %v", yTicks)
	}
	// 0 is drawn where 3 is: the smallest positive value.
	if len(markers) != 4 || markers[0].y != markers[1].y || markers[2].y >= markers[1].y {
		t.Errorf("markers %v", markers)
	}
	var b strings.Builder
	c.WriteSVG(&b)
	if strings.Contains(b.String(), "NaN") || strings.Contains(b.String(), "Inf") {
		t.Errorf("SVG has non-finite coordinates")
	}
}

// TestSteps: a step series holds each value until the next point, so its
// line has a corner below (or above) every point but the first, and no
// ramp between values.
func TestSteps(t *testing.T) {
	c := &Chart{Series: []Series{{Name: "occupancy", X: []float64{0, 1, 2}, Y: []float64{1, 4, 2}, Steps: true}}}
	sc := c.layout()
	var line *polylineShape
	for _, s := range sc.shapes {
		if p, ok := s.(polylineShape); ok && p.series == "occupancy" {
			line = &p
		}
	}
	if line == nil || len(line.pts) != 5 {
		t.Fatalf("step line %+v: want 5 points", line)
	}
	for i := 1; i < len(line.pts); i++ {
		a, b := line.pts[i-1], line.pts[i]
		if a.x != b.x && a.y != b.y {
			t.Errorf("segment %d goes from %v to %v: a ramp", i, a, b)
		}
	}
}
