// SPDX-License-Identifier: Apache-2.0

//go:build !amd64

package prefetch

// Read hints that the bytes of b will be read soon: a no-op on this
// architecture.
func Read(b []byte) {}

// Write hints that the bytes of b will be written soon: a no-op on this
// architecture.
func Write(b []byte) {}
