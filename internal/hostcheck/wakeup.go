// SPDX-License-Identifier: Apache-2.0

package hostcheck

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// wakeGap is how long the sleeping CPU is left idle before each wake-up:
// long enough for it to leave polling for its idle state (a KVM guest's
// haltpoll polls for up to guest_halt_poll_ns, 200 µs by default).
const wakeGap = time.Millisecond

// measureWakeUp times how long an idle CPU takes to run a thread woken
// from another CPU, n times: a thread pinned to one CPU waits for a pipe
// to become readable, a thread pinned to another sleeps wakeGap, reads the
// clock and writes it down the pipe, and the reader reads the clock as
// soon as it runs. That is the path of a packet's interrupt to an idle CPU: an IPI,
// the CPU leaving its idle state (on a VM guest that halted, the
// hypervisor scheduling the vCPU again), the scheduler. The C-states'
// claimed exit latencies leave the hypervisor out; this does not.
//
// It fills c.WakeUpNs (median) and c.WakeUpMaxNs, or c.WakeUpError when it
// cannot measure (one CPU, or pinning refused). Both threads exit locked,
// so the runtime ends them and the caller's affinity is untouched.
func (c *CPU) measureWakeUp(n int) {
	cpus, err := twoCPUs()
	if err != nil {
		c.WakeUpError = err.Error()
		return
	}
	// The reader waits holding a P (see below): the writer needs another.
	// magnet record runs on one P; it gets a second for the measurement
	// (before its probes load), or its traces would carry no wake-up and
	// report's slow-wake warning would never fire.
	if procs := runtime.GOMAXPROCS(0); procs < 2 {
		runtime.GOMAXPROCS(2)
		defer runtime.GOMAXPROCS(procs)
	}
	var pipe [2]int
	if err := unix.Pipe2(pipe[:], unix.O_CLOEXEC); err != nil {
		c.WakeUpError = fmt.Sprintf("pipe: %v", err)
		return
	}
	defer unix.Close(pipe[0])
	writeEnd := pipe[1]
	defer func() {
		if writeEnd >= 0 {
			unix.Close(writeEnd)
		}
	}()

	type result struct {
		lat []time.Duration
		err error
	}
	done, wrote := make(chan result, 1), make(chan error, 1)
	readerReady, writerReady := make(chan error, 1), make(chan error, 1)
	// Both threads are pinned before either starts, so that a refusal
	// leaves neither waiting on the pipe.
	start := make(chan bool)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		readerReady <- pinTo(cpus[1])
		if !<-start {
			return
		}
		lat := make([]time.Duration, 0, n)
		b := make([]byte, 8)
		for len(lat) < n {
			// Waiting in a raw system call, the thread keeps its P
			// and runs on at once when woken, instead of queueing for
			// one in exitsyscall once sysmon has taken it away (that
			// added ~30 µs to every wake-up, measured). ppoll with a
			// timeout, not a blocking read: a stop-the-world waits for
			// this thread, and it must not wait for a writer the stop
			// itself holds.
			ready, closed := waitReadable(pipe[0])
			if closed {
				done <- result{err: errors.New("the writer closed the pipe")}
				return
			}
			if !ready {
				continue // timed out: once every 5 ms at most
			}
			now := monotonicNs()
			if k, err := unix.Read(pipe[0], b); err != nil || k != len(b) {
				done <- result{err: fmt.Errorf("read %d bytes: %v", k, err)}
				return
			}
			lat = append(lat, time.Duration(now-int64(binary.NativeEndian.Uint64(b))))
		}
		done <- result{lat: lat}
	}()
	go func() {
		runtime.LockOSThread()
		writerReady <- pinTo(cpus[0])
		if !<-start {
			return
		}
		b := make([]byte, 8)
		for range n {
			time.Sleep(wakeGap)
			binary.NativeEndian.PutUint64(b, uint64(monotonicNs()))
			if _, err := unix.Write(pipe[1], b); err != nil {
				wrote <- fmt.Errorf("write: %w", err)
				return
			}
		}
		wrote <- nil
	}()
	if err := errors.Join(<-readerReady, <-writerReady); err != nil {
		close(start) // a closed channel reads false: both threads end
		c.WakeUpError = err.Error()
		return
	}
	start <- true
	start <- true
	if err := <-wrote; err != nil {
		// Closing the write end ends the reader's read; it is waited for
		// before the read end closes, so it never reads a reused
		// descriptor.
		unix.Close(writeEnd)
		writeEnd = -1
		<-done
		c.WakeUpError = err.Error()
		return
	}
	res := <-done
	if res.err != nil {
		c.WakeUpError = res.err.Error()
		return
	}
	slices.Sort(res.lat)
	c.WakeUpNs = float64(res.lat[len(res.lat)/2])
	c.WakeUpMaxNs = float64(res.lat[len(res.lat)-1])
	c.WakeUpSamples = len(res.lat)
}

// MeasureWakeUp times n wake-ups of an idle CPU as hostcheck does (see
// CPU.WakeUpNs) and returns their median and longest, or why it could not.
func MeasureWakeUp(n int) (median, longest time.Duration, err error) {
	var c CPU
	c.measureWakeUp(n)
	if c.WakeUpError != "" {
		return 0, 0, errors.New(c.WakeUpError)
	}
	return time.Duration(c.WakeUpNs), time.Duration(c.WakeUpMaxNs), nil
}

// twoCPUs returns the first two CPUs this thread may run on.
func twoCPUs() ([2]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return [2]int{}, fmt.Errorf("affinity: %w", err)
	}
	var cpus []int
	for i := 0; i < 8*int(unsafe.Sizeof(set)) && len(cpus) < 2; i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	if len(cpus) < 2 {
		return [2]int{}, errors.New("one CPU: no other CPU to wake")
	}
	return [2]int{cpus[0], cpus[1]}, nil
}

// pinTo binds the calling thread to cpu.
func pinTo(cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("pin to CPU %d: %w", cpu, err)
	}
	return nil
}

// monotonicNs reads CLOCK_MONOTONIC, the clock both threads share.
func monotonicNs() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// waitReadable waits up to 5 ms for pipe end fd to become readable, in a
// raw ppoll, and says whether it did, or whether the write end is closed
// with nothing left to read.
func waitReadable(fd int) (ready, closed bool) {
	pfd := unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	ts := unix.NsecToTimespec(int64(5 * time.Millisecond))
	n, _, errno := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1,
		uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	if errno != 0 || n != 1 {
		return false, false // timed out, or interrupted: try again
	}
	if pfd.Revents&unix.POLLIN != 0 {
		return true, false
	}
	return false, pfd.Revents&(unix.POLLHUP|unix.POLLERR) != 0
}
