// SPDX-License-Identifier: Apache-2.0

package export_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// capture keeps the cells WriteTable's tests look at, copied: the row
// buffer is WriteTable's.
type capture struct {
	cols                  map[string]int
	time, size            []int64
	traceName, comm, host []string
}

func newCapture(t *export.Table) *capture {
	c := &capture{cols: map[string]int{}}
	for i, col := range t.Columns {
		c.cols[col.Name] = i
	}
	return c
}

func (c *capture) WriteRow(row []export.Value) error {
	c.time = append(c.time, row[c.cols["time_ns"]].Int)
	c.size = append(c.size, row[c.cols["size"]].Int)
	c.traceName = append(c.traceName, row[c.cols["trace"]].Str)
	c.comm = append(c.comm, row[c.cols["comm"]].Str)
	c.host = append(c.host, row[c.cols["host"]].Str)
	return nil
}

func (c *capture) Close() error { return nil }

// mergeTrace writes a trace of host whose clock reads wall-offset ns
// behind the wall clock: recs in the order given, each a sock_send whose
// size identifies it.
func mergeTrace(t *testing.T, host string, offset int64, recs []recSpec) []byte {
	t.Helper()
	return bootTrace(t, host, offset, "", recs)
}

// bootTrace is mergeTrace with a boot id in the header ("" for none).
func bootTrace(t *testing.T, host string, offset int64, boot string, recs []recSpec) []byte {
	t.Helper()
	h := testHeader(t)
	h.Host, h.Clock.WallOffsetNs = host, offset
	if boot != "" {
		h.Extra = map[string]any{"boot_id": boot}
	}
	var buf bytes.Buffer
	w, err := trace.NewWriter(&buf, h, trace.WriterOptions{})
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	for _, rs := range recs {
		if err := w.Write(encode(t, h, rs)); err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	if err := w.Close(&trace.Summary{}); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return buf.Bytes()
}

func exportTable(t *testing.T, files map[string][]byte, order []string) (*capture, uint64) {
	t.Helper()
	var srcs []export.TableSource
	var hs []*trace.Header
	for _, name := range order {
		r := newReader(t, files[name])
		srcs = append(srcs, export.TableSource{Name: name, Reader: r})
		hs = append(hs, r.Header())
	}
	tb := export.NewTable(hs)
	c := newCapture(tb)
	late, err := export.WriteTable(tb, srcs, c)
	if err != nil {
		t.Fatalf("WriteTable: %v", err)
	}
	return c, late
}

// TestWriteTableMerges: two traces whose events interleave in time, on
// clocks with different wall offsets, each slightly out of time order as a
// recorder drains its rings, come out as one timeline: every row once,
// time_ns never decreasing, ties in the order of the sources, and each
// row's task resolved from its own trace's metadata as it stood where the
// record was read.
func TestWriteTableMerges(t *testing.T) {
	const n = 3000
	const wallA, wallB = int64(1_700_000_000_000_000_000), int64(1_700_000_000_000_000_000 - 5_000_000)
	// A's events at wall time wallA + t0 + 20i, B's at 20i + 10 (so
	// interleaved), except that every 7th of B's ties with A's i.
	var a, b []recSpec
	a = append(a, recSpec{"task", hdr{time: t0, tid: 7}, vals{"pid": 1, "comm": "alpha"}})
	b = append(b, recSpec{"task", hdr{time: t0, tid: 7}, vals{"pid": 2, "comm": "beta"}})
	for i := range n {
		ta := uint64(t0 + 20*i)
		tb := uint64(int64(ta+10) + wallA - wallB)
		if i%7 == 0 {
			tb -= 10
		}
		if i == n/2 {
			// The thread renamed halfway through A: later rows of A say so.
			a = append(a, recSpec{"task", hdr{time: ta, tid: 7}, vals{"pid": 1, "comm": "alpha2"}})
		}
		a = append(a, recSpec{"sock_send", hdr{time: ta, tid: 7, size: int32(100_000 + i), cpu: uint16(i % 2)}, nil})
		b = append(b, recSpec{"sock_send", hdr{time: tb, tid: 7, size: int32(200_000 + i), cpu: uint16(i % 2)}, nil})
	}
	// Drain order: A's records swapped in pairs (two CPUs' rings
	// alternating), one of B's read 600 records late.
	for i := 1; i+1 < len(a); i += 2 {
		if a[i].name == "sock_send" && a[i+1].name == "sock_send" {
			a[i], a[i+1] = a[i+1], a[i]
		}
	}
	moved := b[100]
	b = append(b[:100], b[101:]...)
	b = append(b[:700], append([]recSpec{moved}, b[700:]...)...)

	files := map[string][]byte{"a.mgt": mergeTrace(t, "ha", wallA, a), "b.mgt": mergeTrace(t, "hb", wallB, b)}
	c, late := exportTable(t, files, []string{"a.mgt", "b.mgt"})
	if late != 0 {
		t.Errorf("late = %d, want 0", late)
	}
	if len(c.time) != 2*n {
		t.Fatalf("%d rows, want %d", len(c.time), 2*n)
	}
	seen := map[int64]int{}
	for i := range c.time {
		seen[c.size[i]]++
		if i > 0 && c.time[i] < c.time[i-1] {
			t.Fatalf("row %d: time_ns %d after %d", i, c.time[i], c.time[i-1])
		}
		if i > 0 && c.time[i] == c.time[i-1] && c.traceName[i] == "a.mgt" && c.traceName[i-1] == "b.mgt" {
			t.Fatalf("row %d: a tie put b.mgt before a.mgt", i)
		}
		id := c.size[i]
		var wantTrace, wantHost, wantComm string
		var wantTime int64
		switch {
		case id >= 200_000:
			j := id - 200_000
			wantTrace, wantHost, wantComm = "b.mgt", "hb", "beta"
			wantTime = wallA + t0 + 20*j + 10
			if j%7 == 0 {
				wantTime -= 10
			}
		default:
			j := id - 100_000
			wantTrace, wantHost, wantComm = "a.mgt", "ha", "alpha"
			if j >= n/2 {
				wantComm = "alpha2"
			}
			wantTime = wallA + t0 + 20*j
		}
		if got := fmt.Sprint(c.traceName[i], c.host[i], c.comm[i], c.time[i]); got != fmt.Sprint(wantTrace, wantHost, wantComm, wantTime) {
			t.Fatalf("row %d (size %d): %s, want %s", i, id, got, fmt.Sprint(wantTrace, wantHost, wantComm, wantTime))
		}
	}
	for i := range n {
		for _, id := range []int64{int64(100_000 + i), int64(200_000 + i)} {
			if seen[id] != 1 {
				t.Fatalf("record %d written %d times", id, seen[id])
			}
		}
	}
	// Equal times: every 7th pair ties, and the first source wins.
	if c.traceName[0] != "a.mgt" || c.traceName[1] != "b.mgt" || c.time[0] != c.time[1] {
		t.Errorf("first two rows %s@%d %s@%d, want a tie with a.mgt first", c.traceName[0], c.time[0], c.traceName[1], c.time[1])
	}
	// The other order of the sources breaks ties the other way.
	c, _ = exportTable(t, files, []string{"b.mgt", "a.mgt"})
	if c.traceName[0] != "b.mgt" || c.time[0] != c.time[1] {
		t.Errorf("sources b, a: first row from %s, want b.mgt", c.traceName[0])
	}
}

// TestWriteTableLate: a record further out of order than the window is
// still written once, late, and counted.
func TestWriteTableLate(t *testing.T) {
	const n = 3000
	var recs []recSpec
	for i := range n {
		recs = append(recs, recSpec{"sock_send", hdr{time: uint64(t0 + 10*i), size: int32(i)}, nil})
	}
	moved := recs[10]
	recs = append(recs[:10], recs[11:]...)
	recs = append(recs[:2500], append([]recSpec{moved}, recs[2500:]...)...)
	c, late := exportTable(t, map[string][]byte{"x.mgt": mergeTrace(t, "x", 0, recs)}, []string{"x.mgt"})
	if late != 1 {
		t.Errorf("late = %d, want 1", late)
	}
	if len(c.size) != n {
		t.Fatalf("%d rows, want %d", len(c.size), n)
	}
	seen := map[int64]bool{}
	for _, s := range c.size {
		if seen[s] {
			t.Fatalf("record %d written twice", s)
		}
		seen[s] = true
	}
}
