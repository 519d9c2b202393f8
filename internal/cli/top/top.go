// SPDX-License-Identifier: Apache-2.0

// Package topcmd is the `magnet top` command: a live table of the
// connections magnet's daemon tracks, refreshed in the terminal.
package topcmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/magnet-tracer/magnet/internal/top"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// New returns the top command.
func New() *cobra.Command {
	var (
		socket, tokenFile, sortBy string
		interval, window          time.Duration
		once, asJSON, ascending   bool
		delivery                  bool
		filter                    magnetclient.Filter
		ports, pids               []uint
	)
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Show a live table of connections from the magnet daemon",
		Long: `Show a live table of the connections the magnet daemon tracks (magnet daemon
must be running): application and wire rates, the kernel's delivery-rate
estimate, cwnd, srtt, retransmissions, segments lost and drops, with the
owning process.

Rates are bits per second over the daemon's time window (--window), both
directions added. DELIVERY is the mean of the kernel's per-ACK delivery-rate
samples over the window, those the application limited left out (the daemon
records them while top runs: --delivery); when all were app-limited, or
without per-ACK samples, it is the last sample, and a "*" after it marks a
sample the kernel took while the application, not the network, limited
sending.

Keys: left/right (or < >) choose the sort column, r reverses it, space
refreshes now, q quits. When standard output is not a terminal, or with
--once, it prints the table once and exits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			order := top.DefaultOrder
			if sortBy != "" {
				i, err := top.ColumnIndex(sortBy)
				if err != nil {
					return fmt.Errorf("top: --sort: %w", err)
				}
				order = top.Order{By: i, Desc: top.Columns[i].Right}
			}
			if ascending {
				order.Desc = false
			}
			for _, p := range ports {
				if p == 0 || p > 65535 {
					return fmt.Errorf("top: --port %d: want 1 to 65535", p)
				}
				filter.Ports = append(filter.Ports, uint16(p))
			}
			for _, p := range pids {
				if p == 0 || p > 1<<22 {
					return fmt.Errorf("top: --pid %d: not a process id", p)
				}
				filter.PIDs = append(filter.PIDs, uint32(p))
			}
			if interval < 100*time.Millisecond {
				return fmt.Errorf("top: --interval %v: want at least 100ms", interval)
			}
			var opts []magnetclient.Option
			if tokenFile != "" {
				tok, err := os.ReadFile(tokenFile)
				if err != nil {
					return fmt.Errorf("top: read token: %w", err)
				}
				opts = append(opts, magnetclient.WithToken(strings.SplitN(string(tok), "\n", 2)[0]))
			}
			c, err := magnetclient.Dial(socket, opts...)
			if err != nil {
				return fmt.Errorf("top: %w (is magnet daemon running?)", err)
			}
			defer c.Close()
			src := top.SourceFunc(func(ctx context.Context) ([]magnetclient.Connection, error) {
				var opts []magnetclient.PullOption
				if delivery {
					opts = append(opts, magnetclient.WithDelivery())
				}
				return c.Connections(ctx, filter, magnetclient.Window{Ns: int64(window)}, opts...)
			})

			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			out := cmd.OutOrStdout()
			f, isFile := out.(*os.File)
			tty := isFile && term.IsTerminal(int(f.Fd())) && term.IsTerminal(int(os.Stdin.Fd()))
			if once || asJSON || !tty {
				return printOnce(ctx, src, out, order, asJSON)
			}
			old, err := term.MakeRaw(int(os.Stdin.Fd()))
			if err != nil {
				return fmt.Errorf("top: terminal raw mode: %w", err)
			}
			defer term.Restore(int(os.Stdin.Fd()), old)
			size := func() (int, int) {
				w, h, err := term.GetSize(int(f.Fd()))
				if err != nil {
					return 0, 0
				}
				return w, h
			}
			// A resized terminal is redrawn at once, not at the next refresh.
			winch := make(chan os.Signal, 1)
			signal.Notify(winch, syscall.SIGWINCH)
			defer signal.Stop(winch)
			redraw := make(chan struct{}, 1)
			go func() {
				for {
					select {
					case <-ctx.Done():
						return
					case <-winch:
						select {
						case redraw <- struct{}{}:
						default:
						}
					}
				}
			}()
			return top.Run(ctx, src, os.Stdin, out, top.Options{
				Interval: interval, Order: order, Size: size, Where: socketName(socket), Redraw: redraw,
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&socket, "socket", magnetclient.DefaultSocket, "the daemon's Unix socket, or tcp://HOST:PORT")
	fl.StringVar(&tokenFile, "token-file", "", "file whose first line is the bearer token (for tcp://)")
	fl.DurationVar(&interval, "interval", time.Second, "time between refreshes")
	fl.DurationVar(&window, "window", 0, "time window of the rates (default: the daemon's, 1s)")
	fl.StringVar(&sortBy, "sort", "", "column to sort by: "+columnNames()+" (default app)")
	fl.BoolVar(&ascending, "ascending", false, "sort ascending (numbers sort descending by default)")
	fl.BoolVar(&once, "once", false, "print the table once and exit")
	fl.BoolVar(&delivery, "delivery", true, "ask for the kernel's per-ACK delivery-rate samples (the daemon's rate group, one event per ACK); false: the last tcp_state sample")
	fl.BoolVar(&asJSON, "json", false, "print the connections once as JSON (the daemon's /v1/connections) and exit")
	fl.UintSliceVar(&ports, "port", nil, "only connections with this local or remote port (repeatable)")
	fl.UintSliceVar(&pids, "pid", nil, "only connections this process owns (repeatable)")
	fl.StringSliceVar(&filter.Comms, "comm", nil, "only connections of this command (repeatable)")
	fl.StringSliceVar(&filter.Addrs, "addr", nil, "only connections with this address or prefix at either end (repeatable)")
	return cmd
}

func printOnce(ctx context.Context, src top.Source, out io.Writer, order top.Order, asJSON bool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conns, err := src.Connections(ctx)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return errors.New("top: the daemon did not answer within 10s")
		}
		return fmt.Errorf("top: %w", err)
	}
	if asJSON {
		if conns == nil {
			conns = []magnetclient.Connection{}
		}
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(conns)
	}
	rows := make([]top.Row, len(conns))
	for i, c := range conns {
		rows[i] = top.RowOf(c)
	}
	order.Sort(rows)
	for _, l := range top.Render(rows, order, 0) {
		if _, err := fmt.Fprintln(out, l); err != nil {
			return err
		}
	}
	return nil
}

func columnNames() string {
	names := make([]string, len(top.Columns))
	for i, c := range top.Columns {
		names[i] = strings.ToLower(c.Name)
	}
	return strings.Join(names, ", ")
}

func socketName(s string) string {
	if s == "" {
		return magnetclient.DefaultSocket
	}
	return s
}
