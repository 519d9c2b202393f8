// SPDX-License-Identifier: Apache-2.0

package export

import (
	"fmt"
	"io"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress/zstd"
)

// parquetWriter writes the table as one Parquet file with typed, optional
// columns (int64, uint64, UTF-8 strings), which pandas, polars and DuckDB
// read directly.
//
// A row has a column for every field of every event type, and an event
// fills a tenth of them, so the writer is columnar: a row only appends its
// non-null cells to their column's pending values, and at each batch the
// nulls between them go to parquet-go's column writers as runs sliced from
// one shared slice of nulls. Assembling whole parquet.Rows cost a Value,
// its levels and a copy for every null cell, ~80% of an export's CPU time.
type parquetWriter struct {
	t      *Table
	w      *parquet.GenericWriter[any]
	cols   []*parquet.ColumnWriter // by leaf
	leafOf []int                   // table column -> parquet leaf
	kinds  []ColumnKind            // by table column
	pend   []pendingColumn         // by leaf
	rows   int                     // rows in the batch
	group  int                     // rows in the row group, batch excluded
	nulls  []parquet.Value
	arena  []byte // the batch's strings: the column buffers copy them at flush
}

// pendingColumn is one column's non-null cells of the batch and the rows
// they are in, ascending.
type pendingColumn struct {
	vals []parquet.Value
	at   []int32
}

const (
	parquetBatch    = 1024
	parquetRowGroup = 32 << 10 // rows: about 40 MB of buffers with every field a column
)

// parquetZstd is zstd at its fastest level: the default level took a fifth
// of an export's CPU time for files only a few percent smaller.
var parquetZstd = &zstd.Codec{Level: zstd.SpeedFastest}

// maxParquetColumns is the most columns parquet-go writes: one more made
// it panic.
const maxParquetColumns = 65534

func newParquetWriter(t *Table, out io.Writer) (*parquetWriter, error) {
	if len(t.Columns) > maxParquetColumns {
		return nil, fmt.Errorf("the traces' dictionaries make %d columns, more than the %d columns Parquet takes: export fewer traces at once, or as csv", len(t.Columns), maxParquetColumns)
	}
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
	// zstd: uncompressed columns made exports ~15x larger (108 vs 7 bytes
	// per event on a host-wide recording); every Parquet reader has zstd.
	// Row groups of a bounded size (parquetRowGroup, cut by flush) keep the
	// writer's memory bounded, however long the trace.
	pw := &parquetWriter{
		t:      t,
		w:      parquet.NewGenericWriter[any](out, schema, parquet.Compression(parquetZstd)),
		leafOf: make([]int, len(t.Columns)),
		nulls:  make([]parquet.Value, parquetBatch),
	}
	// A group's leaves are ordered by name: map each to its table column.
	for li, path := range schema.Columns() {
		i, ok := t.index[path[0]]
		if !ok {
			return nil, fmt.Errorf("parquet schema: unknown column %q", path[0])
		}
		pw.leafOf[i] = li
	}
	for _, c := range t.Columns {
		pw.kinds = append(pw.kinds, c.Kind)
	}
	pw.cols = pw.w.ColumnWriters()
	pw.pend = make([]pendingColumn, len(pw.cols))
	return pw, nil
}

func (p *parquetWriter) WriteRow(row []Value) error {
	if cells := p.t.setCells(row); cells != nil {
		for _, ti := range cells {
			p.cell(row, ti)
		}
	} else {
		for ti := range row {
			p.cell(row, ti)
		}
	}
	p.rows++
	if p.rows >= parquetBatch {
		return p.flush()
	}
	return nil
}

// cell stages cell ti of row, unless it is null.
func (p *parquetWriter) cell(row []Value, ti int) {
	v := &row[ti]
	if v.Null {
		return
	}
	var pv parquet.Value
	switch p.kinds[ti] {
	case KindInt:
		pv = parquet.Int64Value(v.Int)
	case KindUint:
		pv = parquet.Int64Value(int64(v.Uint))
	default:
		start := len(p.arena)
		p.arena = append(p.arena, v.Str...)
		pv = parquet.ByteArrayValue(p.arena[start:len(p.arena):len(p.arena)])
	}
	li := p.leafOf[ti]
	pc := &p.pend[li]
	pc.vals = append(pc.vals, pv.Level(0, 1, li))
	pc.at = append(pc.at, int32(p.rows))
}

// flush writes the batch to the column writers, each column's cells in
// runs of values and of nulls, and ends the row group when it is full.
func (p *parquetWriter) flush() error {
	if p.rows == 0 {
		return nil
	}
	for li := range p.pend {
		pc := &p.pend[li]
		cw := p.cols[li]
		next := int32(0)
		for i := 0; i < len(pc.at); {
			if r := pc.at[i]; r > next {
				if _, err := cw.WriteRowValues(p.nulls[:r-next]); err != nil {
					return fmt.Errorf("write parquet: %w", err)
				}
			}
			j := i + 1
			for j < len(pc.at) && pc.at[j] == pc.at[j-1]+1 {
				j++
			}
			if _, err := cw.WriteRowValues(pc.vals[i:j]); err != nil {
				return fmt.Errorf("write parquet: %w", err)
			}
			next = pc.at[j-1] + 1
			i = j
		}
		if n := int32(p.rows); next < n {
			if _, err := cw.WriteRowValues(p.nulls[:n-next]); err != nil {
				return fmt.Errorf("write parquet: %w", err)
			}
		}
		pc.vals, pc.at = pc.vals[:0], pc.at[:0]
	}
	p.group += p.rows
	p.rows = 0
	p.arena = p.arena[:0]
	if p.group >= parquetRowGroup {
		p.group = 0
		if err := p.w.Flush(); err != nil {
			return fmt.Errorf("write parquet: %w", err)
		}
	}
	return nil
}

func (p *parquetWriter) Close() error {
	if err := p.flush(); err != nil {
		return err
	}
	if err := p.w.Close(); err != nil {
		return fmt.Errorf("write parquet: %w", err)
	}
	return nil
}
