// SPDX-License-Identifier: Apache-2.0

package export_test

import (
	"bufio"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/synth"
	"github.com/magnet-tracer/magnet/internal/trace"
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

func benchEach(b *testing.B, fn func(r *trace.Reader) error) {
	path, n := synthTrace(b, 1_000_000)
	b.ResetTimer()
	c0 := cpuNs()
	for range b.N {
		r, err := trace.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := fn(r); err != nil {
			b.Fatal(err)
		}
		r.Close()
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(b.N*n)/(float64(cpuNs()-c0)/1e9), "events/cpu-s")
}

func BenchmarkRead(b *testing.B) {
	benchEach(b, func(r *trace.Reader) error {
		for {
			if _, err := r.Next(); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
		}
	})
}

func BenchmarkParseText(b *testing.B) {
	benchEach(b, func(r *trace.Reader) error {
		return export.WriteText(io.Discard, r, export.TextOptions{})
	})
}

func BenchmarkExportCSV(b *testing.B) {
	benchEach(b, func(r *trace.Reader) error {
		t := export.NewTable([]*trace.Header{r.Header()})
		w, err := export.NewRowWriter("csv", t, io.Discard)
		if err != nil {
			return err
		}
		if err := export.WriteTable(t, []export.TableSource{{Name: "synth", Reader: r}}, w); err != nil {
			return err
		}
		return w.Close()
	})
}
