// SPDX-License-Identifier: Apache-2.0

// Package report is the `magnet report` command.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/analyze"
)

// New returns the report command.
func New() *cobra.Command {
	var conn uint64
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "report TRACE... [--conn ID] [--json]",
		Short: "Show how each layer of the stack reshapes what the application sent (modulation)",
		Long: `For each connection (busiest first) and for the host: at every layer the data
passes, from the application's sends down to the device and up to the
receiving application, the number of events, bytes, data size (mean, median,
p99) and spacing between events (mean, median, p99 in microseconds, and the
coefficient of variation) -- MAGNeT's Table II. Pure ACKs and failed calls
are left out at the socket and TCP layers.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rep, err := analyze.Modulation(args, conn)
			if err != nil {
				return fmt.Errorf("report: %w", err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			if conn != 0 && len(rep.Conns) == 0 {
				return fmt.Errorf("report: no connection %d with data in %v", conn, args)
			}
			for _, w := range rep.Warnings {
				fmt.Fprintf(out, "warning: %s\n", w)
			}
			for _, c := range rep.Conns {
				fmt.Fprintf(out, "\nconnection %d (%s) %s %s -> %s, pid %d %s", c.Conn.ID, c.Trace, c.Conn.Proto, c.Conn.Local, c.Conn.Remote, c.Conn.PID, c.Conn.Comm)
				if c.Conn.Peer != 0 {
					fmt.Fprintf(out, ", peer %d", c.Conn.Peer)
				}
				fmt.Fprintln(out)
				writeLayers(out, c.Layers)
			}
			if conn == 0 && len(rep.Host) > 0 {
				fmt.Fprintln(out, "\nhost (all connections)")
				writeLayers(out, rep.Host)
			}
			return nil
		},
	}
	cmd.Flags().Uint64Var(&conn, "conn", 0, "report only this connection id")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func writeLayers(w io.Writer, ls []*analyze.LayerStats) {
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
	tw.Flush()
}
