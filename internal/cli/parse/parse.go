// SPDX-License-Identifier: Apache-2.0

// Package parse is the `magnet parse` command: traces to text.
package parse

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/archive"
	"github.com/magnet-tracer/magnet/internal/evselect"
	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// New returns the parse command.
func New() *cobra.Command {
	var (
		conns, meta, header, asJSON bool
		fileOrder, salvage          bool
		timeFmt, events             string
		conn                        uint64
		evFlags                     evselect.Flags
		selFlags                    archive.Flags
	)
	cmd := &cobra.Command{
		Use:   "parse TRACE... [EXPRESSION] [--types T,...] [--filter CEL]",
		Short: "Print traces as tab-separated text, one event a line, in time order",
		Long: `Print traces as tab-separated text: a header line, then one event a line with
the columns time, cpu, pid, tid, comm, netns, conn, event, size and fields
(the event's own fields as name=value pairs). Reads traces written on
machines of either byte order. A trace cut short is printed up to its last
complete block, with a warning. A damaged trace (a block whose checksum,
magic or length is wrong) is an error after the records before the damage;
--salvage reads on from the next valid block and says how much it skipped.

Lines are in time order. A recorder stores its rings in drain order, nearly
but not quite in time order (the connection and interface records of the
control ring come after events of earlier times); parse puts each trace in
order through a window of 1,024 records and warns, with a count, about
records further out of order than that. --file-order prints the records as
stored instead.

Several traces (files, rotated recordings, directories or archives) are
merged into one timeline, as magnet report and magnet export place them:
traces of one boot of one machine by their shared clock, others by their
wall clocks. Each line then starts with a trace column naming its trace.
Relative times count from the earliest record of all of them; raw times stay
each trace's own clock.

TRACE may be one file, the files of one rotated recording (read as one
timeline, in order), or a directory or archive, narrowed with
--host/--since/--until (see magnet archive ls).

Arguments after the traces are a pcap-filter expression, as tcpdump takes
one ("tcp port 443 and host 10.0.0.2"): it selects the events of the
connections it matches; events with no connection (sched) never match. The
traces are the arguments up to the first that is not an existing file or
directory; write "--" before the expression to end them explicitly.
--filter takes a CEL expression over the event's fields, the daemon's
language; --types and --groups select event types and groups. All of them
combine with AND (docs/FILTERS.md).`,
		Example: `  magnet parse ftp.mgt | head
  magnet parse --conns ftp.mgt
  magnet parse --types tcp_xmit,tcp_rcv --conn 4097 ftp.mgt
  magnet parse web.mgt 'tcp port 443 and host 10.1.2.3'
  magnet parse web.mgt --filter 'rport == 5201 && size > 1000'
  magnet parse a.mgt b.mgt -- udp
  magnet parse sender.mgt receiver.mgt --time abs
  magnet parse /srv/magnet-archive --host web1 --since 10:00 --until 10:05`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			args, err := evFlags.Args(cmd, args)
			if err != nil {
				return fmt.Errorf("parse: %w", err)
			}
			if events != "" {
				evFlags.Types = append(evFlags.Types, strings.Split(events, ",")...)
			}
			tf, err := export.ParseTimeFormat(timeFmt)
			if err != nil {
				return fmt.Errorf("parse: %w", err)
			}
			sel, err := selFlags.Selection(time.Now())
			if err != nil {
				return fmt.Errorf("parse: %w", err)
			}
			inputs, cleanup, err := archive.Resolve(args, sel)
			if err != nil {
				return fmt.Errorf("parse: %w", err)
			}
			defer cleanup()
			for i := range inputs {
				inputs[i].Salvage = salvage
			}
			// --conns lists the connections of the selected events.
			if !header {
				if err := evFlags.Apply(inputs, conn); err != nil {
					return fmt.Errorf("parse: %w", err)
				}
			}
			srcs, err := export.OpenTables(inputs)
			if err != nil {
				return fmt.Errorf("parse: %w", err)
			}
			defer export.CloseTables(srcs)
			out := cmd.OutOrStdout()
			switch {
			case header:
				if err := writeHeaders(out, srcs); err != nil {
					return fmt.Errorf("parse: %w", err)
				}
			case conns:
				if err := writeConns(out, srcs, asJSON); err != nil {
					return fmt.Errorf("parse: %w", err)
				}
			default:
				opts := export.TextOptions{Time: tf, Meta: meta, FileOrder: fileOrder}
				late, err := export.WriteTexts(out, srcs, opts)
				if err != nil {
					return fmt.Errorf("parse: %w", err)
				}
				if late > 0 {
					fmt.Fprintf(os.Stderr, "magnet: warning: %d records were further out of time order in their trace than the reorder window (%d records) and are printed late; sort by time for a strict order\n", late, export.ReorderWindow)
				}
			}
			for _, s := range srcs {
				for _, w := range s.Reader.Warnings() {
					fmt.Fprintf(os.Stderr, "magnet: warning: %s: %s\n", s.Name, w)
				}
				if cut, off := s.Reader.Truncated(); cut {
					fmt.Fprintf(os.Stderr, "magnet: warning: %s was cut short at offset %d (recorder killed or disk full?); everything before it was read\n", s.Name, off)
				}
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
	evFlags.Register(f, "print events")
	f.StringVar(&events, "events", "", "event types (the old name of --types)")
	// Hidden: record's --events names groups; a warning on use says --types.
	_ = f.MarkDeprecated("events", "use --types (event types) or --groups (event groups)")
	f.Uint64Var(&conn, "conn", 0, "print only events of this connection id")
	f.BoolVar(&fileOrder, "file-order", false, "print records in the order stored (each trace in turn) rather than in time order")
	f.BoolVar(&salvage, "salvage", false, "read on after damaged data: skip to the next valid block, and say how much was skipped")
	selFlags.Register(f)
	return cmd
}

// writeHeaders prints the trace header as JSON; several as a JSON array.
func writeHeaders(out io.Writer, srcs []export.TableSource) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	if len(srcs) == 1 {
		return enc.Encode(srcs[0].Reader.Header())
	}
	hs := make([]*trace.Header, len(srcs))
	for i, s := range srcs {
		hs[i] = s.Reader.Header()
	}
	return enc.Encode(hs)
}

// traceConns is one trace's connection table in --conns --json of several
// traces.
type traceConns struct {
	Trace string         `json:"trace"`
	Conns []*export.Conn `json:"conns"`
}

// writeConns prints the connection table of each trace, their ends paired
// across the traces; several tables each after a "# NAME" line, or as a
// JSON array of {trace, conns}.
func writeConns(out io.Writer, srcs []export.TableSource, asJSON bool) error {
	var (
		tables [][]*export.Conn
		starts []uint64
		names  []string
		hs     []*trace.Header
		rerr   error
	)
	for _, s := range srcs {
		cs, start, err := export.Conns(s.Reader)
		if err != nil && rerr == nil {
			rerr = fmt.Errorf("%s: %w", s.Name, err) // after the tables built so far
		}
		tables, starts = append(tables, cs), append(starts, start)
		names, hs = append(names, s.Name), append(hs, s.Reader.Header())
	}
	if len(srcs) > 1 {
		export.PairTraces(tables, names, export.NewTimeline(hs).Offsets)
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	switch {
	case asJSON && len(srcs) == 1:
		if err := enc.Encode(tables[0]); err != nil {
			return err
		}
	case asJSON:
		all := make([]traceConns, len(srcs))
		for i := range srcs {
			all[i] = traceConns{names[i], tables[i]}
		}
		if err := enc.Encode(all); err != nil {
			return err
		}
	default:
		for i := range srcs {
			if len(srcs) > 1 {
				if i > 0 {
					fmt.Fprintln(out)
				}
				fmt.Fprintf(out, "# %s\n", names[i])
			}
			if err := export.WriteConns(out, tables[i], starts[i]); err != nil {
				return err
			}
		}
	}
	return rerr
}
