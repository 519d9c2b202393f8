// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/bits"
)

// Layout constants of the file. docs/FORMAT.md is the reference.
const (
	preambleSize    = 24
	blockHeaderSize = 32
	endianMark      = 0x01234567

	// MaxHeaderBytes caps the length of the JSON header a Reader accepts.
	MaxHeaderBytes = 16 << 20
	// MaxBlockBytes caps the payload length of a block a Reader accepts,
	// and the BlockSize a Writer accepts.
	MaxBlockBytes = 64 << 20
	// DefaultBlockSize is the payload size of a block when
	// WriterOptions.BlockSize is zero.
	DefaultBlockSize = 64 << 10
)

var (
	fileMagic     = [8]byte{'M', 'G', 'T', 'R', 'A', 'C', 'E', 0}
	dataMagic     = [4]byte{'M', 'G', 'B', 'K'}
	endMagic      = [4]byte{'M', 'G', 'E', 'N'}
	castagnoli    = crc32.MakeTable(crc32.Castagnoli)
	nativeIsBig   = isBigEndian(binary.NativeEndian)
	errWriterDone = errors.New("writer is closed")
)

// Sentinel errors, for errors.Is. Every error a Reader returns about the
// content of a file is a *FormatError wrapping one of them.
var (
	// ErrNotTrace means the data is not a magnet trace at all.
	ErrNotTrace = errors.New("not a magnet trace")
	// ErrVersion means the file is a magnet trace of a format version
	// this package does not know.
	ErrVersion = errors.New("unsupported trace format version")
	// ErrCorrupt means the file is a magnet trace whose content is damaged.
	ErrCorrupt = errors.New("corrupt trace")
	// ErrTooLarge means the file asks for more than a Reader's limits
	// allow, such as a compressed trace's zstd window.
	ErrTooLarge = errors.New("trace exceeds a reader limit")
)

// FormatError reports malformed trace data at a file offset.
type FormatError struct {
	Offset int64 // file offset of the bad data
	Kind   error // ErrNotTrace, ErrVersion, ErrCorrupt or ErrTooLarge
	msg    string
}

func (e *FormatError) Error() string { return e.msg }

// Unwrap returns e.Kind, so that errors.Is(err, ErrCorrupt) works.
func (e *FormatError) Unwrap() error { return e.Kind }

func formatError(kind error, off int64, format string, args ...any) *FormatError {
	return &FormatError{Offset: off, Kind: kind, msg: fmt.Sprintf(format, args...)}
}

func isBigEndian(order binary.ByteOrder) bool {
	var b [2]byte
	order.PutUint16(b[:], 0x0102)
	return b[0] == 0x01
}

// swapOp is one integer field whose bytes are reversed to change byte order.
type swapOp struct {
	offset, size int
}

// typeIndex finds a dictionary entry by the type byte of a record in
// constant time, along with the integer fields to swap for that type.
type typeIndex struct {
	types [256]*EventType
	swaps [256][]swapOp
}

// newTypeIndex indexes types, which must have passed validateTypes. The
// index points into types.
func newTypeIndex(types []EventType) *typeIndex {
	idx := &typeIndex{}
	for i := range types {
		t := &types[i]
		idx.types[t.ID] = t
		var ops []swapOp
		for _, f := range CommonFields {
			if f.isInteger() && f.Size > 1 {
				ops = append(ops, swapOp{f.Offset, f.Size})
			}
		}
		for _, f := range t.Fields {
			if f.isInteger() && f.Size > 1 {
				ops = append(ops, swapOp{f.Offset, f.Size})
			}
		}
		idx.swaps[t.ID] = ops
	}
	return idx
}

// swapRecord reverses the byte order of every integer field of rec in place.
func swapRecord(rec []byte, ops []swapOp) {
	for _, op := range ops {
		b := rec[op.offset : op.offset+op.size]
		switch op.size {
		case 2:
			b[0], b[1] = b[1], b[0]
		case 4:
			binary.LittleEndian.PutUint32(b, bits.ReverseBytes32(binary.LittleEndian.Uint32(b)))
		case 8:
			binary.LittleEndian.PutUint64(b, bits.ReverseBytes64(binary.LittleEndian.Uint64(b)))
		}
	}
}

// pad8 returns the number of zero bytes that follow n bytes to reach a
// multiple of 8.
func pad8(n int64) int64 {
	return (8 - n%8) % 8
}

// zstdMagic starts every zstd frame (RFC 8878): the archive stores traces
// compressed, and every reader takes them as they are.
var zstdMagic = [4]byte{0x28, 0xb5, 0x2f, 0xfd}

// maxZstdWindow caps the memory a compressed trace can make the decoder
// take: magnet writes with a window far below it.
const maxZstdWindow = 64 << 20
