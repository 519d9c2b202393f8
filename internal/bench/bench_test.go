// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"context"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{10, 12, 14})
	// sd = 2, t(0.975, 2) = 4.303, half-width = 4.303*2/sqrt(3).
	if s.Mean != 12 || math.Abs(s.CI95-4.303*2/math.Sqrt(3)) > 1e-9 || s.N != 3 {
		t.Fatalf("Summarize = %+v", s)
	}
	if s := Summarize([]float64{5}); s.Mean != 5 || s.CI95 != 0 {
		t.Fatalf("one value: %+v", s)
	}
	if s := Summarize(nil); s.N != 0 {
		t.Fatalf("no value: %+v", s)
	}
	if tValue(100) != 1.96 || tValue(1) != 12.706 {
		t.Fatal("t table")
	}
}

func TestEvaluateGoals(t *testing.T) {
	r := &Report{Links: []LinkResult{{RateMbit: 0, Configs: []ConfigResult{
		{Name: RecordSender, Runs: []Trial{{Rep: 1}}, ReductionPct: Stat{Mean: 0.5, N: 1}},
		{Name: TcpdumpSender, Runs: []Trial{{Rep: 1}}, ReductionPct: Stat{Mean: 40, N: 1}},
		{Name: RecordReceiver, Runs: []Trial{{Rep: 1, Tracer: Traced{Lost: 3}}}, ReductionPct: Stat{Mean: 2, N: 1}},
	}}}}
	g := evaluate(r)
	r.Goals = g
	want := []string{met, met, missed, notMeasured, missed, notMeasured, notMeasured, notMeasured}
	if len(g) != len(want) {
		t.Fatalf("%d goals, want %d", len(g), len(want))
	}
	for i := range want {
		if g[i].Verdict != want[i] {
			t.Errorf("goal %q: %s, want %s (%s)", g[i].Goal, g[i].Verdict, want[i], g[i].Measured)
		}
	}
	var buf bytes.Buffer
	if err := r.WriteMarkdown(&buf); err != nil || !strings.Contains(buf.String(), "**missed**") {
		t.Fatalf("markdown: %v\n%s", err, buf.String())
	}
}

// TestSmoke is the CI run of the bench: one repetition of 1-second
// transfers, baseline, loaded and record-sender, unlimited link. It keeps
// the bench code from rotting; its numbers mean little.
func TestSmoke(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and BPF")
	}
	if err := netlab.Available(); err != nil {
		t.Skip(err)
	}
	if testing.Short() {
		t.Skip("builds magnet and runs transfers")
	}
	bin := filepath.Join(t.TempDir(), "magnet")
	build := exec.Command("go", "build", "-o", bin, "github.com/magnet-tracer/magnet/cmd/magnet")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build magnet: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var log bytes.Buffer
	r, err := Run(ctx, Options{
		Magnet: bin, Reps: 1, Duration: time.Second, Links: []int{0},
		Configs: []string{Baseline, Loaded, RecordSender}, Log: &log,
	})
	t.Log(log.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Links) != 1 || len(r.Links[0].Configs) != 3 {
		t.Fatalf("report has %d links", len(r.Links))
	}
	for _, c := range r.Links[0].Configs {
		if c.Skipped != "" || c.ThroughputMbit.Mean <= 0 {
			t.Errorf("%s: throughput %v Mbit/s, skipped %q", c.Name, c.ThroughputMbit.Mean, c.Skipped)
		}
		if c.Name == RecordSender && c.Events.Mean <= 0 {
			t.Errorf("record-sender recorded no events")
		}
	}
	var md bytes.Buffer
	if err := r.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteJSON(&bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
}
