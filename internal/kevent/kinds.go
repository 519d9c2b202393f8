// SPDX-License-Identifier: Apache-2.0

package kevent

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
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
	out = append(out, pmu("kprobe", "CONFIG_KPROBE_EVENTS"))
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

// kprobeAvailable says why a --kprobe cannot be recorded, nil when it can:
// the kernel has kprobes and the function is one it can probe (in its BTF
// or its symbol table: a function inlined everywhere is in neither).
func kprobeAvailable(fn string) error {
	if a := pmu("kprobe", "CONFIG_KPROBE_EVENTS"); !a.Available {
		return fmt.Errorf("kprobe %s: %s; a tracepoint near it (--tracepoint) may do", fn, a.Why)
	}
	if kernel, err := btf.LoadKernelSpec(); err == nil {
		var f *btf.Func
		if kernel.TypeByName(fn, &f) == nil {
			return nil
		}
	}
	ok, err := inKallsyms(fn)
	if err != nil {
		return fmt.Errorf("kprobe %s: %w", fn, err)
	}
	if !ok {
		return fmt.Errorf("kprobe %s: no such kernel function (not in the kernel's BTF nor /proc/kallsyms)", fn)
	}
	return nil
}

// inKallsyms says whether /proc/kallsyms lists fn as a text symbol.
func inKallsyms(fn string) (bool, error) {
	f, err := os.Open("/proc/kallsyms")
	if err != nil {
		return false, fmt.Errorf("read the kernel's symbols: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "ADDRESS TYPE NAME [MODULE]"; the address is never kept.
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && fields[2] == fn && strings.ContainsAny(fields[1], "tT") {
			return true, nil
		}
	}
	return false, sc.Err()
}
