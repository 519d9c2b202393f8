// SPDX-License-Identifier: Apache-2.0

package hostcheck

import (
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/bytesize"
)

// maxCopyBytes caps the copied buffer, so that a host reporting a huge
// last-level cache (some virtual machines report the host's) does not make
// the check allocate gigabytes.
const maxCopyBytes = 256 << 20

// Memory holds the memory copy bandwidth.
type Memory struct {
	// CopyGBps is the best rate, in 10^9 bytes per second, at which one
	// thread copied a buffer of BufferBytes to another (bytes copied, not
	// bytes read plus bytes written).
	CopyGBps float64 `json:"copy_gbps"`
	// BufferBytes is the size of the copied buffer.
	BufferBytes int64 `json:"buffer_bytes"`
	// LargestCacheBytes is the largest CPU cache sysfs reports for CPU 0,
	// 0 if unknown. When it is not smaller than BufferBytes the copy may
	// partly run from the cache and CopyGBps overstates memory bandwidth.
	LargestCacheBytes int64 `json:"largest_cache_bytes"`
}

// measureMemory times copies of a buffer larger than the caches.
func measureMemory(s samples) Memory {
	m := Memory{LargestCacheBytes: largestCache()}
	size := int64(s.copyBytes)
	if s.copyPastCache {
		size = max(size, min(4*m.LargestCacheBytes, maxCopyBytes))
	}
	m.BufferBytes = size
	src, freeSrc := allocBuffer(size)
	defer freeSrc()
	dst, freeDst := allocBuffer(size)
	defer freeDst()
	// Write src for real: untouched pages all map the shared zero page,
	// which would make the copy read from the cache.
	src[0] = 1
	for n := 1; n < len(src); n *= 2 {
		copy(src[n:], src[:n])
	}
	copy(dst, src) // fault dst's pages in, untimed
	best := time.Duration(0)
	for range s.copies {
		t0 := time.Now()
		copy(dst, src)
		if d := time.Since(t0); best == 0 || d < best {
			best = d
		}
	}
	if best > 0 {
		m.CopyGBps = float64(size) / float64(best) // bytes per ns = GB/s
	}
	return m
}

// allocBuffer returns a buffer of size bytes and the function that frees
// it. The buffer is mapped outside the Go heap, asking for transparent huge
// pages, so that faulting it in is quick (a 4 KiB page fault costs
// microseconds in a virtual machine) and freeing it returns the memory at
// once rather than at some later garbage collection.
func allocBuffer(size int64) ([]byte, func()) {
	b, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return make([]byte, size), func() {}
	}
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE) // only a hint; fine to fail
	return b, func() { _ = unix.Munmap(b) }
}

// largestCache returns the size in bytes of the largest cache of CPU 0,
// or 0 if sysfs does not say.
func largestCache() int64 {
	files, _ := filepath.Glob("/sys/devices/system/cpu/cpu0/cache/index*/size")
	var largest int64
	for _, f := range files {
		if n := parseSize(readTrim(f)); n > largest {
			largest = n
		}
	}
	return largest
}

// parseSize parses a sysfs cache size such as "48K", "2048K" or "32M"; 0
// if it is not one.
func parseSize(s string) int64 {
	n, _ := bytesize.Parse(s)
	return n
}
