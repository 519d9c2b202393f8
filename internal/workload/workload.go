// SPDX-License-Identifier: Apache-2.0

// Package workload generates the traffic magnet is tested and demonstrated
// with: the FTP-like pattern of the MAGNeT paper (a fixed number of equal
// messages at a steady interval, over TCP or UDP), a flood of small
// messages that overflows the tracer's buffers, and connection churn (one
// short TCP connection after another, where recording costs most per
// byte).
//
// Every message is handed to the kernel with one Write on an unbuffered
// socket, so each message is one send system call, which is what magnet
// counts.
package workload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults for the zero fields of a Spec, and the interval the command line
// uses unless told otherwise.
const (
	DefaultCount    = 100
	DefaultSize     = 10240
	DefaultInterval = 20 * time.Millisecond
)

// MaxDatagram is the largest UDP payload over IPv4.
const MaxDatagram = 65507

// udpIdle is how long a UDP server waits for more after the first datagram.
const udpIdle = 2 * time.Second

// ErrUnknownProtocol is returned for a protocol other than "tcp" or "udp".
var ErrUnknownProtocol = errors.New("unknown protocol")

// Spec describes the messages Send writes.
type Spec struct {
	// Proto is "tcp" or "udp".
	Proto string
	// Count is the number of messages; DefaultCount if 0.
	Count int
	// Size is the size of each message in bytes; DefaultSize if 0. Over UDP
	// it must not exceed MaxDatagram.
	Size int
	// Interval is the time between the starts of consecutive messages
	// (of consecutive bursts, with Burst); 0 sends as fast as possible.
	Interval time.Duration
	// Burst is how many messages are written back to back at each
	// interval, for bursty traffic of the same mean rate as Burst times
	// the messages at Interval/Burst; 1 if 0.
	Burst int
}

// Result says what one side of a workload moved.
type Result struct {
	// Bytes is the payload sent or received.
	Bytes int64
	// Messages counts writes when sending and reads (TCP) or datagrams (UDP)
	// when receiving.
	Messages int
	// Connections counts, for a churn, the connections that completed
	// (Churn) or were served (ServeChurn), each one request.
	Connections int
	// Start is when the first message was written or the first byte read;
	// End is when the exchange finished. Both are zero if nothing moved.
	Start, End time.Time
	// Delivered is, for a TCP sender that finished, the segments its
	// kernel counted delivered (tcpi_delivered of TCP_INFO, the FIN
	// included), read once the receiver had closed: what the last
	// tcp_rate event of the connection says.
	Delivered uint32
}

// CheckProto returns nil for "tcp" and "udp" and an error wrapping
// ErrUnknownProtocol otherwise.
func CheckProto(proto string) error {
	if proto == "tcp" || proto == "udp" {
		return nil
	}
	return fmt.Errorf("%w %q (want tcp or udp)", ErrUnknownProtocol, proto)
}

// withDefaults fills the zero fields of s and checks the rest.
func (s Spec) withDefaults() (Spec, error) {
	if err := CheckProto(s.Proto); err != nil {
		return s, err
	}
	if s.Count == 0 {
		s.Count = DefaultCount
	}
	if s.Size == 0 {
		s.Size = DefaultSize
	}
	if s.Burst == 0 {
		s.Burst = 1
	}
	switch {
	case s.Count < 0:
		return s, fmt.Errorf("negative message count %d", s.Count)
	case s.Size < 0:
		return s, fmt.Errorf("negative message size %d", s.Size)
	case s.Interval < 0:
		return s, fmt.Errorf("negative interval %v", s.Interval)
	case s.Burst < 0:
		return s, fmt.Errorf("negative burst %d", s.Burst)
	}
	if err := checkSize(s.Proto, s.Size); err != nil {
		return s, err
	}
	return s, nil
}

func checkSize(proto string, size int) error {
	if proto == "udp" && size > MaxDatagram {
		return fmt.Errorf("udp message of %d bytes exceeds the %d-byte datagram limit", size, MaxDatagram)
	}
	return nil
}

// Serve receives one workload on addr and returns what arrived. It calls
// ready, if not nil, once the socket is listening, with its address.
//
// Over TCP it accepts exactly one connection, reads until the sender closes
// its side, then closes the connection, which tells the sender everything
// arrived. Over UDP it reads datagrams until none has come for 2 seconds
// after the first one; use ServeBytes to stop as soon as a known amount has
// arrived. When ctx ends first, Serve returns what arrived so far with
// ctx's error.
func Serve(ctx context.Context, proto, addr string, ready func(net.Addr)) (Result, error) {
	return ServeBytes(ctx, proto, addr, 0, ready)
}

// ServeBytes is Serve that, over UDP, also stops once want bytes have
// arrived (a sender's Count*Size). want is ignored over TCP, where the
// sender's close marks the end, and 0 means no target.
func ServeBytes(ctx context.Context, proto, addr string, want int64, ready func(net.Addr)) (Result, error) {
	if err := CheckProto(proto); err != nil {
		return Result{}, err
	}
	if proto == "tcp" {
		return serveTCP(ctx, addr, ready)
	}
	return serveUDP(ctx, addr, want, ready)
}

func serveTCP(ctx context.Context, addr string, ready func(net.Addr)) (Result, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return Result{}, err
	}
	defer ln.Close()
	if ready != nil {
		ready(ln.Addr())
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	conn, err := ln.Accept()
	stop()
	ln.Close()
	if err != nil {
		if ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		return Result{}, err
	}
	defer conn.Close()
	defer context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })()

	var r Result
	buf := make([]byte, 64<<10)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			if r.Messages == 0 {
				r.Start = time.Now()
			}
			r.Bytes += int64(n)
			r.Messages++
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return r, err
		}
	}
	r.End = time.Now()
	return r, conn.Close()
}

// udpReceiveBuffer is what a UDP server asks its socket to hold: a
// second of 100 Mbit/s, so that a server descheduled for a while on a
// loaded host does not drop what the tests count.
const udpReceiveBuffer = 12 << 20

// growReceiveBuffer raises the socket's receive buffer to udpReceiveBuffer:
// past net.core.rmem_max when the process may (CAP_NET_ADMIN), else as far
// as rmem_max allows. Failure leaves the default, which is only smaller.
func growReceiveBuffer(pc net.PacketConn) {
	sc, ok := pc.(interface {
		SyscallConn() (syscall.RawConn, error)
	})
	if !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, udpReceiveBuffer) != nil {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, udpReceiveBuffer)
		}
	})
}

func serveUDP(ctx context.Context, addr string, want int64, ready func(net.Addr)) (Result, error) {
	var lc net.ListenConfig
	pc, err := lc.ListenPacket(ctx, "udp", addr)
	if err != nil {
		return Result{}, err
	}
	defer pc.Close()
	growReceiveBuffer(pc)
	if ready != nil {
		ready(pc.LocalAddr())
	}
	defer context.AfterFunc(ctx, func() { pc.SetReadDeadline(time.Now()) })()

	var r Result
	buf := make([]byte, 64<<10)
	for want <= 0 || r.Bytes < want {
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return r, ctx.Err()
			}
			if errors.Is(err, os.ErrDeadlineExceeded) && r.Messages > 0 {
				return r, nil // idle: the sender is done
			}
			return r, err
		}
		now := time.Now()
		if r.Messages == 0 {
			r.Start = now
		}
		r.Bytes += int64(n)
		r.Messages++
		r.End = now
		if ctx.Err() == nil {
			_ = pc.SetReadDeadline(now.Add(udpIdle))
		}
	}
	return r, nil
}

// Send connects to addr and writes s.Count messages of s.Size bytes, each
// with a single Write, starting one (or a burst of s.Burst) every
// s.Interval on a schedule fixed at the start so that delays do not
// accumulate. Over TCP it then closes its
// sending side and waits for the server to close, so that every byte has
// been delivered when Send returns. Over UDP each message is one datagram
// (one larger than the path MTU leaves the host IP-fragmented).
func Send(ctx context.Context, addr string, s Spec) (Result, error) {
	s, err := s.withDefaults()
	if err != nil {
		return Result{}, err
	}
	conn, err := dial(ctx, s.Proto, addr)
	if err != nil {
		return Result{}, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()

	msg := payload(s.Size)
	var r Result
	var timer *time.Timer
	for i := range s.Count {
		if s.Interval > 0 && i > 0 && i%s.Burst == 0 {
			at := r.Start.Add(time.Duration(i/s.Burst) * s.Interval)
			if d := time.Until(at); d > 0 {
				if timer == nil {
					timer = time.NewTimer(d)
					defer timer.Stop()
				} else {
					timer.Reset(d)
				}
				select {
				case <-timer.C:
				case <-ctx.Done():
					return r, ctx.Err()
				}
			}
		}
		if i == 0 {
			r.Start = time.Now()
		}
		n, err := conn.Write(msg)
		r.Bytes += int64(n)
		if err != nil {
			return r, writeErr(ctx, err)
		}
		r.Messages++
	}
	if err := finish(ctx, conn); err != nil {
		return r, err
	}
	r.End = time.Now()
	r.Delivered = delivered(conn)
	return r, nil
}

// Flood connects to addr and writes messages of size bytes back to back for
// d, to overflow a tracer's buffers. Over TCP it then closes its side and
// waits for the server, as Send does.
func Flood(ctx context.Context, proto, addr string, size int, d time.Duration) (Result, error) {
	if err := CheckProto(proto); err != nil {
		return Result{}, err
	}
	if size <= 0 {
		return Result{}, fmt.Errorf("message size %d not positive", size)
	}
	if err := checkSize(proto, size); err != nil {
		return Result{}, err
	}
	conn, err := dial(ctx, proto, addr)
	if err != nil {
		return Result{}, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()

	msg := payload(size)
	r := Result{Start: time.Now()}
	until := r.Start.Add(d)
	// The deadline also ends a write blocked on a full socket buffer.
	_ = conn.SetWriteDeadline(until)
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	for time.Now().Before(until) {
		n, err := conn.Write(msg)
		r.Bytes += int64(n)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil {
				break
			}
			return r, writeErr(ctx, err)
		}
		r.Messages++
	}
	_ = conn.SetWriteDeadline(time.Time{})
	if err := finish(ctx, conn); err != nil {
		return r, err
	}
	r.End = time.Now()
	r.Delivered = delivered(conn)
	return r, nil
}

func dial(ctx context.Context, proto, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, proto, addr)
}

// finish ends a TCP exchange: it closes the sending side and waits for the
// peer to close, so every byte has arrived. It does nothing for UDP.
func finish(ctx context.Context, conn net.Conn) error {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return nil
	}
	if err := tc.CloseWrite(); err != nil {
		return writeErr(ctx, err)
	}
	if _, err := io.Copy(io.Discard, tc); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("wait for receiver: %w", err)
	}
	return nil
}

// delivered reads tcpi_delivered of a TCP connection; 0 for UDP or when
// TCP_INFO cannot be read.
func delivered(conn net.Conn) uint32 {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return 0
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return 0
	}
	var info *unix.TCPInfo
	_ = raw.Control(func(fd uintptr) {
		info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	})
	if err != nil || info == nil {
		return 0
	}
	return info.Delivered
}

// writeErr reports ctx's error instead of the deadline it caused.
func writeErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// payload returns size bytes of printable text, easy to spot in a capture.
func payload(size int) []byte {
	const pattern = "magnet workload "
	b := make([]byte, size)
	for i := range b {
		b[i] = pattern[i%len(pattern)]
	}
	return b
}
