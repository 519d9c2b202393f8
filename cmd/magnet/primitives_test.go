// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"strings"
	"testing"
)

// magnet bench primitives as a user types it: bad input gives one line and
// a failing exit; as root, tiny counts give a whole report on stdout.
func TestBenchPrimitives(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "primitives", "--reps", "0"}, "bench primitives: --reps 0: want 1 to"},
		{[]string{"bench", "primitives", "--runs", "-1"}, "bench primitives: --runs -1: want 1 to"},
		{[]string{"bench", "primitives", "--events-per-s", "0"}, "--events-per-s 0"},
		{[]string{"bench", "primitives", "--nope"}, "unknown flag: --nope"},
	} {
		oneLineError(t, magnet(t, c.args...), c.want)
	}
	needRoot(t)
	r := magnet(t, "bench", "primitives", "--reps", "2", "--runs", "2000")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"# magnet bench primitives", "- **Command:** `magnet bench primitives --reps 2 --runs 2000`", "| ktime_ringbuf |", "## The floor"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, r.stdout)
		}
	}
}
