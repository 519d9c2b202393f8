// SPDX-License-Identifier: Apache-2.0

package plot

import (
	"fmt"
	"html"
	"image/color"
	"io"
	"strings"
)

// WriteSVG draws the chart as a self-contained SVG document. Each series is
// one element with class "series" and its name in data-name.
func (c *Chart) WriteSVG(w io.Writer) error {
	sc := c.layout()
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="%d">`+"\n",
		sc.w, sc.h, sc.w, sc.h, fontSize)
	for _, s := range sc.shapes {
		switch s := s.(type) {
		case rectShape:
			b.WriteString(`<rect`)
			if s.x != 0 || s.y != 0 {
				fmt.Fprintf(&b, ` x="%.1f" y="%.1f"`, s.x, s.y)
			}
			fmt.Fprintf(&b, ` width="%.1f" height="%.1f"`, s.w, s.h)
			if s.fill == nil {
				b.WriteString(` fill="none"`)
			} else {
				fmt.Fprintf(&b, ` fill="%s"`, hex(*s.fill))
				if s.fillOpacity < 1 {
					fmt.Fprintf(&b, ` fill-opacity="%.2f"`, s.fillOpacity)
				}
			}
			if s.stroke != nil {
				fmt.Fprintf(&b, ` stroke="%s"`, hex(*s.stroke))
			}
			b.WriteString("/>\n")
		case lineShape:
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"`, s.a.x, s.a.y, s.b.x, s.b.y, hex(s.stroke))
			if s.width != 1 {
				fmt.Fprintf(&b, ` stroke-width="%.1f"`, s.width)
			}
			b.WriteString("/>\n")
		case polylineShape:
			fmt.Fprintf(&b, `<polyline class="series" data-name="%s" fill="none" stroke="%s" stroke-width="%.1f" stroke-linejoin="round" points="`,
				esc(s.series), hex(s.stroke), s.width)
			for _, p := range s.pts {
				fmt.Fprintf(&b, "%.1f,%.1f ", p.x, p.y)
			}
			b.WriteString(`"/>` + "\n")
		case markersShape:
			b.WriteString(`<g`)
			if s.series != "" {
				fmt.Fprintf(&b, ` class="series" data-name="%s"`, esc(s.series))
			}
			fmt.Fprintf(&b, ` fill="%s"`, hex(s.fill))
			if s.opacity < 1 {
				fmt.Fprintf(&b, ` fill-opacity="%.2f"`, s.opacity)
			}
			b.WriteString(">")
			for _, p := range s.pts {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="%.1f"/>`, p.x, p.y, s.radius)
			}
			b.WriteString("</g>\n")
		case textShape:
			b.WriteString(`<text`)
			if s.vertical {
				fmt.Fprintf(&b, ` transform="translate(%.1f,%.1f) rotate(-90)"`, s.at.x, s.at.y)
			} else {
				fmt.Fprintf(&b, ` x="%.1f" y="%.1f"`, s.at.x, s.at.y)
			}
			switch s.anchor {
			case anchorMiddle:
				b.WriteString(` text-anchor="middle"`)
			case anchorEnd:
				b.WriteString(` text-anchor="end"`)
			}
			if s.size != fontSize {
				fmt.Fprintf(&b, ` font-size="%g"`, s.size)
			}
			if s.bold {
				b.WriteString(` font-weight="bold"`)
			}
			if s.fill != black {
				fmt.Fprintf(&b, ` fill="%s"`, hex(s.fill))
			}
			fmt.Fprintf(&b, ">%s</text>\n", esc(s.s))
		}
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func hex(c color.RGBA) string { return fmt.Sprintf("#%02x%02x%02x", c.R, c.G, c.B) }

func esc(s string) string { return html.EscapeString(s) }
