// SPDX-License-Identifier: Apache-2.0

package export

import (
	"fmt"
	"io"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress/zstd"
)

// parquetWriter writes the table as one Parquet file with typed, optional
// columns (int64, uint64, UTF-8 strings), which pandas, polars, DuckDB and
// Spark read directly.
//
// A row has a column for every field of every event type (167 on a
// recording of every event group) and an event fills a tenth of them, so
// nulls are most of the cells: the chunkWriter keeps only the values.
type parquetWriter struct {
	t      *Table
	cw     *chunkWriter
	leafOf []int        // table column -> leaf
	kinds  []ColumnKind // by table column
}

const (
	// parquetRowGroup is the most rows in a row group: engines split work
	// by row group, and the writer holds one row group's values.
	parquetRowGroup = 32 << 10
	// parquetGroupBytes ends a row group early when a column's values
	// take this much (long hex fields): a column chunk is one page, and
	// readers cap a page's size.
	parquetGroupBytes = 64 << 20
)

// parquetZstd is zstd at its fastest level: the default level took a fifth
// of an export's CPU time for files only a few percent smaller.
var parquetZstd = &zstd.Codec{Level: zstd.SpeedFastest}

// maxParquetColumns is the most columns parquet-go writes (its schema
// makes this writer's footer): one more made it panic.
const maxParquetColumns = 65534

// parquetSchema is the table's Parquet schema: every column optional.
func parquetSchema(t *Table) *parquet.Schema {
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
	return parquet.NewSchema("magnet", group)
}

func newParquetWriter(t *Table, out io.Writer) (*parquetWriter, error) {
	if len(t.Columns) > maxParquetColumns {
		return nil, fmt.Errorf("the traces' dictionaries make %d columns, more than the %d columns Parquet takes: export fewer traces at once, or as csv", len(t.Columns), maxParquetColumns)
	}
	schema := parquetSchema(t)
	cw, err := newChunkWriter(out, schema, parquetRowGroup, parquetGroupBytes)
	if err != nil {
		return nil, err
	}
	pw := &parquetWriter{t: t, cw: cw, leafOf: make([]int, len(t.Columns))}
	// A group's leaves are ordered by name: map each to its table column.
	leaves := schema.Columns()
	if len(leaves) != len(t.Columns) {
		return nil, fmt.Errorf("parquet schema: %d leaves for %d columns", len(leaves), len(t.Columns))
	}
	for li, path := range leaves {
		i, ok := t.index[path[0]]
		if !ok {
			return nil, fmt.Errorf("parquet schema: unknown column %q", path[0])
		}
		pw.leafOf[i] = li
	}
	for _, c := range t.Columns {
		pw.kinds = append(pw.kinds, c.Kind)
	}
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
	return p.cw.endRow()
}

// cell stages cell ti of row, unless it is null.
func (p *parquetWriter) cell(row []Value, ti int) {
	v := &row[ti]
	if v.Null {
		return
	}
	switch p.kinds[ti] {
	case KindInt:
		p.cw.putInt64(p.leafOf[ti], v.Int)
	case KindUint:
		p.cw.putInt64(p.leafOf[ti], int64(v.Uint))
	default:
		p.cw.putString(p.leafOf[ti], v.Str)
	}
}

func (p *parquetWriter) Close() error { return p.cw.close() }
