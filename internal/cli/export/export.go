// SPDX-License-Identifier: Apache-2.0

// Package exportcmd is the `magnet export` command.
package exportcmd

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/archive"
	"github.com/magnet-tracer/magnet/internal/evselect"
	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/outfile"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// New returns the export command.
func New() *cobra.Command {
	var format, output, connsOut, table string
	var ds datasetFlags
	var noConns, salvage bool
	var selFlags archive.Flags
	var evFlags evselect.Flags
	cmd := &cobra.Command{
		Use:   "export TRACE... [EXPRESSION] --format tsv|csv|jsonl|parquet|ulm|pcapng|perfetto [--table events|journeys|polls] -o OUT",
		Short: "Export traces as typed tables (TSV, CSV, JSON lines, Parquet)",
		Long: `Export the events of one or more traces as one table: the columns trace,
time_ns (wall clock, ns since the Unix epoch, so several traces share one
timeline), cpu, pid, tid, comm, netns, conn, event, size, then every event
field (empty where an event has none). The connection table goes beside it,
in the same format: OUT with ".conns" before its extension.

Rows are in time order: the traces are merged by time_ns, and each is put in
order through a window of 1,024 rows (a recorder writes its per-CPU rings in
drain order, slightly out of time order). Rows further out of order than that
are written as they come, with a warning; equal times keep the order of the
TRACE arguments. Traces of one boot of one machine share its clock: their
time_ns is that clock plus the first trace's wall offset, as magnet report
places them. --format pcapng merges the packets of several traces the same
way (as mergecap does), an interface per trace, namespace and ifindex.

--table journeys writes, instead of the events, one row per data segment a
receiver got from a sender also in the traces: the sender's tcp_xmit,
ip_send, dev_queue, dev_xmit and the receiver's dev_recv, ip_recv, tcp_rcv,
sock_recv, each as a time (<layer>_ns) and an event id (<layer>_id, the
event's place in its trace), empty where a layer was not recorded; the
events are paired by the packet's identity as magnet report's hops are
(docs/REPORT.md).

--table polls writes one row per NAPI poll and connection whose received
packets (dev_recv) it delivered, and one row (conn and packets empty) per
poll that delivered none: trace, cpu, poll_ns (the poll's end), poll_id
(the napi_poll event's place in its trace), dev, work, budget, conns (how
many connections the poll delivered), conn and packets; the packets are
placed in polls as magnet report's receive path places them. The traces
need napi_poll events (record --groups default,irq,napi).

A TRACE may be a file, the files of a rotated recording (one timeline), or a
directory or archive, narrowed with --host, --since and --until.

Arguments after the traces are a pcap-filter expression ("tcp port 443");
it, --filter, --types and --groups select the events exported
(docs/FILTERS.md).`,
		Example: `  magnet export ftp.mgt --format parquet -o ftp.parquet   # and ftp.conns.parquet
  magnet export sender.mgt receiver.mgt --format csv -o both.csv
  duckdb -c "select event, count(*), sum(size) from 'ftp.parquet' group by event"
  magnet export both.mgt --table journeys -f parquet -o seg.parquet  # one row per segment
  magnet export rx.mgt --table polls -f csv -o polls.csv   # which connections each NAPI poll delivered
  magnet export /srv/magnet-archive --host a,b --since 10:00 --until 10:05 -f parquet -o ten.parquet`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			args, err := evFlags.Args(cmd, args)
			if err != nil {
				return fmt.Errorf("export: %w", err)
			}
			if err := export.CheckFormat(format); err != nil {
				return fmt.Errorf("export: %w", err)
			}
			if table != "events" && table != "journeys" && table != "polls" {
				return fmt.Errorf("export: unknown --table %q (want events, journeys or polls)", table)
			}
			if table != "events" {
				switch {
				case format == "ulm" || format == "pcapng" || format == "perfetto":
					return fmt.Errorf("export: --table %s is a table: write it as tsv, csv, jsonl or parquet, not %s", table, format)
				case ds.dir != "":
					return fmt.Errorf("export: --dataset holds the events; export --table %s to a file", table)
				case evFlags.Active() && table == "journeys":
					return fmt.Errorf("export: --table journeys follows every layer of each segment: it takes no event selection")
				case evFlags.Active():
					return fmt.Errorf("export: --table polls places every connection's packets in every poll: it takes no event selection")
				}
			}
			if ds.dir != "" {
				if evFlags.Active() {
					return fmt.Errorf("export: --dataset keeps every event; select with the readers of the dataset")
				}
				return ds.run(cmd, args, format, output, &selFlags)
			}
			if output == "" {
				return fmt.Errorf("export: an output file is required (-o FILE, or - for standard output)")
			}
			// ULM is an event log: conn_open lines carry the connections.
			if output == "-" && connsOut == "" || format == "ulm" {
				noConns = true
			}
			sel, err := selFlags.Selection(time.Now())
			if err != nil {
				return fmt.Errorf("export: %w", err)
			}
			inputs, cleanup, err := archive.Resolve(args, sel)
			if err != nil {
				return fmt.Errorf("export: %w", err)
			}
			defer cleanup()
			for i := range inputs {
				inputs[i].Salvage = salvage
			}
			if err := evFlags.Apply(inputs, 0); err != nil {
				return fmt.Errorf("export: %w", err)
			}
			read := readPaths(args, inputs)
			srcs, err := export.OpenTables(inputs)
			if err != nil {
				return fmt.Errorf("export: %w", err)
			}
			defer export.CloseTables(srcs)
			switch table {
			case "journeys":
				return writeJourneys(output, format, inputs, read, cmd.OutOrStdout())
			case "polls":
				return writePolls(output, format, inputs, read, cmd.OutOrStdout())
			}
			var headers []*trace.Header
			for _, s := range srcs {
				headers = append(headers, s.Reader.Header())
			}
			if format == "perfetto" {
				if err := writeFile(output, read, cmd.OutOrStdout(), func(w io.Writer) error {
					_, err := analyze.WritePerfettoOf(w, inputs)
					return err
				}); err != nil {
					return fmt.Errorf("export: %w", err)
				}
				return nil
			}
			if format == "pcapng" {
				err := writeFile(output, read, cmd.OutOrStdout(), func(w io.Writer) error {
					n, late, err := export.WritePcapng(w, srcs)
					if err == nil && n == 0 {
						fmt.Fprintln(os.Stderr, "magnet: warning: no packets: record with --groups default,headers to capture them")
					}
					if late > 0 {
						fmt.Fprintf(os.Stderr, "magnet: warning: %d packets were further out of time order in their trace than the reorder window; they are written late\n", late)
					}
					return err
				})
				if err != nil {
					return fmt.Errorf("export: %w", err)
				}
				return nil
			}
			if !noConns {
				// The connection table is written second: check it first, so
				// that refusing it leaves the events' output as it was.
				if connsOut == "" {
					connsOut = connsPath(output)
				}
				others := append(append([]string(nil), read...), output)
				if err := outfile.Check(connsOut, outfile.Options{Inputs: others}); err != nil {
					return fmt.Errorf("export: %w", err)
				}
			}
			t := export.NewTable(headers)
			var late uint64
			if err := writeFile(output, read, cmd.OutOrStdout(), func(w io.Writer) error {
				rw, err := export.NewRowWriter(format, t, w)
				if err != nil {
					return err
				}
				if late, err = export.WriteTable(t, srcs, rw); err != nil {
					rw.Close()
					return err
				}
				return rw.Close()
			}); err != nil {
				return fmt.Errorf("export: %w", err)
			}
			if late > 0 {
				fmt.Fprintf(os.Stderr, "magnet: warning: %d rows were further out of time order in their trace than the reorder window; sort by time_ns for a strict order\n", late)
			}
			for _, s := range srcs {
				for _, w := range s.Reader.Warnings() {
					fmt.Fprintf(os.Stderr, "magnet: warning: %s: %s\n", s.Name, w)
				}
				if cut, off := s.Reader.Truncated(); cut {
					fmt.Fprintf(os.Stderr, "magnet: warning: %s was cut short at offset %d; exported up to its last complete block\n", s.Name, off)
				}
			}
			if noConns {
				return nil
			}
			if connsOut == "" {
				connsOut = connsPath(output)
			}
			if output != "-" {
				read = append(read, output) // the table just written
			}
			if err := writeConns(connsOut, format, inputs, read, cmd.OutOrStdout()); err != nil {
				return fmt.Errorf("export: %w", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&format, "format", "f", "", "tsv, csv, jsonl, parquet, ulm (NetLogger), pcapng (packets of the headers group) or perfetto (Chrome JSON trace)")
	f.StringVarP(&output, "output", "o", "", "file to write (- for standard output)")
	f.StringVar(&connsOut, "conns-output", "", "where to write the connection table (default: OUT with .conns before the extension)")
	f.StringVar(&table, "table", "events", "what to export: events (one row per event), journeys (one row per data segment received, every layer's event) or polls (one row per NAPI poll and connection it delivered packets of)")
	f.BoolVar(&noConns, "no-conns", false, "do not write the connection table")
	f.BoolVar(&salvage, "salvage", false, "read on after damaged data: skip to the next valid block, and say how much was skipped")
	selFlags.Register(f)
	evFlags.Register(f, "export events")
	ds.register(f)
	return cmd
}

// writeJourneys writes the journeys table of the traces to path.
func writeJourneys(path, format string, traces []trace.Source, read []string, stdout io.Writer) error {
	var n uint64
	err := writeFile(path, read, stdout, func(w io.Writer) error {
		rw, err := export.NewRowWriter(format, export.JourneyTable(), w)
		if err != nil {
			return err
		}
		if n, err = analyze.WriteJourneys(traces, rw); err != nil {
			rw.Close()
			return err
		}
		return rw.Close()
	})
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if n == 0 {
		fmt.Fprintln(os.Stderr, "magnet: warning: no journeys: they need both ends of a TCP connection in the traces, recorded with the tcp, ip and dev groups")
	}
	return nil
}

// writePolls writes the polls table of the traces to path. The traces are
// read first, so that a set without napi_poll events fails before the
// output is created.
func writePolls(path, format string, traces []trace.Source, read []string, stdout io.Writer) error {
	p, err := analyze.ReadPolls(traces)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	err = writeFile(path, read, stdout, func(w io.Writer) error {
		rw, err := export.NewRowWriter(format, export.PollTable(), w)
		if err != nil {
			return err
		}
		if _, err := p.Write(rw); err != nil {
			rw.Close()
			return err
		}
		return rw.Close()
	})
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if p.Lost > 0 {
		fmt.Fprintf(os.Stderr, "magnet: warning: %d irq/napi events were lost: polls are missing and their packets are counted in a later poll\n", p.Lost)
	}
	return nil
}

// connsPath inserts ".conns" before the extension: ftp.csv -> ftp.conns.csv.
func connsPath(out string) string {
	ext := filepath.Ext(out)
	return strings.TrimSuffix(out, ext) + ".conns" + ext
}

// readPaths lists every file the command reads (the arguments and the
// traces they resolve to), none of which an output may be.
func readPaths(args []string, srcs []trace.Source) []string {
	read := append([]string(nil), args...)
	for _, s := range srcs {
		read = append(read, s.Paths...)
	}
	return read
}

func writeConns(path, format string, traces []trace.Source, read []string, stdout io.Writer) error {
	// Every table first: the ends of a connection recorded in two traces
	// are paired across them.
	var tables [][]*export.Conn
	var headers []*trace.Header
	var names []string
	for _, src := range traces {
		r, err := src.Open()
		if err != nil {
			return err
		}
		cs, _, err := export.Conns(r)
		r.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", src.Name, err)
		}
		tables = append(tables, cs)
		headers = append(headers, r.Header())
		names = append(names, filepath.Base(src.Name))
	}
	tl := export.NewTimeline(headers)
	export.PairTraces(tables, names, tl.Offsets)
	t := export.ConnTable()
	return writeFile(path, read, stdout, func(w io.Writer) error {
		rw, err := export.NewRowWriter(format, t, w)
		if err != nil {
			return err
		}
		for i, cs := range tables {
			off := tl.Wall(i, 0) // the events' time_ns rule
			for _, c := range cs {
				if err := rw.WriteRow(export.ConnRow(names[i], c, off)); err != nil {
					rw.Close()
					return err
				}
			}
		}
		return rw.Close()
	})
}

// writeFile creates path (or uses stdout for "-") and runs fn on it; the
// error names the file. path may be none of the files in read.
func writeFile(path string, read []string, stdout io.Writer, fn func(io.Writer) error) error {
	if path == "-" {
		return fn(stdout)
	}
	f, err := outfile.Create(path, outfile.Options{Inputs: read, Lock: true})
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
