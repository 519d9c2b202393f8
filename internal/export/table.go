// SPDX-License-Identifier: Apache-2.0

package export

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
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
	plans   map[*trace.EventType]*typePlan // filled by fill
	nulls   []Value                        // a row of nulls, copied to start each row
	// filled is the row fill filled last and cells the cells it may have
	// set: the next fill of that row resets only those, and a writer may
	// read only those (every other cell is null). A row has a cell for
	// every field of every type; going over all of them per row cost as
	// much as filling it.
	filled *Value
	cells  []int
}

// setCells returns the cells the last fill of row may have set, or nil
// when row was not filled by fill (or changed size).
func (t *Table) setCells(row []Value) []int {
	if len(row) == 0 || &row[0] != t.filled || len(row) != len(t.Columns) {
		return nil
	}
	return t.cells
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

// The fixed columns' places in every event table (fixedColumns' order).
const (
	colTrace = iota
	colHost
	colTimeNs
	colCPU
	colPID
	colTID
	colComm
	colNetNS
	colConn
	colEvent
	colSize
)

// typePlan is where the fields of one event type go in the table, worked
// out once per type: looking each field and enum name up per record cost
// more than writing the row.
type typePlan struct {
	fields []fieldPlan
	cells  []int // every cell a record of the type may set, once each
	// family and caplen are the type's fields of those names (Size 0 when
	// it has none): an address is IPv6 when family is 6, bytes are cut to
	// caplen.
	family, caplen trace.Field
	tcpflags       int // column of the TCP flags, -1 for other types
}

type fieldPlan struct {
	f     trace.Field
	col   int
	kind  byte              // 'a' ip, 's' str, 'b' bytes, 'e' enum, 'i' int, 'u' uint
	names map[uint64]string // an enum's names
}

func (t *Table) plan(h *trace.Header, et *trace.EventType) *typePlan {
	if p, ok := t.plans[et]; ok {
		return p
	}
	p := &typePlan{tcpflags: -1}
	p.family, _ = et.Field("family")
	p.caplen, _ = et.Field("caplen")
	for _, f := range et.Fields {
		i, ok := t.index[f.Name]
		if !ok || t.Columns[i].Kind != columnKind(f) {
			i, ok = t.index[et.Name+"_"+f.Name]
			if !ok {
				continue
			}
		}
		fp := fieldPlan{f: f, col: i}
		switch {
		case f.Kind == "ip":
			fp.kind = 'a'
		case f.Kind == "str":
			fp.kind = 's'
		case f.Kind == "bytes":
			fp.kind = 'b'
		case f.Enum() != "":
			fp.kind = 'e'
			// The dictionary keys its enums by decimal text (what
			// fmt.Sprint makes of the value): keep the keys that are
			// exactly that, as numbers.
			fp.names = map[uint64]string{}
			for k, name := range h.Enums[f.Enum()] {
				if n, err := strconv.ParseUint(k, 10, 64); err == nil && strconv.FormatUint(n, 10) == k {
					fp.names[n] = name
				}
			}
		case f.Kind == "i":
			fp.kind = 'i'
		default:
			fp.kind = 'u'
		}
		p.fields = append(p.fields, fp)
	}
	if et.Name == "tcp_xmit" || et.Name == "tcp_rcv" || et.Name == "tcp_retrans" {
		if i, ok := t.index["tcpflags"]; ok {
			p.tcpflags = i
		}
	}
	seen := map[int]bool{}
	add := func(i int) {
		if !seen[i] {
			seen[i] = true
			p.cells = append(p.cells, i)
		}
	}
	for i := range fixedColumns {
		add(i)
	}
	for _, fp := range p.fields {
		add(fp.col)
	}
	if p.tcpflags >= 0 {
		add(p.tcpflags)
	}
	if t.plans == nil {
		t.plans = map[*trace.EventType]*typePlan{}
	}
	t.plans[et] = p
	return p
}

// fieldBytes is the bytes of field f of rec, as trace.Record's accessors
// bound them.
func fieldBytes(rec trace.Record, f trace.Field) ([]byte, bool) {
	if f.Offset < 0 || f.Size <= 0 || f.Offset > len(rec.Data)-f.Size {
		return nil, false
	}
	return rec.Data[f.Offset : f.Offset+f.Size : f.Offset+f.Size], true
}

// fill fills row with the record held, of time wall on the common clock.
func (t *Table) fill(row []Value, name string, h *trace.Header, wall int64, held *Held) {
	if cells := t.setCells(row); cells != nil {
		for _, i := range cells {
			row[i] = Value{Null: true}
		}
	} else {
		if len(t.nulls) != len(row) {
			t.nulls = make([]Value, len(row))
			for i := range t.nulls {
				t.nulls[i] = Value{Null: true}
			}
		}
		copy(row, t.nulls)
	}
	rec := held.Rec
	pid, comm, ok := held.Task()
	row[colTrace] = Value{Str: name}
	row[colHost] = Value{Str: h.Host}
	row[colTimeNs] = Value{Int: wall}
	row[colCPU] = Value{Uint: uint64(rec.CPU())}
	if ok && rec.Type.Name != "lost" {
		row[colPID] = Value{Uint: uint64(pid)}
		row[colComm] = Value{Str: comm}
	}
	row[colTID] = Value{Uint: uint64(rec.TID())}
	row[colNetNS] = Value{Uint: uint64(rec.NetNS())}
	if c := rec.Conn(); c != 0 {
		row[colConn] = Value{Uint: c}
	}
	row[colEvent] = Value{Str: rec.Type.Name}
	row[colSize] = Value{Int: int64(rec.Size())}
	p := t.plan(h, rec.Type)
	t.filled, t.cells = &row[0], p.cells
	v4 := true
	if fam, ok := rec.FieldUint(p.family); ok && p.family.Size > 0 && fam == 6 {
		v4 = false
	}
	caplen := -1
	if n, ok := rec.FieldUint(p.caplen); ok && p.caplen.Size > 0 {
		caplen = int(n)
	}
	for i := range p.fields {
		fp := &p.fields[i]
		var v Value
		switch fp.kind {
		case 'a':
			if b, ok := fieldBytes(rec, fp.f); ok && len(b) == 16 {
				if v4 {
					v.Str = netip.AddrFrom4([4]byte(b[:4])).String()
				} else {
					v.Str = netip.AddrFrom16([16]byte(b)).String()
				}
			} else {
				v.Str = netip.Addr{}.String()
			}
		case 's':
			if b, ok := fieldBytes(rec, fp.f); ok {
				if i := bytes.IndexByte(b, 0); i >= 0 {
					b = b[:i]
				}
				v.Str = string(b)
			}
		case 'b':
			b, _ := fieldBytes(rec, fp.f)
			if caplen >= 0 && caplen <= len(b) {
				b = b[:caplen]
			}
			v.Str = hex.EncodeToString(b)
		case 'e':
			n, _ := rec.FieldUint(fp.f)
			if s, ok := fp.names[n]; ok {
				v.Str = s
			} else {
				v.Str = strconv.FormatUint(n, 10)
			}
		case 'i':
			v.Int, _ = rec.FieldInt(fp.f)
		default:
			v.Uint, _ = rec.FieldUint(fp.f)
		}
		row[fp.col] = v
	}
	if p.tcpflags >= 0 {
		row[p.tcpflags] = Value{Str: TCPFlags(rec.Flags())}
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
	if f == "" {
		return fmt.Errorf("--format is required (%s)", strings.Join(Formats, ", "))
	}
	for _, ok := range Formats {
		if f == ok {
			return nil
		}
	}
	return fmt.Errorf("unknown format %q (want %s)", f, strings.Join(Formats, ", "))
}
