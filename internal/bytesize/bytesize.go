// SPDX-License-Identifier: Apache-2.0

// Package bytesize reads byte counts as people type them: "8MiB", "8 MiB",
// "500M", "4096". It is the one syntax of every size magnet takes, on the
// command line and in configuration files alike.
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// units are the suffixes Parse knows, longest first so that "KiB" is not
// read as "B". K, KB and KiB alike are powers of 1024: magnet's sizes are
// of buffers and files, and a KB of 1000 beside a KiB of 1024 in the same
// option would be a trap.
var units = []struct {
	suffix string
	mult   int64
}{
	{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"TIB", 1 << 40},
	{"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"TB", 1 << 40},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

// Parse reads a size in bytes: a positive whole number, then optionally
// spaces and a unit (B, K, M, G or T, each also as KB or KiB, in any case;
// all powers of 1024). Spaces around it are ignored. Zero, a sign, a
// fraction or a size past what an int64 holds is an error.
func Parse(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range units {
		if rest, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimRight(rest, " \t"), u.mult
			break
		}
	}
	if t == "" || strings.TrimLeft(t, "0123456789") != "" {
		return 0, fmt.Errorf("bad size %q: want a whole number of bytes with an optional unit, e.g. 8MiB or 500M", s)
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q too large", s)
	}
	if n == 0 {
		return 0, fmt.Errorf("size %q: want more than 0", s)
	}
	return n * mult, nil
}
