// SPDX-License-Identifier: Apache-2.0

// Package watch is the `magnet watch` command: a live event stream from
// the daemon, in the terminal.
package watch

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/pcapfilter"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// New returns the watch command.
func New() *cobra.Command {
	var (
		socket, tokenFile, expr string
		types, groups           []string
		ports, pids, conns      []uint
		queue                   int
		asJSON                  bool
	)
	cmd := &cobra.Command{
		Use:   "watch [EXPRESSION] [flags]",
		Short: "Print live events from the magnet daemon",
		Long: `Print the events the magnet daemon sees, live, one a line: those of your own
processes' connections (root, and members of the daemon's see-all groups: every
event). Filters combine with AND; --filter takes a CEL expression over the
event's fields and the arguments, joined, a pcap-filter expression over the
event's connection ("tcp port 5201"), as parse, report, export and plot take
them (docs/FILTERS.md). Other users' processes an event ran in
(a softirq interrupts anyone's) show as pid 0 with no command.

A watch is one of the daemon's subscriptions: a user holds at most
subscribers.per_user of them (16 by default; the next is refused), and types of
groups that cost the whole host (sched, headers, ip, tcpsend) need root unless
the daemon's access.user_groups allows them (docs/DAEMON.md#limits-per-user).

Lines starting with "#" say that events were lost: by this watch when the
terminal could not keep up, or by the recorder when a kernel ring was full.`,
		Example: `  magnet watch 'tcp port 5201'
  magnet watch --pid 1234 --types sock_send,sock_recv
  magnet watch --types tcp_state --filter 'fields.srtt_us > 1000' --json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			f := magnetclient.Filter{Types: types, Groups: groups, Expr: expr, Pcap: strings.Join(args, " ")}
			if f.Pcap != "" {
				// Checked here too, so that a typo fails before dialling.
				if _, err := pcapfilter.Parse(f.Pcap); err != nil {
					return fmt.Errorf("watch: %w", err)
				}
			}
			for _, p := range ports {
				if p == 0 || p > 65535 {
					return fmt.Errorf("watch: --conn-port %d: want 1-65535", p)
				}
				f.Ports = append(f.Ports, uint16(p))
			}
			for _, p := range pids {
				if p > 1<<31 {
					return fmt.Errorf("watch: --pid %d: not a process id", p)
				}
				f.PIDs = append(f.PIDs, uint32(p))
			}
			for _, c := range conns {
				f.Conns = append(f.Conns, uint64(c))
			}
			var opts []magnetclient.Option
			if tokenFile != "" {
				tok, err := os.ReadFile(tokenFile)
				if err != nil {
					return fmt.Errorf("watch: %w", err)
				}
				first, _, _ := strings.Cut(string(tok), "\n")
				opts = append(opts, magnetclient.WithToken(first))
			}
			c, err := magnetclient.Dial(socket, opts...)
			if err != nil {
				return fmt.Errorf("watch: %w (is magnet daemon running?)", err)
			}
			defer c.Close()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			s, err := c.Subscribe(ctx, f, queue)
			if err != nil {
				return fmt.Errorf("watch: %w", err)
			}
			defer s.Close()
			context.AfterFunc(ctx, func() { s.Close() })
			out := bufio.NewWriter(cmd.OutOrStdout())
			defer out.Flush()
			if !asJSON {
				fmt.Fprintf(out, "# watching (groups enabled: %s)\n", strings.Join(s.Subscribed().Groups, ","))
				out.Flush()
			}
			for {
				m, err := s.Next()
				if err != nil {
					if ctx.Err() != nil || errors.Is(err, io.EOF) {
						return nil
					}
					return fmt.Errorf("watch: %w", err)
				}
				if asJSON {
					b, _ := json.Marshal(m)
					out.Write(append(b, '\n'))
				} else {
					writeText(out, m)
				}
				out.Flush()
			}
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&socket, "socket", magnetclient.DefaultSocket, "the daemon: its Unix socket, or tcp://HOST:PORT")
	fl.StringVar(&tokenFile, "token-file", "", "bearer token for tcp://")
	fl.UintSliceVar(&ports, "conn-port", nil, "only connections with this local or remote port")
	fl.UintSliceVar(&pids, "pid", nil, "only this process (the connections it owns)")
	fl.UintSliceVar(&conns, "conn", nil, "only this connection id")
	fl.StringSliceVar(&types, "types", nil, "only these event types (e.g. sock_send,tcp_state)")
	fl.StringSliceVar(&types, "type", nil, "event types (the old name of --types)")
	_ = fl.MarkDeprecated("type", "use --types")
	fl.StringSliceVar(&groups, "groups", nil, "only events of these groups (e.g. sock,tcp); enables them")
	fl.StringVar(&expr, "filter", "", "a CEL expression the event must satisfy")
	fl.IntVar(&queue, "queue", 0, "events the daemon may hold for this watch (0: its default)")
	fl.BoolVar(&asJSON, "json", false, "print the daemon's messages as JSON, one a line")
	return cmd
}

// writeText prints one message as a line.
func writeText(w io.Writer, m magnetclient.Message) {
	switch {
	case m.Event != nil:
		e := m.Event
		t := time.Unix(0, e.WallNs).Format("15:04:05.000000")
		conn := "-"
		if e.Local != "" {
			conn = fmt.Sprintf("%d %s %s>%s", e.Conn, e.Proto, e.Local, e.Remote)
		} else if e.Conn != 0 {
			conn = fmt.Sprint(e.Conn)
		}
		fmt.Fprintf(w, "%s cpu%-2d %7d %-15s %-12s %8d  %s%s\n", t, e.CPU, e.PID, clean(e.Comm), e.Type, e.Size, conn, fields(e))
	case m.Lost != nil:
		if m.Lost.Source == "subscriber" {
			fmt.Fprintf(w, "# lost %d events: this watch fell behind (%d so far)\n", m.Lost.Count, m.Lost.Total)
		} else {
			fmt.Fprintf(w, "# the recorder lost %d events: a kernel ring was full\n", m.Lost.Count)
		}
	case m.End != nil:
		fmt.Fprintf(w, "# the daemon ended the stream (%s)\n", m.End.Reason)
	}
}

func fields(e *magnetclient.Event) string {
	var b strings.Builder
	if e.TCPFlags != "" {
		fmt.Fprintf(&b, " tcpflags=%s", e.TCPFlags)
	}
	keys := make([]string, 0, len(e.Fields))
	for k := range e.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%v", k, e.Fields[k])
	}
	return b.String()
}

// clean keeps a command name from moving the terminal's cursor.
func clean(s string) string {
	if s == "" {
		return "-"
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}
