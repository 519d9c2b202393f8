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

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/rotate"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// carryingRecording writes a rotated recording of files one-minute files
// whose first record is a task record: every file after the first starts
// with a carried copy of it. It returns the files, oldest first.
func carryingRecording(t *testing.T, dir string, files int) []string {
	t.Helper()
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	const offset = int64(1_000_000_000_000_000_000)
	h := &trace.Header{Host: "h", StartWallNs: start.UnixNano(), Types: types, Clock: trace.Clock{WallOffsetNs: offset}}
	p, err := rotate.ParsePattern(filepath.Join(dir, "%h-%n.mgt"), "h")
	if err != nil {
		t.Fatal(err)
	}
	now := start
	var paths []string
	s, err := rotate.New(h, rotate.Options{Pattern: p, Interval: time.Minute, Now: func() time.Time { return now },
		OnStart: func(path string) { paths = append(paths, path) }})
	if err != nil {
		t.Fatal(err)
	}
	paths = append(paths, s.Path())
	task := h.TypeByName("task")
	rec := make([]byte, task.Size)
	rec[30] = task.ID
	binary.NativeEndian.PutUint64(rec, uint64(now.UnixNano()-offset))
	binary.NativeEndian.PutUint32(rec[16:], 42)
	if err := s.Write(rec); err != nil {
		t.Fatal(err)
	}
	send := h.TypeByName("sock_send")
	rec = make([]byte, send.Size)
	rec[30] = send.ID
	for i := 0; i < files*60; i++ {
		binary.NativeEndian.PutUint64(rec, uint64(now.UnixNano()-offset))
		if err := s.Write(rec); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Second)
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(nil); err != nil {
		t.Fatal(err)
	}
	return compact(paths)
}

// compact drops repeated paths (OnStart may name the first file again).
func compact(paths []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range paths {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
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
