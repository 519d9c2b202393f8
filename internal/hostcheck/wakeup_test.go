// SPDX-License-Identifier: Apache-2.0

package hostcheck

import (
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Where it cannot wake one CPU from another, measureWakeUp says why and
// measures nothing; the thread it ran on keeps its affinity.
func TestWakeUpCannotMeasure(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}
	defer unix.SchedSetaffinity(0, &all)

	one := all
	for cpu, kept := 0, false; cpu < 1024; cpu++ {
		if one.IsSet(cpu) {
			if kept {
				one.Clear(cpu)
			}
			kept = true
		}
	}
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	var c CPU
	c.measureWakeUp(3)
	if !strings.Contains(c.WakeUpError, "one CPU") || c.WakeUpSamples != 0 || c.WakeUpNs != 0 {
		t.Errorf("on one CPU: %+v, want an error saying so and no figure", c)
	}
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil || after != one {
		t.Errorf("affinity changed to %v (%v), want %v", after, err, one)
	}
	if err := unix.SchedSetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}

	if runtime.NumCPU() < 2 {
		return
	}
	// magnet record runs on one P: the wake-up is measured all the same
	// (before, the trace carried none), and the P count is given back.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	c = CPU{}
	c.measureWakeUp(3)
	if c.WakeUpError != "" || c.WakeUpSamples != 3 || c.WakeUpNs <= 0 {
		t.Errorf("with GOMAXPROCS 1: %+v, want three wake-ups measured", c)
	}
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Errorf("GOMAXPROCS %d after the measurement, want 1 back", n)
	}
}

// MeasureWakeUp gives what Run reports: a median no longer than the longest.
func TestMeasureWakeUp(t *testing.T) {
	median, longest, err := MeasureWakeUp(10)
	if runtime.NumCPU() < 2 {
		if err == nil {
			t.Errorf("one CPU, yet measured %v", median)
		}
		return
	}
	if err != nil || median <= 0 || longest < median {
		t.Fatalf("MeasureWakeUp(10) = %v, %v, %v; want 0 < median ≤ longest", median, longest, err)
	}
	t.Logf("idle wake-up %v median, %v longest", median, longest)
}
