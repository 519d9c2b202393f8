// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"net/netip"
	"testing"
)

// fuzzHeader is a header with a small dictionary that still has a field of
// every kind, so that seeds stay short and minimizing inputs stays quick.
func fuzzHeader() *Header {
	return &Header{Types: []EventType{
		{ID: 1, Name: "a", Size: 40, Fields: []Field{
			{Name: "u", Offset: 32, Size: 4, Kind: KindUint},
			{Name: "i", Offset: 36, Size: 2, Kind: KindInt},
			{Name: "e", Offset: 38, Size: 1, Kind: "enum:e"},
		}},
		{ID: 2, Name: "b", Size: 64, Fields: []Field{
			{Name: "s", Offset: 32, Size: 8, Kind: KindStr},
			{Name: "ip", Offset: 40, Size: 16, Kind: KindIP},
			{Name: "raw", Offset: 56, Size: 8, Kind: KindBytes},
		}},
	}}
}

// fixChecksums returns a copy of data with the header checksum and the
// checksum of every block it can find rewritten to match, so that mutated
// inputs get past the checksums to the code behind them.
func fixChecksums(data []byte) []byte {
	data = bytes.Clone(data)
	if len(data) < preambleSize {
		return data
	}
	var order binary.ByteOrder = binary.LittleEndian
	if binary.BigEndian.Uint32(data[8:]) == endianMark {
		order = binary.BigEndian
	}
	off := int64(preambleSize) + int64(order.Uint32(data[16:]))
	if off > int64(len(data)) {
		return data
	}
	order.PutUint32(data[20:], crc32.Checksum(data[preambleSize:off], castagnoli))
	off += pad8(off)
	for off+blockHeaderSize <= int64(len(data)) {
		end := off + blockHeaderSize + int64(order.Uint32(data[off+4:]))
		if end > int64(len(data)) {
			break
		}
		order.PutUint32(data[off+12:], crc32.Checksum(data[off+blockHeaderSize:end], castagnoli))
		off = end
	}
	return data
}

// readEverything reads data as a trace to the end, with or without
// salvage, checks what it can and returns the number of records read.
func readEverything(t *testing.T, data []byte, salvage bool) int {
	r, err := NewReader(bytes.NewReader(data))
	if err != nil {
		return 0
	}
	r.SetSalvage(salvage)
	for n := 0; ; n++ {
		rec, err := r.Next()
		if err == io.EOF {
			cut, off := r.Truncated()
			if cut == (r.Summary() != nil) {
				t.Fatalf("truncated %v at %d, summary %v", cut, off, r.Summary())
			}
			if s := r.Salvaged(); s.Records != uint64(n) || s.Regions > 0 && (!salvage || s.Bytes <= 0) {
				t.Fatalf("salvage %v: %+v after %d records", salvage, s, n)
			}
			return n
		}
		if err != nil {
			var fe *FormatError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v is not a *FormatError", err)
			}
			if salvage && !r.Compressed() {
				t.Fatalf("salvage stopped at an error: %v", err)
			}
			return n
		}
		if len(rec.Data) != rec.Type.Size || rec.Offset < 0 || !r.Compressed() && rec.Offset+int64(len(rec.Data)) > int64(len(data)) {
			t.Fatalf("record of %d bytes at offset %d in %d bytes of input", len(rec.Data), rec.Offset, len(data))
		}
		for _, f := range rec.Type.Fields {
			rec.Value(f)
		}
		rec.Time()
		rec.Flags()
	}
}

// FuzzReader feeds arbitrary bytes to the Reader, as they are and with
// their checksums repaired. It must never panic or hang, and a clean end
// must come with either a summary or a truncation.
func FuzzReader(f *testing.F) {
	h := fuzzHeader()
	var recs [][]byte
	for i := range 6 {
		if i%2 == 0 {
			recs = append(recs, encode(f, h, rec{"a", map[string]any{"time_ns": i, "u": 7 * i, "i": -i, "e": i}}))
		} else {
			recs = append(recs, encode(f, h, rec{"b", map[string]any{"time_ns": i, "s": "x", "ip": netip.MustParseAddr("10.1.2.3"), "raw": []byte{1, 2}}}))
		}
	}
	native := writeTrace(f, h, WriterOptions{BlockSize: 64}, recs, true)
	big := writeTrace(f, h, WriterOptions{ByteOrder: binary.BigEndian, BlockSize: 64}, recs, true)
	f.Add(native)
	f.Add(big)
	f.Add(writeTrace(f, h, WriterOptions{}, recs, false))
	f.Add(compress(f, native)) // the archive's .mgt.zst
	for _, cut := range []int{len(native) - 1, len(native) - 40, len(native) - 100, len(native) - 150} {
		f.Add(native[:cut])
		f.Add(big[:cut])
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		for _, d := range [][]byte{data, fixChecksums(data)} {
			plain := readEverything(t, d, false)
			// Salvage reads what a plain read does, and perhaps more.
			if salvaged := readEverything(t, d, true); salvaged < plain {
				t.Fatalf("salvage read %d records, a plain read %d", salvaged, plain)
			}
		}
	})
}
