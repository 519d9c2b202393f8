// SPDX-License-Identifier: Apache-2.0

package ring

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"
)

// record makes a record of n bytes whose content says which one it is.
func record(i, n int) []byte {
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(i*7 + j)
	}
	if n >= 4 {
		binary.NativeEndian.PutUint32(b, uint32(i))
	}
	return b
}

// readAll reads what the ring holds, committing as it goes.
func readAll(t *testing.T, r *Reader) [][]byte {
	t.Helper()
	var out [][]byte
	for {
		rec, st, err := r.Peek()
		if err != nil {
			t.Fatal(err)
		}
		if st != Record {
			r.Commit()
			return out
		}
		out = append(out, bytes.Clone(rec))
		r.Advance()
	}
}

// TestReadWrapsAround checks that the reader reads every record in order,
// across the end of the ring (the double mapping makes it contiguous),
// skipping discarded ones: record by record with Peek, and by runs of
// frames with Unread, Frame and Skip, as the recorder's drain does.
func TestReadWrapsAround(t *testing.T) {
	for _, c := range []struct {
		name string
		read func(t *testing.T, r *Reader, round int) [][]byte
	}{
		{"peek", func(t *testing.T, r *Reader, _ int) [][]byte { return readAll(t, r) }},
		{"runs", func(t *testing.T, r *Reader, round int) [][]byte { return readRuns(t, r, 1+round%4) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := NewMemory(4096)
			r := m.Reader()
			sizes := []int{32, 56, 40, 184, 1, 7, 200, 64}
			next, want := 0, 0
			for round := 0; round < 200; round++ {
				// Fill what fits, a discarded frame before every fifth
				// record, then read it all back.
				for {
					if next%5 == 4 {
						d := m.Reserve(24)
						if d < 0 {
							break
						}
						m.Discard(d)
					}
					if !m.Output(record(next, sizes[next%len(sizes)])) {
						break
					}
					next++
				}
				for _, rec := range c.read(t, r, round) {
					if wantRec := record(want, sizes[want%len(sizes)]); !bytes.Equal(rec, wantRec) {
						t.Fatalf("record %d = %x, want %x", want, rec, wantRec)
					}
					want++
				}
				if want != next {
					t.Fatalf("read %d records, %d written", want, next)
				}
				if r.Available() != 0 || r.Pending() {
					t.Fatalf("ring not empty after reading everything: %d bytes", r.Available())
				}
			}
			if m.Wraps == 0 {
				t.Fatal("no record wrapped around the end of the ring")
			}
		})
	}
}

func TestBusyRecordBlocksWhatFollows(t *testing.T) {
	m := NewMemory(4096)
	r := m.Reader()
	a := m.Reserve(16)
	m.Write(a, 0, record(1, 16))
	if !m.Output(record(2, 16)) {
		t.Fatal("no room")
	}
	if _, st, err := r.Peek(); err != nil || st != Busy {
		t.Fatalf("Peek = %v, %v; want Busy", st, err)
	}
	m.Submit(a)
	got := readAll(t, r)
	if len(got) != 2 || !bytes.Equal(got[0], record(1, 16)) || !bytes.Equal(got[1], record(2, 16)) {
		t.Fatalf("read %x", got)
	}
}

func TestDiscardedRecordsAreSkipped(t *testing.T) {
	m := NewMemory(4096)
	r := m.Reader()
	m.Output(record(1, 24))
	d := m.Reserve(100)
	m.Discard(d)
	m.Output(record(3, 24))
	got := readAll(t, r)
	if len(got) != 2 || !bytes.Equal(got[1], record(3, 24)) {
		t.Fatalf("read %x", got)
	}
}

// TestCommitReturnsSpace checks that space comes back to the producer only
// at Commit, and that a peeked record stays intact until then.
func TestCommitReturnsSpace(t *testing.T) {
	m := NewMemory(4096)
	r := m.Reader()
	for m.Output(record(0, 120)) {
	}
	rec, st, err := r.Peek()
	if err != nil || st != Record {
		t.Fatalf("Peek = %v, %v", st, err)
	}
	r.Advance()
	if m.Output(record(9, 120)) {
		t.Fatal("the producer got space before Commit")
	}
	if !bytes.Equal(rec, record(0, 120)) {
		t.Fatal("record changed before Commit")
	}
	r.Commit()
	if !m.Output(record(9, 120)) {
		t.Fatal("no space after Commit")
	}
}

func TestCorruptHeader(t *testing.T) {
	m := NewMemory(4096)
	r := m.Reader()
	p := m.Reserve(16)
	m.put(uintptr(p), 1<<20) // longer than what was reserved
	if _, _, err := r.Peek(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Peek error = %v, want ErrCorrupt", err)
	}
}

// TestKernelRing reads records a BPF program wrote into a real ring buffer,
// and checks that the producer's wake-up reaches the Poller.
func TestKernelRing(t *testing.T) {
	m, r, p := kernelRing(t)
	// bpf_ringbuf_output(&m, &stack[-16], 12, 0): 12 bytes, 0x2a repeated.
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SocketFilter,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R1, 0x2a2a2a2a),
			asm.StoreMem(asm.RFP, -16, asm.R1, asm.Word),
			asm.StoreMem(asm.RFP, -12, asm.R1, asm.Word),
			asm.StoreMem(asm.RFP, -8, asm.R1, asm.Word),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -16),
			asm.Mov.Imm(asm.R3, 12),
			asm.Mov.Imm(asm.R4, 0),
			asm.FnRingbufOutput.Call(),
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()

	// Nothing to read: Wait returns at its timeout.
	start := time.Now()
	if err := p.Wait(30 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 25*time.Millisecond {
		t.Fatalf("Wait returned after %v with nothing to read", d)
	}
	// A producer's wake-up ends a long Wait.
	woken := make(chan error, 1)
	go func() { woken <- p.Wait(time.Minute) }()
	time.Sleep(20 * time.Millisecond)
	if _, _, err := prog.Benchmark(make([]byte, 14), 1, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-woken:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Wait not woken up by the producer")
	}
	if got := readAll(t, r); len(got) != 1 {
		t.Fatalf("read %d records, want 1", len(got))
	}

	// One page holds 204 records of 12 (+4 padding, +8 header) bytes; run
	// the program more often than that to wrap around.
	want := bytes.Repeat([]byte{0x2a}, 12)
	read := 0
	for round := 0; round < 3; round++ {
		if _, _, err := prog.Benchmark(make([]byte, 14), 150, nil); err != nil {
			t.Fatal(err)
		}
		if err := p.Wait(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		got := readAll(t, r)
		if len(got) != 150 {
			t.Fatalf("round %d: read %d records, want 150", round, len(got))
		}
		for _, rec := range got {
			if !bytes.Equal(rec, want) {
				t.Fatalf("record %x, want %x", rec, want)
			}
		}
		read += len(got)
	}
	if r.Available() != 0 {
		t.Fatalf("%d bytes left after reading %d records", r.Available(), read)
	}
}

// TestPollerWake checks that Wake ends a Wait that has hours to go, and
// that every Wait after it returns at once: a recorder must not sleep on
// past the end of its recording.
func TestPollerWake(t *testing.T) {
	_, _, p := kernelRing(t)

	waited := make(chan error, 1)
	go func() { waited <- p.Wait(time.Hour) }()
	p.Wake() // before or while the goroutine waits: either must end it
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Wait(1h) still waiting 20 s after Wake")
	}
	go func() { waited <- p.Wait(time.Hour) }()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a Wait after Wake did not return at once")
	}
}

// kernelRing makes a BPF ring buffer of one page, its Reader and a
// Poller of it, all closed when the test ends; the test is skipped
// without root.
func kernelRing(t *testing.T) (*ebpf.Map, *Reader, *Poller) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("BPF ring buffers need root")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.RingBuf, MaxEntries: uint32(os.Getpagesize())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	r, err := NewReader(m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	p, err := NewPoller(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return m, r, p
}
