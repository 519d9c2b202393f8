// SPDX-License-Identifier: Apache-2.0

// End-to-end tests: the built magnet-lab, as the project runs it.
package main_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// labBin builds magnet-lab into a test directory.
func labBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "magnet-lab")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

func run(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// Bad input gives one line and a failing exit; as root, tiny counts give
// a whole report of the kernel's primitives on stdout.
func TestBadInputAndPrimitives(t *testing.T) {
	bin := labBin(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"primitives", "--reps", "0"}, "primitives: --reps 0: want 1 to"},
		{[]string{"primitives", "--runs", "-1"}, "primitives: --runs -1: want 1 to"},
		{[]string{"primitives", "--events-per-s", "0"}, "--events-per-s 0"},
		{[]string{"primitives", "--nope"}, "unknown flag: --nope"},
		{[]string{"bench", "--reps", "0"}, "bench: --reps 0: want at least 1"},
		{[]string{"bench", "--configs", "strace"}, `unknown configuration "strace"`},
		{[]string{"nope"}, `unknown command "nope"`},
	} {
		_, stderr, code := run(t, bin, c.args...)
		msg := strings.TrimRight(stderr, "\n")
		if code == 0 || strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "magnet-lab: ") || !strings.Contains(msg, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want one line saying %q", c.args, code, stderr, c.want)
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("the primitives' run needs root")
	}
	stdout, stderr, code := run(t, bin, "primitives", "--reps", "2", "--runs", "2000")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"# magnet-lab primitives", "- **Command:** `magnet-lab primitives --reps 2 --runs 2000`", "| ktime_ringbuf |", "## The floor"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, stdout)
		}
	}
}
