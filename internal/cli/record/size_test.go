// SPDX-License-Identifier: Apache-2.0

package record

import (
	"strings"
	"testing"
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
