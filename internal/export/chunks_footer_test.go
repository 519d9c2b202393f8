// SPDX-License-Identifier: Apache-2.0

package export

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"testing"

	"github.com/parquet-go/parquet-go"
)

// footerTestSchema is a table as wide as a recording of every event group
// makes (167 optional columns), with one int64 column always set.
func footerTestSchema() *parquet.Schema {
	group := parquet.Group{}
	for i := range 167 {
		group[fmt.Sprintf("c%03d", i)] = parquet.Optional(parquet.Int(64))
	}
	return parquet.NewSchema("t", group)
}

// liveHeap is the heap's live bytes after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// The writer keeps what the footer needs of each row group already
// encoded: the memory it holds grows by the footer's own size per row
// group (about 180 bytes per column chunk), not by the ~1 KB each column
// chunk's metadata took as a struct, which made an export of 8.8 M events
// hold 48 MB more than one of 1.1 M.
func TestChunkWriterFooterMemory(t *testing.T) {
	cw, err := newChunkWriter(io.Discard, footerTestSchema(), 16, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	groups := func(n int) {
		for range n * 16 {
			cw.putInt64(0, 1)
			if err := cw.endRow(); err != nil {
				t.Fatal(err)
			}
		}
	}
	groups(50)
	before := liveHeap()
	const more = 400
	groups(more)
	after := liveHeap()
	perChunk := (float64(after) - float64(before)) / (more * 167)
	t.Logf("%.0f bytes held per column chunk", perChunk)
	if perChunk > 400 {
		t.Errorf("%.0f bytes held per column chunk written, want at most 400 (its encoded metadata)", perChunk)
	}
	runtime.KeepAlive(cw)
}

// The footer assembled from row groups encoded one by one is the footer
// parquet-go's thrift encoder writes for the same metadata, for fewer
// than 15 row groups (a one-byte list header) and for more.
func TestChunkWriterFooterSameAsEncoder(t *testing.T) {
	for _, rows := range []int{3 * 16, 40 * 16} {
		var out bytes.Buffer
		cw, err := newChunkWriter(&out, footerTestSchema(), 16, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		for i := range rows {
			cw.putInt64(i%167, int64(i))
			if err := cw.endRow(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cw.close(); err != nil {
			t.Fatal(err)
		}
		f, err := parquet.OpenFile(bytes.NewReader(out.Bytes()), int64(out.Len()))
		if err != nil {
			t.Fatalf("%d rows: %v", rows, err)
		}
		md := f.Metadata()
		if md.NumRows != int64(rows) || len(md.RowGroups) != rows/16 {
			t.Fatalf("%d rows: the footer says %d rows in %d row groups", rows, md.NumRows, len(md.RowGroups))
		}
		for i, rg := range md.RowGroups {
			if rg.Ordinal != int16(i) || rg.NumRows != 16 || len(rg.Columns) != 167 {
				t.Fatalf("row group %d: ordinal %d, %d rows, %d columns", i, rg.Ordinal, rg.NumRows, len(rg.Columns))
			}
		}
		// Values read back: column c holds row r's value where r%167 == c.
		var sum int64
		for _, rg := range f.RowGroups() {
			for _, cc := range rg.ColumnChunks() {
				pages := cc.Pages()
				for {
					p, err := pages.ReadPage()
					if err != nil {
						break
					}
					vals := make([]parquet.Value, p.NumValues())
					n, _ := p.Values().ReadValues(vals)
					for _, v := range vals[:n] {
						if !v.IsNull() {
							sum += v.Int64()
						}
					}
				}
				pages.Close()
			}
		}
		if want := int64(rows * (rows - 1) / 2); sum != want {
			t.Errorf("%d rows: values sum to %d, want %d", rows, sum, want)
		}
	}
}
