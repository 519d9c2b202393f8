// SPDX-License-Identifier: Apache-2.0

package ring

import (
	"bytes"
	"testing"
)

// readRuns reads what the ring holds the way the recorder's drain does, by
// walking Unread with Frame and consuming with Skip, a few frames at a time,
// and commits.
func readRuns(t *testing.T, r *Reader, perRun int) [][]byte {
	t.Helper()
	var out [][]byte
	for {
		view := r.Unread()
		off, took := 0, 0
		for took < perRun {
			n, step, st := Frame(view[off:])
			if st == Busy {
				break
			}
			if st == Record {
				out = append(out, bytes.Clone(view[off+FrameHeaderSize:off+FrameHeaderSize+n]))
				took++
			}
			off += step
		}
		r.Skip(off)
		if off == 0 {
			r.Commit()
			return out
		}
	}
}

// TestFrameStates checks what Frame says of a committed, a discarded and a
// busy frame, and of a view too short for a frame.
func TestFrameStates(t *testing.T) {
	m := NewMemory(4096)
	r := m.Reader()
	m.Output(record(1, 20))
	d := m.Reserve(9)
	m.Discard(d)
	b := m.Reserve(16)
	view := r.Unread()
	if len(view) != 3*FrameHeaderSize+24+16+16 {
		t.Fatalf("Unread = %d bytes, want %d", len(view), 3*FrameHeaderSize+24+16+16)
	}
	n, step, st := Frame(view)
	if n != 20 || step != FrameHeaderSize+24 || st != Record {
		t.Fatalf("committed frame = %d, %d, %v", n, step, st)
	}
	off := step
	if n, step, st = Frame(view[off:]); n != 9 || step != FrameHeaderSize+16 || st != Empty {
		t.Fatalf("discarded frame = %d, %d, %v", n, step, st)
	}
	off += step
	if _, _, st = Frame(view[off:]); st != Busy {
		t.Fatalf("reserved frame = %v, want Busy", st)
	}
	if _, _, st = Frame(view[off : off+4]); st != Busy {
		t.Fatalf("half a frame header = %v, want Busy", st)
	}
	m.Write(b, 0, record(3, 16))
	m.Submit(b)
	// The view is the ring's memory: the commit shows through it.
	if n, _, st = Frame(view[off:]); n != 16 || st != Record {
		t.Fatalf("frame committed since = %d, %v", n, st)
	}
	r.Skip(len(view))
	if _, st, err := r.Peek(); err != nil || st != Empty {
		t.Fatalf("Peek after Skip of everything = %v, %v; want Empty", st, err)
	}
}

// TestSkipThenPeek checks that Peek and Advance go on where Skip left off.
func TestSkipThenPeek(t *testing.T) {
	m := NewMemory(4096)
	r := m.Reader()
	for i := 0; i < 3; i++ {
		m.Output(record(i, 32))
	}
	if _, st, _ := r.Peek(); st != Record {
		t.Fatal("nothing to peek")
	}
	_, step, _ := Frame(r.Unread())
	r.Skip(step)
	rec, st, err := r.Peek()
	if err != nil || st != Record || !bytes.Equal(rec, record(1, 32)) {
		t.Fatalf("Peek after Skip = %x, %v, %v; want record 1", rec, st, err)
	}
	r.Skip(0) // nothing consumed: the peeked record stays peeked
	r.Advance()
	if got := readAll(t, r); len(got) != 1 || !bytes.Equal(got[0], record(2, 32)) {
		t.Fatalf("then read %x, want record 2", got)
	}
}
