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
type CPUTimes struct {
	At    time.Time
	Idle  map[int]time.Duration
	Steal map[int]time.Duration
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
	t.At = time.Now()
	return t, nil
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
