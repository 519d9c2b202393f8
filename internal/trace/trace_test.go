// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func foreignOrder() binary.ByteOrder {
	if nativeIsBig {
		return binary.LittleEndian
	}
	return binary.BigEndian
}

func TestRoundTripEveryKind(t *testing.T) {
	for _, order := range []binary.ByteOrder{nil, foreignOrder()} {
		t.Run(fmt.Sprint(order), func(t *testing.T) {
			h := testHeader(append(magnetTypes(), kindsType()))
			want := []rec{
				{"every_kind", map[string]any{
					"time_ns": 123456789012345, "conn": 0x1122334455667788, "tid": 77, "size": -5, "netns": 4026531993, "cpu": 513, "flags": 0x81,
					"u8": 250, "i8": -3, "i16": -12345, "i32": -1234567890, "u64": uint64(0xfedcba9876543210), "i64": -0x123456789abcdef,
					"reason": 5, "raw": []byte{1, 2, 3, 4}, "label": "hello", "u16": 0xbeef,
					"addr": netip.MustParseAddr("2001:db8::1"),
				}},
				{"conn_open", map[string]any{"time_ns": 5, "proto": 6, "family": 2, "state": 2, "lport": 1234, "rport": 80,
					"laddr": netip.MustParseAddr("192.0.2.1"), "raddr": netip.MustParseAddr("198.51.100.7")}},
				{"task", map[string]any{"time_ns": 6, "pid": 99, "comm": "exactly16bytes!!"}},
			}
			var recs [][]byte
			for _, r := range want {
				recs = append(recs, encode(t, h, r))
			}
			file := writeTrace(t, h, WriterOptions{ByteOrder: order}, recs, true)

			r, err := NewReader(bytes.NewReader(file))
			if err != nil {
				t.Fatal(err)
			}
			if order != nil && r.ByteOrder() != order {
				t.Errorf("ByteOrder() = %v, want %v", r.ByteOrder(), order)
			}
			gotHdr := r.Header()
			wantHdr := *h
			wantHdr.Format, wantHdr.Version, wantHdr.Common = FormatName, Version, CommonFields
			if !reflect.DeepEqual(gotHdr, &wantHdr) {
				t.Errorf("header:\n got %+v\nwant %+v", gotHdr, &wantHdr)
			}

			rec, err := r.Next()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(rec.Data, recs[0]) {
				t.Errorf("record 0 = %x, want %x", rec.Data, recs[0])
			}
			if rec.Type.Name != "every_kind" || rec.TypeID() != 200 {
				t.Errorf("type = %s (%d), want every_kind (200)", rec.Type.Name, rec.TypeID())
			}
			if rec.Offset%8 != 0 {
				t.Errorf("record offset %d is not 8-byte aligned", rec.Offset)
			}
			if got := [...]any{rec.Time(), rec.Conn(), rec.TID(), rec.Size(), rec.NetNS(), rec.CPU(), rec.Flags()}; got !=
				[...]any{uint64(123456789012345), uint64(0x1122334455667788), uint32(77), int32(-5), uint32(4026531993), uint16(513), uint8(0x81)} {
				t.Errorf("common header = %v", got)
			}
			wantVals := map[string]any{
				"u8": uint64(250), "i8": int64(-3), "i16": int64(-12345), "i32": int64(-1234567890),
				"u64": uint64(0xfedcba9876543210), "i64": int64(-0x123456789abcdef), "reason": uint64(5),
				"raw": []byte{1, 2, 3, 4}, "label": "hello", "u16": uint64(0xbeef),
				"addr": netip.MustParseAddr("2001:db8::1"), "size": int64(-5), "time_ns": uint64(123456789012345),
			}
			for name, want := range wantVals {
				f, _ := rec.Type.Field(name)
				if got := rec.Value(f); !reflect.DeepEqual(got, want) {
					t.Errorf("Value(%s) = %#v, want %#v", name, got, want)
				}
			}
			if v, ok := rec.Uint("reason"); !ok || v != 5 {
				t.Errorf("Uint(reason) = %d, %v", v, ok)
			}
			f, _ := rec.Type.Field("reason")
			if name, ok := r.Header().EnumName(f, 5); !ok || name != "TCP_CSUM" {
				t.Errorf("EnumName(reason, 5) = %q, %v", name, ok)
			}
			if v, ok := rec.Int("i16"); !ok || v != -12345 {
				t.Errorf("Int(i16) = %d, %v", v, ok)
			}
			if _, ok := rec.Int("u8"); ok {
				t.Error("Int(u8) reported a signed value for an unsigned field")
			}
			if _, ok := rec.Uint("i8"); ok {
				t.Error("Uint(i8) reported an unsigned value for a signed field")
			}
			if _, ok := rec.Uint("nonexistent"); ok {
				t.Error("Uint(nonexistent) reported a value")
			}
			if s, ok := rec.Str("label"); !ok || s != "hello" {
				t.Errorf("Str(label) = %q, %v", s, ok)
			}
			if b, ok := rec.Bytes("raw"); !ok || !bytes.Equal(b, []byte{1, 2, 3, 4}) {
				t.Errorf("Bytes(raw) = %v, %v", b, ok)
			}
			if rec.Value(Field{Name: "outside", Offset: 90, Size: 16, Kind: KindBytes}) != nil {
				t.Error("Value of a field outside the record is not nil")
			}

			rec, err = r.Next()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(rec.Data, recs[1]) {
				t.Errorf("record 1 = %x, want %x", rec.Data, recs[1])
			}
			if a, ok := rec.Addr("raddr", true); !ok || a != netip.MustParseAddr("198.51.100.7") {
				t.Errorf("Addr(raddr, v4) = %v, %v", a, ok)
			}
			if st, _ := rec.Uint("state"); st != 2 {
				t.Errorf("state = %d, want 2", st)
			}

			rec, err = r.Next()
			if err != nil {
				t.Fatal(err)
			}
			if s, _ := rec.Str("comm"); s != "exactly16bytes!!" {
				t.Errorf("comm = %q", s)
			}
			if _, err := r.Next(); err != io.EOF {
				t.Fatalf("Next after last record = %v, want io.EOF", err)
			}
			if cut, _ := r.Truncated(); cut {
				t.Error("complete file reported as truncated")
			}
			s := r.Summary()
			if s == nil {
				t.Fatal("no summary")
			}
			wantSum := Summary{EndWallNs: h.StartWallNs + 5e9, Lost: 7, Blocks: 1,
				Events: map[string]uint64{"every_kind": 1, "conn_open": 1, "task": 1}}
			if !reflect.DeepEqual(*s, wantSum) {
				t.Errorf("summary = %+v, want %+v", *s, wantSum)
			}
		})
	}
}

func TestRoundTripManyBlocks(t *testing.T) {
	h := testHeader(magnetTypes())
	recs := sampleRecords(t, h, 1000)
	for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		file := writeTrace(t, h, WriterOptions{ByteOrder: order, BlockSize: 1000}, recs, true)
		got, r, err := readAll(t, file)
		if err != nil {
			t.Fatalf("%v: %v", order, err)
		}
		if !reflect.DeepEqual(got, recs) {
			t.Fatalf("%v: records differ after the round trip", order)
		}
		if s := r.Summary(); s == nil || s.Blocks < 40 || s.Events["tcp_xmit"] != 250 {
			t.Errorf("%v: summary = %+v", order, s)
		}
	}
}

// lender is a BlockLender in memory that lends more room than asked for,
// poisoned, so that a Writer using what it was not lent, or leaving the
// room's bytes unwritten, shows.
type lender struct {
	bytes.Buffer
	room    []byte
	asked   []int
	commits int
}

func (l *lender) Room(n int) []byte {
	l.asked = append(l.asked, n)
	l.room = bytes.Repeat([]byte{0xee}, n+100)[:0]
	return l.room
}

func (l *lender) Commit(n int) error {
	l.Write(l.room[:n])
	l.commits++
	return nil
}

// A Writer builds its blocks in the room its io.Writer lends, and the file
// is byte for byte the one it writes without: blocks of at most BlockSize
// bytes of records, or of one larger record.
func TestLentBlocks(t *testing.T) {
	h := testHeader(magnetTypes())
	recs := sampleRecords(t, h, 1000)
	for _, bs := range []int{1000, 16} {
		want := writeTrace(t, h, WriterOptions{BlockSize: bs}, recs, true)
		var l lender
		w, err := NewWriter(&l, h, WriterOptions{BlockSize: bs})
		if err != nil {
			t.Fatal(err)
		}
		buffered := false
		for _, r := range recs {
			if err := w.Write(r); err != nil {
				t.Fatal(err)
			}
			buffered = buffered || w.Buffered() > 0
		}
		if !buffered && bs > 100 { // 16: each record is a block of its own
			t.Error("Buffered() was always 0 with lent blocks")
		}
		if err := w.Close(&Summary{EndWallNs: h.StartWallNs + 5e9, Lost: 7}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(l.Bytes(), want) {
			t.Fatalf("block size %d: the file built in lent room differs", bs)
		}
		if w.Bytes() != int64(l.Len()) {
			t.Errorf("Bytes() = %d, wrote %d", w.Bytes(), l.Len())
		}
		if l.commits != len(l.asked) || l.commits < 40 {
			t.Errorf("block size %d: %d blocks lent, %d committed", bs, len(l.asked), l.commits)
		}
		for _, n := range l.asked {
			if n != blockHeaderSize+max(bs, 40) && n != blockHeaderSize+max(bs, 56) && n != blockHeaderSize+max(bs, 72) && n != blockHeaderSize+max(bs, 32) {
				t.Fatalf("block size %d: asked for room of %d bytes", bs, n)
			}
		}
	}
}

func TestBigEndianWriterMatchesNative(t *testing.T) {
	h := testHeader(magnetTypes())
	recs := sampleRecords(t, h, 50)
	be := writeTrace(t, h, WriterOptions{ByteOrder: binary.BigEndian, BlockSize: 256}, recs, true)
	le := writeTrace(t, h, WriterOptions{ByteOrder: binary.LittleEndian, BlockSize: 256}, recs, true)
	if bytes.Equal(be, le) {
		t.Fatal("big- and little-endian files are identical")
	}
	if len(be) != len(le) {
		t.Fatalf("big-endian file is %d bytes, little-endian %d", len(be), len(le))
	}
	gotBE, _, err := readAll(t, be)
	if err != nil {
		t.Fatal(err)
	}
	gotLE, _, err := readAll(t, le)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gotBE, recs) || !reflect.DeepEqual(gotLE, recs) {
		t.Fatal("records differ after the round trip")
	}
	// The caller's record must not be swapped in place.
	if !reflect.DeepEqual(recs, sampleRecords(t, h, 50)) {
		t.Fatal("Write modified the caller's record")
	}
}

// blockBounds walks a well-formed file and returns the offset where blocks
// start, the end offset of every data block with the number of records
// before it, and the offset of the end block.
func blockBounds(t *testing.T, file []byte) (first int64, ends []int64, before []int, endBlock int64) {
	order := binary.ByteOrder(binary.LittleEndian)
	if binary.BigEndian.Uint32(file[8:]) == endianMark {
		order = binary.BigEndian
	}
	off := int64(preambleSize) + int64(order.Uint32(file[16:]))
	off += pad8(off)
	first = off
	n := 0
	for {
		plen := int64(order.Uint32(file[off+4:]))
		if string(file[off:off+4]) == "MGEN" {
			return first, ends, before, off
		}
		n += int(order.Uint32(file[off+8:]))
		off += blockHeaderSize + plen
		ends = append(ends, off)
		before = append(before, n)
	}
}

func TestTruncationAtEveryOffset(t *testing.T) {
	h := testHeader(magnetTypes())
	recs := sampleRecords(t, h, 12)
	for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		file := writeTrace(t, h, WriterOptions{ByteOrder: order, BlockSize: 100}, recs, true)
		first, ends, before, endBlock := blockBounds(t, file)
		if len(ends) < 4 {
			t.Fatalf("want several blocks, got %d", len(ends))
		}
		jsonEnd := preambleSize + int64(order.Uint32(file[16:]))
		for cut := 0; cut <= len(file); cut++ {
			got, r, err := readAll(t, file[:cut])
			if int64(cut) < jsonEnd {
				if err == nil {
					t.Fatalf("%v: cut at %d inside the header: no error", order, cut)
				}
				if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNotTrace) {
					t.Fatalf("%v: cut at %d: error %v is neither ErrCorrupt nor ErrNotTrace", order, cut, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%v: cut at %d: %v", order, cut, err)
			}
			wantN, wantOff := 0, first
			if int64(cut) < first {
				wantOff = jsonEnd
			}
			for i, end := range ends {
				if end <= int64(cut) {
					wantN, wantOff = before[i], end
				}
			}
			if !slices.EqualFunc(got, recs[:wantN], bytes.Equal) {
				t.Fatalf("%v: cut at %d: got %d records, want the first %d", order, cut, len(got), wantN)
			}
			truncated, off := r.Truncated()
			if cut == len(file) {
				if truncated || r.Summary() == nil {
					t.Fatalf("%v: complete file: truncated %v, summary %v", order, truncated, r.Summary())
				}
				continue
			}
			if !truncated || r.Summary() != nil {
				t.Fatalf("%v: cut at %d: truncated %v, summary %v", order, cut, truncated, r.Summary())
			}
			if int64(cut) >= endBlock {
				wantOff = endBlock
			}
			if off != wantOff {
				t.Fatalf("%v: cut at %d: truncated at offset %d, want %d", order, cut, off, wantOff)
			}
		}
	}
}

func TestFlushedButNotClosed(t *testing.T) {
	h := testHeader(magnetTypes())
	recs := sampleRecords(t, h, 5)
	file := writeTrace(t, h, WriterOptions{}, recs, false)
	got, r, err := readAll(t, file)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, recs) {
		t.Fatalf("got %d records, want %d", len(got), len(recs))
	}
	if cut, off := r.Truncated(); !cut || off != int64(len(file)) {
		t.Errorf("Truncated() = %v, %d; want true, %d", cut, off, len(file))
	}
}

func TestZeroFilledTail(t *testing.T) {
	h := testHeader(magnetTypes())
	recs := sampleRecords(t, h, 5)
	file := writeTrace(t, h, WriterOptions{}, recs, false)
	size := len(file)
	file = append(file, make([]byte, 4096)...)
	got, r, err := readAll(t, file)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(recs) {
		t.Fatalf("got %d records, want %d", len(got), len(recs))
	}
	if cut, off := r.Truncated(); !cut || off != int64(size) {
		t.Errorf("Truncated() = %v, %d; want true, %d", cut, off, size)
	}
}

// rawFile builds a trace by hand from header JSON and raw blocks, so that
// tests can make files the Writer refuses to write.
func rawFile(order binary.ByteOrder, version uint16, js []byte, blocks ...[]byte) []byte {
	b := make([]byte, preambleSize)
	copy(b, fileMagic[:])
	order.PutUint32(b[8:], endianMark)
	order.PutUint16(b[12:], version)
	order.PutUint32(b[16:], uint32(len(js)))
	order.PutUint32(b[20:], crc32.Checksum(js, castagnoli))
	b = append(b, js...)
	b = append(b, make([]byte, pad8(int64(len(b))))...)
	for _, blk := range blocks {
		b = append(b, blk...)
	}
	return b
}

func rawBlock(order binary.ByteOrder, magic string, records uint32, payload []byte) []byte {
	b := make([]byte, blockHeaderSize, blockHeaderSize+len(payload))
	copy(b, magic)
	order.PutUint32(b[4:], uint32(len(payload)))
	order.PutUint32(b[8:], records)
	order.PutUint32(b[12:], crc32.Checksum(payload, castagnoli))
	return append(b, payload...)
}

func headerJSON(t *testing.T, h *Header) []byte {
	hdr := *h
	hdr.Format, hdr.Version, hdr.Common = FormatName, Version, CommonFields
	js, err := json.Marshal(&hdr)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func TestBadInput(t *testing.T) {
	le := binary.LittleEndian
	h := testHeader(magnetTypes())
	js := headerJSON(t, h)
	recs := sampleRecords(t, h, 8)
	good := writeTrace(t, h, WriterOptions{ByteOrder: le, BlockSize: 100}, recs, true)
	first, ends, before, _ := blockBounds(t, good)

	badCRC := bytes.Clone(good)
	badCRC[ends[0]+blockHeaderSize+3] ^= 0xff // a byte of the second block's payload

	badMagic := bytes.Clone(good)
	copy(badMagic[ends[1]:], "XXXX")

	unknown := bytes.Clone(good)
	payload := unknown[ends[0]+blockHeaderSize : ends[1]]
	payload[offType] = 77
	le.PutUint32(unknown[ends[0]+12:], crc32.Checksum(payload, castagnoli))

	hugeHeader := bytes.Clone(good)
	le.PutUint32(hugeHeader[16:], 1<<30)

	badEndian := bytes.Clone(good)
	le.PutUint32(badEndian[8:], 0xdeadbeef)

	badHeaderCRC := bytes.Clone(good)
	badHeaderCRC[30] ^= 1

	badField := *h
	badField.Types = append(magnetTypes(), EventType{ID: 9, Name: "bad", Size: 40, Fields: []Field{{Name: "x", Offset: 36, Size: 8, Kind: KindUint}}})
	dupID := *h
	dupID.Types = append(magnetTypes(), EventType{ID: 4, Name: "again", Size: 32})
	oddSize := *h
	oddSize.Types = []EventType{{ID: 1, Name: "odd", Size: 36}}
	badIntSize := *h
	badIntSize.Types = []EventType{{ID: 1, Name: "odd", Size: 40, Fields: []Field{{Name: "x", Offset: 32, Size: 3, Kind: KindInt}}}}

	oneRec := recs[0] // a 32-byte sock_send
	twoRecs := append(bytes.Clone(recs[0]), recs[0]...)

	tests := []struct {
		name string
		file []byte
		want string // exact error text
		kind error
		recs int // records returned before the error
	}{
		{"empty", nil, "not a magnet trace (bad magic at offset 0)", ErrNotTrace, 0},
		{"foreign file", []byte("PK\x03\x04 this is a zip file, not a trace at all"), "not a magnet trace (bad magic at offset 0)", ErrNotTrace, 0},
		{"bad endian mark", badEndian, "not a magnet trace (bad endian mark 0xefbeadde at offset 8)", ErrNotTrace, 0},
		{"version 2", rawFile(le, 2, js), "unsupported trace format version 2 at offset 12 (this magnet reads version 1)", ErrVersion, 0},
		{"oversize header", hugeHeader, "header length 1073741824 at offset 16 exceeds the limit of 16777216 bytes", ErrCorrupt, 0},
		{"header checksum", badHeaderCRC, fmt.Sprintf("header checksum mismatch at offset 24 (stored %08x, computed %08x)",
			le.Uint32(good[20:]), crc32.Checksum(badHeaderCRC[24:24+len(js)], castagnoli)), ErrCorrupt, 0},
		{"bad JSON", rawFile(le, 1, []byte(`{"format": `)), "bad header JSON at offset 24: unexpected end of JSON input", ErrCorrupt, 0},
		{"JSON version differs", rawFile(le, 1, bytes.Replace(js, []byte(`"version":1`), []byte(`"version":3`), 1)),
			"invalid header at offset 24: version is 3, want 1", ErrCorrupt, 0},
		{"field outside record", rawFile(le, 1, headerJSON(t, &badField)),
			"invalid header at offset 24: event type bad: field x (offset 36, size 8) lies outside bytes 32 to 40 of the record", ErrCorrupt, 0},
		{"duplicate id", rawFile(le, 1, headerJSON(t, &dupID)), "invalid header at offset 24: event type id 4 is used twice", ErrCorrupt, 0},
		{"record size", rawFile(le, 1, headerJSON(t, &oddSize)),
			"invalid header at offset 24: event type odd: size 36 is not a multiple of 8 between 32 and 65536", ErrCorrupt, 0},
		{"integer size", rawFile(le, 1, headerJSON(t, &badIntSize)),
			"invalid header at offset 24: event type odd: field x: integer size 3 is not 1, 2, 4 or 8", ErrCorrupt, 0},
		{"block checksum", badCRC, fmt.Sprintf("corrupt block at offset %d: payload checksum mismatch (stored %08x, computed %08x)",
			ends[0], le.Uint32(good[ends[0]+12:]), crc32.Checksum(badCRC[ends[0]+blockHeaderSize:ends[1]], castagnoli)), ErrCorrupt, before[0]},
		{"bad block magic", badMagic, fmt.Sprintf(`corrupt block at offset %d: bad block magic "XXXX"`, ends[1]), ErrCorrupt, before[1]},
		{"unknown type", unknown, fmt.Sprintf("unknown event type 77 at offset %d", ends[0]+blockHeaderSize), ErrCorrupt, before[0]},
		{"record past block", rawFile(le, 1, js, rawBlock(le, "MGBK", 2, append(bytes.Clone(oneRec), make([]byte, 16)...))),
			fmt.Sprintf("corrupt block at offset %d: record at offset %d runs past the end of the block", first, first+blockHeaderSize+32), ErrCorrupt, 0},
		{"record count", rawFile(le, 1, js, rawBlock(le, "MGBK", 3, twoRecs)),
			fmt.Sprintf("corrupt block at offset %d: block holds 2 records, its header says 3", first), ErrCorrupt, 0},
		{"huge block", rawFile(le, 1, js, rawBlock(le, "MGBK", 1, oneRec)[:4], []byte{0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0}, make([]byte, 24)),
			fmt.Sprintf("corrupt block at offset %d: payload length 4294967295 exceeds the limit of 67108864 bytes", first), ErrCorrupt, 0},
		{"trailing data", append(bytes.Clone(good), "more"...), fmt.Sprintf("trailing data at offset %d after the end block", len(good)), ErrCorrupt, 8},
		{"bad summary", rawFile(le, 1, js, rawBlock(le, "MGEN", 0, []byte("{"))),
			fmt.Sprintf("corrupt end block at offset %d: bad summary JSON: unexpected end of JSON input", first), ErrCorrupt, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, err := readAll(t, tt.file)
			if err == nil {
				t.Fatal("no error")
			}
			if err.Error() != tt.want {
				t.Errorf("error = %q\n         want %q", err, tt.want)
			}
			if !errors.Is(err, tt.kind) {
				t.Errorf("error %v is not %v", err, tt.kind)
			}
			var fe *FormatError
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), fmt.Sprintf("offset %d", fe.Offset)) {
				t.Errorf("error %q does not name its offset", err)
			}
			if len(got) != tt.recs {
				t.Errorf("got %d records before the error, want %d", len(got), tt.recs)
			}
		})
	}
}

func TestWriterErrors(t *testing.T) {
	h := testHeader(magnetTypes())
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h, WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	xmit := encode(t, h, rec{"tcp_xmit", nil})
	for _, tt := range []struct {
		rec  []byte
		want string
	}{
		{xmit[:32], "write record: tcp_xmit record is 32 bytes, want 40"},
		{append(bytes.Clone(xmit), make([]byte, 8)...), "write record: tcp_xmit record is 48 bytes, want 40"},
		{xmit[:16], "write record: record is 16 bytes, shorter than the 32-byte common header"},
		{func() []byte { b := bytes.Clone(xmit); b[offType] = 99; return b }(), "write record: unknown event type 99"},
	} {
		if err := w.Write(tt.rec); err == nil || err.Error() != tt.want {
			t.Errorf("Write error = %v, want %q", err, tt.want)
		}
	}
	if err := w.Close(nil); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(xmit); err == nil {
		t.Error("Write after Close succeeded")
	}

	bad := testHeader([]EventType{{ID: 1, Name: "x", Size: 40, Fields: []Field{{Name: "a", Offset: 32, Size: 4, Kind: "float"}}}})
	if _, err := NewWriter(io.Discard, bad, WriterOptions{}); err == nil || err.Error() != `new trace writer: event type x: field a: unknown kind "float"` {
		t.Errorf("NewWriter with a bad dictionary: %v", err)
	}
	if _, err := NewWriter(io.Discard, h, WriterOptions{BlockSize: -1}); err == nil {
		t.Error("NewWriter accepted a negative block size")
	}
}

// failingWriter accepts limit bytes and then fails.
type failingWriter struct{ limit int }

func (f *failingWriter) Write(p []byte) (int, error) {
	if len(p) > f.limit {
		n := f.limit
		f.limit = 0
		return n, errors.New("disk full")
	}
	f.limit -= len(p)
	return len(p), nil
}

func TestWriterFailureIsSticky(t *testing.T) {
	h := testHeader(magnetTypes())
	fw := &failingWriter{limit: 4096}
	w, err := NewWriter(fw, h, WriterOptions{BlockSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	var werr error
	for _, r := range sampleRecords(t, h, 400) {
		if werr = w.Write(r); werr != nil {
			break
		}
	}
	if werr == nil || !strings.Contains(werr.Error(), "disk full") {
		t.Fatalf("Write error = %v, want disk full", werr)
	}
	if w.Bytes() != 4096 {
		t.Errorf("Bytes() = %d, want 4096", w.Bytes())
	}
	if err := w.Close(nil); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("Close after failure = %v", err)
	}
}

func TestOpen(t *testing.T) {
	h := testHeader(magnetTypes())
	path := filepath.Join(t.TempDir(), "x.mgt")
	if err := os.WriteFile(path, writeTrace(t, h, WriterOptions{}, sampleRecords(t, h, 3), true), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		if _, err := r.Next(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 3 {
		t.Errorf("read %d records, want 3", n)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	if err := os.WriteFile(path, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Open(path)
	if want := "open trace " + path + ": not a magnet trace (bad magic at offset 0)"; err == nil || err.Error() != want {
		t.Errorf("Open(non-trace) = %v, want %q", err, want)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open(missing) = %v", err)
	}
}

func TestHeaderLookups(t *testing.T) {
	h := testHeader(magnetTypes())
	if typ := h.TypeByName("conn_open"); typ == nil || typ.ID != 14 {
		t.Errorf("TypeByName(conn_open) = %v", typ)
	}
	if typ := h.TypeByID(22); typ == nil || typ.Name != "task" {
		t.Errorf("TypeByID(22) = %v", typ)
	}
	if h.TypeByID(99) != nil || h.TypeByName("nope") != nil {
		t.Error("lookup of a missing type returned an entry")
	}
}

func BenchmarkNext(b *testing.B) {
	h := testHeader(magnetTypes())
	recs := sampleRecords(b, h, 10000)
	for _, order := range []binary.ByteOrder{binary.NativeEndian, foreignOrder()} {
		file := writeTrace(b, h, WriterOptions{ByteOrder: order}, recs, true)
		b.Run(fmt.Sprint(order), func(b *testing.B) {
			b.SetBytes(int64(len(file)))
			b.ReportAllocs()
			for b.Loop() {
				r, err := NewReader(bytes.NewReader(file))
				if err != nil {
					b.Fatal(err)
				}
				for {
					if _, err := r.Next(); err != nil {
						break
					}
				}
			}
		})
	}
}

// HostLimit reads extra.host_limits as a header decoded from JSON holds it,
// and is 0 for a figure or a host_limits the trace lacks.
func TestHostLimit(t *testing.T) {
	var h Header
	if err := json.Unmarshal([]byte(`{"extra":{"host_limits":{"clock_step_ns":30,"idle_wakeup_ns":44800.5}}}`), &h); err != nil {
		t.Fatal(err)
	}
	if got := h.HostLimit("idle_wakeup_ns"); got != 44800.5 {
		t.Errorf("idle_wakeup_ns = %v, want 44800.5", got)
	}
	if got := h.HostLimit("memcpy_gbps"); got != 0 {
		t.Errorf("missing memcpy_gbps = %v, want 0", got)
	}
	if got := (&Header{}).HostLimit("clock_step_ns"); got != 0 {
		t.Errorf("no host_limits: %v, want 0", got)
	}
}
