// SPDX-License-Identifier: Apache-2.0

package streamfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

type dropRange struct{ off, n int64 }

type fakeDrops struct {
	got  []dropRange
	fail bool
}

func (d *fakeDrops) drop(_ int, off, n int64) error {
	d.got = append(d.got, dropRange{off, n})
	if d.fail {
		return errors.New("no")
	}
	return nil
}

// fakeClock is a clock that moves only when told.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func tempFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// Pages are dropped front to back, without gaps or overlaps, once written
// DropAfter ago, on 2 MiB boundaries.
func TestDropsFollowTheWritesLate(t *testing.T) {
	f := tempFile(t)
	if _, err := f.Write(make([]byte, 100)); err != nil { // a header written before
		t.Fatal(err)
	}
	w := New(f, Options{Queue: -1, DropAfter: 10 * time.Second})
	d, clock := &fakeDrops{}, &fakeClock{t: time.Unix(1000, 0)}
	w.drop, w.now = d.drop, clock.now
	chunk := make([]byte, 1<<20)
	write := func(n int) {
		for range n {
			if _, err := w.Write(chunk); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(9) // marks at 4 MiB+100 and 8 MiB+100
	if len(d.got) != 0 {
		t.Fatalf("dropped %v before DropAfter", d.got)
	}
	clock.t = clock.t.Add(10 * time.Second)
	write(1) // both marks old: up to 8 MiB+100, on a 2 MiB boundary
	clock.t = clock.t.Add(5 * time.Second)
	write(4) // a mark at 12 MiB+100, now
	clock.t = clock.t.Add(5 * time.Second)
	write(1) // 5 s old: nothing
	if len(d.got) != 1 {
		t.Fatalf("drops %v, want only the first", d.got)
	}
	clock.t = clock.t.Add(5 * time.Second)
	write(1)
	want := []dropRange{{100, 8<<20 - 100}, {8 << 20, 4 << 20}}
	if len(d.got) != len(want) {
		t.Fatalf("drops %v, want %v", d.got, want)
	}
	for i := range want {
		if d.got[i] != want[i] {
			t.Fatalf("drop %d is %+v, want %+v (all: %v)", i, d.got[i], want[i], d.got)
		}
	}
	if got, err := os.ReadFile(f.Name()); err != nil || len(got) != 100+16<<20 {
		t.Fatalf("file is %d bytes (%v), want %d", len(got), err, 100+16<<20)
	}
}

// A failed drop turns drops off and fails no write.
func TestFailedDropStopsDropping(t *testing.T) {
	w := New(tempFile(t), Options{Queue: -1, DropAfter: time.Nanosecond})
	d := &fakeDrops{fail: true}
	w.drop, w.align = d.drop, 1
	for range 5 {
		if _, err := w.Write(make([]byte, markEvery)); err != nil {
			t.Fatal(err)
		}
	}
	if len(d.got) != 1 {
		t.Fatalf("drops after a failure: %v", d.got)
	}
}

// A pipe is written to and never dropped.
func TestPipeIsNotDropped(t *testing.T) {
	r, wp, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer wp.Close()
	w := New(wp, Options{Queue: -1, DropAfter: time.Nanosecond})
	d := &fakeDrops{}
	w.drop = d.drop
	go func() { _, _ = w.Write([]byte("hello")); wp.Close() }()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(r); err != nil || buf.String() != "hello" {
		t.Fatalf("read %q, %v", buf.String(), err)
	}
	if len(d.got) != 0 {
		t.Fatalf("a pipe was dropped: %v", d.got)
	}
}

// On a real file system, pages written back leave the page cache once
// DropAfter has passed, and the file reads back whole.
func TestPagesLeaveTheCache(t *testing.T) {
	f := tempFile(t)
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC {
		t.Skip("the temporary directory is on tmpfs, whose pages are never written back")
	}
	w := New(f, Options{Queue: -1, DropAfter: time.Hour})
	clock := &fakeClock{t: time.Unix(1000, 0)}
	w.now = clock.now
	data := make([]byte, 3*markEvery)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if _, err := w.Write(data[:2*markEvery]); err != nil {
		t.Fatal(err)
	}
	// Written back for certain (the flusher's part), so that the drop
	// takes effect.
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	clock.t = clock.t.Add(time.Hour)
	if _, err := w.Write(data[2*markEvery:]); err != nil {
		t.Fatal(err)
	}
	if !w.drops || w.dropped != 2*markEvery {
		t.Skipf("nothing dropped (drops %v, up to %d): the file system refuses fadvise", w.drops, w.dropped)
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
	for _, v := range vec[:2*markEvery/page] {
		resident += int(v & 1)
	}
	if resident != 0 {
		t.Errorf("%d of the first %d pages still cached after they were written back and dropped", resident, 2*markEvery/page)
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

// directFile makes a Writer with direct writes on a file of the temporary
// directory, or skips when its file system has none.
func directFile(t *testing.T) (*os.File, *Writer) {
	t.Helper()
	f := tempFile(t)
	w := New(f, Options{Queue: 4 * chunkSize, Direct: true})
	if w.direct == 0 {
		w.Close()
		var st unix.Statx_t
		_ = unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &st)
		t.Skipf("the temporary directory's file system offers no direct I/O (statx mask %#x, dio_offset_align %d)", st.Mask, st.Dio_offset_align)
	}
	return f, w
}

// writeRandom writes 2000 writes of random sizes through w, by Write or in
// lent room (Room and Commit, lending more room than is used), flushing at
// random, closes it and returns what it wrote.
func writeRandom(t *testing.T, w *Writer) []byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(3, 4))
	var want []byte
	for i := range 2000 {
		b := make([]byte, rng.IntN(100000))
		for j := range b {
			b[j] = byte(i + j)
		}
		want = append(want, b...)
		if rng.IntN(2) == 0 {
			room := w.Room(len(b) + rng.IntN(1000))
			if room == nil || len(room) != 0 || cap(room) < len(b) {
				t.Fatalf("Room(%d) lent len %d cap %d", len(b), len(room), cap(room))
			}
			if err := w.Commit(copy(room[:len(b)], b)); err != nil {
				t.Fatal(err)
			}
		} else if _, err := w.Write(b); err != nil {
			t.Fatal(err)
		}
		if rng.IntN(40) == 0 {
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		if i%500 == 0 { // a flush right after another: nothing new to hand over
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return want
}

func checkFile(t *testing.T, f *os.File, want []byte) {
	t.Helper()
	got, err := os.ReadFile(f.Name())
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("file of %d bytes (%v) differs from the %d written", len(got), err, len(want))
	}
}

// Direct writes, the early chunks' tails written through the page cache and
// again directly, make the file as written, and leave at most its last page
// in the page cache.
func TestDirectWrites(t *testing.T) {
	f, w := directFile(t)
	want := writeRandom(t, w)
	m, err := unix.Mmap(int(f.Fd()), 0, len(want), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(want)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	resident := 0
	for _, v := range vec {
		resident += int(v & 1)
	}
	if resident > 1 {
		t.Errorf("%d of the file's %d pages are in the page cache, want at most the last", resident, len(vec))
	}
	checkFile(t, f, want)
}

// A file system that refuses a direct write after all gets every chunk
// through the page cache, overlaps included, and the file is still as
// written.
func TestDirectRefused(t *testing.T) {
	f, w := directFile(t)
	w.refused = true // before the goroutine's first write: New only started it
	checkFile(t, f, writeRandom(t, w))
}

// Lent room and writes mix in order through the page cache too.
func TestLentRoom(t *testing.T) {
	f := tempFile(t)
	w := New(f, Options{Queue: 4 * chunkSize})
	checkFile(t, f, writeRandom(t, w))
}

// Without a queue there is no room to lend, nor room for more than a chunk.
func TestNoRoom(t *testing.T) {
	w := New(tempFile(t), Options{Queue: -1})
	if w.Room(10) != nil {
		t.Error("lent room without a queue")
	}
	w = New(tempFile(t), Options{})
	defer w.Close()
	if w.Room(chunkSize+1) != nil {
		t.Error("lent room for more than a chunk")
	}
	if err := w.Commit(1); err == nil {
		t.Error("commit without room lent")
	}
}

// A file whose offset is not aligned is written through the page cache.
func TestDirectNeedsAnAlignedStart(t *testing.T) {
	f := tempFile(t)
	if _, err := f.Write([]byte("header")); err != nil {
		t.Fatal(err)
	}
	w := New(f, Options{Queue: 4 * chunkSize, Direct: true})
	if w.direct != 0 {
		t.Fatalf("direct writes (alignment %d) from offset 6", w.direct)
	}
	if _, err := w.Write([]byte(" and more")); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(f.Name()); err != nil || string(got) != "header and more" {
		t.Fatalf("file holds %q (%v)", got, err)
	}
}

// Prefaulted chunks are there from New on, no more than the queue holds,
// each page of them in memory already (mincore), and a Write fills them
// rather than new ones.
func TestPrefault(t *testing.T) {
	if w := New(tempFile(t), Options{Queue: 2 * chunkSize, Prefault: 10 * chunkSize}); w.chunks != 2 {
		t.Errorf("%d chunks prefaulted for a queue of 2", w.chunks)
	} else {
		w.Close()
	}
	f := tempFile(t)
	w := New(f, Options{Queue: 4 * chunkSize, Prefault: chunkSize + 1, Direct: true})
	if w.chunks != 2 || len(w.free) != 2 {
		t.Fatalf("%d chunks, %d free after New, want 2 and 2", w.chunks, len(w.free))
	}
	page := os.Getpagesize()
	for range 2 {
		c := <-w.free
		mem := c[:cap(c)]
		start := (page - int(uintptr(unsafe.Pointer(&mem[0])))%page) % page
		pages := (len(mem) - start) / page
		vec := make([]byte, pages)
		if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[start])), uintptr(pages*page), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
			t.Fatalf("mincore: %v", errno)
		}
		absent := 0
		for _, v := range vec {
			absent += int(1 - v&1)
		}
		if absent > 0 {
			t.Errorf("%d of a prefaulted chunk's %d pages are not in memory", absent, pages)
		}
		w.free <- c
	}
	want := make([]byte, 2*chunkSize-4096)
	for i := range want {
		want[i] = byte(i * 7)
	}
	// In pieces, as a recorder writes.
	for p := want; len(p) > 0; p = p[min(len(p), 64<<10):] {
		if _, err := w.Write(p[:min(len(p), 64<<10)]); err != nil {
			t.Fatal(err)
		}
	}
	if w.chunks != 2 {
		t.Errorf("%d chunks allocated, want the 2 prefaulted", w.chunks)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	checkFile(t, f, want)
}

// A direct writer's prefaulted chunks start at a huge page's boundary and
// are marked for transparent huge pages (the "hg" flag of their mapping in
// smaps), where the kernel has THP; the file is still as written. That
// chunks made later are not asked for huge pages is not checked here: the
// heap memory a freed marked chunk leaves behind keeps its flag, and a
// later chunk may be allocated in it.
func TestDirectChunksAskForHugePages(t *testing.T) {
	thp, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || bytes.Contains(thp, []byte("[never]")) {
		t.Skipf("no transparent huge pages here (%q, %v)", bytes.TrimSpace(thp), err)
	}
	f, w := directFile(t)
	c := w.newChunk(true)
	addr := uintptr(unsafe.Pointer(&c[:1][0]))
	if addr%hugePage != 0 || cap(c) != chunkSize {
		t.Fatalf("chunk at %#x (cap %d): want a %d-byte chunk at a 2 MiB boundary", addr, cap(c), chunkSize)
	}
	flags := vmFlags(t, addr)
	if !bytes.Contains(flags, []byte(" hg")) {
		t.Errorf("the chunk's mapping has flags %q, want hg (MADV_HUGEPAGE)", flags)
	}
	checkFile(t, f, writeRandom(t, w))

	// A writer through the page cache pins nothing: its chunks need no
	// huge pages, nor the address space to align them.
	pw := New(tempFile(t), Options{Queue: 4 * chunkSize})
	defer pw.Close()
	if pc := pw.newChunk(true); cap(pc) != chunkSize {
		t.Errorf("page-cache chunk cap %d, want %d", cap(pc), chunkSize)
	}
}

// vmFlags returns the VmFlags line of the mapping of this process that
// holds addr (/proc/self/smaps).
func vmFlags(t *testing.T, addr uintptr) []byte {
	t.Helper()
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Skipf("no smaps: %v", err)
	}
	in := false
	for _, line := range bytes.Split(smaps, []byte("\n")) {
		var lo, hi uintptr
		if n, _ := fmt.Sscanf(string(line), "%x-%x ", &lo, &hi); n == 2 {
			in = lo <= addr && addr < hi
			continue
		}
		if in && bytes.HasPrefix(line, []byte("VmFlags:")) {
			return line
		}
	}
	t.Fatalf("no mapping holds %#x", addr)
	return nil
}
