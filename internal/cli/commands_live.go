// SPDX-License-Identifier: Apache-2.0

package cli

import (
	topcmd "github.com/magnet-tracer/magnet/internal/cli/top"
)

// The daemon's clients that are not the daemon's core.
func init() {
	subcommands = append(subcommands, topcmd.New)
}
