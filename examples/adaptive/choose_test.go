// SPDX-License-Identifier: Apache-2.0

package main

import "testing"

func TestChoose(t *testing.T) {
	const full, fps = 1 << 20, 25 // full frames need 209.7 Mbit/s, half 52.4, quarter 13.1
	cases := []struct {
		bps  float64
		cur  int
		want string
	}{
		{1e9, 0, "full"},
		{210e6, 1, "half"}, // enough for full, but not with 10 % to spare
		{231e6, 1, "full"},
		{210e6, 0, "full"}, // staying needs no headroom
		{95e6, 0, "half"},
		{24e6, 1, "quarter"},
		{55e6, 2, "quarter"}, // half needs 57.7 with headroom
		{58e6, 2, "half"},
		{1, 0, "sixteenth"}, // the smallest is all there is
	}
	for _, c := range cases {
		if got := Levels[Choose(c.bps, full, fps, c.cur)]; got != c.want {
			t.Errorf("Choose(%g bit/s, from %s) = %s, want %s", c.bps, Levels[c.cur], got, c.want)
		}
	}
	if FrameBytes(full, 2) != full/16 || FrameBytes(3, 4) != 1 {
		t.Fatal("FrameBytes")
	}
}
