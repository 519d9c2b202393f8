// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strings"
	"testing"
)

func TestTally(t *testing.T) {
	var tl Tally
	if tl.Records() != 0 || tl.First() != 0 || tl.Last() != 0 {
		t.Fatalf("zero Tally: %d records, %d..%d", tl.Records(), tl.First(), tl.Last())
	}
	for i, x := range []struct {
		id uint8
		ts uint64
	}{{7, 500}, {3, 200}, {7, 900}, {255, 300}, {0, 1 << 63}, {3, 250}} {
		tl.Add(x.id, x.ts)
		if tl.Records() != uint32(i+1) {
			t.Fatalf("after %d Adds: %d records", i+1, tl.Records())
		}
	}
	var got []uint32
	for id, n := range tl.Counts() {
		got = append(got, uint32(id), n)
	}
	if want := []uint32{7, 2, 3, 2, 255, 1, 0, 1}; !slices.Equal(got, want) {
		t.Errorf("Counts = %v, want %v (id, count in the order first counted)", got, want)
	}
	if tl.First() != 200 || tl.Last() != 1<<63 {
		t.Errorf("times %d..%d, want 200..%d", tl.First(), tl.Last(), uint64(1<<63))
	}
	tl.Reset()
	if tl.Records() != 0 || tl.First() != 0 || tl.Last() != 0 || tl.counts != [256]uint32{} {
		t.Fatal("Reset left something counted")
	}
	for range tl.Counts() {
		t.Fatal("Counts yields a type after Reset")
	}
	tl.Add(9, 0) // time 0 is a time like any other
	tl.Add(9, 40)
	if tl.First() != 0 || tl.Last() != 40 || tl.Records() != 2 {
		t.Errorf("times %d..%d, %d records; want 0..40, 2", tl.First(), tl.Last(), tl.Records())
	}
}

// appendTallied writes recs with Room and AppendTallied, as appendAll does
// with Append, counting each run as a caller that copies records does.
func appendTallied(t *testing.T, w *Writer, recs [][]byte, run int) {
	t.Helper()
	var tl Tally
	for i := 0; i < len(recs); {
		room, err := w.Room(1 << 10)
		if err != nil {
			t.Fatal(err)
		}
		for j := 0; j < run && i < len(recs) && len(room)+len(recs[i]) <= cap(room); j++ {
			room = append(room, recs[i]...)
			tl.Add(recs[i][offType], binary.NativeEndian.Uint64(recs[i][offTime:]))
			i++
		}
		if err := w.AppendTallied(room, &tl); err != nil {
			t.Fatal(err)
		}
		tl.Reset()
	}
}

// TestAppendTalliedMatchesAppend checks that a Writer given runs with
// their tallies writes the very bytes it writes when it walks each run
// itself (Append): the same blocks, block headers (record counts, time
// ranges), summary counts and file time range; in either byte order,
// with lent room or the Writer's own, with times out of order in a run.
func TestAppendTalliedMatchesAppend(t *testing.T) {
	h := testHeader(magnetTypes())
	recs := sampleRecords(t, h, 1000)
	for i := 0; i < len(recs); i += 7 { // times not in order, within runs and across blocks
		binary.NativeEndian.PutUint64(recs[i][offTime:], uint64(50_000-i*13))
	}
	for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		for _, lent := range []bool{false, true} {
			for _, run := range []int{1, 7, 1000} {
				var files [2][]byte
				for k, add := range []func(*testing.T, *Writer, [][]byte, int){appendAll, appendTallied} {
					var buf bytes.Buffer
					var l lender
					var w *Writer
					var err error
					if lent {
						w, err = NewWriter(&l, h, WriterOptions{ByteOrder: order, BlockSize: 1000})
					} else {
						w, err = NewWriter(&buf, h, WriterOptions{ByteOrder: order, BlockSize: 1000})
					}
					if err != nil {
						t.Fatal(err)
					}
					var cp [][]byte
					for _, r := range recs {
						cp = append(cp, bytes.Clone(r))
					}
					add(t, w, cp, run)
					if err := w.Close(&Summary{EndWallNs: h.StartWallNs + 5e9}); err != nil {
						t.Fatal(err)
					}
					files[k] = buf.Bytes()
					if lent {
						files[k] = l.Bytes()
					}
				}
				if !bytes.Equal(files[0], files[1]) {
					t.Fatalf("%v lent=%v run=%d: the file written with tallies differs from Append's", order, lent, run)
				}
				if _, ends, _, _ := blockBounds(t, files[1]); len(ends) < 40 {
					t.Fatalf("%v lent=%v run=%d: %d blocks, want many", order, lent, run, len(ends))
				}
			}
		}
	}
}

// TestAppendTalliedRejects checks what AppendTallied can check without a
// step per record: a tally whose records do not fill the run exactly, or
// that counts a type not in the dictionary, adds none of the run.
func TestAppendTalliedRejects(t *testing.T) {
	h := testHeader(magnetTypes())
	recs := sampleRecords(t, h, 8) // sock_send 32, tcp_xmit 40, conn_open 72, task 56, ...
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h, WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tally := func(extra ...uint8) *Tally {
		var tl Tally
		for _, r := range recs[:2] {
			tl.Add(r[offType], 1)
		}
		for _, id := range extra {
			tl.Add(id, 1)
		}
		return &tl
	}
	var short Tally
	short.Add(recs[0][offType], 1)
	for _, c := range []struct {
		name  string
		tally *Tally
		want  string
	}{
		{"one record more", tally(recs[0][offType]), "counts 104 bytes of records (3 records), the run holds 72"},
		{"one record less", &short, "counts 32 bytes of records (1 records), the run holds 72"},
		{"unknown type", tally(200), "unknown event type 200"},
	} {
		room, err := w.Room(1 << 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs[:2] {
			room = append(room, r...)
		}
		if err := w.AppendTallied(room, c.tally); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: AppendTallied = %v, want %q", c.name, err, c.want)
		}
	}
	room, _ := w.Room(1 << 10)
	if err := w.AppendTallied(room, tally()); err == nil || !strings.Contains(err.Error(), "the run holds none") {
		t.Errorf("empty run with records tallied: %v", err)
	}
	if err := w.AppendTallied(append(make([]byte, 0, 100), recs[0]...), tally()); err == nil || !strings.Contains(err.Error(), "not the room") {
		t.Errorf("AppendTallied of other memory = %v", err)
	}
	room, _ = w.Room(1 << 10)
	var one Tally
	one.Add(recs[0][offType], binary.NativeEndian.Uint64(recs[0][offTime:]))
	if err := w.AppendTallied(append(room, recs[0]...), &one); err != nil {
		t.Fatal(err)
	}
	closeHoldingOnly(t, w, &buf, recs[0])
}
