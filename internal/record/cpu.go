// SPDX-License-Identifier: Apache-2.0

package record

import (
	"time"

	"golang.org/x/sys/unix"
)

// CPU is what the recording process spent of the CPU, split where the
// recorder's work changes: getting ready (loading and verifying the
// programs, which is most of it, and attaching them) and recording (from the
// probes attached to the last event drained, so that the drain's cost per
// event is Record / events written). Stopping (detaching the programs,
// before the last drain; writing the summary and unloading, after it) is
// in neither: it is a fixed cost, not the events'. It is the whole
// process's CPU time (getrusage RUSAGE_SELF): for `magnet record`, the
// recorder's; a recorder run inside a bigger program counts that
// program's other threads too.
type CPU struct {
	Setup        time.Duration // process start to probes attached
	Record       time.Duration // probes attached to the last event drained
	RecordSystem time.Duration // Record's part spent in the kernel (system calls, faults)
}

// PerEvent is Record over n events, in ns; 0 without events.
func (c CPU) PerEvent(n uint64) float64 {
	if n == 0 {
		return 0
	}
	return float64(c.Record.Nanoseconds()) / float64(n)
}

// summary is the form of c in the trace summary's extra (docs/FORMAT.md).
func (c CPU) summary() map[string]int64 {
	return map[string]int64{
		"setup":         c.Setup.Nanoseconds(),
		"record":        c.Record.Nanoseconds(),
		"record_system": c.RecordSystem.Nanoseconds(),
	}
}

// processCPU is the process's user and system CPU time so far; zeros if
// getrusage fails (it does not for RUSAGE_SELF).
func processCPU() (user, system time.Duration) {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}
