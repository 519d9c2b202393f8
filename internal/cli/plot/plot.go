// SPDX-License-Identifier: Apache-2.0

// Package plotcmd is the `magnet plot` command.
package plotcmd

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/archive"
	"github.com/magnet-tracer/magnet/internal/evselect"
	"github.com/magnet-tracer/magnet/internal/outfile"
	"github.com/magnet-tracer/magnet/internal/plot"
)

// New returns the plot command.
func New() *cobra.Command {
	var kind, output string
	var conn uint64
	var window time.Duration
	var windowEvents int
	var selFlags archive.Flags
	var evFlags evselect.Flags
	var salvage bool
	cmd := &cobra.Command{
		Use: "plot TRACE... [EXPRESSION] --kind KIND -o FILE.svg|FILE.png",
		Example: `  magnet plot ftp.mgt --kind sendbuf -o sendbuf.svg
  magnet plot sender.mgt receiver.mgt -o ends.svg
  magnet plot sender.mgt receiver.mgt --kind e2e-delay -o delay.png
  magnet plot rx.mgt --kind napi -o polls.svg`,
		Short: "Draw a chart of a trace (SVG or PNG), without external tools",
		Long: `Draw one chart of a trace:
  modulation  application sends vs device transmits: size against time (MAGNeT Fig. 12)
  sendbuf     send-buffer occupancy over time (Fig. 13)
  bandwidth   application and wire throughput over a sliding window (Fig. 6/7)
  cwnd        congestion window and slow-start threshold
  srtt        smoothed round-trip time
  layers      per-hop delay distributions (CDF)
  sched       time between context switches per CPU (MAGNET 2.0 Fig. 2/3; record with --groups default,sched)
  napi        polls by the packets each NAPI poll took (record with --groups default,napi)
  e2e         a connection's two ends: bytes written at the sender's socket and read at the receiver's
  e2e-delay   each data segment's delay end to end (tcp_xmit to sock_recv) and at the receiver
              (dev_recv to sock_recv), against the time it was read
e2e and e2e-delay take the sender's and the receiver's traces (recorded on two hosts, or
two recordings of one host), or one trace holding both ends; the ends are paired by
the connection's addresses and ports, as report pairs them. With two traces, e2e is
the default kind.
The connection is the one that moved the most application bytes unless --conn says otherwise.
The output's extension chooses the format: .svg (vector, for pages) or .png (an image
at twice the chart's size, drawn with the built-in Go fonts).
TRACE may be a file, the files of one rotated recording, or a directory or archive
narrowed to one recording with --host, --since and --until.
Arguments after the trace are a pcap-filter expression ("tcp port 443"); it,
--filter, --types and --groups select the events drawn (docs/FILTERS.md).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			args, err := evFlags.Args(cmd, args)
			if err != nil {
				return fmt.Errorf("plot: %w", err)
			}
			if output == "" {
				return fmt.Errorf("plot: an output file is required (-o FILE.svg or -o FILE.png)")
			}
			write, ok := writers[strings.ToLower(filepath.Ext(output))]
			if !ok {
				return fmt.Errorf("plot: %s: unknown output format (want a .svg or .png file)", output)
			}
			sel, err := selFlags.Selection(time.Now())
			if err != nil {
				return fmt.Errorf("plot: %w", err)
			}
			srcs, cleanup, err := archive.Resolve(args, sel)
			if err != nil {
				return fmt.Errorf("plot: %w", err)
			}
			defer cleanup()
			for i := range srcs {
				srcs[i].Salvage = salvage
			}
			if err := evFlags.Apply(srcs, 0); err != nil {
				return fmt.Errorf("plot: %w", err)
			}
			if len(srcs) > 1 && !cmd.Flags().Changed("kind") {
				kind = "e2e" // two traces: the two ends of a connection
			}
			pair := slices.Contains(analyze.PairKinds, kind)
			if len(srcs) > 2 || len(srcs) == 2 && !pair {
				return fmt.Errorf("plot: the selection holds %d traces (%s, ...): --kind %s draws one, e2e and e2e-delay two (a sender's and a receiver's); narrow it with --host/--since/--until", len(srcs), srcs[0].Name, kind)
			}
			opts := analyze.PlotOptions{Conn: conn, Window: window, WindowEvents: windowEvents}
			var fig *analyze.Figure
			switch {
			case pair:
				fig, err = analyze.PlotPair(srcs, kind, opts)
			case kind == "napi":
				fig, err = analyze.PlotNapi(srcs[0])
			default:
				fig, err = analyze.PlotOf(srcs[0], kind, opts)
			}
			if err != nil {
				return fmt.Errorf("plot: %w", err)
			}
			read := append([]string(nil), args...)
			for _, s := range srcs {
				read = append(read, s.Paths...)
			}
			f, err := outfile.Create(output, outfile.Options{Inputs: read, Lock: true})
			if err != nil {
				return fmt.Errorf("plot: %w", err)
			}
			if err := write(Chart(fig), f); err != nil {
				f.Close()
				return fmt.Errorf("plot: %w", err)
			}
			if err := f.Close(); err != nil {
				return fmt.Errorf("plot: %w", err)
			}
			for _, w := range fig.Warnings {
				fmt.Fprintf(os.Stderr, "magnet: warning: %s\n", w)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&kind, "kind", "k", "bandwidth", strings.Join(append(append(append([]string(nil), analyze.Kinds...), "napi"), analyze.PairKinds...), ", ")+" (two traces: e2e)")
	f.StringVarP(&output, "output", "o", "", "file to write: .svg or .png")
	f.Uint64Var(&conn, "conn", 0, "connection id (default: the busiest)")
	f.DurationVar(&window, "window", 0, "bandwidth: sliding window (default: 1/50 of the transfer, at least 10ms)")
	f.IntVar(&windowEvents, "window-events", 0, "bandwidth: slide over this many events instead (MAGNET 2.0 used 1000)")
	f.BoolVar(&salvage, "salvage", false, "read on after damaged data: skip to the next valid block, and say how much was skipped")
	selFlags.Register(f)
	evFlags.Register(f, "draw events")
	return cmd
}

// writers draw a chart in the format an output file's extension names.
var writers = map[string]func(*plot.Chart, io.Writer) error{
	".svg": (*plot.Chart).WriteSVG,
	".png": (*plot.Chart).WritePNG,
}

// Chart turns an analysis figure into a drawable chart.
func Chart(fig *analyze.Figure) *plot.Chart {
	c := &plot.Chart{Title: fig.Title, XLabel: fig.XLabel, YLabel: fig.YLabel, NoData: fig.NoData, LogX: fig.LogX, LogY: fig.LogY}
	for _, s := range fig.Series {
		c.Series = append(c.Series, plot.Series{Name: s.Name, X: s.X, Y: s.Y, Points: s.Scatter, Steps: s.Steps})
	}
	return c
}
