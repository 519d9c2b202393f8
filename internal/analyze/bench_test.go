// SPDX-License-Identifier: Apache-2.0

package analyze_test

import (
	"io"
	"testing"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/internal/tracegen"
)

// The benchmarks analyse a synthetic trace (tracegen.Bench: MAGNET_BENCH_EVENTS
// sets its size) and report events per second of wall and of CPU time and
// the peak heap; bench/analysis.sh runs them for bench/ANALYSIS.md.

// BenchmarkReport is `magnet report TRACE`: every table, both ends of
// every connection followed.
func BenchmarkReport(b *testing.B) {
	tracegen.Bench(b, func(path string) error {
		_, err := analyze.Modulation([]string{path}, 0)
		return err
	})
}

// BenchmarkPerfetto is `magnet export --format perfetto`.
func BenchmarkPerfetto(b *testing.B) {
	tracegen.Bench(b, func(path string) error {
		_, err := analyze.WritePerfetto(io.Discard, []string{path})
		return err
	})
}

// BenchmarkJourneys is `magnet export --table journeys --format csv`.
func BenchmarkJourneys(b *testing.B) {
	tracegen.Bench(b, func(path string) error {
		rw, err := export.NewRowWriter("csv", export.JourneyTable(), io.Discard)
		if err != nil {
			return err
		}
		if _, err := analyze.WriteJourneys(trace.Sources([]string{path}), rw); err != nil {
			return err
		}
		return rw.Close()
	})
}
