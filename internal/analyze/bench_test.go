// SPDX-License-Identifier: Apache-2.0

package analyze_test

import (
	"bufio"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/synth"
)

func synthTrace(b *testing.B, n int) (string, int) {
	path := filepath.Join(b.TempDir(), "synth.mgt")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	got, err := synth.Write(bw, synth.Options{Events: n})
	if err != nil {
		b.Fatal(err)
	}
	bw.Flush()
	f.Close()
	return path, got
}

func cpuNs() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

func BenchmarkReport(b *testing.B) {
	path, n := synthTrace(b, 1_000_000)
	b.ResetTimer()
	c0 := cpuNs()
	for range b.N {
		if _, err := analyze.Modulation([]string{path}, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(b.N*n)/(float64(cpuNs()-c0)/1e9), "events/cpu-s")
}
