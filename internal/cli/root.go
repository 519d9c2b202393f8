// SPDX-License-Identifier: Apache-2.0

// Package cli assembles magnet's subcommands into one cobra root command.
// Each subcommand lives in its own package under internal/cli and exports
// New() *cobra.Command; this package only wires them together.
package cli

import (
	"errors"

	"github.com/spf13/cobra"
)

// ExitCode returns the process exit code for err: its own, when it carries
// one (a recorded command's status), else 1.
func ExitCode(err error) int {
	var ec interface{ ExitCode() int }
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return 1
}

// Silent reports whether err needs no message (the exit status says it all).
func Silent(err error) bool {
	var s interface{ Silent() bool }
	return errors.As(err, &s) && s.Silent()
}

// NewRoot builds the magnet command tree.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "magnet",
		Short:         "Monitor for application-generated network traffic",
		Long:          "magnet records every step of data through the Linux network stack, from the application's socket calls down to the device, with eBPF.",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       Version,
	}
	root.CompletionOptions.HiddenDefaultCmd = true
	for _, c := range subcommands {
		root.AddCommand(c())
	}
	return root
}

// subcommands lists the constructors of every subcommand; see commands.go.
var subcommands []func() *cobra.Command
