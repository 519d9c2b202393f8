// SPDX-License-Identifier: Apache-2.0

// Package cli assembles magnet's subcommands into one cobra root command.
// Each subcommand lives in its own package under internal/cli and exports
// New() *cobra.Command; this package only wires them together.
package cli

import (
	"errors"

	"github.com/spf13/cobra"
)

// ExitError carries a specific process exit code with an error.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// ExitCode returns the process exit code for err: the code of an ExitError,
// else 1.
func ExitCode(err error) int {
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	return 1
}

// NewRoot builds the magnet command tree.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "magnet",
		Short:         "Monitor for application-generated network traffic",
		Long:          "magnet records every step of data through the Linux network stack, from the application's socket calls down to the device, with eBPF.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.CompletionOptions.HiddenDefaultCmd = true
	for _, c := range subcommands {
		root.AddCommand(c())
	}
	return root
}

// subcommands lists the constructors of every subcommand; see commands.go.
var subcommands []func() *cobra.Command
