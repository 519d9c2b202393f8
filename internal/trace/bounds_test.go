// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// A header beyond the bounds is refused by the Reader with a line saying
// which bound, and never written by the Writer.
func TestHeaderBounds(t *testing.T) {
	big := strings.Repeat("h", 15<<20)
	manyFields := EventType{ID: 9, Name: "wide", Size: 32 + 4104}
	for i := range MaxFields + 1 {
		manyFields.Fields = append(manyFields.Fields, Field{Name: fmt.Sprintf("f%d", i), Offset: 32 + i, Size: 1, Kind: KindUint})
	}
	cases := []struct {
		name string
		edit func(h *Header)
		want string
	}{
		{"host", func(h *Header) { h.Host = big }, "host is 15728640 bytes, more than the limit of 256"},
		{"cpu model", func(h *Header) { h.CPUModel = big[:MaxHeaderString+1] }, "cpu_model is 257 bytes"},
		{"fields", func(h *Header) { h.Types = append(h.Types, manyFields) }, "fields, more than the limit of 4096"},
		{"field name", func(h *Header) { h.Types[1].Fields[0].Name = big[:MaxName+1] }, "name or kind longer than 128 bytes"},
		{"enum value", func(h *Header) { h.Enums = map[string]map[string]string{"e": {"1": big[:MaxName+1]}} }, "enum table e: entry"},
		{"command", func(h *Header) { h.Settings.Command = []string{big[:MaxSetting+1]} }, "a setting is 131073 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := testHeader(magnetTypes())
			c.edit(h)
			if _, err := NewWriter(&bytes.Buffer{}, h, WriterOptions{}); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("writer: err %v, want %q", err, c.want)
			}
			file := rawFile(binary.LittleEndian, Version, headerJSON(t, h))
			_, err := NewReader(bytes.NewReader(file))
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("reader: err %v, want %q", err, c.want)
			}
		})
	}
	// At the bounds all is well.
	h := testHeader(magnetTypes())
	h.Host, h.CPUModel = big[:MaxHeaderString], big[:MaxHeaderString]
	if _, err := NewReader(bytes.NewReader(writeTrace(t, h, WriterOptions{}, nil, true))); err != nil {
		t.Fatal(err)
	}
}

// A compressed trace whose zstd window is beyond the reader's limit is
// said to be so, not called damaged.
func TestZstdWindowLimit(t *testing.T) {
	h := testHeader(magnetTypes())
	file := writeTrace(t, h, WriterOptions{}, sampleRecords(t, h, 40), true)
	var buf bytes.Buffer
	enc, err := zstd.NewWriter(&buf, zstd.WithSingleSegment(false))
	if err != nil {
		t.Fatal(err)
	}
	enc.Write(file)
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	z := buf.Bytes()
	// The window descriptor follows the frame header descriptor when the
	// frame is not a single segment: 128 MiB is exponent 17 (2^(10+17)).
	if z[4]&0x20 != 0 {
		t.Fatalf("encoder wrote a single-segment frame (descriptor %#x)", z[4])
	}
	z[5] = 17 << 3
	_, _, err = readAll(t, z)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "window larger than this reader's limit of 64 MiB") || strings.Contains(err.Error(), "damaged") {
		t.Fatalf("err %v, want the window limit", err)
	}
}
