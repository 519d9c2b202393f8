// SPDX-License-Identifier: Apache-2.0

package ring

import (
	"sync/atomic"
	"unsafe"
)

// Memory is a ring buffer in ordinary memory, laid out as the kernel lays
// out a BPF ring buffer, with a producer standing in for BPF programs: the
// Reader code that reads the kernel's rings can be tested and benchmarked
// without BPF.
type Memory struct {
	cons, prod uintptr
	data       []byte
	size       int
	// Wraps counts the records whose bytes crossed the end of the data
	// area, which the kernel's double mapping makes contiguous.
	Wraps int
}

// NewMemory makes an empty ring of size bytes, a power of two.
func NewMemory(size int) *Memory {
	if size <= 0 || size&(size-1) != 0 {
		panic("ring: size must be a power of two")
	}
	return &Memory{data: make([]byte, 2*size), size: size}
}

// Reader returns a Reader of the ring.
func (m *Memory) Reader() *Reader {
	return newReader(&m.cons, &m.prod, m.data, m.size)
}

// Reserve reserves a record of n bytes and returns where it starts, or -1
// when the ring has no room, as bpf_ringbuf_reserve does. The record stays
// busy (unreadable, and blocking what follows) until Submit or Discard.
func (m *Memory) Reserve(n int) int {
	total := uintptr(hdrSize + (n+7)&^7)
	prod := atomic.LoadUintptr(&m.prod)
	if prod+total-atomic.LoadUintptr(&m.cons) > uintptr(m.size) {
		return -1
	}
	m.put(prod, busyBit|uint32(n))
	atomic.StoreUintptr(&m.prod, prod+total)
	return int(prod)
}

// Write copies b into the record at pos (from Reserve), at offset off.
func (m *Memory) Write(pos, off int, b []byte) {
	for i, c := range b {
		at := (pos + hdrSize + off + i) & (m.size - 1)
		m.data[at] = c
		m.data[at+m.size] = c
	}
	if (pos&(m.size-1))+hdrSize+off+len(b) > m.size {
		m.Wraps++
	}
}

// Submit commits the record at pos.
func (m *Memory) Submit(pos int) {
	m.put(uintptr(pos), m.header(uintptr(pos))&^busyBit)
}

// Discard commits the record at pos as discarded.
func (m *Memory) Discard(pos int) {
	m.put(uintptr(pos), m.header(uintptr(pos))&^busyBit|discardBit)
}

// Output reserves, writes and submits b in one step, as bpf_ringbuf_output
// does; it reports whether there was room.
func (m *Memory) Output(b []byte) bool {
	pos := m.Reserve(len(b))
	if pos < 0 {
		return false
	}
	m.Write(pos, 0, b)
	m.Submit(pos)
	return true
}

func (m *Memory) header(pos uintptr) uint32 {
	at := pos & uintptr(m.size-1)
	return atomic.LoadUint32((*uint32)(ptr(m.data, at)))
}

// put writes a record's length word in both mappings, with release
// semantics as the kernel does (the reader ignores the other header word).
func (m *Memory) put(pos uintptr, v uint32) {
	at := pos & uintptr(m.size-1)
	atomic.StoreUint32((*uint32)(ptr(m.data, at+uintptr(m.size))), v)
	atomic.StoreUint32((*uint32)(ptr(m.data, at)), v)
}

func ptr(b []byte, i uintptr) unsafe.Pointer {
	return unsafe.Pointer(&b[i])
}
