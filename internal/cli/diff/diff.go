// SPDX-License-Identifier: Apache-2.0

// Package diff is the `magnet diff` command.
package diff

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/analyze"
)

// New returns the diff command.
func New() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "diff A.mgt B.mgt [--json]",
		Short: "Set the figures of two runs side by side, and say which differences exceed the noise",
		Long: `Compare two runs: the busiest connection that wrote data in each trace
(its verdict shares, throughput, srtt, cwnd, retransmissions) and the
distribution of every layer's sizes and spacings.

Distributions are compared whole, with the two-sample Kolmogorov-Smirnov
distance: a difference is significant when it exceeds the test's critical
value (alpha 0.001) and a noise floor of 0.5, and the medians moved by more
than 25%. Single figures have no spread of their own: they count as
significant beyond 50% (rates, times), 10 and 50% (retransmissions) or 0.15
of the transfer (verdict shares). The floors are what two runs of one
workload differed by when measured (docs/REPORT.md).`,
		Example: `  magnet diff before.mgt after.mgt
  magnet diff --json a.mgt b.mgt`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := Run(cmd.OutOrStdout(), args[0], args[1], asJSON); err != nil {
				return fmt.Errorf("diff: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// Run compares the runs traced in a and b and prints the comparison to out,
// as a table or as JSON; `magnet report A --compare B` runs it too.
func Run(out io.Writer, a, b string, asJSON bool) error {
	var reps [2]*analyze.Report
	for i, p := range []string{a, b} {
		r, err := analyze.Modulation([]string{p}, 0)
		if err != nil {
			return err
		}
		reps[i] = r
	}
	d := analyze.Compare(reps[0], reps[1])
	if d.ConnA == 0 {
		return fmt.Errorf("no connection with data in %s", a)
	}
	if d.ConnB == 0 {
		return fmt.Errorf("no connection with data in %s", b)
	}
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(d)
	}
	write(out, []string{a, b}, d)
	return nil
}

func mark(sig bool) string {
	if sig {
		return "yes"
	}
	return ""
}

func write(w io.Writer, args []string, d *analyze.Diff) {
	fmt.Fprintf(w, "A: %s, connection %d\nB: %s, connection %d\n\n", args[0], d.ConnA, args[1], d.ConnB)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "figure\tA\tB\tB-A\tsignificant\t")
	for _, f := range d.Figures {
		fmt.Fprintf(tw, "%s\t%.4g\t%.4g\t%+.3g\t%s\t\n", f.Name, f.A, f.B, f.Delta, mark(f.Significant))
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "layer\tdistribution\tcount A\tcount B\tmedian A\tmedian B\tp99 A\tp99 B\tKS\tcritical\tsignificant\t")
	for _, x := range d.Dists {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.3f\t%.3f\t%s\t\n", x.Layer, x.What, x.NA, x.NB, x.MedianA, x.MedianB, x.P99A, x.P99B, x.KS, x.Critical, mark(x.Significant))
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d differences exceed the noise\n", d.Significant)
}
