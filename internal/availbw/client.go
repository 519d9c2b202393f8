// SPDX-License-Identifier: Apache-2.0

package availbw

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ClientConfig configures a Client.
type ClientConfig struct {
	// Server is the server's control address, host:port.
	Server string
	// Secret is the server's shared secret, if it requires one.
	Secret string
	// MaxRate bounds the probing rate (IP bit/s); 0 leaves it to the
	// server's limit and this host's pacing.
	MaxRate float64
	// Params shape the search; zero fields take DefaultParams.
	Params Params
	// Log, if set, receives a line per fleet.
	Log func(format string, args ...any)
}

// Client measures the available bandwidth from a server to this host.
type Client struct {
	cfg     ClientConfig
	tcp     net.Conn
	ctl     *conn
	udp     *net.UDPConn
	server  netip.Addr
	session uint64
	chal    message
	rtt     time.Duration

	samples  chan taggedSample
	ctrl     chan ctrlResult
	userTime atomic.Bool // a packet came without a kernel timestamp
	done     chan struct{}
	// kernelStamps: the kernel timestamps packets on arrival (see
	// waitForStamps); else the times are those of the reads.
	kernelStamps bool
	// drops0 is the UDP socket's drop count once it was ready.
	drops0 uint32
}

type taggedSample struct {
	stream uint32
	Sample
}

type ctrlResult struct {
	m   message
	err error
}

// rcvBufBytes is the receive buffer asked for: several streams' worth, so
// that a reader held up by the scheduler loses nothing (the kernel has
// already timestamped what waits in the buffer).
const rcvBufBytes = 8 << 20

// Dial connects to the server, authenticates and opens the UDP socket the
// probe packets will arrive on, all in the calling thread's network
// namespace. The caller must Close the Client.
func Dial(ctx context.Context, cfg ClientConfig) (*Client, error) {
	if cfg.MaxRate < 0 {
		return nil, errors.New("negative maximum rate")
	}
	cfg.Params = cfg.Params.withDefaults()
	if err := cfg.Params.check(); err != nil {
		return nil, err
	}
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	tcp, err := d.DialContext(dctx, "tcp", cfg.Server)
	if err != nil {
		return nil, fmt.Errorf("connect to probe server: %w", err)
	}
	c := &Client{cfg: cfg, tcp: tcp, ctl: newConn(tcp), done: make(chan struct{})}
	if err := c.open(); err != nil {
		tcp.Close()
		return nil, err
	}
	if err := c.handshake(dctx); err != nil {
		c.udp.Close()
		tcp.Close()
		return nil, err
	}
	c.samples = make(chan taggedSample, 4096)
	c.ctrl = make(chan ctrlResult, 4)
	go c.readUDP()
	go c.readControl()
	return c, nil
}

// open makes the UDP socket, on the address the control connection
// leaves from, with kernel receive timestamps.
func (c *Client) open() error {
	local := c.tcp.LocalAddr().(*net.TCPAddr).AddrPort()
	c.server = c.tcp.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(local.Addr(), 0)))
	if err != nil {
		return fmt.Errorf("open udp socket: %w", err)
	}
	raw, err := udp.SyscallConn()
	if err != nil {
		udp.Close()
		return fmt.Errorf("udp socket: %w", err)
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
		// Beyond net.core.rmem_max only with CAP_NET_ADMIN; the plain
		// option gets what the limit allows.
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBufBytes) != nil {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBufBytes)
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		udp.Close()
		return fmt.Errorf("ask for kernel receive timestamps: %w", err)
	}
	c.udp = udp
	c.kernelStamps = waitForStamps(udp)
	c.drops0, _ = socketDrops(udp)
	return nil
}

// socketDrops returns how many packets the kernel has dropped at the
// socket since it was made, for want of receive buffer space (or of
// memory): the SK_MEMINFO_DROPS figure of SO_MEMINFO.
func socketDrops(udp *net.UDPConn) (uint32, error) {
	raw, err := udp.SyscallConn()
	if err != nil {
		return 0, err
	}
	var info [unix.SK_MEMINFO_VARS]uint32
	var serr error
	err = raw.Control(func(fd uintptr) {
		n := uint32(unsafe.Sizeof(info))
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_MEMINFO,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0)
		if errno != 0 {
			serr = errno
		} else if n <= unix.SK_MEMINFO_DROPS*4 {
			serr = fmt.Errorf("SO_MEMINFO gave %d bytes", n)
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return 0, fmt.Errorf("socket drop count: %w", err)
	}
	return info[unix.SK_MEMINFO_DROPS], nil
}

// waitForStamps waits until the kernel timestamps packets as they arrive,
// and reports whether it does. The first socket to ask for timestamps
// switches them on for the whole kernel through a work queue, which a
// busy host may run late; until then a packet gets its timestamp only
// when it is read, which makes a train look as if it arrived all at once.
// So the client sends itself a datagram, reads it a little later, and
// checks that its timestamp is from when it arrived, not from the read.
func waitForStamps(udp *net.UDPConn) bool {
	self := udp.LocalAddr().(*net.UDPAddr)
	buf := make([]byte, 64)
	oob := make([]byte, unix.CmsgSpace(int(unsafe.Sizeof(unix.Timespec{})))*2)
	const settle = 2 * time.Millisecond
	deadline := time.Now().Add(stampWait)
	defer udp.SetReadDeadline(time.Time{})
	for time.Now().Before(deadline) {
		if _, err := udp.WriteToUDP([]byte("magnet-probe timestamp check"), self); err != nil {
			return false
		}
		time.Sleep(settle)
		_ = udp.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, oobn, _, _, err := udp.ReadMsgUDP(buf, oob)
		read := time.Now().UnixNano()
		if err != nil {
			continue
		}
		if ts, ok := kernelTime(oob[:oobn]); ok && read-ts >= int64(settle)/2 {
			return true
		}
	}
	return false
}

// stampWait bounds how long Dial waits for kernel timestamps.
const stampWait = 3 * time.Second

// handshake exchanges hello, challenge, start and ready.
func (c *Client) handshake(ctx context.Context) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.tcp.SetDeadline(dl)
	}
	defer c.tcp.SetDeadline(time.Time{})
	nonce, err := newNonce()
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := c.ctl.write(message{Type: msgHello, Version: ProtocolVersion, Nonce: nonce}); err != nil {
		return fmt.Errorf("probe server: %w", err)
	}
	ch, err := c.ctl.expect(msgChallenge)
	if err != nil {
		return fmt.Errorf("probe server handshake: %w", err)
	}
	c.rtt = time.Since(t0)
	if ch.Version != ProtocolVersion {
		return fmt.Errorf("probe server speaks protocol %d, this client %d", ch.Version, ProtocolVersion)
	}
	start := message{Type: msgStart, Port: c.udp.LocalAddr().(*net.UDPAddr).Port}
	if !ch.Auth && c.cfg.Secret != "" {
		// Anyone can run a server without a secret: one that asks for none
		// is not the server the secret was meant for.
		return errors.New("probe server requires no secret: it cannot prove it is the server you meant (drop --secret to probe it anyway)")
	}
	if ch.Auth {
		if c.cfg.Secret == "" {
			return errors.New("probe server requires a secret (--secret)")
		}
		if !validProof(ch.MAC, c.cfg.Secret, "server", nonce, ch.Nonce) {
			return errors.New("probe server does not know the secret: wrong secret, or not the server you meant")
		}
		start.MAC = proof(c.cfg.Secret, "client", nonce, ch.Nonce)
	}
	if err := c.ctl.write(start); err != nil {
		return fmt.Errorf("probe server: %w", err)
	}
	ready, err := c.ctl.expect(msgReady)
	if err != nil {
		return fmt.Errorf("probe server: %w", err)
	}
	c.chal, c.session = ch, ready.Session
	return nil
}

// readUDP hands every probe packet of this session from the server to
// the estimator, with the kernel's receive time.
func (c *Client) readUDP() {
	defer close(c.samples)
	buf := make([]byte, 2048)
	oob := make([]byte, unix.CmsgSpace(int(unsafe.Sizeof(unix.Timespec{})))*2)
	for {
		n, oobn, _, from, err := c.udp.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			return
		}
		if from.Addr().Unmap() != c.server {
			continue
		}
		h, err := parseProbe(buf[:n])
		if err != nil || h.Session != c.session {
			continue
		}
		rx, ok := kernelTime(oob[:oobn])
		if !ok {
			rx = time.Now().UnixNano()
			c.userTime.Store(true)
		}
		select {
		case c.samples <- taggedSample{h.Stream, Sample{Seq: h.Seq, Sent: h.SentNs, Recv: rx}}:
		case <-c.done:
			return
		}
	}
}

// kernelTime returns the SCM_TIMESTAMPNS receive time in oob.
func kernelTime(oob []byte) (int64, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= 16 {
			sec := int64(binary.NativeEndian.Uint64(m.Data[0:]))
			nsec := int64(binary.NativeEndian.Uint64(m.Data[8:]))
			return sec*1e9 + nsec, true
		}
	}
	return 0, false
}

// readControl hands the server's messages to the estimator.
func (c *Client) readControl() {
	for {
		m, err := c.ctl.read()
		select {
		case c.ctrl <- ctrlResult{m, err}:
		case <-c.done:
			return
		}
		if err != nil {
			return
		}
	}
}

// Close ends the session and releases the sockets.
func (c *Client) Close() error {
	select {
	case <-c.done:
		return nil
	default:
	}
	close(c.done)
	err := c.tcp.Close()
	if uerr := c.udp.Close(); err == nil {
		err = uerr
	}
	return err
}

// errSessionLimit is returned when the server's time limit ends the
// session.
var errSessionLimit = errors.New("the server's session time limit was reached")

// Stream timing on the client.
const (
	// straggleWait is how long after the server's report the client
	// still waits for missing packets, beyond a quarter of the stream.
	straggleWait = 20 * time.Millisecond
	// minIdle and idleShare space streams: after each, the client waits
	// this long, at least, and this share of the stream's duration, so
	// that the queue a stream built has drained before the next.
	minIdle   = 2 * time.Millisecond
	idleShare = 0.5
)

// probe asks the server for one stream and collects what arrives.
func (c *Client) probe(ctx context.Context, spec StreamSpec) (SendReport, []Sample, error) {
	if err := c.ctl.write(message{Type: msgStream, Stream: &spec}); err != nil {
		return SendReport{}, nil, fmt.Errorf("probe server: %w", err)
	}
	dur := time.Duration(spec.GapNs * int64(spec.Count))
	timeout := time.NewTimer(dur + 2*c.rtt + 5*time.Second)
	defer timeout.Stop()
	var (
		got      []Sample
		rep      *SendReport
		straggle <-chan time.Time
	)
	for rep == nil || (len(got) < rep.Sent && straggle != nil) {
		select {
		case s, ok := <-c.samples:
			if !ok {
				return SendReport{}, nil, errors.New("probe udp socket closed")
			}
			if s.stream == spec.ID {
				got = append(got, s.Sample)
			}
		case r := <-c.ctrl:
			if r.err != nil {
				return SendReport{}, nil, fmt.Errorf("probe server: %w", r.err)
			}
			switch r.m.Type {
			case msgSent:
				if r.m.Report.ID != spec.ID {
					return SendReport{}, nil, fmt.Errorf("probe server reported stream %d, want %d", r.m.Report.ID, spec.ID)
				}
				rep = r.m.Report
				t := time.NewTimer(straggleWait + dur/4)
				defer t.Stop()
				straggle = t.C
			case msgError:
				return SendReport{}, nil, fmt.Errorf("probe server: %s", r.m.Error)
			default:
				return SendReport{}, nil, fmt.Errorf("probe server: unexpected %q message", r.m.Type)
			}
		case <-straggle:
			straggle = nil
		case <-timeout.C:
			return SendReport{}, nil, fmt.Errorf("probe server did not report stream %d within %v", spec.ID, dur+5*time.Second)
		case <-ctx.Done():
			return SendReport{}, nil, ctx.Err()
		}
		if rep != nil && rep.Refused != "" {
			break
		}
	}
	if rep.Refused != "" && strings.Contains(rep.Refused, "session time limit") {
		return SendReport{}, nil, fmt.Errorf("%w (%s)", errSessionLimit, rep.Refused)
	}
	idle := max(minIdle, time.Duration(float64(dur)*idleShare))
	select {
	case <-time.After(idle):
	case <-ctx.Done():
		return *rep, got, ctx.Err()
	}
	return *rep, got, nil
}
