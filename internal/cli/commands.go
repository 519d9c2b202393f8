// SPDX-License-Identifier: Apache-2.0

package cli

func init() {
	subcommands = append(subcommands)
}
