// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// magnet bench as a user types it: bad input gives one line and a failing
// exit before anything is built; as root, a one-transfer run writes a JSON
// report whose recorded run agrees with iperf3's own counts.
func TestBench(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--reps", "0"}, "bench: --reps 0: want at least 1"},
		{[]string{"bench", "--duration", "1500ms"}, "bench: --duration 1.5s: want whole seconds"},
		{[]string{"bench", "--configs", "record,strace"}, `bench: --configs: unknown configuration "strace"`},
		{[]string{"bench", "--workload", "netperf"}, `bench: --workload "netperf": want iperf3 or magnet`},
		{[]string{"bench", "-o", "/nonexistent/dir/r.md", "--reps", "1"}, "bench: -o:"},
	} {
		r := magnet(t, c.args...)
		if c.args[1] == "-o" && os.Geteuid() != 0 {
			continue // not root: told so before -o is checked
		}
		oneLineError(t, r, c.want)
	}
	needRoot(t)
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("iperf3 not installed")
	}
	out := filepath.Join(t.TempDir(), "cost.json")
	r := magnet(t, "bench", "--reps", "1", "--duration", "1s", "--rate", "500", "--configs", "record",
		"--saturation-configs", "none", "--diagnostic=false", "--json", "-o", out)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Runs []struct {
			Config    string `json:"config"`
			Sent      int64  `json:"sent_bytes"`
			Received  int64  `json:"received_bytes"`
			Events    uint64 `json:"events"`
			Lost      uint64 `json:"lost"`
			TraceRecv int64  `json:"trace_received_bytes"`
			Err       string `json:"error"`
		} `json:"runs"`
		Goals []struct {
			Goal, Verdict string
		} `json:"goals"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, b)
	}
	var configs []string
	for _, run := range rep.Runs {
		configs = append(configs, run.Config)
		if run.Err != "" || run.Received <= 0 {
			t.Errorf("%s: %+v", run.Config, run)
		}
		// iperf3 sends a 37-byte cookie on the data connection before
		// the data it counts; the trace's socket calls see it.
		if run.Config == "record" && (run.Events == 0 || run.Lost != 0 || run.TraceRecv != run.Received+37) {
			t.Errorf("record: %+v", run)
		}
	}
	// Each repetition runs its configurations in an order of its own.
	slices.Sort(configs)
	if strings.Join(configs, ",") != "baseline,record" || len(rep.Goals) == 0 {
		t.Errorf("runs %v, goals %+v", configs, rep.Goals)
	}
}
