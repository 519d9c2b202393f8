// SPDX-License-Identifier: Apache-2.0

package machine

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of /proc/stat's times: the kernel's USER_HZ, which the
// ABI fixes at 100 on every architecture Go runs Linux on.
const userHZ = 100

// CPUTimes is, per CPU, how long it has been idle (idle + iowait) and how
// long the hypervisor kept it from running (steal) since boot, as
// /proc/stat counts them, and when they were read. The kernel computes a
// tickless CPU's idle time from its idle entries and exits, the idle period
// under way included, so two readings a few seconds apart give its busy time
// to /proc/stat's 10 ms resolution whatever ran there: processes, softirq,
// kernel threads, BPF programs.
//
// Sleeps is, per CPU, how many times it entered an idle state other than
// polling (cpuidle's usage counts; on a VM, each is a halt the hypervisor
// sees, and a wake-up after it); nil where the kernel has no cpuidle.
type CPUTimes struct {
	At     time.Time
	Idle   map[int]time.Duration
	Steal  map[int]time.Duration
	Sleeps map[int]uint64
}

// ReadCPUTimes reads /proc/stat.
func ReadCPUTimes() (CPUTimes, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return CPUTimes{}, fmt.Errorf("cpu times: %w", err)
	}
	defer f.Close()
	t, err := parseCPUTimes(f)
	if err != nil {
		return CPUTimes{}, fmt.Errorf("cpu times: /proc/stat: %w", err)
	}
	t.Sleeps = readSleeps("/sys/devices/system/cpu", t.Idle)
	t.At = time.Now()
	return t, nil
}

// readSleeps sums, for each CPU of cpus, the usage of its cpuidle states
// other than POLL under root; nil if a CPU has none.
func readSleeps(root string, cpus map[int]time.Duration) map[int]uint64 {
	sleeps := map[int]uint64{}
	for cpu := range cpus {
		dir := fmt.Sprintf("%s/cpu%d/cpuidle", root, cpu)
		states, err := os.ReadDir(dir)
		if err != nil || len(states) == 0 {
			return nil
		}
		var n uint64
		for _, st := range states {
			name, err1 := os.ReadFile(dir + "/" + st.Name() + "/name")
			usage, err2 := os.ReadFile(dir + "/" + st.Name() + "/usage")
			if err1 != nil || err2 != nil {
				return nil
			}
			if strings.TrimSpace(string(name)) == "POLL" {
				continue
			}
			u, err := strconv.ParseUint(strings.TrimSpace(string(usage)), 10, 64)
			if err != nil {
				return nil
			}
			n += u
		}
		sleeps[cpu] = n
	}
	return sleeps
}

// SleepsSince is, per CPU, the idle-state entries other than polling
// between two readings; nil if either reading has none.
func (t CPUTimes) SleepsSince(earlier CPUTimes) map[int]uint64 {
	if t.Sleeps == nil || earlier.Sleeps == nil {
		return nil
	}
	d := map[int]uint64{}
	for cpu, n := range t.Sleeps {
		if n0, ok := earlier.Sleeps[cpu]; ok && n >= n0 {
			d[cpu] = n - n0
		}
	}
	return d
}

func parseCPUTimes(r io.Reader) (CPUTimes, error) {
	t := CPUTimes{Idle: map[int]time.Duration{}, Steal: map[int]time.Duration{}}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// "cpuN user nice system idle iowait irq softirq steal ...";
		// the "cpu" line is the sum.
		if len(f) < 9 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		cpu, err := strconv.Atoi(f[0][3:])
		if err != nil {
			return CPUTimes{}, fmt.Errorf("line %q: %w", f[0], err)
		}
		var v [8]uint64
		for i := range v {
			if v[i], err = strconv.ParseUint(f[1+i], 10, 64); err != nil {
				return CPUTimes{}, fmt.Errorf("%s: field %d: %w", f[0], i+1, err)
			}
		}
		tick := time.Second / userHZ
		t.Idle[cpu] = time.Duration(v[3]+v[4]) * tick
		t.Steal[cpu] = time.Duration(v[7]) * tick
	}
	if err := sc.Err(); err != nil {
		return CPUTimes{}, err
	}
	if len(t.Idle) == 0 {
		return CPUTimes{}, fmt.Errorf("no cpuN line")
	}
	return t, nil
}

// BusySince is, per CPU present in both readings, the time between them that
// the CPU was neither idle nor stolen, clamped to [0, elapsed] (the two
// counts are read at slightly different moments and in 10 ms steps).
func (t CPUTimes) BusySince(earlier CPUTimes) map[int]time.Duration {
	wall := t.At.Sub(earlier.At)
	busy := map[int]time.Duration{}
	for cpu, idle := range t.Idle {
		idle0, ok := earlier.Idle[cpu]
		if !ok {
			continue
		}
		b := wall - (idle - idle0) - (t.Steal[cpu] - earlier.Steal[cpu])
		busy[cpu] = min(max(b, 0), wall)
	}
	return busy
}
