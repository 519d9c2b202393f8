// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteLayerTable writes one connection's (or the host's) modulation as
// a text table, a row per layer: MAGNeT's Table II, as `magnet report`
// and `magnet demo` print it.
func WriteLayerTable(w io.Writer, ls []*LayerStats) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "layer\tcount\tbytes\tsize mean\tmedian\tp99\tspacing µs mean\tmedian\tp99\tcv\tlost\t")
	for _, l := range ls {
		lost := ""
		if l.LostNear > 0 {
			lost = fmt.Sprint(l.LostNear)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.0f\t%.0f\t%.1f\t%.1f\t%.1f\t%.2f\t%s\t\n", l.Layer, l.Count, l.Bytes,
			l.Size.Mean, l.Size.Median, l.Size.P99, l.Spacing.Mean, l.Spacing.Median, l.Spacing.P99, l.Spacing.CV, lost)
	}
	return tw.Flush()
}
