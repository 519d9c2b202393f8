// SPDX-License-Identifier: Apache-2.0

package availbw

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/hostcheck"
)

// Server defaults.
const (
	DefaultPort        = 7207
	DefaultMaxRate     = 1e9 // bit/s
	DefaultMaxDuration = 20 * time.Second
)

// Timeouts of the server's control channel.
const (
	handshakeTimeout = 5 * time.Second
	idleTimeout      = 10 * time.Second
)

// ServerConfig configures a Server.
type ServerConfig struct {
	// Listen is the TCP address of the control channel; the probe packets
	// leave from the same IP address. ":7207" if empty.
	Listen string
	// Secret, when set, is required of every client (an HMAC challenge on
	// the control channel; the secret itself never crosses the network).
	Secret string
	// MaxRate bounds the rate of every stream (IP bit/s);
	// DefaultMaxRate if 0.
	MaxRate float64
	// MaxDuration bounds each client's session; DefaultMaxDuration if 0.
	MaxDuration time.Duration
	// RealTime sends streams at real-time priority (SCHED_FIFO) when the
	// process may. Off by default: a real-time thread spinning through a
	// stream's gaps takes its CPU from every ordinary task, the cross
	// traffic of this host included, so the path it measures is emptier
	// than the path it was asked about. Only for a sender that runs
	// nothing else.
	RealTime bool
	// Log receives one line per session; nil discards them.
	Log func(format string, args ...any)
}

// Server answers probe clients, one at a time. It sends probe packets only
// to the address of the client whose control connection it is serving, at
// no more than MaxRate and for no longer than MaxDuration per session.
type Server struct {
	cfg      ServerConfig
	ln       net.Listener
	udp      *net.UDPConn
	pace     float64
	paceErr  string
	realtime bool
	busy     sync.Mutex // held by the session in progress
	wg       sync.WaitGroup
}

// Listen opens the server's TCP listener and its UDP socket in the
// calling thread's network namespace and measures how fast this host can
// pace packets. Serve must follow, and Close must end it.
func Listen(cfg ServerConfig) (*Server, error) {
	if cfg.Listen == "" {
		cfg.Listen = fmt.Sprintf(":%d", DefaultPort)
	}
	if cfg.MaxRate == 0 {
		cfg.MaxRate = DefaultMaxRate
	}
	if cfg.MaxDuration == 0 {
		cfg.MaxDuration = DefaultMaxDuration
	}
	if cfg.MaxRate < 0 || cfg.MaxDuration < 0 {
		return nil, errors.New("probe server: negative maximum rate or duration")
	}
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	s := &Server{cfg: cfg, realtime: cfg.RealTime && canRealtime()}
	// The pace figure is measured before any socket is open, with the
	// thread in the namespace the sockets will be in.
	if cost, err := hostcheck.SendCost(); err != nil {
		s.paceErr = err.Error()
	} else {
		s.pace = hostcheck.Limits{SendCostNs: cost}.MaxPacedBitRate()
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("probe server: listen: %w", err)
	}
	local := ln.Addr().(*net.TCPAddr).AddrPort()
	udpAddr := netip.AddrPortFrom(local.Addr(), 0)
	udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(udpAddr))
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("probe server: udp socket: %w", err)
	}
	s.ln, s.udp = ln, udp
	return s, nil
}

// Addr is the control channel's address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Pace is the highest rate this host can pace, in IP bit/s of full-size
// packets, or 0 when the send cost could not be measured.
func (s *Server) Pace() float64 { return s.pace }

// RealTime reports whether the server sends its streams at real-time
// priority (it needs root or CAP_SYS_NICE to).
func (s *Server) RealTime() bool { return s.realtime }

// Serve accepts clients until ctx ends or Close is called. A client that
// arrives while another is being served is told the server is busy.
func (s *Server) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { s.ln.Close() })
	defer stop()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			s.wg.Wait()
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("probe server: accept: %w", err)
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			if err := s.session(ctx, c); err != nil {
				s.cfg.Log("probe server: %v: %v", c.RemoteAddr(), err)
			}
		}()
	}
}

// Close stops the server; sessions in progress end at their next message.
func (s *Server) Close() error {
	err := s.ln.Close()
	if uerr := s.udp.Close(); err == nil {
		err = uerr
	}
	s.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// session serves one client from hello to bye.
func (s *Server) session(ctx context.Context, nc net.Conn) error {
	defer context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now()) })()
	c := newConn(nc)
	refuse := func(why string) error {
		// A deadline that ended the read would fail the write too.
		_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
		_ = c.write(message{Type: msgError, Error: why})
		return errors.New(why)
	}
	// failed says why a read ended the session, to the client too, rather
	// than leave it an EOF or a reset.
	failed := func(err error, idle time.Duration) error {
		var ne net.Error
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case ctx.Err() != nil:
			return refuse("the server is shutting down")
		case errors.As(err, &ne) && ne.Timeout():
			return refuse(fmt.Sprintf("no message for %v: session closed", idle))
		case errors.Is(err, errMessage):
			return refuse(strings.TrimPrefix(err.Error(), errMessage.Error()+": "))
		}
		return err
	}
	_ = nc.SetDeadline(time.Now().Add(handshakeTimeout))
	hello, err := c.expect(msgHello)
	if err != nil {
		return failed(err, handshakeTimeout)
	}
	if hello.Version != ProtocolVersion {
		return refuse(fmt.Sprintf("protocol version %d not supported (server speaks %d)", hello.Version, ProtocolVersion))
	}
	if !s.busy.TryLock() {
		return refuse("busy with another client; try again later")
	}
	defer s.busy.Unlock()

	nonce, err := newNonce()
	if err != nil {
		return refuse("internal error")
	}
	ch := message{Type: msgChallenge, Version: ProtocolVersion, Nonce: nonce, Auth: s.cfg.Secret != "",
		MaxRate: s.cfg.MaxRate, MaxDurationNs: int64(s.cfg.MaxDuration), Pace: s.pace, PaceError: s.paceErr, RealTime: s.realtime}
	if s.cfg.Secret != "" {
		ch.MAC = proof(s.cfg.Secret, "server", hello.Nonce, nonce)
	}
	if err := c.write(ch); err != nil {
		return err
	}
	start, err := c.expect(msgStart)
	if err != nil {
		return failed(err, handshakeTimeout)
	}
	if s.cfg.Secret != "" && !validProof(start.MAC, s.cfg.Secret, "client", hello.Nonce, nonce) {
		return refuse("authentication failed: wrong secret")
	}
	if start.Port == 0 {
		return refuse("no UDP port given")
	}
	// The probe packets go to the control peer's own address and nowhere
	// else: the server cannot be aimed at a third host.
	peer := nc.RemoteAddr().(*net.TCPAddr).AddrPort()
	dst := netip.AddrPortFrom(peer.Addr(), uint16(start.Port))
	var sid [8]byte
	if _, err := rand.Read(sid[:]); err != nil {
		return refuse("internal error")
	}
	session := binary.BigEndian.Uint64(sid[:])
	if err := c.write(message{Type: msgReady, Session: session}); err != nil {
		return err
	}

	var ru0 unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	deadline := time.Now().Add(s.cfg.MaxDuration)
	var sent int64
	buf := make([]byte, MaxPacketSize)
	for {
		_ = nc.SetDeadline(time.Now().Add(idleTimeout))
		m, err := c.read()
		if err != nil {
			return failed(err, idleTimeout)
		}
		switch m.Type {
		case msgBye:
			var ru unix.Rusage
			_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
			s.cfg.Log("probe server: %v: session done, %d probe bytes", peer, sent)
			return c.write(message{Type: msgBye, CPUSeconds: cpuSeconds(ru) - cpuSeconds(ru0)})
		case msgStream:
		default:
			return refuse(fmt.Sprintf("unexpected %q message", m.Type))
		}
		spec := *m.Stream
		rep := SendReport{ID: spec.ID}
		dur := time.Duration(spec.GapNs * int64(spec.Count))
		switch {
		case spec.Rate() > s.cfg.MaxRate*(1+1e-9):
			rep.Refused = fmt.Sprintf("rate %s above the server's limit %s", FormatRate(spec.Rate()), FormatRate(s.cfg.MaxRate))
		case time.Now().Add(dur).After(deadline):
			rep.Refused = fmt.Sprintf("session time limit (%v) reached", s.cfg.MaxDuration)
		default:
			rep = sendStream(s.udp, dst, session, spec, buf, s.realtime)
			sent += int64(rep.Sent) * int64(spec.Size)
		}
		if err := c.write(message{Type: msgSent, Report: &rep}); err != nil {
			return err
		}
		if rep.Refused != "" && time.Now().After(deadline) {
			return refuse(fmt.Sprintf("session time limit (%v) reached", s.cfg.MaxDuration))
		}
	}
}

// sendStream sends spec's packets to dst at their rate and reports when
// the first and last left. It keeps to a schedule fixed at the start, so
// that a late packet does not delay the rest, sleeping through long gaps
// and spinning through the last stretch of each. The thread stays locked
// so that the scheduler does not move it mid-stream.
func sendStream(udp *net.UDPConn, dst netip.AddrPort, session uint64, spec StreamSpec, buf []byte, rt bool) SendReport {
	runtime.LockOSThread()
	restore := func() bool { return true }
	if rt {
		restore, _ = realtime()
	}
	defer func() {
		if restore() {
			runtime.UnlockOSThread()
		}
		// Else the thread stays locked to this goroutine and is thrown
		// away with it, rather than reused at real-time priority.
	}()
	const sleepAbove = 400 * time.Microsecond // sleeping is imprecise by about this much
	headers := ipUDPHeaders
	if dst.Addr().Unmap().Is6() {
		headers = ip6UDPHeaders
	}
	pkt := buf[:spec.Size-headers]
	for i := probeHeaderLen; i < len(pkt); i++ {
		pkt[i] = 0
	}
	h := probeHeader{Session: session, Stream: spec.ID}
	rep := SendReport{ID: spec.ID}
	gap := time.Duration(spec.GapNs)
	start := time.Now()
	for i := range spec.Count {
		due := start.Add(time.Duration(i) * gap)
		if wait := time.Until(due); wait > 2*sleepAbove {
			time.Sleep(wait - sleepAbove)
		}
		now := time.Now()
		for now.Before(due) {
			if !rt {
				// Any other task runnable on this CPU goes first: the
				// probe waits for the host's own traffic, not the reverse.
				unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			}
			now = time.Now()
		}
		h.Seq = uint32(i)
		h.SentNs = now.UnixNano()
		h.put(pkt)
		if _, err := udp.WriteToUDPAddrPort(pkt, dst); err != nil {
			rep.Refused = fmt.Sprintf("send failed after %d packets: %v", i, err)
			break
		}
		if i == 0 {
			rep.First = h.SentNs
		}
		rep.Last = h.SentNs
		rep.Sent++
	}
	return rep
}

// senderPriority is the SCHED_FIFO priority of a thread sending a stream
// when ServerConfig.RealTime asks for it: low among real-time priorities,
// but above every ordinary task, so that the sender wakes on time and is
// not preempted mid-stream (and so that every ordinary task on its CPU
// waits for the stream to end).
const senderPriority = 10

// realtime raises the calling thread, which must be locked to its
// goroutine, to SCHED_FIFO when the process may (root or CAP_SYS_NICE).
// It returns a function that restores the previous policy and reports
// whether it could, and whether the thread is now real-time. The kernel's
// real-time throttling (sched_rt_runtime_us) still leaves other tasks a
// share of every CPU.
func realtime() (restore func() bool, ok bool) {
	noop := func() bool { return true }
	old, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		return noop, false
	}
	attr := unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: senderPriority}
	if err := unix.SchedSetAttr(0, &attr, 0); err != nil {
		return noop, false
	}
	return func() bool { return unix.SchedSetAttr(0, old, 0) == nil }, true
}

// canRealtime reports whether this process may send at real-time
// priority.
func canRealtime() bool {
	runtime.LockOSThread()
	restore, ok := realtime()
	if restore() {
		runtime.UnlockOSThread()
	}
	return ok
}

func cpuSeconds(ru unix.Rusage) float64 {
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}
