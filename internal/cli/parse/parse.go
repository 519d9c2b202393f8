// SPDX-License-Identifier: Apache-2.0

// Package parse is the `magnet parse` command: traces to text.
package parse

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/archive"
	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// New returns the parse command.
func New() *cobra.Command {
	var (
		conns, meta, header, asJSON bool
		timeFmt, events             string
		conn                        uint64
		selFlags                    archive.Flags
	)
	cmd := &cobra.Command{
		Use:   "parse TRACE... [--host H --since T --until T]",
		Short: "Print a trace as tab-separated text, one event a line",
		Long: `Print a trace as tab-separated text: a header line, then one event a line with
the columns time, cpu, pid, tid, comm, netns, conn, event, size and fields
(the event's own fields as name=value pairs). Reads traces written on
machines of either byte order. A trace cut short is printed up to its last
complete block, with a warning.

TRACE may be one file, the files of one rotated recording (read as one
timeline, in order), or a directory or archive narrowed to one recording
with --host/--since/--until (see magnet archive ls).`,
		Example: `  magnet parse ftp.mgt | head
  magnet parse --conns ftp.mgt
  magnet parse --events tcp_xmit,tcp_rcv --conn 4097 ftp.mgt
  magnet parse /srv/magnet-archive --host web1 --since 10:00 --until 10:05`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			tf, err := export.ParseTimeFormat(timeFmt)
			if err != nil {
				return fmt.Errorf("parse: %w", err)
			}
			sel, err := selFlags.Selection(time.Now())
			if err != nil {
				return fmt.Errorf("parse: %w", err)
			}
			srcs, cleanup, err := archive.Resolve(args, sel)
			if err != nil {
				return fmt.Errorf("parse: %w", err)
			}
			defer cleanup()
			if len(srcs) > 1 {
				return fmt.Errorf("parse: the selection holds %d traces (%s, ...): give one file or chain, or narrow it with --host/--since/--until", len(srcs), srcs[0].Name)
			}
			name := srcs[0].Name
			r, err := srcs[0].Open()
			if err != nil {
				return fmt.Errorf("parse: %w", err)
			}
			defer r.Close()
			out := cmd.OutOrStdout()
			switch {
			case header:
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(r.Header())
			case conns:
				cs, start, err := export.Conns(r)
				if asJSON {
					enc := json.NewEncoder(out)
					enc.SetIndent("", "  ")
					if jerr := enc.Encode(cs); jerr != nil {
						return jerr
					}
				} else if werr := export.WriteConns(out, cs, start); werr != nil {
					return werr
				}
				if err != nil {
					return fmt.Errorf("parse: %s: %w", name, err)
				}
			default:
				opts := export.TextOptions{Time: tf, Meta: meta}
				sel, err := selectEvents(r.Header(), events)
				if err != nil {
					return fmt.Errorf("parse: %w", err)
				}
				if sel != nil || conn != 0 {
					opts.Filter = func(rec trace.Record) bool {
						return (sel == nil || sel[rec.Type.ID]) && (conn == 0 || rec.Conn() == conn)
					}
				}
				if err := export.WriteText(out, r, opts); err != nil {
					return fmt.Errorf("parse: %s: %w", name, err)
				}
			}
			for _, w := range r.Warnings() {
				fmt.Fprintf(os.Stderr, "magnet: warning: %s\n", w)
			}
			if cut, off := r.Truncated(); cut {
				fmt.Fprintf(os.Stderr, "magnet: warning: %s was cut short at offset %d (recorder killed or disk full?); everything before it was read\n", name, off)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&conns, "conns", false, "print the connection table instead of events")
	f.BoolVar(&asJSON, "json", false, "with --conns: print JSON")
	f.BoolVar(&header, "header", false, "print the trace header (host, clock, settings, event dictionary) as JSON")
	f.BoolVar(&meta, "meta", false, "also print metadata records (task, iface)")
	f.StringVar(&timeFmt, "time", "rel", "time column: rel (seconds since the first record), abs (UTC wall clock) or raw (ns)")
	f.StringVar(&events, "events", "", "print only these event types (comma-separated names)")
	f.Uint64Var(&conn, "conn", 0, "print only events of this connection id")
	selFlags.Register(f)
	return cmd
}

func selectEvents(h *trace.Header, list string) (map[uint8]bool, error) {
	if list == "" {
		return nil, nil
	}
	sel := map[uint8]bool{}
	for _, name := range strings.Split(list, ",") {
		t := h.TypeByName(strings.TrimSpace(name))
		if t == nil {
			var names []string
			for _, et := range h.Types {
				names = append(names, et.Name)
			}
			return nil, fmt.Errorf("unknown event type %q (this trace has %s)", name, strings.Join(names, ", "))
		}
		sel[t.ID] = true
	}
	return sel, nil
}
