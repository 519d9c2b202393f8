// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync/atomic"

	"github.com/magnet-tracer/magnet/internal/prefetch"
)

// WriterOptions tunes a Writer. The zero value is ready to use.
type WriterOptions struct {
	// ByteOrder is the byte order of the file. Nil means the native byte
	// order, which is what the recorder uses; a foreign order exists so
	// that tests can produce a foreign-endian trace.
	ByteOrder binary.ByteOrder
	// BlockSize is the payload size in bytes at which a block is written
	// out. Zero means DefaultBlockSize. A block holds at least one record,
	// so a record larger than BlockSize gets a block of its own.
	BlockSize int
}

// BlockLender is an io.Writer that lends a Writer room to build its blocks
// in, so that a block is not built in a buffer of the Writer's and copied
// into one of the io.Writer's (streamfile.Writer is one: the copy cost a
// recorder a tenth of its CPU time). NewWriter uses it when its io.Writer
// has these methods.
type BlockLender interface {
	io.Writer
	// Room returns room for n bytes after what was written so far, as a
	// slice of length 0 and capacity n at least, or nil when there is
	// none to lend. Nothing may be written in between Room and Commit.
	Room(n int) []byte
	// Commit writes the first n bytes of the room Room returned last. The
	// room is no longer the caller's once Commit is called.
	Commit(n int) error
}

// Writer writes a trace file. It is not safe for concurrent use, except
// for Bytes.
//
// Every block is built in memory and handed to the underlying writer in one
// Write call, so a file cut short by a crash ends in a block that is either
// complete or detectably incomplete.
type Writer struct {
	w         io.Writer
	lender    BlockLender // w, when it lends room for blocks; nil if not
	order     binary.ByteOrder
	swap      bool
	idx       *typeIndex
	blockSize int
	maxSize   int         // largest record size of the dictionary
	sizes     [256]uint32 // record size by type id; 0 = not in the dictionary

	block   []byte // block header room followed by the payload so far; nil between blocks
	lent    bool   // block is room w lent, else it is own
	own     []byte // the Writer's own block buffer
	records uint32 // records in block
	first   uint64 // smallest time_ns in block
	last    uint64 // largest time_ns in block
	fetched int    // block's room up to here was prefetched
	fetchAt int    // prefetch again once block is this long

	fileFirst, fileLast uint64 // time range of the whole file
	anyRecord           bool
	blocks              uint64
	counts              [256]uint64 // records written, by type id

	written atomic.Int64
	err     error // sticky: once a write fails or Close succeeds, every call returns it
}

// NewWriter writes the preamble and the header h to w and returns a Writer
// for the records. It fills in h's Format, Version and Common fields on a
// copy; h itself is not modified. The Writer does not close w.
func NewWriter(w io.Writer, h *Header, opts WriterOptions) (*Writer, error) {
	hdr := *h
	hdr.Format = FormatName
	hdr.Version = Version
	hdr.Common = append([]Field(nil), CommonFields...)
	hdr.Types = append([]EventType(nil), h.Types...)
	if err := hdr.checkBounds(); err != nil {
		return nil, fmt.Errorf("new trace writer: %w", err)
	}
	if err := validateTypes(hdr.Types); err != nil {
		return nil, fmt.Errorf("new trace writer: %w", err)
	}
	if opts.BlockSize < 0 || opts.BlockSize > MaxBlockBytes {
		return nil, fmt.Errorf("new trace writer: block size %d is not between 0 and %d", opts.BlockSize, MaxBlockBytes)
	}
	if opts.BlockSize == 0 {
		opts.BlockSize = DefaultBlockSize
	}
	order := opts.ByteOrder
	if order == nil {
		order = binary.NativeEndian
	}
	js, err := json.Marshal(&hdr)
	if err != nil {
		return nil, fmt.Errorf("new trace writer: encode header: %w", err)
	}
	if len(js) > MaxHeaderBytes {
		return nil, fmt.Errorf("new trace writer: header is %d bytes, more than the limit of %d", len(js), MaxHeaderBytes)
	}

	tw := &Writer{
		w:         w,
		order:     order,
		swap:      isBigEndian(order) != nativeIsBig,
		idx:       newTypeIndex(hdr.Types),
		blockSize: opts.BlockSize,
	}
	for _, t := range hdr.Types {
		tw.maxSize = max(tw.maxSize, t.Size)
		tw.sizes[t.ID] = uint32(t.Size)
	}
	tw.own = make([]byte, 0, blockHeaderSize+min(opts.BlockSize, DefaultBlockSize))
	tw.lender, _ = w.(BlockLender)

	n := int64(preambleSize + len(js))
	buf := make([]byte, preambleSize, n+pad8(n))
	copy(buf[0:8], fileMagic[:])
	order.PutUint32(buf[8:12], endianMark)
	order.PutUint16(buf[12:14], Version)
	order.PutUint16(buf[14:16], 0)
	order.PutUint32(buf[16:20], uint32(len(js)))
	order.PutUint32(buf[20:24], crc32.Checksum(js, castagnoli))
	buf = append(buf, js...)
	buf = append(buf, make([]byte, pad8(n))...)
	if err := tw.writeOut(buf); err != nil {
		return nil, fmt.Errorf("new trace writer: write header: %w", err)
	}
	return tw, nil
}

// Write adds one record to the current block and writes the block out when
// it is full. rec is in native byte order and must be exactly as long as its
// type's Size; the type is the byte at offset 30. Write copies rec.
func (w *Writer) Write(rec []byte) error {
	if w.err != nil {
		return fmt.Errorf("write record: %w", w.err)
	}
	if len(rec) < CommonSize {
		return fmt.Errorf("write record: record is %d bytes, shorter than the %d-byte common header", len(rec), CommonSize)
	}
	id := rec[offType]
	t := w.idx.types[id]
	if t == nil {
		return fmt.Errorf("write record: unknown event type %d", id)
	}
	if len(rec) != t.Size {
		return fmt.Errorf("write record: %s record is %d bytes, want %d", t.Name, len(rec), t.Size)
	}
	if w.records > 0 && len(w.block)-blockHeaderSize+len(rec) > w.blockSize {
		if err := w.Flush(); err != nil {
			return err
		}
	}

	ts := binary.NativeEndian.Uint64(rec[offTime:])
	if w.records == 0 {
		w.first, w.last = ts, ts
		w.startBlock(len(rec))
	}
	w.first, w.last = min(w.first, ts), max(w.last, ts)
	if !w.anyRecord {
		w.fileFirst, w.fileLast, w.anyRecord = ts, ts, true
	}
	w.fileFirst, w.fileLast = min(w.fileFirst, ts), max(w.fileLast, ts)

	start := len(w.block)
	w.block = append(w.block, rec...)
	if w.swap {
		swapRecord(w.block[start:], w.idx.swaps[id])
	}
	w.records++
	w.counts[id]++
	if len(w.block) >= w.fetchAt {
		w.prefetchRoom()
	}

	if len(w.block)-blockHeaderSize >= w.blockSize {
		return w.Flush()
	}
	return nil
}

// Room returns room at the end of the current block, starting one if
// there is none, for a caller that copies records in itself, many at a
// time, and then hands them to Append: a recorder copying records straight
// from the kernel's ring, with no call per record. The room is a slice of
// length 0 and a capacity of at most max bytes; the capacity is below the
// largest record size of the dictionary only when max is. Nothing else
// may be written between Room and Append.
func (w *Writer) Room(max int) ([]byte, error) {
	if w.err != nil {
		return nil, fmt.Errorf("write records: %w", w.err)
	}
	if w.records > 0 && w.blockSize-(len(w.block)-blockHeaderSize) < w.maxSize {
		if err := w.Flush(); err != nil {
			return nil, err
		}
	}
	if w.records == 0 && len(w.block) == 0 {
		w.startBlock(w.blockSize)
	}
	if len(w.block) >= w.fetchAt {
		w.prefetchRoom()
	}
	n := min(max, blockHeaderSize+w.blockSize-len(w.block))
	return w.block[len(w.block) : len(w.block) : len(w.block)+n], nil
}

// Append adds the records the caller put in the room Room returned: recs
// is that room, records laid end to end in native byte order, each exactly
// as long as its type's Size. A record that breaks this is an error, and
// none of recs is added.
func (w *Writer) Append(recs []byte) error {
	if w.err != nil {
		return fmt.Errorf("write records: %w", w.err)
	}
	if len(recs) > 0 {
		if err := w.checkRoom(recs); err != nil {
			return err
		}
	}
	// Count the run as the recorder's drain does, checking each record's
	// size on the way; AppendTallied takes it from there.
	var t Tally
	for off := 0; off < len(recs); {
		if len(recs)-off < CommonSize {
			return badRecords(recs[off:], w.idx)
		}
		id := recs[off+offType]
		size := int(w.sizes[id])
		if size == 0 || len(recs)-off < size {
			return badRecords(recs[off:], w.idx)
		}
		t.Add(id, binary.NativeEndian.Uint64(recs[off+offTime:]))
		off += size
	}
	return w.AppendTallied(recs, &t)
}

// giveBackRoom ends a block that was started for room and got no record:
// a lender's room must not outlive a flush of the file.
func (w *Writer) giveBackRoom() {
	if w.records == 0 {
		w.block, w.lent = nil, false
	}
}

// checkRoom checks that recs (not empty) starts where Room's room did.
func (w *Writer) checkRoom(recs []byte) error {
	start := len(w.block)
	if w.block == nil || cap(w.block)-start < len(recs) || &w.block[:start+1][start] != &recs[0] {
		return errors.New("write records: not the room Room returned")
	}
	return nil
}

// took adds recs, checked and counted by type, to the block: n records
// whose times range from first to last. It swaps them in place into a
// foreign byte order.
func (w *Writer) took(recs []byte, n uint32, first, last uint64) error {
	if w.swap {
		for o := 0; o < len(recs); {
			id := recs[o+offType]
			size := int(w.sizes[id])
			swapRecord(recs[o:o+size], w.idx.swaps[id])
			o += size
		}
	}
	if w.records > 0 {
		first, last = min(first, w.first), max(last, w.last)
	}
	w.first, w.last = first, last
	if !w.anyRecord {
		w.fileFirst, w.fileLast, w.anyRecord = first, last, true
	}
	w.fileFirst, w.fileLast = min(w.fileFirst, first), max(w.fileLast, last)
	w.block = w.block[:len(w.block)+len(recs)]
	w.records += n
	if len(w.block)-blockHeaderSize >= w.blockSize {
		return w.Flush()
	}
	return nil
}

// badRecords says what is wrong with the first record of recs, which
// Append could not take.
func badRecords(recs []byte, idx *typeIndex) error {
	if len(recs) < CommonSize {
		return fmt.Errorf("write records: %d bytes after the last whole record", len(recs))
	}
	t := idx.types[recs[offType]]
	if t == nil {
		return fmt.Errorf("write records: unknown event type %d", recs[offType])
	}
	return fmt.Errorf("write records: %s record cut short", t.Name)
}

// Flush writes the current block out now, if it holds any records. The
// recorder calls it periodically so that a crash loses at most the records
// of the last interval.
func (w *Writer) Flush() error {
	if w.err != nil {
		return fmt.Errorf("flush trace: %w", w.err)
	}
	if w.records == 0 {
		return nil
	}
	payload := w.block[blockHeaderSize:]
	w.putBlockHeader(w.block[:blockHeaderSize], dataMagic, payload, w.records, w.first, w.last)
	var err error
	if w.lent {
		err = w.commit(len(w.block))
	} else {
		err = w.writeOut(w.block)
		w.own = w.block[:0] // it may have grown
	}
	if err != nil {
		return fmt.Errorf("flush trace: %w", err)
	}
	w.blocks++
	w.block, w.lent = nil, false
	w.records = 0
	return nil
}

// prefetchAhead is how far ahead of the records written prefetchRoom
// asks for room, and prefetchStep how often. A lent block lies in the
// file writer's chunk, bigger than the CPU's own cache and cold since it
// was last written out: each line's first store would wait for the line.
// Room looks once per call, so a caller that asks for larger room steps
// further (the recorder's drain: 8 KiB, its runRoom); the reach covers
// twice that, so that room is fetched a room's length before it fills.
var (
	prefetchAhead = 16 << 10
	prefetchStep  = 1 << 10
)

// prefetchRoom asks, ahead of the next records, for the room they will be
// written to, as far as the block's memory goes (a lent block's reaches
// to the end of the lender's chunk).
func (w *Writer) prefetchRoom() {
	n := len(w.block)
	w.fetchAt = n + prefetchStep
	from, to := max(w.fetched, n), min(n+prefetchAhead, cap(w.block))
	if to > from {
		prefetch.Write(w.block[from:to])
		w.fetched = to
	}
}

// startBlock gets the room of a new block whose first record is n bytes:
// a block holds at most BlockSize bytes of records, or its first record
// if that is larger.
func (w *Writer) startBlock(n int) {
	w.fetched, w.fetchAt = 0, 0
	if w.lender != nil {
		if room := w.lender.Room(blockHeaderSize + max(w.blockSize, n)); room != nil {
			w.block, w.lent = room[:blockHeaderSize], true
			return
		}
	}
	w.block, w.lent = w.own[:blockHeaderSize], false
}

// commit writes the block built in the lender's room; a failure is as
// sticky as writeOut's.
func (w *Writer) commit(n int) error {
	if err := w.lender.Commit(n); err != nil {
		w.err = err
		return err
	}
	w.written.Add(int64(n))
	return nil
}

// Close flushes the current block and writes the end block with summary s.
// The Writer fills in the summary's Blocks and Events from what it wrote;
// s itself is not modified and may be nil. Close does not close the
// underlying writer.
func (w *Writer) Close(s *Summary) error {
	if err := w.Flush(); err != nil {
		return fmt.Errorf("close trace: %w", err)
	}
	var sum Summary
	if s != nil {
		sum = *s
	}
	sum.Blocks = w.blocks
	sum.Events = make(map[string]uint64)
	for id, n := range w.counts {
		if n > 0 {
			sum.Events[w.idx.types[id].Name] = n
		}
	}
	js, err := json.Marshal(&sum)
	if err != nil {
		return fmt.Errorf("close trace: encode summary: %w", err)
	}
	buf := make([]byte, blockHeaderSize, blockHeaderSize+len(js))
	buf = append(buf, js...)
	w.putBlockHeader(buf[:blockHeaderSize], endMagic, js, 0, w.fileFirst, w.fileLast)
	if err := w.writeOut(buf); err != nil {
		return fmt.Errorf("close trace: %w", err)
	}
	w.err = errWriterDone
	return nil
}

// Bytes returns the number of bytes written to the underlying writer so
// far. It is safe to call from any goroutine.
func (w *Writer) Bytes() int64 {
	return w.written.Load()
}

func (w *Writer) putBlockHeader(h []byte, magic [4]byte, payload []byte, records uint32, first, last uint64) {
	copy(h[0:4], magic[:])
	w.order.PutUint32(h[4:8], uint32(len(payload)))
	w.order.PutUint32(h[8:12], records)
	w.order.PutUint32(h[12:16], crc32.Checksum(payload, castagnoli))
	w.order.PutUint64(h[16:24], first)
	w.order.PutUint64(h[24:32], last)
}

// writeOut hands buf to the underlying writer in one call. A failure is
// sticky: the file now ends in an incomplete block, and nothing more may be
// appended to it.
func (w *Writer) writeOut(buf []byte) error {
	n, err := w.w.Write(buf)
	w.written.Add(int64(n))
	if err == nil && n != len(buf) {
		err = io.ErrShortWrite
	}
	if err != nil {
		w.err = err
	}
	return err
}

// Buffered returns the number of bytes the next block write will hand to the
// underlying writer: the block header and the records not yet written out, or
// 0 when there are none. A writer that must not run out of space (rotation)
// checks it before each Write or Flush.
func (w *Writer) Buffered() int {
	if w.records == 0 {
		return 0
	}
	return len(w.block)
}
