// SPDX-License-Identifier: Apache-2.0

package report

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/cli/diff"
)

const testTrace = "../../../testdata/bigendian.mgt"

// execute runs a fresh command with args and returns what it printed.
func execute(cmd *cobra.Command, args ...string) (string, error) {
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// report A --compare B prints exactly what diff A B prints, as a table and
// as JSON.
func TestReportCompareIsDiff(t *testing.T) {
	for _, js := range [][]string{nil, {"--json"}} {
		want, err := execute(diff.New(), append(append([]string(nil), js...), testTrace, testTrace)...)
		if err != nil {
			t.Fatal(err)
		}
		got, err := execute(New(), append(append([]string(nil), js...), testTrace, "--compare", testTrace)...)
		if err != nil {
			t.Fatal(err)
		}
		if got != want || !strings.Contains(got, "connection") && !strings.Contains(got, "conn_a") {
			t.Errorf("report --compare %v:\n%s\nmagnet diff:\n%s", js, got, want)
		}
	}
}

// Bad uses of --compare: one error, saying what is wrong.
func TestReportCompareBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{testTrace, "--compare", "/nonexistent/b.mgt"}, "/nonexistent/b.mgt"},
		{[]string{testTrace, testTrace, "--compare", testTrace}, "give one trace"},
		{[]string{testTrace, "--compare", testTrace, "--conn", "4097"}, "neither --conn nor --html"},
	} {
		_, err := execute(New(), c.args...)
		if err == nil || !strings.HasPrefix(err.Error(), "report: ") || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error %v, want one line saying %q", c.args, err, c.want)
		}
	}
}

// The verdict's receiver lines: the stack and the socket queue, then the
// reader's states, or the group to record for them.
func TestWriteVerdictReceiver(t *testing.T) {
	v := &analyze.Verdict{Why: "w", Receiver: &analyze.TimeShare{ReceiveUs: 100, SocketWaitUs: 75, SocketShare: 0.75},
		Missing: []string{"sched at the receiver (record with --groups default,sched to see where the receiver's delay went)"}}
	var b bytes.Buffer
	writeVerdict(&b, v)
	for _, want := range []string{"25% in the stack (dev_recv to tcp_rcv), 75% in the socket queue", "record with --groups default,sched to see where the receiver's delay went"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("verdict lacks %q:\n%s", want, b.String())
		}
	}
	v.Receiver.Reader = &analyze.ReaderWait{FollowedUs: 60, AsleepUs: 54, RunnableUs: 3, OnCPUUs: 3, OffCPUShare: 0.95, Followed: 0.8}
	v.Missing = nil
	b.Reset()
	writeVerdict(&b, v)
	if want := "off-CPU 95% (asleep 90%, runnable but waiting for a CPU 5%), on CPU 5%; followed for 80% of the wait"; !strings.Contains(b.String(), want) {
		t.Errorf("verdict lacks %q:\n%s", want, b.String())
	}
}
