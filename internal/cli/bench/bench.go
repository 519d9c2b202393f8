// SPDX-License-Identifier: Apache-2.0

// Package benchcmd is the `magnet bench` command: what recording costs on
// this host, the way users measure it (see internal/overhead), and the
// accuracy of magnet probe (bench probe).
package benchcmd

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/cli/benchreport"
	probecmd "github.com/magnet-tracer/magnet/internal/cli/probe"
	"github.com/magnet-tracer/magnet/internal/overhead"
)

// New returns the bench command.
func New() *cobra.Command {
	var (
		reps, goalReps, rate, snaplen int
		seed                          uint64
		duration                      time.Duration
		configs, satConfigs           string
		workload, workDir, out        string
		diagnostic, asJSON            bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure what recording costs on this host: CPU per GB and throughput, against tcpdump, perf and bpftrace",
		Long: `Measure what recording costs on this host, the way users measure it.

Builds two network namespaces joined by a veth pair and runs iperf3 from one
to the other (--workload magnet: magnet's own flood) under each
configuration, interleaved (each repetition runs every configuration once, in
an order of its own drawn from --seed),
unpinned, --reps times of --duration:

  baseline          nothing recording
  record-conn       magnet record --events conn: connection lifecycle only, the floor
  record-GROUP      magnet record --events GROUP, for each other default group
  record            magnet record, default groups (the whole host, as users run it)
  tcpdump           tcpdump -s 96 -w FILE on the sender's veth
  perf              perf record -a of the tracepoints magnet's default groups use
  bpftrace          bpftrace printing a line per event of the same tracepoints

First at a fixed rate below saturation (--rate, tc tbf on the veth): CPU
seconds per GB received, over all CPUs (/proc/stat; steal and guest
excluded), and how much more than the same repetition's baseline; then at
saturation (the veth unlimited, --saturation-configs): throughput and its
loss. Mean and 95 % confidence interval, and each of the issue's goals with
its verdict. Events per GB, events lost (must be 0), the recorder's own CPU,
and the trace's bytes on the data connection against iperf3's.

With --diagnostic (on by default) one more transfer is recorded with
bpf_stats on, for a table of each BPF program's runs and run time: program
bodies only, not what the system pays, and in no figure above.

Needs root, iproute2 and iperf3; tcpdump, perf and bpftrace for their
configurations (bench/cost.sh installs them).`,
		Example: `  sudo magnet bench -o bench/RESULTS.md
  sudo magnet bench --reps 2 --duration 2s --configs record,tcpdump --saturation-configs none
  sudo magnet bench --rate 1000 --workload magnet --json -o cost.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := overhead.Options{
				Workload: workload, RateMbit: rate, Reps: reps, GoalReps: goalReps, Seed: seed, Duration: duration,
				Diagnostic: diagnostic, TcpdumpSnaplen: snaplen, WorkDir: workDir,
				Log: cmd.ErrOrStderr(), Command: "magnet " + strings.Join(os.Args[1:], " "),
			}
			if err := checkFlags(&opts, configs, satConfigs); err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			if os.Geteuid() != 0 {
				return fmt.Errorf("bench: %w", overhead.ErrNotRoot)
			}
			var err error
			if opts.Magnet, err = os.Executable(); err != nil {
				return fmt.Errorf("bench: find the magnet binary: %w", err)
			}
			return benchreport.Run(cmd.Context(), "bench", cmd.OutOrStdout(), out, asJSON, func(ctx context.Context) (*overhead.Report, error) {
				return overhead.Measure(ctx, opts)
			})
		},
	}
	f := cmd.Flags()
	f.IntVar(&reps, "reps", 5, "repetitions; each runs every configuration once")
	f.IntVar(&goalReps, "goal-reps", 0, "repetitions after --reps of only the configurations the goals compare ("+strings.Join(overhead.GoalConfigs, ", ")+"), to narrow their intervals")
	f.Uint64Var(&seed, "seed", 0, "seed of each repetition's random order of the configurations (0: drawn, and written in the report)")
	f.DurationVar(&duration, "duration", 4*time.Second, "length of each transfer, whole seconds")
	f.IntVar(&rate, "rate", 4000, "the fixed rate below saturation, Mbit/s (tc tbf on the veth)")
	f.StringVar(&configs, "configs", strings.Join(overhead.Names(overhead.Configs()), ","), "configurations at the fixed rate, comma-separated (the baseline always runs)")
	f.StringVar(&satConfigs, "saturation-configs", strings.Join(overhead.SaturationDefault, ","), "configurations at saturation, comma-separated; none for no saturation phase")
	f.StringVar(&workload, "workload", overhead.Iperf3, "iperf3, or magnet (magnet workload send --flood, 64 KiB messages)")
	f.BoolVar(&diagnostic, "diagnostic", true, "also record one transfer with bpf_stats on for the per-program table")
	f.IntVar(&snaplen, "tcpdump-snaplen", 96, "tcpdump -s")
	f.StringVar(&workDir, "work-dir", "", "directory for the tracers' files while they run (default: the system's temporary directory)")
	f.StringVarP(&out, "output", "o", "", "write the report to FILE (Markdown, or JSON with --json); default stdout")
	f.BoolVar(&asJSON, "json", false, "write JSON instead of Markdown")
	cmd.AddCommand(probecmd.NewBench())
	return cmd
}

// checkFlags fills opts' configurations and checks every flag, so that a
// mistake is told before any namespace is made.
func checkFlags(opts *overhead.Options, configs, satConfigs string) error {
	var err error
	if opts.Configs, err = overhead.Select(configs); err != nil {
		return fmt.Errorf("--configs: %w", err)
	}
	if strings.TrimSpace(satConfigs) != "none" {
		if opts.Saturation, err = overhead.Select(satConfigs); err != nil {
			return fmt.Errorf("--saturation-configs: %w", err)
		}
	}
	switch {
	case opts.Reps < 1:
		return fmt.Errorf("--reps %d: want at least 1", opts.Reps)
	case opts.GoalReps < 0:
		return fmt.Errorf("--goal-reps %d: want 0 or more", opts.GoalReps)
	case opts.Duration < time.Second || opts.Duration%time.Second != 0:
		return fmt.Errorf("--duration %v: want whole seconds, at least 1s (iperf3 -t)", opts.Duration)
	case opts.RateMbit < 1:
		return fmt.Errorf("--rate %d: want at least 1 Mbit/s", opts.RateMbit)
	case opts.Workload != overhead.Iperf3 && opts.Workload != overhead.MagnetFlood:
		return fmt.Errorf("--workload %q: want iperf3 or magnet", opts.Workload)
	case opts.TcpdumpSnaplen < 1:
		return fmt.Errorf("--tcpdump-snaplen %d: want at least 1", opts.TcpdumpSnaplen)
	}
	return nil
}
