// SPDX-License-Identifier: Apache-2.0

package prefetch

import "testing"

// TestRanges calls both hints on ranges of every awkward shape: empty,
// shorter than a line, unaligned, ending at the very end of the slice.
// A hint changes no byte.
func TestRanges(t *testing.T) {
	b := make([]byte, 4096)
	for i := range b {
		b[i] = byte(i * 7)
	}
	for _, r := range [][2]int{{0, 0}, {0, 1}, {3, 70}, {63, 65}, {64, 128}, {100, 4096}, {4095, 4096}, {0, 4096}} {
		Read(b[r[0]:r[1]])
		Write(b[r[0]:r[1]])
	}
	Read(nil)
	Write(nil)
	for i := range b {
		if b[i] != byte(i*7) {
			t.Fatalf("byte %d changed", i)
		}
	}
}

func BenchmarkRead2KiB(b *testing.B) {
	buf := make([]byte, 2048)
	for b.Loop() {
		Read(buf)
	}
}

func BenchmarkWrite2KiB(b *testing.B) {
	buf := make([]byte, 2048)
	for b.Loop() {
		Write(buf)
	}
}
