// SPDX-License-Identifier: Apache-2.0

// Package demo is the `magnet demo` command: the paper's FTP pattern between
// two network namespaces, recorded and shown.
package demo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// New returns the demo command.
func New() *cobra.Command {
	var (
		output, proto string
		lines, rate   int
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Record the paper's FTP pattern between two network namespaces and show it",
		Long: `Build two "hosts" (network namespaces joined by a veth pair, rate-limited
with tc tbf), send 100 messages of 10,240 bytes, one every 20 ms, from one to
the other (MAGNeT's FTP example), record it, and print the summary, the
connection table, the first lines of the parsed trace and, last, the
report's modulation table for each end: what the application asked of the
network against what every layer down to the wire made of it. Needs root.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if proto != "tcp" && proto != "udp" {
				return fmt.Errorf("demo: unknown protocol %q (want tcp or udp)", proto)
			}
			if err := netlab.Available(); err != nil {
				return fmt.Errorf("demo: %w", err)
			}
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("demo: %w", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// `magnet demo | head` must not kill the demo before it removes
			// its namespaces: a closed pipe becomes a write error instead.
			signal.Ignore(syscall.SIGPIPE)
			netlab.CleanupStale("magnet-demo")
			lab, err := netlab.New(netlab.Options{Name: "magnet-demo", RateMbit: rate})
			if err != nil {
				return fmt.Errorf("demo: %w", err)
			}
			defer lab.Close()
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "hosts: %s (%s) -> %s (%s), %d Mbit/s\n", lab.Client.NS, lab.Client.Addr, lab.Server.NS, lab.Server.Addr, rate)
			const port = 5201
			addr := fmt.Sprintf("%s:%d", lab.Server.Addr, port)

			recCtx, recStop := context.WithCancel(ctx)
			defer recStop()
			ready := make(chan struct{})
			type result struct {
				res *record.Result
				err error
			}
			done := make(chan result, 1)
			go func() {
				res, err := record.Run(recCtx, record.Config{
					Output: output, Groups: event.DefaultGroups,
					// The port alone would also take any other traffic on it
					// (iperf3's default), in any namespace of the host.
					Filters: record.Filters{Port: port, Pcap: "host " + lab.Server.Addr.String()}, Ready: func() { close(ready) },
				})
				done <- result{res, err}
			}()
			select {
			case <-ready:
			case r := <-done:
				return fmt.Errorf("demo: record: %w", r.err)
			}
			werr := runWorkload(ctx, lab, self, proto, addr)
			recStop()
			r := <-done
			if r.err != nil {
				return fmt.Errorf("demo: record: %w", r.err)
			}
			if werr != nil {
				return fmt.Errorf("demo: %w", werr)
			}
			if err := show(out, r.res, lines); err != nil && !errors.Is(err, syscall.EPIPE) {
				return fmt.Errorf("demo: %w", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&output, "output", "o", "demo.mgt", "trace file to write")
	f.StringVar(&proto, "proto", "tcp", "tcp or udp")
	f.IntVar(&rate, "rate", 100, "link rate in Mbit/s")
	f.IntVarP(&lines, "lines", "n", 20, "lines of the parsed trace to show")
	return cmd
}

func runWorkload(ctx context.Context, lab *netlab.Lab, self, proto, addr string) error {
	srv := exec.CommandContext(ctx, "ip", "netns", "exec", lab.Server.NS, self, "workload", "serve",
		"--proto", proto, "--listen", addr, "--count", "100", "--size", "10240")
	stdout, err := srv.StdoutPipe()
	if err != nil {
		return err
	}
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		return fmt.Errorf("start server: %w", err)
	}
	defer func() {
		if srv.ProcessState == nil {
			srv.Process.Kill()
			srv.Wait()
		}
	}()
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "listening") {
		return fmt.Errorf("server did not start")
	}
	cli := exec.CommandContext(ctx, "ip", "netns", "exec", lab.Client.NS, self, "workload", "send",
		"--proto", proto, "--to", addr, "--count", "100", "--size", "10240", "--interval", "20ms")
	cli.Stderr = os.Stderr
	if out, err := cli.Output(); err != nil {
		return fmt.Errorf("client: %w", err)
	} else {
		fmt.Printf("client: %s", out)
	}
	sc.Scan()
	fmt.Printf("server: %s\n", sc.Text())
	return srv.Wait()
}

func show(out io.Writer, res *record.Result, lines int) error {
	var total uint64
	var parts []string
	for _, name := range record.SortedCounts(res.Events) {
		if name == "task" || name == "iface" {
			continue
		}
		total += res.Events[name]
		parts = append(parts, fmt.Sprintf("%s %d", name, res.Events[name]))
	}
	fmt.Fprintf(out, "\nrecorded %s: %d events, %d lost, %d bytes\n  %s\n", res.Output, total, res.Lost, res.Bytes, strings.Join(parts, ", "))

	r, err := trace.Open(res.Output)
	if err != nil {
		return err
	}
	cs, start, err := export.Conns(r)
	r.Close()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n$ magnet parse --conns %s\n", res.Output)
	if err := export.WriteConns(out, cs, start); err != nil {
		return err
	}
	r, err = trace.Open(res.Output)
	if err != nil {
		return err
	}
	defer r.Close()
	fmt.Fprintf(out, "\n$ magnet parse %s | head -%d\n", res.Output, lines+1)
	lw := &lineLimit{w: out, left: lines + 1}
	if err := export.WriteText(lw, r, export.TextOptions{}); err != nil && err != errEnough {
		return err
	}
	return showModulation(out, res.Output)
}

// showModulation ends the demo with the paper's point: the report's
// modulation table for each end of the connection, what the application
// asked of the network against what each layer, down to the wire, made
// of it.
func showModulation(out io.Writer, path string) error {
	rep, err := analyze.Modulation([]string{path}, 0)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n$ magnet report %s   # modulation: each layer's count, size and spacing\n", path)
	var sends, wire, reads *analyze.LayerStats
	for _, c := range rep.Conns {
		role, s, r := "sender", layerOf(c, "sock_send"), layerOf(c, "sock_recv")
		switch {
		case s != nil:
			if sends == nil {
				sends, wire = s, layerOf(c, "dev_xmit")
			}
		case r != nil:
			role = "receiver"
			if reads == nil {
				reads = r
			}
		default:
			continue // the listener: no data
		}
		fmt.Fprintf(out, "\nconnection %d, the %s: %s %s -> %s\n", c.Conn.ID, role, c.Conn.Proto, c.Conn.Local, c.Conn.Remote)
		if err := analyze.WriteLayerTable(out, c.Layers); err != nil {
			return err
		}
	}
	// The same, in words (medians; cv: the spacing's coefficient of
	// variation, 0 for a perfectly regular stream).
	fmt.Fprintln(out)
	for _, l := range []struct {
		what string
		l    *analyze.LayerStats
	}{{"the application asked for %d sends of %.0f bytes, %.1f ms apart (cv %.2f)\n", sends},
		{"the device sent %d packets of %.0f bytes, %.1f ms apart (cv %.2f)\n", wire},
		{"the receiving application got %d reads of %.0f bytes, %.1f ms apart (cv %.2f)\n", reads}} {
		if l.l != nil {
			if _, err := fmt.Fprintf(out, l.what, l.l.Count, l.l.Size.Median, l.l.Spacing.Median/1e3, l.l.Spacing.CV); err != nil {
				return err
			}
		}
	}
	return nil
}

func layerOf(c *analyze.ConnReport, name string) *analyze.LayerStats {
	for _, l := range c.Layers {
		if l.Layer == name && l.Count > 0 {
			return l
		}
	}
	return nil
}

var errEnough = fmt.Errorf("enough lines")

// lineLimit passes on the first left lines, then stops the writer.
type lineLimit struct {
	w    io.Writer
	left int
}

func (l *lineLimit) Write(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, errEnough
	}
	n := 0
	for i, c := range p {
		if c == '\n' {
			l.left--
			if l.left == 0 {
				n = i + 1
				break
			}
		}
		n = i + 1
	}
	if _, err := l.w.Write(p[:n]); err != nil {
		return 0, err
	}
	if n < len(p) {
		return n, errEnough
	}
	return n, nil
}
