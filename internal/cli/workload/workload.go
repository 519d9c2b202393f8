// SPDX-License-Identifier: Apache-2.0

// Package workloadcmd implements the hidden "magnet workload" command, which
// generates test traffic for magnet's tests, benchmarks and demo, usually
// run inside a namespace as "ip netns exec NS magnet workload ...".
package workloadcmd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/workload"
)

// New returns the hidden "workload" command with its "serve" and "send"
// subcommands.
func New() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "workload",
		Short:  "Generate test traffic (for tests and demos)",
		Hidden: true,
		Args:   cobra.NoArgs,
	}
	cmd.AddCommand(newServe(), newSend())
	return cmd
}

func newServe() *cobra.Command {
	var (
		proto, listen string
		count, size   int
		churn         bool
	)
	cmd := &cobra.Command{
		Use:   "serve --listen ADDR",
		Short: "Receive one workload and report what arrived",
		Long: `Receive one workload and report what arrived.

Prints "listening ADDR" once the socket is ready and "received BYTES bytes in
N reads" when done. Over TCP it takes one connection and ends when the sender
closes it. Over UDP it ends once --count times --size bytes have arrived, or
2 seconds after the last datagram.

With --churn (TCP), it serves connections until SIGINT or SIGTERM, each
concurrently: it reads one request up to its '\n' and closes the connection
first. It then prints "received BYTES bytes in N connections".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := workload.CheckProto(proto); err != nil {
				return fmt.Errorf("workload: %w", err)
			}
			if listen == "" {
				return errors.New("workload: --listen ADDR is required")
			}
			if count < 0 || size < 0 {
				return errors.New("workload: --count and --size must not be negative")
			}
			f := cmd.Flags()
			if churn && proto != "tcp" {
				return fmt.Errorf("workload: --churn makes TCP connections: it cannot run over %s", proto)
			}
			if churn && (f.Changed("count") || f.Changed("size")) {
				return errors.New("workload: --churn cannot be combined with --count or --size (each request ends at its '\\n')")
			}
			ctx, stop := signalContext(cmd.Context())
			defer stop()

			out := cmd.OutOrStdout()
			// os.Stdout is unbuffered: the line is out before Serve blocks.
			ready := func(a net.Addr) { fmt.Fprintf(out, "listening %s\n", a) }
			if churn {
				r, err := workload.ServeChurn(ctx, listen, ready)
				if err != nil {
					return fmt.Errorf("workload: %w", err)
				}
				fmt.Fprintf(out, "received %d bytes in %d connections\n", r.Bytes, r.Connections)
				return nil
			}
			r, err := workload.ServeBytes(ctx, proto, listen, int64(count)*int64(size), ready)
			if err != nil && !interrupted(ctx, err) {
				return fmt.Errorf("workload: %w", err)
			}
			fmt.Fprintf(out, "received %d bytes in %d reads\n", r.Bytes, r.Messages)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&proto, "proto", "tcp", "protocol: tcp or udp")
	f.StringVar(&listen, "listen", "", "address to listen on, host:port")
	f.IntVar(&count, "count", 0, "messages expected (udp: stop after count*size bytes)")
	f.IntVar(&size, "size", 0, "bytes per message expected")
	f.BoolVar(&churn, "churn", false, "tcp: serve one request per connection, many connections, until SIGINT or SIGTERM")
	return cmd
}

func newSend() *cobra.Command {
	var (
		proto, to          string
		count, size, burst int
		interval           time.Duration
		flood, churn       time.Duration
		tcpInfo            bool
	)
	cmd := &cobra.Command{
		Use:   "send --to ADDR",
		Short: "Send a workload and report what was sent",
		Long: `Send a workload and report what was sent.

Without --flood, writes --count messages of --size bytes, one every
--interval, each with one send call (the MAGNeT paper's FTP-like pattern);
with --burst N, N messages back to back every --interval.
With --flood, writes --size-byte messages back to back for that long.
Prints "sent BYTES bytes in N messages", and with --tcp-info a second line
"tcpi_delivered SEGMENTS".

With --churn (TCP), makes one short connection after another for that long,
one at a time: connect, one --size-byte request in one send call ('q's ended
by '\n'), read until the server closes, close. Prints "sent BYTES bytes in N
connections".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := workload.CheckProto(proto); err != nil {
				return fmt.Errorf("workload: %w", err)
			}
			if to == "" {
				return errors.New("workload: --to ADDR is required")
			}
			f := cmd.Flags()
			if f.Changed("churn") {
				return sendChurn(cmd, proto, to, churn, size)
			}
			if f.Changed("flood") {
				if f.Changed("count") || f.Changed("interval") || f.Changed("burst") {
					return errors.New("workload: --flood cannot be combined with --count, --interval or --burst")
				}
				if flood <= 0 {
					return fmt.Errorf("workload: --flood %v must be positive", flood)
				}
				if !f.Changed("size") {
					size = 64
				}
			}
			if count <= 0 || size <= 0 || burst <= 0 {
				return errors.New("workload: --count, --size and --burst must be positive")
			}
			if interval < 0 {
				return fmt.Errorf("workload: --interval %v must not be negative", interval)
			}
			if proto == "udp" && size > workload.MaxDatagram {
				return fmt.Errorf("workload: --size %d exceeds the udp limit of %d bytes", size, workload.MaxDatagram)
			}
			ctx, stop := signalContext(cmd.Context())
			defer stop()

			var (
				r   workload.Result
				err error
			)
			if flood > 0 {
				r, err = workload.Flood(ctx, proto, to, size, flood)
			} else {
				r, err = workload.Send(ctx, to, workload.Spec{Proto: proto, Count: count, Size: size, Interval: interval, Burst: burst})
			}
			if err != nil && !interrupted(ctx, err) {
				return fmt.Errorf("workload: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "sent %d bytes in %d messages\n", r.Bytes, r.Messages)
			if tcpInfo && proto == "tcp" {
				fmt.Fprintf(cmd.OutOrStdout(), "tcpi_delivered %d\n", r.Delivered)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&proto, "proto", "tcp", "protocol: tcp or udp")
	f.StringVar(&to, "to", "", "address to send to, host:port")
	f.IntVar(&count, "count", workload.DefaultCount, "messages to send")
	f.IntVar(&size, "size", workload.DefaultSize, "bytes per message (64 with --flood, 100 with --churn)")
	f.DurationVar(&interval, "interval", workload.DefaultInterval, "time between messages, 0 for back to back")
	f.DurationVar(&flood, "flood", 0, "send small messages as fast as possible for this long")
	f.IntVar(&burst, "burst", 1, "messages written back to back at each interval (bursty traffic)")
	f.BoolVar(&tcpInfo, "tcp-info", false, "tcp: also print the kernel's tcpi_delivered once the receiver has closed")
	f.DurationVar(&churn, "churn", 0, "tcp: make short connections (one --size-byte request each) one after another for this long")
	return cmd
}

// sendChurn is "send --churn D": the flags that shape the other workloads
// are refused rather than ignored.
func sendChurn(cmd *cobra.Command, proto, to string, d time.Duration, size int) error {
	f := cmd.Flags()
	for _, other := range []string{"flood", "count", "interval", "burst", "tcp-info"} {
		if f.Changed(other) {
			return errors.New("workload: --churn cannot be combined with --flood, --count, --interval, --burst or --tcp-info")
		}
	}
	if proto != "tcp" {
		return fmt.Errorf("workload: --churn makes TCP connections: it cannot run over %s", proto)
	}
	if d <= 0 {
		return fmt.Errorf("workload: --churn %v must be positive", d)
	}
	if !f.Changed("size") {
		size = workload.DefaultChurnSize
	}
	if size < 1 {
		return fmt.Errorf("workload: --size %d: a churn request needs at least 1 byte (its '\\n')", size)
	}
	ctx, stop := signalContext(cmd.Context())
	defer stop()
	r, err := workload.Churn(ctx, to, size, d)
	if err != nil && !interrupted(ctx, err) {
		return fmt.Errorf("workload: %w", err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "sent %d bytes in %d connections\n", r.Bytes, r.Connections)
	return nil
}

// signalContext returns a context that ends on SIGINT or SIGTERM, so an
// interrupted run still reports what it moved.
func signalContext(parent context.Context) (context.Context, context.CancelFunc) {
	if parent == nil {
		parent = context.Background()
	}
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}

// interrupted reports whether err only says that ctx ended.
func interrupted(ctx context.Context, err error) bool {
	return ctx.Err() != nil && errors.Is(err, ctx.Err())
}
