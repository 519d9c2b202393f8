// SPDX-License-Identifier: Apache-2.0

// Command magnet records what applications ask of the network and what the
// Linux network stack makes of it. See README.md.
package main

import (
	"fmt"
	"os"

	"github.com/magnet-tracer/magnet/internal/cli"
)

func main() {
	if err := cli.NewRoot().Execute(); err != nil {
		if !cli.Silent(err) {
			fmt.Fprintf(os.Stderr, "magnet: %v\n", err)
		}
		os.Exit(cli.ExitCode(err))
	}
}
