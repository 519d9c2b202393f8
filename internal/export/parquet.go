// SPDX-License-Identifier: Apache-2.0

package export

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress/zstd"
	"github.com/parquet-go/parquet-go/encoding/rle"
	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"
)

// parquetWriter writes the table as one Parquet file with typed, optional
// columns (int64, uint64, UTF-8 strings), which pandas, polars, DuckDB and
// Spark read directly.
//
// A row has a column for every field of every event type (167 on a
// recording of every event group) and an event fills a tenth of them, so
// nulls are most of the cells. parquet-go's column writers take a Value
// per cell, null or not, and append a row index and a level for each:
// that was two thirds of an export's CPU time. This writer instead keeps,
// per column and row group, only the column's values already PLAIN-encoded
// and the rows they are in; at the end of the row group it makes each
// column's definition levels in one pass, encodes them with parquet-go's
// RLE encoder, and writes one data page per column chunk. parquet-go still
// provides the schema (the footer's schema elements and column orders are
// those of an empty file parquet-go writes for the same schema), the level
// and thrift encoders and the zstd codec, so the file is what parquet-go
// would write, less the optional page indexes and size statistics.
type parquetWriter struct {
	t      *Table
	out    *bufio.Writer
	off    int64 // bytes written so far
	meta   format.FileMetaData
	cols   []pqColumn   // by leaf
	leafOf []int        // table column -> leaf
	kinds  []ColumnKind // by table column
	rows   int          // rows in the row group
	staged int          // value bytes staged in the row group
	levels []byte       // a column's definition levels, one per row
	enc    rle.Encoding
	lvl    []byte // RLE-encoded levels
	comp   []byte // compressed values
	hdr    bytes.Buffer
	henc   *thrift.Encoder
}

// pqColumn is one column's row group so far: its non-null values PLAIN
// encoded (an integer in 8 bytes, a string as a 4-byte length and its
// bytes) and the rows they are in, ascending.
type pqColumn struct {
	kind ColumnKind
	path string
	data []byte
	at   []int32
}

const (
	// parquetRowGroup is the most rows in a row group: engines split work
	// by row group, and the writer holds one row group's values.
	parquetRowGroup = 32 << 10
	// parquetGroupBytes ends a row group early when its values take this
	// much (long hex fields): a column chunk is one page, and readers cap
	// a page's size.
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
	// The footer's schema, writer name and column orders are those of an
	// empty file parquet-go writes for the schema.
	var empty bytes.Buffer
	ew := parquet.NewGenericWriter[any](&empty, schema, parquet.Compression(parquetZstd))
	if err := ew.Close(); err != nil {
		return nil, fmt.Errorf("parquet schema: %w", err)
	}
	ef, err := parquet.OpenFile(bytes.NewReader(empty.Bytes()), int64(empty.Len()))
	if err != nil {
		return nil, fmt.Errorf("parquet schema: %w", err)
	}
	em := ef.Metadata()
	pw := &parquetWriter{
		t:      t,
		out:    bufio.NewWriterSize(out, 1<<20),
		leafOf: make([]int, len(t.Columns)),
		enc:    rle.Encoding{BitWidth: 1},
		meta: format.FileMetaData{
			Version:          em.Version,
			Schema:           em.Schema,
			KeyValueMetadata: em.KeyValueMetadata,
			CreatedBy:        em.CreatedBy,
			ColumnOrders:     em.ColumnOrders,
		},
	}
	pw.henc = thrift.NewEncoder(new(thrift.CompactProtocol).NewWriter(&pw.hdr))
	// A group's leaves are ordered by name: map each to its table column.
	leaves := schema.Columns()
	if len(leaves) != len(t.Columns) || len(em.Schema) != len(t.Columns)+1 {
		return nil, fmt.Errorf("parquet schema: %d leaves for %d columns", len(leaves), len(t.Columns))
	}
	pw.cols = make([]pqColumn, len(leaves))
	for li, path := range leaves {
		i, ok := t.index[path[0]]
		if !ok {
			return nil, fmt.Errorf("parquet schema: unknown column %q", path[0])
		}
		pw.leafOf[i] = li
		pw.cols[li] = pqColumn{kind: t.Columns[i].Kind, path: path[0]}
	}
	for _, c := range t.Columns {
		pw.kinds = append(pw.kinds, c.Kind)
	}
	if _, err := pw.write([]byte("PAR1")); err != nil {
		return nil, err
	}
	return pw, nil
}

func (p *parquetWriter) write(b []byte) (int, error) {
	n, err := p.out.Write(b)
	p.off += int64(n)
	if err != nil {
		return n, fmt.Errorf("write parquet: %w", err)
	}
	return n, nil
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
	if p.rows >= parquetRowGroup || p.staged >= parquetGroupBytes {
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
	c := &p.cols[p.leafOf[ti]]
	n := len(c.data)
	switch p.kinds[ti] {
	case KindInt:
		c.data = binary.LittleEndian.AppendUint64(c.data, uint64(v.Int))
	case KindUint:
		c.data = binary.LittleEndian.AppendUint64(c.data, v.Uint)
	default:
		c.data = binary.LittleEndian.AppendUint32(c.data, uint32(len(v.Str)))
		c.data = append(c.data, v.Str...)
	}
	p.staged += len(c.data) - n
	c.at = append(c.at, int32(p.rows))
}

// flush writes the row group: for each column, its definition levels (1
// on the rows it has a value in) RLE-encoded, then its values compressed,
// as one data page, and its chunk's statistics for the footer.
func (p *parquetWriter) flush() error {
	if p.rows == 0 {
		return nil
	}
	n := p.rows
	if cap(p.levels) < n {
		p.levels = make([]byte, n)
	}
	levels := p.levels[:n]
	rg := format.RowGroup{NumRows: int64(n), FileOffset: p.off, Ordinal: int16(min(len(p.meta.RowGroups), math.MaxInt16))}
	for li := range p.cols {
		c := &p.cols[li]
		clear(levels)
		for _, r := range c.at {
			levels[r] = 1
		}
		var err error
		if p.lvl, err = p.enc.EncodeLevels(p.lvl[:0], levels); err != nil {
			return fmt.Errorf("write parquet: definition levels of %s: %w", c.path, err)
		}
		if p.comp, err = parquetZstd.Encode(p.comp[:0], c.data); err != nil {
			return fmt.Errorf("write parquet: compress %s: %w", c.path, err)
		}
		stats := c.stats(n)
		page := format.PageHeader{
			Type:                 format.DataPageV2,
			UncompressedPageSize: int32(len(p.lvl) + len(c.data)),
			CompressedPageSize:   int32(len(p.lvl) + len(p.comp)),
			DataPageHeaderV2: thrift.New(format.DataPageHeaderV2{
				NumValues:                  int32(n),
				NumNulls:                   int32(n - len(c.at)),
				NumRows:                    int32(n),
				Encoding:                   format.Plain,
				DefinitionLevelsByteLength: int32(len(p.lvl)),
				IsCompressed:               thrift.New(true),
				Statistics:                 stats,
			}),
		}
		p.hdr.Reset()
		if err := p.henc.Encode(&page); err != nil {
			return fmt.Errorf("write parquet: page header of %s: %w", c.path, err)
		}
		start := p.off
		for _, b := range [][]byte{p.hdr.Bytes(), p.lvl, p.comp} {
			if _, err := p.write(b); err != nil {
				return err
			}
		}
		hlen := int64(p.hdr.Len())
		md := format.ColumnMetaData{
			Type:                  format.Int64,
			Encoding:              []format.Encoding{format.Plain, format.RLE},
			PathInSchema:          []string{c.path},
			Codec:                 format.Zstd,
			NumValues:             int64(n),
			TotalUncompressedSize: hlen + int64(page.UncompressedPageSize),
			TotalCompressedSize:   p.off - start,
			DataPageOffset:        start,
			Statistics:            stats,
			EncodingStats:         []format.PageEncodingStats{{PageType: format.DataPageV2, Encoding: format.Plain, Count: 1}},
		}
		if c.kind == KindString {
			md.Type = format.ByteArray
		}
		rg.Columns = append(rg.Columns, format.ColumnChunk{FileOffset: start, MetaData: md})
		rg.TotalByteSize += md.TotalUncompressedSize
		rg.TotalCompressedSize += md.TotalCompressedSize
		c.data, c.at = c.data[:0], c.at[:0]
	}
	p.meta.RowGroups = append(p.meta.RowGroups, rg)
	p.meta.NumRows += int64(n)
	p.rows, p.staged = 0, 0
	return nil
}

// stats is the column's statistics over a row group of n rows: its nulls,
// and its least and greatest values in the column's order (signed or
// unsigned integers, strings byte by byte), PLAIN-encoded without a length.
func (c *pqColumn) stats(n int) format.Statistics {
	s := format.Statistics{NullCount: int64(n - len(c.at))}
	if len(c.at) == 0 {
		return s
	}
	d := c.data
	switch c.kind {
	case KindInt:
		lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
		for i := 0; i+8 <= len(d); i += 8 {
			v := int64(binary.LittleEndian.Uint64(d[i:]))
			lo, hi = min(lo, v), max(hi, v)
		}
		s.MinValue = binary.LittleEndian.AppendUint64(nil, uint64(lo))
		s.MaxValue = binary.LittleEndian.AppendUint64(nil, uint64(hi))
	case KindUint:
		lo, hi := uint64(math.MaxUint64), uint64(0)
		for i := 0; i+8 <= len(d); i += 8 {
			v := binary.LittleEndian.Uint64(d[i:])
			lo, hi = min(lo, v), max(hi, v)
		}
		s.MinValue = binary.LittleEndian.AppendUint64(nil, lo)
		s.MaxValue = binary.LittleEndian.AppendUint64(nil, hi)
	default:
		var lo, hi []byte
		for i := 0; i+4 <= len(d); {
			l := int(binary.LittleEndian.Uint32(d[i:]))
			v := d[i+4 : i+4+l]
			if lo == nil || bytes.Compare(v, lo) < 0 {
				lo = v
			}
			if hi == nil || bytes.Compare(v, hi) > 0 {
				hi = v
			}
			i += 4 + l
		}
		s.MinValue = append([]byte{}, lo...)
		s.MaxValue = append([]byte{}, hi...)
	}
	return s
}

func (p *parquetWriter) Close() error {
	if err := p.flush(); err != nil {
		return err
	}
	footer, err := thrift.Marshal(new(thrift.CompactProtocol), &p.meta)
	if err != nil {
		return fmt.Errorf("write parquet: footer: %w", err)
	}
	footer = binary.LittleEndian.AppendUint32(footer, uint32(len(footer)))
	footer = append(footer, "PAR1"...)
	if _, err := p.write(footer); err != nil {
		return err
	}
	if err := p.out.Flush(); err != nil {
		return fmt.Errorf("write parquet: %w", err)
	}
	return nil
}
