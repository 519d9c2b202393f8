// SPDX-License-Identifier: Apache-2.0

package probe

import "testing"

func TestWakeupBytes(t *testing.T) {
	for _, c := range []struct {
		perCPU int
		fill   float64
		want   uint64
	}{
		{4 << 20, 0, 2 << 20},         // the default: half
		{4 << 20, 1.0 / 64, 64 << 10}, // sooner
		{4 << 20, 1.0 / 8, 512 << 10}, // sooner
		{4 << 20, 1, 4 << 20},         // only when full
		{4 << 20, 2, 4 << 20},         // never past the ring
		{4 << 20, 1e-12, 1},           // at every event
		{4096, 1.0 / 8, 512},
	} {
		if got := wakeupBytes(c.perCPU, c.fill); got != c.want {
			t.Errorf("wakeupBytes(%d, %g) = %d, want %d", c.perCPU, c.fill, got, c.want)
		}
	}
}
