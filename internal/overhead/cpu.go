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

// busyTicks reads the machine's busy time over all CPUs from /proc/stat.
func busyTicks() (uint64, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("cpu time: %w", err)
	}
	defer f.Close()
	n, err := parseBusy(f)
	if err != nil {
		return 0, fmt.Errorf("cpu time: /proc/stat: %w", err)
	}
	return n, nil
}

// parseBusy returns the busy ticks of /proc/stat's "cpu" line (all CPUs):
// user + nice + system + irq + softirq, less guest and guest_nice (which
// the kernel also counts in user and nice: a host's virtual machines are
// not what a tracer costs), steal and idle never counted. Whatever ran is
// in it: the workload, the tracers, softirq, kernel threads, BPF programs.
func parseBusy(r io.Reader) (uint64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "cpu" {
			continue
		}
		// cpu user nice system idle iowait irq softirq steal guest guest_nice;
		// kernels before 2.6.33 stop earlier, and 2.6.11 and later have
		// at least up to steal.
		if len(f) < 9 {
			return 0, fmt.Errorf("cpu line with %d fields, want at least 8 times", len(f)-1)
		}
		var v [10]uint64
		for i := 0; i < len(v) && 1+i < len(f); i++ {
			x, err := strconv.ParseUint(f[1+i], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cpu line, field %d: %w", i+1, err)
			}
			v[i] = x
		}
		user, nice, system, irq, softirq, guest, guestNice := v[0], v[1], v[2], v[5], v[6], v[8], v[9]
		busy := user + nice + system + irq + softirq
		if g := guest + guestNice; g <= busy {
			busy -= g
		}
		return busy, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no cpu line")
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
	window := float64(settleWindow) / float64(time.Second) * userHZ * float64(runtime.NumCPU())
	allowed := uint64(window * settleBusy)
	prev, err := busyTicks()
	if err != nil {
		return false
	}
	for end := time.Now().Add(limit); time.Now().Before(end); {
		time.Sleep(settleWindow)
		cur, err := busyTicks()
		if err != nil {
			return false
		}
		if cur-prev <= allowed {
			return true
		}
		prev = cur
	}
	return false
}
