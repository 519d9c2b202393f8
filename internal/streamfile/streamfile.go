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
package streamfile

import (
	"os"

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

// Writer writes to a regular file and gives its pages back behind it. It
// is not safe for concurrent use.
type Writer struct {
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

// New returns a Writer that appends to f from its current offset, hinting
// every window bytes (0 means DefaultWindow). For anything but a regular
// file (a pipe, a terminal) it writes and hints nothing. The caller still
// owns f and closes it.
func New(f *os.File, window int) *Writer {
	if window <= 0 {
		window = DefaultWindow
	}
	w := &Writer{f: f, fd: int(f.Fd()), window: int64(window), align: dropAlign, hinter: kernel{}}
	var st unix.Stat_t
	if err := unix.Fstat(w.fd, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
		if off, err := f.Seek(0, 1); err == nil {
			w.off, w.started, w.dropped, w.hints = off, off, off, true
		}
	}
	return w
}

// Write writes p to the file. The hints' own errors are not the caller's
// concern (the data is written either way): a failed hint turns hints off.
func (w *Writer) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.off += int64(n)
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
