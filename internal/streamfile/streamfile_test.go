// SPDX-License-Identifier: Apache-2.0

package streamfile

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

type call struct {
	drop   bool
	off, n int64
}

type fakeHinter struct {
	calls []call
	fail  bool
}

func (h *fakeHinter) startWriteback(_ int, off, n int64) error {
	h.calls = append(h.calls, call{false, off, n})
	if h.fail {
		return errors.New("no")
	}
	return nil
}

func (h *fakeHinter) drop(_ int, off, n int64) error {
	h.calls = append(h.calls, call{true, off, n})
	return nil
}

func tempFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// The hints cover the file front to back without gaps or overlaps: write-back
// started for each window as it is passed, pages dropped lag windows behind.
func TestHintsFollowTheWrites(t *testing.T) {
	f := tempFile(t)
	if _, err := f.Write(make([]byte, 100)); err != nil { // a header written before
		t.Fatal(err)
	}
	w := New(f, Options{Window: 1000, Queue: -1})
	w.align = 1
	h := &fakeHinter{}
	w.hinter = h
	chunk := make([]byte, 300)
	for range 20 { // 6,000 bytes after the first 100
		if _, err := w.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	want := []call{
		{false, 100, 1200},
		{false, 1300, 1200},
		{true, 100, 400}, // up to 2500 - 2×1000
		{false, 2500, 1200},
		{true, 500, 1200},
		{false, 3700, 1200},
		{true, 1700, 1200},
		{false, 4900, 1200},
		{true, 2900, 1200},
	}
	if len(h.calls) != len(want) {
		t.Fatalf("hints %v, want %v", h.calls, want)
	}
	for i := range want {
		if h.calls[i] != want[i] {
			t.Fatalf("hint %d is %+v, want %+v (all: %v)", i, h.calls[i], want[i], h.calls)
		}
	}
	got, err := os.ReadFile(f.Name())
	if err != nil || len(got) != 6100 {
		t.Fatalf("file is %d bytes (%v), want 6100", len(got), err)
	}
}

// A failed hint turns hints off and fails no write.
func TestFailedHintStopsHinting(t *testing.T) {
	w := New(tempFile(t), Options{Window: 10, Queue: -1})
	h := &fakeHinter{fail: true}
	w.hinter = h
	for range 5 {
		if _, err := w.Write(make([]byte, 20)); err != nil {
			t.Fatal(err)
		}
	}
	if len(h.calls) != 1 {
		t.Fatalf("hints after a failure: %v", h.calls)
	}
}

// A pipe is written to and never hinted.
func TestPipeIsNotHinted(t *testing.T) {
	r, wp, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer wp.Close()
	w := New(wp, Options{Window: 1, Queue: -1})
	h := &fakeHinter{}
	w.hinter = h
	go func() { _, _ = w.Write([]byte("hello")); wp.Close() }()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(r); err != nil || buf.String() != "hello" {
		t.Fatalf("read %q, %v", buf.String(), err)
	}
	if len(h.calls) != 0 {
		t.Fatalf("a pipe was hinted: %v", h.calls)
	}
}

// On a real file system, pages written back leave the page cache at the
// hint that is lag windows past them, and the file reads back whole.
func TestPagesLeaveTheCache(t *testing.T) {
	f := tempFile(t)
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC {
		t.Skip("the temporary directory is on tmpfs, whose pages are never written back")
	}
	const window = 1 << 20
	w := New(f, Options{Window: window, Queue: -1})
	data := make([]byte, 8*window)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if _, err := w.Write(data[:2*window]); err != nil {
		t.Fatal(err)
	}
	// The first two windows written back for certain, so that the drops of
	// the next hints, which cover them, take effect.
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	for off := 2 * window; off < len(data); off += window {
		if _, err := w.Write(data[off : off+window]); err != nil {
			t.Fatal(err)
		}
	}
	if !w.hints {
		t.Skip("the file system of the temporary directory refuses sync_file_range or fadvise")
	}
	m, err := unix.Mmap(int(f.Fd()), 0, len(data), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(data)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	resident := 0
	for _, v := range vec[:2*window/page] {
		resident += int(v & 1)
	}
	if resident != 0 {
		t.Errorf("%d of the first %d pages still cached after they were written back and dropped", resident, 2*window/page)
	}
	if !bytes.Equal(m, data) {
		t.Error("the file does not read back as written")
	}
}

// Through the queue, writes of every size reach the file in order, whole,
// once Close returns; Flush hands a partial chunk over.
func TestQueuedWritesArriveInOrder(t *testing.T) {
	f := tempFile(t)
	w := New(f, Options{Queue: 4 * chunkSize})
	rng := rand.New(rand.NewPCG(1, 2))
	var want []byte
	for i := range 2000 {
		b := make([]byte, rng.IntN(20000))
		for j := range b {
			b[j] = byte(i + j)
		}
		want = append(want, b...)
		if _, err := w.Write(b); err != nil {
			t.Fatal(err)
		}
		if i%300 == 0 {
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := w.Write([]byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Write after Close: %v, want ErrClosed", err)
	}
	got, err := os.ReadFile(f.Name())
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("file of %d bytes (%v) differs from the %d written", len(got), err, len(want))
	}
}

// With the whole queue behind (a reader that has not started), Write waits,
// and goes on once the file takes data again.
func TestFullQueueWaits(t *testing.T) {
	r, wp, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w := New(wp, Options{Queue: 2 * chunkSize})
	want := make([]byte, 5*chunkSize+123)
	for i := range want {
		want[i] = byte(i * 13)
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := w.Write(want)
		if err == nil {
			err = w.Close()
		}
		wp.Close()
		wrote <- err
	}()
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, want the %d written", len(got), len(want))
	}
}

// A failed write is returned by a later Write or Close, and nothing after
// it is written.
func TestWriteErrorIsSticky(t *testing.T) {
	f := tempFile(t)
	ro, err := os.Open(f.Name()) // read-only: every write fails
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	w := New(ro, Options{})
	if _, err := w.Write(make([]byte, 3*chunkSize)); err != nil {
		t.Fatalf("first Write: %v (the failure is the goroutine's, later)", err)
	}
	if err := w.Close(); err == nil {
		t.Fatal("Close after failed writes returned nil")
	}
}
