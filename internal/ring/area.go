// SPDX-License-Identifier: Apache-2.0

package ring

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// AreaPosSize is the size of an area's positions in its positions map:
// the producer's on the first cache line, the reader's on the second
// (struct area_pos in bpf/lib/maps.h).
const AreaPosSize = 128

// NewAreaReader reads an area: element index of data, a BPF_F_MMAPABLE
// array whose elements are areas of a power-of-two size, with its positions
// at element posIndex of pos, a BPF_F_MMAPABLE array of AreaPosSize-byte
// elements. An area holds what a ring buffer holds, laid out the same way
// (see bpf/lib/area.h): its records are read by the same code. Like the
// kernel's ring buffer, the area is mapped twice in a row, so that a view
// from any position is contiguous; unlike it, an area has no descriptor to
// wait on: its producer wakes the reader through another ring (Poller).
// Close unmaps it; the maps must stay open while the Reader is used.
func NewAreaReader(data *ebpf.Map, index int, pos *ebpf.Map, posIndex int) (*Reader, error) {
	size := int(data.ValueSize())
	page := os.Getpagesize()
	if size < page || size&(size-1) != 0 {
		return nil, fmt.Errorf("area size %d is not a power of two of at least a page", size)
	}
	if data.Type() != ebpf.Array || pos.Type() != ebpf.Array || pos.ValueSize() != AreaPosSize {
		return nil, fmt.Errorf("maps %s and %s are not an area and its positions", data, pos)
	}
	if index < 0 || index >= int(data.MaxEntries()) || posIndex < 0 || posIndex >= int(pos.MaxEntries()) {
		return nil, fmt.Errorf("area %d (positions %d) out of range", index, posIndex)
	}
	posLen := (int(pos.MaxEntries())*AreaPosSize + page - 1) / page * page
	positions, err := unix.Mmap(pos.FD(), 0, posLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map area positions: %w", err)
	}
	// Reserve twice the area's size of address space, then put the area
	// in both halves.
	base, err := unix.MmapPtr(-1, 0, nil, uintptr(2*size), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		_ = unix.Munmap(positions)
		return nil, fmt.Errorf("reserve area mapping: %w", err)
	}
	unmap := func() error {
		return errors.Join(unix.MunmapPtr(base, uintptr(2*size)), unix.Munmap(positions))
	}
	for half := range 2 {
		at := unsafe.Add(base, half*size)
		if _, err := unix.MmapPtr(data.FD(), int64(index)*int64(size), at, uintptr(size), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
			_ = unmap()
			return nil, fmt.Errorf("map area %d: %w", index, err)
		}
	}
	at := posIndex * AreaPosSize
	r := newReader((*uintptr)(unsafe.Pointer(&positions[at+64])), (*uintptr)(unsafe.Pointer(&positions[at])),
		unsafe.Slice((*byte)(base), 2*size), size)
	r.unmap = unmap
	return r, nil
}
