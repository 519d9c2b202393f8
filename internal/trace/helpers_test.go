// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"testing"
)

// magnetTypes returns a dictionary that mimics magnet's own events, so that
// tests and the fixture look like real traces.
func magnetTypes() []EventType {
	return []EventType{
		{ID: 1, Name: "sock_send", Group: "sock", Size: 32},
		{ID: 4, Name: "tcp_xmit", Group: "tcp", Size: 40, Fields: []Field{
			{Name: "seq", Offset: 32, Size: 4, Kind: KindUint},
			{Name: "gso_segs", Offset: 36, Size: 2, Kind: KindUint},
			{Name: "retrans", Offset: 38, Size: 1, Kind: KindUint},
		}},
		{ID: 14, Name: "conn_open", Group: "conn", Size: 72, Fields: []Field{
			{Name: "proto", Offset: 32, Size: 1, Kind: KindUint},
			{Name: "family", Offset: 33, Size: 1, Kind: KindUint},
			{Name: "state", Offset: 34, Size: 1, Kind: "enum:tcp_state"},
			{Name: "lport", Offset: 36, Size: 2, Kind: KindUint},
			{Name: "rport", Offset: 38, Size: 2, Kind: KindUint},
			{Name: "laddr", Offset: 40, Size: 16, Kind: KindIP},
			{Name: "raddr", Offset: 56, Size: 16, Kind: KindIP},
		}},
		{ID: 22, Name: "task", Group: "task", Size: 56, Fields: []Field{
			{Name: "pid", Offset: 32, Size: 4, Kind: KindUint},
			{Name: "comm", Offset: 40, Size: 16, Kind: KindStr},
		}},
	}
}

// kindsType is a made-up event type with a field of every kind.
func kindsType() EventType {
	return EventType{ID: 200, Name: "every_kind", Group: "test", Size: 96, Fields: []Field{
		{Name: "u8", Offset: 32, Size: 1, Kind: KindUint},
		{Name: "i8", Offset: 33, Size: 1, Kind: KindInt},
		{Name: "i16", Offset: 34, Size: 2, Kind: KindInt},
		{Name: "i32", Offset: 36, Size: 4, Kind: KindInt},
		{Name: "u64", Offset: 40, Size: 8, Kind: KindUint},
		{Name: "i64", Offset: 48, Size: 8, Kind: KindInt},
		{Name: "reason", Offset: 56, Size: 4, Kind: "enum:drop_reason"},
		{Name: "raw", Offset: 60, Size: 4, Kind: KindBytes},
		{Name: "label", Offset: 64, Size: 12, Kind: KindStr},
		{Name: "u16", Offset: 76, Size: 2, Kind: KindUint},
		{Name: "addr", Offset: 80, Size: 16, Kind: KindIP},
	}}
}

func testHeader(types []EventType) *Header {
	return &Header{
		Clock:       Clock{Source: "CLOCK_MONOTONIC", ResolutionNs: 1, WallOffsetNs: 1_699_999_000_000_000_000, Kernel: "tsc"},
		Host:        "testhost",
		Kernel:      "6.8.0-test",
		Arch:        "amd64",
		CPUs:        8,
		CPUModel:    "Test CPU",
		StartWallNs: 1_700_000_000_000_000_000,
		Settings:    Settings{Events: []string{"all"}, BufferBytes: 1 << 20},
		Types:       types,
		Enums: map[string]map[string]string{
			"tcp_state":   {"1": "ESTABLISHED", "2": "SYN_SENT"},
			"drop_reason": {"2": "NOT_SPECIFIED", "5": "TCP_CSUM"},
		},
		Extra: map[string]any{"note": "test"},
	}
}

// rec is a record to encode: its type name and field values. Integers are
// given as int (or uint64 above the int range), text as string, addresses
// as netip.Addr (an IPv4 address goes into the first 4 bytes) and raw bytes
// as []byte.
type rec struct {
	typ  string
	vals map[string]any
}

// encode builds r as a native-order record of the dictionary in h.
func encode(tb testing.TB, h *Header, r rec) []byte {
	tb.Helper()
	t := h.TypeByName(r.typ)
	if t == nil {
		tb.Fatalf("no event type %q", r.typ)
	}
	data := make([]byte, t.Size)
	data[offType] = t.ID
	for name, v := range r.vals {
		f, ok := t.Field(name)
		if !ok {
			tb.Fatalf("event type %s has no field %q", t.Name, name)
		}
		b := data[f.Offset : f.Offset+f.Size]
		switch x := v.(type) {
		case int:
			putUint(b, uint64(x))
		case uint64:
			putUint(b, x)
		case string:
			if len(x) > len(b) {
				tb.Fatalf("field %s: %q is too long", name, x)
			}
			copy(b, x)
		case netip.Addr:
			if x.Is4() {
				a := x.As4()
				copy(b, a[:])
			} else {
				a := x.As16()
				copy(b, a[:])
			}
		case []byte:
			copy(b, x)
		default:
			tb.Fatalf("field %s: cannot encode %T", name, v)
		}
	}
	return data
}

func putUint(b []byte, v uint64) {
	switch len(b) {
	case 1:
		b[0] = byte(v)
	case 2:
		binary.NativeEndian.PutUint16(b, uint16(v))
	case 4:
		binary.NativeEndian.PutUint32(b, uint32(v))
	case 8:
		binary.NativeEndian.PutUint64(b, v)
	default:
		panic(fmt.Sprintf("integer of %d bytes", len(b)))
	}
}

// writeTrace writes the records to a trace in memory and returns the file.
// When end is false the writer is flushed but not closed, as if the
// recorder had been killed.
func writeTrace(tb testing.TB, h *Header, opts WriterOptions, recs [][]byte, end bool) []byte {
	tb.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h, opts)
	if err != nil {
		tb.Fatal(err)
	}
	for _, r := range recs {
		if err := w.Write(r); err != nil {
			tb.Fatal(err)
		}
	}
	if end {
		err = w.Close(&Summary{EndWallNs: h.StartWallNs + 5e9, Lost: 7})
	} else {
		err = w.Flush()
	}
	if err != nil {
		tb.Fatal(err)
	}
	if w.Bytes() != int64(buf.Len()) {
		tb.Fatalf("Bytes() = %d, wrote %d", w.Bytes(), buf.Len())
	}
	return buf.Bytes()
}

// readAll reads every record of file and returns copies of their data, the
// error that ended reading (nil at a clean io.EOF) and the reader.
func readAll(tb testing.TB, file []byte) ([][]byte, *Reader, error) {
	tb.Helper()
	r, err := NewReader(bytes.NewReader(file))
	if err != nil {
		return nil, nil, err
	}
	var out [][]byte
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return out, r, nil
		}
		if err != nil {
			return out, r, err
		}
		out = append(out, bytes.Clone(rec.Data))
	}
}

// sampleRecords returns a varied sequence of records of magnetTypes.
func sampleRecords(tb testing.TB, h *Header, n int) [][]byte {
	tb.Helper()
	var out [][]byte
	for i := range n {
		common := map[string]any{"time_ns": 1000 + 10*i, "conn": 0xabc0 + i%3, "tid": 4242, "netns": 4026531840, "cpu": i % 4, "flags": i % 2}
		var r rec
		switch i % 4 {
		case 0:
			r = rec{"sock_send", map[string]any{"size": 100 + i}}
		case 1:
			r = rec{"tcp_xmit", map[string]any{"size": 1448, "seq": 0xdeadbeef + i, "gso_segs": 2, "retrans": i % 3}}
		case 2:
			r = rec{"conn_open", map[string]any{"proto": 6, "family": 2, "state": 1, "lport": 40000 + i, "rport": 443,
				"laddr": netip.MustParseAddr("10.0.0.1"), "raddr": netip.MustParseAddr("10.0.0.2")}}
		case 3:
			r = rec{"task", map[string]any{"pid": 1000 + i, "comm": "curl"}}
		}
		for k, v := range common {
			r.vals[k] = v
		}
		out = append(out, encode(tb, h, r))
	}
	return out
}
