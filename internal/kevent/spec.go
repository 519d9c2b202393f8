// SPDX-License-Identifier: Apache-2.0

// Package kevent records kernel events chosen at run time: any tracepoint
// (its fields decoded from its tracefs format), uprobes on applications'
// functions, and the receive path's built-in groups (irq, napi). It loads
// bpf/kevent.bpf.c once per event, writes each event's layout into the
// trace's dictionary so that readers decode it with no code of their own,
// and counts produced and lost events per event exactly as the built-in
// events are counted.
package kevent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Kind is how an event is hooked.
type Kind int

// The kinds of kernel event.
const (
	Tracepoint Kind = iota
	Uprobe
	USDT
	Kprobe
)

func (k Kind) String() string {
	switch k {
	case Tracepoint:
		return "tracepoint"
	case Uprobe:
		return "uprobe"
	case USDT:
		return "usdt"
	case Kprobe:
		return "kprobe"
	}
	return "kind " + strconv.Itoa(int(k))
}

// Spec is one kernel event asked for.
type Spec struct {
	Kind Kind
	// System and Name name a tracepoint (napi, napi_poll); for a kprobe,
	// Name is the function.
	System, Name string
	// Filter is a test on the tracepoint's fields, checked in the kernel
	// (tpformat.ParseFilter).
	Filter string
	// Binary and Symbol name a uprobe's function; Provider and Name a USDT
	// probe of Binary.
	Binary, Symbol, Provider string
	// Group is the group the event belongs to in the trace: irq or napi
	// for the built-in groups, else the kind.
	Group string
	// System-wide events happen in interrupts, whatever task is current:
	// the --pid, --cgroup and --netns filters are not applied to them.
	SystemWide bool
}

func (s Spec) String() string {
	switch s.Kind {
	case Uprobe:
		return "uprobe " + s.Binary + ":" + s.Symbol
	case USDT:
		return "usdt " + s.Binary + ":" + s.Provider + ":" + s.Name
	case Kprobe:
		return "kprobe " + s.Name
	}
	t := "tracepoint " + s.System + ":" + s.Name
	if s.Filter != "" {
		t += " if " + s.Filter
	}
	return t
}

// ParseTracepoint parses a --tracepoint value: SYSTEM:NAME, optionally
// followed by "if FILTER".
func ParseTracepoint(v string) (Spec, error) {
	v = strings.TrimSpace(v)
	name, filter, hasFilter := strings.Cut(v, " if ")
	if !hasFilter && strings.HasSuffix(v, " if") {
		return Spec{}, fmt.Errorf("tracepoint %q: empty filter after \"if\"", v)
	}
	sys, n, ok := strings.Cut(strings.TrimSpace(name), ":")
	if !ok || !ident(sys) || !ident(n) {
		return Spec{}, fmt.Errorf("tracepoint %q: want SYSTEM:NAME [if FILTER], e.g. napi:napi_poll", v)
	}
	filter = strings.TrimSpace(filter)
	if hasFilter && filter == "" {
		return Spec{}, fmt.Errorf("tracepoint %q: empty filter after \"if\"", v)
	}
	return Spec{Kind: Tracepoint, System: sys, Name: n, Filter: filter, Group: "tracepoint"}, nil
}

// ParseUprobe parses a --uprobe value: BINARY:SYMBOL.
func ParseUprobe(v string) (Spec, error) {
	i := strings.LastIndexByte(v, ':')
	if i <= 0 || i == len(v)-1 {
		return Spec{}, fmt.Errorf("uprobe %q: want BINARY:SYMBOL, e.g. /usr/sbin/nginx:ngx_http_finalize_request", v)
	}
	bin, sym := v[:i], v[i+1:]
	path, err := findBinary(bin)
	if err != nil {
		return Spec{}, fmt.Errorf("uprobe %q: %w", v, err)
	}
	return Spec{Kind: Uprobe, Binary: path, Symbol: sym, Group: "uprobe"}, nil
}

// ParseUSDT parses a --usdt value: BINARY:PROVIDER:NAME.
func ParseUSDT(v string) (Spec, error) {
	parts := strings.Split(v, ":")
	if len(parts) < 3 || !ident(parts[len(parts)-1]) || !ident(parts[len(parts)-2]) {
		return Spec{}, fmt.Errorf("usdt %q: want BINARY:PROVIDER:NAME", v)
	}
	bin := strings.Join(parts[:len(parts)-2], ":")
	path, err := findBinary(bin)
	if err != nil {
		return Spec{}, fmt.Errorf("usdt %q: %w", v, err)
	}
	return Spec{Kind: USDT, Binary: path, Provider: parts[len(parts)-2], Name: parts[len(parts)-1], Group: "usdt"}, nil
}

// ParseKprobe parses a --kprobe value: a kernel function's name.
func ParseKprobe(v string) (Spec, error) {
	if !ident(v) {
		return Spec{}, fmt.Errorf("kprobe %q: want a kernel function's name", v)
	}
	return Spec{Kind: Kprobe, Name: v, Group: "kprobe"}, nil
}

func findBinary(bin string) (string, error) {
	if !strings.Contains(bin, "/") {
		for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
			p := filepath.Join(dir, bin)
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p, nil
			}
		}
		return "", fmt.Errorf("%s not found in PATH", bin)
	}
	st, err := os.Stat(bin)
	if err != nil {
		return "", errors.Unwrap(err)
	}
	if st.IsDir() {
		return "", fmt.Errorf("%s is a directory", bin)
	}
	return bin, nil
}

func ident(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i, r := range s {
		switch {
		case r == '_' || r == '.', r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// Builtin groups of `--events`: the receive path's interrupts and polls.
var builtin = map[string]struct {
	help  string
	specs []Spec
}{
	"irq": {
		"hard interrupts of network devices, NET_RX and NET_TX softirqs (opt-in): irq_handler_entry/exit, softirq_entry/exit",
		[]Spec{
			{Kind: Tracepoint, System: "irq", Name: "irq_handler_entry", Group: "irq", SystemWide: true},
			{Kind: Tracepoint, System: "irq", Name: "irq_handler_exit", Group: "irq", SystemWide: true},
			{Kind: Tracepoint, System: "irq", Name: "softirq_entry", Filter: "vec == 2 || vec == 3", Group: "irq", SystemWide: true},
			{Kind: Tracepoint, System: "irq", Name: "softirq_exit", Filter: "vec == 2 || vec == 3", Group: "irq", SystemWide: true},
		},
	},
	"napi": {
		"NAPI polls: device, packets taken (work) and budget (opt-in): napi_poll",
		[]Spec{{Kind: Tracepoint, System: "napi", Name: "napi_poll", Group: "napi", SystemWide: true}},
	},
}

// GroupHelp describes the built-in groups, one a line, for --help.
func GroupHelp() string {
	var names []string
	for n := range builtin {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "  %-9s %s\n", n, builtin[n].help)
	}
	return b.String()
}

// SplitGroups takes the built-in groups of this package (irq, napi) out of
// an --events value: it returns the rest, for event.ParseGroups, and the
// groups' events. The irq group's hard interrupts are narrowed to the
// network devices' interrupt lines (NetIRQs); a host where none is found
// records none of them, and says so in notes.
func SplitGroups(events string) (rest string, specs []Spec, notes []string, err error) {
	var keep []string
	seen := map[string]bool{}
	for _, part := range strings.Split(events, ",") {
		p := strings.TrimSpace(part)
		g, ok := builtin[strings.TrimPrefix(p, "-")]
		if !ok {
			keep = append(keep, part)
			continue
		}
		if strings.HasPrefix(p, "-") || seen[p] {
			continue // not in any default: removing it removes nothing
		}
		seen[p] = true
		for _, s := range g.specs {
			if s.System == "irq" && strings.HasPrefix(s.Name, "irq_handler") {
				irqs := NetIRQs()
				if len(irqs) == 0 {
					if s.Name == "irq_handler_entry" {
						notes = append(notes, "irq: no network device has an interrupt line of its own here (virtual devices such as veth have none): hard interrupts are not recorded")
					}
					continue
				}
				if len(irqs) > 8 {
					irqs = irqs[:8]
					if s.Name == "irq_handler_entry" {
						notes = append(notes, "irq: more than 8 network interrupt lines; the first 8 are recorded")
					}
				}
				var tests []string
				for _, n := range irqs {
					tests = append(tests, "irq == "+strconv.Itoa(n))
				}
				s.Filter = strings.Join(tests, " || ")
			}
			specs = append(specs, s)
		}
	}
	if len(keep) == 0 && len(specs) > 0 {
		// "--events napi" records napi alone, as "--events sched" does
		// sched (and the connection records every trace has).
		keep = []string{"conn"}
	}
	return strings.Join(keep, ","), specs, notes, nil
}

// NetIRQs lists the interrupt lines of the host's network devices: the
// MSI vectors or the legacy line of each device under /sys/class/net (or
// of the PCI device a virtio device sits on).
func NetIRQs() []int {
	seen := map[int]bool{}
	devs, _ := filepath.Glob("/sys/class/net/*/device")
	for _, d := range devs {
		p, err := filepath.EvalSymlinks(d)
		if err != nil {
			continue
		}
		for up := 0; up < 2 && p != "/"; up, p = up+1, filepath.Dir(p) {
			msi, _ := os.ReadDir(filepath.Join(p, "msi_irqs"))
			for _, e := range msi {
				if n, err := strconv.Atoi(e.Name()); err == nil {
					seen[n] = true
				}
			}
			if len(msi) > 0 {
				break
			}
			if b, err := os.ReadFile(filepath.Join(p, "irq")); err == nil {
				if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
					seen[n] = true
					break
				}
			}
		}
	}
	var out []int
	for n := range seen {
		out = append(out, n)
	}
	sort.Ints(out)
	return out
}
