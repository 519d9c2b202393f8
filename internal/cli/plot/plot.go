// SPDX-License-Identifier: Apache-2.0

// Package plotcmd is the `magnet plot` command.
package plotcmd

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
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
		Use:   "plot TRACE... [EXPRESSION] --kind KIND -o FILE.svg|FILE.png",
		Short: "Draw a chart of a trace (SVG or PNG), without external tools",
		Long: `Draw one chart of a trace:
  modulation  application sends vs device transmits: size against time (MAGNeT Fig. 12)
  sendbuf     send-buffer occupancy over time (Fig. 13)
  bandwidth   application and wire throughput over a sliding window (Fig. 6/7)
  cwnd        congestion window and slow-start threshold
  srtt        smoothed round-trip time
  layers      per-hop delay distributions (CDF)
  sched       time between context switches per CPU (MAGNET 2.0 Fig. 2/3; record with --events default,sched)
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
			if len(srcs) > 1 {
				return fmt.Errorf("plot: the selection holds %d traces (%s, ...): plot draws one; narrow it with --host/--since/--until", len(srcs), srcs[0].Name)
			}
			fig, err := analyze.PlotOf(srcs[0], kind, analyze.PlotOptions{Conn: conn, Window: window, WindowEvents: windowEvents})
			if err != nil {
				return fmt.Errorf("plot: %w", err)
			}
			read := append([]string(nil), args...)
			read = append(read, srcs[0].Paths...)
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
	f.StringVarP(&kind, "kind", "k", "bandwidth", strings.Join(analyze.Kinds, ", "))
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
