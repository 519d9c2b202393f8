// SPDX-License-Identifier: Apache-2.0

// Package prefetch asks the CPU to bring memory into its caches before a
// loop gets to it.
//
// The recorder reads records another CPU has just written into a ring
// buffer and copies them into a block bigger than its own caches: each
// cache line it first touches, on either side, is a miss that the hardware
// prefetcher, which follows one stream of misses within a page, only partly
// hides. Asking for the next kilobytes once per kilobyte consumed lets those
// misses overlap with the work on the records before them. A call costs a
// few nanoseconds, so callers make one per many records, not one per record.
//
// On amd64 the functions issue PREFETCHT0 (read) and PREFETCHW (write: the
// line arrives owned, so the first store does not ask again); elsewhere they
// do nothing. A prefetch never faults, but b must still be memory the caller
// may read: the range is only a hint, yet it is the caller's.
package prefetch

// Line is the cache line size the functions step by.
const Line = 64
