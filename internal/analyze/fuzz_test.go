// SPDX-License-Identifier: Apache-2.0

package analyze_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// FuzzReport feeds arbitrary files to the report and to every plot:
// whatever the trace says (events out of order, odd losses, fields of any
// value), they return a result or an error and never panic.
func FuzzReport(f *testing.F) {
	if seed, err := os.ReadFile("../../testdata/bigendian.mgt"); err == nil {
		f.Add(seed)
	}
	for _, recs := range [][]rec{schedRecs(), readerRecs()} {
		seed, err := os.ReadFile(writeTrace(f, recs))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(seed)
		f.Add(seed[:len(seed)*2/3])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "f.mgt")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		analyze.Modulation([]string{path}, 0)
		for _, kind := range analyze.Kinds {
			analyze.Plot([]string{path}, kind, analyze.PlotOptions{})
		}
		for _, kind := range analyze.PairKinds {
			analyze.PlotPair(trace.Sources([]string{path}), kind, analyze.PlotOptions{})
		}
		analyze.PlotNapi(trace.Sources([]string{path})[0])
	})
}
