// SPDX-License-Identifier: Apache-2.0

package workload

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// DefaultChurnSize is the request of each connection of a churn when the
// command line gives no size: a small request, as a web or RPC client sends.
const DefaultChurnSize = 100

// requestEnd ends every churn request: the server reads until it has seen
// it, so that it needs no length or count agreed beforehand.
const requestEnd = '\n'

// Churn makes one short TCP connection after another to addr for d,
// sequentially and as fast as it can: each is connected, sent one request
// of size bytes with a single Write (size-1 bytes of 'q', then '\n'), read
// until the server closes it, and closed. The connection in progress when d
// ends is finished, not cut short. Result.Connections (and Messages: one
// request each) counts the connections that completed, Bytes their
// requests.
//
// The server closes first, so the client is the passive closer: TIME_WAIT,
// which holds a connection's address pair for a minute, stays on the
// server's side, and the client's ephemeral ports are free again as soon
// as its close is acknowledged. Were the client to close first, a few
// seconds at thousands of connections a second would use up its
// ephemeral ports (28,232 by default), and connect would fail.
func Churn(ctx context.Context, addr string, size int, d time.Duration) (Result, error) {
	if size < 1 {
		return Result{}, fmt.Errorf("churn request size %d: want at least 1 byte (its '\\n')", size)
	}
	if d <= 0 {
		return Result{}, fmt.Errorf("churn duration %v not positive", d)
	}
	// Keep-alive probes never matter to a connection this short, and
	// turning them on costs four setsockopt calls per connection.
	dialer := net.Dialer{KeepAlive: -1}
	req := request(size)
	buf := make([]byte, 512)
	r := Result{Start: time.Now()}
	until := r.Start.Add(d)
	for time.Now().Before(until) {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		conn, err := dialer.DialContext(ctx, "tcp", addr)
		if err != nil {
			return r, writeErr(ctx, fmt.Errorf("connection %d: %w", r.Connections+1, err))
		}
		err = exchange(ctx, conn, req, buf)
		if cerr := conn.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return r, writeErr(ctx, fmt.Errorf("connection %d: %w", r.Connections+1, err))
		}
		r.Connections++
		r.Messages++
		r.Bytes += int64(size)
	}
	r.End = time.Now()
	return r, nil
}

// exchange writes req on conn and reads until the server closes it.
func exchange(ctx context.Context, conn net.Conn, req, buf []byte) error {
	defer context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })()
	if _, err := conn.Write(req); err != nil {
		return err
	}
	for {
		_, err := conn.Read(buf)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("wait for the server's close: %w", err)
		}
	}
}

// request is a churn request of size bytes: 'q's ended by requestEnd.
func request(size int) []byte {
	b := bytes.Repeat([]byte{'q'}, size)
	b[size-1] = requestEnd
	return b
}

// ServeChurn accepts TCP connections on addr until ctx ends, each served
// concurrently: it reads until the request's '\n' (or the client's close)
// and closes the connection, so the client's read of end-of-file says its
// request was received and counted. It calls ready, if not nil, once the
// socket is listening, with its address. The end of ctx is its normal end:
// it then waits for the connections being served and returns what arrived
// (Connections, and Bytes), with a nil error.
func ServeChurn(ctx context.Context, addr string, ready func(net.Addr)) (Result, error) {
	lc := net.ListenConfig{KeepAlive: -1} // as the client: see Churn
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return Result{}, err
	}
	defer ln.Close()
	if ready != nil {
		ready(ln.Addr())
	}
	defer context.AfterFunc(ctx, func() { ln.Close() })()

	var (
		mu     sync.Mutex
		r      Result
		served sync.WaitGroup
	)
	for {
		conn, err := ln.Accept()
		if err != nil {
			served.Wait()
			if ctx.Err() != nil {
				return r, nil
			}
			return r, err
		}
		served.Go(func() {
			n := readRequest(ctx, conn)
			// Counted before the close: once the client sees it, its
			// connection is in the count.
			mu.Lock()
			now := time.Now()
			if r.Connections == 0 {
				r.Start = now
			}
			r.Connections++
			r.Messages++
			r.Bytes += n
			r.End = now
			mu.Unlock()
			conn.Close()
		})
	}
}

// readRequest reads from conn until it has seen requestEnd, the client
// closes, or ctx ends, and returns the bytes read. A connection that fails
// (reset) is served as one the client closed: counted with what it brought.
func readRequest(ctx context.Context, conn net.Conn) int64 {
	defer context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Now()) })()
	var n int64
	buf := make([]byte, 512)
	for {
		m, err := conn.Read(buf)
		n += int64(m)
		if err != nil || bytes.IndexByte(buf[:m], requestEnd) >= 0 {
			return n
		}
	}
}
