// SPDX-License-Identifier: Apache-2.0

package record

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/magnet-tracer/magnet/internal/kevent"
)

// kernelFlags are the flags of kernel events chosen at run time.
type kernelFlags struct {
	tracepoints, uprobes, usdts, kprobes []string
}

func (k *kernelFlags) add(f *pflag.FlagSet) {
	// StringArray, not StringSlice: a filter may hold commas.
	f.StringArrayVar(&k.tracepoints, "tracepoint", nil, "also record this tracepoint, SYSTEM:NAME [if FILTER] (repeatable; fields decoded from its tracefs format; FILTER: FIELD OP NUMBER joined by && and ||, checked in the kernel)")
	f.StringArrayVar(&k.uprobes, "uprobe", nil, "also record calls of a program's function, BINARY:SYMBOL, with its first six argument registers (repeatable)")
	f.StringArrayVar(&k.usdts, "usdt", nil, "also record a USDT probe, BINARY:PROVIDER:NAME (repeatable; see magnet status for this kernel)")
	f.StringArrayVar(&k.kprobes, "kprobe", nil, "also record calls of a kernel function (repeatable; see magnet status for this kernel)")
}

// specs turns the flags and the kernel-event groups of --events into the
// events to record; rest is --events without those groups.
func (k *kernelFlags) specs(events string) (rest string, specs []kevent.Spec, err error) {
	rest, specs, notes, err := kevent.SplitGroups(events)
	if err != nil {
		return "", nil, err
	}
	for _, n := range notes {
		fmt.Fprintf(os.Stderr, "magnet: note: %s\n", n)
	}
	for _, list := range []struct {
		vals  []string
		parse func(string) (kevent.Spec, error)
	}{
		{k.tracepoints, kevent.ParseTracepoint},
		{k.uprobes, kevent.ParseUprobe},
		{k.usdts, kevent.ParseUSDT},
		{k.kprobes, kevent.ParseKprobe},
	} {
		for _, v := range list.vals {
			s, err := list.parse(v)
			if err != nil {
				return "", nil, err
			}
			specs = append(specs, s)
		}
	}
	return rest, specs, nil
}

const kernelHelp = `
Kernel events chosen at run time (groups of --groups, or flags):
%s  --tracepoint SYSTEM:NAME [if FILTER]   any tracepoint of the kernel
  --uprobe BINARY:SYMBOL                 an application's function
Their fields are written into the trace's dictionary, so parse, export and
report show them with no code of their own. Kernel addresses are never
recorded; a text of variable length keeps its first 64 bytes.
`

func kernelGroupHelp() string {
	return fmt.Sprintf(kernelHelp, kevent.GroupHelp())
}
