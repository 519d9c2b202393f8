// SPDX-License-Identifier: Apache-2.0

package export

import (
	"bytes"
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
}
