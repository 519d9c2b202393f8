// SPDX-License-Identifier: Apache-2.0

package overhead

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// TestMeasureSmall runs a tiny measurement end to end (real namespaces,
// iperf3, magnet record as a process, tcpdump) and checks what the report
// says against the tools' own counts. It asserts no CPU figure: the machine
// may be loaded, and those are the measurement's to report, not a test's.
func TestMeasureSmall(t *testing.T) {
	if err := netlab.Available(); err != nil {
		t.Skip(err)
	}
	for _, tool := range []string{"iperf3", "tcpdump"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	bin := filepath.Join(t.TempDir(), "magnet")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/magnet").CombinedOutput(); err != nil {
		t.Fatalf("build magnet: %v\n%s", err, out)
	}
	configs, err := Select("record,record-noemit,tcpdump")
	if err != nil {
		t.Fatal(err)
	}
	sat, err := Select("record")
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	rep, err := Measure(context.Background(), Options{
		Magnet: bin, Workload: Iperf3, RateMbit: 500, Reps: 2, Duration: time.Second,
		Configs: configs, Saturation: sat, TcpdumpSnaplen: 96, WorkDir: t.TempDir(), Log: &log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("runs:\n%s", log.String())
	want := map[string]int{"fixed/baseline": 2, "fixed/record": 2, "fixed/record-noemit": 2, "fixed/tcpdump": 2, "saturation/baseline": 2, "saturation/record": 2}
	got := map[string]int{}
	for _, run := range rep.Runs {
		if run.Err != "" {
			t.Errorf("%s %d %s: %s", run.Phase, run.Rep, run.Config, run.Err)
			continue
		}
		got[run.Phase+"/"+run.Config]++
		if run.Received == 0 || run.Sent < run.Received || run.BusyS <= 0 || run.Seconds <= 0 {
			t.Errorf("%s %d %s: sent %d, received %d, CPU %v s over %v s", run.Phase, run.Rep, run.Config, run.Sent, run.Received, run.BusyS, run.Seconds)
		}
		switch run.Config {
		case Record:
			if run.Events == 0 || run.Lost != 0 {
				t.Errorf("%s %d record: %d events, %d lost", run.Phase, run.Rep, run.Events, run.Lost)
			}
			// The trace's socket calls on the data connection carry
			// exactly what iperf3 counted, and its cookie.
			if d := rep.accountingDiff(run); d != "" {
				t.Errorf("%s %d record: %s", run.Phase, run.Rep, d)
			}
		case RecordNoEmit:
			// Every program ran in full and wrote no event: the
			// trace holds connections only, and nothing was lost.
			if run.Events != 0 || run.Lost != 0 {
				t.Errorf("%s %d record-noemit: %d events, %d lost", run.Phase, run.Rep, run.Events, run.Lost)
			}
		case TcpdumpName:
			if run.Events == 0 {
				t.Errorf("tcpdump %d: no packet captured", run.Rep)
			}
		}
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s: %d runs, want %d", k, got[k], n)
		}
	}
	// The report's figures are the runs': bytes from iperf3's receiver.
	row := rep.row(rep.Fixed, Record)
	if row == nil || row.Runs != 2 || row.Lost != 0 || row.MoreCPU.N != 2 || row.CPUPerGB.Mean <= 0 {
		t.Fatalf("record row: %+v", row)
	}
	var sum float64
	for _, run := range rep.Runs {
		if run.Phase == PhaseFixed && run.Config == Record {
			sum += run.BusyS / (float64(run.Received) / 1e9)
		}
	}
	if diff := row.CPUPerGB.Mean - sum/2; diff > 1e-9 || diff < -1e-9 {
		t.Errorf("record CPU per GB %v, runs say %v", row.CPUPerGB.Mean, sum/2)
	}
	var md bytes.Buffer
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"## Against the goals", "## CPU per GB at 0.5 Gbit/s", "## Throughput at saturation", "| record |", "| tcpdump |"} {
		if !strings.Contains(md.String(), s) {
			t.Errorf("markdown lacks %q", s)
		}
	}
	if os.Getenv("OVERHEAD_SHOW") != "" {
		t.Log(md.String())
	}
}
