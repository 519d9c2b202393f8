// SPDX-License-Identifier: Apache-2.0

package overhead

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of /proc/stat's times, USER_HZ, which the ABI fixes
// at 100 on every architecture Go runs Linux on.
const userHZ = 100

// cpuStat is /proc/stat's all-CPU line, in ticks of USER_HZ.
type cpuStat struct {
	// busy: user + nice + system + irq + softirq, less guest and
	// guest_nice (which the kernel also counts in user and nice: a
	// host's virtual machines are not what a tracer costs).
	busy uint64
	// notBusy: idle + iowait + steal.
	notBusy uint64
	// cpus: the cpuN lines, the CPUs online.
	cpus int
}

// cpuSample is a cpuStat and when it was read.
type cpuSample struct {
	at   time.Time
	stat cpuStat
}

// sampleCPU reads /proc/stat.
func sampleCPU() (cpuSample, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuSample{}, fmt.Errorf("cpu time: %w", err)
	}
	defer f.Close()
	st, err := parseStat(f)
	if err != nil {
		return cpuSample{}, fmt.Errorf("cpu time: /proc/stat: %w", err)
	}
	return cpuSample{at: time.Now(), stat: st}, nil
}

// busyBetween is the busy time of all CPUs from a to b, two ways.
//
// precise is the CPUs' elapsed time less their idle, iowait and steal
// time. With the tick stopped in idle (NO_HZ, every distribution kernel),
// the kernel measures idle and iowait at each entry and exit of the idle
// loop, to the microsecond: /proc/stat prints them in 10 ms units, so a
// reading is off by less than 10 ms per CPU, whatever the length.
//
// ticked is the sum of the busy columns, which the kernel samples (unless
// built with VIRT_CPU_ACCOUNTING or IRQ_TIME_ACCOUNTING): each tick (HZ
// per second) charges its whole period to whatever the CPU was doing at
// that instant. Over a transfer of a few seconds at 10 % busy that is a
// binomial count of some hundred ticks, off by about ± its square root
// (±7 % per run on 2 CPUs at HZ 250 over 4 s): the noise that left the
// goals undecided when the figures came from it.
func busyBetween(a, b cpuSample) (precise, ticked float64) {
	ticked = ticksSeconds(b.stat.busy - a.stat.busy)
	cpus := b.stat.cpus
	if cpus == 0 {
		cpus = runtime.NumCPU()
	}
	precise = b.at.Sub(a.at).Seconds()*float64(cpus) - ticksSeconds(b.stat.notBusy-a.stat.notBusy)
	return max(precise, 0), ticked
}

// parseStat reads /proc/stat's "cpu" line (all CPUs) and counts the cpuN
// lines.
func parseStat(r io.Reader) (cpuStat, error) {
	var st cpuStat
	found := false
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || !strings.HasPrefix(f[0], "cpu") {
			continue
		}
		if f[0] != "cpu" {
			if _, err := strconv.Atoi(f[0][3:]); err == nil {
				st.cpus++
			}
			continue
		}
		// cpu user nice system idle iowait irq softirq steal guest guest_nice;
		// kernels before 2.6.33 stop earlier, and 2.6.11 and later have
		// at least up to steal.
		if len(f) < 9 {
			return cpuStat{}, fmt.Errorf("cpu line with %d fields, want at least 8 times", len(f)-1)
		}
		var v [10]uint64
		for i := 0; i < len(v) && 1+i < len(f); i++ {
			x, err := strconv.ParseUint(f[1+i], 10, 64)
			if err != nil {
				return cpuStat{}, fmt.Errorf("cpu line, field %d: %w", i+1, err)
			}
			v[i] = x
		}
		user, nice, system, idle, iowait, irq, softirq, steal, guest, guestNice := v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9]
		st.busy = user + nice + system + irq + softirq
		if g := guest + guestNice; g <= st.busy {
			st.busy -= g
		}
		st.notBusy = idle + iowait + steal
		found = true
	}
	if err := sc.Err(); err != nil {
		return cpuStat{}, err
	}
	if !found {
		return cpuStat{}, fmt.Errorf("no cpu line")
	}
	return st, nil
}

// ticksSeconds converts /proc/stat ticks to seconds.
func ticksSeconds(n uint64) float64 {
	return float64(n) / userHZ
}

// settleWindow and settleBusy define a quiet machine: at most settleBusy
// of all CPUs' time busy over one window.
const (
	settleWindow = 250 * time.Millisecond
	settleBusy   = 0.04
)

// settle waits until the machine is quiet, at most limit, and says whether
// it became so. What a tracer leaves behind when it stops (the kernel
// freeing its maps and programs after an RCU grace period, a file's
// writeback, its process's exit) and what it does once started (the
// learning pass, the first wake-ups) would otherwise land in whichever
// transfer is measured next, as noise in the next configuration's figure.
// No event says "the machine is idle": the busy time is polled.
func settle(limit time.Duration) bool {
	allowed := settleWindow.Seconds() * float64(runtime.NumCPU()) * settleBusy
	prev, err := sampleCPU()
	if err != nil {
		return false
	}
	for end := time.Now().Add(limit); time.Now().Before(end); {
		time.Sleep(settleWindow)
		cur, err := sampleCPU()
		if err != nil {
			return false
		}
		if busy, _ := busyBetween(prev, cur); busy <= allowed {
			return true
		}
		prev = cur
	}
	return false
}
