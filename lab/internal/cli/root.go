// SPDX-License-Identifier: Apache-2.0

// Package cli assembles magnet-lab, the measurement lab: what the project
// measures about itself (the cost of recording against other tracers and
// earlier builds, synthetic events, the kernel's primitives). None of it
// ships in the magnet binary; users measure their host with `magnet bench`.
package cli

import (
	"github.com/spf13/cobra"

	benchcmd "github.com/magnet-tracer/magnet/lab/internal/cli/bench"
	primitivescmd "github.com/magnet-tracer/magnet/lab/internal/cli/primitives"
)

// NewRoot builds the magnet-lab command tree.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "magnet-lab",
		Short:         "magnet's measurement lab: what recording costs, measured every way",
		Long:          "magnet-lab measures magnet itself: recording's overhead against no tracer, tcpdump and bpftrace, connection churn, per-event cost, loss against ring size, synthetic-event ceilings, another build of magnet side by side, and what the kernel's primitives cost. See lab/README.md.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(benchcmd.New(), primitivescmd.New())
	return root
}
