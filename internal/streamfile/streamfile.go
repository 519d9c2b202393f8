// SPDX-License-Identifier: Apache-2.0

// Package streamfile writes a file the way a recorder writes a trace: once,
// front to back, for as long as the recording lasts, never reading it back.
//
// Written through the page cache as usual, such a file grows the cache by
// everything written, and each write copies into pages the kernel has just
// taken from its free lists. On a virtual machine whose memory the host
// backs lazily (this project's CI VM) that first touch of a never-used page
// is a trap to the host: it was half of a recorder's CPU time (perf:
// copy_folio_from_iter_atomic), and it can happen on a
// real host too, as reclaim, once the page cache fills memory. A Writer
// starts the write-back of what it wrote every Window bytes
// (sync_file_range) and drops from the page cache what was written back
// (posix_fadvise DONTNEED), a few windows behind, so that the cache pages
// it releases are the ones its next writes are given, and the file never
// holds more than a few windows of dirty pages, which also keeps the
// recorder away from the kernel's dirty-page throttling. Neither call
// waits for the disk.
//
// A write(2) can still wait for the disk, the journal or free memory: on
// the shared CI VM single 64 KiB writes took up to 110 ms while other work
// wrote too, and a recorder that waited that long in its drain loop let a
// small ring overflow. So by default a Writer copies what it is given into
// a queue of 1 MiB chunks and a goroutine of its own writes them: the
// caller waits only when the whole queue is behind.
package streamfile

import (
	"errors"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// DefaultWindow is how many bytes are written between two hints to the
// kernel: large enough that the two system calls cost nothing per byte,
// small enough that a few windows of pages are a small cache.
const DefaultWindow = 4 << 20

// lag is how many windows behind the end of the file pages are dropped:
// write-back started one window ago may not have finished, and dirty pages
// or pages under write-back are not dropped (harmless, but not released).
const lag = 2

// dropAlign aligns the ranges dropped: the page cache holds a file in folios
// of up to 2 MiB (ext4 gives large folios to large writes), naturally
// aligned, and a folio that sticks out of a range is not dropped, so a
// boundary between two drops must not cut one.
const dropAlign = 2 << 20

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
	// Window is how many bytes are written between two hints; 0 means
	// DefaultWindow.
	Window int
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
	f       *os.File
	fd      int
	window  int64
	align   int64 // dropAlign, but 1 in tests of the arithmetic
	off     int64 // where the next write lands
	started int64 // write-back started for [.., started)
	dropped int64 // dropped from the page cache up to here
	hints   bool  // false for anything but a regular file, or once a hint failed
	hinter  hinter
}

// hinter is the kernel's side, replaced in tests.
type hinter interface {
	startWriteback(fd int, off, n int64) error
	drop(fd int, off, n int64) error
}

type kernel struct{}

func (kernel) startWriteback(fd int, off, n int64) error {
	return unix.SyncFileRange(fd, off, n, unix.SYNC_FILE_RANGE_WRITE)
}

func (kernel) drop(fd int, off, n int64) error {
	return unix.Fadvise(fd, off, n, unix.FADV_DONTNEED)
}

// New returns a Writer that appends to f from its current offset. For
// anything but a regular file (a pipe, a terminal) it gives no hints. The
// caller still owns f, and closes it after the Writer.
func New(f *os.File, opts Options) *Writer {
	window := opts.Window
	if window <= 0 {
		window = DefaultWindow
	}
	w := &Writer{f: f, fd: int(f.Fd()), window: int64(window), align: dropAlign, hinter: kernel{}}
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
	var st unix.Stat_t
	if err := unix.Fstat(w.fd, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
		if off, err := f.Seek(0, 1); err == nil {
			w.off, w.started, w.dropped, w.hints = off, off, off, true
		}
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

// write writes p to the file and hints. The hints' own errors are not the
// caller's concern (the data is written either way): a failed hint turns
// hints off.
func (w *Writer) write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.off += int64(n)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	if w.hints && w.off-w.started >= w.window {
		w.hint()
	}
	return n, err
}

// hint starts write-back of what was written since the last hint and drops
// what is at least lag windows behind the end.
func (w *Writer) hint() {
	if err := w.hinter.startWriteback(w.fd, w.started, w.off-w.started); err != nil {
		w.hints = false
		return
	}
	w.started = w.off
	if end := (w.off - lag*w.window) &^ (w.align - 1); end > w.dropped {
		if err := w.hinter.drop(w.fd, w.dropped, end-w.dropped); err != nil {
			w.hints = false
			return
		}
		w.dropped = end
	}
}
