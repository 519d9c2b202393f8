// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"strings"
	"testing"
)

// appendAll writes recs with Room and Append, a run of up to run records
// at a time, and returns the file.
func appendAll(t *testing.T, w *Writer, recs [][]byte, run int) {
	t.Helper()
	for i := 0; i < len(recs); {
		room, err := w.Room(1 << 10)
		if err != nil {
			t.Fatal(err)
		}
		for j := 0; j < run && i < len(recs) && len(room)+len(recs[i]) <= cap(room); j++ {
			room = append(room, recs[i]...)
			i++
		}
		if len(room) == 0 {
			t.Fatalf("room of %d bytes for a %d-byte record", cap(room), len(recs[i]))
		}
		if err := w.Append(room); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAppendMatchesWrite checks that records added a run at a time with
// Room and Append read back as those written one by one with Write, in
// either byte order, with lent room or the Writer's own, and that the
// summary counts them alike.
func TestAppendMatchesWrite(t *testing.T) {
	h := testHeader(magnetTypes())
	recs := sampleRecords(t, h, 1000)
	for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		for _, lent := range []bool{false, true} {
			for _, run := range []int{1, 7, 1000} {
				var buf bytes.Buffer
				var l lender
				out := &buf
				var w *Writer
				var err error
				if lent {
					w, err = NewWriter(&l, h, WriterOptions{ByteOrder: order, BlockSize: 1000})
				} else {
					w, err = NewWriter(out, h, WriterOptions{ByteOrder: order, BlockSize: 1000})
				}
				if err != nil {
					t.Fatal(err)
				}
				// Copies: Append swaps a foreign order in place.
				var cp [][]byte
				for _, r := range recs {
					cp = append(cp, bytes.Clone(r))
				}
				appendAll(t, w, cp, run)
				if err := w.Close(&Summary{EndWallNs: h.StartWallNs + 5e9}); err != nil {
					t.Fatal(err)
				}
				file := buf.Bytes()
				if lent {
					file = l.Bytes()
				}
				if w.Bytes() != int64(len(file)) {
					t.Errorf("Bytes() = %d, wrote %d", w.Bytes(), len(file))
				}
				got, r, err := readAll(t, file)
				if err != nil {
					t.Fatalf("%v lent=%v run=%d: %v", order, lent, run, err)
				}
				if !reflect.DeepEqual(got, recs) {
					t.Fatalf("%v lent=%v run=%d: records differ after the round trip", order, lent, run)
				}
				s := r.Summary()
				if s == nil || s.Blocks < 40 || s.Events["tcp_xmit"] != 250 || s.Events["task"] != 250 {
					t.Errorf("%v lent=%v run=%d: summary = %+v", order, lent, run, s)
				}
			}
		}
	}
}

// TestAppendRejects checks that Append takes nothing of a run with a bad
// record in it, and only the room Room lent.
func TestAppendRejects(t *testing.T) {
	h := testHeader(magnetTypes())
	recs := sampleRecords(t, h, 8)
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h, WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(recs[1])
	bad[offType] = 200
	for _, c := range []struct {
		name string
		run  [][]byte
		want string
	}{
		{"unknown type", [][]byte{recs[0], bad}, "unknown event type 200"},
		{"cut short", [][]byte{recs[0], recs[1][:36]}, "cut short"},
		{"tail", [][]byte{recs[0], recs[1][:8]}, "bytes after the last whole record"},
	} {
		room, err := w.Room(1 << 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range c.run {
			room = append(room, r...)
		}
		if err := w.Append(room); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Append = %v, want %q", c.name, err, c.want)
		}
	}
	if err := w.Append(make([]byte, 40)); err == nil || !strings.Contains(err.Error(), "not the room") {
		t.Errorf("Append of other memory = %v", err)
	}
	room, _ := w.Room(1 << 10)
	if err := w.Append(append(room, recs[0]...)); err != nil {
		t.Fatal(err)
	}
	closeHoldingOnly(t, w, &buf, recs[0])
}

// closeHoldingOnly closes w and checks that the trace in buf holds rec, a
// sock_send, and nothing else, in its records and its summary: what is
// left after a test's rejected appends.
func closeHoldingOnly(t *testing.T, w *Writer, buf *bytes.Buffer, rec []byte) {
	t.Helper()
	if err := w.Close(nil); err != nil {
		t.Fatal(err)
	}
	got, r, err := readAll(t, buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !bytes.Equal(got[0], rec) || r.Summary().Events["sock_send"] != 1 || len(r.Summary().Events) != 1 {
		t.Fatalf("read %d records, summary %+v; want the one good record", len(got), r.Summary())
	}
}

// TestRoomNeverSplitsARecord checks that Room ends a block before it has
// less room left than the largest record type, and that empty room is
// given back (nothing written, no block).
func TestRoomNeverSplitsARecord(t *testing.T) {
	h := testHeader(magnetTypes())
	var l lender
	w, err := NewWriter(&l, h, WriterOptions{BlockSize: 200})
	if err != nil {
		t.Fatal(err)
	}
	room, err := w.Room(1 << 10)
	if err != nil || cap(room) != 200 {
		t.Fatalf("Room = %d bytes, %v; want the block's 200", cap(room), err)
	}
	if err := w.Append(room); err != nil || w.Buffered() != 0 {
		t.Fatalf("empty Append = %v, buffered %d", err, w.Buffered())
	}
	rec := sampleRecords(t, h, 1)[0] // 32 bytes
	for i := 0; i < 7; i++ {
		room, err := w.Room(1 << 10)
		if err != nil {
			t.Fatal(err)
		}
		if cap(room) < w.maxSize {
			t.Fatalf("room of %d bytes, less than the largest record (%d)", cap(room), w.maxSize)
		}
		if err := w.Append(append(room, rec...)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(nil); err != nil {
		t.Fatal(err)
	}
	got, r, err := readAll(t, l.Bytes())
	// The largest record is 72 bytes: a block of 200 takes five of 32
	// (72 bytes left after four), then has 40 left and ends.
	if err != nil || w.maxSize != 72 || len(got) != 7 || r.Summary().Blocks != 2 {
		t.Fatalf("read %d records in %d blocks, %v (largest record %d); want 7 in 2", len(got), r.Summary().Blocks, err, w.maxSize)
	}
}
