// SPDX-License-Identifier: Apache-2.0

package availbw

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"
)

// loopServer runs a server on loopback in this namespace until the test
// ends.
func loopServer(t *testing.T, cfg ServerConfig) *Server {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	srv, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		srv.Close()
	})
	return srv
}

// loopSession completes a handshake by hand and returns the control
// connection, ready for stream requests.
func loopSession(t *testing.T, srv *Server) *conn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", srv.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	c := newConn(nc)
	if err := c.write(message{Type: msgHello, Version: ProtocolVersion, Nonce: "00"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.expect(msgChallenge); err != nil {
		t.Fatal(err)
	}
	if err := c.write(message{Type: msgStart, Port: 9}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.expect(msgReady); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestClientRefusesServerWithoutSecret: a client given a secret must not
// probe a server that asks for none (anyone can run one).
func TestClientRefusesServerWithoutSecret(t *testing.T) {
	srv := loopServer(t, ServerConfig{MaxRate: 1e9})
	c, err := Dial(context.Background(), ClientConfig{Server: srv.Addr().String(), Secret: "s3cret"})
	if err == nil {
		c.Close()
		t.Fatal("the client accepted a server without a secret")
	}
	if !strings.Contains(err.Error(), "requires no secret") {
		t.Errorf("error %q does not say the server has no secret", err)
	}
}

// TestServerSaysWhy: a session the server ends because of its limits or
// a bad request ends with an error message saying why, not an EOF.
func TestServerSaysWhy(t *testing.T) {
	srv := loopServer(t, ServerConfig{MaxRate: 1e9, MaxDuration: time.Millisecond})

	// A stream the server will not send, rejected as it is read.
	c := loopSession(t, srv)
	raw, _ := json.Marshal(message{Type: msgStream, Stream: &StreamSpec{ID: 1, Count: MaxStreamPackets + 1, Size: 1200, GapNs: 1000}})
	if _, err := c.w.Write(append(raw, '\n')); err != nil {
		t.Fatal(err)
	}
	if _, err := c.expect(msgSent); err == nil || !strings.Contains(err.Error(), "packets outside") {
		t.Errorf("oversized stream: %v, want the server's reason", err)
	}

	// The session time limit: refused streams, then the end, with why.
	srv = loopServer(t, ServerConfig{MaxRate: 1e9, MaxDuration: time.Millisecond})
	c = loopSession(t, srv)
	for id := uint32(1); ; id++ {
		if err := c.write(message{Type: msgStream, Stream: &StreamSpec{ID: id, Count: 10, Size: 1200, GapNs: 1e6}}); err != nil {
			t.Fatal(err)
		}
		m, err := c.read()
		if err != nil {
			t.Fatalf("after stream %d: %v, want a report or an error message", id, err)
		}
		if m.Type == msgError {
			if !strings.Contains(m.Error, "session time limit") {
				t.Errorf("the server ended the session with %q", m.Error)
			}
			break
		}
		if m.Type != msgSent || !strings.Contains(m.Report.Refused, "session time limit") {
			t.Fatalf("stream %d: %+v", id, m)
		}
		// The server ends the session once past its limit: the next
		// read has its reason, whatever this request.
	}
}

// TestRealTimeFlagged: a result from a server at real-time priority says
// what that does to the path it measured.
func TestRealTimeFlagged(t *testing.T) {
	r := &Result{Estimate: &Estimate{Converged: true, Low: 1e6, High: 2e6, Point: 1.5e6}, KernelTimestamps: true}
	if f := r.flags(); len(f) != 0 {
		t.Fatalf("flags %v, want none", f)
	}
	r.ServerRealTime = true
	if f := r.flags(); len(f) != 1 || f[0] != FlagRealTime {
		t.Errorf("flags %v, want the real-time flag", f)
	}
}

// TestSessionLimitReachesClient: a client whose search the server's time
// limit ends before a fleet was measured gets the limit as the reason, not
// an EOF and not a figure (TestSessionLimitMidSearch has the limit reached
// after some).
func TestSessionLimitReachesClient(t *testing.T) {
	for _, limit := range []time.Duration{time.Millisecond, 30 * time.Millisecond} {
		srv := loopServer(t, ServerConfig{MaxRate: 1e9, MaxDuration: limit})
		c, err := Dial(context.Background(), ClientConfig{Server: srv.Addr().String()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r, err := c.Estimate(ctx)
		cancel()
		c.Close()
		if err == nil {
			t.Logf("limit %v: %d fleets, stopped %q", limit, len(r.Fleets), r.Stopped)
		} else {
			t.Logf("limit %v: %v", limit, err)
		}
		switch {
		case err != nil && strings.Contains(err.Error(), "session time limit"):
			// Ended before anything was measured: the reason is the error.
		case err != nil:
			t.Errorf("limit %v: %v, want the server's session time limit", limit, err)
		case !strings.Contains(r.Estimate.Stopped, "session time limit"):
			t.Errorf("limit %v: result stopped %q, want the server's session time limit", limit, r.Estimate.Stopped)
		case len(r.Fleets) == 0:
			t.Errorf("limit %v: a result with no fleet measured: %+v", limit, r.Estimate)
		}
	}
}
