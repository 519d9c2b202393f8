// SPDX-License-Identifier: Apache-2.0

package export

import (
	"fmt"
	"io"

	"github.com/parquet-go/parquet-go"
)

// parquetWriter writes the table as one Parquet file with typed, optional
// columns (int64, uint64, UTF-8 strings), which pandas, polars and DuckDB
// read directly.
type parquetWriter struct {
	w      *parquet.GenericWriter[any]
	leaf   []int // parquet leaf column index -> table column
	kinds  []ColumnKind
	batch  []parquet.Row
	values []parquet.Value
}

const (
	parquetBatch    = 4096
	parquetRowGroup = 32 << 10 // rows: about 40 MB of buffers with every field a column
)

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
	// Row groups of a bounded size keep the writer's memory bounded, however
	// long the trace: the default puts the whole file in one row group.
	pw := &parquetWriter{w: parquet.NewGenericWriter[any](out, schema, parquet.Compression(&parquet.Zstd), parquet.MaxRowsPerRowGroup(parquetRowGroup))}
	// A group's leaves are ordered by name: map each to its table column.
	for _, path := range schema.Columns() {
		i, ok := t.index[path[0]]
		if !ok {
			return nil, fmt.Errorf("parquet schema: unknown column %q", path[0])
		}
		pw.leaf = append(pw.leaf, i)
	}
	for _, c := range t.Columns {
		pw.kinds = append(pw.kinds, c.Kind)
	}
	return pw, nil
}

func (p *parquetWriter) WriteRow(row []Value) error {
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
	if len(p.batch) >= parquetBatch {
		return p.flush()
	}
	return nil
}

func (p *parquetWriter) flush() error {
	if len(p.batch) == 0 {
		return nil
	}
	if _, err := p.w.WriteRows(p.batch); err != nil {
		return fmt.Errorf("write parquet: %w", err)
	}
	p.batch, p.values = p.batch[:0], p.values[:0]
	return nil
}

func (p *parquetWriter) Close() error {
	if err := p.flush(); err != nil {
		return err
	}
	return p.w.Close()
}
