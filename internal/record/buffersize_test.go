// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/record"
)

// The buffer size takes the syntax of every other size (--rotate-size,
// the daemon's and collect's configuration): "8 MiB" included.
func TestParseBufferSize(t *testing.T) {
	good := map[string]int{"8MiB": 8 << 20, "8 MiB": 8 << 20, "8M": 8 << 20, "64k": 64 << 10, "1GiB": 1 << 30, "4096": 4096, "256KB": 256 << 10}
	for in, want := range good {
		got, err := record.ParseBufferSize(in)
		if err != nil || got != want {
			t.Errorf("ParseBufferSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	bad := map[string]string{"": "bad size", "lots": "bad size", "3000": "power of two", "-8M": "bad size",
		"2GiB": "up to 1GiB", "1.5M": "bad size", "99999999999G": "too large", "1": "power of two", "0": "more than 0"}
	for in, want := range bad {
		if n, err := record.ParseBufferSize(in); err == nil || n != 0 || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseBufferSize(%q) = %d, %v; want an error with %q", in, n, err, want)
		}
	}
}
