// SPDX-License-Identifier: Apache-2.0

package export

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/klauspost/compress/zstd"
	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/encoding/rle"
	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"
)

// chunkWriter writes a Parquet file column chunk by column chunk, for a
// flat schema of int32, int64 (signed, unsigned or timestamps) and byte
// array leaves, each required or optional.
//
// parquet-go's column writers take a Value per cell, null or not, and
// append a row index and a level for each: most of an export's CPU time
// when most cells are null. This writer instead keeps, per column and row
// group, only the column's values already PLAIN-encoded and the rows they
// are in; at the end of the row group it makes an optional column's
// definition levels in one pass, encodes them with parquet-go's RLE
// encoder, and writes one data page per column chunk. parquet-go still
// provides the schema (the footer's schema elements and column orders are
// those of an empty file parquet-go writes for the same schema), the level
// and thrift encoders and the zstd codec, so the file is what parquet-go
// would write, less the optional page indexes and size statistics, and
// with strings PLAIN where parquet-go may use a dictionary: zstd takes
// the repeats out as well.
type chunkWriter struct {
	// zenc compresses the pages: zstd at its fastest level, as
	// parquetZstd, but this writer's own for its lifetime and with a
	// window of zstdWindow. parquetZstd's pooled encoders, with the
	// default 8 MiB window, each took a 16 MiB history, made again
	// after a garbage collection emptied the pool: 16 of the 28 MB an
	// export held.
	zenc *zstd.Encoder
	out  *bufio.Writer
	off  int64               // bytes written so far
	meta format.FileMetaData // RowGroups stays empty: see groups
	// groups holds the footer's row groups thrift-encoded, as the footer
	// will hold them: as structs, each column chunk's metadata took about
	// 1 KB, so that an export's memory grew with the trace's length (97 MB
	// at 8.8 M events against 47 MB at 1.1 M); encoded, about 180 bytes,
	// which the footer itself holds.
	groups   [][]byte   // each its exact size: a growing slice's spare half would count twice at the garbage collector's target
	cols     []chunkCol // by leaf, in schema order
	byName   map[string]int
	maxRows  int
	maxBytes int
	rows     int    // rows in the row group
	full     bool   // a column's values reached maxBytes
	err      error  // of a page made while staging
	levels   []byte // a column's definition levels, one per row
	enc      rle.Encoding
	lvl      []byte // RLE-encoded levels
	comp     []byte // compressed values
	hdr      bytes.Buffer
	henc     *thrift.Encoder
}

// chunkCol is one column's row group so far: the pages it made, and its
// values since the last page PLAIN-encoded (an integer in 4 or 8 bytes, a
// byte array as a 4-byte length and its bytes) with, for an optional
// column, the rows they are in, ascending. A required column has a value
// in every row.
type chunkCol struct {
	path     string
	typ      format.Type // Int32, Int64 or ByteArray
	unsigned bool        // an integer's order
	required bool
	data     []byte
	n        int // values since the last page
	at       []int32
	first    int32 // the first row since the last page

	pages  []byte // the chunk's pages: header, levels, compressed values
	npages int
	size   int64 // the pages' size uncompressed
	values int   // values in the chunk
	raw    int   // value bytes in the chunk
	has    bool  // lo and hi are set
	lo, hi []byte
}

// chunkPage is how many bytes of values make a page: the values are
// staged uncompressed only until then (growing one buffer per column to a
// row group's values was a sixth of a dataset's CPU time), and a page
// this size compresses about as well as a whole chunk. A variable for
// the tests, which make pages small.
var chunkPage = 1 << 20

// newChunkWriter starts a file of schema, whose leaves must be top-level
// int32, int64 or byte array columns, with row groups of at most maxRows
// rows, ended early once a column's values take maxBytes: a column chunk
// is one page, and readers cap a page's size.
func newChunkWriter(out io.Writer, schema *parquet.Schema, maxRows, maxBytes int) (*chunkWriter, error) {
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
	zenc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithZeroFrames(true),
		zstd.WithEncoderCRC(false), zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(zstdWindow))
	if err != nil {
		return nil, fmt.Errorf("parquet: zstd: %w", err)
	}
	cw := &chunkWriter{
		zenc:     zenc,
		out:      bufio.NewWriterSize(out, 1<<20),
		maxRows:  maxRows,
		maxBytes: maxBytes,
		enc:      rle.Encoding{BitWidth: 1},
		byName:   map[string]int{},
		meta: format.FileMetaData{
			Version:          em.Version,
			Schema:           em.Schema,
			KeyValueMetadata: em.KeyValueMetadata,
			CreatedBy:        em.CreatedBy,
			ColumnOrders:     em.ColumnOrders,
		},
	}
	cw.henc = thrift.NewEncoder(new(thrift.CompactProtocol).NewWriter(&cw.hdr))
	for _, path := range schema.Columns() {
		leaf, _ := schema.Lookup(path...)
		if len(path) != 1 || leaf.MaxRepetitionLevel != 0 || leaf.MaxDefinitionLevel > 1 {
			return nil, fmt.Errorf("parquet schema: column %v is not a flat one", path)
		}
		c := chunkCol{path: path[0], required: leaf.MaxDefinitionLevel == 0}
		typ := leaf.Node.Type()
		switch typ.Kind() {
		case parquet.Int32:
			c.typ = format.Int32
		case parquet.Int64:
			c.typ = format.Int64
		case parquet.ByteArray:
			c.typ = format.ByteArray
		default:
			return nil, fmt.Errorf("parquet schema: column %s of type %v", path[0], typ)
		}
		if lt := typ.LogicalType(); lt != nil {
			if it, ok := lt.Value.(*format.IntType); ok && !it.IsSigned {
				c.unsigned = true
			}
		}
		cw.byName[c.path] = len(cw.cols)
		cw.cols = append(cw.cols, c)
	}
	if _, err := cw.write([]byte("PAR1")); err != nil {
		return nil, err
	}
	return cw, nil
}

// leaf is the index of the column named name, or -1.
func (cw *chunkWriter) leaf(name string) int {
	if li, ok := cw.byName[name]; ok {
		return li
	}
	return -1
}

func (cw *chunkWriter) write(b []byte) (int, error) {
	n, err := cw.out.Write(b)
	cw.off += int64(n)
	if err != nil {
		return n, fmt.Errorf("write parquet: %w", err)
	}
	return n, nil
}

// putInt64 gives the current row's value of int64 leaf li. A leaf gets at
// most one value per row; an optional leaf given none is null.
func (cw *chunkWriter) putInt64(li int, v int64) {
	c := &cw.cols[li]
	c.data = binary.LittleEndian.AppendUint64(c.data, uint64(v))
	c.n++
	if !c.required {
		c.at = append(c.at, int32(cw.rows))
	}
	if len(c.data) >= chunkPage {
		cw.page(c, cw.rows+1)
	}
}

// putInt32 gives the current row's value of int32 leaf li.
func (cw *chunkWriter) putInt32(li int, v int32) {
	c := &cw.cols[li]
	c.data = binary.LittleEndian.AppendUint32(c.data, uint32(v))
	c.n++
	if !c.required {
		c.at = append(c.at, int32(cw.rows))
	}
	if len(c.data) >= chunkPage {
		cw.page(c, cw.rows+1)
	}
}

// putString gives the current row's value of byte array leaf li.
func (cw *chunkWriter) putString(li int, s string) {
	c := &cw.cols[li]
	c.data = binary.LittleEndian.AppendUint32(c.data, uint32(len(s)))
	c.data = append(c.data, s...)
	c.n++
	if !c.required {
		c.at = append(c.at, int32(cw.rows))
	}
	if len(c.data) >= chunkPage {
		cw.page(c, cw.rows+1)
	}
}

// endRow closes the current row: every required leaf must have a value.
func (cw *chunkWriter) endRow() error {
	if cw.err != nil {
		return cw.err
	}
	cw.rows++
	if cw.rows >= cw.maxRows || cw.full {
		return cw.flush()
	}
	return nil
}

// page makes a page of column c's values staged since its last page:
// the rows from c.first up to end, its definition levels (1 on the rows
// it has a value in) RLE-encoded if it is optional, then its values
// compressed. The column's chunk takes the page's statistics.
func (cw *chunkWriter) page(c *chunkCol, end int) {
	if cw.err != nil {
		return
	}
	rows := end - int(c.first)
	cw.lvl = cw.lvl[:0]
	if !c.required {
		if cap(cw.levels) < rows {
			cw.levels = make([]byte, rows)
		}
		levels := cw.levels[:rows]
		clear(levels)
		for _, r := range c.at {
			levels[r-c.first] = 1
		}
		var err error
		if cw.lvl, err = cw.enc.EncodeLevels(cw.lvl, levels); err != nil {
			cw.err = fmt.Errorf("write parquet: definition levels of %s: %w", c.path, err)
			return
		}
	}
	cw.comp = cw.zenc.EncodeAll(c.data, cw.comp[:0])
	stats := c.stats(rows)
	page := format.PageHeader{
		Type:                 format.DataPageV2,
		UncompressedPageSize: int32(len(cw.lvl) + len(c.data)),
		CompressedPageSize:   int32(len(cw.lvl) + len(cw.comp)),
		DataPageHeaderV2: thrift.New(format.DataPageHeaderV2{
			NumValues:                  int32(rows),
			NumNulls:                   int32(rows - c.n),
			NumRows:                    int32(rows),
			Encoding:                   format.Plain,
			DefinitionLevelsByteLength: int32(len(cw.lvl)),
			IsCompressed:               thrift.New(true),
			Statistics:                 stats,
		}),
	}
	cw.hdr.Reset()
	if err := cw.henc.Encode(&page); err != nil {
		cw.err = fmt.Errorf("write parquet: page header of %s: %w", c.path, err)
		return
	}
	c.size += int64(cw.hdr.Len()) + int64(page.UncompressedPageSize)
	c.pages = append(c.pages, cw.hdr.Bytes()...)
	c.pages = append(c.pages, cw.lvl...)
	c.pages = append(c.pages, cw.comp...)
	c.npages++
	c.values += c.n
	c.raw += len(c.data)
	if c.n > 0 {
		if !c.has || c.compare(stats.MinValue, c.lo) < 0 {
			c.lo = stats.MinValue
		}
		if !c.has || c.compare(stats.MaxValue, c.hi) > 0 {
			c.hi = stats.MaxValue
		}
		c.has = true
	}
	cw.full = cw.full || c.raw >= cw.maxBytes
	c.data, c.at, c.n, c.first = c.data[:0], c.at[:0], 0, int32(end)
}

// compare orders two PLAIN-encoded values (without a length) of c.
func (c *chunkCol) compare(a, b []byte) int {
	switch {
	case c.typ == format.Int32 && c.unsigned:
		return cmp.Compare(binary.LittleEndian.Uint32(a), binary.LittleEndian.Uint32(b))
	case c.typ == format.Int32:
		return cmp.Compare(int32(binary.LittleEndian.Uint32(a)), int32(binary.LittleEndian.Uint32(b)))
	case c.typ == format.Int64 && c.unsigned:
		return cmp.Compare(binary.LittleEndian.Uint64(a), binary.LittleEndian.Uint64(b))
	case c.typ == format.Int64:
		return cmp.Compare(int64(binary.LittleEndian.Uint64(a)), int64(binary.LittleEndian.Uint64(b)))
	}
	return bytes.Compare(a, b)
}

// flush writes the row group: for each column, its pages, and its
// chunk's statistics for the footer.
func (cw *chunkWriter) flush() error {
	if cw.err != nil {
		return cw.err
	}
	if cw.rows == 0 {
		return nil
	}
	n := cw.rows
	rg := format.RowGroup{NumRows: int64(n), FileOffset: cw.off, Ordinal: int16(min(len(cw.groups), math.MaxInt16))}
	for li := range cw.cols {
		c := &cw.cols[li]
		if int(c.first) < n || c.npages == 0 {
			cw.page(c, n)
		}
		if cw.err != nil {
			return cw.err
		}
		if c.required && c.values != n {
			return fmt.Errorf("write parquet: required column %s has %d values in %d rows", c.path, c.values, n)
		}
		stats := format.Statistics{NullCount: int64(n - c.values)}
		if c.has {
			stats.MinValue, stats.MaxValue = c.lo, c.hi
		}
		start := cw.off
		if _, err := cw.write(c.pages); err != nil {
			return err
		}
		md := format.ColumnMetaData{
			Type:                  c.typ,
			Encoding:              []format.Encoding{format.Plain, format.RLE},
			PathInSchema:          []string{c.path},
			Codec:                 format.Zstd,
			NumValues:             int64(n),
			TotalUncompressedSize: c.size,
			TotalCompressedSize:   cw.off - start,
			DataPageOffset:        start,
			Statistics:            stats,
			EncodingStats:         []format.PageEncodingStats{{PageType: format.DataPageV2, Encoding: format.Plain, Count: int32(c.npages)}},
		}
		rg.Columns = append(rg.Columns, format.ColumnChunk{FileOffset: start, MetaData: md})
		rg.TotalByteSize += md.TotalUncompressedSize
		rg.TotalCompressedSize += md.TotalCompressedSize
		c.pages, c.npages, c.size, c.values, c.raw, c.has, c.lo, c.hi, c.first = c.pages[:0], 0, 0, 0, 0, false, nil, nil, 0
	}
	b, err := thrift.Marshal(new(thrift.CompactProtocol), &rg)
	if err != nil {
		return fmt.Errorf("write parquet: row group metadata: %w", err)
	}
	cw.groups = append(cw.groups, b)
	cw.meta.NumRows += int64(n)
	cw.rows, cw.full = 0, false
	return nil
}

// stats is the column's statistics over a row group of n rows: its nulls,
// and its least and greatest values in the column's order (signed or
// unsigned integers, byte arrays byte by byte), PLAIN-encoded without a
// length.
func (c *chunkCol) stats(n int) format.Statistics {
	s := format.Statistics{NullCount: int64(n - c.n)}
	if c.n == 0 {
		return s
	}
	d := c.data
	switch {
	case c.typ == format.Int32 && c.unsigned:
		lo, hi := uint32(math.MaxUint32), uint32(0)
		for i := 0; i+4 <= len(d); i += 4 {
			v := binary.LittleEndian.Uint32(d[i:])
			lo, hi = min(lo, v), max(hi, v)
		}
		s.MinValue = binary.LittleEndian.AppendUint32(nil, lo)
		s.MaxValue = binary.LittleEndian.AppendUint32(nil, hi)
	case c.typ == format.Int32:
		lo, hi := int32(math.MaxInt32), int32(math.MinInt32)
		for i := 0; i+4 <= len(d); i += 4 {
			v := int32(binary.LittleEndian.Uint32(d[i:]))
			lo, hi = min(lo, v), max(hi, v)
		}
		s.MinValue = binary.LittleEndian.AppendUint32(nil, uint32(lo))
		s.MaxValue = binary.LittleEndian.AppendUint32(nil, uint32(hi))
	case c.typ == format.Int64 && c.unsigned:
		lo, hi := uint64(math.MaxUint64), uint64(0)
		for i := 0; i+8 <= len(d); i += 8 {
			v := binary.LittleEndian.Uint64(d[i:])
			lo, hi = min(lo, v), max(hi, v)
		}
		s.MinValue = binary.LittleEndian.AppendUint64(nil, lo)
		s.MaxValue = binary.LittleEndian.AppendUint64(nil, hi)
	case c.typ == format.Int64:
		lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
		for i := 0; i+8 <= len(d); i += 8 {
			v := int64(binary.LittleEndian.Uint64(d[i:]))
			lo, hi = min(lo, v), max(hi, v)
		}
		s.MinValue = binary.LittleEndian.AppendUint64(nil, uint64(lo))
		s.MaxValue = binary.LittleEndian.AppendUint64(nil, uint64(hi))
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

func (cw *chunkWriter) close() error {
	if err := cw.flush(); err != nil {
		return err
	}
	parts, err := cw.footer()
	if err != nil {
		return fmt.Errorf("write parquet: footer: %w", err)
	}
	n := 0
	for _, b := range parts {
		if _, err := cw.write(b); err != nil {
			return err
		}
		n += len(b)
	}
	if _, err := cw.write(binary.LittleEndian.AppendUint32(nil, uint32(n))); err != nil {
		return err
	}
	if _, err := cw.write([]byte("PAR1")); err != nil {
		return err
	}
	if err := cw.out.Flush(); err != nil {
		return fmt.Errorf("write parquet: %w", err)
	}
	return nil
}

// zstdWindow is the window of the pages' compression: a page is one
// column's values in a row group (32 K rows: 256 KiB of 8-byte integers),
// so a larger window finds nothing more in most.
const zstdWindow = 1 << 20

// footer encodes the file's metadata, in parts to be written one after
// the other, with the row groups encoded at each flush. In thrift's compact protocol a list is a header (its length and
// element type) followed by its elements, each encoded as on its own, so
// the footer is the metadata encoded with no row group, its empty list's
// header replaced by a header for ngroups structs followed by the groups.
// Where that header is, and that a list is laid out so, is checked against
// the encoder's own output for a one-group list.
func (cw *chunkWriter) footer() ([][]byte, error) {
	p := new(thrift.CompactProtocol)
	meta := cw.meta
	meta.RowGroups = []format.RowGroup{}
	empty, err := thrift.Marshal(p, &meta)
	if err != nil {
		return nil, err
	}
	probe := format.RowGroup{NumRows: 1}
	meta.RowGroups = []format.RowGroup{probe}
	one, err := thrift.Marshal(p, &meta)
	if err != nil {
		return nil, err
	}
	one1, err := thrift.Marshal(p, &probe)
	if err != nil {
		return nil, err
	}
	// The first byte where they differ is the list header: 0x0C for no
	// struct (type 12), 0x1C for one.
	at := 0
	for at < len(empty) && at < len(one) && empty[at] == one[at] {
		at++
	}
	if at == len(empty) || empty[at] != 0x0C || one[at] != 0x1C ||
		!bytes.Equal(one, slices.Concat(empty[:at], []byte{0x1C}, one1, empty[at+1:])) {
		return nil, errors.New("the thrift encoder lays out the row groups in a way this writer does not know")
	}
	var hdr []byte
	if n := len(cw.groups); n < 15 {
		hdr = []byte{byte(n<<4) | 0x0C}
	} else {
		hdr = binary.AppendUvarint([]byte{0xFC}, uint64(n))
	}
	return slices.Concat([][]byte{empty[:at], hdr}, cw.groups, [][]byte{empty[at+1:]}), nil
}
