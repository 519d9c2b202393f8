// SPDX-License-Identifier: Apache-2.0

package rotate

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/outfile"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/trace"
)

func TestPattern(t *testing.T) {
	at := time.Date(2025, 3, 1, 10, 4, 5, 0, time.UTC)
	for _, c := range []struct{ pattern, want string }{
		{"/var/lib/magnet/%H-%Y%m%dT%H%M%S.mgt", "/var/lib/magnet/web1-20250301T100405.mgt"},
		{"d/%Y-%m-%d_%H.mgt", "d/2025-03-01_10.mgt"},
		{"%h.%n.%s.mgt", "web1.0007.1740823445.mgt"},
		{"100%%.mgt", "100%.mgt"},
	} {
		p, err := ParsePattern(c.pattern, "web1")
		if err != nil {
			t.Fatal(err)
		}
		got := p.Expand(at, 7)
		if got != filepath.Clean(c.want) {
			t.Errorf("%s: got %s, want %s", c.pattern, got, c.want)
		}
		if !p.Matches(filepath.Base(got)) || !p.Matches(strings.TrimSuffix(filepath.Base(got), ".mgt")+"-2.mgt") {
			t.Errorf("%s does not match its own %s", c.pattern, got)
		}
	}
	for _, bad := range []string{"/x/%Y/a.mgt", "a%", "%q.mgt", ".hidden", "dir/"} {
		if _, err := ParsePattern(bad, "h"); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	p, _ := ParsePattern("/d/%H-%Y.mgt", "web1")
	if p.Matches("other-2025.mgt.new") || p.Matches("x.txt") {
		t.Error("pattern matches foreign names")
	}
}

func header(t *testing.T) *trace.Header {
	t.Helper()
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		t.Fatal(err)
	}
	return &trace.Header{Host: "web1", StartWallNs: 1, Types: types, Clock: trace.Clock{Source: "CLOCK_MONOTONIC"},
		Extra: map[string]any{"hooks": map[string]string{}}}
}

// stream makes a recording's worth of records: threads, an interface,
// connections that open and close over time, data events and a loss.
func stream(t *testing.T, h *trace.Header, n int) [][]byte {
	t.Helper()
	mk := func(name string, ts uint64, conn uint64, tid uint32, size int32) []byte {
		et := h.TypeByName(name)
		b := make([]byte, et.Size)
		binary.NativeEndian.PutUint64(b[0:], ts)
		binary.NativeEndian.PutUint64(b[8:], conn)
		binary.NativeEndian.PutUint32(b[16:], tid)
		binary.NativeEndian.PutUint32(b[20:], uint32(size))
		binary.NativeEndian.PutUint32(b[24:], 4026531840)
		b[30] = et.ID
		return b
	}
	ifc := mk("iface", 999_000, 0, 0, 0)
	binary.NativeEndian.PutUint32(ifc[32:], 2)
	copy(ifc[40:], "veth0")
	out := [][]byte{ifc}
	ts := uint64(1_000_000)
	for i := range n - 1 {
		ts += 1000
		conn := uint64(100 + i/50) // a new connection every 50 events
		tid := uint32(10 + i/200)  // a new thread every 200
		if i%200 == 0 {
			r := mk("task", ts, 0, tid, 0)
			binary.NativeEndian.PutUint32(r[32:], tid)
			copy(r[40:], "worker")
			out = append(out, r)
		}
		switch {
		case i%50 == 0:
			r := mk("conn_open", ts, conn, tid, 0)
			r[32], r[33] = 6, 4
			binary.NativeEndian.PutUint16(r[36:], uint16(40000+i))
			binary.NativeEndian.PutUint16(r[38:], 80)
			copy(r[40:], []byte{10, 0, 0, 1})
			copy(r[56:], []byte{10, 0, 0, 2})
			out = append(out, r)
		case i%50 == 49 && i%100 == 49: // every other connection closes
			out = append(out, mk("conn_close", ts, conn, tid, 0))
		case i == n/2:
			r := mk("lost", ts, 0, 0, 0)
			binary.NativeEndian.PutUint32(r[48:], 3)
			out = append(out, r)
		default:
			out = append(out, mk("sock_send", ts, conn, tid, int32(i)))
		}
	}
	return out
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// TestSeams: rotation by size and by time; the chain reads back exactly the
// records written, in order, and every file reads on its own; alike when
// records of every type come a run at a time through Room and
// AppendTallied, as the recorder's drain gives them (the state a new file
// repeats comes in those runs too).
func TestSeams(t *testing.T) {
	t.Run("write", func(t *testing.T) { testSeams(t, byWrite) })
	t.Run("tallied", func(t *testing.T) { testSeams(t, byTally) })
}

// How testSeams hands records to the Sink.
type feed int

const (
	byWrite feed = iota // one at a time
	byTally             // every record in runs through AppendTallied
)

// writeRun writes recs[i:], as far as the next flush at index stop, and
// returns where it stopped: a run of records through Room and
// AppendTallied (as many as fit, up to 7), or one record through Write.
func writeRun(t *testing.T, s *Sink, recs [][]byte, i, stop int, how feed) int {
	t.Helper()
	if how == byWrite {
		if err := s.Write(recs[i]); err != nil {
			t.Fatal(err)
		}
		return i + 1
	}
	room, err := s.Room(1 << 10)
	if err != nil {
		t.Fatal(err)
	}
	var tl trace.Tally
	j := i
	for ; j < stop && j-i < 7 && len(room)+len(recs[j]) <= cap(room); j++ {
		room = append(room, recs[j]...)
		tl.Add(recs[j][30], binary.NativeEndian.Uint64(recs[j]))
	}
	if j == i {
		t.Fatalf("room of %d bytes for a %d-byte record", cap(room), len(recs[i]))
	}
	if err = s.AppendTallied(room, &tl); err != nil {
		t.Fatal(err)
	}
	return j
}

func testSeams(t *testing.T, how feed) {
	h := header(t)
	recs := stream(t, h, 20000)
	dir := t.TempDir()
	p, err := ParsePattern(filepath.Join(dir, "%H-%Y%m%dT%H%M%S.mgt"), "web1")
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)}
	var finished []string
	s, err := New(h, Options{Pattern: p, Interval: time.Minute, MaxBytes: 64 << 10, BlockSize: 4096, Now: clk.now,
		OnFinish: func(p string) { finished = append(finished, p) }})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(recs); {
		stop := (i/1000 + 1) * 1000
		i = writeRun(t, s, recs, i, min(stop, len(recs)), how)
		if i == stop { // the recorder's periodic flush; time moves on
			step := 30 * time.Second // the first half rotates by time,
			if i-1 > len(recs)/2 {
				step = time.Second // the second by size
			}
			clk.t = clk.t.Add(step)
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Close(&trace.Summary{Lost: 3, Extra: map[string]any{"produced": map[string]uint64{}}}); err != nil {
		t.Fatal(err)
	}
	if s.Write(recs[0]) == nil {
		t.Fatal("write after close accepted")
	}
	if len(finished) < 5 || s.Stats().Files != int64(len(finished)) {
		t.Fatalf("%d files finished, stats %+v", len(finished), s.Stats())
	}
	reasons := map[string]int{}
	var total, lastNs uint64
	for i, path := range finished {
		// The records end before MaxBytes; the end block's summary may go
		// a little past it.
		if fi, err := os.Stat(path); err != nil || fi.Size() > 64<<10+1024 {
			t.Fatalf("%s: %v, %d bytes with MaxBytes 64 KiB", path, err, fi.Size())
		}
		r, err := trace.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		rot := r.Rotation()
		if rot == nil || rot.Seq != i || rot.Recording != s.Recording() {
			t.Fatalf("%s: rotation %+v", path, rot)
		}
		if i > 0 && rot.Prev != filepath.Base(finished[i-1]) {
			t.Fatalf("%s: prev %q, want %q", path, rot.Prev, finished[i-1])
		}
		if i > 0 && rot.PrevLastNs != lastNs {
			t.Fatalf("%s: prev_last_ns %d, want %d: the latest time of the files before", path, rot.PrevLastNs, lastNs)
		}
		lastNs = max(lastNs, latest(t, path))
		// Alone, each file resolves every connection and thread it uses.
		cs, _, err := export.Conns(r)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			if c.Proto != "tcp" || c.Comm != "worker" {
				t.Fatalf("%s: connection %d unresolved on its own: %+v", path, c.ID, c)
			}
		}
		end := r.RotationEnd()
		if end == nil || (i < len(finished)-1) != (end.Next != "") || end.NextRecord != rot.FirstRecord+end.Records {
			t.Fatalf("%s: end %+v", path, end)
		}
		if i < len(finished)-1 && end.Next != filepath.Base(finished[i+1]) {
			t.Fatalf("%s: next %q", path, end.Next)
		}
		reasons[end.Reason]++
		total += r.Summary().Lost
		r.Close()
	}
	if reasons["size"] == 0 || reasons["interval"] == 0 || reasons["end"] != 1 {
		t.Fatalf("reasons %v", reasons)
	}
	if total != 3 {
		t.Fatalf("losses over the files: %d, want 3", total)
	}

	r, err := trace.OpenChain(finished)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	i := 0
	for ; ; i++ {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if i >= len(recs) || !bytes.Equal(rec.Data, recs[i]) {
			t.Fatalf("record %d of the chain differs from what was written", i)
		}
	}
	if i != len(recs) || len(r.Warnings()) != 0 {
		t.Fatalf("chain: %d records of %d, warnings %v", i, len(recs), r.Warnings())
	}
	if sum := r.Summary(); sum == nil || sum.Events["sock_send"] == 0 || sum.Lost != 3 {
		t.Fatalf("chain summary %+v", sum)
	}
}

// latest returns the largest time_ns of the records in the file at path.
func latest(t *testing.T, path string) uint64 {
	t.Helper()
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var ts uint64
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return ts
		}
		if err != nil {
			t.Fatal(err)
		}
		ts = max(ts, rec.Time())
	}
}

// TestKeepAndBudget: --keep deletes the oldest finished files, the budget
// bounds the total, and a file another recorder holds is never touched.
func TestKeepAndBudget(t *testing.T) {
	h := header(t)
	recs := stream(t, h, 5000)
	dir := t.TempDir()
	p, _ := ParsePattern(filepath.Join(dir, "%h-%n.mgt"), "web1")
	// A foreign recorder's current file: locked, matching the pattern.
	other := filepath.Join(dir, "web1-9999.mgt")
	f, err := os.Create(other)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := lockFile(f); err != nil {
		t.Fatal(err)
	}
	if !InUse(other) {
		t.Fatal("locked file not in use")
	}
	var logs []string
	s, err := New(h, Options{Pattern: p, MaxBytes: 16 << 10, Keep: 3, BlockSize: 4096,
		Log: func(f string, a ...any) { logs = append(logs, f) }})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := s.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	if InUse(s.Path()) != true {
		t.Fatal("current file not in use")
	}
	if err := s.Close(nil); err != nil {
		t.Fatal(err)
	}
	fs, _ := Finished(p, "")
	if len(fs) != 3 || s.Stats().Dropped != s.Stats().Files-3 {
		t.Fatalf("kept %d files, stats %+v", len(fs), s.Stats())
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatal("foreign current file deleted")
	}

	dir2 := t.TempDir()
	p2, _ := ParsePattern(filepath.Join(dir2, "b-%n.mgt"), "web1")
	s, err = New(h, Options{Pattern: p2, MaxBytes: 16 << 10, Budget: 60 << 10, BlockSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := s.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	s.Close(nil)
	fs, _ = Finished(p2, "")
	var sum int64
	for _, f := range fs {
		sum += f.Size
	}
	if sum > 60<<10 || s.Stats().Dropped == 0 {
		t.Fatalf("budget: %d bytes in %d files, stats %+v", sum, len(fs), s.Stats())
	}
}

// tmpfs mounts a small tmpfs for the test (root only) and unmounts it after.
func tmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// TestDiskFullStops: without a drop policy, a full file system ends the
// current file properly (end block, reason "disk full") and stops.
func TestDiskFullStops(t *testing.T) {
	dir := tmpfs(t, "1m")
	h := header(t)
	recs := stream(t, h, 100000) // ~4 MB
	p, _ := ParsePattern(filepath.Join(dir, "%n.mgt"), "h")
	s, err := New(h, Options{Pattern: p, MaxBytes: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	var werr error
	n := 0
	for _, r := range recs {
		if werr = s.Write(r); werr != nil {
			break
		}
		n++
	}
	if !errors.Is(werr, ErrDiskFull) || n == len(recs) {
		t.Fatalf("wrote %d records, error %v; want ErrDiskFull", n, werr)
	}
	if s.Close(nil) == nil {
		t.Fatal("close after a full disk succeeded")
	}
	fs, _ := Finished(p, "")
	paths := make([]string, len(fs))
	for i, f := range fs {
		paths[i] = f.Path
	}
	r, err := trace.OpenChain(paths)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := 0
	for {
		if _, err := r.Next(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
		got++
	}
	if cut, _ := r.Truncated(); cut || r.RotationEnd().Reason != "disk full" {
		t.Fatalf("last file: cut %v, end %+v", cut, r.RotationEnd())
	}
	// What the sink accepted before its buffered block is in the files;
	// only the records of the block it could not write are missing.
	if got > n || n-got > 4096 {
		t.Fatalf("chain holds %d records, sink accepted %d", got, n)
	}
	t.Logf("%d files, %d records written before the disk filled", len(paths), got)
}

// TestDiskFullDrops: with the drop policy, the oldest finished files go
// and the recording goes on.
func TestDiskFullDrops(t *testing.T) {
	dir := tmpfs(t, "1m")
	h := header(t)
	recs := stream(t, h, 100000)
	p, _ := ParsePattern(filepath.Join(dir, "%n.mgt"), "h")
	var logs []string
	s, err := New(h, Options{Pattern: p, MaxBytes: 128 << 10, DropOnFull: true, Log: func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := s.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(nil); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Dropped == 0 || !strings.Contains(strings.Join(logs, "\n"), "disk full") {
		t.Fatalf("nothing dropped: %+v %v", st, logs)
	}
	fs, _ := Finished(p, "")
	last := fs[len(fs)-1].Path
	r, err := trace.Open(last)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for {
		if _, err := r.Next(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
	}
	if r.RotationEnd() == nil || r.RotationEnd().Reason != "end" {
		t.Fatalf("last file did not end normally: %+v", r.RotationEnd())
	}
	t.Logf("%d files started, %d dropped (%d bytes), %d left", st.Files, st.Dropped, st.DroppedBytes, len(fs))
}

// TestIntervalAtEnd: a recording that ends right after its interval ran
// out ends in the file holding its last records, not in a new one holding
// none; an idle recording still rotates (one flush late), and the next
// record after the interval starts the next file.
func TestIntervalAtEnd(t *testing.T) {
	h := header(t)
	recs := stream(t, h, 200)
	p, _ := ParsePattern(filepath.Join(t.TempDir(), "%h-%n.mgt"), "web1")
	clk := &clock{time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)}
	run := func(after func(s *Sink)) []string {
		var finished []string
		s, err := New(h, Options{Pattern: p, Interval: time.Minute, Now: clk.now,
			OnFinish: func(p string) { finished = append(finished, p) }})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs[:100] {
			if err := s.Write(r); err != nil {
				t.Fatal(err)
			}
		}
		clk.t = clk.t.Add(time.Minute)
		if err := s.Flush(); err != nil { // the interval is over
			t.Fatal(err)
		}
		if s.Stats().Files != 1 || s.Previous() != "" {
			t.Fatalf("rotated before a record or a second flush: %+v, previous %q", s.Stats(), s.Previous())
		}
		after(s)
		if err := s.Close(nil); err != nil {
			t.Fatal(err)
		}
		for _, f := range finished {
			r, err := trace.Open(f)
			if err != nil {
				t.Fatal(err)
			}
			for {
				if _, err := r.Next(); err != nil {
					break
				}
			}
			if end := r.RotationEnd(); end == nil || end.Records == 0 {
				t.Fatalf("%s holds no record of its own: %+v", f, end)
			}
			r.Close()
		}
		return finished
	}
	// The recording stops: one file, ended as "end".
	if fs := run(func(*Sink) {}); len(fs) != 1 {
		t.Fatalf("stop right after the interval: %d files, want 1", len(fs))
	}
	// A record comes: it starts the next file.
	fs := run(func(s *Sink) {
		first := s.Path()
		if err := s.Write(recs[100]); err != nil {
			t.Fatal(err)
		}
		if s.Stats().Files != 2 || s.Previous() != first || s.Path() == first {
			t.Fatalf("after a record: %+v, path %s, previous %s", s.Stats(), s.Path(), s.Previous())
		}
	})
	if len(fs) != 2 {
		t.Fatalf("a record after the interval: %d files, want 2", len(fs))
	}
	// Idle: the next flush rotates.
	var idle *Sink
	fs = run(func(s *Sink) {
		idle = s
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
		if s.Stats().Files != 2 {
			t.Fatalf("idle: second flush did not rotate: %+v", s.Stats())
		}
		for _, r := range recs[100:110] {
			if err := s.Write(r); err != nil {
				t.Fatal(err)
			}
		}
	})
	if len(fs) != 2 || idle.Path() != fs[1] || idle.Previous() != fs[0] {
		t.Fatalf("idle: files %v, path %s, previous %s", fs, idle.Path(), idle.Previous())
	}
}

// TestBudgetCountsExtra: bytes kept beside the files (the shipper's staging
// copies) count against the budget.
func TestBudgetCountsExtra(t *testing.T) {
	h := header(t)
	recs := stream(t, h, 5000)
	budget := func(extra int64) (kept int64, dropped int64) {
		p, _ := ParsePattern(filepath.Join(t.TempDir(), "b-%n.mgt"), "web1")
		s, err := New(h, Options{Pattern: p, MaxBytes: 16 << 10, Budget: 100 << 10, BlockSize: 4096,
			Extra: func() int64 { return extra }})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if err := s.Write(r); err != nil {
				t.Fatal(err)
			}
		}
		s.Close(nil)
		fs, _ := Finished(p, "")
		for _, f := range fs {
			kept += f.Size
		}
		return kept, s.Stats().Dropped
	}
	kept0, dropped0 := budget(0)
	kept, dropped := budget(40 << 10)
	if kept0 > 100<<10 || kept+40<<10 > 100<<10 || dropped <= dropped0 {
		t.Fatalf("without extra: %d bytes kept, %d dropped; with 40 KiB extra: %d kept, %d dropped", kept0, dropped0, kept, dropped)
	}
}

// In a sticky world-writable directory a link planted at the dot-name a
// file is written under is not followed.
func TestPlantedDotName(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tmp")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(target, []byte("keep\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, ".r-0000.mgt.new")); err != nil {
		t.Fatal(err)
	}
	p, _ := ParsePattern(filepath.Join(dir, "r-%n.mgt"), "h")
	s, err := New(header(t), Options{Pattern: p, Interval: time.Hour})
	if !errors.Is(err, outfile.ErrUnsafe) {
		if s != nil {
			s.Close(nil)
		}
		t.Fatalf("err %v, want outfile.ErrUnsafe", err)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep\n" {
		t.Fatalf("the link's target was written: %q", b)
	}
}
