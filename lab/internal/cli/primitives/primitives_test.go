// SPDX-License-Identifier: Apache-2.0

package primitivescmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func run(args ...string) (string, error) {
	cmd := New()
	var out bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	return out.String(), err
}

// Bad input fails before anything is loaded, with one line naming the flag.
func TestFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--reps", "0"}, "primitives: --reps 0: want 1 to"},
		{[]string{"--runs", "-1"}, "primitives: --runs -1: want 1 to"},
		{[]string{"--runs", "0"}, "primitives: --runs 0"},
		{[]string{"--runs", "2000000"}, "primitives: --runs 2000000: want 1 to 1000000"},
		{[]string{"--events-per-s", "0"}, "primitives: --events-per-s 0: want a positive rate"},
		{[]string{"--events-per-s", "-5"}, "--events-per-s -5"},
		{[]string{"--events-per-s", "lots"}, `invalid argument "lots"`},
		{[]string{"--bogus"}, "unknown flag: --bogus"},
		{[]string{"stray"}, `unknown command "stray"`},
		{[]string{"-o", "/nonexistent-dir/p.md", "--reps", "1", "--runs", "1"}, "primitives: -o: stat /nonexistent-dir"},
	} {
		_, err := run(c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error %v, want one line with %q", c.args, err, c.want)
		}
	}
}

// The CLI smoke: tiny counts, the report written to a file, every program
// in it. Figures are not judged (the machine is shared).
func TestSmoke(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF programs and maps")
	}
	path := filepath.Join(t.TempDir(), "PRIMITIVES.md")
	if _, err := run("--reps", "2", "--runs", "2000", "--events-per-s", "1000000", "-o", path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	for _, want := range []string{
		"# magnet-lab primitives", "repeat 2000", "2 repetitions",
		"| empty |", "| ktime_get_ns |", "| ringbuf_reserve_submit |", "| array_ring |", "| ktime_array_ring |",
		"At **1,000,000 events/s** on the bottleneck CPU (given with --events-per-s), the 1 % goal leaves each event **10.0 ns**",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	out, err := run("--reps", "1", "--runs", "100", "--json")
	if err != nil || !strings.Contains(out, `"ktime_array_ring"`) || !strings.Contains(out, `"budget_ns": 20.408`) {
		t.Errorf("--json: %v\n%s", err, out)
	}
}
