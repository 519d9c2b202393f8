// SPDX-License-Identifier: Apache-2.0

// Package benchcmd is the `magnet bench` command: what a user measures on
// their own host. `magnet bench probe` is the accuracy of magnet probe;
// the project's own measurements (overhead against other tracers, per-event
// cost, synthetic events, build against build) are magnet-lab's.
package benchcmd

import (
	"github.com/spf13/cobra"

	probecmd "github.com/magnet-tracer/magnet/internal/cli/probe"
)

// New returns the bench command.
func New() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure magnet on this host: the accuracy of magnet probe",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(probecmd.NewBench())
	return cmd
}
