// SPDX-License-Identifier: Apache-2.0

// End-to-end tests of the daemon's clients beyond its API: magnet top in a
// real terminal (tmux), the Prometheus exposition, the oscilloscope page in
// headless Chromium, the adaptive example, and MAGNET 2.0's Fig. 7.
package main_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// liveDaemon is a `magnet daemon` process started by a test.
type liveDaemon struct {
	Socket string // its Unix socket
	TCP    string // its TCP listener's address, "" without one
	Token  string // the TCP listener's token
	Config string // its configuration file, "" without one
	cmd    *exec.Cmd
	log    *lockedBuffer
}

// lockedBuffer collects a process's output while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startDaemon runs the daemon on a socket of its own, with a TCP listener
// on a free loopback port when tcp is set, and the YAML config (if any).
// The tests give a filter.port: the daemon then records their own traffic
// only, whatever else runs on the host.
// It waits until the daemon records and serves; the daemon is stopped with
// SIGTERM at the end of the test, and must exit 0.
func startDaemon(t *testing.T, tcp bool, config string) *liveDaemon {
	t.Helper()
	needRoot(t)
	dir := t.TempDir()
	d := &liveDaemon{Socket: filepath.Join(dir, "magnet.sock"), log: &lockedBuffer{}}
	ready := filepath.Join(dir, "ready")
	args := []string{"daemon", "--socket", d.Socket, "--ready-file", ready}
	if tcp {
		d.Token = "e2e-token-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		tok := filepath.Join(dir, "token")
		if err := os.WriteFile(tok, []byte(d.Token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--listen", "127.0.0.1:0", "--token-file", tok)
	}
	if config != "" {
		d.Config = filepath.Join(dir, "magnetd.yaml")
		if err := os.WriteFile(d.Config, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", d.Config)
	}
	d.cmd = exec.Command(bin, args...)
	d.cmd.Stderr = d.log
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.cmd.Wait() }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("daemon exit: %v\n%s", err, d.log.String())
			}
		case <-time.After(30 * time.Second):
			_ = d.cmd.Process.Kill()
			<-exited
			t.Errorf("daemon did not stop within 30s of SIGTERM\n%s", d.log.String())
		}
	})
	deadline := time.After(60 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("daemon exited before it was ready: %v\n%s", err, d.log.String())
		case <-deadline:
			t.Fatalf("daemon not ready within 60s\n%s", d.log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if tcp {
		m := regexp.MustCompile(`serving on \S+ and (127\.0\.0\.1:\d+)`).FindStringSubmatch(d.log.String())
		if m == nil {
			t.Fatalf("no TCP address in the daemon's log:\n%s", d.log.String())
		}
		d.TCP = m[1]
	}
	return d
}

// Client dials the daemon's Unix socket.
func (d *liveDaemon) Client(t *testing.T) *magnetclient.Client {
	t.Helper()
	c, err := magnetclient.Dial(d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Reload rewrites the configuration file and sends SIGHUP, then waits for
// the daemon to say it reloaded.
func (d *liveDaemon) Reload(t *testing.T, config string) {
	t.Helper()
	if d.Config == "" {
		t.Fatal("the daemon was started without a configuration file")
	}
	if err := os.WriteFile(d.Config, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	before := strings.Count(d.log.String(), "reload")
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Count(d.log.String(), "reload") > before })
	if strings.Contains(d.log.String(), "keeping the running configuration") {
		t.Fatalf("reload refused:\n%s", d.log.String())
	}
}

// flow is one bulk TCP transfer from the lab's client to its server,
// inside the test process, counting what the application moved.
type flow struct {
	Sent, Received atomic.Int64
	Local, Remote  netip.AddrPort // the client's ends
	start          time.Time
	conn           net.Conn
	sendDone       chan struct{}
	recvDone       chan struct{}
	stopOnce       sync.Once
	chunk          int
}

// startFlow opens a connection from the client to port on the server and
// writes chunk-byte writes back to back until Stop. The server reads into
// a chunk-byte buffer.
func startFlow(t *testing.T, lab *netlab.Lab, port, chunk int) *flow {
	t.Helper()
	f := &flow{sendDone: make(chan struct{}), recvDone: make(chan struct{}), chunk: chunk}
	var ln net.Listener
	addr := netip.AddrPortFrom(lab.Server.Addr, uint16(port)).String()
	if err := lab.Server.Do(func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(f.recvDone)
		defer ln.Close()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, chunk)
		for {
			n, err := c.Read(buf)
			f.Received.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	if err := lab.Client.Do(func() (err error) {
		f.conn, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	}); err != nil {
		ln.Close()
		t.Fatal(err)
	}
	f.Local = f.conn.LocalAddr().(*net.TCPAddr).AddrPort()
	f.Remote = f.conn.RemoteAddr().(*net.TCPAddr).AddrPort()
	f.start = time.Now()
	go func() {
		defer close(f.sendDone)
		buf := make([]byte, chunk)
		for {
			n, err := f.conn.Write(buf)
			f.Sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { f.Stop() })
	return f
}

// Stop ends the transfer: the sender stops writing and closes, the
// receiver reads what is left. It returns how long the flow lasted.
func (f *flow) Stop() time.Duration {
	f.stopOnce.Do(func() {
		_ = f.conn.SetWriteDeadline(time.Now())
		<-f.sendDone
		_ = f.conn.Close()
		select {
		case <-f.recvDone:
		case <-time.After(10 * time.Second):
		}
	})
	return time.Since(f.start)
}

// findConn waits for the daemon to know the client end of f and returns
// its id.
func findConn(t *testing.T, c *magnetclient.Client, f *flow) uint64 {
	t.Helper()
	filter := magnetclient.Filter{LocalPorts: []uint16{f.Local.Port()}, RemotePorts: []uint16{f.Remote.Port()},
		Addrs: []string{f.Local.Addr().String()}}
	deadline := time.Now().Add(15 * time.Second)
	for {
		conns, err := c.Connections(context.Background(), filter, magnetclient.Window{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cn := range conns {
			if cn.Local == f.Local.String() && cn.Remote == f.Remote.String() {
				return cn.ID
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon does not know the connection %v -> %v", f.Local, f.Remote)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lineReader reads a process's output line by line with a deadline.
type lineReader struct {
	lines chan string
}

func newLineReader(r io.Reader) *lineReader {
	lr := &lineReader{lines: make(chan string, 256)}
	go func() {
		s := bufio.NewScanner(r)
		for s.Scan() {
			lr.lines <- s.Text()
		}
		close(lr.lines)
	}()
	return lr
}

// next returns the next line, or an error at EOF or after d.
func (lr *lineReader) next(d time.Duration) (string, error) {
	select {
	case l, ok := <-lr.lines:
		if !ok {
			return "", io.EOF
		}
		return l, nil
	case <-time.After(d):
		return "", errors.New("timed out")
	}
}

func mbit(bps float64) string { return fmt.Sprintf("%.1f Mbit/s", bps/1e6) }
