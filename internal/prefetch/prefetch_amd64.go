// SPDX-License-Identifier: Apache-2.0

package prefetch

// Read hints that the bytes of b will be read soon.
//
//go:noescape
func Read(b []byte)

// Write hints that the bytes of b will be written soon.
//
//go:noescape
func Write(b []byte)
