// SPDX-License-Identifier: Apache-2.0

package workload

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// serve starts ServeBytes on a loopback port and returns its address and a
// channel with its outcome.
func serve(t *testing.T, ctx context.Context, proto string, want int64) (string, <-chan outcome) {
	t.Helper()
	addrc := make(chan string, 1)
	done := make(chan outcome, 1)
	go func() {
		r, err := ServeBytes(ctx, proto, "127.0.0.1:0", want, func(a net.Addr) { addrc <- a.String() })
		done <- outcome{r, err}
	}()
	select {
	case a := <-addrc:
		return a, done
	case o := <-done:
		t.Fatalf("serve %s: %v", proto, o.err)
	}
	return "", nil
}

type outcome struct {
	r   Result
	err error
}

func TestSendServe(t *testing.T) {
	for _, proto := range []string{"tcp", "udp"} {
		t.Run(proto, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			spec := Spec{Proto: proto, Count: 10, Size: 1000, Interval: time.Millisecond}
			addr, done := serve(t, ctx, proto, 10*1000)

			sent, err := Send(ctx, addr, spec)
			if err != nil {
				t.Fatal(err)
			}
			if sent.Bytes != 10000 || sent.Messages != 10 {
				t.Errorf("sent %d bytes in %d messages, want 10000 in 10", sent.Bytes, sent.Messages)
			}
			if d := sent.End.Sub(sent.Start); d < 9*time.Millisecond {
				t.Errorf("10 messages 1ms apart took %v, want at least 9ms", d)
			}
			o := <-done
			if o.err != nil {
				t.Fatal(o.err)
			}
			if o.r.Bytes != 10000 {
				t.Errorf("server got %d bytes, want 10000", o.r.Bytes)
			}
			if proto == "udp" && o.r.Messages != 10 {
				t.Errorf("server got %d datagrams, want 10", o.r.Messages)
			}
		})
	}
}

func TestSendDefaultsAndSchedule(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr, done := serve(t, ctx, "tcp", 0)
	// 20 messages at 5ms: the schedule is fixed at the start, so the total
	// is close to 19 intervals, not 19 intervals plus the write times.
	sent, err := Send(ctx, addr, Spec{Proto: "tcp", Count: 20, Interval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if sent.Bytes != 20*DefaultSize {
		t.Errorf("sent %d bytes, want %d", sent.Bytes, 20*DefaultSize)
	}
	if d := sent.End.Sub(sent.Start); d < 95*time.Millisecond || d > 2*time.Second {
		t.Errorf("20 messages 5ms apart took %v", d)
	}
	if o := <-done; o.err != nil || o.r.Bytes != 20*DefaultSize {
		t.Errorf("server: %d bytes, %v", o.r.Bytes, o.err)
	}
}

func TestSendBursts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr, done := serve(t, ctx, "udp", 12*100)
	// 12 datagrams in bursts of 4 every 20ms: three bursts, the last one
	// starting 40ms after the first.
	sent, err := Send(ctx, addr, Spec{Proto: "udp", Count: 12, Size: 100, Interval: 20 * time.Millisecond, Burst: 4})
	if err != nil {
		t.Fatal(err)
	}
	if sent.Messages != 12 {
		t.Errorf("sent %d datagrams, want 12", sent.Messages)
	}
	if d := sent.End.Sub(sent.Start); d < 40*time.Millisecond || d > 2*time.Second {
		t.Errorf("three bursts 20ms apart took %v, want from 40ms", d)
	}
	if o := <-done; o.err != nil || o.r.Messages != 12 {
		t.Errorf("server: %d datagrams, %v; want 12", o.r.Messages, o.err)
	}
	if _, err := Send(ctx, addr, Spec{Proto: "udp", Burst: -1}); err == nil {
		t.Error("negative burst accepted")
	}
}

func TestUDPServeIdle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr, done := serve(t, ctx, "udp", 0) // no target: ends after 2s idle
	if _, err := Send(ctx, addr, Spec{Proto: "udp", Count: 3, Size: 100}); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil || o.r.Bytes != 300 || o.r.Messages != 3 {
		t.Errorf("server: %d bytes in %d datagrams, %v; want 300 in 3", o.r.Bytes, o.r.Messages, o.err)
	}
}

func TestFlood(t *testing.T) {
	for _, proto := range []string{"tcp", "udp"} {
		t.Run(proto, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			addr, done := serve(t, ctx, proto, 0)
			r, err := Flood(ctx, proto, addr, 64, 100*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			// A floor, not a rate: the machine may be busy with other work.
			if r.Messages < 100 || r.Bytes != int64(r.Messages)*64 {
				t.Errorf("flood sent %d bytes in %d messages", r.Bytes, r.Messages)
			}
			t.Logf("%s flood: %d messages in %v", proto, r.Messages, r.End.Sub(r.Start).Round(time.Millisecond))
			if proto == "udp" {
				cancel() // don't wait for the idle timeout
			}
			o := <-done
			if proto == "tcp" && (o.err != nil || o.r.Bytes != r.Bytes) {
				t.Errorf("server got %d bytes, %v; want %d", o.r.Bytes, o.err, r.Bytes)
			}
			if proto == "udp" && (o.r.Bytes == 0 || o.r.Bytes > r.Bytes) {
				t.Errorf("server got %d of %d bytes", o.r.Bytes, r.Bytes)
			}
		})
	}
}

func TestServeCancel(t *testing.T) {
	for _, proto := range []string{"tcp", "udp"} {
		ctx, cancel := context.WithCancel(context.Background())
		_, done := serve(t, ctx, proto, 0)
		cancel()
		select {
		case o := <-done:
			if !errors.Is(o.err, context.Canceled) {
				t.Errorf("%s: cancelled Serve returned %v", proto, o.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: Serve ignores cancellation", proto)
		}
	}
}

func TestBadSpecs(t *testing.T) {
	ctx := context.Background()
	if _, err := Send(ctx, "127.0.0.1:9", Spec{Proto: "sctp"}); !errors.Is(err, ErrUnknownProtocol) {
		t.Errorf("sctp: %v", err)
	} else if got, want := err.Error(), `unknown protocol "sctp" (want tcp or udp)`; got != want {
		t.Errorf("error %q, want %q", got, want)
	}
	if _, err := Send(ctx, "127.0.0.1:9", Spec{Proto: "udp", Size: MaxDatagram + 1}); err == nil {
		t.Error("oversized datagram accepted")
	}
	if _, err := Serve(ctx, "icmp", "127.0.0.1:0", nil); !errors.Is(err, ErrUnknownProtocol) {
		t.Errorf("icmp: %v", err)
	}
	if _, err := Flood(ctx, "tcp", "127.0.0.1:9", 0, time.Second); err == nil {
		t.Error("zero-size flood accepted")
	}
}

// serveChurn starts ServeChurn on a loopback port and returns its address,
// a function that stops it and its outcome.
func serveChurn(t *testing.T) (string, func() outcome) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	done := make(chan outcome, 1)
	go func() {
		r, err := ServeChurn(ctx, "127.0.0.1:0", func(a net.Addr) { addrc <- a.String() })
		done <- outcome{r, err}
	}()
	select {
	case a := <-addrc:
		return a, func() outcome { cancel(); return <-done }
	case o := <-done:
		cancel()
		t.Fatalf("serve churn: %v", o.err)
	}
	return "", nil
}

func TestChurn(t *testing.T) {
	for _, size := range []int{100, 1} {
		addr, stop := serveChurn(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		sent, err := Churn(ctx, addr, size, 200*time.Millisecond)
		cancel()
		o := stop()
		if err != nil {
			t.Fatal(err)
		}
		if o.err != nil {
			t.Fatalf("server: %v", o.err)
		}
		// A floor, not a rate: the machine may be busy with other work.
		if sent.Connections < 10 || sent.Messages != sent.Connections || sent.Bytes != int64(sent.Connections*size) {
			t.Errorf("%d-byte churn: %d bytes in %d connections (%d messages)", size, sent.Bytes, sent.Connections, sent.Messages)
		}
		// The server closes first, after counting: every connection the
		// client finished is in the server's count, and no other.
		if o.r.Connections != sent.Connections || o.r.Bytes != sent.Bytes {
			t.Errorf("%d-byte churn: server got %d bytes in %d connections, client sent %d in %d", size, o.r.Bytes, o.r.Connections, sent.Bytes, sent.Connections)
		}
		t.Logf("%d-byte churn: %d connections in %v", size, sent.Connections, sent.End.Sub(sent.Start).Round(time.Millisecond))
	}
}

func TestChurnCancel(t *testing.T) {
	addr, stop := serveChurn(t)
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	r, err := Churn(ctx, addr, 100, time.Minute)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled churn returned %v", err)
	}
	if d := time.Since(start); d > 5*time.Second || r.Connections == 0 {
		t.Errorf("cancelled churn: %d connections, ended after %v", r.Connections, d)
	}
}

func TestChurnBadSpecs(t *testing.T) {
	ctx := context.Background()
	if _, err := Churn(ctx, "127.0.0.1:9", 0, time.Second); err == nil {
		t.Error("zero-size churn request accepted")
	}
	if _, err := Churn(ctx, "127.0.0.1:9", 100, 0); err == nil {
		t.Error("churn of no duration accepted")
	}
	// Nobody listens: the first connection fails and says so.
	addr, stop := serveChurn(t)
	stop()
	if _, err := Churn(ctx, addr, 100, time.Second); err == nil || !strings.Contains(err.Error(), "connection 1: ") {
		t.Errorf("churn to a closed port: %v", err)
	}
}
