// SPDX-License-Identifier: Apache-2.0

package export

import (
	"bytes"
	"encoding/csv"
	"strconv"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/trace"
)

func tableHeaders() []*trace.Header {
	return []*trace.Header{{Types: []trace.EventType{
		{ID: 1, Name: "a", Size: 40, Fields: []trace.Field{{Name: "x", Offset: 32, Size: 4, Kind: "u"}, {Name: "state", Offset: 36, Size: 1, Kind: "enum:tcp_state"}}},
		{ID: 2, Name: "b", Size: 40, Fields: []trace.Field{{Name: "x", Offset: 32, Size: 4, Kind: "i"}, {Name: "addr", Offset: 16, Size: 16, Kind: "ip"}}},
	}}}
}

func TestNewTableColumns(t *testing.T) {
	tb := NewTable(tableHeaders())
	var names []string
	for _, c := range tb.Columns {
		names = append(names, c.Name)
	}
	got := strings.Join(names, ",")
	want := "trace,host,time_ns,cpu,pid,tid,comm,netns,conn,event,size,x,state,b_x,addr,tcpflags"
	if got != want {
		t.Fatalf("columns\n got %s\nwant %s", got, want)
	}
	if tb.Columns[tb.index["b_x"]].Kind != KindInt || tb.Columns[tb.index["x"]].Kind != KindUint || tb.Columns[tb.index["state"]].Kind != KindString {
		t.Fatalf("kinds wrong: %+v", tb.Columns)
	}
}

func TestRowWriters(t *testing.T) {
	tb := &Table{Columns: []Column{{"n", KindInt}, {"u", KindUint}, {"s", KindString}}, index: map[string]int{"n": 0, "u": 1, "s": 2}}
	row := []Value{{Int: -5}, {Null: true}, {Str: "a,\"b\"\tc\n"}}
	cases := map[string]string{
		"csv":   "n,u,s\n-5,,\"a,\"\"b\"\"\tc\n\"\n",
		"tsv":   "n\tu\ts\n-5\t\t\"a,\"\"b\"\"\tc\n\"\n",
		"jsonl": "{\"n\":-5,\"s\":\"a,\\\"b\\\"\\tc\\n\"}\n",
	}
	for format, want := range cases {
		var b bytes.Buffer
		w, err := NewRowWriter(format, tb, &b)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.WriteRow(row); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if b.String() != want {
			t.Errorf("%s:\n got %q\nwant %q", format, b.String(), want)
		}
	}
	if _, err := NewRowWriter("xml", tb, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), `unknown format "xml"`) {
		t.Errorf("xml format: %v", err)
	}
	if err := CheckFormat(""); err == nil || !strings.Contains(err.Error(), "--format is required") {
		t.Errorf("no format: %v", err)
	}
}

// TestDelimitedLikeEncodingCSV: the CSV and TSV writers quote exactly as
// encoding/csv does, so any CSV reader reads the cells back.
func TestDelimitedLikeEncodingCSV(t *testing.T) {
	tb := ConnTable()
	cells := []string{"", "plain", "a,b", "a\tb", `say "hi"`, " lead", "\ttab", "two\nlines", "cr\rhere", `\.`, "ünï"}
	for _, format := range []string{"csv", "tsv"} {
		var got, want bytes.Buffer
		w, err := NewRowWriter(format, tb, &got)
		if err != nil {
			t.Fatal(err)
		}
		cw := csv.NewWriter(&want)
		if format == "tsv" {
			cw.Comma = '\t'
		}
		names := make([]string, len(tb.Columns))
		for i, c := range tb.Columns {
			names[i] = c.Name
		}
		cw.Write(names)
		for _, s := range cells {
			row := make([]Value, len(tb.Columns))
			rec := make([]string, len(tb.Columns))
			for i, c := range tb.Columns {
				switch c.Kind {
				case KindString:
					row[i], rec[i] = Value{Str: s}, s
				case KindInt:
					row[i], rec[i] = Value{Int: -42}, "-42"
				default:
					row[i] = Value{Null: true}
				}
			}
			if err := w.WriteRow(row); err != nil {
				t.Fatal(err)
			}
			cw.Write(rec)
		}
		w.Close()
		cw.Flush()
		if got.String() != want.String() {
			t.Errorf("%s differs from encoding/csv:\n%q\nwant\n%q", format, got.String(), want.String())
		}
	}
}

func TestAppendUint(t *testing.T) {
	for _, v := range []uint64{0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 12345, 4026531840, 1<<63 + 12345, ^uint64(0)} {
		if got, want := string(appendUint([]byte("x"), v)), "x"+strconv.FormatUint(v, 10); got != want {
			t.Errorf("appendUint(%d) = %q, want %q", v, got, want)
		}
	}
	for _, v := range []int64{0, -1, -10, -99, 123456789, -9223372036854775808, 9223372036854775807} {
		if got, want := string(appendInt(nil, v)), strconv.FormatInt(v, 10); got != want {
			t.Errorf("appendInt(%d) = %q, want %q", v, got, want)
		}
	}
}
