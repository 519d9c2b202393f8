// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/tracegen"
)

// TestExportParquetSpeed: `magnet export --format parquet`, to one file
// and as a dataset, takes at most a CPU-second per million events. CPU
// time (user + system, from the process's rusage) is what the floor is
// about, not wall time, which other work on the machine stretches; the
// least of three runs is kept for the same reason (a run that shared its
// core lost cache to the other work). bench/EXPORT.md measures it on a
// real recording.
func TestExportParquetSpeed(t *testing.T) {
	if testing.Short() {
		t.Skip("exports 2 M events six times")
	}
	dir := t.TempDir()
	trace := filepath.Join(dir, "flood.mgt")
	f, err := os.Create(trace)
	if err != nil {
		t.Fatal(err)
	}
	n, err := tracegen.Write(f, tracegen.Options{Events: 2_000_000, Conns: 4})
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	events := float64(n)
	for _, c := range []struct {
		name string
		args func(i int) []string
	}{
		{"file", func(i int) []string {
			return []string{"export", trace, "--format", "parquet", "--no-conns", "-o", filepath.Join(dir, "out.parquet")}
		}},
		{"dataset", func(i int) []string {
			return []string{"export", trace, "--format", "parquet", "--dataset", filepath.Join(dir, "ds", string(rune('a'+i))), "--partition", "host,date"}
		}},
	} {
		best := time.Duration(1 << 62)
		for i := 0; i < 3; i++ {
			cmd := exec.Command(bin, c.args(i)...)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", c.name, err, out)
			}
			ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
			cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
			best = min(best, cpu)
		}
		rate := events / best.Seconds()
		t.Logf("%s: %.0f events in %s CPU: %.2f M events per CPU-second", c.name, events, best.Round(time.Millisecond), rate/1e6)
		if rate < 1e6 {
			t.Errorf("%s: %.2f M events per CPU-second, want at least 1", c.name, rate/1e6)
		}
	}
}
