// SPDX-License-Identifier: Apache-2.0

// Package probecmd is the `magnet probe` command: a server that sends
// probe streams to the client that asks, and a client that estimates the
// available bandwidth from the server to itself (see internal/availbw).
package probecmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/availbw"
)

// SecretEnv names the environment variable read when --secret is not
// given, which keeps the secret out of the process list.
const SecretEnv = "MAGNET_PROBE_SECRET"

// New returns the probe command with its server and client subcommands.
func New() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Estimate the available bandwidth of a path with packet trains",
		Long: `Estimate the available bandwidth of the path from a server to a client:
the rate the path could carry on top of its current traffic. The server
sends periodic UDP streams at rates the client chooses; the client times
their arrival with kernel timestamps, tests each stream for one-way delays
that increase (pathload's pairwise-difference test) and for an arrival rate
below the sending rate, votes over fleets of streams, and narrows the range
by bisection and a fluid-model jump. It reports the range, the grey region
where fleets disagreed, and when this host rather than the network limits
the measurement. See docs/PROBE.md.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newServer(), newClient())
	return cmd
}

func newServer() *cobra.Command {
	var (
		listen, secret, maxRate string
		realTime                bool
		maxDuration             time.Duration
	)
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Answer probe clients: send them probe streams",
		Long: `Answer probe clients, one at a time, on a TCP control channel (default port
7207). Each client gets probe streams sent to its own address (the peer of
its control connection, never any other host), at no more than --max-rate
and for no longer than --max-duration. With --secret (or $` + SecretEnv + `),
a client must prove it knows the secret (HMAC challenge; the secret never
crosses the network).`,
		Example: `  magnet probe server
  magnet probe server --listen 10.0.0.1:7207 --max-rate 10G --max-duration 30s --secret hunter2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rate, err := availbw.ParseRate(maxRate)
			if err != nil {
				return fmt.Errorf("probe server: --max-rate: %w", err)
			}
			if maxDuration <= 0 {
				return fmt.Errorf("probe server: --max-duration %v must be positive", maxDuration)
			}
			if secret == "" {
				secret = os.Getenv(SecretEnv)
			}
			errOut := cmd.ErrOrStderr()
			srv, err := availbw.Listen(availbw.ServerConfig{
				Listen: listen, Secret: secret, MaxRate: rate, MaxDuration: maxDuration, RealTime: realTime,
				Log: func(format string, args ...any) { fmt.Fprintf(errOut, format+"\n", args...) },
			})
			if err != nil {
				return err
			}
			defer srv.Close()
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			pace := "unknown"
			if srv.Pace() > 0 {
				pace = availbw.FormatRate(srv.Pace())
			}
			rt := "at real-time priority (--realtime)"
			switch {
			case !realTime:
				rt = "at normal priority"
			case !srv.RealTime():
				rt = "at normal priority (--realtime not permitted)"
			}
			// Tests and scripts wait for this line.
			fmt.Fprintf(cmd.OutOrStdout(), "listening %s (max rate %s, max duration %v, this host paces up to %s, sending %s)\n",
				srv.Addr(), availbw.FormatRate(rate), maxDuration, pace, rt)
			return srv.Serve(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", ":"+strconv.Itoa(availbw.DefaultPort), "control channel address, [host]:port")
	f.StringVar(&secret, "secret", "", "shared secret clients must know (default $"+SecretEnv+")")
	f.StringVar(&maxRate, "max-rate", "1G", "highest rate of any stream, bit/s (k, M, G suffixes)")
	f.DurationVar(&maxDuration, "max-duration", availbw.DefaultMaxDuration, "longest session per client")
	f.BoolVar(&realTime, "realtime", false, "send streams at real-time priority: only on a sender that runs nothing else (it starves this host's other traffic)")
	return cmd
}

func newClient() *cobra.Command {
	var (
		port              int
		maxRate, secret   string
		asJSON, verbose   bool
		timeout           time.Duration
		packetSize, count int
	)
	cmd := &cobra.Command{
		Use:   "client HOST",
		Short: "Estimate the available bandwidth from a probe server to this host",
		Long: `Estimate the available bandwidth of the path from HOST, where magnet probe
server runs, to this host. Prints the estimate as a range, the grey region,
the capacity seen by back-to-back trains, flags that qualify the estimate
(host-limited: this host cannot pace fast enough to find the limit; coalesced
timestamps: lower bound only), the CPU time used, probe bytes and time taken.`,
		Example: `  magnet probe client 10.0.0.1
  magnet probe client server.example:7207 --max-rate 500M --json`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return errors.New("probe client: give the probe server's HOST (magnet probe client HOST)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			addr, err := serverAddr(args[0], port, cmd.Flags().Changed("port"))
			if err != nil {
				return fmt.Errorf("probe client: %w", err)
			}
			var rate float64
			if maxRate != "" {
				if rate, err = availbw.ParseRate(maxRate); err != nil {
					return fmt.Errorf("probe client: --max-rate: %w", err)
				}
			}
			if timeout <= 0 {
				return fmt.Errorf("probe client: --timeout %v must be positive", timeout)
			}
			// The library takes 0 for its default; a user who typed 0 meant
			// something else.
			if count < 10 || count > availbw.MaxStreamPackets {
				return fmt.Errorf("probe client: --stream-packets %d outside 10..%d", count, availbw.MaxStreamPackets)
			}
			if packetSize < availbw.MinPacketSize || packetSize > availbw.MaxPacketSize {
				return fmt.Errorf("probe client: --packet-size %d outside %d..%d bytes", packetSize, availbw.MinPacketSize, availbw.MaxPacketSize)
			}
			if secret == "" {
				secret = os.Getenv(SecretEnv)
			}
			cfg := availbw.ClientConfig{Server: addr, Secret: secret, MaxRate: rate,
				Params: availbw.Params{PacketSize: packetSize, StreamPackets: count}}
			if verbose {
				errOut := cmd.ErrOrStderr()
				cfg.Log = func(format string, args ...any) { fmt.Fprintf(errOut, format+"\n", args...) }
			}
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			c, err := availbw.Dial(ctx, cfg)
			if err != nil {
				return fmt.Errorf("probe client: %w", err)
			}
			defer c.Close()
			r, err := c.Estimate(ctx)
			if err != nil {
				if errors.Is(err, context.DeadlineExceeded) {
					return fmt.Errorf("probe client: no estimate within --timeout %v", timeout)
				}
				return fmt.Errorf("probe client: %w", err)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			}
			return Write(out, r)
		},
	}
	f := cmd.Flags()
	f.IntVar(&port, "port", availbw.DefaultPort, "server's control port")
	f.StringVar(&maxRate, "max-rate", "", "never probe above this rate, bit/s (k, M, G suffixes)")
	f.StringVar(&secret, "secret", "", "the server's shared secret (default $"+SecretEnv+")")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	f.BoolVarP(&verbose, "verbose", "v", false, "log every stream to stderr")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "give up after this long")
	f.IntVar(&packetSize, "packet-size", availbw.DefaultParams.PacketSize, "IP size of the probe packets, bytes")
	f.IntVar(&count, "stream-packets", availbw.DefaultParams.StreamPackets, "packets per stream")
	return cmd
}

// serverAddr joins HOST (which may carry its own port) and the port.
func serverAddr(host string, port int, portSet bool) (string, error) {
	if port < 1 || port > 65535 {
		return "", fmt.Errorf("--port %d outside 1..65535", port)
	}
	if h, p, err := net.SplitHostPort(host); err == nil {
		if portSet && p != strconv.Itoa(port) {
			return "", fmt.Errorf("%s names port %s but --port says %d", host, p, port)
		}
		if h == "" {
			return "", fmt.Errorf("%q: no host", host)
		}
		return host, nil
	}
	if host == "" || strings.ContainsAny(host, " /") {
		return "", fmt.Errorf("%q is not a host name or address", host)
	}
	return net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(port)), nil
}

// Write prints a result as text.
func Write(w io.Writer, r *availbw.Result) error {
	p := &printer{w: w}
	p.linef("available bandwidth from %s to this host", r.Server)
	switch {
	case (r.HostLimited || r.RateLimited) && r.High == 0:
		p.field("estimate", "at least %s (%s)", availbw.FormatRate(r.Low), limitWord(r))
	case r.HostLimited:
		p.field("estimate", "%s (range %s to %s; host-limited: may be this host's limit)", availbw.FormatRate(r.Point),
			availbw.FormatRate(r.Low), availbw.FormatRate(float64(r.High)))
	case r.Coalesced:
		p.field("estimate", "at least %s (lower bound: the receiver's timestamps are coalesced)", availbw.FormatRate(r.Low))
	case r.High > 0:
		p.field("estimate", "%s (range %s to %s)", availbw.FormatRate(r.Point), availbw.FormatRate(r.Low), availbw.FormatRate(float64(r.High)))
	default:
		p.field("estimate", "%s (no fleet was above it)", availbw.FormatRate(r.Point))
	}
	if r.GreyHigh > 0 {
		p.field("grey region", "%s to %s (fleets there disagreed: the available bandwidth varied)",
			availbw.FormatRate(r.GreyLow), availbw.FormatRate(r.GreyHigh))
	} else {
		p.field("grey region", "none")
	}
	if r.CapacityAtLeast {
		p.field("capacity", "at least %s (back-to-back trains arrived as fast as they were sent)", availbw.FormatRate(r.Capacity))
	} else {
		half := ""
		if r.HalfCapacity > 0 {
			half = "; half-size packets " + availbw.FormatRate(r.HalfCapacity)
		}
		p.field("capacity", "%s (median spacing of back-to-back trains%s)", availbw.FormatRate(r.Capacity), half)
	}
	pace := "unknown"
	if r.ServerPace > 0 {
		pace = availbw.FormatRate(r.ServerPace)
	}
	ts := "kernel receive timestamps"
	if !r.KernelTimestamps {
		ts = "user-space receive times"
	}
	rt := "at real-time priority"
	if !r.ServerRealTime {
		rt = "at normal priority"
	}
	p.field("host", "sender reached %s back to back (its send cost allows %s), sending %s; probed up to %s; %s",
		availbw.FormatRate(r.TrainSendRate), pace, rt, availbw.FormatRate(r.ProbeLimit), ts)
	if len(r.Flags) == 0 {
		p.field("flags", "none")
	}
	for _, f := range r.Flags {
		p.field("flag", "%s", f)
	}
	server := "not reported"
	if r.ServerCPUSeconds != nil {
		server = fmt.Sprintf("%.2f s", *r.ServerCPUSeconds)
	} else {
		// The server ended the session: say why the search stopped short.
		p.field("stopped", "%s", r.Stopped)
	}
	p.field("cost", "%d streams (%d rejected) in %d fleets, %s of probe traffic, %.2f s, CPU %.2f s here and %s on the server",
		r.Streams, r.Rejected, len(r.Fleets), formatBytes(r.Bytes), float64(r.TookNs)/1e9, r.ClientCPUSeconds, server)
	return p.err
}

func limitWord(r *availbw.Result) string {
	if r.HostLimited {
		return "host-limited: this host cannot pace faster; the network may carry more"
	}
	return "rate-limited: no stream may go faster"
}

func formatBytes(n int64) string {
	switch {
	case n >= 1e6:
		return fmt.Sprintf("%.2f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}

// printer writes lines and keeps the first error.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) linef(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format+"\n", args...)
	}
}

func (p *printer) field(name, format string, args ...any) {
	p.linef("  %-12s %s", name+":", fmt.Sprintf(format, args...))
}

// signalContext ends on SIGINT or SIGTERM.
func signalContext(parent context.Context) (context.Context, context.CancelFunc) {
	if parent == nil {
		parent = context.Background()
	}
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}
