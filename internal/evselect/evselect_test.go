// SPDX-License-Identifier: Apache-2.0

package evselect

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSplitArgs(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.mgt"), filepath.Join(dir, "b.mgt")
	for _, p := range []string{a, b} {
		os.WriteFile(p, nil, 0o644)
	}
	for _, tc := range []struct {
		args   []string
		dash   int
		traces string
		expr   string
	}{
		{[]string{a}, -1, a, ""},
		{[]string{a, b}, -1, a + "," + b, ""},
		{[]string{a, "tcp", "port", "80"}, -1, a, "tcp port 80"},
		{[]string{a, b, "host 10.0.0.1"}, -1, a + "," + b, "host 10.0.0.1"},
		{[]string{dir, "udp"}, -1, dir, "udp"},
		{[]string{"s3://bucket/x", "udp"}, -1, "s3://bucket/x", "udp"},
		// After "--" everything is the expression, even a file's name.
		{[]string{a, b, "udp"}, 1, a, b + " udp"},
		{[]string{"missing.mgt", "udp"}, -1, "", "missing.mgt udp"},
	} {
		tr, e := SplitArgs(tc.args, tc.dash)
		if strings.Join(tr, ",") != tc.traces || e != tc.expr {
			t.Errorf("%q dash %d: traces %q expr %q, want %q %q", tc.args, tc.dash, tr, e, tc.traces, tc.expr)
		}
	}
	if _, err := ParsePcap("missing.mgt udp"); err == nil || !strings.Contains(err.Error(), "missing.mgt: no such file") {
		t.Errorf("a missing trace reads as %v", err)
	}
	if _, err := ParsePcap("./x udp"); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("a missing path reads as %v", err)
	}
}
