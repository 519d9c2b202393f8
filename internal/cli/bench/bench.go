// SPDX-License-Identifier: Apache-2.0

// Package benchcmd is the `magnet bench` command: the overhead of recording
// against no tracer, tcpdump and bpftrace, per-event cost and the loss sweep
// (see internal/bench).
package benchcmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/bench"
	"github.com/magnet-tracer/magnet/internal/cli/benchreport"
	bwprobecmd "github.com/magnet-tracer/magnet/internal/cli/bwprobe"
	primitivescmd "github.com/magnet-tracer/magnet/internal/cli/primitives"
)

// New returns the bench command.
func New() *cobra.Command {
	var (
		reps, unlimitedReps      int
		duration                 time.Duration
		links, configs, out      string
		sweep, full, asJSON, pin bool
		cost, synth, churn       bool
		producers                int
		before, label            string
		compareWith, cmpLbl      string
		snaplen                  int
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure what recording costs: throughput, CPU, events, losses, against tcpdump and bpftrace",
		Long: `Measure what recording costs. Builds two network namespaces joined by a
veth pair (optionally rate-limited with tc tbf), runs a saturating TCP
transfer (magnet workload send --flood D --size 65536) under each
configuration, interleaved, --reps times, and reports the mean and 95 %
confidence interval of throughput, CPU, events, losses and trace bytes per
packet. Configurations:

  baseline          nothing loaded
  hooks             magnet's programs attached as for loaded, no group enabled:
                    each returns at once (what the hooks themselves cost)
  loaded            magnet's programs attached, all default groups, ring never read
  record-sender     magnet record --netns <sender's namespace>, writing to disk
  record-receiver   magnet record --netns <receiver's namespace>
  record-sender-sock   record-sender with --events sock: socket calls only
  tcpdump-sender    tcpdump -w on the sender's veth
  tcpdump-receiver  tcpdump -w on the receiver's veth
  bpftrace          bpftrace with the equivalent tracepoints, printing to a file
  record-sender-proc   this build's magnet record binary as a process (unlimited link only)
  record-sender-other  the --compare-with build's, the same way: the two
                       differ by the change between the builds
  record-other-port    magnet record --port of a port no run uses, on the
                       sender's side: what every other connection pays
                       while magnet records one service (--churn's)
  record-other-expr    the same with a pcap-filter expression that excludes
                       every run's traffic instead of --port

--churn adds connection churn on an unlimited link of its own: short
connections one after another (magnet workload send --churn D --size 100:
connect, one 100-byte request, the server's close, close), under baseline,
hooks, loaded, record-sender, record-receiver, record-sender-sock,
record-other-port and tcpdump-sender (or --configs when given),
interleaved, --reps times of --duration: connections/s, CPU and events
per connection.

--sweep adds per-event cost (bpf_stats), events lost against the
ring-buffer size, what limits the event rate and the synthetic events;
--cost adds only the per-event cost and --synth only the synthetic events:
alone (the recorder's ceiling) and, when the unlimited link is in --links,
beside the saturating transfer, recorded as record-sender records it (the
event rate while the workload runs). With --links none, nothing else runs. --full is the documented full run (every link,
configuration, the churn, the sweep, pinned; with --compare-with, the two
process configurations too). Needs root.`,
		Example: `  sudo magnet bench --reps 1 --duration 2s --links unlimited --configs baseline,record-sender
  sudo magnet bench --churn --links none --reps 3 --duration 3s
  sudo magnet bench --full -o bench/RESULTS.md`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			opts := bench.Options{
				Reps: reps, Duration: duration, Sweep: sweep, Cost: sweep || cost, Synth: sweep || synth, Churn: churn,
				TcpdumpSnaplen: snaplen, Log: cmd.ErrOrStderr(),
				Command: "magnet " + strings.Join(os.Args[1:], " "),
			}
			if full {
				opts.Sweep, opts.Cost, opts.Synth, opts.Churn = true, true, true, true
				if !f.Changed("links") {
					links = "unlimited,1000,100"
				}
				if !f.Changed("configs") {
					configs = strings.Join(bench.AllConfigs, ",")
				}
			}
			var err error
			if opts.Links, err = ParseLinks(links); err != nil {
				return fmt.Errorf("bench: --links: %w", err)
			}
			if opts.Configs, err = ParseConfigs(configs); err != nil {
				return fmt.Errorf("bench: --configs: %w", err)
			}
			if f.Changed("configs") {
				// Else the churn runs its own list (bench.ChurnConfigs).
				opts.ChurnConfigs = opts.Configs
			}
			if reps < 1 {
				return fmt.Errorf("bench: --reps %d: want at least 1", reps)
			}
			if producers < 1 {
				return fmt.Errorf("bench: --synth-producers %d: want at least 1", producers)
			}
			opts.SynthProducers = producers
			if unlimitedReps < 0 {
				return fmt.Errorf("bench: --unlimited-reps %d: want at least 1 (0: as --reps)", unlimitedReps)
			}
			opts.UnlimitedReps = unlimitedReps
			opts.Pin = pin
			if full && !f.Changed("pin") {
				// Two "hosts", as the papers had: unpinned, placement on
				// 2 vCPUs makes the baseline bimodal (docs/BENCH.md).
				opts.Pin = true
			}
			if full && !f.Changed("unlimited-reps") {
				opts.UnlimitedReps = 2 * reps
			}
			if duration < time.Second {
				return fmt.Errorf("bench: --duration %v: want at least 1s", duration)
			}
			if os.Geteuid() != 0 {
				return fmt.Errorf("bench: %w", bench.ErrNotRoot)
			}
			if opts.Magnet, err = os.Executable(); err != nil {
				return fmt.Errorf("bench: find the magnet binary: %w", err)
			}
			opts.Label = label
			if compareWith != "" {
				if _, err := os.Stat(compareWith); err != nil {
					return fmt.Errorf("bench: --compare-with: %w", err)
				}
				opts.CompareWith, opts.CompareLabel = compareWith, cmpLbl
				if full && !f.Changed("configs") {
					opts.Configs = append(opts.Configs, bench.RecordSenderProc, bench.RecordSenderOther)
				}
			}
			if before != "" {
				if opts.Before, err = bench.ReadBefore(before); err != nil {
					return fmt.Errorf("bench: --before: %w", err)
				}
				if !opts.Cost {
					return errors.New("bench: --before compares per-event cost: add --cost, --sweep or --full")
				}
			}
			if full && (reps != 5 || duration != 5*time.Second) {
				opts.Note = fmt.Sprintf("reduced from the documented full run (5 repetitions of 5s) to %d of %v to bound the machine time", reps, duration)
			}
			// -o is checked before the long run, not after it.
			return benchreport.Run(cmd.Context(), "bench", cmd.OutOrStdout(), out, asJSON, func(ctx context.Context) (*bench.Report, error) {
				return bench.Run(ctx, opts)
			})
		},
	}
	f := cmd.Flags()
	f.IntVar(&reps, "reps", 5, "repetitions of each configuration")
	f.BoolVar(&pin, "pin", false, "run each host's processes (workload, its side's tracer) on a CPU of its own, as on two machines (--full: on unless --pin=false)")
	f.IntVar(&unlimitedReps, "unlimited-reps", 0, "repetitions on the unlimited link, whose losses the goals judge (0: --reps; --full: twice --reps)")
	f.DurationVar(&duration, "duration", 5*time.Second, "length of each transfer")
	f.StringVar(&links, "links", "unlimited", "link rates: unlimited or Mbit/s, comma-separated (e.g. unlimited,1000,100); none for no overhead table")
	f.StringVar(&configs, "configs", strings.Join(bench.AllConfigs, ","), "configurations to run, comma-separated (--churn: its own list unless given)")
	f.BoolVar(&sweep, "sweep", false, "also measure per-event cost and loss against ring-buffer size")
	f.BoolVar(&synth, "synth", false, "also measure the recording path with synthetic events at paced rates, alone and beside the transfer on the unlimited link; --sweep and --full include it")
	f.IntVar(&producers, "synth-producers", 1, "threads that make the synthetic events, each at an equal share of the rate (e.g. 2: one per vCPU here)")
	f.BoolVar(&cost, "cost", false, "also measure per-event cost (bpf_stats), --reps times; with --links none, only that")
	f.BoolVar(&churn, "churn", false, "also measure connection churn: short connections (one 100-byte request each) one after another, unlimited link, --reps times of --duration per configuration; with --links none, only that (and what else is asked)")
	f.StringVar(&before, "before", "", "set the per-event cost of this earlier JSON report (magnet bench --json) beside this run's")
	f.StringVar(&compareWith, "compare-with", "", "also record each cost workload with this other magnet binary at the same time, --reps times in each order, and compare")
	f.StringVar(&cmpLbl, "compare-label", "", "what the --compare-with binary is (e.g. a commit)")
	f.StringVar(&label, "label", "", "what this run measures (e.g. a commit), shown when a later report compares with it")
	f.BoolVar(&full, "full", false, "the full run: every link, every configuration, the sweep")
	f.StringVarP(&out, "output", "o", "", "write the report to FILE (markdown, or JSON with --json); default stdout")
	f.BoolVar(&asJSON, "json", false, "write JSON instead of markdown")
	f.IntVar(&snaplen, "tcpdump-snaplen", 0, "tcpdump -s; 0 keeps tcpdump's default (whole packets)")
	cmd.AddCommand(bwprobecmd.NewBench())
	cmd.AddCommand(primitivescmd.New())
	return cmd
}

// ParseLinks parses --links: "unlimited" (or 0) and rates in Mbit/s, or
// "none" for no overhead table at all (--cost or --sweep alone).
func ParseLinks(s string) ([]int, error) {
	var out []int
	if strings.TrimSpace(s) == "none" {
		return []int{}, nil
	}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if f == "unlimited" {
			out = append(out, 0)
			continue
		}
		n, err := strconv.Atoi(strings.TrimSuffix(strings.ToLower(f), "mbit"))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q: want unlimited or a rate in Mbit/s", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("no link given")
	}
	return out, nil
}

// ParseConfigs parses --configs against bench.KnownConfigs.
func ParseConfigs(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		ok := false
		for _, c := range bench.KnownConfigs {
			ok = ok || c == f
		}
		if !ok {
			return nil, fmt.Errorf("unknown configuration %q (want %s)", f, strings.Join(bench.KnownConfigs, ","))
		}
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, errors.New("no configuration given")
	}
	return out, nil
}
