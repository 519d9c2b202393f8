// SPDX-License-Identifier: Apache-2.0

package kevent

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"

	"github.com/magnet-tracer/magnet/internal/tpformat"
)

// Availability says whether this kernel offers one kind of kernel event.
type Availability struct {
	Kind      string `json:"kind"`
	Available bool   `json:"available"`
	Why       string `json:"why,omitempty"`
}

// Kinds lists the kinds of kernel event and whether this kernel offers
// them, for `magnet status`.
func Kinds() []Availability {
	var out []Availability
	tp := Availability{Kind: "tracepoint", Available: true}
	if tpformat.Find() == "" {
		// magnet record mounts it when it is root.
		tp.Why = "tracefs is not mounted (magnet record mounts it at /sys/kernel/tracing)"
		if _, err := os.Stat("/sys/kernel/tracing"); err != nil {
			tp.Available, tp.Why = false, "this kernel has no tracefs (CONFIG_TRACING is off)"
		}
	}
	if err := features.HaveProgramType(ebpf.TracePoint); err != nil && tp.Available {
		tp.Available, tp.Why = false, "BPF tracepoint programs: "+err.Error()
	}
	out = append(out, tp)
	up := pmu("uprobe", "CONFIG_UPROBE_EVENTS")
	out = append(out, up)
	out = append(out, Availability{Kind: "usdt", Available: up.Available, Why: up.Why})
	kp := pmu("kprobe", "CONFIG_KPROBE_EVENTS")
	if kp.Available {
		kp.Available, kp.Why = false, errKprobeBuild.Error()
	}
	out = append(out, kp)
	return out
}

// pmu checks for a perf event source of the kernel (kprobe, uprobe).
func pmu(name, config string) Availability {
	a := Availability{Kind: name, Available: true}
	if _, err := os.Stat("/sys/bus/event_source/devices/" + name); err != nil {
		a.Available = false
		a.Why = fmt.Sprintf("this kernel has no %ss (%s is off)", name, config)
	}
	return a
}

// kprobeAvailable explains why a --kprobe cannot be recorded.
func kprobeAvailable(fn string) error {
	if a := pmu("kprobe", "CONFIG_KPROBE_EVENTS"); !a.Available {
		return fmt.Errorf("kprobe %s: %s; a tracepoint near it (--tracepoint) may do", fn, a.Why)
	}
	return fmt.Errorf("kprobe %s: %w", fn, errKprobeBuild)
}

var errKprobeBuild = errors.New("kprobes are not recorded by this build of magnet; a tracepoint near the function (--tracepoint) may do")
