// SPDX-License-Identifier: Apache-2.0

package workloadcmd

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// run executes "magnet workload args..." in process with out as stdout.
func run(out io.Writer, args ...string) error {
	return runContext(context.Background(), out, args...)
}

// runContext is run until ctx ends, as a signal would end it.
func runContext(ctx context.Context, out io.Writer, args ...string) error {
	root := &cobra.Command{Use: "magnet", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(New())
	root.SetArgs(append([]string{"workload"}, args...))
	root.SetOut(out)
	root.SetErr(io.Discard)
	return root.ExecuteContext(ctx)
}

// startServe runs `workload serve args...` until ctx ends and returns the
// address its first line says it listens on, the scanner of its later
// lines, and where its error arrives once it returns.
func startServe(t *testing.T, ctx context.Context, args ...string) (string, *bufio.Scanner, <-chan error) {
	t.Helper()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := runContext(ctx, pw, append([]string{"serve"}, args...)...)
		pw.CloseWithError(err)
		done <- err
	}()
	lines := bufio.NewScanner(pr)
	if !lines.Scan() {
		t.Fatalf("serve printed nothing: %v", <-done)
	}
	addr, ok := strings.CutPrefix(lines.Text(), "listening ")
	if !ok {
		t.Fatalf("first line %q, want listening ADDR", lines.Text())
	}
	return addr, lines, done
}

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--proto", "sctp", "--listen", "127.0.0.1:0"}, `workload: unknown protocol "sctp" (want tcp or udp)`},
		{[]string{"send", "--proto", "sctp", "--to", "127.0.0.1:9"}, `workload: unknown protocol "sctp" (want tcp or udp)`},
		{[]string{"serve"}, "workload: --listen ADDR is required"},
		{[]string{"send"}, "workload: --to ADDR is required"},
		{[]string{"send", "--to", "127.0.0.1:9", "--flood", "1s", "--count", "5"}, "workload: --flood cannot be combined with --count, --interval or --burst"},
		{[]string{"send", "--to", "127.0.0.1:9", "--count", "0"}, "workload: --count, --size and --burst must be positive"},
		{[]string{"send", "--to", "127.0.0.1:9", "--burst", "0"}, "workload: --count, --size and --burst must be positive"},
		{[]string{"send", "--proto", "udp", "--to", "127.0.0.1:9", "--size", "70000"}, "workload: --size 70000 exceeds the udp limit of 65507 bytes"},
		{[]string{"send", "--proto", "udp", "--to", "127.0.0.1:9", "--churn", "1s"}, "workload: --churn makes TCP connections: it cannot run over udp"},
		{[]string{"send", "--to", "127.0.0.1:9", "--churn", "1s", "--size", "0"}, `workload: --size 0: a churn request needs at least 1 byte (its '\n')`},
		{[]string{"send", "--to", "127.0.0.1:9", "--churn", "0s"}, "workload: --churn 0s must be positive"},
		{[]string{"send", "--to", "127.0.0.1:9", "--churn", "1s", "--flood", "1s"}, "workload: --churn cannot be combined with --flood, --count, --interval, --burst or --tcp-info"},
		{[]string{"send", "--to", "127.0.0.1:9", "--churn", "1s", "--count", "5"}, "workload: --churn cannot be combined with --flood, --count, --interval, --burst or --tcp-info"},
		{[]string{"send", "--to", "127.0.0.1:9", "--churn", "1s", "--tcp-info"}, "workload: --churn cannot be combined with --flood, --count, --interval, --burst or --tcp-info"},
		{[]string{"serve", "--proto", "udp", "--listen", "127.0.0.1:0", "--churn"}, "workload: --churn makes TCP connections: it cannot run over udp"},
		{[]string{"serve", "--listen", "127.0.0.1:0", "--churn", "--size", "100"}, `workload: --churn cannot be combined with --count or --size (each request ends at its '\n')`},
	} {
		err := run(io.Discard, tc.args...)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestServeSend(t *testing.T) {
	for _, proto := range []string{"tcp", "udp"} {
		t.Run(proto, func(t *testing.T) {
			addr, lines, done := startServe(t, context.Background(), "--proto", proto, "--listen", "127.0.0.1:0", "--count", "10", "--size", "1000")

			var sent bytes.Buffer
			if err := run(&sent, "send", "--proto", proto, "--to", addr, "--count", "10", "--size", "1000", "--interval", "1ms"); err != nil {
				t.Fatal(err)
			}
			if got, want := sent.String(), "sent 10000 bytes in 10 messages\n"; got != want {
				t.Errorf("send printed %q, want %q", got, want)
			}
			if !lines.Scan() {
				t.Fatalf("serve printed no result: %v", <-done)
			}
			if got := lines.Text(); !strings.HasPrefix(got, "received 10000 bytes in ") || !strings.HasSuffix(got, " reads") {
				t.Errorf("serve printed %q", got)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestFloodSizeDefault(t *testing.T) {
	addr, lines, done := startServe(t, context.Background(), "--listen", "127.0.0.1:0")
	var sent bytes.Buffer
	if err := run(&sent, "send", "--to", addr, "--flood", "50ms"); err != nil {
		t.Fatal(err)
	}
	var n, msgs int64
	if _, err := fmt.Sscanf(sent.String(), "sent %d bytes in %d messages", &n, &msgs); err != nil || msgs == 0 || n != 64*msgs {
		t.Errorf("flood printed %q (%v), want 64-byte messages", sent.String(), err)
	}
	lines.Scan()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestChurnServeSend: the churn's two lines, as the bench reads them, agree
// on every connection and byte; the server prints its line once stopped
// (here by its context, in the bench by SIGTERM).
func TestChurnServeSend(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, lines, done := startServe(t, ctx, "--listen", "127.0.0.1:0", "--churn")
	var sent bytes.Buffer
	if err := run(&sent, "send", "--to", addr, "--churn", "200ms"); err != nil {
		t.Fatal(err)
	}
	var n, conns int64
	if _, err := fmt.Sscanf(sent.String(), "sent %d bytes in %d connections\n", &n, &conns); err != nil || conns == 0 || n != 100*conns {
		t.Fatalf("send printed %q (%v), want 100-byte requests", sent.String(), err)
	}
	cancel()
	if !lines.Scan() {
		t.Fatalf("serve printed no result: %v", <-done)
	}
	if got, want := lines.Text(), fmt.Sprintf("received %d bytes in %d connections", n, conns); got != want {
		t.Errorf("serve printed %q, want %q", got, want)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
