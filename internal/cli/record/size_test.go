// SPDX-License-Identifier: Apache-2.0

package record

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestWakeupFraction(t *testing.T) {
	good := map[float64]float64{12.5: 0.125, 100: 1, 1.5625: 1.0 / 64}
	for in, want := range good {
		got, err := wakeupFraction(in)
		if err != nil || got != want {
			t.Errorf("wakeupFraction(%g) = %g, %v; want %g", in, got, err, want)
		}
	}
	// 0 per cent: below any record, so every event wakes the reader.
	if got, err := wakeupFraction(0); err != nil || got <= 0 || got > 1e-9 {
		t.Errorf("wakeupFraction(0) = %g, %v; want a tiny positive fraction", got, err)
	}
	for _, in := range []float64{-1, 100.5, math.NaN()} {
		if _, err := wakeupFraction(in); err == nil || !strings.Contains(err.Error(), "between 0 and 100") {
			t.Errorf("wakeupFraction(%g) error = %v", in, err)
		}
	}
}

func TestCheckFlushEvery(t *testing.T) {
	for _, c := range []struct {
		d, rotate time.Duration
		want      string // "" = accepted
	}{
		{200 * time.Millisecond, 0, ""},
		{time.Millisecond, 0, ""},
		{time.Minute, 0, ""},
		{time.Second, time.Second, ""},
		{0, 0, "--flush-every 0s: want between 1ms and 1m"},
		{-time.Second, 0, "--flush-every -1s: want between 1ms and 1m"},
		{500 * time.Microsecond, 0, "want between 1ms and 1m"},
		{time.Hour, 0, "--flush-every 1h0m0s: want between 1ms and 1m"},
		{2 * time.Second, time.Second, "--flush-every 2s: longer than --rotate 1s"},
	} {
		err := checkFlushEvery(c.d, c.rotate)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("checkFlushEvery(%v, %v) = %v, want %q", c.d, c.rotate, err, c.want)
		}
	}
}
