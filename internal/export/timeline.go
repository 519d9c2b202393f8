// SPDX-License-Identifier: Apache-2.0

package export

import "github.com/magnet-tracer/magnet/internal/trace"

// Timeline places several traces on one clock, the first trace's
// CLOCK_MONOTONIC. Traces recorded during one boot of one machine (the
// same boot_id in their headers, e.g. in two namespaces of a host) share
// that clock exactly, so nothing is added. Traces of other machines are
// placed by their wall clocks (each header's clock.wall_offset_ns): then a
// one-way figure across two traces is only as good as the synchronisation
// of the two machines' clocks (NTP: around a millisecond; PTP: around a
// microsecond).
type Timeline struct {
	// Offsets[i] added to trace i's time_ns gives the time on the common
	// clock.
	Offsets []int64
	boots   []string
	// wall0 is the first trace's wall offset: the common clock plus it is
	// wall-clock time.
	wall0 int64
}

// NewTimeline aligns the traces with headers hs.
func NewTimeline(hs []*trace.Header) *Timeline {
	tl := &Timeline{Offsets: make([]int64, len(hs)), boots: make([]string, len(hs))}
	if len(hs) > 0 {
		tl.wall0 = hs[0].Clock.WallOffsetNs
	}
	for i, h := range hs {
		tl.boots[i] = BootID(h)
		if i > 0 && !tl.SameClock(0, i) {
			tl.Offsets[i] = h.Clock.WallOffsetNs - hs[0].Clock.WallOffsetNs
		}
	}
	return tl
}

// SameClock reports whether traces i and j were stamped by one clock.
func (tl *Timeline) SameClock(i, j int) bool {
	return i == j || tl.boots[i] != "" && tl.boots[i] == tl.boots[j]
}

// BootID returns the boot id of the machine that recorded the trace with
// header h (extra.boot_id), or "" when the header does not say.
func BootID(h *trace.Header) string {
	id, _ := h.Extra["boot_id"].(string)
	return id
}

// Wall returns time t (ns) of trace i's clock as wall-clock ns since the
// Unix epoch on the common timeline: the same rule for every command, so
// that rows exported as time_ns come in the order `magnet report` sees the
// events. A trace alone, or of another machine, gets its own header's
// wall offset; traces of one boot share the first one's, so a few
// microseconds of difference between the wall offsets two recorders
// measured do not reorder events of one clock.
func (tl *Timeline) Wall(i int, t uint64) int64 {
	return int64(t) + tl.Offsets[i] + tl.wall0
}
