// SPDX-License-Identifier: Apache-2.0

package cli

// Version is magnet's version, shown by `magnet --version` and in the man
// pages. Release builds set it at link time:
//
//	go build -ldflags "-X github.com/magnet-tracer/magnet/internal/cli.Version=1.2.3"
//
// (the Makefile does); a plain `go build` says "dev".
var Version = "dev"
