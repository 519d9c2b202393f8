// SPDX-License-Identifier: Apache-2.0

// Package machine describes the host a benchmark runs on, for its report:
// what the papers' tables give beside their figures (CPU, cores, kernel),
// the clock rate that turns nanoseconds into cycles, and how busy the host
// was.
package machine

import (
	"bufio"
	"os"
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
}

// Read describes this host.
func Read() Info {
	m := Info{Cores: runtime.NumCPU()}
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
