// SPDX-License-Identifier: Apache-2.0

// Command magnet-lab is magnet's measurement lab (lab/README.md): the
// benchmarks the project runs on itself, kept out of the magnet binary.
package main

import (
	"fmt"
	"os"

	"github.com/magnet-tracer/magnet/lab/internal/cli"
)

func main() {
	if err := cli.NewRoot().Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "magnet-lab: %v\n", err)
		os.Exit(1)
	}
}
