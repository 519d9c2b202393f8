// SPDX-License-Identifier: Apache-2.0

// Package status is the `magnet status` command: what this kernel offers,
// and what running recorders are doing (MAGNeT's /proc/net/magnet).
package status

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/collect"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/kevent"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/record"
)

type report struct {
	Hooks []probe.HookStatus `json:"hooks"`
	// Verify says why the hooks' programs were not loaded to check them
	// ("available" then means only that the hook exists), "" when they were.
	Verify    string            `json:"verify,omitempty"`
	ServedBy  map[string]string `json:"served_by"`
	Recorders []record.Status   `json:"recorders"`
	// Collect is the collect service's shipper, when one runs on spool.
	Collect *collect.Status `json:"collect,omitempty"`
	// KernelEvents says which kinds of kernel event chosen at run time
	// (magnet record --tracepoint, --uprobe, --usdt, --kprobe) this kernel
	// offers.
	KernelEvents []kevent.Availability `json:"kernel_events"`
}

// New returns the status command.
func New() *cobra.Command {
	var asJSON bool
	var dir, spool string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show which hooks this kernel offers and what running recorders are doing",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			hooks, verr := probe.VerifyHooks(probe.CheckHooks())
			rep := report{Hooks: hooks}
			if verr != nil {
				rep.Verify = verr.Error()
			}
			rep.ServedBy = probe.ServedBy(rep.Hooks)
			rep.KernelEvents = kevent.Kinds()
			recs, err := record.ReadStatuses(dir)
			if err != nil {
				return fmt.Errorf("status: %w", err)
			}
			rep.Recorders = recs
			if st, err := collect.ReadStatus(spool); err == nil {
				rep.Collect = &st
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "EVENTS\tHOOK\tSTATE")
			for _, h := range rep.Hooks {
				state := "available"
				if !h.Available {
					state = "unavailable: " + h.Reason
				}
				fmt.Fprintf(tw, "%s\t%s/%s\t%s\n", h.Serves(), h.Kind, h.Target, state)
			}
			tw.Flush()
			if rep.Verify != "" {
				fmt.Fprintf(out, "(%s: \"available\" means the hook exists)\n", rep.Verify)
			}
			fmt.Fprintln(out)
			tw = tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "EVENT\tSERVED BY")
			for _, in := range event.Catalogue {
				if by := rep.ServedBy[in.Name]; by != "" {
					fmt.Fprintf(tw, "%s\t%s\n", in.Name, by)
				} else if in.Hook != "recorder" && in.Name != "lost" && in.Name != "iface" {
					fmt.Fprintf(tw, "%s\t%s\n", in.Name, "unavailable")
				}
			}
			tw.Flush()
			fmt.Fprintln(out)
			if rep.Collect != nil {
				printCollect(out, rep.Collect)
			}
			tw = tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "KERNEL EVENTS\tSTATE")
			for _, k := range rep.KernelEvents {
				state := "available"
				if !k.Available {
					state = "unavailable: " + k.Why
				} else if k.Why != "" {
					state += " (" + k.Why + ")"
				}
				fmt.Fprintf(tw, "%s\t%s\n", k.Kind, state)
			}
			tw.Flush()
			fmt.Fprintln(out)
			if len(recs) == 0 {
				fmt.Fprintln(out, "no recorder running")
				return nil
			}
			for _, s := range recs {
				fill := 0.0
				if s.BufferBytes > 0 {
					fill = 100 * float64(s.BufferUsed) / float64(s.BufferBytes)
				}
				fmt.Fprintf(out, "recorder pid %d -> %s (since %s)\n", s.PID, s.Output, s.Started.Format("2006-01-02 15:04:05"))
				if s.Previous != "" {
					fmt.Fprintf(out, "  previous: %s (finished)\n", s.Previous)
				}
				fmt.Fprintf(out, "  events:   %s\n", strings.Join(s.Events, ","))
				if len(s.Filters) > 0 {
					fmt.Fprintf(out, "  filters:  %v\n", s.Filters)
				}
				if len(s.Command) > 0 {
					fmt.Fprintf(out, "  command:  %s\n", strings.Join(s.Command, " "))
				}
				fmt.Fprintf(out, "  buffer:   %d bytes, %.1f%% full\n", s.BufferBytes, fill)
				fmt.Fprintf(out, "  recorded: %d events, %d bytes written\n", s.Recorded, s.Written)
				fmt.Fprintf(out, "  lost:     %d events\n", s.Lost)
				fmt.Fprintf(out, "  missed:   %d program runs the kernel skipped (their events are missing)\n", s.Missed)
				if s.KernelSkipped != nil {
					fmt.Fprintf(out, "  kernel skipped: %d device program runs the kernel did not make for frames the interfaces counted (%d comparisons)\n", *s.KernelSkipped, s.KernelSkippedChecked)
				} else {
					fmt.Fprintf(out, "  kernel skipped: not compared yet\n")
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().StringVar(&dir, "status-dir", record.DefaultStatusDir, "where recorders publish their status")
	cmd.Flags().StringVar(&spool, "spool", collect.DefaultSpool, "the collect service's spool, whose shipper status is shown")
	return cmd
}

// printCollect shows the collect service's shipping: the spool, and per
// target its backlog, last success, failures and any stall.
func printCollect(out io.Writer, st *collect.Status) {
	age := time.Since(st.Updated).Round(time.Second)
	fmt.Fprintf(out, "collect shipper pid %d, spool %s (status %s old)\n", st.PID, st.Spool, age)
	budget := "no budget"
	if st.Budget > 0 {
		budget = fmt.Sprintf("budget %d", st.Budget)
	}
	fmt.Fprintf(out, "  spool:   %d bytes + %d staged (%s); %d files waiting (%d bytes)\n", st.SpoolBytes, st.StagingBytes, budget, st.Waiting, st.WaitingBytes)
	fmt.Fprintf(out, "  shipped: %d files everywhere; dropped by the budget: %d files (%d bytes)\n", st.Shipped, st.Dropped, st.DroppedBytes)
	tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  TARGET\tTYPE\tBACKLOG\tSHIPPED\tFAILURES\tLAST SUCCESS\tSTATE")
	for _, t := range st.Targets {
		last := "never"
		if !t.LastSuccess.IsZero() {
			last = t.LastSuccess.Local().Format("2006-01-02 15:04:05")
		}
		state := "ok"
		switch {
		case t.Stalled:
			state = fmt.Sprintf("stalled %.0fs on %s", t.InFlightSeconds, t.InFlight)
		case t.ConsecutiveFailures > 0:
			state = fmt.Sprintf("failing (%d in a row): %s", t.ConsecutiveFailures, t.LastError)
		case t.InFlight != "":
			state = "shipping " + t.InFlight
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d (%d bytes)\t%d\t%d\t%s\t%s\n", t.Name, t.Type, t.Backlog, t.BacklogBytes, t.Shipped, t.Failures, last, state)
	}
	tw.Flush()
	fmt.Fprintln(out)
}
