// SPDX-License-Identifier: Apache-2.0

package report

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/magnet-tracer/magnet/internal/analyze"
)

// writeRxPath prints a trace's receive path: per CPU the share of its time
// in hard interrupts, NET_RX/NET_TX softirqs and NAPI polls, the packets
// per poll, and how each connection's packets fell into polls.
func writeRxPath(w io.Writer, rp *analyze.RxPath) {
	fmt.Fprintf(w, "\nreceive path (%s): time per CPU over %.2f s\n", rp.Trace, rp.SpanS)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "cpu\thard irq %\tirqs\tNET_RX %\tsoftirqs\tNET_TX %\tsoftirqs\tNAPI %\tpolls\tpackets\tper poll mean\tmedian\tp99\tfull budget\t")
	pct := func(v float64) string { return strconv.FormatFloat(100*v, 'f', 2, 64) }
	for _, c := range append(rp.CPUs, rp.All) {
		cpu := "all"
		if c.CPU >= 0 {
			cpu = strconv.Itoa(c.CPU)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%d\t%s\t%d\t%d\t%.1f\t%.0f\t%.0f\t%d\t\n", cpu,
			pct(c.HardIRQShare), c.HardIRQs, pct(c.NetRxShare), c.NetRx, pct(c.NetTxShare), c.NetTx,
			pct(c.NapiShare), c.Polls, c.Packets, c.PerPoll.Mean, c.PerPoll.Median, c.PerPoll.P99, c.FullPolls)
	}
	tw.Flush()
	if len(rp.PacketsPerPoll) > 0 {
		var ks []int
		for k := range rp.PacketsPerPoll {
			ks = append(ks, k)
		}
		sort.Ints(ks)
		var parts []string
		for _, k := range ks {
			parts = append(parts, fmt.Sprintf("%d:%d", k, rp.PacketsPerPoll[k]))
		}
		fmt.Fprintf(w, "  polls by packets taken (packets:polls): %s\n", strings.Join(parts, " "))
	}
	for _, n := range rp.NICs {
		fmt.Fprintf(w, "  %s (hostcheck): %s\n", n.Name, coalescing(n))
	}
	for _, c := range rp.Conns {
		fmt.Fprintf(w, "  connection %d: %d packets in %d polls (%.1f a poll), %d of the polls shared with other connections", c.Conn, c.Packets, c.Polls, c.PerPoll, c.SharedPolls)
		if c.OutsidePolls > 0 {
			fmt.Fprintf(w, "; %d packets in no poll", c.OutsidePolls)
		}
		fmt.Fprintln(w)
	}
	if len(rp.Conns) > 0 {
		fmt.Fprintf(w, "  each poll's connections: magnet export %s --table polls -f csv -o polls.csv\n", rp.Trace)
	}
	if rp.Lost > 0 {
		fmt.Fprintf(w, "  warning: %d irq/napi events were lost: the figures are short\n", rp.Lost)
	}
}

// coalescing says how an interface coalesces receive interrupts, as
// ethtool -c would.
func coalescing(n analyze.NICCoalesce) string {
	var parts []string
	if n.RxUsecs != nil {
		parts = append(parts, fmt.Sprintf("rx-usecs %d", *n.RxUsecs))
	}
	if n.RxFrames != nil {
		parts = append(parts, fmt.Sprintf("rx-frames %d", *n.RxFrames))
	}
	if n.AdaptiveRx != nil {
		parts = append(parts, fmt.Sprintf("adaptive-rx %v", *n.AdaptiveRx))
	}
	if len(parts) == 0 {
		what := n.Error
		if what == "" {
			what = "not reported"
		}
		parts = append(parts, "coalescing "+what)
	}
	gro := "off"
	if n.GRO {
		gro = "on"
	}
	return strings.Join(parts, ", ") + ", GRO " + gro
}

// writeKernelEvents says which kernel events chosen at run time a trace
// holds, and where their fields are shown.
func writeKernelEvents(w io.Writer, kc *analyze.KernelEventCounts) {
	var parts []string
	for _, e := range kc.Events {
		parts = append(parts, fmt.Sprintf("%s %d", e.Name, e.Records))
	}
	fmt.Fprintf(w, "\nkernel events (%s): %s\n", kc.Trace, strings.Join(parts, ", "))
	fmt.Fprintln(w, "  their fields: magnet parse --types NAME; on a timeline: magnet export -f perfetto")
}
