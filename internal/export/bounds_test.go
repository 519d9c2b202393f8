// SPDX-License-Identifier: Apache-2.0

package export

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// Traces whose dictionaries add up to more columns than Parquet takes are
// refused with an error, not a panic.
func TestParquetTooManyColumns(t *testing.T) {
	var hs []*trace.Header
	for h := range 17 {
		et := trace.EventType{ID: 1, Name: "e", Size: 8 + 4096}
		for i := range trace.MaxFields {
			et.Fields = append(et.Fields, trace.Field{Name: fmt.Sprintf("f%d_%d", h, i), Offset: 32 + i, Size: 1, Kind: trace.KindUint})
		}
		hs = append(hs, &trace.Header{Types: []trace.EventType{et}})
	}
	tb := NewTable(hs)
	if len(tb.Columns) <= maxParquetColumns {
		t.Fatalf("only %d columns", len(tb.Columns))
	}
	_, err := NewRowWriter("parquet", tb, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "more than the 65534 columns Parquet takes") {
		t.Fatalf("err %v", err)
	}
	// At the limit it works.
	tb.Columns = tb.Columns[:maxParquetColumns]
	w, err := NewRowWriter("parquet", tb, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
}
