// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
)

// input is what a Reader reads blocks from: the bytes salvage read ahead
// and gave back, then the buffered file.
type input struct {
	pend []byte
	br   *bufio.Reader
}

func (in *input) Read(p []byte) (int, error) {
	if len(in.pend) > 0 {
		n := copy(p, in.pend)
		in.pend = in.pend[n:]
		return n, nil
	}
	return in.br.Read(p)
}

// peek returns nil when there is more data, io.EOF when there is none.
func (in *input) peek() error {
	if len(in.pend) > 0 {
		return nil
	}
	_, err := in.br.Peek(1)
	return err
}

// Salvage says what a Reader in salvage mode skipped.
type Salvage struct {
	// Regions is the number of damaged stretches skipped, and Bytes their
	// total length.
	Regions int
	Bytes   int64
	// Offset is where the first began and First what was wrong there.
	Offset int64
	First  string
	// Records counts the records returned, so that a caller can compare
	// it with the summary's count, when the end block survived.
	Records uint64
	// Unreadable, in a compressed trace, says where the zstd data itself
	// was damaged: nothing after it could be decompressed, so the reading
	// ended there.
	Unreadable string
}

// SetSalvage makes the Reader read on after damaged data instead of
// stopping with an error: it looks for the next block whose header and
// checksum are valid and goes on from there, counting what it skipped
// (Salvaged). Call it before the first Next. Damage in the header is not
// salvaged: without the dictionary no record can be read.
func (r *Reader) SetSalvage(on bool) {
	r.salvage = on
	if r.chain != nil && r.chain.cur != nil {
		r.chain.cur.salvage = on
	}
}

// Salvaged returns what salvage skipped so far; for a Reader made by
// OpenChain, in all its files.
func (r *Reader) Salvaged() Salvage {
	if r.chain == nil {
		return r.salv
	}
	s := r.chain.salv
	if r.chain.cur != nil { // nil once the chain's last file is read
		add(&s, r.chain.cur.salv)
	}
	return s
}

// salvageWarning says what salvage skipped, or "" when nothing.
func (r *Reader) salvageWarning() string {
	s := r.Salvaged()
	if s.Regions == 0 && s.Unreadable == "" {
		return ""
	}
	var parts []string
	if s.Regions > 0 {
		parts = append(parts, fmt.Sprintf("--salvage skipped %d damaged stretch(es), %d bytes, the first at offset %d (%s)", s.Regions, s.Bytes, s.Offset, s.First))
	}
	if s.Unreadable != "" {
		parts = append(parts, "--salvage stopped: "+s.Unreadable)
	}
	w := strings.Join(parts, "; ")
	if sum := r.Summary(); sum != nil && r.chain == nil {
		var want uint64
		for _, n := range sum.Events {
			want += n
		}
		if want > s.Records {
			w += fmt.Sprintf("; the summary counts %d records, %d were read (%d lost)", want, s.Records, want-s.Records)
		}
	}
	return w
}

func add(s *Salvage, o Salvage) {
	if s.Regions == 0 {
		s.Offset, s.First = o.Offset, o.First
	}
	if s.Unreadable == "" {
		s.Unreadable = o.Unreadable
	}
	s.Regions += o.Regions
	s.Bytes += o.Bytes
	s.Records += o.Records
}

// skipped counts a damaged stretch of n bytes at off.
func (r *Reader) skipped(off, n int64, cause error) {
	if r.salv.Regions == 0 {
		r.salv.Offset, r.salv.First = off, cause.Error()
	}
	r.salv.Regions++
	r.salv.Bytes += n
}

// damaged handles a bad block at start, of which h (its header) and
// payload were read: in salvage mode it skips to the next valid block,
// else it returns err.
func (r *Reader) damaged(start int64, h, payload []byte, err error) error {
	if !r.salvage {
		return err
	}
	rest := make([]byte, 0, len(h)-8+len(payload))
	rest = append(append(rest, h[8:]...), payload...)
	return r.resync(start, rest, err, false)
}

// resync looks for the next valid block after damaged data at start, in
// rest (the bytes already read from start+8 on) and what follows it, and
// gives back to the input everything from that block on. Where none
// follows, the file ends at start: cut short if cutIfNone (the data may
// just be the incomplete last block), else damaged to its end.
func (r *Reader) resync(start int64, rest []byte, cause error, cutIfNone bool) error {
	base := start + 8 // file offset of buf[0]
	buf := rest
	eof := false
	for i := 0; ; {
		j := bytes.Index(buf[i:], blockMagicPrefix)
		if j < 0 {
			i = max(i, len(buf)-len(blockMagicPrefix)+1)
		} else {
			i += j
		}
		if j >= 0 {
			n, need := r.blockAt(buf[i:], base+int64(i))
			if need > 0 && !eof {
				var err error
				if buf, eof, err = r.more(buf, i+need); err != nil {
					return r.unreadableIn(start, base+int64(len(buf)), cause, err)
				}
				continue
			}
			if n > 0 {
				at := base + int64(i)
				r.skipped(start, at-start, cause)
				r.in.pend = append(buf[i:len(buf):len(buf)], r.in.pend...)
				r.off = at
				return nil
			}
			i++
			continue
		}
		if eof {
			break
		}
		// Drop what was scanned, keeping a possible magic's start.
		if i > 1<<20 {
			buf = append([]byte(nil), buf[i:]...)
			base += int64(i)
			i = 0
		}
		var err error
		if buf, eof, err = r.more(buf, len(buf)+readChunk); err != nil {
			return r.unreadableIn(start, base+int64(len(buf)), cause, err)
		}
	}
	if cutIfNone {
		r.cutShort(start)
		return nil
	}
	r.skipped(start, base+int64(len(buf))-start, cause)
	r.cutShort(start)
	return nil
}

// unreadableIn handles a read error at end while resync skips damaged data
// from start: damage to the zstd stream ends a salvaging Reader there, the
// stretch counted as skipped; any other error is returned.
func (r *Reader) unreadableIn(start, end int64, cause, err error) error {
	if !r.unreadable(end, err) {
		return err
	}
	r.skipped(start, end-start, cause)
	return nil
}

// blockMagicPrefix starts both block magics.
var blockMagicPrefix = []byte("MG")

// more reads into buf until it holds n bytes or the data ends.
func (r *Reader) more(buf []byte, n int) ([]byte, bool, error) {
	for len(buf) < n {
		l := len(buf)
		chunk := min(n-l, readChunk)
		buf = growLen(buf, chunk)
		got, err := io.ReadFull(&r.in, buf[l:])
		r.off += int64(got)
		buf = buf[:l+got]
		if isEOF(err) {
			return buf, true, nil
		}
		if err != nil {
			return buf, false, err
		}
	}
	return buf, false, nil
}

// blockAt checks whether b starts with a whole, valid block (file offset
// off) and returns its length. need > 0 says b must hold need bytes to
// tell; both 0 means it is not a block.
func (r *Reader) blockAt(b []byte, off int64) (n, need int) {
	if len(b) < blockHeaderSize {
		return 0, blockHeaderSize
	}
	var magic [4]byte
	copy(magic[:], b)
	l := r.order.Uint32(b[4:8])
	count := r.order.Uint32(b[8:12])
	switch magic {
	case dataMagic:
		first, last := r.order.Uint64(b[16:24]), r.order.Uint64(b[24:32])
		if l > MaxBlockBytes || l < CommonSize || l%8 != 0 || count == 0 || count > l/CommonSize || first > last {
			return 0, 0
		}
	case endMagic:
		if l > maxSummaryBytes || count != 0 {
			return 0, 0
		}
	default:
		return 0, 0
	}
	total := blockHeaderSize + int(l)
	if len(b) < total {
		return 0, total
	}
	payload := b[blockHeaderSize:total]
	if crc32.Checksum(payload, castagnoli) != r.order.Uint32(b[12:16]) {
		return 0, 0
	}
	if magic == dataMagic {
		if r.checkRecords(payload, count, off, off+blockHeaderSize) != nil {
			return 0, 0
		}
	} else if json.Unmarshal(payload, new(Summary)) != nil {
		return 0, 0
	}
	return total, 0
}

// findBlock returns the file offset of the first whole, valid block in buf,
// whose first byte is at file offset base.
func (r *Reader) findBlock(buf []byte, base int64) (int64, bool) {
	for i := 0; ; i++ {
		j := bytes.Index(buf[i:], blockMagicPrefix)
		if j < 0 {
			return 0, false
		}
		i += j
		if n, _ := r.blockAt(buf[i:], base+int64(i)); n > 0 {
			return base + int64(i), true
		}
	}
}
