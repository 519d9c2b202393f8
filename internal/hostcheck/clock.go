// SPDX-License-Identifier: Apache-2.0

package hostcheck

import (
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// clocksourceDir holds the kernel's choice of clock source.
const clocksourceDir = "/sys/devices/system/clocksource/clocksource0"

// clockBatch is how many clock reads one timed batch makes; enough that
// the two reads timing the batch add under 1% to each read.
const clockBatch = 1000

// Clock describes the clock that timestamps packets: the kernel's
// CLOCK_MONOTONIC, which eBPF's bpf_ktime_get_ns reads too.
type Clock struct {
	// Source is the kernel's current clock source (tsc, hpet, kvm-clock,
	// acpi_pm, arch_sys_counter, ...); "" if unknown.
	Source string `json:"source"`
	// Available lists the clock sources the kernel could switch to.
	Available []string `json:"available,omitempty"`
	// ConstantTSC is true when the CPU's time stamp counter ticks at a
	// fixed rate whatever the CPU frequency (cpuinfo flag constant_tsc).
	ConstantTSC bool `json:"constant_tsc"`
	// NonstopTSC is true when the time stamp counter keeps ticking in deep
	// C-states (cpuinfo flag nonstop_tsc).
	NonstopTSC bool `json:"nonstop_tsc"`
	// ClaimedResolutionNs is what clock_getres(CLOCK_MONOTONIC) says.
	ClaimedResolutionNs int64 `json:"claimed_resolution_ns"`
	// ObservedStepNs is the smallest non-zero difference between two
	// successive reads of the clock.
	ObservedStepNs float64 `json:"observed_step_ns"`
	// SameValueFraction is the fraction of successive reads that returned
	// the same time, a sign of a coarse clock.
	SameValueFraction float64 `json:"same_value_fraction"`
	// ReadCostNs is the median time of one clock read (clock_gettime
	// through the vDSO, as Go's time package does it).
	ReadCostNs float64 `json:"read_cost_ns"`
}

// measureClock reads the clock source from sysfs and times the clock.
func measureClock(s samples) Clock {
	c := Clock{
		Source:    readTrim(clocksourceDir + "/current_clocksource"),
		Available: strings.Fields(readTrim(clocksourceDir + "/available_clocksource")),
	}
	c.ConstantTSC, c.NonstopTSC = tscFlags()
	var ts unix.Timespec
	if err := unix.ClockGetres(unix.CLOCK_MONOTONIC, &ts); err == nil {
		c.ClaimedResolutionNs = ts.Nano()
	}

	// time.Since on a time with a monotonic reading does one
	// clock_gettime(CLOCK_MONOTONIC) and nothing else.
	base := time.Now()
	reads := make([]time.Duration, s.stepReads)
	for i := range reads {
		reads[i] = time.Since(base)
	}
	c.ObservedStepNs, c.SameValueFraction = smallestStep(reads)

	costs := make([]float64, s.clockBatches)
	var sink time.Duration
	for i := range costs {
		t0 := time.Since(base)
		for range clockBatch {
			sink += time.Since(base)
		}
		costs[i] = float64(time.Since(base)-t0) / clockBatch
	}
	_ = sink
	c.ReadCostNs = median(costs)
	return c
}

// smallestStep returns the smallest positive difference between successive
// readings, in ns, and the fraction of successive readings that were equal.
func smallestStep(reads []time.Duration) (step, same float64) {
	var smallest time.Duration
	equal := 0
	for i := 1; i < len(reads); i++ {
		d := reads[i] - reads[i-1]
		switch {
		case d == 0:
			equal++
		case d > 0 && (smallest == 0 || d < smallest):
			smallest = d
		}
	}
	if len(reads) > 1 {
		same = float64(equal) / float64(len(reads)-1)
	}
	return float64(smallest), same
}

// tscFlags reports whether the first CPU in /proc/cpuinfo has the
// constant_tsc and nonstop_tsc flags.
func tscFlags() (constant, nonstop bool) {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return false, false
	}
	for line := range strings.Lines(string(b)) {
		key, val, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(key) != "flags" {
			continue
		}
		flags := strings.Fields(val)
		return slices.Contains(flags, "constant_tsc"), slices.Contains(flags, "nonstop_tsc")
	}
	return false, false
}

// median returns the median of v, reordering v; 0 if v is empty.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// readTrim returns the content of a small file without surrounding white
// space, or "" if it cannot be read.
func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
