// SPDX-License-Identifier: Apache-2.0

// Package streamfile writes a file the way a recorder writes a trace: once,
// front to back, for as long as the recording lasts, never reading it back.
//
// A write(2) can wait for the disk, the journal or free memory: on the
// shared CI VM single 64 KiB writes took up to 111 ms while other work wrote
// too, and a recorder that waited that long in its drain loop let a small
// ring overflow. So by default a Writer copies what it is given into a
// queue of 1 MiB chunks and a goroutine of its own writes them: the caller
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
package streamfile

import (
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

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

// chunkSize is the unit of the queue and of the writes to the file.
const chunkSize = 1 << 20

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
}

// Writer writes to a file front to back, by default from a goroutine of its
// own, and gives the pages of a regular file back behind it. It is not safe
// for concurrent use. The caller must Close it (which waits for what is
// queued) before closing the file.
type Writer struct {
	// The caller's side.
	chunk  []byte      // being filled; nil when none
	full   chan []byte // to the writer goroutine; nil when writing in Write
	free   chan []byte // written chunks, back from the goroutine
	chunks int         // chunks allocated
	max    int         // chunks allowed
	done   chan struct{}
	closed bool

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
	w := &Writer{f: f, fd: int(f.Fd()), dropAfter: opts.DropAfter, align: dropAlign, now: time.Now, drop: fadviseDontNeed}
	if w.dropAfter == 0 {
		w.dropAfter = flusherDelay()
	}
	var st unix.Stat_t
	if err := unix.Fstat(w.fd, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && w.dropAfter > 0 {
		if off, err := f.Seek(0, io.SeekCurrent); err == nil {
			w.off, w.dropped, w.drops = off, off, true
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
			w.full <- w.chunk
			w.chunk = nil
		}
	}
	return n, nil
}

// getChunk returns an empty chunk: a written one, a new one while fewer
// than the queue's worth exist, or else the next one written (the only
// wait: the whole queue is behind).
func (w *Writer) getChunk() []byte {
	select {
	case c := <-w.free:
		return c[:0]
	default:
	}
	if w.chunks < w.max {
		w.chunks++
		return make([]byte, 0, chunkSize)
	}
	return (<-w.free)[:0]
}

// Flush hands what was queued so far to the writer goroutine, without
// waiting for it: the file has it moments later.
func (w *Writer) Flush() error {
	if w.closed {
		return ErrClosed
	}
	if w.full != nil && len(w.chunk) > 0 {
		w.full <- w.chunk
		w.chunk = nil
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
			if _, err := w.write(c); err != nil {
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
