// SPDX-License-Identifier: Apache-2.0

package record

import (
	"errors"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/pcapfilter"
)

// A bad expression is refused before anything loads, in one line naming
// the column; a command written without -- is pointed to its place.
func TestCheckExpression(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{"", ""},
		{"tcp port 443 and net 10.1.0.0/16", ""},
		{"tcp port", "column 9 (end): port needs a value"},
		{"host 10.0.0.1 and len > 100", `column 19: "len" is not supported`},
		{"tcp[13] & 2 != 0", `column 4: unexpected character '['`},
		{"ls -l", `unexpected argument "ls" (put the command to record after --)`},
		{strings.Repeat("port 1 or ", 64) + "port 2", "more than 128 tests"},
	} {
		err := checkExpression(tc.expr)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.expr, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") || !errors.Is(err, pcapfilter.ErrSyntax)):
			t.Errorf("%q: error %v, want one line containing %q", tc.expr, err, tc.want)
		}
	}
}

// The expression comes before --, the command after it.
func TestExpressionArgs(t *testing.T) {
	cmd := New()
	cmd.SetArgs([]string{"-o", t.TempDir() + "/x.mgt", "tcp", "port", "--", "true"})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "record: pcap filter: column 9 (end): port needs a value") {
		t.Fatalf("record tcp port -- true: %v", err)
	}
}

// An empty --filter is refused rather than read as "every event".
func TestCELFilterEmpty(t *testing.T) {
	cmd := New()
	cmd.SetArgs([]string{"-o", t.TempDir() + "/x.mgt", "--filter", " "})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "record: --filter is empty") {
		t.Fatalf("record --filter ' ': %v", err)
	}
}

// --no-emit runs every program in full: with --hooks-only (which runs
// none) or --summary (which writes no event anyway) it is refused, before
// anything loads.
func TestNoEmitCombinations(t *testing.T) {
	for _, extra := range [][]string{{"--hooks-only"}, {"--summary=1s"}} {
		cmd := New()
		cmd.SetArgs(append([]string{"-o", t.TempDir() + "/x.mgt", "--no-emit"}, extra...))
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), "record: --no-emit runs the programs in full") {
			t.Fatalf("record --no-emit %v: %v", extra, err)
		}
	}
}
