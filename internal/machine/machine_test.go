// SPDX-License-Identifier: Apache-2.0

package machine

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Read finds what every Linux host has: its cores, kernel and CPU model.
func TestRead(t *testing.T) {
	m := Read()
	if m.Cores != runtime.NumCPU() || !strings.HasPrefix(m.Kernel, "Linux ") || m.CPU == "" {
		t.Fatalf("Read() = %+v", m)
	}
}

// LoadAvg reads three non-negative averages.
func TestLoadAvg(t *testing.T) {
	l := LoadAvg()
	for _, v := range l {
		if v < 0 {
			t.Fatalf("LoadAvg() = %v", l)
		}
	}
}

func TestParseCPUTimes(t *testing.T) {
	in := `cpu  65340 63 58405 101652 892 0 11669 65 0 0
cpu0 31023 43 30223 49903 236 0 9154 29 0 0
cpu1 34317 20 28182 51749 655 0 2514 36 0 0
intr 1 2 3
`
	got, err := parseCPUTimes(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Idle) != 2 {
		t.Fatalf("%d CPUs, want 2 (the summed cpu line is not one)", len(got.Idle))
	}
	if want := (49903 + 236) * 10 * time.Millisecond; got.Idle[0] != want {
		t.Errorf("cpu0 idle %v, want idle+iowait %v", got.Idle[0], want)
	}
	if want := 36 * 10 * time.Millisecond; got.Steal[1] != want {
		t.Errorf("cpu1 steal %v, want %v", got.Steal[1], want)
	}
	for _, bad := range []string{"", "intr 1 2\n", "cpuX 1 2 3 4 5 6 7 8\n", "cpu0 1 2 3 x 5 6 7 8\n"} {
		if _, err := parseCPUTimes(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestBusySince(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := CPUTimes{At: t0, Idle: map[int]time.Duration{0: time.Second, 1: time.Second}, Steal: map[int]time.Duration{0: 0, 1: 0}}
	b := CPUTimes{At: t0.Add(2 * time.Second),
		Idle:  map[int]time.Duration{0: time.Second + 500*time.Millisecond, 1: 4 * time.Second, 2: 0},
		Steal: map[int]time.Duration{0: 100 * time.Millisecond, 1: 0}}
	busy := b.BusySince(a)
	if busy[0] != 1400*time.Millisecond {
		t.Errorf("cpu0 busy %v, want 2s - 0.5s idle - 0.1s stolen", busy[0])
	}
	if busy[1] != 0 {
		t.Errorf("cpu1 busy %v, want 0 (clamped: more idle than elapsed)", busy[1])
	}
	if _, ok := busy[2]; ok {
		t.Error("cpu2 is not in the earlier reading but has a busy time")
	}
}

func TestReadCPUTimes(t *testing.T) {
	a, err := ReadCPUTimes()
	if err != nil {
		t.Skipf("no /proc/stat here: %v", err)
	}
	if len(a.Idle) == 0 {
		t.Fatal("no CPU read")
	}
	if _, err := os.Stat("/sys/devices/system/cpu/cpu0/cpuidle/state0"); err == nil && a.Sleeps == nil {
		t.Error("this kernel has cpuidle, but no sleeps were read")
	}
	// Keep this CPU busy for a while: its busy time must show it.
	end := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(end) {
	}
	b, err := ReadCPUTimes()
	if err != nil {
		t.Fatal(err)
	}
	var total time.Duration
	for _, d := range b.BusySince(a) {
		total += d
	}
	if total < 200*time.Millisecond {
		t.Errorf("%v busy over all CPUs while this test spun 300 ms", total)
	}
}

// TestReadSleeps: idle-state entries are summed over the states other than
// POLL, and a CPU without cpuidle means no count at all.
func TestReadSleeps(t *testing.T) {
	root := t.TempDir()
	state := func(cpu, st int, name, usage string) {
		dir := filepath.Join(root, fmt.Sprintf("cpu%d/cpuidle/state%d", cpu, st))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "name"), []byte(name+"\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "usage"), []byte(usage+"\n"), 0o644)
	}
	state(0, 0, "POLL", "1000")
	state(0, 1, "haltpoll idle", "40")
	state(0, 2, "C6", "2")
	state(1, 0, "POLL", "7")
	state(1, 1, "haltpoll idle", "5")
	cpus := map[int]time.Duration{0: 0, 1: 0}
	got := readSleeps(root, cpus)
	if got[0] != 42 || got[1] != 5 {
		t.Fatalf("sleeps %v, want cpu0 42 (POLL left out), cpu1 5", got)
	}
	later := CPUTimes{Sleeps: map[int]uint64{0: 50, 1: 5}}
	if d := later.SleepsSince(CPUTimes{Sleeps: got}); d[0] != 8 || d[1] != 0 {
		t.Errorf("sleeps since %v, want cpu0 8, cpu1 0", d)
	}
	if d := later.SleepsSince(CPUTimes{}); d != nil {
		t.Errorf("sleeps since a reading without them: %v, want none", d)
	}
	cpus[2] = 0
	if got := readSleeps(root, cpus); got != nil {
		t.Errorf("cpu2 has no cpuidle, yet sleeps %v", got)
	}
}
