// SPDX-License-Identifier: Apache-2.0

package export

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// ColumnKind is the type of a table column.
type ColumnKind int

// Column kinds.
const (
	KindInt    ColumnKind = iota // signed 64-bit
	KindUint                     // unsigned 64-bit
	KindString                   // text (addresses, names, enums, hex bytes)
)

// Column is one column of the event table.
type Column struct {
	Name string
	Kind ColumnKind
}

// fixedColumns start every row: where and when the event happened and to
// whom. time_ns is wall-clock time (ns since the Unix epoch), so rows of
// several traces share one timeline.
var fixedColumns = []Column{
	{"trace", KindString}, {"host", KindString}, {"time_ns", KindInt}, {"cpu", KindUint}, {"pid", KindUint}, {"tid", KindUint},
	{"comm", KindString}, {"netns", KindUint}, {"conn", KindUint}, {"event", KindString}, {"size", KindInt},
}

// Table is the event listing of one or more traces as typed rows: the fixed
// columns, then the union of every event type's own fields (empty where an
// event has no such field).
type Table struct {
	Columns []Column
	index   map[string]int
}

// NewTable derives the columns from the traces' dictionaries. A field name
// used with two different kinds gets the event name as a prefix in the
// second.
func NewTable(headers []*trace.Header) *Table {
	t := &Table{Columns: append([]Column(nil), fixedColumns...), index: map[string]int{}}
	for i, c := range t.Columns {
		t.index[c.Name] = i
	}
	for _, h := range headers {
		for _, et := range h.Types {
			for _, f := range et.Fields {
				name, kind := f.Name, columnKind(f)
				if i, ok := t.index[name]; ok {
					if t.Columns[i].Kind == kind {
						continue
					}
					name = et.Name + "_" + f.Name
					if _, ok := t.index[name]; ok {
						continue
					}
				}
				t.index[name] = len(t.Columns)
				t.Columns = append(t.Columns, Column{name, kind})
			}
		}
	}
	// TCP segment events keep their flags in the common flags byte.
	t.index["tcpflags"] = len(t.Columns)
	t.Columns = append(t.Columns, Column{"tcpflags", KindString})
	return t
}

func columnKind(f trace.Field) ColumnKind {
	switch {
	case f.Enum() != "", f.Kind == "ip", f.Kind == "str", f.Kind == "bytes":
		return KindString
	case f.Kind == "i":
		return KindInt
	}
	return KindUint
}

// Value is one cell: Null when the event has no such field.
type Value struct {
	Null bool
	Int  int64
	Uint uint64
	Str  string
}

// RowWriter receives rows of a Table.
type RowWriter interface {
	WriteRow(row []Value) error
	Close() error
}

// TableSource is one trace to export, named for the trace column.
type TableSource struct {
	Name   string
	Reader *trace.Reader
}

// OpenTables opens every source, named by its base name, so that a bad one
// fails before anything is written. On error nothing stays open; otherwise
// the caller closes them with CloseTables.
func OpenTables(srcs []trace.Source) ([]TableSource, error) {
	var out []TableSource
	for _, in := range srcs {
		r, err := in.Open()
		if err != nil {
			CloseTables(out)
			return nil, err
		}
		out = append(out, TableSource{Name: filepath.Base(in.Name), Reader: r})
	}
	return out, nil
}

// CloseTables closes what OpenTables opened.
func CloseTables(ts []TableSource) {
	for _, t := range ts {
		t.Reader.Close()
	}
}

// WriteTable streams every event of the sources (metadata records
// resolved, not written) into w as one timeline: the traces merged by
// time_ns through a Merge. It returns how many rows came more than the
// window out of order and so were written late (out of time order); the
// error, if any, names the trace and comes after the rows written before
// it.
func WriteTable(t *Table, sources []TableSource, w RowWriter) (late uint64, err error) {
	m := NewMerge(sources, MergeOptions{})
	row := make([]Value, len(t.Columns))
	for {
		h, err := m.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return m.Late(), err
		}
		src := sources[h.Source]
		t.fill(row, src.Name, src.Reader.Header(), h.Wall, h)
		if err := w.WriteRow(row); err != nil {
			return m.Late(), err
		}
	}
}

// fill fills row with the record held, of time wall on the common clock.
func (t *Table) fill(row []Value, name string, h *trace.Header, wall int64, held *Held) {
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

// String renders a cell as text ("" for null).
func (v Value) String(k ColumnKind) string {
	if v.Null {
		return ""
	}
	switch k {
	case KindInt:
		return strconv.FormatInt(v.Int, 10)
	case KindUint:
		return strconv.FormatUint(v.Uint, 10)
	}
	return v.Str
}

// Formats lists the export formats WriteFormat accepts.
var Formats = []string{"tsv", "csv", "jsonl", "parquet", "ulm", "pcapng", "perfetto"}

// CheckFormat validates a --format value.
func CheckFormat(f string) error {
	for _, ok := range Formats {
		if f == ok {
			return nil
		}
	}
	return fmt.Errorf("unknown format %q (want %s)", f, strings.Join(Formats, ", "))
}
