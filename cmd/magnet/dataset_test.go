// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/tracegen"
)

// TestExportDataset runs docs/DEPLOY.md's `magnet export ARCHIVE --format
// parquet --dataset DIR` through the binary on a directory of traces: the
// events and conns trees under host=/date=, then a second run after one
// more trace arrived writes only that one; bad flags are one clear line.
func TestExportDataset(t *testing.T) {
	in, ds := t.TempDir(), t.TempDir()
	write := func(names ...string) {
		var fs []*os.File
		for _, n := range names {
			f, err := os.Create(filepath.Join(in, n))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fs = append(fs, f)
		}
		var err error
		if len(fs) == 2 {
			_, err = tracegen.WritePair(fs[0], fs[1], tracegen.Options{Events: 5000, Conns: 2})
		} else {
			_, err = tracegen.Write(fs[0], tracegen.Options{Events: 3000, Conns: 1})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	write("snd.mgt", "rcv.mgt")
	r := magnet(t, "export", in, "--format", "parquet", "--dataset", ds)
	if r.code != 0 || !strings.Contains(r.stderr, "2 files written") || !strings.Contains(r.stderr, "0 already there") {
		t.Fatalf("first run: %d %s", r.code, r.stderr)
	}
	for _, p := range []string{
		"events/host=synth-sender/date=2025-06-15/snd.parquet", "conns/host=synth-sender/date=2025-06-15/snd.parquet",
		"events/host=synth-receiver/date=2025-06-15/rcv.parquet", "conns/host=synth-receiver/date=2025-06-15/rcv.parquet",
	} {
		if _, err := os.Stat(filepath.Join(ds, p)); err != nil {
			t.Error(err)
		}
	}
	write("more.mgt")
	r = magnet(t, "export", in, "--format", "parquet", "--dataset", ds, "--quiet")
	if r.code != 0 || !strings.Contains(r.stderr, "1 files written") || !strings.Contains(r.stderr, "2 already there") {
		t.Fatalf("second run: %d %s", r.code, r.stderr)
	}
	r = magnet(t, "export", in, "--format", "parquet", "--dataset", ds, "--quiet")
	if r.code != 0 || !strings.Contains(r.stderr, "0 files written, 3 already there") {
		t.Fatalf("third run: %d %s", r.code, r.stderr)
	}
	oneLineError(t, magnet(t, "export", in, "--format", "csv", "--dataset", ds), "--dataset writes Parquet")
	oneLineError(t, magnet(t, "export", in, "--format", "parquet", "--dataset", ds, "--partition", "rack"), "want host, date or both")
}
