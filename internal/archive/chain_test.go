// SPDX-License-Identifier: Apache-2.0

package archive

import (
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/internal/tracegen"
)

// carryingRecording writes a rotated recording of files one-minute files
// whose first record is a task record: every file after the first starts
// with a carried copy of it. It returns the files, oldest first.
func carryingRecording(t *testing.T, dir string, files int) []string {
	t.Helper()
	r := tracegen.NewRotated(t, dir, "h", "%h-%n.mgt", time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC))
	task := r.Record("task")
	binary.NativeEndian.PutUint32(task[16:], 42)
	r.Write(task)
	r.EverySecond(r.Record("sock_send"), files*60)
	return r.Close()
}

// readAll reads a source to the end and returns its sock_send count and
// warnings.
func readAll(t *testing.T, src trace.Source) (int, []string) {
	t.Helper()
	r, err := src.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	n := 0
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return n, r.Warnings()
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Type.Name == "sock_send" {
			n++
		}
	}
}

// TestChainFromTheMiddle: a chain read from a middle file (its carried
// records kept, since nothing before it is read) has seams that meet, and
// says nothing; a recording whose first files are gone from the archive
// says so once.
func TestChainFromTheMiddle(t *testing.T) {
	dir := t.TempDir()
	paths := carryingRecording(t, dir, 5)
	if len(paths) != 5 {
		t.Fatalf("%d files: %v", len(paths), paths)
	}
	n, warns := readAll(t, trace.Source{Name: "middle", Paths: paths[2:]})
	if n != 180 || len(warns) != 0 {
		t.Fatalf("files 2-4: %d sock_send (want 180), warnings %q", n, warns)
	}
	// The first two files are gone (dropped by a budget before shipping).
	for _, p := range paths[:2] {
		os.Remove(p)
	}
	es, err := Scan(dir)
	if err != nil {
		t.Fatal(err)
	}
	cs := Select(es, Selection{})
	if len(cs) != 1 {
		t.Fatalf("%d chains", len(cs))
	}
	n, warns = readAll(t, cs[0].Source(Selection{}))
	if n != 180 || len(warns) != 1 || !strings.Contains(warns[0], "files 0 to 1 of recording ") || !strings.Contains(warns[0], "missing before "+filepath.Base(paths[2])) {
		t.Fatalf("archive without files 0-1: %d sock_send, warnings %q", n, warns)
	}
	// A window that starts later asks nothing of the missing files.
	sel := Selection{Since: time.Date(2025, 3, 1, 10, 3, 30, 0, time.UTC)}
	cs = Select(es, sel)
	if _, warns = readAll(t, cs[0].Source(sel)); len(warns) != 0 {
		t.Fatalf("window from file 3: warnings %q", warns)
	}
}

// TestDescribeCutShort: the manifest of a file cut short (its recorder
// killed: no end block, no summary) counts its events as read.
func TestDescribeCutShort(t *testing.T) {
	dir := t.TempDir()
	paths := carryingRecording(t, dir, 2)
	whole, err := Describe(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(paths[0])
	// Cut off the end block and the last data block's tail.
	if err := os.Truncate(paths[0], fi.Size()-200); err != nil {
		t.Fatal(err)
	}
	m, err := Describe(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	n, _ := readAll(t, trace.Source{Name: "cut", Paths: paths[:1]})
	if !m.CutShort || m.EndWallNs != 0 || m.Events["sock_send"] != uint64(n) || n == 0 || m.Events["task"] != 1 {
		t.Fatalf("cut-short manifest %+v; %d sock_send read (the whole file had %v)", m, n, whole.Events)
	}
	t.Logf("cut short: %d of %d sock_send", n, whole.Events["sock_send"])
}
