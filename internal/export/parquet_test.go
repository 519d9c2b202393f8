// SPDX-License-Identifier: Apache-2.0

package export

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/internal/tracegen"
)

// rowParquetWriter is the writer the columnar parquetWriter replaced: it
// assembles every row as a parquet.Row, nulls included. It stays here as
// the reference the columnar writer must agree with, value for value.
type rowParquetWriter struct {
	w      *parquet.GenericWriter[any]
	leaf   []int
	kinds  []ColumnKind
	batch  []parquet.Row
	values []parquet.Value
}

func newRowParquetWriter(t *Table, out io.Writer) *rowParquetWriter {
	group := parquet.Group{}
	for _, c := range t.Columns {
		var n parquet.Node
		switch c.Kind {
		case KindInt:
			n = parquet.Int(64)
		case KindUint:
			n = parquet.Uint(64)
		default:
			n = parquet.String()
		}
		group[c.Name] = parquet.Optional(n)
	}
	schema := parquet.NewSchema("magnet", group)
	pw := &rowParquetWriter{w: parquet.NewGenericWriter[any](out, schema, parquet.Compression(&parquet.Zstd), parquet.MaxRowsPerRowGroup(parquetRowGroup))}
	for _, path := range schema.Columns() {
		pw.leaf = append(pw.leaf, t.index[path[0]])
	}
	for _, c := range t.Columns {
		pw.kinds = append(pw.kinds, c.Kind)
	}
	return pw
}

func (p *rowParquetWriter) WriteRow(row []Value) error {
	start := len(p.values)
	for li, ti := range p.leaf {
		v := row[ti]
		var pv parquet.Value
		def := 1
		switch {
		case v.Null:
			pv, def = parquet.NullValue(), 0
		case p.kinds[ti] == KindInt:
			pv = parquet.Int64Value(v.Int)
		case p.kinds[ti] == KindUint:
			pv = parquet.Int64Value(int64(v.Uint))
		default:
			pv = parquet.ByteArrayValue([]byte(v.Str))
		}
		p.values = append(p.values, pv.Level(0, def, li))
	}
	p.batch = append(p.batch, parquet.Row(p.values[start:]))
	if len(p.batch) >= 4096 {
		return p.flush()
	}
	return nil
}

func (p *rowParquetWriter) flush() error {
	if _, err := p.w.WriteRows(p.batch); err != nil {
		return err
	}
	p.batch, p.values = p.batch[:0], p.values[:0]
	return nil
}

func (p *rowParquetWriter) Close() error {
	if err := p.flush(); err != nil {
		return err
	}
	return p.w.Close()
}

// fillByName is the row filler fill replaced, which looked every field up
// by name per record: the reference for fill's per-type plans.
func (t *Table) fillByName(row []Value, name string, h *trace.Header, wall int64, held *Held) {
	for i := range row {
		row[i] = Value{Null: true}
	}
	rec := held.Rec
	pid, comm, ok := held.Task()
	set := func(col string, v Value) { row[t.index[col]] = v }
	set("trace", Value{Str: name})
	set("host", Value{Str: h.Host})
	set("time_ns", Value{Int: wall})
	set("cpu", Value{Uint: uint64(rec.CPU())})
	if ok && rec.Type.Name != "lost" {
		set("pid", Value{Uint: uint64(pid)})
		set("comm", Value{Str: comm})
	}
	set("tid", Value{Uint: uint64(rec.TID())})
	set("netns", Value{Uint: uint64(rec.NetNS())})
	if c := rec.Conn(); c != 0 {
		set("conn", Value{Uint: c})
	}
	set("event", Value{Str: rec.Type.Name})
	set("size", Value{Int: int64(rec.Size())})
	v4 := true
	if fam, ok := rec.Uint("family"); ok && fam == 6 {
		v4 = false
	}
	caplen := -1
	if n, ok := rec.Uint("caplen"); ok {
		caplen = int(n)
	}
	for _, f := range rec.Type.Fields {
		i, ok := t.index[f.Name]
		if !ok || t.Columns[i].Kind != columnKind(f) {
			i, ok = t.index[rec.Type.Name+"_"+f.Name]
			if !ok {
				continue
			}
		}
		var v Value
		switch {
		case f.Kind == "ip":
			a, _ := rec.Addr(f.Name, v4)
			v.Str = a.String()
		case f.Kind == "str":
			v.Str, _ = rec.Str(f.Name)
		case f.Kind == "bytes":
			b, _ := rec.Bytes(f.Name)
			if caplen >= 0 && caplen <= len(b) {
				b = b[:caplen]
			}
			v.Str = hex.EncodeToString(b)
		case f.Enum() != "":
			n, _ := rec.Uint(f.Name)
			if s, ok := h.EnumName(f, n); ok {
				v.Str = s
			} else {
				v.Str = fmt.Sprint(n)
			}
		case f.Kind == "i":
			v.Int, _ = rec.Int(f.Name)
		default:
			v.Uint, _ = rec.Uint(f.Name)
		}
		row[i] = v
	}
	if rec.Type.Name == "tcp_xmit" || rec.Type.Name == "tcp_rcv" || rec.Type.Name == "tcp_retrans" {
		if i, ok := t.index["tcpflags"]; ok {
			row[i] = Value{Str: TCPFlags(rec.Flags())}
		}
	}
}

// readParquet reads every row of a Parquet file.
func readParquet(t *testing.T, data []byte) (*parquet.Schema, []parquet.Row) {
	t.Helper()
	f, err := parquet.OpenFile(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	r := parquet.NewReader(f)
	defer r.Close()
	var rows []parquet.Row
	buf := make([]parquet.Row, 512)
	for {
		n, err := r.ReadRows(buf)
		for _, row := range buf[:n] {
			rows = append(rows, row.Clone())
		}
		if errors.Is(err, io.EOF) {
			return f.Schema(), rows
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// sameParquet fails unless the two files have one schema and equal rows in
// one order.
func sameParquet(t *testing.T, want, got []byte) int {
	t.Helper()
	ws, wr := readParquet(t, want)
	gs, gr := readParquet(t, got)
	if ws.String() != gs.String() {
		t.Fatalf("schemas differ:\n%s\n%s", ws, gs)
	}
	if len(wr) != len(gr) {
		t.Fatalf("%d rows, want %d", len(gr), len(wr))
	}
	for i := range wr {
		if !wr[i].Equal(gr[i]) {
			t.Fatalf("row %d differs:\n got %v\nwant %v", i, gr[i], wr[i])
		}
	}
	return len(wr)
}

// Random tables, each cell null with a column's own probability, are
// written alike by the columnar writer and the row writer: runs of nulls
// and values of every length, across batches and row groups.
func TestParquetColumnarMatchesRows(t *testing.T) {
	tb := &Table{index: map[string]int{}}
	kinds := []ColumnKind{KindInt, KindUint, KindString}
	for i := range 40 {
		tb.index[fmt.Sprintf("c%02d", i)] = i
		tb.Columns = append(tb.Columns, Column{fmt.Sprintf("c%02d", i), kinds[i%3]})
	}
	rng := rand.New(rand.NewPCG(1, 2))
	pNull := make([]float64, len(tb.Columns))
	for i := range pNull {
		pNull[i] = []float64{0, 1, 0.5, 0.99, 0.01, rng.Float64()}[i%6]
	}
	var want, got bytes.Buffer
	ref := newRowParquetWriter(tb, &want)
	w, err := NewRowWriter("parquet", tb, &got)
	if err != nil {
		t.Fatal(err)
	}
	row := make([]Value, len(tb.Columns))
	const rows = 3*parquetRowGroup + 519
	for range rows {
		for i := range row {
			row[i] = Value{Null: rng.Float64() < pNull[i], Int: rng.Int64() - rng.Int64(), Uint: rng.Uint64(), Str: strings.Repeat("x", rng.IntN(5))}
		}
		if err := ref.WriteRow(row); err != nil {
			t.Fatal(err)
		}
		if err := w.WriteRow(row); err != nil {
			t.Fatal(err)
		}
	}
	if err := ref.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if n := sameParquet(t, want.Bytes(), got.Bytes()); n != rows {
		t.Fatalf("%d rows, want %d", n, rows)
	}
}

// fillFunc fills a row of t; rowWriterFunc makes the Parquet writer.
type fillFunc func(t *Table, row []Value, name string, h *trace.Header, wall int64, held *Held)

// exportParquet is WriteTable with the filler and writer given.
func exportParquet(t *testing.T, paths []string, fill fillFunc, newWriter func(*Table, io.Writer) RowWriter) []byte {
	t.Helper()
	var srcs []trace.Source
	for _, p := range paths {
		srcs = append(srcs, trace.Source{Name: p, Paths: []string{p}})
	}
	ts, err := OpenTables(srcs)
	if err != nil {
		t.Fatal(err)
	}
	defer CloseTables(ts)
	var hs []*trace.Header
	for _, s := range ts {
		hs = append(hs, s.Reader.Header())
	}
	tb := NewTable(hs)
	var out bytes.Buffer
	w := newWriter(tb, &out)
	m := NewMerge(ts, MergeOptions{})
	row := make([]Value, len(tb.Columns))
	for {
		h, err := m.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		src := ts[h.Source]
		fill(tb, row, src.Name, src.Reader.Header(), h.Wall, h)
		if err := w.WriteRow(row); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// The export of real trace layouts (a synthetic sender and receiver with
// every layer, and the foreign-endian test trace) is the same before and
// after: the row writer fed by per-name lookups, and the columnar writer fed
// by per-type plans. DuckDB, when installed, must see the same rows too.
func TestParquetExportUnchanged(t *testing.T) {
	dir := t.TempDir()
	snd, rcv := writePair(t, dir, "snd.mgt", "rcv.mgt", 150000)
	paths := []string{snd, rcv, "../../testdata/bigendian.mgt"}
	before := exportParquet(t, paths, (*Table).fillByName, func(tb *Table, w io.Writer) RowWriter { return newRowParquetWriter(tb, w) })
	after := exportParquet(t, paths, (*Table).fill, func(tb *Table, w io.Writer) RowWriter {
		pw, err := newParquetWriter(tb, w)
		if err != nil {
			t.Fatal(err)
		}
		return pw
	})
	n := sameParquet(t, before, after)
	if n < 150000 {
		t.Fatalf("only %d rows", n)
	}
	if err := exec.Command("python3", "-c", "import duckdb").Run(); err != nil {
		t.Logf("duckdb not installed for python3: compared with parquet-go's reader only")
		return
	}
	if err := os.WriteFile(filepath.Join(dir, "before.parquet"), before, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "after.parquet"), after, 0o644); err != nil {
		t.Fatal(err)
	}
	q := `select (select count(*) from (select * from 'before.parquet' except all select * from 'after.parquet')),
		(select count(*) from (select * from 'after.parquet' except all select * from 'before.parquet')),
		(select count(*) from 'after.parquet')`
	cmd := exec.Command("python3", "-c", "import duckdb,sys; c = duckdb.connect(); c.execute('set enable_progress_bar = false'); print(*c.execute(sys.argv[1]).fetchone())", q)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("duckdb: %v\n%s", err, out)
	}
	if got, want := strings.TrimSpace(string(out)), fmt.Sprintf("0 0 %d", n); got != want {
		t.Fatalf("duckdb: rows only before, only after, after = %s, want %s", got, want)
	}
}

// Long values end a row group before parquetRowGroup rows: a column chunk
// is one page, and a page must stay small enough for readers.
func TestParquetLongValuesCutRowGroups(t *testing.T) {
	tb := &Table{index: map[string]int{"id": 0, "payload": 1}, Columns: []Column{{"id", KindInt}, {"payload", KindString}}}
	var buf bytes.Buffer
	w, err := NewRowWriter("parquet", tb, &buf)
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("ab", 1<<19) // 1 MB
	const rows = parquetGroupBytes>>20 + 6
	for i := range rows {
		if err := w.WriteRow([]Value{{Int: int64(i)}, {Str: big[:len(big)-i]}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := parquet.OpenFile(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(f.RowGroups()); n != 2 {
		t.Fatalf("%d row groups, want 2 (cut at %d bytes of values)", n, parquetGroupBytes)
	}
	_, got := readParquet(t, buf.Bytes())
	if len(got) != rows {
		t.Fatalf("%d rows, want %d", len(got), rows)
	}
	for i, r := range got {
		if r[0].Int64() != int64(i) || len(r[1].ByteArray()) != len(big)-i {
			t.Fatalf("row %d: id %d, payload of %d bytes", i, r[0].Int64(), len(r[1].ByteArray()))
		}
	}
}

// writePair writes a synthetic sender's and receiver's traces of events
// events over three connections into dir, and returns their paths.
func writePair(t *testing.T, dir, sndName, rcvName string, events int) (snd, rcv string) {
	t.Helper()
	snd, rcv = filepath.Join(dir, sndName), filepath.Join(dir, rcvName)
	fs, err := os.Create(snd)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	fr, err := os.Create(rcv)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.Close()
	if _, err := tracegen.WritePair(fs, fr, tracegen.Options{Events: events, Conns: 3}); err != nil {
		t.Fatal(err)
	}
	return snd, rcv
}
