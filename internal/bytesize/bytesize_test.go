// SPDX-License-Identifier: Apache-2.0

package bytesize

import (
	"strconv"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	good := map[string]int64{
		"4096": 4096, "1B": 1, "64k": 64 << 10, "256KB": 256 << 10, "8KiB": 8 << 10,
		"8M": 8 << 20, "8MiB": 8 << 20, "8 MiB": 8 << 20, " 8mib ": 8 << 20, "8\tMB": 8 << 20,
		"1GiB": 1 << 30, "3g": 3 << 30, "2TiB": 2 << 40, "1T": 1 << 40,
		"0008M":               8 << 20,
		"8388607T":            8388607 << 40, // the largest whole number of TiB an int64 holds
		"9223372036854775807": 1<<63 - 1,
	}
	for in, want := range good {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	bad := map[string]string{
		"": "bad size", " ": "bad size", "MiB": "bad size", "lots": "bad size", "8X": "bad size",
		"-8M": "bad size", "+8M": "bad size", "1.5M": "bad size", "8 M iB": "bad size", "8MiB8": "bad size",
		"8 8M": "bad size", "0x10": "bad size", "8MiBB": "bad size", "8PiB": "bad size",
		"0": "want more than 0", "0KiB": "want more than 0",
		"8388608T": "too large", "99999999999G": "too large", "9223372036854775808": "too large",
	}
	for in, want := range bad {
		if n, err := Parse(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %d, %v; want an error with %q", in, n, err, want)
		}
	}
}

// FuzzParse checks that Parse never panics, that what it accepts is
// positive, and that the same size written as a plain byte count, in
// another case or with spaces around it reads back the same.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"8MiB", "8 MiB", "500M", "4096", "1.5G", "-1", "0", "99999999999G", "8388607T", "kib", " 7 b "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err != nil {
			if n != 0 {
				t.Fatalf("Parse(%q) = %d with error %v", s, n, err)
			}
			return
		}
		if n <= 0 {
			t.Fatalf("Parse(%q) = %d: not positive", s, n)
		}
		for _, same := range []string{strconv.FormatInt(n, 10), strconv.FormatInt(n, 10) + "b", strings.ToLower(s), strings.ToUpper(s), " " + s + " "} {
			if m, err := Parse(same); err != nil || m != n {
				t.Fatalf("Parse(%q) = %d but Parse(%q) = %d, %v", s, n, same, m, err)
			}
		}
	})
}
