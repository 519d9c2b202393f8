// SPDX-License-Identifier: Apache-2.0

package record

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	good := map[string]int{"8MiB": 8 << 20, "8M": 8 << 20, "64k": 64 << 10, "1GiB": 1 << 30, "4096": 4096, "256KB": 256 << 10}
	for in, want := range good {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	bad := map[string]string{"": "bad size", "lots": "bad size", "3000": "power of two", "-8M": "bad size", "2GiB": "power of two", "1.5M": "bad size", "99999999999G": "too large"}
	for in, want := range bad {
		if _, err := ParseSize(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseSize(%q) error = %v, want %q", in, err, want)
		}
	}
}

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
