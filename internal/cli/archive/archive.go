// SPDX-License-Identifier: Apache-2.0

// Package archivecmd is the `magnet archive` command.
package archivecmd

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/archive"
)

// New returns the archive command.
func New() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "archive",
		Short: "Look into an archive of traces shipped by magnet collect",
		Long: `An archive holds the traces of many hosts as HOST/YYYY-MM-DD/FILE.mgt.zst, each
beside a manifest (FILE.mgt.zst.json: host, times, recording, events, size,
SHA-256). Every analysis command (parse, report, export, plot) reads an
archive directly: give it the archive and --host/--since/--until.`,
	}
	cmd.AddCommand(newLs())
	return cmd
}

func newLs() *cobra.Command {
	var asJSON bool
	var selFlags archive.Flags
	cmd := &cobra.Command{
		Use:   "ls ARCHIVE [--host H --since T --until T] [--json]",
		Short: "List what an archive holds, per host and time",
		Long: `List the traces of an archive (a directory, s3://BUCKET/PREFIX, or
ssh://[USER@]HOST[:PORT]/PATH read with the system ssh client), one line per
file, grouped by host and recording: a recording's rotated files form a chain
that every analysis command reads as one timeline.`,
		Example: `  magnet archive ls /srv/magnet-archive
  magnet archive ls /srv/magnet-archive --host web1,web2 --since 10:00 --until 11:00 --json
  magnet archive ls s3://traces/site-a
  magnet archive ls ssh://magnet@archive.example.org/srv/magnet-archive --ssh-option IdentityFile=/etc/magnet/id_ed25519`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := selFlags.Selection(time.Now())
			if err != nil {
				return fmt.Errorf("archive ls: %w", err)
			}
			entries, err := archive.Find(args[0], sel)
			if err != nil {
				return fmt.Errorf("archive ls: %w", err)
			}
			chains := archive.Select(entries, sel)
			out := cmd.OutOrStdout()
			if asJSON {
				type jsonChain struct {
					Host      string          `json:"host"`
					Recording string          `json:"recording,omitempty"`
					Files     []archive.Entry `json:"files"`
					Missing   []string        `json:"missing,omitempty"`
				}
				list := []jsonChain{}
				for _, c := range chains {
					list = append(list, jsonChain{c.Host, c.Recording, c.Entries, c.Missing()})
				}
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "host\trecording\tseq\tstart (UTC)\tend (UTC)\tevents\tlost\tbytes\tfile")
			for _, c := range chains {
				for _, e := range c.Entries {
					end := "-"
					if !e.End().IsZero() {
						end = e.End().UTC().Format("2006-01-02 15:04:05")
					} else if e.CutShort {
						end = "cut short"
					}
					// A file without a manifest (a spool, a record --rotate
					// directory) was not read: its counts are unknown. A
					// manifest has its file's checksum (and no events map
					// when it counted none).
					events, lost := "-", "-"
					if e.Events != nil || e.SHA256 != "" {
						var n uint64
						for name, c := range e.Events {
							if name != "task" && name != "iface" && name != "lost" {
								n += c
							}
						}
						events, lost = fmt.Sprint(n), fmt.Sprint(e.Lost)
					}
					rec := e.Recording
					if rec == "" {
						rec = "-"
					}
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\n", e.Host, rec, e.Seq,
						e.Start().UTC().Format("2006-01-02 15:04:05"), end, events, lost, e.Bytes, e.Path)
				}
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, c := range chains {
				for _, m := range c.Missing() {
					fmt.Fprintf(out, "missing: %s\n", m)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: one object per recording with its files")
	selFlags.Register(cmd.Flags())
	return cmd
}
