// SPDX-License-Identifier: Apache-2.0

package bwprobe

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// startServer runs a probe server in h's namespace until the test ends.
func startServer(t *testing.T, h netlab.Host, cfg ServerConfig) *Server {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = netip.AddrPortFrom(h.Addr, 0).String()
	}
	var srv *Server
	if err := h.Do(func() error {
		var err error
		srv, err = Listen(cfg)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
	})
	return srv
}

// dialIn connects a client from h's namespace.
func dialIn(t *testing.T, h netlab.Host, cfg ClientConfig) (*Client, error) {
	t.Helper()
	var c *Client
	err := h.Do(func() error {
		var err error
		c, err = Dial(context.Background(), cfg)
		return err
	})
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// rawSession opens a control connection from h and completes the
// handshake by hand, proving secret (if any), with probe packets going to
// port. It returns the connection, ready for stream requests.
func rawSession(t *testing.T, h netlab.Host, srv *Server, secret string, port int) (*conn, net.Conn) {
	t.Helper()
	var nc net.Conn
	if err := h.Do(func() error {
		var err error
		nc, err = net.DialTimeout("tcp", srv.Addr().String(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	c := newConn(nc)
	if err := c.write(message{Type: msgHello, Version: ProtocolVersion, Nonce: "00"}); err != nil {
		t.Fatal(err)
	}
	ch, err := c.expect(msgChallenge)
	if err != nil {
		t.Fatal(err)
	}
	start := message{Type: msgStart, Port: port}
	if secret != "" {
		start.MAC = proof(secret, "client", "00", ch.Nonce)
	}
	if err := c.write(start); err != nil {
		t.Fatal(err)
	}
	return c, nc
}

// listenUDPIn opens a UDP socket on h's address.
func listenUDPIn(t *testing.T, h netlab.Host) *net.UDPConn {
	t.Helper()
	var u *net.UDPConn
	if err := h.Do(func() error {
		var err error
		u, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(h.Addr, 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	return u
}

// waitIdle waits until srv serves no session: one whose client has just
// gone ends only once the server has seen its connection close.
func waitIdle(t *testing.T, srv *Server) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !srv.busy.TryLock(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("server still busy after 5s")
		}
	}
	srv.busy.Unlock()
}

func TestServerSecret(t *testing.T) {
	lab := netlab.ForTest(t, netlab.Options{Name: "bwprobetest"})
	srv := startServer(t, lab.Server, ServerConfig{Secret: "s3cret", MaxRate: 1e9})
	addr := srv.Addr().String()

	if _, err := dialIn(t, lab.Client, ClientConfig{Server: addr}); err == nil || !strings.Contains(err.Error(), "requires a secret") {
		t.Errorf("no secret: %v, want the server to require one", err)
	}
	waitIdle(t, srv)
	if _, err := dialIn(t, lab.Client, ClientConfig{Server: addr, Secret: "guess"}); err == nil || !strings.Contains(err.Error(), "does not know the secret") {
		t.Errorf("wrong secret: %v, want the server's proof rejected", err)
	}
	// A client that ignores the server's proof and sends a wrong one of
	// its own is turned away by the server.
	waitIdle(t, srv)
	c, _ := rawSession(t, lab.Client, srv, "guess", 9)
	if _, err := c.expect(msgReady); err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Errorf("wrong proof: %v, want authentication failed", err)
	}
	waitIdle(t, srv)
	cl, err := dialIn(t, lab.Client, ClientConfig{Server: addr, Secret: "s3cret"})
	if err != nil {
		t.Fatalf("right secret: %v", err)
	}
	cl.Close()
}

func TestServerGuards(t *testing.T) {
	lab := netlab.ForTest(t, netlab.Options{Name: "bwprobetest"})
	srv := startServer(t, lab.Server, ServerConfig{MaxRate: 20e6, MaxDuration: 400 * time.Millisecond})
	rcv := listenUDPIn(t, lab.Client)
	port := rcv.LocalAddr().(*net.UDPAddr).Port
	c, nc := rawSession(t, lab.Client, srv, "", port)
	if _, err := c.expect(msgReady); err != nil {
		t.Fatal(err)
	}

	// A second client while the first is served is told the server is busy.
	if _, err := dialIn(t, lab.Client, ClientConfig{Server: srv.Addr().String()}); err == nil || !strings.Contains(err.Error(), "busy") {
		t.Errorf("second client: %v, want busy", err)
	}

	// Above the server's maximum rate: refused, nothing sent.
	fast := StreamSpec{ID: 1, Count: 20, Size: 1000, GapNs: gapFor(1000, 100e6)}
	if err := c.write(message{Type: msgStream, Stream: &fast}); err != nil {
		t.Fatal(err)
	}
	m, err := c.expect(msgSent)
	if err != nil {
		t.Fatal(err)
	}
	if m.Report.Sent != 0 || !strings.Contains(m.Report.Refused, "above the server's limit") {
		t.Errorf("stream at 100 Mb/s with a 20 Mb/s limit: %+v", *m.Report)
	}

	// Within the limit: the stream goes to the control peer's address,
	// the port it named, and comes from the server.
	ok := StreamSpec{ID: 2, Count: 20, Size: 1000, GapNs: gapFor(1000, 10e6)}
	if err := c.write(message{Type: msgStream, Stream: &ok}); err != nil {
		t.Fatal(err)
	}
	if m, err = c.expect(msgSent); err != nil || m.Report.Sent != 20 || m.Report.Refused != "" {
		t.Fatalf("stream at 10 Mb/s: %+v, %v", m.Report, err)
	}
	buf := make([]byte, 2000)
	_ = rcv.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := range 20 {
		n, from, err := rcv.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("packet %d: %v", i, err)
		}
		h, err := parseProbe(buf[:n])
		if err != nil || h.Stream != 2 || n != 1000-ipUDPHeaders || from.Addr() != lab.Server.Addr {
			t.Fatalf("packet %d: %d bytes from %v, header %+v, %v", i, n, from, h, err)
		}
	}

	// Past the session's time limit streams are refused and the server
	// hangs up.
	time.Sleep(500 * time.Millisecond)
	if err := c.write(message{Type: msgStream, Stream: &ok}); err != nil {
		t.Fatal(err)
	}
	if m, err = c.expect(msgSent); err != nil || !strings.Contains(m.Report.Refused, "session time limit") {
		t.Fatalf("after the time limit: %+v, %v", m.Report, err)
	}
	if _, err := c.read(); err == nil {
		t.Error("server kept the session open after its time limit")
	}
	nc.Close()

	// Bad input ends the session with an error, not a crash.
	c2, _ := rawSession(t, lab.Client, srv, "", port)
	if _, err := c2.expect(msgReady); err != nil {
		t.Fatal(err)
	}
	if err := c2.write(message{Type: msgHello}); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.expect(msgSent); err == nil || !strings.Contains(err.Error(), "unexpected") {
		t.Errorf("hello mid-session: %v, want the server to refuse it", err)
	}
}

// TestEstimateOnPath measures a 50 Mbit/s path without cross traffic,
// where the available bandwidth is the capacity.
func TestEstimateOnPath(t *testing.T) {
	if testing.Short() {
		t.Skip("probes a namespace path")
	}
	p := netlab.PathForTest(t, netlab.PathOptions{Name: "bwprobetest", BottleneckMbit: 50})
	srv := startServer(t, p.Sender, ServerConfig{MaxRate: 100e9})
	c, err := dialIn(t, p.Receiver, ClientConfig{Server: srv.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.Estimate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := p.BottleneckBits(r.Params.PacketSize)
	t.Logf("estimate %s [%s, %s], capacity %s, want %s; %d streams, %d bytes, %v, flags %v",
		FormatRate(r.Point), FormatRate(r.Low), FormatRate(r.High), FormatRate(r.Capacity), FormatRate(want),
		r.Streams, r.Bytes, time.Duration(r.TookNs), r.Flags)
	if r.HostLimited {
		// A machine starved for a moment may not pace even 50 Mbit/s;
		// then the probe must say so and its lower bound must hold.
		if r.Low > 1.05*want {
			t.Errorf("host-limited with a lower bound %s above the true %s", FormatRate(r.Low), FormatRate(want))
		}
		return
	}
	if e := (r.Point - want) / want; e < -0.15 || e > 0.15 {
		t.Errorf("estimate %s, want %s within 15 %%", FormatRate(r.Point), FormatRate(want))
	}
	if e := (r.Capacity - want) / want; e < -0.15 || e > 0.15 {
		t.Errorf("capacity %s, want %s within 15 %%", FormatRate(r.Capacity), FormatRate(want))
	}
	if r.RateLimited || !r.KernelTimestamps || r.Bytes <= 0 || r.TookNs <= 0 {
		t.Errorf("flags %v, kernel timestamps %v, bytes %d, took %d", r.Flags, r.KernelTimestamps, r.Bytes, r.TookNs)
	}
}

// TestUnlimitedIsHostLimited probes a path with no bottleneck: the host
// cannot pace fast enough to find one, and must say so.
func TestUnlimitedIsHostLimited(t *testing.T) {
	if testing.Short() {
		t.Skip("probes a namespace path")
	}
	p := netlab.PathForTest(t, netlab.PathOptions{Name: "bwprobetest"})
	srv := startServer(t, p.Sender, ServerConfig{MaxRate: 100e9})
	c, err := dialIn(t, p.Receiver, ClientConfig{Server: srv.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Estimate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("estimate %s, limit %s, trains sent at %s, flags %v", FormatRate(r.Point), FormatRate(r.ProbeLimit),
		FormatRate(r.TrainSendRate), r.Flags)
	if !r.HostLimited || r.High != 0 || len(r.Flags) == 0 || !strings.HasPrefix(r.Flags[0], FlagHostLimited) {
		t.Fatalf("host-limited %v, high %v, flags %v: want host-limited", r.HostLimited, r.High, r.Flags)
	}
}

func TestDialErrors(t *testing.T) {
	ctx := context.Background()
	if _, err := Dial(ctx, ClientConfig{Server: "127.0.0.1:1"}); err == nil || !strings.Contains(err.Error(), "connect to probe server") {
		t.Errorf("closed port: %v", err)
	}
	if _, err := Dial(ctx, ClientConfig{Server: "127.0.0.1:1", MaxRate: -1}); err == nil {
		t.Error("negative rate accepted")
	}
	if _, err := Dial(ctx, ClientConfig{Server: "127.0.0.1:1", Params: Params{StreamPackets: 5}}); err == nil {
		t.Error("5-packet streams accepted")
	}
	if _, err := Listen(ServerConfig{Listen: "127.0.0.1:0", MaxRate: -1}); err == nil {
		t.Error("negative server rate accepted")
	}
}
