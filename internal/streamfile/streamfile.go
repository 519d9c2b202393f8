// SPDX-License-Identifier: Apache-2.0

// Package streamfile writes a file the way a recorder writes a trace: once,
// front to back, for as long as the recording lasts, never reading it back.
//
// A write(2) can wait for the disk, the journal or free memory: on the
// shared CI VM single 64 KiB writes took up to 111 ms while other work wrote
// too, and a recorder that waited that long in its drain loop let a small
// ring overflow. So by default a Writer copies what it is given into a
// queue of 4 MiB chunks and a goroutine of its own writes them: the caller
// waits only when the whole queue is behind.
//
// Written through the page cache as usual, such a file also grows the cache
// by everything written, and each write copies into pages the kernel has
// just taken from its free lists. On a virtual machine whose memory the
// host backs lazily (this project's CI VM), the first touch of a never-used
// page traps to the host: it was half of a recorder's CPU time while the
// VM's memory was fresh (perf: copy_folio_from_iter_atomic). A Writer
// therefore drops from the page cache what the kernel's flusher has written
// back (posix_fadvise DONTNEED), once it is older than the flusher's expiry
// (vm.dirty_expire_centisecs + vm.dirty_writeback_centisecs): the cache holds
// at most that much of the file, and later writes reuse the pages released.
// It does not start the write-back itself (sync_file_range): that moved the
// flusher's work into the recorder, which then cost 10-17 ns more per event
// (measured, the two recording the same transfers).
//
// With Options.Direct, a Writer that has a goroutine goes around the page
// cache altogether where the file system allows it (O_DIRECT): the kernel
// takes the data from the chunk itself, a few pages of memory used again and
// again, instead of copying it into page-cache pages that are new to the VM
// each time. On the CI VM a buffered write of fresh pages cost 0.8-1 ns a
// byte of system time (dd, 400 MB), a direct one 0.1: for a recorder's
// 40-byte events, some 30 ns an event (perf: half the recorder's samples
// were copy_folio_from_iter_atomic). Direct writes must start and end on
// the file system's alignment, so a chunk handed over early (Flush, Close)
// is written as its aligned part, directly, and its tail through the page
// cache; the next chunk starts with that tail again and writes over it
// directly, which puts the tail's page out of the cache.
package streamfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// markEvery is how many bytes are written between two marks of the time
// a file offset was written: the granularity of what is dropped.
const markEvery = 4 << 20

// dropAlign aligns the ranges dropped: the page cache holds a file in folios
// of up to 2 MiB (ext4 gives large folios to large writes), naturally
// aligned, and a folio that sticks out of a range is not dropped, so a
// boundary between two drops must not cut one.
const dropAlign = 2 << 20

// flusherDelay is how long after a write its pages are dropped: the
// kernel's flusher writes back pages dirty for longer than
// vm.dirty_expire_centisecs, looking every vm.dirty_writeback_centisecs;
// dropping a page still dirty would make this writer write it back itself.
// A margin of 5 s on top.
func flusherDelay() time.Duration {
	read := func(name string, def int) time.Duration {
		b, err := os.ReadFile("/proc/sys/vm/" + name)
		if err != nil {
			return time.Duration(def) * 10 * time.Millisecond
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || n < 0 {
			return time.Duration(def) * 10 * time.Millisecond
		}
		return time.Duration(n) * 10 * time.Millisecond
	}
	return read("dirty_expire_centisecs", 3000) + read("dirty_writeback_centisecs", 500) + 5*time.Second
}

// DefaultQueue is how many bytes a Writer holds that its goroutine has not
// yet written: about a second of a recorder's output at a million events a
// second, which rides out any disk stall seen here.
const DefaultQueue = 64 << 20

// chunkSize is the unit of the queue and of the writes to the file. Each
// write is a system call, and a system call made while the rest of the
// process sleeps wakes the Go runtime's monitor thread, which then polls
// every 20 µs until its idle count grows again: 4 MiB chunks rather than
// 1 MiB halved its wake-ups and CPU time in a recorder of a loopback flood
// (1180 wake-ups in 3 s instead of 2690, 19 ms of CPU instead of 42).
const chunkSize = 4 << 20

// ErrClosed is returned by a Writer's methods after Close.
var ErrClosed = errors.New("stream file closed")

// Options tunes a Writer. The zero value is ready to use.
type Options struct {
	// DropAfter is how long after a write its pages leave the page cache;
	// 0 means after the kernel's flusher wrote them back, a negative
	// value never.
	DropAfter time.Duration
	// Queue is how many bytes may wait for the writer goroutine; 0 means
	// DefaultQueue, a negative value writes in the caller's Write, with
	// no goroutine (what a caller that must know what reached the file
	// before each call returns wants).
	Queue int
	// Direct writes a regular file around the page cache (O_DIRECT) when
	// its file system says it can (statx STATX_DIOALIGN, Linux 6.1) and f
	// is at an aligned offset, and through the cache otherwise. Only with
	// a queue. The Writer opens f's file a second time (/proc/self/fd) for
	// them; f's offset stays where it was (direct writes say where they
	// go), and f must not be written to other than through the Writer
	// until Close.
	Direct bool
	// Prefault is how many bytes of the queue's chunks New allocates and
	// touches at once (rounded up to whole chunks, at most the queue),
	// rather than on first use: each page of a new chunk otherwise costs
	// a page fault in the caller's Write, the first time it is filled,
	// which a recorder that starts its drain right after pays while its
	// events wait (a few hundred faults in the first seconds of a flood
	// on the CI VM, 2-5 % of the recorder's samples). The memory is the
	// process's from then on, as the chunks are once used.
	Prefault int
}

// Writer writes to a file front to back, by default from a goroutine of its
// own, and gives the pages of a regular file back behind it. It is not safe
// for concurrent use. The caller must Close it (which waits for what is
// queued) before closing the file.
type Writer struct {
	// The caller's side.
	chunk        []byte      // being filled; nil when none
	carry        []byte      // direct: the unaligned tail of the chunk last handed over, which the next chunk starts with
	carryWritten bool        // the goroutine writes carry with the chunk it ends (a flush's)
	reused       int         // bytes at the start of chunk that came from carry and are written already
	full         chan []byte // to the writer goroutine; nil when writing in Write
	free         chan []byte // written chunks, back from the goroutine
	chunks       int         // chunks allocated
	max          int         // chunks allowed
	done         chan struct{}
	closed       bool

	mu  sync.Mutex
	err error // the first write error, sticky

	// The file's side: the writer goroutine's, or Write's without one.
	f         *os.File
	fd        int
	off       int64 // where the next write lands
	dropped   int64 // dropped from the page cache up to here
	marks     []mark
	dropAfter time.Duration
	drops     bool // false for anything but a regular file, or once a drop failed
	align     int64
	now       func() time.Time
	drop      func(fd int, off, n int64) error
	// direct is the alignment of direct writes (offsets, lengths and
	// memory), 0 when writes go through the page cache. The caller's side
	// reads it too: it never changes after New.
	direct   int
	directFD int // f's file opened again with O_DIRECT; -1 if none
	// refused says the file system refused a direct write after all: the
	// goroutine goes on writing the chunks as they come, overlaps
	// included, through the page cache.
	refused bool
}

// mark is when the file reached an offset.
type mark struct {
	off int64
	at  time.Time
}

func fadviseDontNeed(fd int, off, n int64) error {
	return unix.Fadvise(fd, off, n, unix.FADV_DONTNEED)
}

// New returns a Writer that appends to f from its current offset. For
// anything but a regular file (a pipe, a terminal) it drops nothing. The
// caller still owns f, and closes it after the Writer.
func New(f *os.File, opts Options) *Writer {
	w := &Writer{f: f, fd: int(f.Fd()), directFD: -1, dropAfter: opts.DropAfter, align: dropAlign, now: time.Now, drop: fadviseDontNeed}
	if w.dropAfter == 0 {
		w.dropAfter = flusherDelay()
	}
	var st unix.Stat_t
	if err := unix.Fstat(w.fd, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
		if off, err := f.Seek(0, io.SeekCurrent); err == nil {
			w.off, w.dropped = off, off
			if opts.Queue >= 0 && opts.Direct {
				w.directFD, w.direct = openDirect(f, off)
			}
			// Direct writes leave nothing in the page cache to drop.
			w.drops = w.dropAfter > 0 && w.direct == 0
		}
	}
	if opts.Queue >= 0 {
		queue := opts.Queue
		if queue == 0 {
			queue = DefaultQueue
		}
		w.max = max(2, queue/chunkSize)
		w.full = make(chan []byte, w.max)
		w.free = make(chan []byte, w.max)
		w.done = make(chan struct{})
		for range min(w.max, (opts.Prefault+chunkSize-1)/chunkSize) {
			w.chunks++
			w.free <- prefault(w.newChunk(true))
		}
		go w.run()
	}
	return w
}

// Write queues p for the file (or, with no queue, writes it). It returns
// the error of an earlier write, if one failed: what follows it would not
// be where the reader expects it.
func (w *Writer) Write(p []byte) (int, error) {
	if w.closed {
		return 0, ErrClosed
	}
	if err := w.loadErr(); err != nil {
		return 0, err
	}
	if w.full == nil {
		return w.write(p)
	}
	n := len(p)
	for len(p) > 0 {
		if w.chunk == nil {
			w.chunk = w.getChunk()
		}
		c := copy(w.chunk[len(w.chunk):cap(w.chunk)], p)
		w.chunk = w.chunk[:len(w.chunk)+c]
		p = p[c:]
		if len(w.chunk) == cap(w.chunk) {
			w.handOver(true)
		}
	}
	return n, nil
}

// handOver sends the chunk being filled to the writer goroutine. With
// direct writes, a chunk handed over before it is full ends in a tail that
// is not aligned, which the next chunk starts with: for a flush the
// goroutine writes the tail through the page cache now and the next chunk
// writes it again directly; otherwise only the next chunk writes it.
func (w *Writer) handOver(flush bool) {
	c := w.chunk
	if w.direct > 0 {
		aligned := len(c) &^ (w.direct - 1)
		w.carry = append(w.carry[:0], c[aligned:]...)
		w.carryWritten = flush
		if !flush {
			c = c[:aligned]
		}
	}
	w.full <- c
	w.chunk = nil
}

// Room lends room for n bytes after what was written so far, in the chunk
// being filled (trace.Writer builds its blocks there: see
// trace.BlockLender); Commit writes them. It returns nil without a queue,
// or when n is more than a chunk holds.
func (w *Writer) Room(n int) []byte {
	if w.full == nil || w.closed || n > chunkSize-max(w.direct, 1) {
		return nil
	}
	if w.chunk != nil && cap(w.chunk)-len(w.chunk) < n {
		w.handOver(false)
	}
	if w.chunk == nil {
		w.chunk = w.getChunk()
	}
	return w.chunk[len(w.chunk):len(w.chunk):cap(w.chunk)]
}

// Commit queues the first n bytes of the room Room lent. Like Write, it
// returns the error of an earlier write, if one failed.
func (w *Writer) Commit(n int) error {
	if w.closed {
		return ErrClosed
	}
	if n < 0 || w.chunk == nil || n > cap(w.chunk)-len(w.chunk) {
		return errors.New("stream file: commit of more than the room lent")
	}
	w.chunk = w.chunk[:len(w.chunk)+n]
	if len(w.chunk) == cap(w.chunk) {
		w.handOver(true)
	}
	return w.loadErr()
}

// getChunk returns an empty chunk: a written one, a new one while fewer
// than the queue's worth exist, or else the next one written (the only
// wait: the whole queue is behind).
func (w *Writer) getChunk() []byte {
	var c []byte
	select {
	case c = <-w.free:
	default:
		if w.chunks < w.max {
			w.chunks++
			c = w.newChunk(false)
		} else {
			c = <-w.free
		}
	}
	c = append(c[:0], w.carry...)
	w.reused = 0
	if w.carryWritten {
		w.reused = len(w.carry)
	}
	w.carry = w.carry[:0]
	return c
}

// hugePage is the size of a transparent huge page with 4 KiB pages
// (x86-64, and arm64's usual granule).
const hugePage = 2 << 20

// newChunk allocates an empty chunk. A chunk that is written directly and
// made now, to be prefaulted (huge), is also asked to be backed by
// transparent huge pages (MADV_HUGEPAGE, which takes effect where THP is
// "always" or "madvise"; elsewhere it is harmless): a direct write pins the
// pages it writes from, one by one for 4 KiB pages (gup_fast_fallback was a
// third of the writer's system time, 4 % of a recorder's samples in a
// 64-byte flood) and once per 2 MiB for a huge page: a 4 MiB direct write
// here took 94-114 µs of CPU from 4 KiB pages and 37-40 µs from huge pages.
// The chunk then starts at a 2 MiB boundary, in an allocation 2 MiB larger,
// whose rest it never touches. Chunks made later, while the caller fills
// them, do not ask: the first touch of a huge page may compact memory
// first (THP's defrag setting), a stall the caller (a recorder's drain)
// must not take.
func (w *Writer) newChunk(huge bool) []byte {
	if w.direct == 0 || !huge {
		return alignedChunk(max(w.direct, 1))
	}
	c := alignedChunk(max(w.direct, hugePage))
	// Best effort: without huge pages, the writes pin 4 KiB pages as
	// before.
	_ = unix.Madvise(c[:cap(c)], unix.MADV_HUGEPAGE)
	return c
}

// alignedChunk allocates an empty chunk whose memory starts at a multiple
// of align, as direct writes want it.
func alignedChunk(align int) []byte {
	b := make([]byte, chunkSize+align-1)
	skip := (align - int(uintptr(unsafe.Pointer(&b[0])))%align) % align
	return b[skip : skip : skip+chunkSize]
}

// prefault makes every page of chunk c's memory present and written to,
// so that filling it later takes no page fault: in one system call where
// the kernel offers it (MADV_POPULATE_WRITE, Linux 5.14), else page by
// page.
func prefault(c []byte) []byte {
	mem := c[:cap(c)]
	page := os.Getpagesize()
	start := (page - int(uintptr(unsafe.Pointer(&mem[0])))%page) % page
	end := start + (len(mem)-start)/page*page
	if start < end && unix.Madvise(mem[start:end], unix.MADV_POPULATE_WRITE) == nil {
		// Left: the pages the chunk shares with its neighbours.
		mem[0], mem[len(mem)-1] = 0, 0
		return c
	}
	for i := 0; i < len(mem); i += page {
		mem[i] = 0
	}
	mem[len(mem)-1] = 0
	return c
}

// Flush hands what was queued so far to the writer goroutine, without
// waiting for it: the file has it moments later.
func (w *Writer) Flush() error {
	if w.closed {
		return ErrClosed
	}
	if w.full != nil && len(w.chunk) > w.reused {
		w.handOver(true)
	}
	return w.loadErr()
}

// Close writes what is queued, waits for it and stops the goroutine; it
// returns the first write error. It does not close the file. Calling it
// again returns nil.
func (w *Writer) Close() error {
	if w.closed {
		return nil
	}
	err := w.Flush()
	w.closed = true
	if w.full != nil {
		close(w.full)
		<-w.done
	}
	if w.directFD >= 0 {
		if cerr := unix.Close(w.directFD); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return err
	}
	return w.loadErr()
}

func (w *Writer) loadErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// run is the writer goroutine. After a failure it writes nothing more, but
// keeps handing chunks back so that Write never waits for it in vain.
func (w *Writer) run() {
	defer close(w.done)
	for c := range w.full {
		if w.loadErr() == nil {
			write := w.write
			if w.direct > 0 {
				write = w.writeDirect
			}
			if _, err := write(c); err != nil {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
			}
		}
		w.free <- c
	}
}

// write writes p to the file, marks the time every markEvery bytes and
// drops what was written long enough ago. A failed drop is not the caller's
// concern (the data is written either way): it turns drops off.
func (w *Writer) write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.off += int64(n)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	if w.drops {
		w.dropOld()
	}
	return n, err
}

// writeDirect writes chunk p, which starts at the aligned offset w.off:
// its aligned part directly, and the rest, only in a chunk handed over
// early, through the page cache. w.off moves past the aligned part only:
// the next chunk starts with the rest. A file system that refuses a direct
// write after all gets this and every later chunk through the page cache.
func (w *Writer) writeDirect(p []byte) (int, error) {
	aligned := len(p) &^ (w.direct - 1)
	if w.refused {
		if err := w.pwrite(w.fd, p, w.off); err != nil {
			return 0, err
		}
		w.off += int64(aligned)
		return len(p), nil
	}
	if err := w.pwrite(w.directFD, p[:aligned], w.off); err != nil {
		if !errors.Is(err, unix.EINVAL) {
			return 0, err
		}
		w.refused = true
		return w.writeDirect(p)
	}
	w.off += int64(aligned)
	if err := w.pwrite(w.fd, p[aligned:], w.off); err != nil {
		return aligned, err
	}
	return len(p), nil
}

// pwrite writes all of p at off of fd, one of f's descriptors.
func (w *Writer) pwrite(fd int, p []byte, off int64) error {
	for len(p) > 0 {
		n, err := unix.Pwrite(fd, p, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "write", Path: w.f.Name(), Err: err}
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

// openDirect opens f's file a second time, for direct writes, and returns
// the descriptor and the writes' alignment, or -1 and 0 when the file
// system does not offer them, the offset off is not aligned, or the
// alignment does not divide a chunk. The second descriptor leaves f's own
// flags alone, and takes the tails of early chunks through the page cache
// without a system call to switch O_DIRECT off and on.
func openDirect(f *os.File, off int64) (int, int) {
	var st unix.Statx_t
	if err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &st); err != nil {
		return -1, 0
	}
	if st.Mask&unix.STATX_DIOALIGN == 0 || st.Dio_offset_align == 0 {
		return -1, 0
	}
	// The page size at least: any logical block size divides it, and a
	// chunk's pages are then whole.
	align := max(os.Getpagesize(), int(st.Dio_offset_align), int(st.Dio_mem_align))
	if align&(align-1) != 0 || chunkSize%align != 0 || off%int64(align) != 0 {
		return -1, 0
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, 0
	}
	return fd, align
}

func (w *Writer) dropOld() {
	now := w.now()
	last := w.dropped
	if len(w.marks) > 0 {
		last = w.marks[len(w.marks)-1].off
	}
	if w.off-last >= markEvery {
		w.marks = append(w.marks, mark{w.off, now})
	}
	i := 0
	for i < len(w.marks) && now.Sub(w.marks[i].at) >= w.dropAfter {
		i++
	}
	if i == 0 {
		return
	}
	end := w.marks[i-1].off &^ (w.align - 1)
	w.marks = append(w.marks[:0], w.marks[i:]...)
	if end <= w.dropped {
		return
	}
	if err := w.drop(w.fd, w.dropped, end-w.dropped); err != nil {
		w.drops = false
		return
	}
	w.dropped = end
}
