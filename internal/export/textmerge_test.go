// SPDX-License-Identifier: Apache-2.0

package export_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// textOf runs WriteTexts on the named traces and returns its lines (header
// line included) and late count.
func textOf(t *testing.T, files map[string][]byte, order []string, opts export.TextOptions) ([]string, uint64) {
	t.Helper()
	var srcs []export.TableSource
	for _, name := range order {
		srcs = append(srcs, export.TableSource{Name: name, Reader: newReader(t, files[name])})
	}
	var out bytes.Buffer
	late, err := export.WriteTexts(&out, srcs, opts)
	if err != nil {
		t.Fatalf("WriteTexts: %v", err)
	}
	return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n"), late
}

// column returns column i of every line after the header line.
func column(lines []string, i int) []string {
	var out []string
	for _, l := range lines[1:] {
		out = append(out, strings.Split(l, "\t")[i])
	}
	return out
}

// controlRingTrace is what a recorder writes: the event rings' records,
// then the control ring's (drained apart) with earlier times.
func controlRingTrace(t *testing.T) []byte {
	return mergeTrace(t, "h", 0, []recSpec{
		{"task", hdr{time: t0, tid: 7}, vals{"pid": 7, "comm": "app"}},
		{"sock_send", hdr{time: t0 + 2000, conn: 5, tid: 7, size: 1}, nil},
		{"tcp_xmit", hdr{time: t0 + 3000, conn: 5, tid: 7, size: 2}, nil},
		{"sock_send", hdr{time: t0 + 5000, conn: 5, tid: 7, size: 3}, nil},
		{"conn_open", hdr{time: t0 + 1000, conn: 5, tid: 7}, vals{"proto": 6, "family": 4}},
		{"conn_close", hdr{time: t0 + 4000, conn: 5}, vals{"state": 7}},
	})
}

// TestWriteTextsTimeOrder: the control ring's records, stored after events
// of later times, are printed in time order; --file-order keeps the file's.
func TestWriteTextsTimeOrder(t *testing.T) {
	files := map[string][]byte{"x.mgt": controlRingTrace(t)}
	lines, late := textOf(t, files, []string{"x.mgt"}, export.TextOptions{})
	if late != 0 {
		t.Errorf("late = %d, want 0", late)
	}
	if lines[0] != headerLine {
		t.Errorf("header line %q, want %q", lines[0], headerLine)
	}
	got := fmt.Sprint(column(lines, 0), column(lines, 7))
	want := "[0.000001000 0.000002000 0.000003000 0.000004000 0.000005000] [conn_open sock_send tcp_xmit conn_close sock_send]"
	if got != want {
		t.Errorf("time order:\n got %s\nwant %s", got, want)
	}
	lines, late = textOf(t, files, []string{"x.mgt"}, export.TextOptions{FileOrder: true, Meta: true})
	got = fmt.Sprint(column(lines, 0), column(lines, 7))
	want = "[0.000000000 0.000002000 0.000003000 0.000005000 0.000001000 0.000004000] [task sock_send tcp_xmit sock_send conn_open conn_close]"
	if got != want || late != 0 {
		t.Errorf("file order (late %d):\n got %s\nwant %s", late, got, want)
	}
	// The zero of relative time does not depend on what is printed: the
	// task record at t0 counts, printed or not.
	lines, _ = textOf(t, files, []string{"x.mgt"}, export.TextOptions{Filter: func(r trace.Record) bool { return r.Type.Name == "conn_close" }})
	if got := fmt.Sprint(column(lines, 0)); got != "[0.000004000]" {
		t.Errorf("filtered: times %s, want [0.000004000]", got)
	}
}

// TestWriteTextsLate: a record further out of order than the window is
// printed once, late, and counted; the rest stays in order.
func TestWriteTextsLate(t *testing.T) {
	const n = 3000
	var recs []recSpec
	for i := range n {
		recs = append(recs, recSpec{"sock_send", hdr{time: uint64(t0 + 10*i), size: int32(i)}, nil})
	}
	moved := recs[10]
	recs = append(recs[:10], recs[11:]...)
	recs = append(recs[:2500], append([]recSpec{moved}, recs[2500:]...)...)
	// Within the window: 1,000 records late is put right.
	near := recs[2990]
	recs = append(recs[:2990], recs[2991:]...)
	recs = append(recs[:1990], append([]recSpec{near}, recs[1990:]...)...)
	files := map[string][]byte{"x.mgt": mergeTrace(t, "x", 0, recs)}
	lines, late := textOf(t, files, []string{"x.mgt"}, export.TextOptions{})
	if late != 1 {
		t.Errorf("late = %d, want 1", late)
	}
	sizes := column(lines, 8)
	if len(sizes) != n {
		t.Fatalf("%d lines, want %d", len(sizes), n)
	}
	var want []string
	for i := range n {
		if i != 10 {
			want = append(want, fmt.Sprint(i))
		}
	}
	idx := -1
	for i, s := range sizes {
		if s == "10" {
			idx = i
		}
	}
	rest := append(append([]string(nil), sizes[:idx]...), sizes[idx+1:]...)
	if fmt.Sprint(rest) != fmt.Sprint(want) {
		t.Errorf("apart from the late record the lines are not in order")
	}
	// Record 10, at file position p, is read once p-(window-1) lines are
	// out; nothing held is earlier, so it is the next line.
	p := -1
	for i, r := range recs {
		if r.h.size == 10 {
			p = i
		}
	}
	if want := p - (export.ReorderWindow - 1); idx != want {
		t.Errorf("the late record is line %d, want %d", idx, want)
	}
}

// TestWriteTextsSeveral: two traces of two machines are merged by wall
// clock, each line naming its trace; two traces of one boot are merged by
// their shared clock, whatever their wall offsets say, as in report and in
// the table export.
func TestWriteTextsSeveral(t *testing.T) {
	const wallA = int64(1_700_000_000_000_000_000)
	// On A's clock: A at 1000, 3000, 5000; B at 2000, 4000 (conn_open
	// stored last), 6000.
	a := []recSpec{
		{"sock_send", hdr{time: t0 + 1000, size: 1}, nil},
		{"sock_send", hdr{time: t0 + 3000, size: 3}, nil},
		{"sock_send", hdr{time: t0 + 5000, size: 5}, nil},
	}
	bRecs := func(shift int64) []recSpec {
		return []recSpec{
			{"sock_recv", hdr{time: uint64(t0 + 2000 + shift), size: 2}, nil},
			{"sock_recv", hdr{time: uint64(t0 + 6000 + shift), size: 6}, nil},
			{"conn_open", hdr{time: uint64(t0 + 4000 + shift), conn: 9}, vals{"proto": 6, "family": 4}},
		}
	}
	// Another machine whose monotonic clock reads 1 s more, its wall
	// offset 1 s less.
	files := map[string][]byte{
		"a.mgt": bootTrace(t, "ha", wallA, "boot-a", a),
		"b.mgt": bootTrace(t, "hb", wallA-1e9, "boot-b", bRecs(1e9)),
	}
	lines, late := textOf(t, files, []string{"a.mgt", "b.mgt"}, export.TextOptions{})
	if late != 0 {
		t.Errorf("late = %d", late)
	}
	if want := "trace\t" + headerLine; lines[0] != want {
		t.Errorf("header line %q, want %q", lines[0], want)
	}
	got := fmt.Sprint(column(lines, 0), column(lines, 1), column(lines, 9))
	want := "[a.mgt b.mgt a.mgt b.mgt a.mgt b.mgt] [0.000000000 0.000001000 0.000002000 0.000003000 0.000004000 0.000005000] [1 2 3 0 5 6]"
	if got != want {
		t.Errorf("two machines:\n got %s\nwant %s", got, want)
	}
	abs, _ := textOf(t, files, []string{"a.mgt", "b.mgt"}, export.TextOptions{Time: export.TimeAbsolute})
	wallB2000 := time.Unix(0, wallA+t0+2000).UTC().Format("2006-01-02T15:04:05.000000000Z")
	if got, want := column(abs, 1)[1], wallB2000; got != want {
		t.Errorf("b's first abs time %s, want %s", got, want)
	}
	raw, _ := textOf(t, files, []string{"a.mgt", "b.mgt"}, export.TextOptions{Time: export.TimeRaw})
	if got, want := column(raw, 1)[1], fmt.Sprint(int64(t0+2000+1e9)); got != want {
		t.Errorf("b's first raw time %s, want its own clock's %s", got, want)
	}
	// --file-order: trace after trace, as stored.
	fo, _ := textOf(t, files, []string{"a.mgt", "b.mgt"}, export.TextOptions{FileOrder: true})
	if got, want := fmt.Sprint(column(fo, 9)), "[1 3 5 2 6 0]"; got != want {
		t.Errorf("file order: sizes %s, want %s", got, want)
	}

	// One boot, two recorders whose wall offsets differ by 3 µs (each
	// measured its own): the shared clock orders B's 2000 before A's 3000
	// although B's offset would put it after.
	same := map[string][]byte{
		"a.mgt": bootTrace(t, "h", wallA, "boot-1", a),
		"b.mgt": bootTrace(t, "h", wallA+1500, "boot-1", bRecs(0)),
	}
	lines, _ = textOf(t, same, []string{"a.mgt", "b.mgt"}, export.TextOptions{Time: export.TimeAbsolute})
	if got, want := fmt.Sprint(column(lines, 9)), "[1 2 3 0 5 6]"; got != want {
		t.Errorf("one boot: sizes %s, want %s", got, want)
	}
	if got, want := column(lines, 1)[1], wallB2000; got != want {
		t.Errorf("one boot: b's first abs time %s, want %s (a's wall offset)", got, want)
	}
	// The table export places rows by the same rule.
	var srcs []export.TableSource
	var hs []*trace.Header
	for _, name := range []string{"a.mgt", "b.mgt"} {
		r := newReader(t, same[name])
		srcs = append(srcs, export.TableSource{Name: name, Reader: r})
		hs = append(hs, r.Header())
	}
	tb := export.NewTable(hs)
	c := newCapture(tb)
	if _, err := export.WriteTable(tb, srcs, c); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(c.size), "[1 2 3 0 5 6]"; got != want {
		t.Errorf("table, one boot: sizes %s, want %s", got, want)
	}
	if got, want := c.time[1], wallA+t0+2000; got != want {
		t.Errorf("table, one boot: b's time_ns %d, want %d", got, want)
	}
}
