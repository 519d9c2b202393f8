// SPDX-License-Identifier: Apache-2.0

// Package primitivescmd is `magnet-lab primitives`: what the kernel's
// primitives cost per call here, and the floor they put under the cost of
// recording every event (see lab/internal/primitives).
package primitivescmd

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/cli/benchreport"
	"github.com/magnet-tracer/magnet/lab/internal/primitives"
)

// New returns the primitives command.
func New() *cobra.Command {
	var (
		reps, runs int
		eventsPerS float64
		note, out  string
		asJSON     bool
	)
	cmd := &cobra.Command{
		Use:   "primitives",
		Short: "Measure what the kernel's clock, maps and ring buffer cost per call, and the floor they set per event",
		Long: `Measure what the kernel's own primitives cost per call on this machine: the
clocks (bpf_ktime_get_ns, bpf_ktime_get_boot_ns, bpf_ktime_get_coarse_ns),
a helper call, per-CPU and hash map accesses, a 40-byte record in the BPF
ring buffer (reserve and submit, or output) and a 48-byte record in an
array ring at a per-CPU head (MAGNeT's design), and the two together with
the clock, as every event needs at least. Each is a small XDP program built
in Go and run --runs times with BPF_PROG_TEST_RUN, which times the loop in
the kernel; --reps repetitions, interleaved; figures net of an empty
program's. Then the floor: the share of one CPU those take at
--events-per-s, against the 1 % throughput goal. Needs root. See
lab/README.md and lab/results/PRIMITIVES.md.`,
		Example: `  sudo magnet-lab primitives
  sudo magnet-lab primitives --reps 20 --runs 40000 -o lab/results/PRIMITIVES.md`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := primitives.Options{
				Reps: reps, Runs: runs, EventsPerS: eventsPerS, EventsFrom: primitives.DefaultEventsFrom,
				Command: "magnet-lab " + strings.Join(os.Args[1:], " "), Note: note,
			}
			if cmd.Flags().Changed("events-per-s") {
				opts.EventsFrom = "given with --events-per-s"
			}
			if err := opts.Check(); err != nil {
				return fmt.Errorf("primitives: %w", err)
			}
			// -o is checked before the run, not after it.
			return benchreport.Run(cmd.Context(), "primitives", cmd.OutOrStdout(), out, asJSON, func(ctx context.Context) (*primitives.Report, error) {
				return primitives.Run(ctx, opts)
			})
		},
	}
	f := cmd.Flags()
	f.IntVar(&reps, "reps", 20, "repetitions: every program once per repetition, interleaved")
	f.IntVar(&runs, "runs", 40000, fmt.Sprintf("program runs per repetition, timed together by the kernel (at most %d)", primitives.MaxRuns))
	f.Float64Var(&eventsPerS, "events-per-s", primitives.DefaultEventsPerS, "event rate on the bottleneck CPU that the floor is taken at; the default is what record-sender wrote in the full bench run of 2026-11-23")
	f.StringVar(&note, "note", "", "a note for the report's header (what else ran on the machine, ...)")
	f.StringVarP(&out, "output", "o", "", "write the report to FILE (markdown, or JSON with --json); default stdout")
	f.BoolVar(&asJSON, "json", false, "write JSON instead of markdown")
	return cmd
}
