// SPDX-License-Identifier: Apache-2.0

package hostcheck

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// cpuDir is where sysfs describes the CPUs.
const cpuDir = "/sys/devices/system/cpu"

// haltPollDir holds the parameters of a KVM guest's haltpoll cpuidle driver.
const haltPollDir = "/sys/module/haltpoll/parameters"

// DeepIdleLatencyUs is the exit latency, in µs, above which an idle state
// disturbs timing: waking from it delays the handling of the first packet
// after a quiet period by more than the gap between two 1500-byte packets
// at 1 Gb/s (12 µs), so that gap can no longer be timed.
const DeepIdleLatencyUs = 10

// CPU describes how the CPUs change speed and sleep, as sysfs shows it
// for CPU 0.
type CPU struct {
	// ScalingDriver is the cpufreq driver (intel_pstate, amd-pstate-epp,
	// acpi-cpufreq, ...); "" when there is no frequency scaling.
	ScalingDriver string `json:"scaling_driver,omitempty"`
	// Governor is the cpufreq governor (performance, powersave, schedutil,
	// ondemand, ...).
	Governor string `json:"governor,omitempty"`
	// CurKHz, MinKHz and MaxKHz are scaling_cur_freq, scaling_min_freq and
	// scaling_max_freq in kHz, 0 if unknown.
	CurKHz int64 `json:"cur_khz,omitempty"`
	MinKHz int64 `json:"min_khz,omitempty"`
	MaxKHz int64 `json:"max_khz,omitempty"`
	// PstateStatus is the status of intel_pstate or amd_pstate (active,
	// passive, guided), "" if neither is loaded.
	PstateStatus string `json:"pstate_status,omitempty"`
	// IdleDriver is the cpuidle driver, "" without cpuidle.
	IdleDriver string `json:"idle_driver,omitempty"`
	// IdleGovernor is the cpuidle governor (menu, teo, haltpoll, ...).
	IdleGovernor string `json:"idle_governor,omitempty"`
	// IdleStates are the C-states of CPU 0, shallowest first.
	IdleStates []IdleState `json:"idle_states,omitempty"`
	// GuestHaltPollNs is a KVM guest's haltpoll guest_halt_poll_ns: how
	// long an idle vCPU polls before it halts (0: it halts at once); ""
	// where there is no haltpoll module.
	GuestHaltPollNs string `json:"guest_halt_poll_ns,omitempty"`
	// WakeUpNs is the median time an idle CPU took to run a thread woken
	// from another CPU (see measureWakeUp), WakeUpMaxNs the longest, over
	// WakeUpSamples wake-ups; zero with WakeUpError saying why when it
	// could not be measured.
	WakeUpNs      float64 `json:"wakeup_ns,omitempty"`
	WakeUpMaxNs   float64 `json:"wakeup_max_ns,omitempty"`
	WakeUpSamples int     `json:"wakeup_samples,omitempty"`
	WakeUpError   string  `json:"wakeup_error,omitempty"`
}

// IdleState is one cpuidle state (C-state).
type IdleState struct {
	Name string `json:"name"`
	Desc string `json:"desc,omitempty"`
	// LatencyUs is the worst-case time, in µs, to wake from the state.
	LatencyUs int64 `json:"latency_us"`
	// Disabled is true when the state may not be entered.
	Disabled bool `json:"disabled"`
}

// ReadCPU reads cpufreq and cpuidle from sysfs; the wake-up is not measured.
func ReadCPU() CPU {
	freq := cpuDir + "/cpu0/cpufreq/"
	c := CPU{
		ScalingDriver: readTrim(freq + "scaling_driver"),
		Governor:      readTrim(freq + "scaling_governor"),
		CurKHz:        readInt(freq + "scaling_cur_freq"),
		MinKHz:        readInt(freq + "scaling_min_freq"),
		MaxKHz:        readInt(freq + "scaling_max_freq"),
		IdleDriver:    readTrim(cpuDir + "/cpuidle/current_driver"),
		IdleGovernor:  readTrim(cpuDir + "/cpuidle/current_governor"),
		// The module's parameters are there whether or not it drives
		// cpuidle; they matter only when it does.
		GuestHaltPollNs: readTrim(haltPollDir + "/guest_halt_poll_ns"),
	}
	if c.IdleDriver != "haltpoll" {
		c.GuestHaltPollNs = ""
	}
	for _, p := range []string{"intel_pstate", "amd_pstate"} {
		if s := readTrim(cpuDir + "/" + p + "/status"); s != "" {
			c.PstateStatus = p + " " + s
			break
		}
	}
	dirs, _ := filepath.Glob(cpuDir + "/cpu0/cpuidle/state*")
	slices.SortFunc(dirs, func(a, b string) int { return stateNumber(a) - stateNumber(b) })
	for _, d := range dirs {
		c.IdleStates = append(c.IdleStates, IdleState{
			Name:      readTrim(d + "/name"),
			Desc:      readTrim(d + "/desc"),
			LatencyUs: readInt(d + "/latency"),
			Disabled:  readTrim(d+"/disable") == "1",
		})
	}
	return c
}

// IdleSummary says in one line how the CPUs idle: the cpuidle driver and
// governor and, for a KVM guest's haltpoll, how long it polls before it
// halts; "" without cpuidle. On a guest that halts at once, a workload
// that waits briefly pays a hypervisor wake-up each time, which moves a
// throughput figure (docs/BENCH.md at d71bc17, "A machine whose sender waits").
func (c CPU) IdleSummary() string {
	if c.IdleDriver == "" {
		return ""
	}
	d := "cpuidle " + c.IdleDriver
	if c.IdleGovernor != "" {
		d += ", governor " + c.IdleGovernor
	}
	if c.GuestHaltPollNs != "" {
		d += ", guest_halt_poll_ns " + c.GuestHaltPollNs
		if c.GuestHaltPollNs == "0" {
			d += " (the guest halts at once when idle)"
		}
	}
	return d
}

// Disturbances returns, in plain words, each way the CPU's frequency
// scaling and idle states disturb timing; nil if none does.
func (c CPU) Disturbances() []string {
	var out []string
	switch c.Governor {
	case "powersave":
		if strings.HasSuffix(c.PstateStatus, "active") {
			out = append(out, "governor powersave with "+c.PstateStatus+
				": the CPU picks its own frequency by load, so the first packets of a burst are handled more slowly")
		} else {
			out = append(out, "governor powersave: the CPU runs at its lowest frequency, so every per-packet cost is higher")
		}
	case "ondemand", "conservative", "schedutil":
		out = append(out, "governor "+c.Governor+
			": the frequency follows the load, so costs differ between an idle and a busy moment")
	}
	if c.WakeUpNs > DeepIdleLatencyUs*1e3 {
		why := ""
		if c.GuestHaltPollNs == "0" {
			why = "; this VM guest halts at once when idle (haltpoll guest_halt_poll_ns 0), and the hypervisor must run it again"
		}
		out = append(out, fmt.Sprintf(
			"idle CPU wake-up %.0f µs: a thread woken on an idle CPU ran %.0f µs later (median of %d, longest %.0f µs), so a packet arriving at an idle CPU waits about that long before it is timestamped%s",
			c.WakeUpNs/1e3, c.WakeUpNs/1e3, c.WakeUpSamples, c.WakeUpMaxNs/1e3, why))
	}
	for _, s := range c.IdleStates {
		if !s.Disabled && s.LatencyUs > DeepIdleLatencyUs {
			out = append(out, fmt.Sprintf(
				"idle state %s enabled with %d µs exit latency: a packet arriving at an idle CPU waits up to %d µs before it is timestamped",
				s.Name, s.LatencyUs, s.LatencyUs))
		}
	}
	return out
}

// stateNumber returns N of a path ending in stateN, or -1.
func stateNumber(dir string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(dir), "state"))
	if err != nil {
		return -1
	}
	return n
}

// readInt returns the integer in a small file, or 0.
func readInt(path string) int64 {
	n, err := strconv.ParseInt(readTrim(path), 10, 64)
	if err != nil {
		return 0
	}
	return n
}
