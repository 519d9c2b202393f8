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
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	c = CPU{}
	c.measureWakeUp(3)
	if !strings.Contains(c.WakeUpError, "GOMAXPROCS 1") || c.WakeUpSamples != 0 {
		t.Errorf("with GOMAXPROCS 1: %+v, want an error saying so and no figure", c)
	}
}

// MeasureWakeUp gives what Run reports: a median no longer than the longest.
func TestMeasureWakeUp(t *testing.T) {
	median, longest, err := MeasureWakeUp(10)
	if runtime.NumCPU() < 2 || runtime.GOMAXPROCS(0) < 2 {
		if err == nil {
			t.Errorf("one CPU or GOMAXPROCS 1, yet measured %v", median)
		}
		return
	}
	if err != nil || median <= 0 || longest < median {
		t.Fatalf("MeasureWakeUp(10) = %v, %v, %v; want 0 < median ≤ longest", median, longest, err)
	}
	t.Logf("idle wake-up %v median, %v longest", median, longest)
}
