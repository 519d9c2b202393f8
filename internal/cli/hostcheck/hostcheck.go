// SPDX-License-Identifier: Apache-2.0

// Package hostcheckcmd is the `magnet hostcheck` command: it measures what
// this host can measure (clock, system calls, memory, network interfaces,
// CPU power management) and judges, for common link rates, whether it can
// time packet pairs and packet trains and saturate the link.
package hostcheckcmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/hostcheck"
)

// output is what --json prints: the report with its limits and verdicts.
type output struct {
	*hostcheck.Report
	Limits   hostcheck.Limits    `json:"limits"`
	Verdicts []hostcheck.Verdict `json:"verdicts"`
}

// New returns the hostcheck command.
func New() *cobra.Command {
	var (
		asJSON, quick bool
		iface         string
	)
	cmd := &cobra.Command{
		Use:   "hostcheck",
		Short: "Measure what this host can measure: clock, system calls, memory, interfaces, CPU",
		Long: `Measure, in a few seconds, the figures that limit what this host can measure
on a network: the clock's resolution and cost, the cost of a system call and
of sending a packet, memory copy bandwidth, what each network interface does
to packet timestamps (GRO, LRO, interrupt coalescing), and CPU frequency
scaling and idle states. Then judge, for 100 Mb/s to 100 Gb/s, whether the
host can time packet pairs, time packet trains, and saturate the link.

The verdict considers the receive side of every interface that is up and not
a loopback, the worst deciding, or only the one named by --interface.
See docs/HOSTCHECK.md for the rules.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			rep, err := hostcheck.Run(ctx, hostcheck.Options{Quick: quick})
			if err != nil {
				return err
			}
			verdicts, err := rep.Verdicts(iface)
			if err != nil {
				return fmt.Errorf("hostcheck: %w (see the interfaces listed by magnet hostcheck)", err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(output{Report: rep, Limits: rep.Limits(), Verdicts: verdicts})
			}
			return Write(out, rep, verdicts)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.BoolVar(&quick, "quick", false, "take fewer samples (about half a second; noisier figures)")
	f.StringVar(&iface, "interface", "", "judge only this receiving interface (default: all that are up)")
	return cmd
}

// Write prints rep and its verdicts as text: one section per subject, each
// line "name: value — meaning", then the verdict table.
func Write(w io.Writer, rep *hostcheck.Report, verdicts []hostcheck.Verdict) error {
	p := &printer{w: w}
	writeClock(p, rep)
	writeSyscalls(p, rep)
	writeMemory(p, rep)
	writeInterfaces(p, rep)
	writeCPU(p, rep)
	writeVerdicts(p, verdicts)
	return p.err
}

// printer writes lines and keeps the first write error.
type printer struct {
	w   io.Writer
	err error
}

// section starts a section with its title.
func (p *printer) section(title string) {
	if p.err != nil {
		return
	}
	_, p.err = fmt.Fprintf(p.w, "%s\n", title)
}

// line writes "  name: value — meaning".
func (p *printer) line(name, value, meaning string) {
	if p.err != nil {
		return
	}
	if meaning == "" {
		_, p.err = fmt.Fprintf(p.w, "  %s: %s\n", name, value)
		return
	}
	_, p.err = fmt.Fprintf(p.w, "  %s: %s — %s\n", name, value, meaning)
}

func writeClock(p *printer, rep *hostcheck.Report) {
	c := rep.Clock
	p.section("Clock")
	src := c.Source
	if src == "" {
		src = "unknown"
	}
	if len(c.Available) > 0 {
		src += " (available: " + strings.Join(c.Available, ", ") + ")"
	}
	p.line("source", src, clockSourceMeaning(c.Source))
	tsc := fmt.Sprintf("constant %s, non-stop %s", yesNo(c.ConstantTSC), yesNo(c.NonstopTSC))
	switch {
	case c.ConstantTSC && c.NonstopTSC:
		p.line("TSC", tsc, "the counter ticks at one rate whatever the CPU frequency, even in idle states")
	case !c.ConstantTSC:
		p.line("TSC", tsc, "the counter's rate follows the CPU frequency; the kernel must correct it, or avoid it")
	default:
		p.line("TSC", tsc, "the counter may stop in deep idle states; the kernel must resynchronise it")
	}
	p.line("claimed resolution", hostcheck.FormatNs(float64(c.ClaimedResolutionNs)),
		"what clock_getres(CLOCK_MONOTONIC) says; the observed step is what counts")
	p.line("observed step", hostcheck.FormatNs(c.ObservedStepNs),
		"the smallest time difference two successive timestamps showed: no gap shorter than this can be seen")
	if c.SameValueFraction > 0.01 {
		p.line("repeated readings", fmt.Sprintf("%.0f%%", 100*c.SameValueFraction),
			"successive reads often return the same time: the clock is coarser than its reads are fast")
	}
	p.line("read cost", hostcheck.FormatNs(c.ReadCostNs),
		"each timestamp costs this much CPU time (median; clock_gettime through the vDSO)")
}

// clockSourceMeaning explains a clock source in plain words.
func clockSourceMeaning(src string) string {
	switch src {
	case "tsc":
		return "the CPU's time stamp counter: read in a few ns without entering the kernel"
	case "kvm-clock", "hyperv_clocksource_tsc_page", "xen":
		return "a paravirtual clock from the hypervisor: fine-grained, a little dearer than the TSC"
	case "arch_sys_counter":
		return "the CPU's generic timer: read without entering the kernel"
	case "hpet":
		return "the HPET chip: each read goes out to a device and costs about a microsecond"
	case "acpi_pm":
		return "the ACPI power management timer: slow to read and coarse (279 ns ticks)"
	case "jiffies":
		return "the scheduler tick: millisecond resolution, useless for packet timing"
	case "":
		return "sysfs does not say which clock the kernel uses"
	}
	return "the kernel's current clock source"
}

func writeSyscalls(p *printer, rep *hostcheck.Report) {
	s := rep.Syscalls
	l := rep.Limits()
	p.section("System calls")
	p.line("minimal system call", hostcheck.FormatNs(s.MinimalNs),
		"getppid: the bare price of entering and leaving the kernel (median)")
	if s.UDPSendError != "" {
		p.line(fmt.Sprintf("UDP send of %d bytes", s.UDPSendBytes), "not measured",
			s.UDPSendError+"; the pacing rate is unknown")
		return
	}
	p.line(fmt.Sprintf("UDP send of %d bytes", s.UDPSendBytes), hostcheck.FormatNs(s.UDPSendNs),
		"one send through the whole IP stack to a socket of our own on 127.0.0.1 (median)")
	p.line("highest paced rate",
		fmt.Sprintf("%s packets/s, %s", formatCount(l.MaxPacedPacketRate()), hostcheck.FormatBitRate(l.MaxPacedBitRate())),
		fmt.Sprintf("one thread sending %d-byte packets back to back can go no faster", hostcheck.PacketBytes))
	p.line("smallest inter-packet gap", hostcheck.FormatNs(s.UDPSendNs),
		"one thread cannot space its packets closer than one send")
}

func writeMemory(p *printer, rep *hostcheck.Report) {
	m := rep.Memory
	l := rep.Limits()
	p.section("Memory")
	meaning := fmt.Sprintf("one thread copying a %d MiB buffer", m.BufferBytes>>20)
	if m.LargestCacheBytes >= m.BufferBytes {
		meaning += fmt.Sprintf("; the CPU reports a %d MiB cache, so part of the copy may hit it and the figure may be high",
			m.LargestCacheBytes>>20)
	} else {
		meaning += ", larger than the caches"
	}
	if m.Copies > 1 && m.CopyMaxGBps > m.CopyMinGBps {
		meaning = fmt.Sprintf("median of %d copies, from %.3g to %.3g GB/s; ", m.Copies, m.CopyMinGBps, m.CopyMaxGBps) + meaning
	}
	p.line("copy bandwidth", fmt.Sprintf("%.3g GB/s", m.CopyGBps), meaning)
	p.line("highest receive-and-record rate", hostcheck.FormatBitRate(l.MaxReceiveBitRate()),
		fmt.Sprintf("each received byte crosses memory %d times (DMA, copy to the reader) and magnet writes %d bytes per %d-byte packet",
			hostcheck.ReceiveCopies, hostcheck.RecordBytesPerPacket, hostcheck.PacketBytes))
}

func writeInterfaces(p *printer, rep *hostcheck.Report) {
	p.section("Interfaces")
	if rep.InterfacesError != "" {
		p.line("interfaces", "not listed", rep.InterfacesError)
		return
	}
	for _, ifc := range rep.Interfaces {
		state := "down"
		if ifc.Up {
			state = "up"
		}
		link := fmt.Sprintf("%s, MTU %d", state, ifc.MTU)
		var meaning string
		switch {
		case ifc.SpeedError != "":
			link += ", speed " + ifc.SpeedError
		case ifc.SpeedMbps > 0:
			link += ", speed " + hostcheck.FormatBitRate(float64(ifc.SpeedMbps)*1e6)
			meaning = "the rate the driver reports for the link"
		default:
			link += ", speed unknown"
			meaning = "the driver does not know the link's rate (no carrier or a virtual device)"
		}
		if ifc.Loopback {
			meaning = "loopback: never the receive path of a measured network"
		}
		p.line(ifc.Name+" link", link, meaning)

		if ifc.OffloadsError != "" {
			p.line(ifc.Name+" offloads", ifc.OffloadsError, "whether packets are merged is unknown")
		} else if o := ifc.Offloads; o != nil {
			val := fmt.Sprintf("GRO %s, hardware GRO %s, LRO %s, GSO %s, TSO %s",
				onOff(o.GRO), onOff(o.GROHW), onOff(o.LRO), onOff(o.GSO), onOff(o.TSO))
			meaning := "received packets are timestamped one by one"
			if o.Merges() {
				meaning = "received packets of a flow are merged: one timestamp per merged super-packet, so gaps inside it are lost"
			}
			if o.GSO || o.TSO {
				meaning += "; GSO/TSO: sends leave the stack as super-packets cut up later, so send-side events are per super-packet"
			}
			p.line(ifc.Name+" offloads", val, meaning)
		}

		if ifc.CoalesceError != "" {
			meaning := "the NIC's interrupt delay is unknown"
			if ifc.CoalesceError == "unsupported by driver" {
				meaning = "the driver has no interrupt coalescing to report (usual for virtual devices)"
			}
			p.line(ifc.Name+" coalescing", ifc.CoalesceError, meaning)
		} else if c := ifc.Coalesce; c != nil {
			p.line(ifc.Name+" coalescing", coalesceValue(c), coalesceMeaning(c))
		}
	}
}

// coalesceValue lists the coalescing settings the driver reported.
func coalesceValue(c *hostcheck.Coalesce) string {
	var parts []string
	if c.RxUsecs != nil {
		parts = append(parts, fmt.Sprintf("rx-usecs %d", *c.RxUsecs))
	}
	if c.RxFrames != nil {
		parts = append(parts, fmt.Sprintf("rx-frames %d", *c.RxFrames))
	}
	if c.AdaptiveRx != nil {
		parts = append(parts, "adaptive-rx "+onOff(*c.AdaptiveRx))
	}
	if len(parts) == 0 {
		return "nothing reported"
	}
	return strings.Join(parts, ", ")
}

// coalesceMeaning explains what coalescing does to timestamps.
func coalesceMeaning(c *hostcheck.Coalesce) string {
	switch {
	case c.Adaptive():
		return "the driver changes the interrupt delay with the load: packets close together may share a timestamp"
	case c.RxUsecs != nil && *c.RxUsecs > 0:
		return fmt.Sprintf("packets arriving within %d µs share one interrupt and so one timestamp: no smaller gap can be measured", *c.RxUsecs)
	case c.RxFrames != nil && *c.RxFrames > 1:
		return fmt.Sprintf("the NIC waits for %d packets before it interrupts: they share one timestamp", *c.RxFrames)
	}
	return "the NIC interrupts at every packet: timestamps are per packet"
}

func writeCPU(p *printer, rep *hostcheck.Report) {
	c := rep.CPU
	p.section("CPU")
	if c.Governor == "" && c.ScalingDriver == "" {
		p.line("frequency scaling", "none visible",
			"no cpufreq in sysfs: a fixed frequency, or one the firmware or hypervisor manages")
	} else {
		val := c.Governor
		if c.ScalingDriver != "" {
			val += " (" + c.ScalingDriver + ")"
		}
		if c.PstateStatus != "" {
			val += ", " + c.PstateStatus
		}
		meaning := "the frequency policy of CPU 0"
		if c.Governor == "performance" {
			meaning = "CPUs stay at their highest frequency: steady per-packet costs"
		}
		p.line("governor", val, meaning)
		if c.MaxKHz > 0 {
			p.line("frequency", fmt.Sprintf("now %d MHz, range %d–%d MHz", c.CurKHz/1000, c.MinKHz/1000, c.MaxKHz/1000),
				"send and receive costs above were measured at whatever frequency the CPU ran")
		}
	}
	if len(c.IdleStates) == 0 {
		p.line("idle states", "none visible", "no cpuidle in sysfs")
	} else {
		var parts []string
		for _, s := range c.IdleStates {
			part := fmt.Sprintf("%s %d µs", s.Name, s.LatencyUs)
			if s.Disabled {
				part += " (disabled)"
			}
			parts = append(parts, part)
		}
		val := strings.Join(parts, ", ")
		if c.IdleDriver != "" {
			val += " (" + c.IdleDriver + ")"
		}
		p.line("idle states", val, "the time each state takes to wake from, as the kernel claims it")
	}
	if c.GuestHaltPollNs != "" {
		meaning := "a KVM guest polls this long when idle before it halts and leaves the CPU to the hypervisor"
		if c.GuestHaltPollNs == "0" {
			meaning = "this KVM guest halts at once when idle: every wake-up goes through the hypervisor"
		}
		p.line("guest halt polling", c.GuestHaltPollNs+" ns", meaning)
	}
	switch {
	case c.WakeUpError != "":
		p.line("idle wake-up", "not measured", c.WakeUpError)
	case c.WakeUpSamples > 0:
		p.line("idle wake-up", fmt.Sprintf("%s (longest %s)", hostcheck.FormatNs(c.WakeUpNs), hostcheck.FormatNs(c.WakeUpMaxNs)),
			fmt.Sprintf("a thread blocked on an idle CPU, woken from another, ran this much later (median of %d): the real cost of leaving idle, hypervisor included", c.WakeUpSamples))
	}
	dist := c.Disturbances()
	if len(dist) == 0 {
		p.line("timing disturbance", "none found",
			fmt.Sprintf("no power-saving governor, no enabled idle state slower than %d µs to wake, and no slower wake-up measured", hostcheck.DeepIdleLatencyUs))
	}
	for _, d := range dist {
		name, meaning, _ := strings.Cut(d, ": ")
		p.line("timing disturbance", name, meaning)
	}
}

func writeVerdicts(p *printer, verdicts []hostcheck.Verdict) {
	p.section(fmt.Sprintf("Verdict (%d-byte packets; trains of %d packets)", hostcheck.PacketBytes, hostcheck.TrainPackets))
	if p.err != nil {
		return
	}
	tw := tabwriter.NewWriter(p.w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  RATE\tGAP\tPAIRS\tTRAINS\tSATURATE")
	for _, v := range verdicts {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", hostcheck.FormatBitRate(v.RateBps), hostcheck.FormatNs(v.GapNs),
			answer(v.Pairs), answer(v.Trains), answer(v.Saturate))
	}
	if p.err = tw.Flush(); p.err != nil {
		return
	}
	// One line per distinct reason, with the columns and rates it applies
	// to, in the order the reasons first appear.
	type because struct{ figure, detail string }
	var order []because
	cols := make(map[because][]string)
	rates := make(map[because][]string)
	for _, v := range verdicts {
		for _, a := range []struct {
			col string
			ans hostcheck.Answer
		}{{"pairs", v.Pairs}, {"trains", v.Trains}, {"saturate", v.Saturate}} {
			for _, r := range a.ans.LimitedBy {
				b := because{r.Figure, r.Detail}
				if cols[b] == nil {
					order = append(order, b)
				}
				if !slices.Contains(cols[b], a.col) {
					cols[b] = append(cols[b], a.col)
				}
				if rate := hostcheck.FormatBitRate(v.RateBps); !slices.Contains(rates[b], rate) {
					rates[b] = append(rates[b], rate)
				}
			}
		}
	}
	if len(order) == 0 {
		return
	}
	p.section("Why not")
	for _, b := range order {
		at := strings.Join(rates[b], ", ")
		if len(rates[b]) == len(verdicts) {
			at = "every rate"
		}
		p.line(fmt.Sprintf("%s at %s", strings.Join(cols[b], ", "), at), b.figure, b.detail)
	}
}

// answer is a table cell: "yes", or "no: " and the limiting figures.
func answer(a hostcheck.Answer) string {
	if a.OK {
		return "yes"
	}
	var figs []string
	for _, r := range a.LimitedBy {
		if !slices.Contains(figs, r.Figure) {
			figs = append(figs, r.Figure)
		}
	}
	return "no: " + strings.Join(figs, ", ")
}

// formatCount formats a large number with three significant digits and
// a k, M or G suffix: "1.29 M".
func formatCount(n float64) string {
	for _, u := range []struct {
		scale float64
		name  string
	}{{1e9, " G"}, {1e6, " M"}, {1e3, " k"}} {
		if n >= u.scale {
			return strconv.FormatFloat(n/u.scale, 'g', 3, 64) + u.name
		}
	}
	return strconv.FormatFloat(n, 'g', 3, 64)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
