// SPDX-License-Identifier: Apache-2.0

package kevent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
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
	fe := Availability{Kind: "fentry", Available: true, Why: "not used by --kprobe, which needs kprobes"}
	if err := fentryLoads(fentryProbe); err != nil {
		fe.Available, fe.Why = false, err.Error()
	}
	out = append(out, fe)
	return out
}

// fentryProbe is the function a test fentry program is loaded for: one
// every kernel with TCP has in its BTF.
const fentryProbe = "tcp_sendmsg"

// fentryLoads says whether the kernel accepts an fentry program on fn, by
// loading an empty one: some kernels refuse fentry (lockdown, no BPF
// trampoline) although fn is in their BTF.
func fentryLoads(fn string) error {
	if os.Geteuid() != 0 {
		return errors.New("whether this kernel accepts fentry programs is not known: testing needs root")
	}
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.Tracing, AttachType: ebpf.AttachTraceFEntry, AttachTo: fn, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		msg := err.Error()
		// cilium/ebpf guesses at a memlock limit for EPERM; the kernel
		// charges BPF memory to the cgroup, and EPERM is a refusal.
		if i := strings.Index(msg, " (MEMLOCK"); i > 0 {
			msg = msg[:i]
		}
		return fmt.Errorf("this kernel refuses fentry programs (%s)", msg)
	}
	p.Close()
	return nil
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
// the function is one the kernel can probe (in its BTF or its symbol
// table: a function inlined everywhere is in neither) and the kernel has
// kprobes. Without kprobes the answer also says whether fentry, the other
// way into a kernel function, is refused too.
func kprobeAvailable(fn string) error {
	known := false
	if kernel, err := btf.LoadKernelSpec(); err == nil {
		var f *btf.Func
		known = kernel.TypeByName(fn, &f) == nil
	}
	if !known {
		ok, err := inKallsyms(fn)
		if err != nil {
			return fmt.Errorf("kprobe %s: %w", fn, err)
		}
		if !ok {
			return fmt.Errorf("kprobe %s: no such kernel function (not in the kernel's BTF nor /proc/kallsyms)", fn)
		}
	}
	if a := pmu("kprobe", "CONFIG_KPROBE_EVENTS"); !a.Available {
		why := "; fentry would serve, but --kprobe records with kprobes only"
		if err := fentryLoads(fn); err != nil {
			why = " and " + strings.TrimPrefix(err.Error(), "this kernel ")
		}
		return fmt.Errorf("kprobe %s: %s%s; a tracepoint near it (--tracepoint) may do", fn, a.Why, why)
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
