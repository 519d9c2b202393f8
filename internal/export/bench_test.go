// SPDX-License-Identifier: Apache-2.0

package export_test

import (
	"errors"
	"io"
	"testing"

	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/internal/tracegen"
)

// The benchmarks read a synthetic trace (tracegen.Bench: MAGNET_BENCH_EVENTS
// sets its size) and report events per second of wall and of CPU time and
// the peak heap; bench/analysis.sh runs them for bench/ANALYSIS.md.

func benchReader(b *testing.B, fn func(r *trace.Reader) error) {
	tracegen.Bench(b, func(path string) error {
		r, err := trace.Open(path)
		if err != nil {
			return err
		}
		defer r.Close()
		return fn(r)
	})
}

// BenchmarkRead is the trace reader alone: every record, nothing done.
func BenchmarkRead(b *testing.B) {
	benchReader(b, func(r *trace.Reader) error {
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

// BenchmarkParse is `magnet parse TRACE`: one text line per event.
func BenchmarkParse(b *testing.B) {
	benchReader(b, func(r *trace.Reader) error {
		return export.WriteText(io.Discard, r, export.TextOptions{})
	})
}

func benchExport(b *testing.B, format string) {
	benchReader(b, func(r *trace.Reader) error {
		t := export.NewTable([]*trace.Header{r.Header()})
		w, err := export.NewRowWriter(format, t, io.Discard)
		if err != nil {
			return err
		}
		if _, err := export.WriteTable(t, []export.TableSource{{Name: "synth.mgt", Reader: r}}, w); err != nil {
			return err
		}
		return w.Close()
	})
}

// BenchmarkExportCSV is `magnet export --format csv`.
func BenchmarkExportCSV(b *testing.B) { benchExport(b, "csv") }

// BenchmarkExportJSONL is `magnet export --format jsonl`.
func BenchmarkExportJSONL(b *testing.B) { benchExport(b, "jsonl") }

// BenchmarkExportParquet is `magnet export --format parquet`.
func BenchmarkExportParquet(b *testing.B) { benchExport(b, "parquet") }
