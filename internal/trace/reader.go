// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/klauspost/compress/zstd"
)

// readChunk bounds how much a Reader allocates ahead of the data it has
// actually read, so that a length field claiming megabytes in a short file
// costs nothing.
const readChunk = 64 << 10

// Reader reads a trace file record by record.
type Reader struct {
	br         *bufio.Reader
	in         input         // br, after bytes salvage read ahead and gave back
	closer     io.Closer     // the file opened by Open, or nil
	dec        *zstd.Decoder // set when the trace is zstd-compressed
	off        int64         // offset in the (decompressed) trace of the next byte br returns
	raw        []byte        // the header JSON as stored, for typed views of its extra keys
	rawSummary []byte        // likewise the summary JSON
	chain      *chain        // set by OpenChain: the files after this one
	notes      []string      // Source.Notes, first of Warnings

	windowed       bool              // SetWindow: only events in [winFrom, winTo)
	keep           func(Record) bool // SetKeep
	winFrom, winTo int64             // wall-clock ns; 0 = open

	hdr   Header
	order binary.ByteOrder
	swap  bool
	idx   *typeIndex

	block    []byte // payload of the current block, records checked
	blockOff int64  // file offset of block[0]
	pos      int    // offset in block of the next record

	done      bool  // no more records: end block seen or file cut short
	err       error // sticky error
	truncated bool
	truncOff  int64
	summary   *Summary

	salvage bool    // SetSalvage: skip damaged data
	salv    Salvage // what was skipped
}

// Open opens the trace file at path and reads its header. The caller must
// call Close.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	r, err := NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open trace %s: %w", path, err)
	}
	r.closer = f
	return r, nil
}

// NewReader reads the preamble and header of a trace from rd and returns a
// Reader positioned at the first record. A zstd-compressed trace (as the
// archive stores them, .mgt.zst) is recognised by its magic and decompressed
// on the fly; offsets then count in the decompressed trace. Errors about the
// content are *FormatError values that name the offset. Close on the returned
// Reader releases the decompressor but does not close rd.
func NewReader(rd io.Reader) (*Reader, error) {
	r := &Reader{br: bufio.NewReaderSize(rd, 64<<10)}
	r.in.br = r.br
	if magic, _ := r.br.Peek(len(zstdMagic)); bytes.Equal(magic, zstdMagic[:]) {
		dec, err := zstd.NewReader(r.br,
			// One block in flight: no decoder goroutines, bounded memory.
			zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(maxZstdWindow),
			// Every part of a trace has its own CRC-32C, which names the
			// damaged block; the frame's checksum adds nothing but would
			// withhold the frame's last zstd block (up to 128 KiB of
			// records) from salvage when any of it is damaged.
			zstd.IgnoreChecksum(true))
		if err != nil {
			return nil, fmt.Errorf("start zstd decoder: %w", err)
		}
		r.dec = dec
		r.br = bufio.NewReaderSize(zstdErrors{dec}, 64<<10)
		r.in.br = r.br
	}
	if err := r.readHeader(); err != nil {
		if r.dec != nil && errors.Is(err, ErrNotTrace) {
			err = formatError(ErrNotTrace, 0, "zstd data that does not decompress to a magnet trace (or is cut short before its header)")
		}
		r.releaseDecoder()
		return nil, err
	}
	return r, nil
}

// Compressed reports whether the trace is read through zstd decompression.
func (r *Reader) Compressed() bool { return r.dec != nil }

func (r *Reader) releaseDecoder() {
	if r.dec != nil {
		r.dec.Close()
		r.dec = nil
	}
}

// Close closes the file opened by Open (every file, for OpenChain) and
// releases the decompressor. For a Reader made by NewReader it does not
// close the underlying reader.
func (r *Reader) Close() error {
	r.releaseDecoder()
	var err error
	if r.closer != nil {
		err = r.closer.Close()
		r.closer = nil
	}
	if r.chain != nil {
		if cerr := r.chain.close(); err == nil {
			err = cerr
		}
	}
	return err
}

// Header returns the file's header. The caller must not modify it.
func (r *Reader) Header() *Header { return &r.hdr }

// ByteOrder returns the byte order the file was written in. Records
// returned by Next are always in native byte order.
func (r *Reader) ByteOrder() binary.ByteOrder { return r.order }

// Truncated reports, after Next has returned io.EOF, whether the file was
// cut short (it has no end block), and if so the file offset where the
// incomplete data begins. Everything before that offset has been returned.
// For a Reader made by OpenChain it reports on the last file.
func (r *Reader) Truncated() (bool, int64) {
	if r.chain != nil {
		return r.chain.cur.Truncated()
	}
	return r.truncated, r.truncOff
}

// Summary returns the summary from the end block once Next has returned
// io.EOF, or nil if the file was cut short.
// For a Reader made by OpenChain it sums the files' summaries (carried
// records not counted), with the last file's extra keys, and is nil when the
// last file was cut short.
func (r *Reader) Summary() *Summary {
	if r.chain != nil {
		return r.chain.summary()
	}
	return r.summary
}

// Next returns the next record, in native byte order. It returns io.EOF
// after the last record, both at the end block and where a cut-short file
// ends; Truncated tells the two apart. Records come block by block: the
// records of a damaged block are never returned, and the error names the
// block's offset.
//
// The returned Record's Data aliases the Reader's buffer and is valid only
// until the next call to Next; copy it to keep it.
func (r *Reader) Next() (Record, error) {
	for {
		var rec Record
		var err error
		if r.chain != nil {
			rec, err = r.chainNext()
		} else {
			rec, err = r.next()
		}
		if err != nil || (!r.windowed || r.inWindow(rec)) && (r.keep == nil || r.keep(rec)) {
			return rec, err
		}
	}
}

// SetKeep makes Next return only the records keep accepts (nil: all); a
// selection of events (internal/evselect) that every reader of the trace
// then sees.
func (r *Reader) SetKeep(keep func(Record) bool) { r.keep = keep }

// SetWindow makes Next return only the events whose wall-clock time (ns
// since the Unix epoch) is in [from, to); 0 leaves a side open. State
// records (task, iface, conn_open) always pass: later events need them.
func (r *Reader) SetWindow(from, to int64) {
	r.winFrom, r.winTo, r.windowed = from, to, from != 0 || to != 0
}

func (r *Reader) inWindow(rec Record) bool {
	switch rec.Type.Name {
	case "task", "iface", "conn_open":
		return true
	}
	wall := int64(rec.Time()) + r.hdr.Clock.WallOffsetNs
	return wall >= r.winFrom && (r.winTo == 0 || wall < r.winTo)
}

func (r *Reader) next() (Record, error) {
	for r.pos >= len(r.block) {
		if r.err != nil {
			return Record{}, r.err
		}
		if r.done {
			return Record{}, io.EOF
		}
		if err := r.readBlock(); err != nil {
			r.err = err
			r.block, r.pos = nil, 0
			return Record{}, err
		}
	}
	// readBlock has checked every record of the block, so the type is
	// known and the record fits.
	id := r.block[r.pos+offType]
	t := r.idx.types[id]
	data := r.block[r.pos : r.pos+t.Size : r.pos+t.Size]
	if r.swap {
		swapRecord(data, r.idx.swaps[id])
	}
	rec := Record{Type: t, Data: data, Offset: r.blockOff + int64(r.pos)}
	r.pos += t.Size
	r.salv.Records++
	return rec, nil
}

// readFull reads n bytes into buf[:0], growing buf as data arrives rather
// than all at once. It returns io.ErrUnexpectedEOF or io.EOF when the data
// ends early, as io.ReadFull does.
func (r *Reader) readFull(buf []byte, n int) ([]byte, error) {
	buf = buf[:0]
	for len(buf) < n {
		chunk := min(n-len(buf), readChunk)
		buf = growLen(buf, chunk)
		got, err := io.ReadFull(&r.in, buf[len(buf)-chunk:])
		r.off += int64(got)
		if err != nil {
			buf = buf[:len(buf)-chunk+got]
			if err == io.EOF && len(buf) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return buf, err
		}
	}
	return buf, nil
}

// growLen extends b by n bytes, reallocating if needed.
func growLen(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b[:len(b)+n]
	}
	nb := make([]byte, len(b)+n, max(2*cap(b), len(b)+n))
	copy(nb, b)
	return nb
}

func isEOF(err error) bool {
	return err == io.EOF || err == io.ErrUnexpectedEOF
}

func (r *Reader) readHeader() error {
	var pre [preambleSize]byte
	got, err := io.ReadFull(r.br, pre[:])
	r.off += int64(got)
	if got < len(fileMagic) || !bytes.Equal(pre[:8], fileMagic[:]) {
		if err != nil && !isEOF(err) {
			return fmt.Errorf("read preamble: %w", err)
		}
		return formatError(ErrNotTrace, 0, "not a magnet trace (bad magic at offset 0)")
	}
	if err != nil {
		if isEOF(err) {
			return formatError(ErrCorrupt, r.off, "trace ends at offset %d inside the %d-byte preamble", r.off, preambleSize)
		}
		return fmt.Errorf("read preamble: %w", err)
	}
	switch {
	case binary.LittleEndian.Uint32(pre[8:12]) == endianMark:
		r.order = binary.LittleEndian
	case binary.BigEndian.Uint32(pre[8:12]) == endianMark:
		r.order = binary.BigEndian
	default:
		return formatError(ErrNotTrace, 8, "not a magnet trace (bad endian mark %#08x at offset 8)", binary.BigEndian.Uint32(pre[8:12]))
	}
	r.swap = isBigEndian(r.order) != nativeIsBig
	if v := r.order.Uint16(pre[12:14]); v != Version {
		return formatError(ErrVersion, 12, "unsupported trace format version %d at offset 12 (this magnet reads version %d)", v, Version)
	}
	hdrLen := r.order.Uint32(pre[16:20])
	if hdrLen > MaxHeaderBytes {
		return formatError(ErrCorrupt, 16, "header length %d at offset 16 exceeds the limit of %d bytes", hdrLen, MaxHeaderBytes)
	}
	hdrCRC := r.order.Uint32(pre[20:24])

	js, err := r.readFull(nil, int(hdrLen))
	if err != nil {
		if isEOF(err) {
			return formatError(ErrCorrupt, r.off, "trace ends at offset %d inside the %d-byte header at offset %d", r.off, hdrLen, preambleSize)
		}
		return fmt.Errorf("read header: %w", err)
	}
	if sum := crc32.Checksum(js, castagnoli); sum != hdrCRC {
		return formatError(ErrCorrupt, preambleSize, "header checksum mismatch at offset %d (stored %08x, computed %08x)", preambleSize, hdrCRC, sum)
	}
	if err := json.Unmarshal(js, &r.hdr); err != nil {
		return formatError(ErrCorrupt, preambleSize, "bad header JSON at offset %d: %v", preambleSize, err)
	}
	r.raw = js
	if err := r.hdr.validate(); err != nil {
		return formatError(ErrCorrupt, preambleSize, "invalid header at offset %d: %v", preambleSize, err)
	}
	r.idx = newTypeIndex(r.hdr.Types)

	// Zero padding up to the first block. A file that ends inside it was
	// cut short before its first block.
	padOff := r.off
	pad, err := r.readFull(make([]byte, 0, 8), int(pad8(r.off)))
	if err != nil {
		if isEOF(err) {
			r.cutShort(padOff)
			return nil
		}
		return fmt.Errorf("read header: %w", err)
	}
	for i, b := range pad {
		if b != 0 {
			return formatError(ErrCorrupt, padOff+int64(i), "non-zero header padding at offset %d", padOff+int64(i))
		}
	}
	return nil
}

func (r *Reader) cutShort(off int64) {
	r.done, r.truncated, r.truncOff = true, true, off
}

// readBlock reads the next block. For a data block it checks the checksum
// and every record before any record is returned. For the end block it reads
// the summary and marks the Reader done; likewise when the file ends.
func (r *Reader) readBlock() error {
	start := r.off
	var h [blockHeaderSize]byte
	got, err := io.ReadFull(&r.in, h[:])
	r.off += int64(got)
	if err != nil {
		if isEOF(err) {
			r.cutShort(start)
			return nil
		}
		if r.unreadable(start, err) {
			return nil
		}
		return fmt.Errorf("read block at offset %d: %w", start, err)
	}
	if h == [blockHeaderSize]byte{} {
		// File systems can leave a zero-filled tail after a crash: the
		// file's size was updated but its last data never reached the disk.
		// A whole block after the zeros, though, means damage.
		cause := formatError(ErrCorrupt, start, "zero-filled data at offset %d", start)
		before := r.salv
		if err := r.resync(start, append([]byte(nil), h[8:]...), cause, true); err != nil || r.salvage || r.truncated {
			return err
		}
		r.salv = before // looked ahead, skipped nothing
		return formatError(ErrCorrupt, start, "zero-filled data at offset %d, yet a whole block follows at offset %d: the file is damaged, not cut short (--salvage reads on)", start, r.off)
	}
	var magic [4]byte
	copy(magic[:], h[0:4])
	payloadLen := r.order.Uint32(h[4:8])
	count := r.order.Uint32(h[8:12])
	crc := r.order.Uint32(h[12:16])

	switch magic {
	case dataMagic:
	case endMagic:
		return r.readEnd(start, h[:], payloadLen, count, crc)
	default:
		return r.damaged(start, h[:], nil, formatError(ErrCorrupt, start, "corrupt block at offset %d: bad block magic %q", start, magic[:]))
	}
	if payloadLen > MaxBlockBytes {
		return r.damaged(start, h[:], nil, formatError(ErrCorrupt, start, "corrupt block at offset %d: payload length %d exceeds the limit of %d bytes", start, payloadLen, MaxBlockBytes))
	}
	payloadOff := r.off
	payload, err := r.readFull(r.block[:0], int(payloadLen))
	if err != nil {
		if isEOF(err) {
			r.block, r.pos = payload[:0], 0
			return r.endsEarly(start, h[:], payload, payloadLen)
		}
		if r.unreadable(start, err) {
			r.block, r.pos = payload[:0], 0
			return nil
		}
		return fmt.Errorf("read block at offset %d: %w", start, err)
	}
	if sum := crc32.Checksum(payload, castagnoli); sum != crc {
		return r.damaged(start, h[:], payload, formatError(ErrCorrupt, start, "corrupt block at offset %d: payload checksum mismatch (stored %08x, computed %08x)", start, crc, sum))
	}
	if err := r.checkRecords(payload, count, start, payloadOff); err != nil {
		return r.damaged(start, h[:], payload, err)
	}
	r.block, r.pos, r.blockOff = payload, 0, payloadOff
	return nil
}

// checkRecords checks that payload holds count whole records of known
// types.
func (r *Reader) checkRecords(payload []byte, count uint32, start, payloadOff int64) error {
	var n uint32
	for pos := 0; pos < len(payload); n++ {
		recOff := payloadOff + int64(pos)
		if len(payload)-pos < CommonSize {
			return formatError(ErrCorrupt, start, "corrupt block at offset %d: record at offset %d runs past the end of the block", start, recOff)
		}
		id := payload[pos+offType]
		t := r.idx.types[id]
		if t == nil {
			return formatError(ErrCorrupt, recOff, "unknown event type %d at offset %d", id, recOff)
		}
		if t.Size > len(payload)-pos {
			return formatError(ErrCorrupt, start, "corrupt block at offset %d: %s record at offset %d runs past the end of the block", start, t.Name, recOff)
		}
		pos += t.Size
	}
	if n != count {
		return formatError(ErrCorrupt, start, "corrupt block at offset %d: block holds %d records, its header says %d", start, n, count)
	}
	return nil
}

// endsEarly handles a block whose payload runs past the end of the data. A
// file cut short ends so; but when a whole, valid block lies in what was
// read, the length field is what is wrong: the file is damaged.
func (r *Reader) endsEarly(start int64, h, payload []byte, payloadLen uint32) error {
	rest := make([]byte, 0, len(h)-8+len(payload))
	rest = append(append(rest, h[8:]...), payload...)
	if r.salvage {
		return r.resync(start, rest, formatError(ErrCorrupt, start, "corrupt block at offset %d: its length %d runs past the end of the file", start, payloadLen), true)
	}
	if at, ok := r.findBlock(rest, start+8); ok {
		return formatError(ErrCorrupt, start, "corrupt block at offset %d: its length %d runs past the end of the file, yet a whole block follows at offset %d: the file is damaged, not cut short (--salvage reads on)", start, payloadLen, at)
	}
	r.cutShort(start)
	return nil
}

// maxSummaryBytes caps the length of the end block's JSON payload.
const maxSummaryBytes = MaxHeaderBytes

func (r *Reader) readEnd(start int64, h []byte, payloadLen, count, crc uint32) error {
	if payloadLen > maxSummaryBytes {
		return r.damaged(start, h, nil, formatError(ErrCorrupt, start, "corrupt end block at offset %d: payload length %d exceeds the limit of %d bytes", start, payloadLen, maxSummaryBytes))
	}
	if count != 0 {
		return r.damaged(start, h, nil, formatError(ErrCorrupt, start, "corrupt end block at offset %d: record count is %d, want 0", start, count))
	}
	js, err := r.readFull(nil, int(payloadLen))
	if err != nil {
		if isEOF(err) {
			return r.endsEarly(start, h, js, payloadLen)
		}
		return fmt.Errorf("read end block at offset %d: %w", start, err)
	}
	if sum := crc32.Checksum(js, castagnoli); sum != crc {
		return r.damaged(start, h, js, formatError(ErrCorrupt, start, "corrupt end block at offset %d: payload checksum mismatch (stored %08x, computed %08x)", start, crc, sum))
	}
	var s Summary
	if err := json.Unmarshal(js, &s); err != nil {
		return r.damaged(start, h, js, formatError(ErrCorrupt, start, "corrupt end block at offset %d: bad summary JSON: %v", start, err))
	}
	if err := r.in.peek(); err == nil {
		if !r.salvage {
			return formatError(ErrCorrupt, r.off, "trailing data at offset %d after the end block", r.off)
		}
		at := r.off
		n, err := io.Copy(io.Discard, &r.in)
		if err != nil {
			return fmt.Errorf("read after end block at offset %d: %w", at, err)
		}
		r.off += n
		r.skipped(at, n, formatError(ErrCorrupt, at, "trailing data at offset %d after the end block", at))
	} else if !errors.Is(err, io.EOF) {
		return fmt.Errorf("read after end block at offset %d: %w", r.off, err)
	}
	r.summary = &s
	r.rawSummary = js
	r.done = true
	return nil
}

// zstdErrors reports damaged compressed data as a corrupt trace. A stream cut
// short stays io.ErrUnexpectedEOF, which the Reader treats as truncation.
type zstdErrors struct{ dec *zstd.Decoder }

func (z zstdErrors) Read(p []byte) (int, error) {
	n, err := z.dec.Read(p)
	switch {
	case errors.Is(err, zstd.ErrWindowSizeExceeded):
		// Not damage: the compressor was asked for a larger window.
		err = formatError(ErrTooLarge, -1, "the zstd data asks for a window larger than this reader's limit of %d MiB: decompress it with zstd -d --long=31 and read the .mgt", maxZstdWindow>>20)
	case err != nil && !isEOF(err):
		err = zstdDamage{formatError(ErrCorrupt, -1, "damaged zstd data: %v", err)}
	}
	return n, err
}

// zstdDamage is damage to a compressed trace's zstd stream, rather than to
// the trace it decompresses to: nothing after it can be decompressed, so
// salvage ends the reading there.
type zstdDamage struct{ *FormatError }

// unreadable ends a salvaging Reader at start, where the compressed data
// could no longer be decompressed (err), and reports whether it did.
func (r *Reader) unreadable(start int64, err error) bool {
	var zd zstdDamage
	if !r.salvage || !errors.As(err, &zd) {
		return false
	}
	if r.salv.Unreadable == "" {
		r.salv.Unreadable = fmt.Sprintf("the compressed data could not be read past offset %d (%v)", start, err)
	}
	r.done = true
	return true
}
