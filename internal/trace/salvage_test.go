// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// salvageAll reads file with salvage on and returns copies of the records.
func salvageAll(t *testing.T, file []byte) ([][]byte, *Reader) {
	t.Helper()
	r, err := NewReader(bytes.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	r.SetSalvage(true)
	var out [][]byte
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return out, r
		}
		if err != nil {
			t.Fatalf("salvage: %v", err)
		}
		out = append(out, bytes.Clone(rec.Data))
	}
}

// damagedFile is a complete trace of 12 records in six blocks, and its
// block layout.
func damagedFile(t *testing.T, order binary.ByteOrder) (file []byte, recs [][]byte, first int64, ends []int64, before []int) {
	h := testHeader(magnetTypes())
	recs = sampleRecords(t, h, 12)
	file = writeTrace(t, h, WriterOptions{ByteOrder: order, BlockSize: 128}, recs, true)
	first, ends, before, _ = blockBounds(t, file)
	if len(ends) < 4 {
		t.Fatalf("want at least 4 blocks, have %d", len(ends))
	}
	return file, recs, first, ends, before
}

// A bit flipped in a block's length makes it run past the end of the file.
// That is damage, not a file cut short: the blocks after it are whole.
func TestLengthFlipIsCorruption(t *testing.T) {
	for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		file, recs, _, ends, before := damagedFile(t, order)
		bad := bytes.Clone(file)
		at := ends[0] // the second block
		order.PutUint32(bad[at+4:], order.Uint32(bad[at+4:])|1<<20)
		got, r, err := readAll(t, bad)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "damaged, not cut short") {
			cut, off := r.Truncated()
			t.Fatalf("%v: err %v (truncated %v at %d), want corruption", order, err, cut, off)
		}
		if len(got) != before[0] {
			t.Fatalf("%v: %d records before the error, want %d", order, len(got), before[0])
		}

		// Salvage skips the bad block and reads the rest, summary included.
		got, r = salvageAll(t, bad)
		lost := before[1] - before[0]
		if len(got) != len(recs)-lost {
			t.Fatalf("%v: salvaged %d records, want %d", order, len(got), len(recs)-lost)
		}
		for i, g := range got {
			j := i
			if i >= before[0] {
				j += lost
			}
			if !bytes.Equal(g, recs[j]) {
				t.Fatalf("%v: salvaged record %d differs from record %d", order, i, j)
			}
		}
		s := r.Salvaged()
		if s.Regions != 1 || s.Bytes != ends[1]-ends[0] || s.Offset != ends[0] || !strings.Contains(s.First, "runs past the end of the file") {
			t.Fatalf("%v: salvaged %+v, want one region of %d bytes at %d", order, s, ends[1]-ends[0], ends[0])
		}
		if cut, _ := r.Truncated(); cut || r.Summary() == nil {
			t.Fatalf("%v: the end block was not salvaged", order)
		}
		if s.Records != uint64(len(got)) {
			t.Fatalf("Records %d, returned %d", s.Records, len(got))
		}
	}
}

// Salvage reads on after every kind of damage, and says how much it
// skipped.
func TestSalvage(t *testing.T) {
	file, recs, first, ends, before := damagedFile(t, binary.LittleEndian)
	// Block i spans [start(i), ends[i]).
	start := func(i int) int64 {
		if i == 0 {
			return first
		}
		return ends[i-1]
	}
	cases := []struct {
		name    string
		damage  func(b []byte) []byte
		lost    int   // records lost
		regions int   // damaged stretches reported
		bytes   int64 // their length
	}{
		{"checksum", func(b []byte) []byte { b[start(1)+40] ^= 0x10; return b }, before[1] - before[0], 1, ends[1] - start(1)},
		{"magic", func(b []byte) []byte { b[start(2)] = 'X'; return b }, before[2] - before[1], 1, ends[2] - start(2)},
		{"two blocks", func(b []byte) []byte { b[start(1)+40] ^= 1; b[start(3)+40] ^= 1; return b }, before[1] - before[0] + before[3] - before[2], 2, ends[1] - start(1) + ends[3] - start(3)},
		{"zeroed", func(b []byte) []byte { clear(b[start(1):ends[1]]); return b }, before[1] - before[0], 1, ends[1] - start(1)},
		{"bytes inserted", func(b []byte) []byte {
			return append(b[:ends[0]:ends[0]], append([]byte("garbage!x"), b[ends[0]:]...)...)
		}, 0, 1, 9},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bad := c.damage(bytes.Clone(file))
			if _, _, err := readAll(t, bad); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("without salvage: err %v, want ErrCorrupt", err)
			}
			got, r := salvageAll(t, bad)
			if len(got) != len(recs)-c.lost {
				t.Fatalf("salvaged %d records, want %d", len(got), len(recs)-c.lost)
			}
			s := r.Salvaged()
			if s.Regions != c.regions || s.Bytes != c.bytes {
				t.Fatalf("salvaged %+v, want %d regions of %d bytes", s, c.regions, c.bytes)
			}
			if r.Summary() == nil {
				t.Fatalf("no summary after salvage")
			}
		})
	}

	// A file cut short is still just cut short, and salvage skips nothing.
	for _, cut := range []int64{ends[2] + 20, ends[2] + 3, ends[len(ends)-1] + 10} {
		got, r := salvageAll(t, file[:cut])
		if c, off := r.Truncated(); !c || r.Salvaged().Regions != 0 {
			t.Fatalf("cut at %d: truncated %v at %d, salvaged %+v", cut, c, off, r.Salvaged())
		}
		want, _, err := readAll(t, file[:cut])
		if err != nil || len(got) != len(want) {
			t.Fatalf("cut at %d: salvaged %d records, read %d (%v)", cut, len(got), len(want), err)
		}
	}

	// Damage up to the end: skipped, and the file has no summary.
	bad := bytes.Clone(file)
	bad[ends[len(ends)-1]] = 'X' // the end block's magic
	_, r := salvageAll(t, bad)
	if s := r.Salvaged(); s.Regions != 1 || s.Bytes != int64(len(file))-ends[len(ends)-1] || r.Summary() != nil {
		t.Fatalf("damaged end block: salvaged %+v, summary %v", s, r.Summary())
	}

	// Trailing data after the end block is counted, not an error.
	_, r = salvageAll(t, append(bytes.Clone(file), "tail"...))
	if s := r.Salvaged(); s.Regions != 1 || s.Bytes != 4 || r.Summary() == nil {
		t.Fatalf("trailing data: salvaged %+v", s)
	}
}

// Warnings and Salvaged still answer after a chain is closed, as they did
// before salvage existed.
func TestChainWarningsAfterClose(t *testing.T) {
	file, _, _, ends, _ := damagedFile(t, binary.LittleEndian)
	bad := bytes.Clone(file)
	bad[ends[0]+40] ^= 1
	p := t.TempDir() + "/a.mgt"
	if err := os.WriteFile(p, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := OpenChain([]string{p})
	if err != nil {
		t.Fatal(err)
	}
	r.SetSalvage(true)
	for {
		if _, err := r.Next(); err != nil {
			if err != io.EOF {
				t.Fatal(err)
			}
			break
		}
	}
	r.Close()
	if s := r.Salvaged(); s.Regions != 1 || len(r.Warnings()) != 1 {
		t.Fatalf("after Close: salvaged %+v, warnings %v", s, r.Warnings())
	}
}

// Damage in a compressed trace: where the zstd data still decompresses,
// the blocks' own checksums find the damaged block and salvage reads on to
// the end (the frame's checksum, were it checked, would withhold the last
// 128 KiB); where it no longer decompresses, salvage keeps what came
// before, says where it stopped and why, and returns no error. Without
// salvage the reader fails either way.
func TestSalvageCompressed(t *testing.T) {
	h := testHeader(magnetTypes())
	recs := sampleRecords(t, h, 4000)
	file := writeTrace(t, h, WriterOptions{BlockSize: 4096}, recs, true)
	var buf bytes.Buffer
	enc, err := zstd.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	enc.Write(file)
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	z := buf.Bytes()
	var readOn, stopped int
	for at := len(z) / 4; at < len(z)-16; at += len(z) / 40 {
		bad := bytes.Clone(z)
		bad[at] ^= 0x55
		if _, err := NewReader(bytes.NewReader(bad)); err != nil {
			// The damaged zstd block holds the header: nothing to salvage.
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNotTrace) {
				t.Errorf("flip at %d: %v", at, err)
			}
			continue
		}
		// A zstd block whose length grew ends the stream early: that
		// reads as a file cut short, as a .zst cut short does.
		if _, r, err := readAll(t, bad); !errors.Is(err, ErrCorrupt) && (err != nil || !r.truncated) {
			t.Errorf("flip at %d of %d: without salvage err %v, want ErrCorrupt or cut short", at, len(z), err)
			continue
		}
		got, r := salvageAll(t, bad)
		s := r.Salvaged()
		for i, rec := range got[:min(len(got), 100)] {
			if !bytes.Equal(rec, recs[i]) {
				t.Fatalf("flip at %d: record %d differs", at, i)
			}
		}
		w := r.Warnings()
		switch {
		case s.Unreadable != "":
			stopped++
			if !strings.Contains(s.Unreadable, "damaged zstd data") || len(got) == 0 || len(got) >= len(recs) ||
				len(w) == 0 || !strings.Contains(w[len(w)-1], "--salvage stopped: the compressed data could not be read past offset") {
				t.Errorf("flip at %d: stopped with %d of %d records, %+v, warnings %q", at, len(got), len(recs), s, w)
			}
		case s.Regions > 0:
			readOn++
			// One damaged block of at most 4096 bytes: ~80 records lost.
			if r.Summary() == nil || len(got) < len(recs)-100 {
				t.Errorf("flip at %d: read on to %d of %d records, summary %v", at, len(got), len(recs), r.Summary() != nil)
			}
		case r.truncated:
			// The zstd stream ended early (see above): read up to there.
			if len(got) == 0 {
				t.Errorf("flip at %d: nothing read before the zstd stream ended", at)
			}
		default:
			t.Errorf("flip at %d: salvage found nothing wrong", at)
		}
	}
	if readOn == 0 || stopped == 0 {
		t.Errorf("cases: %d read on past a damaged block, %d stopped by the zstd data: want both", readOn, stopped)
	}
	t.Logf("%d flips read on past a damaged block, %d stopped where the zstd data did", readOn, stopped)
}
