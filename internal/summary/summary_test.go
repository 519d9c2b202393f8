// SPDX-License-Identifier: Apache-2.0

package summary

import (
	"encoding/binary"
	"testing"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// fakeMap stands in for the summaries map: per-CPU values by cookie.
type fakeMap struct {
	vals      map[uint64][][]byte
	forgotten []uint64
	// beforeForget runs as a delete begins: a program adding meanwhile.
	beforeForget func(cookie uint64)
}

func (m *fakeMap) ReadSummaries(fn func(uint64, [][]byte) error) error {
	for k, v := range m.vals {
		if err := fn(k, v); err != nil {
			return err
		}
	}
	return nil
}

func (m *fakeMap) ForgetSummary(cookie uint64) ([][]byte, error) {
	if m.beforeForget != nil {
		m.beforeForget(cookie)
	}
	v := m.vals[cookie]
	delete(m.vals, cookie)
	m.forgotten = append(m.forgotten, cookie)
	return v, nil
}

func connSummaryType(t *testing.T) *trace.EventType {
	t.Helper()
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		t.Fatal(err)
	}
	for i := range types {
		if types[i].ID == uint8(event.ConnSummary) {
			return &types[i]
		}
	}
	t.Fatal("no conn_summary in the dictionary")
	return nil
}

func field(t *testing.T, typ *trace.EventType, name string) trace.Field {
	t.Helper()
	for _, f := range typ.Fields {
		if f.Name == name {
			return f
		}
	}
	t.Fatalf("conn_summary has no field %s", name)
	return trace.Field{}
}

func put(b []byte, f trace.Field, v uint64) {
	if f.Size == 8 {
		binary.NativeEndian.PutUint64(b[f.Offset:], v)
	} else {
		binary.NativeEndian.PutUint32(b[f.Offset:], uint32(v))
	}
}

func get(b []byte, f trace.Field) uint64 {
	if f.Size == 8 {
		return binary.NativeEndian.Uint64(b[f.Offset:])
	}
	return uint64(binary.NativeEndian.Uint32(b[f.Offset:]))
}

// TestCollectDifferences: records carry what moved since the connection's
// previous record, summed over CPUs; a connection whose figures did not
// move gets none; a closed one is forgotten once quiet.
func TestCollectDifferences(t *testing.T) {
	typ := connSummaryType(t)
	bytes, hist, start := field(t, typ, "sock_send_bytes"), field(t, typ, "rtt_hist_3"), field(t, typ, "start_ns")
	m := &fakeMap{vals: map[uint64][][]byte{7: {make([]byte, typ.Size), make([]byte, typ.Size)}}}
	c, err := New(m, typ, 1000)
	if err != nil {
		t.Fatal(err)
	}
	c.Opened(7, 42)
	var recs [][]byte
	write := func(rec []byte) error {
		recs = append(recs, append([]byte(nil), rec...))
		return nil
	}
	put(m.vals[7][0], bytes, 100)
	put(m.vals[7][1], bytes, 50)
	put(m.vals[7][1], hist, 2)
	if n, err := c.Collect(2_000_000_000, write); err != nil || n != 1 {
		t.Fatalf("first pass: %d records, %v", n, err)
	}
	r := recs[0]
	if got := get(r, bytes); got != 150 {
		t.Errorf("sock_send_bytes %d, want 150 (both CPUs)", got)
	}
	if got := get(r, hist); got != 2 {
		t.Errorf("rtt_hist_3 %d, want 2", got)
	}
	if got := get(r, start); got != 1000 {
		t.Errorf("start_ns %d, want 1000", got)
	}
	if binary.NativeEndian.Uint64(r[0:]) != 2_000_000_000 || binary.NativeEndian.Uint64(r[8:]) != 7 ||
		binary.NativeEndian.Uint32(r[24:]) != 42 || r[30] != uint8(event.ConnSummary) {
		t.Errorf("header %x", r[:32])
	}
	if got := binary.NativeEndian.Uint32(r[20:]); got != 1999 {
		t.Errorf("size %d, want the interval in ms (1999)", got)
	}
	// Nothing moved: no record.
	if n, _ := c.Collect(3_000_000_000, write); n != 0 {
		t.Errorf("a pass with nothing moved wrote %d records", n)
	}
	put(m.vals[7][0], bytes, 130)
	c.Closed(7)
	if n, _ := c.Collect(4_000_000_000, write); n != 1 {
		t.Fatalf("third pass: %d records", n)
	}
	r = recs[1]
	if got := get(r, bytes); got != 30 {
		t.Errorf("sock_send_bytes %d, want the difference 30", got)
	}
	if got := get(r, hist); got != 0 {
		t.Errorf("rtt_hist_3 %d, want 0 (unchanged)", got)
	}
	if got := get(r, start); got != 3_000_000_000 {
		t.Errorf("start_ns %d, want the previous pass's time", got)
	}
	if len(m.forgotten) != 0 {
		t.Errorf("forgotten %v while its figures still moved", m.forgotten)
	}
	if n, _ := c.Collect(5_000_000_000, write); n != 0 || len(m.forgotten) != 1 || len(c.conns) != 0 {
		t.Errorf("closed and quiet: %d records, forgotten %v, %d known; want none, [7], 0", n, m.forgotten, len(c.conns))
	}
}

func TestNewRefusesOtherTypes(t *testing.T) {
	if _, err := New(&fakeMap{}, &trace.EventType{ID: uint8(event.TCPXmit)}, 0); err == nil {
		t.Error("New took a tcp_xmit layout")
	}
}

// TestCollectNeverGoesBack: a figure read below its previous total (a
// socket's figures are totals read from it, not adds) writes no wrapped
// difference: it counts as unmoved, the total stays, and only what goes
// past it later is written.
func TestCollectNeverGoesBack(t *testing.T) {
	typ := connSummaryType(t)
	bytes, segs := field(t, typ, "tcp_rcv_bytes"), field(t, typ, "tcp_xmit_segs")
	m := &fakeMap{vals: map[uint64][][]byte{9: {make([]byte, typ.Size)}}}
	c, err := New(m, typ, 0)
	if err != nil {
		t.Fatal(err)
	}
	var recs [][]byte
	write := func(rec []byte) error {
		recs = append(recs, append([]byte(nil), rec...))
		return nil
	}
	v := m.vals[9][0]
	put(v, bytes, 1000)
	put(v, segs, 10)
	c.Collect(1e9, write)
	put(v, bytes, 999) // read one byte short
	put(v, segs, 12)
	c.Collect(2e9, write)
	put(v, bytes, 1500)
	c.Collect(3e9, write)
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3", len(recs))
	}
	for i, want := range []uint64{1000, 0, 500} {
		if got := get(recs[i], bytes); got != want {
			t.Errorf("record %d: tcp_rcv_bytes %d, want %d", i, got, want)
		}
	}
	if got := get(recs[1], segs); got != 2 {
		t.Errorf("record 1: tcp_xmit_segs %d, want 2 (the other figure still moved)", got)
	}
}

// TestCollectForgetLosesNothing: a packet of a closed connection counted
// between the pass's read and the delete goes in a last record; one
// counted after the delete makes figures anew, recorded in the
// connection's netns (not 0) and forgotten again once quiet.
func TestCollectForgetLosesNothing(t *testing.T) {
	typ := connSummaryType(t)
	drops := field(t, typ, "drop_dev_packets")
	m := &fakeMap{vals: map[uint64][][]byte{7: {make([]byte, typ.Size)}}}
	c, err := New(m, typ, 0)
	if err != nil {
		t.Fatal(err)
	}
	c.Opened(7, 42)
	var recs [][]byte
	write := func(rec []byte) error {
		recs = append(recs, append([]byte(nil), rec...))
		return nil
	}
	put(m.vals[7][0], drops, 5)
	c.Collect(1e9, write)
	c.Closed(7)
	m.beforeForget = func(cookie uint64) { put(m.vals[cookie][0], drops, 6) }
	if n, _ := c.Collect(2e9, write); n != 1 || len(m.forgotten) != 1 {
		t.Fatalf("closed and quiet, one drop during the delete: %d records, forgotten %v; want 1, [7]", n, m.forgotten)
	}
	m.beforeForget = nil
	// A late drop after the delete: the programs make the entry anew.
	m.vals[7] = [][]byte{make([]byte, typ.Size)}
	put(m.vals[7][0], drops, 1)
	if n, _ := c.Collect(3e9, write); n != 1 {
		t.Fatalf("late drop: %d records, want 1", n)
	}
	if n, _ := c.Collect(4e9, write); n != 0 || len(m.forgotten) != 2 {
		t.Errorf("late entry quiet: %d records, forgotten %v; want 0, [7 7]", n, m.forgotten)
	}
	var total uint64
	for i, r := range recs {
		total += get(r, drops)
		if ns := binary.NativeEndian.Uint32(r[24:]); ns != 42 {
			t.Errorf("record %d in netns %d, want 42", i, ns)
		}
	}
	if total != 7 || len(recs) != 3 {
		t.Errorf("%d records with %d drops, want 3 with 5 + 1 + 1", len(recs), total)
	}
}
