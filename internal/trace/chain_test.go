// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

func compress(tb testing.TB, data []byte) []byte {
	tb.Helper()
	var buf bytes.Buffer
	enc, err := zstd.NewWriter(&buf)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := enc.Write(data); err != nil {
		tb.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// TestZstdTransparent: a compressed trace reads exactly like the plain one,
// and one cut short reads as a truncated trace.
func TestZstdTransparent(t *testing.T) {
	h := testHeader(magnetTypes())
	recs := sampleRecords(t, h, 40000)
	plain := writeTrace(t, h, WriterOptions{BlockSize: 4096}, recs, true)
	z := compress(t, plain)
	if len(z) >= len(plain) {
		t.Fatalf("compressed %d >= plain %d", len(z), len(plain))
	}
	got, r, err := readAll(t, z)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Compressed() || len(got) != len(recs) || r.Summary() == nil || r.Summary().Lost != 7 {
		t.Fatalf("compressed=%v records %d of %d summary %+v", r.Compressed(), len(got), len(recs), r.Summary())
	}
	for i := range recs {
		if !bytes.Equal(got[i], recs[i]) {
			t.Fatalf("record %d differs", i)
		}
	}
	r.Close()

	// Cut the compressed stream in the middle: what decompressed before
	// the cut is returned, and the trace says it was cut short.
	got, r, err = readAll(t, z[:len(z)/2])
	if err != nil {
		t.Fatalf("cut zstd: %v", err)
	}
	if cut, _ := r.Truncated(); !cut || len(got) == 0 || len(got) >= len(recs) {
		t.Fatalf("cut zstd: truncated=%v, %d records", cut, len(got))
	}
	r.Close()

	// Garbage after the zstd magic is an error, not a panic.
	bad := append(append([]byte{}, zstdMagic[:]...), bytes.Repeat([]byte{0xff}, 64)...)
	if _, _, err := readAll(t, bad); err == nil {
		t.Fatal("garbage zstd accepted")
	}
}

// writeChainFile writes one file of a rotated recording.
func writeChainFile(t *testing.T, dir, name string, rot Rotation, end *RotationEnd, recs [][]byte) string {
	t.Helper()
	h := testHeader(magnetTypes())
	h.Extra = map[string]any{RotationKey: rot}
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h, WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := w.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	if end != nil {
		err = w.Close(&Summary{Lost: 1, Extra: map[string]any{RotationKey: end}})
	} else {
		err = w.Flush()
	}
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func readChain(t *testing.T, paths ...string) ([]string, *Reader) {
	t.Helper()
	r, err := OpenChain(paths)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return names, r
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, rec.Type.Name)
	}
}

// TestOpenChain: carried records are skipped after the first file, summaries
// add up, and gaps are reported, not fatal.
func TestOpenChain(t *testing.T) {
	dir := t.TempDir()
	h := testHeader(magnetTypes())
	task := encode(t, h, rec{"task", map[string]any{"time_ns": 1, "tid": 5, "pid": 5, "comm": "a"}})
	carriedTask := bytes.Clone(task)
	carriedTask[offFlags] = FlagCarried
	send := func(ts int) []byte {
		return encode(t, h, rec{"sock_send", map[string]any{"time_ns": ts, "tid": 5, "size": 10}})
	}
	a := writeChainFile(t, dir, "a.mgt", Rotation{Recording: "r1", Seq: 0}, &RotationEnd{Next: "b.mgt", Records: 3, NextRecord: 3, Reason: "interval"},
		[][]byte{task, send(2), send(3)})
	b := writeChainFile(t, dir, "b.mgt", Rotation{Recording: "r1", Seq: 1, Prev: "a.mgt", FirstRecord: 3, Carried: 1}, &RotationEnd{Next: "c.mgt", Records: 2, NextRecord: 5, Reason: "size"},
		[][]byte{carriedTask, send(4), send(5)})
	c := writeChainFile(t, dir, "c.mgt", Rotation{Recording: "r1", Seq: 2, Prev: "b.mgt", FirstRecord: 5, Carried: 1}, &RotationEnd{Records: 1, NextRecord: 6, Reason: "end"},
		[][]byte{carriedTask, send(6)})

	names, r := readChain(t, a, b, c)
	if got := strings.Join(names, ","); got != "task,sock_send,sock_send,sock_send,sock_send,sock_send" {
		t.Fatalf("chain records: %s", got)
	}
	if w := r.Warnings(); len(w) != 0 {
		t.Fatalf("warnings on an exact chain: %v", w)
	}
	s := r.Summary()
	if s == nil || s.Events["task"] != 1 || s.Events["sock_send"] != 5 || s.Lost != 3 {
		t.Fatalf("chain summary %+v", s)
	}
	if r.Rotation().Seq != 0 || r.RotationEnd().Reason != "end" {
		t.Fatalf("rotation %+v end %+v", r.Rotation(), r.RotationEnd())
	}
	r.Close()

	// A middle file alone keeps its carried task: it reads on its own.
	names, r = readChain(t, b)
	if names[0] != "task" || len(names) != 3 {
		t.Fatalf("middle file alone: %v", names)
	}
	r.Close()

	// Without the middle file: a warning, and c's carried task is kept.
	names, r = readChain(t, a, c)
	if len(names) != 5 || len(r.Warnings()) != 1 || !strings.Contains(r.Warnings()[0], "missing") {
		t.Fatalf("gap: %v %v", names, r.Warnings())
	}
	r.Close()
	// Callers (collect, report) ask for the warnings after closing.
	if w := r.Warnings(); len(w) != 1 {
		t.Fatalf("warnings after Close: %v", w)
	}

	// The middle file cut short (its recorder killed): the missing record
	// is counted in a warning.
	bcut := writeChainFile(t, dir, "bcut.mgt", Rotation{Recording: "r1", Seq: 1, Prev: "a.mgt", FirstRecord: 3, Carried: 1}, nil,
		[][]byte{carriedTask, send(4)})
	names, r = readChain(t, a, bcut, c)
	if len(names) != 5 || len(r.Warnings()) != 1 || !strings.Contains(r.Warnings()[0], "1 of its records are missing") {
		t.Fatalf("cut: %v %v", names, r.Warnings())
	}
	r.Close()

	// Wrong order and foreign files are errors.
	for _, paths := range [][]string{{b, a}, {a, writeChainFile(t, dir, "x.mgt", Rotation{Recording: "r2", Seq: 1}, nil, nil)}} {
		r, err := OpenChain(paths)
		if err != nil {
			t.Fatal(err)
		}
		for err == nil {
			_, err = r.Next()
		}
		if errors.Is(err, io.EOF) {
			t.Errorf("%v: read without error", paths)
		}
		r.Close()
	}
}
