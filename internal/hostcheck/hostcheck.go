// SPDX-License-Identifier: Apache-2.0

// Package hostcheck measures what this host can measure: the resolution and
// cost of its clock, the cost of a system call and of sending one packet,
// its memory copy bandwidth, what its network interfaces do to packet
// timestamps (offloads that merge packets, interrupt coalescing) and how its
// CPUs change speed and sleep. From these figures it judges, for common link
// rates, whether the host can time packet pairs, time packet trains, and
// saturate the link at all.
//
// The reasoning follows Jin and Tierney, "System Capability Effects on
// Algorithms for Network Bandwidth Measurement" (IMC 2003); docs/HOSTCHECK.md
// explains each figure and rule.
package hostcheck

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// ReportVersion is the version of the Report layout; it changes when a
// field changes meaning, so that a Report stored in a trace can be read
// back correctly.
const ReportVersion = 1

// Options configures Run.
type Options struct {
	// Quick takes fewer samples so that Run finishes within about half a
	// second, for a figure to store with every trace. The figures are
	// noisier but of the same kind.
	Quick bool
}

// Report is everything Run found out about the host. All durations are in
// nanoseconds; a figure that could not be measured is zero and its
// companion *Error field says why.
type Report struct {
	// Version is ReportVersion at the time the report was made.
	Version int `json:"version"`
	// Time is when the check started.
	Time time.Time `json:"time"`
	// Quick is true when the report came from a quick run.
	Quick bool `json:"quick"`
	// TookNs is how long the check took.
	TookNs int64 `json:"took_ns"`
	// Kernel is the kernel release (uname -r).
	Kernel string `json:"kernel"`
	// CPUs is the number of CPUs this process may run on.
	CPUs int `json:"cpus"`

	Clock    Clock    `json:"clock"`
	Syscalls Syscalls `json:"syscalls"`
	Memory   Memory   `json:"memory"`
	// Interfaces lists the network interfaces of the network namespace of
	// the thread that ran the check.
	Interfaces []Interface `json:"interfaces"`
	// InterfacesError says why the interfaces could not be listed.
	InterfacesError string `json:"interfaces_error,omitempty"`
	CPU             CPU    `json:"cpu"`
}

// Run measures the host and returns its report. It takes a few seconds,
// or about half a second with opts.Quick.
//
// Run works on the calling goroutine, locked to its thread, so the network
// interfaces and the loopback socket it uses are those of that thread's
// network namespace. A figure that cannot be measured is reported in the
// Report, not as an error; Run fails only when ctx ends.
func Run(ctx context.Context, opts Options) (*Report, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	start := time.Now()
	r := &Report{
		Version: ReportVersion,
		Time:    start.UTC(), // without the monotonic reading, as stored
		Quick:   opts.Quick,
		Kernel:  kernelRelease(),
		CPUs:    runtime.NumCPU(),
	}
	s := fullSamples
	if opts.Quick {
		s = quickSamples
	}
	steps := []func(){
		func() { r.Clock = measureClock(s) },
		func() { r.Syscalls = measureSyscalls(s) },
		func() { r.Memory = measureMemory(s) },
		func() { r.Interfaces, r.InterfacesError = listInterfaces() },
		func() { r.CPU = ReadCPU(); r.CPU.measureWakeUp(s.wakeUps) },
	}
	for _, step := range steps {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("hostcheck: %w", err)
		}
		step()
	}
	r.TookNs = int64(time.Since(start))
	return r, nil
}

// samples says how much Run measures.
type samples struct {
	clockBatches   int // batches of clockBatch clock reads
	stepReads      int // successive clock reads searched for the smallest step
	syscallBatches int // batches of syscallBatch getppid calls
	sendBatches    int // batches of sendBatch UDP sends
	copies         int // memory copies timed
	copyBytes      int // size of the copied buffer
	wakeUps        int // wake-ups of an idle CPU timed, wakeGap apart
	// copyPastCache grows the buffer to four times the largest cache,
	// up to maxCopyBytes.
	copyPastCache bool
}

// fullSamples takes about a second on a 2020s server.
var fullSamples = samples{
	clockBatches:   1000,
	stepReads:      1 << 20,
	syscallBatches: 500,
	sendBatches:    1000,
	copies:         10,
	copyBytes:      64 << 20,
	wakeUps:        100,
	copyPastCache:  true,
}

// quickSamples takes well under half a second; the buffer still exceeds
// the last-level cache of most hosts.
var quickSamples = samples{
	clockBatches:   200,
	stepReads:      1 << 16,
	syscallBatches: 100,
	sendBatches:    300,
	copies:         3,
	copyBytes:      64 << 20,
	wakeUps:        30,
}

// Limits are the figures that bound what a trace taken on this host can
// show, in the form magnet report needs to warn about them.
type Limits struct {
	// ClockStepNs is the smallest time difference the clock can show:
	// the larger of the observed step and the resolution the kernel claims.
	ClockStepNs float64 `json:"clock_step_ns"`
	// SendCostNs is the time one thread needs to send one 1500-byte packet.
	SendCostNs float64 `json:"send_cost_ns"`
	// MemcpyGBps is the memory copy bandwidth in 10^9 bytes per second:
	// the median copy, which the verdicts use; MemcpyMinGBps and
	// MemcpyMaxGBps are the slowest and fastest.
	MemcpyGBps    float64 `json:"memcpy_gbps"`
	MemcpyMinGBps float64 `json:"memcpy_min_gbps,omitempty"`
	MemcpyMaxGBps float64 `json:"memcpy_max_gbps,omitempty"`
	// IdleWakeUpNs is how long an idle CPU took to run a thread woken
	// from another (median): an event on a CPU that was idle is
	// timestamped up to about that late. 0 when not measured.
	IdleWakeUpNs float64 `json:"idle_wakeup_ns,omitempty"`
}

// Limits returns the figures that bound what a trace taken on this host can
// show. A figure that was not measured is zero.
func (r *Report) Limits() Limits {
	return Limits{
		ClockStepNs:   max(r.Clock.ObservedStepNs, float64(r.Clock.ClaimedResolutionNs)),
		SendCostNs:    r.Syscalls.UDPSendNs,
		MemcpyGBps:    r.Memory.CopyGBps,
		MemcpyMinGBps: r.Memory.CopyMinGBps,
		MemcpyMaxGBps: r.Memory.CopyMaxGBps,
		IdleWakeUpNs:  r.CPU.WakeUpNs,
	}
}

// MaxPacedPacketRate returns how many packets per second one thread can
// send back to back, or 0 when the send cost is unknown.
func (l Limits) MaxPacedPacketRate() float64 {
	if l.SendCostNs <= 0 {
		return 0
	}
	return 1e9 / l.SendCostNs
}

// MaxPacedBitRate returns the highest bit rate one thread can send with
// PacketBytes-sized packets, or 0 when the send cost is unknown.
func (l Limits) MaxPacedBitRate() float64 {
	return l.MaxPacedPacketRate() * PacketBytes * 8
}

// MaxReceiveBitRate returns the highest bit rate of PacketBytes-sized
// packets this host can receive and record, from its memory copy
// bandwidth: each packet is copied ReceiveCopies times and magnet writes
// RecordBytesPerPacket bytes about it. It is 0 when memcpy is unknown.
func (l Limits) MaxReceiveBitRate() float64 {
	perPacket := float64(ReceiveCopies*PacketBytes + RecordBytesPerPacket) // bytes moved
	packets := l.MemcpyGBps * 1e9 / perPacket
	return packets * PacketBytes * 8
}

// kernelRelease returns uname -r, or "" if uname fails.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}
