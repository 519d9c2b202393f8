// SPDX-License-Identifier: Apache-2.0

// Package machine describes the host a benchmark runs on, for its report:
// what the papers' tables give beside their figures (CPU, cores, kernel),
// the clock rate that turns nanoseconds into cycles, and how busy the host
// was.
package machine

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Info is what Read finds; a field it cannot read stays zero.
type Info struct {
	CPU    string  // "model name" of /proc/cpuinfo (the first CPU's)
	Cores  int     // CPUs this process may use
	MHz    float64 // "cpu MHz" of /proc/cpuinfo (the first CPU's), for ns → cycles
	Kernel string  // uname: system, release, machine
	Idle   string  // how the CPUs idle (see describeIdle); "" without cpuidle
}

// Read describes this host.
func Read() Info {
	m := Info{Cores: runtime.NumCPU(), Idle: describeIdle("/sys")}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Sysname[:]) + " " + unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Machine[:])
	}
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case k == "model name" && m.CPU == "":
			m.CPU = v
		case k == "cpu MHz" && m.MHz == 0:
			m.MHz, _ = strconv.ParseFloat(v, 64)
		}
	}
	return m
}

// LoadAvg returns the 1, 5 and 15-minute load averages (zeros if
// /proc/loadavg cannot be read).
func LoadAvg() [3]float64 {
	var l [3]float64
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l
	}
	for i, f := range strings.Fields(string(b)) {
		if i == len(l) {
			break
		}
		l[i], _ = strconv.ParseFloat(f, 64)
	}
	return l
}

// describeIdle says how the CPUs idle, from sysfs under root: the cpuidle
// driver and governor and, for the haltpoll driver of a KVM guest, how long
// the guest polls before it halts. That matters to a throughput figure on a
// VM: with guest_halt_poll_ns 0 every idle moment is a halt, an exit to the
// hypervisor, and the wake-up after it an IPI the hypervisor delivers (tens
// of µs measured), which a workload that waits briefly pays each time. ""
// when the kernel has no cpuidle.
func describeIdle(root string) string {
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	driver := read("devices/system/cpu/cpuidle/current_driver")
	if driver == "" {
		return ""
	}
	d := "cpuidle " + driver
	if g := read("devices/system/cpu/cpuidle/current_governor"); g != "" {
		d += ", governor " + g
	}
	if poll := read("module/haltpoll/parameters/guest_halt_poll_ns"); poll != "" {
		d += ", guest_halt_poll_ns " + poll
		if poll == "0" {
			d += " (the guest halts at once when idle)"
		}
	}
	return d
}
