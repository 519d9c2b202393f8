// SPDX-License-Identifier: Apache-2.0

package availbw

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"golang.org/x/sys/unix"
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

// estimateIn runs one estimate from a client dialled from h's namespace,
// bounded at 30 s, far beyond what a probe of these paths takes.
func estimateIn(t *testing.T, h netlab.Host, cfg ClientConfig) *Result {
	t.Helper()
	c, err := dialIn(t, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.Estimate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return r
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
	if m, err := c.read(); err != nil || m.Type != msgError || !strings.Contains(m.Error, "session time limit") {
		t.Errorf("after the time limit: %+v, %v; want the server to end the session saying why", m, err)
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
	r := estimateIn(t, p.Receiver, ClientConfig{Server: srv.Addr().String()})
	want := p.BottleneckBits(r.Params.PacketSize)
	t.Logf("estimate %s [%s, %s], capacity %s, want %s; %d streams, %d bytes, %v, flags %v",
		FormatRate(r.Point), FormatRate(r.Low), FormatRate(float64(r.High)), FormatRate(r.Capacity), FormatRate(want),
		r.Streams, r.Bytes, time.Duration(r.TookNs), r.Flags)
	if starved(r) {
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

// TestSessionLimitMidSearch: a server whose session time limit ends the
// search after some fleets: the client returns what it measured, saying
// that the limit stopped it, rather than fail with an EOF from the
// goodbye the server no longer answers.
func TestSessionLimitMidSearch(t *testing.T) {
	if testing.Short() {
		t.Skip("probes a namespace path")
	}
	// 20 Mbit/s: far below what even a briefly starved sender paces, so
	// the search never ends host-limited before the limit cuts it.
	p := netlab.PathForTest(t, netlab.PathOptions{Name: "bwprobelim", BottleneckMbit: 20})
	// The capacity trains take some 60 ms of this path; a resolution
	// finer than the path's own variation keeps the search going until
	// its fleets or bytes run out, far past the limit.
	srv := startServer(t, p.Sender, ServerConfig{MaxRate: 100e9, MaxDuration: 800 * time.Millisecond})
	r := estimateIn(t, p.Receiver, ClientConfig{Server: srv.Addr().String(), Params: Params{Resolution: 1e-4, MaxFleets: 1000, MaxBytes: 1e9, MaxDuration: time.Minute}})
	t.Logf("estimate %s [%s, %s], %d fleets, stopped %q, flags %v", FormatRate(r.Point), FormatRate(r.Low), FormatRate(float64(r.High)), len(r.Fleets), r.Stopped, r.Flags)
	if !strings.Contains(r.Stopped, "session time limit (800ms) reached") || len(r.Fleets) == 0 || r.ServerCPUSeconds != nil {
		t.Errorf("stopped %q after %d fleets, server CPU %v: want the limit, some fleets, no CPU figure", r.Stopped, len(r.Fleets), r.ServerCPUSeconds)
	}
	if r.Converged || len(r.Flags) == 0 {
		t.Errorf("a search the server cut short: converged %v, flags %v", r.Converged, r.Flags)
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

// TestPacketRateBottleneckIsHostLimited makes the path's narrow point
// count packets instead of bytes, as a host's per-packet cost does: a
// tbf at 100 Mbit/s whose minimum packet unit is a full frame, so that
// half-size packets pass at the packet rate of full-size ones. The
// trains find a narrow point ten times below what the sender reaches,
// which the send-rate rule does not flag; the half-size trains must.
func TestPacketRateBottleneckIsHostLimited(t *testing.T) {
	if testing.Short() {
		t.Skip("probes a namespace path")
	}
	p := netlab.PathForTest(t, netlab.PathOptions{Name: "bwprobetest"})
	frame := strconv.Itoa(DefaultParams.PacketSize + 14)
	if out, err := p.Command(p.Router, "tc", "qdisc", "replace", "dev", p.Router.Iface, "root", "tbf", "rate", "100mbit",
		"burst", strconv.Itoa(netlab.BurstFor(100)), "limit", strconv.Itoa(256<<10), "mpu", frame).CombinedOutput(); err != nil {
		t.Fatalf("tc: %v: %s", err, out)
	}
	srv := startServer(t, p.Sender, ServerConfig{MaxRate: 100e9})
	r := estimateIn(t, p.Receiver, ClientConfig{Server: srv.Addr().String()})
	t.Logf("estimate %s, capacity %s, half-size %s, trains sent at %s, limits %v, flags %v", FormatRate(r.Point),
		FormatRate(r.Capacity), FormatRate(r.HalfCapacity), FormatRate(r.TrainSendRate), r.HostLimits, r.Flags)
	if r.CapacityAtLeast {
		// A sender starved below 100 Mbit/s cannot tell; it must then
		// be host-limited for its own pace.
		if !r.HostLimited {
			t.Fatalf("trains did not queue and not host-limited: flags %v", r.Flags)
		}
		t.Skipf("the sender did not outrun a 100 Mbit/s link (trains at %s): nothing to tell", FormatRate(r.TrainSendRate))
	}
	if !r.PacketRateBound || !r.HostLimited || !slices.Contains(r.HostLimits, HostLimitPacketRate) {
		t.Fatalf("packet-rate bound %v, host-limited %v (%v), flags %v: want host-limited by the packet rate",
			r.PacketRateBound, r.HostLimited, r.HostLimits, r.Flags)
	}
	if ratio := r.HalfCapacity / r.Capacity; ratio < 0.4 || ratio > 0.65 {
		t.Errorf("half-size packets passed at %.2f of the full-size rate, want about 0.5", ratio)
	}
	if !slices.ContainsFunc(r.Flags, func(f string) bool { return strings.Contains(f, "packets per second") }) {
		t.Errorf("flags %v do not say the narrow point is limited in packets per second", r.Flags)
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

// TestEstimateOverIPv6 runs a whole session over IPv6 (unique local
// addresses in the lab's namespaces): the control channel and its
// shared secret, probe packets sent to the control peer's IPv6 address,
// and an estimate of a 100 Mbit/s bottleneck. The probe's packet size is
// the IP size on the wire whatever the family: the bottleneck's own byte
// counter must agree with the bytes the client says it probed.
func TestEstimateOverIPv6(t *testing.T) {
	if testing.Short() {
		t.Skip("probes a namespace path")
	}
	p := netlab.PathForTest(t, netlab.PathOptions{Name: "bwprobetest", BottleneckMbit: 100, IPv6: true})
	srv := startServer(t, p.Sender, ServerConfig{Listen: netip.AddrPortFrom(p.Sender.Addr6, 0).String(),
		Secret: "s3cret", MaxRate: 100e9})
	addr := srv.Addr().String()
	if !srv.Addr().(*net.TCPAddr).AddrPort().Addr().Is6() {
		t.Fatalf("server listens on %v, want its IPv6 address", srv.Addr())
	}
	if _, err := dialIn(t, p.Receiver, ClientConfig{Server: addr, Secret: "guess"}); err == nil || !strings.Contains(err.Error(), "does not know the secret") {
		t.Errorf("wrong secret over IPv6: %v, want the server's proof rejected", err)
	}
	waitIdle(t, srv)
	raw, _ := rawSession(t, p.Receiver, srv, "guess", 9)
	if _, err := raw.expect(msgReady); err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Errorf("wrong proof over IPv6: %v, want authentication failed", err)
	}
	waitIdle(t, srv)

	before := qdiscSent(t, p)
	c, err := dialIn(t, p.Receiver, ClientConfig{Server: addr, Secret: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	if !c.server.Is6() || !c.udp.LocalAddr().(*net.UDPAddr).IP.Equal(p.Receiver.Addr6.AsSlice()) {
		t.Fatalf("session from %v to %v, want %v to %v", c.server, c.udp.LocalAddr(), p.Sender.Addr6, p.Receiver.Addr6)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.Estimate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	after := qdiscSent(t, p)
	want := p.BottleneckBits(r.Params.PacketSize)
	t.Logf("estimate %s [%s, %s], capacity %s, want %s; %d streams, %d bytes, %v, flags %v",
		FormatRate(r.Point), FormatRate(r.Low), FormatRate(float64(r.High)), FormatRate(r.Capacity), FormatRate(want),
		r.Streams, r.Bytes, time.Duration(r.TookNs), r.Flags)
	// What crossed the bottleneck, less the 14-byte header tc counts per
	// packet, is the IP bytes probed plus the server's control messages
	// (about 0.3 %) and a little neighbour discovery, less any packet lost
	// on the way to the tbf (0.16 % each); IPv4 header sizes on IPv6
	// packets would add 20 bytes to each, 1.7 % at least.
	if dropped := after.dropped - before.dropped; dropped == 0 {
		ip := int64(after.bytes-before.bytes) - 14*int64(after.packets-before.packets)
		if d := float64(ip-r.Bytes) / float64(r.Bytes); d < -0.01 || d > 0.01 {
			t.Errorf("the bottleneck carried %d IP bytes, the client probed %d (%+.2f %%): IPv6 packets not of the size asked for", ip, r.Bytes, d*100)
		}
	}
	if starved(r) {
		// As in TestEstimateOnPath: a starved machine must say so, and
		// its lower bound must hold.
		if r.Low > 1.05*want {
			t.Errorf("host-limited with a lower bound %s above the true %s", FormatRate(r.Low), FormatRate(want))
		}
		return
	}
	if e := (r.Point - want) / want; e < -0.15 || e > 0.15 {
		t.Errorf("estimate %s, want %s within 15 %%", FormatRate(r.Point), FormatRate(want))
	}
	if !r.KernelTimestamps || r.ReceiverDrops != 0 {
		t.Errorf("kernel timestamps %v, receiver drops %d", r.KernelTimestamps, r.ReceiverDrops)
	}
}

// qdiscCounters are a qdisc's "Sent" counters.
type qdiscCounters struct{ bytes, packets, dropped uint64 }

// qdiscSent reads the counters of the tbf on p's bottleneck.
func qdiscSent(t *testing.T, p *netlab.Path) qdiscCounters {
	t.Helper()
	out, err := p.Command(p.Router, "tc", "-s", "qdisc", "show", "dev", p.Router.Iface).CombinedOutput()
	if err != nil {
		t.Fatalf("tc: %v: %s", err, out)
	}
	var c qdiscCounters
	i := strings.Index(string(out), "Sent ")
	if i < 0 {
		t.Fatalf("no counters in %q", out)
	}
	if _, err := fmt.Sscanf(string(out[i:]), "Sent %d bytes %d pkt (dropped %d", &c.bytes, &c.packets, &c.dropped); err != nil {
		t.Fatalf("tc counters %q: %v", out[i:], err)
	}
	return c
}

// TestReceiverDropsCounted overflows a socket and checks that
// socketDrops accounts for every datagram that was not queued.
func TestReceiverDropsCounted(t *testing.T) {
	rcv, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Skipf("no loopback UDP: %v", err)
	}
	defer rcv.Close()
	if d, err := socketDrops(rcv); err != nil || d != 0 {
		t.Fatalf("new socket: %d drops, %v", d, err)
	}
	rawConn, err := rcv.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rawConn.Control(func(fd uintptr) {
		// The kernel rounds this up to its minimum, a few kilobytes.
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 1)
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	snd, err := net.DialUDP("udp4", nil, rcv.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	const sent = 200
	payload := make([]byte, 1000)
	for range sent {
		// Loopback delivers within the send: each datagram is queued or
		// dropped by the time the call returns.
		if _, err := snd.Write(payload); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 2048)
	var got int
	for {
		_ = rcv.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := rcv.Read(buf); err != nil {
			break
		}
		got++
	}
	drops, err := socketDrops(rcv)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d queued, %d dropped of %d", got, drops, sent)
	if got == 0 || drops == 0 || got+int(drops) != sent {
		t.Fatalf("%d read and %d dropped, want a full buffer and %d in all", got, drops, sent)
	}
}

// starved says the result admits the sender could not pace: host-limited,
// or most streams rejected for their send rate. The sender runs at normal
// priority, and on a loaded test machine other work preempts it.
func starved(r *Result) bool {
	return r.HostLimited || slices.ContainsFunc(r.Flags, func(f string) bool { return strings.HasPrefix(f, FlagRejected) })
}
