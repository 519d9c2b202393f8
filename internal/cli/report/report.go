// SPDX-License-Identifier: Apache-2.0

// Package report is the `magnet report` command.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/archive"
	"github.com/magnet-tracer/magnet/internal/cli/diff"
	"github.com/magnet-tracer/magnet/internal/evselect"
	"github.com/magnet-tracer/magnet/internal/outfile"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// New returns the report command.
func New() *cobra.Command {
	var conn uint64
	var asJSON, salvage bool
	var htmlOut, compare string
	var selFlags archive.Flags
	var evFlags evselect.Flags
	cmd := &cobra.Command{
		Use:   "report TRACE... [EXPRESSION] [--conn ID] [--json] [--host H --since T --until T] | report A.mgt --compare B.mgt",
		Short: "Show how each layer of the stack reshapes what the application sent (modulation)",
		Long: `For each connection (busiest first) and for the host: at every layer the data
passes, from the application's sends down to the device and up to the
receiving application, the number of events, bytes, data size (mean, median,
p99) and spacing between events (mean, median, p99 in microseconds, and the
coefficient of variation) -- MAGNeT's Table II. Pure ACKs and failed calls
are left out at the socket and TCP layers. Then the send buffer, throughput,
TCP state and where time goes: the delay of each hop a segment takes.

With sched events (record --groups default,sched), a sched section per trace:
context switches per CPU (count, rate, time between switches), the
context-switch time (sched_entry_tp to sched_exit_tp, kernels 6.16+), the
wakeup-to-run latency (sched_wakeup to the switch that runs the task), and,
for each connection's receive path, where the reading thread was while data
waited in the socket for it.

Several traces (e.g. the sender's and the receiver's, recorded apart) go on
one timeline: the same clock when recorded during one boot of one machine,
else their wall clocks. The two ends of each connection are paired across
them, and every data segment is followed from the sender's tcp_xmit over the
wire (dev_xmit→dev_recv) to the receiver's sock_recv: "end to end".

A TRACE may be a file, the files of a rotated recording (one timeline), or a
directory or archive, narrowed with --host, --since and --until: each
recording selected is one trace of the report.

Arguments after the traces are a pcap-filter expression ("tcp port 443"),
--filter a CEL expression over the event's fields, --types and --groups
event types and groups: the report sees only the events they select, as
parse prints them (docs/FILTERS.md).

With --compare B.mgt, the report is magnet diff's of the one trace given
and B: the busiest sending connection's figures and every layer's
distributions of both runs side by side, marked where they differ beyond
run-to-run noise (--json prints the comparison as JSON).`,
		Example: `  magnet report ftp.mgt
  magnet report --json sender.mgt receiver.mgt
  magnet report --conn 4129 --html ftp.html ftp.mgt
  magnet report /srv/magnet-archive --host a,b --since 10:00 --until 10:05
  magnet report before.mgt --compare after.mgt`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if compare != "" {
				// The comparison of two runs is diff's: the same figures,
				// the same noise floors, the same output.
				if conn != 0 || htmlOut != "" {
					return fmt.Errorf("report: --compare compares the busiest connections of two runs: it takes neither --conn nor --html")
				}
				if len(args) != 1 {
					return fmt.Errorf("report: --compare B compares one trace with B: give one trace, not %d arguments", len(args))
				}
				if err := diff.Run(cmd.OutOrStdout(), args[0], compare, asJSON); err != nil {
					return fmt.Errorf("report: %w", err)
				}
				return nil
			}
			args, err := evFlags.Args(cmd, args)
			if err != nil {
				return fmt.Errorf("report: %w", err)
			}
			sel, err := selFlags.Selection(time.Now())
			if err != nil {
				return fmt.Errorf("report: %w", err)
			}
			srcs, cleanup, err := archive.Resolve(args, sel)
			if err != nil {
				return fmt.Errorf("report: %w", err)
			}
			defer cleanup()
			for i := range srcs {
				srcs[i].Salvage = salvage
			}
			if err := evFlags.Apply(srcs, 0); err != nil {
				return fmt.Errorf("report: %w", err)
			}
			rep, err := analyze.ModulationOf(srcs, conn)
			if err != nil {
				return fmt.Errorf("report: %w", err)
			}
			// Traces recorded in summary mode have conn_summary records
			// instead of events: their table comes from those.
			var summarized []trace.Source
			for _, s := range srcs {
				ok, err := analyze.IsSummary(s)
				if err != nil {
					return fmt.Errorf("report: %w", err)
				}
				if ok {
					summarized = append(summarized, s)
				}
			}
			if len(summarized) > 0 {
				if rep.Summaries, err = analyze.Summaries(summarized, conn); err != nil {
					return fmt.Errorf("report: %w", err)
				}
			}
			out := cmd.OutOrStdout()
			if htmlOut != "" {
				read := append([]string(nil), args...)
				for _, s := range srcs {
					read = append(read, s.Paths...)
				}
				f, err := outfile.Create(htmlOut, outfile.Options{Inputs: read})
				if err != nil {
					return fmt.Errorf("report: %w", err)
				}
				if err := writeHTML(f, rep, srcs, conn); err != nil {
					f.Close()
					return fmt.Errorf("report: %w", err)
				}
				if err := f.Close(); err != nil {
					return fmt.Errorf("report: %w", err)
				}
				if !asJSON {
					return nil
				}
			}
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			if len(rep.Summaries) > 0 {
				fmt.Fprintln(out, "summary mode: each connection's conn_summary records added up (bytes over the recording)")
				analyze.SummaryTable(out, rep.Summaries)
			}
			if conn != 0 && len(rep.Conns) == 0 && len(rep.Summaries) == 0 {
				return fmt.Errorf("report: no connection %d with data in %v", conn, args)
			}
			for _, w := range rep.Warnings {
				fmt.Fprintf(out, "warning: %s\n", w)
			}
			for _, c := range rep.Conns {
				fmt.Fprintf(out, "\nconnection %d (%s) %s %s -> %s, pid %d %s", c.Conn.ID, c.Trace, c.Conn.Proto, c.Conn.Local, c.Conn.Remote, c.Conn.PID, c.Conn.Comm)
				if c.Conn.Peer != 0 {
					fmt.Fprintf(out, ", peer %d", c.Conn.Peer)
				}
				fmt.Fprintln(out)
				writeVerdict(out, c.Verdict)
				writeLayers(out, c.Layers)
				writeDetails(out, c)
			}
			if conn == 0 && len(rep.Host) > 0 {
				fmt.Fprintln(out, "\nhost (all connections)")
				writeLayers(out, rep.Host)
				if len(rep.Drops) > 0 {
					fmt.Fprintf(out, "  %s\n", drops(rep.Drops))
				}
			}
			for _, st := range rep.Sched {
				writeSched(out, st)
			}
			for _, rp := range rep.ReceivePath {
				writeRxPath(out, rp)
			}
			for _, kc := range rep.KernelEvents {
				writeKernelEvents(out, kc)
			}
			return nil
		},
	}
	cmd.Flags().Uint64Var(&conn, "conn", 0, "report only this connection id")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().StringVar(&compare, "compare", "", "set this run's figures beside those of the run traced in `B.mgt`, as magnet diff does")
	cmd.Flags().StringVar(&htmlOut, "html", "", "write one self-contained HTML page with the tables and every plot")
	cmd.Flags().BoolVar(&salvage, "salvage", false, "read on after damaged data: skip to the next valid block, and say how much was skipped")
	selFlags.Register(cmd.Flags())
	evFlags.Register(cmd.Flags(), "report events")
	return cmd
}

func writeLayers(w io.Writer, ls []*analyze.LayerStats) {
	analyze.WriteLayerTable(w, ls)
}

func writeDetails(w io.Writer, c *analyze.ConnReport) {
	if sb := c.SendBuffer; sb != nil {
		fmt.Fprintf(w, "  send buffer: max %d B, mean %.0f B (time-weighted), median %.0f B, p99 %.0f B of %d samples; %d B unacknowledged at the end\n",
			sb.Max, sb.Mean, sb.Median, sb.P99, sb.Samples, sb.Final)
	}
	if tp := c.Throughput; tp != nil {
		fmt.Fprintf(w, "  throughput: application %s, wire %s (first to last byte)", mbps(tp.AppFirstLast), mbps(tp.WireFirstLast))
		if tp.AppOpenClose > 0 || tp.WireOpenClose > 0 {
			fmt.Fprintf(w, "; application %s, wire %s (open to close)", mbps(tp.AppOpenClose), mbps(tp.WireOpenClose))
		}
		fmt.Fprintln(w)
	}
	if t := c.TCP; t != nil {
		fmt.Fprintf(w, "  tcp: cwnd mean %.1f max %.0f segments, srtt mean %.0f max %.0f µs, ssthresh %d; retransmitted %d segments (%d B), %d tcp_retrans events",
			t.CwndMean, t.CwndMax, t.SrttMeanUs, t.SrttMaxUs, t.SsthreshLast, t.RetransSegs, t.RetransBytes, t.RetransEvents)
		if t.KernelRetransSegs > 0 {
			fmt.Fprintf(w, "; the kernel's count (tcpi_total_retrans) %d", t.KernelRetransSegs)
		}
		fmt.Fprintln(w)
		if t.DataBytes > 0 {
			fmt.Fprintf(w, "  sent: %d B of payload left the host, %d B of them network retransmissions; %d B more were re-sent after a local drop (%d times); %d packets (%d B of payload) dropped on the way down\n",
				t.WireBytes, t.RetransBytes, t.LocalResendBytes, t.LocalResendEvents, t.LocalDropPackets, t.LocalDropBytes)
		}
	}
	if len(c.Drops) > 0 {
		fmt.Fprintf(w, "  %s\n", drops(c.Drops))
	}
	if len(c.Hops) > 0 {
		fmt.Fprintln(w, "  where time goes (per segment, µs):")
		tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "    hop\tsegments\tmean\tmedian\tp99\t")
		for _, h := range c.Hops {
			fmt.Fprintf(tw, "    %s\t%d\t%.1f\t%.1f\t%.1f\t\n", h.Hop, h.Count, h.Delay.Mean, h.Delay.Median, h.Delay.P99)
		}
		tw.Flush()
	}
	if p := c.Path; p != nil {
		writePath(w, p)
	}
	if r := c.Receive; r != nil {
		fmt.Fprintf(w, "  receive path: %.0f%% of the time from device to application was spent waiting in the socket for the reader\n", 100*r.SocketShare)
		if rd := r.Reader; rd != nil {
			fmt.Fprintf(w, "  %s\n", readerLine(rd))
		}
	}
}

// readerLine says where the reader was while data waited for it.
func readerLine(rd *analyze.ReaderWait) string {
	if rd.FollowedUs == 0 {
		return "reader during that wait: not followed (no sched events of the reading thread while data waited)"
	}
	pc := func(us float64) float64 { return 100 * us / rd.FollowedUs }
	return fmt.Sprintf("reader during that wait: off-CPU %.0f%% (asleep %.0f%%, runnable but waiting for a CPU %.0f%%), on CPU %.0f%%; followed for %.0f%% of the wait",
		100*rd.OffCPUShare, pc(rd.AsleepUs), pc(rd.RunnableUs), pc(rd.OnCPUUs), 100*rd.Followed)
}

// writeSched prints a trace's context switches per CPU and the wakeup-to-run
// latencies.
func writeSched(w io.Writer, st *analyze.SchedStats) {
	fmt.Fprintf(w, "\nsched (%s): context switches per CPU over %.2f s\n", st.Trace, st.SpanS)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "cpu\tswitches\tper s\tbetween switches µs mean\tmedian\tp99\tmax\tcv\twakeups\twake→run µs mean\tmedian\tp99\tmax\tlost\t")
	for _, c := range append(st.CPUs, st.All) {
		cpu := "all"
		if c.CPU >= 0 {
			cpu = strconv.Itoa(c.CPU)
		}
		lost := ""
		if c.Lost > 0 {
			lost = fmt.Sprint(c.Lost)
		}
		b, k := c.Between, c.WakeupToRun
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%s\t\n", cpu, c.Switches, c.PerSecond,
			b.Mean, b.Median, b.P99, b.Max, b.CV, k.Count, k.Mean, k.Median, k.P99, k.Max, lost)
	}
	tw.Flush()
	if st.All.ContextSwitch.Count == 0 {
		return // a kernel without sched_entry_tp/sched_exit_tp, or an older trace
	}
	fmt.Fprintln(w, "context-switch time: sched_entry_tp to sched_exit_tp of the switches that switched")
	tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "cpu\tswitches timed\tcontext switch µs mean\tmedian\tp99\tmax\tto sched_switch µs median\tp99\t")
	for _, c := range append(st.CPUs, st.All) {
		cpu := "all"
		if c.CPU >= 0 {
			cpu = strconv.Itoa(c.CPU)
		}
		x, p := c.ContextSwitch, c.Pick
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", cpu, x.Count, x.Mean, x.Median, x.P99, x.Max, p.Median, p.P99)
	}
	tw.Flush()
}

// writePath prints the journey of the segments this end sent, from its TCP
// to the peer's application.
func writePath(w io.Writer, p *analyze.Path) {
	peer := fmt.Sprintf("connection %d", p.Peer)
	if p.PeerTrace != "" {
		peer += " in " + p.PeerTrace
	}
	fmt.Fprintf(w, "  end to end, to %s: %d of %d data packets followed from tcp_xmit to the reader's sock_recv (%d packets found at the peer)\n",
		peer, p.Segments, p.DataDeparted, p.Matched)
	if !p.SameClock {
		fmt.Fprintln(w, "  (the two ends were recorded on different machines: the wire hop is only as good as their clock synchronisation)")
	}
	if p.Segments == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "    hop\tsegments\tmean\tmedian\tp99\t")
	for _, h := range p.Hops {
		name := h.Hop
		if name == analyze.WireHop {
			name += " (wire)"
		}
		fmt.Fprintf(tw, "    %s\t%d\t%.1f\t%.1f\t%.1f\t\n", name, h.Count, h.Delay.Mean, h.Delay.Median, h.Delay.P99)
	}
	e := p.EndToEnd
	fmt.Fprintf(tw, "    %s\t%d\t%.1f\t%.1f\t%.1f\t\n", e.Hop, e.Count, e.Delay.Mean, e.Delay.Median, e.Delay.P99)
	tw.Flush()
}

func mbps(bps float64) string {
	if bps == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f Mbit/s", bps/1e6)
}

// drops says which drops lost data and which were the kernel freeing
// packets never going to be delivered (teardown, duplicates).
func drops(m map[string]uint64) string {
	lost, freed := map[string]uint64{}, map[string]uint64{}
	var nl, nf uint64
	for r, n := range m {
		if analyze.DropLosesData(r) {
			lost[r], nl = n, nl+n
		} else {
			freed[r], nf = n, nf+n
		}
	}
	var parts []string
	if nl > 0 {
		parts = append(parts, fmt.Sprintf("drops that lose data: %d (%s)", nl, counts(lost)))
	} else {
		parts = append(parts, "drops that lose data: none")
	}
	if nf > 0 {
		parts = append(parts, fmt.Sprintf("freed at teardown or as duplicates, not lost: %d (%s)", nf, counts(freed)))
	}
	return strings.Join(parts, "; ")
}

func counts(m map[string]uint64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
