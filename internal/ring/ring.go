// SPDX-License-Identifier: Apache-2.0

// Package ring reads BPF ring buffers (BPF_MAP_TYPE_RINGBUF) the way a
// recorder that must keep up with millions of records a second wants to:
// records are handed out in place, in the memory the kernel wrote them to,
// without a copy, a lock or a system call each; the consumer position the
// kernel reads on every reservation is written back once per batch, not
// once per record; and waiting is one epoll over every ring, only when all
// of them are empty.
//
// The layout is the kernel's (kernel/bpf/ringbuf.c): a consumer page the
// reader may write, then a producer page and the data pages mapped twice in
// a row, so that a record that wraps around the end is contiguous. Each
// record starts with an 8-byte header whose first word is its length, with
// a busy bit while the producer still writes it and a discard bit when it
// gave it up; records are padded to 8 bytes.
package ring

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/prefetch"
)

const (
	hdrSize    = 8
	busyBit    = 1 << 31
	discardBit = 1 << 30
)

// State says what Peek found at the head of a ring.
type State int

const (
	// Record means Peek returned a committed record.
	Record State = iota
	// Empty means the ring holds nothing more right now.
	Empty
	// Busy means the next record is reserved but not yet committed: its
	// producer is still writing it, and nothing after it can be read.
	Busy
)

// ErrCorrupt is returned when a ring's positions or headers make no sense,
// which only a bug (here or in the kernel) can cause.
var ErrCorrupt = errors.New("ring buffer positions are inconsistent")

// Reader reads one ring. It is not safe for concurrent use, except for
// Available.
type Reader struct {
	fd       int
	cons     *uintptr // in the consumer page: what the kernel may reuse
	prod     *uintptr // in the producer page: what the kernel has reserved
	data     []byte   // 2 × size: the data pages, mapped twice
	mask     uintptr
	pos      uintptr // next record to read (ahead of *cons until Commit)
	prodSeen uintptr // *prod as last loaded
	peeked   int     // length of the record Peek returned, 0 if none
	fetched  uintptr // data up to here was prefetched
	fetchAt  uintptr // prefetch again once pos reaches this
	unmap    func() error
}

// NewReader maps the ring buffer m for reading. Close unmaps it; the caller
// must call it. m must stay open while the Reader is used.
func NewReader(m *ebpf.Map) (*Reader, error) {
	if m.Type() != ebpf.RingBuf {
		return nil, fmt.Errorf("map %s is a %s, not a ring buffer", m, m.Type())
	}
	size := int(m.MaxEntries())
	if size <= 0 || size&(size-1) != 0 {
		return nil, fmt.Errorf("ring buffer size %d is not a power of two", size)
	}
	page := os.Getpagesize()
	cons, err := unix.Mmap(m.FD(), 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map consumer page: %w", err)
	}
	prod, err := unix.Mmap(m.FD(), int64(page), page+2*size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		_ = unix.Munmap(cons)
		return nil, fmt.Errorf("map data pages: %w", err)
	}
	r := newReader((*uintptr)(unsafe.Pointer(&cons[0])), (*uintptr)(unsafe.Pointer(&prod[0])), prod[page:], size)
	r.fd = m.FD()
	r.unmap = func() error { return errors.Join(unix.Munmap(prod), unix.Munmap(cons)) }
	return r, nil
}

func newReader(cons, prod *uintptr, data []byte, size int) *Reader {
	r := &Reader{fd: -1, cons: cons, prod: prod, data: data, mask: uintptr(size - 1)}
	r.pos = atomic.LoadUintptr(cons)
	r.prodSeen = r.pos
	return r
}

// Close unmaps the ring. Records Peek returned must not be used after it.
func (r *Reader) Close() error {
	if r.unmap == nil {
		return nil
	}
	err := r.unmap()
	r.unmap, r.data = nil, nil
	return err
}

// Size is the size of the ring's data area in bytes.
func (r *Reader) Size() int {
	return int(r.mask) + 1
}

// Available is the number of bytes the kernel has reserved that the reader
// has not yet given back (committed or not, read or not). It is safe to call
// from any goroutine.
func (r *Reader) Available() int {
	return int(atomic.LoadUintptr(r.prod) - atomic.LoadUintptr(r.cons))
}

// Pending says whether the kernel has reserved anything this Reader has not
// read yet: one load, cheap enough to ask before every record of another
// ring.
func (r *Reader) Pending() bool {
	return atomic.LoadUintptr(r.prod) != r.pos
}

// Peek returns the record at the head of the ring without consuming it. The
// slice points into the ring: it stays valid, and unchanged, until the
// record is consumed by Advance and then Commit.
func (r *Reader) Peek() ([]byte, State, error) {
	for {
		if r.pos == r.prodSeen {
			r.prodSeen = atomic.LoadUintptr(r.prod)
			if r.pos == r.prodSeen {
				return nil, Empty, nil
			}
		}
		if r.prodSeen-r.pos < hdrSize {
			return nil, Empty, fmt.Errorf("%w: %d bytes after the consumer position", ErrCorrupt, r.prodSeen-r.pos)
		}
		start := r.pos & r.mask
		n, step, st := header(r.data[start:])
		if st == Busy {
			return nil, Busy, nil
		}
		total := uintptr(step)
		if r.prodSeen-r.pos < total || n > r.Size() {
			return nil, Empty, fmt.Errorf("%w: a %d-byte record with %d bytes reserved", ErrCorrupt, n, r.prodSeen-r.pos)
		}
		if st == Empty {
			r.pos += total
			continue
		}
		r.peeked = n
		if r.pos >= r.fetchAt {
			r.prefetch()
		}
		data := start + hdrSize
		return r.data[data : data+uintptr(n) : data+uintptr(n)], Record, nil
	}
}

// Unread returns what the producer has reserved past the reader, as one
// slice of ring memory: records framed as the kernel frames them (Frame
// reads a frame), committed or not. The data pages are mapped twice in a
// row, so the slice is contiguous even where the ring wraps. It lets a
// caller that consumes records by the run walk them with no call per
// record; Skip then consumes what it took. The slice stays valid until the
// bytes are committed.
func (r *Reader) Unread() []byte {
	r.prodSeen = atomic.LoadUintptr(r.prod)
	start := r.pos & r.mask
	n := min(r.prodSeen-r.pos, r.mask+1)
	return r.data[start : start+n : start+n]
}

// Frame reads the frame at the start of b, a slice of Unread: the length
// of the record's data (after the 8-byte frame header), the bytes the
// whole frame takes (header and padding included), and whether it is
// committed (Record), still being written (Busy) or discarded (Empty: a
// frame to step over). A frame that does not fit in b, or a b shorter
// than a frame header, reads as Busy: there is nothing to take from it
// now, and Peek tells what is wrong, if anything.
func Frame(b []byte) (n, step int, st State) {
	if len(b) < hdrSize {
		return 0, 0, Busy
	}
	if n, step, st = header(b); step > len(b) {
		return 0, 0, Busy
	}
	return n, step, st
}

// header decodes the frame header at the start of b (at least hdrSize
// bytes): the record's length, the frame's size, and Record, Busy or
// Empty (discarded), as Frame says; whether the frame fits is the
// caller's to check.
func header(b []byte) (n, step int, st State) {
	// The atomic load orders the record's bytes after the kernel's xchg
	// that cleared the busy bit.
	hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&b[0])))
	if hdr&busyBit != 0 {
		return 0, 0, Busy
	}
	n = int(hdr &^ discardBit)
	step = hdrSize + (n+7)&^7
	if hdr&discardBit != 0 {
		return n, step, Empty
	}
	return n, step, Record
}

// FrameHeaderSize is the size of the header before each record's data.
const FrameHeaderSize = hdrSize

// Skip consumes the first n bytes of what Unread returned, which must be
// whole frames, committed or discarded. The kernel may reuse their space
// once Commit has run.
func (r *Reader) Skip(n int) {
	if n == 0 {
		return
	}
	r.pos += uintptr(n)
	r.peeked = 0
	if r.pos >= r.fetchAt {
		r.prefetch()
	}
}

// prefetchAhead is how far ahead of the reader prefetch asks for the
// ring's data, and prefetchStep how often: a record here is one the
// producer's CPU has just written, so the reader's first touch of each
// line is a miss to that CPU's cache, ~100 ns that a read a few hundred
// records ahead overlaps with the work on the records before it. One call
// per step, not per record, because a call costs about as much as a
// handful of records.
var (
	prefetchAhead uintptr = 4 << 10
	prefetchStep  uintptr = 1 << 10
)

// prefetch asks for the ring's data from the reader to prefetchAhead
// bytes past it, as far as the producer has reserved it, and not what an
// earlier call asked for. The data pages are mapped twice in a row, so the
// range is contiguous even where the ring wraps.
func (r *Reader) prefetch() {
	r.fetchAt = r.pos + prefetchStep
	from := max(r.fetched, r.pos)
	to := min(r.pos+min(prefetchAhead, r.mask+1), r.prodSeen)
	if to <= from {
		return
	}
	start := from & r.mask
	prefetch.Read(r.data[start : start+(to-from)])
	r.fetched = to
}

// Advance consumes the record Peek last returned. The kernel may reuse its
// space once Commit has run.
func (r *Reader) Advance() {
	if r.peeked == 0 {
		return
	}
	r.pos += uintptr(hdrSize + (r.peeked+7)&^7)
	r.peeked = 0
}

// Commit gives the space of every consumed record back to the kernel.
func (r *Reader) Commit() {
	if atomic.LoadUintptr(r.cons) != r.pos {
		atomic.StoreUintptr(r.cons, r.pos)
	}
}

// Poller waits for any of several rings to be woken up by its producer.
//
// The rings are gathered in an epoll set whose own descriptor waits in Go's
// network poller: a waiting recorder parks its goroutine instead of holding
// a thread in epoll_wait, which the runtime would answer by watching that
// thread every 20 µs for as long as the recording lasts.
type Poller struct {
	file   *os.File // the epoll set
	conn   syscall.RawConn
	events []unix.EpollEvent
	woken  atomic.Bool // Wake was called: no Wait waits any more
}

// NewPoller watches the rings' wake-ups. Close releases it; the caller
// must call it.
func NewPoller(rs ...*Reader) (*Poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("create epoll: %w", err)
	}
	for _, r := range rs {
		// Edge-triggered: a ring reports the producer's wake-ups, not
		// that it holds data, which it nearly always does while traffic
		// flows. Waiting for the wake-up (a ring half full, for
		// magnet) lets the reader take records by the thousand.
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(r.fd)}
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, r.fd, &ev); err != nil {
			unix.Close(epfd)
			return nil, fmt.Errorf("watch ring buffer: %w", err)
		}
	}
	// Non-blocking, so that os.NewFile hands it to the network poller.
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("watch ring buffers: %w", err)
	}
	p := &Poller{file: os.NewFile(uintptr(epfd), "ring-poller"), events: make([]unix.EpollEvent, len(rs))}
	if p.conn, err = p.file.SyscallConn(); err != nil {
		p.file.Close()
		return nil, fmt.Errorf("watch ring buffers: %w", err)
	}
	return p, nil
}

// Wait returns once a ring's producer has woken it up since the last Wait
// (or, the first time, if a ring holds data), or after timeout at most.
// A ring may hold records without having been woken up: callers read
// until the rings are empty, then wait.
func (p *Poller) Wait(timeout time.Duration) error {
	if err := p.file.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return fmt.Errorf("wait for ring buffers: %w", err)
	}
	// After the deadline is set: a Wake that this does not see sets its
	// past deadline after this one, and the read below returns at once.
	if p.woken.Load() {
		return nil
	}
	var werr error
	err := p.conn.Read(func(fd uintptr) bool {
		n, err := p.poll(fd)
		if err != nil && !errors.Is(err, unix.EINTR) {
			werr = err
			return true
		}
		return n > 0
	})
	if err == nil {
		err = werr
	}
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("wait for ring buffers: %w", err)
	}
	return nil
}

// Wake ends the Wait under way, if any, and makes every later Wait
// return at once: for a reader that has to stop waiting for the rings
// because something else ended its work (the recorded command exited, the
// user interrupted it). Without it a recorder noticed only at the end of
// its wait, up to a flush interval later. Any goroutine may call it.
func (p *Poller) Wake() {
	p.woken.Store(true)
	// A deadline in the past makes the parked read return.
	_ = p.file.SetReadDeadline(time.Unix(1, 0))
}

// poll asks the epoll set fd, without waiting, which rings were woken up.
//
// A raw system call: it never blocks, and an ordinary one tells the Go
// runtime it is entering a system call, which wakes its monitor thread
// (sysmon) when every P was idle, to poll every 20 µs for the next
// millisecond and more. A recorder that sleeps between wake-ups made that
// happen at each one: on the CI VM sysmon took a quarter of the recorder's
// CPU time (2300 sleeps in a 3 s flood, 37 ms of CPU).
func (p *Poller) poll(fd uintptr) (int, error) {
	r, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, fd, uintptr(unsafe.Pointer(&p.events[0])), uintptr(len(p.events)), 0, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}

// Close releases the poller.
func (p *Poller) Close() error {
	return p.file.Close()
}
