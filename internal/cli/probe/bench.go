// SPDX-License-Identifier: Apache-2.0

package probecmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/cli/benchreport"
	"github.com/magnet-tracer/magnet/internal/probeaccuracy"
)

// Defaults of the documented full grid.
const (
	fullCapacities = "100,1000"
	fullShares     = "0.1,0.3,0.6,0.9"
	fullCross      = "cbr,bursty"
	fullReps       = 5
	fullUnlimited  = 5
)

// NewBench returns `magnet bench probe`, the accuracy and cost of magnet
// probe on a path whose available bandwidth is known.
func NewBench() *cobra.Command {
	var (
		capacities, shares, cross, out, clientArgs, note string
		reps, unlimited                                  int
		passive, full, asJSON, ipv6                      bool
		passiveDur                                       time.Duration
	)
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Measure the accuracy and cost of magnet probe on a path of known available bandwidth",
		Long: `Measure how accurate and how cheap magnet probe is. Builds namespaces sender →
router → receiver with a tc tbf bottleneck on the router's egress toward the
receiver, injects constant-rate or bursty UDP cross traffic at the router
from a fourth namespace so that the available bandwidth A is known, and
runs magnet probe client against magnet probe server for every capacity,
available share and cross-traffic kind, --reps times, interleaved. Reports
the relative error e = (estimate − A)/A (median and 90th percentile of |e|),
time and probe bytes per estimate, whether the host-limited flag is raised
on an unlimited veth, and with --passive the delivery rate of a TCP transfer
on the same path read from a magnet record trace. --full is the documented
grid. Needs root. See docs/PROBE.md.`,
		Example: `  sudo magnet bench probe --capacities 100 --shares 0.3,0.9 --reps 1
  sudo magnet bench probe --full -o bench/PROBE.md`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			if full {
				for name, def := range map[string]string{"capacities": fullCapacities, "shares": fullShares, "cross": fullCross} {
					if !f.Changed(name) {
						_ = f.Set(name, def)
					}
				}
				if !f.Changed("reps") {
					reps = fullReps
				}
				if !f.Changed("unlimited") {
					unlimited = fullUnlimited
				}
				if !f.Changed("passive") {
					passive = true
				}
			}
			opts := probeaccuracy.Options{Reps: reps, Unlimited: unlimited, IPv6: ipv6, Passive: passive, PassiveDuration: passiveDur,
				Log: cmd.ErrOrStderr(), Command: commandLine(os.Args[1:]), ClientArgs: strings.Fields(clientArgs)}
			var err error
			if opts.Capacities, err = parseInts(capacities); err != nil {
				return fmt.Errorf("bench probe: --capacities: %w", err)
			}
			if opts.Shares, err = parseShares(shares); err != nil {
				return fmt.Errorf("bench probe: --shares: %w", err)
			}
			opts.Cross = splitList(cross)
			if reps < 0 || unlimited < 0 {
				return errors.New("bench probe: --reps and --unlimited must not be negative")
			}
			opts.Note = note
			if full && (reps != fullReps || unlimited != fullUnlimited) {
				opts.Note = strings.TrimSpace(fmt.Sprintf("reduced from the documented full run (%d repetitions, %d unlimited) to %d and %d. %s",
					fullReps, fullUnlimited, reps, unlimited, note))
			}
			if os.Geteuid() != 0 {
				return errors.New("bench probe: need root (network namespaces, BPF for --passive)")
			}
			if opts.Magnet, err = os.Executable(); err != nil {
				return fmt.Errorf("bench probe: find the magnet binary: %w", err)
			}
			// -o is checked before the long run, not after it.
			return benchreport.Run(cmd.Context(), "bench probe", cmd.OutOrStdout(), out, asJSON, func(ctx context.Context) (*probeaccuracy.Report, error) {
				return probeaccuracy.Run(ctx, opts)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&capacities, "capacities", "100", "bottleneck rates in Mbit/s, comma-separated")
	f.StringVar(&shares, "shares", fullShares, "available shares of the capacity, comma-separated, each in (0, 1]")
	f.StringVar(&cross, "cross", fullCross, "cross-traffic kinds: cbr, bursty")
	f.IntVar(&reps, "reps", 1, "estimates per grid cell")
	f.IntVar(&unlimited, "unlimited", 1, "estimates on the path without a bottleneck (must be host-limited)")
	f.BoolVar(&passive, "passive", false, "also measure each cell with a TCP transfer under magnet record")
	f.DurationVar(&passiveDur, "passive-duration", 2*time.Second, "length of each passive transfer")
	f.BoolVar(&ipv6, "ipv6", false, "probe (and transfer, with --passive) over IPv6 on the path's unique local addresses")
	f.BoolVar(&full, "full", false, "the documented full grid (100 and 1000 Mbit/s, 10-90 %, both kinds, 5 reps, passive)")
	f.StringVar(&clientArgs, "client-args", "", "extra arguments for magnet probe client, space-separated")
	f.StringVar(&note, "note", "", "a note for the report's header (what else ran on the machine, ...)")
	f.StringVarP(&out, "output", "o", "", "write the report to FILE (markdown, or JSON with --json); default stdout")
	f.BoolVar(&asJSON, "json", false, "write JSON instead of markdown")
	return cmd
}

// commandLine renders the command as a shell would take it back.
func commandLine(args []string) string {
	out := []string{"magnet"}
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t'\"$\\") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q: want a positive whole number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func parseShares(s string) ([]float64, error) {
	var out []float64
	for _, f := range splitList(s) {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || v <= 0 || v > 1 {
			return nil, fmt.Errorf("%q: want a share in (0, 1]", f)
		}
		out = append(out, v)
	}
	return out, nil
}
