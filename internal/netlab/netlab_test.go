// SPDX-License-Identifier: Apache-2.0

package netlab

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestLabEcho(t *testing.T) {
	l := ForTest(t, Options{Name: "netlabtest"})

	if !l.Subnet.Contains(l.Client.Addr) || !l.Subnet.Contains(l.Server.Addr) || l.Client.Addr == l.Server.Addr {
		t.Fatalf("addresses %v and %v not two hosts of %v", l.Client.Addr, l.Server.Addr, l.Subnet)
	}
	if !netip.MustParsePrefix("10.200.0.0/16").Contains(l.Subnet.Addr()) || l.Subnet.Bits() != 30 {
		t.Fatalf("subnet %v not a /30 of 10.200.0.0/16", l.Subnet)
	}
	for _, h := range []Host{l.Client, l.Server} {
		if h.IfIndex <= 0 || h.NetNSInode == 0 {
			t.Fatalf("host %+v: missing ifindex or netns inode", h)
		}
	}
	if l.Client.NetNSInode == l.Server.NetNSInode {
		t.Fatal("client and server share a namespace inode")
	}

	var ln net.Listener
	err := l.Server.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(l.Server.Addr, 0).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()

	// The listener must not be visible from the host's namespace.
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), 200*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("server listener reachable from the host namespace")
	}

	var conn net.Conn
	err = l.Client.Do(func() error {
		var err error
		conn, err = net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := conn.LocalAddr().(*net.TCPAddr).AddrPort().Addr(); got != l.Client.Addr {
		t.Errorf("client connected from %v, want %v", got, l.Client.Addr)
	}
	msg := []byte("hello through the veth")
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(conn, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echo %q, want %q", got, msg)
	}

	// Command runs in the namespace too.
	out, err := l.Command(l.Server, "ip", "-o", "addr", "show", "dev", l.Server.Iface).CombinedOutput()
	if err != nil {
		t.Fatalf("ip addr in server: %v: %s", err, out)
	}
	if !strings.Contains(string(out), l.Server.Addr.String()+"/30") {
		t.Fatalf("server addresses lack %v: %s", l.Server.Addr, out)
	}
}

func TestCloseRemovesNamespaces(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	l, err := New(Options{Name: "netlabtest"})
	if err != nil {
		t.Fatal(err)
	}
	names := []string{l.Client.NS, l.Server.NS}
	for _, ns := range names {
		if _, err := os.Stat(filepath.Join(netnsDir, ns)); err != nil {
			t.Fatalf("namespace %s missing after New: %v", ns, err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ns := range names {
		if _, err := os.Stat(filepath.Join(netnsDir, ns)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s still there after Close: %v", ns, err)
		}
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestTwoLabsAtOnce(t *testing.T) {
	a := ForTest(t, Options{Name: "netlabtest"})
	b := ForTest(t, Options{Name: "netlabtest"})
	if a.Client.NS == b.Client.NS || a.Server.NS == b.Server.NS {
		t.Fatalf("namespace names collide: %s %s", a.Client.NS, b.Client.NS)
	}
	if a.Subnet == b.Subnet {
		t.Fatalf("both labs use %v", a.Subnet)
	}
	if a.Client.NetNSInode == b.Client.NetNSInode {
		t.Fatal("labs share a namespace")
	}
}

func TestDoRestoresNamespace(t *testing.T) {
	l := ForTest(t, Options{Name: "netlabtest"})
	before := selfNetNS(t)
	var inside uint64
	err := l.Client.Do(func() error {
		inside = selfNetNS(t)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if inside != uint64(l.Client.NetNSInode) {
		t.Errorf("inside Do netns inode %d, want %d", inside, l.Client.NetNSInode)
	}
	want := errors.New("boom")
	if err := l.Server.Do(func() error { return want }); !errors.Is(err, want) {
		t.Errorf("Do returned %v, want fn's error", err)
	}
	if after := selfNetNS(t); after != before {
		t.Errorf("netns inode %d after Do, want %d", after, before)
	}
}

// selfNetNS returns the network namespace inode of the calling thread.
func selfNetNS(t *testing.T) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/thread-self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func TestRateLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("takes a second of bulk transfer")
	}
	const rate = 100
	l := ForTest(t, Options{Name: "netlabtest", RateMbit: rate})

	var ln net.Listener
	err := l.Server.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(l.Server.Addr, 0).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	type result struct {
		n       int64
		elapsed time.Duration
		err     error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		buf := make([]byte, 256<<10)
		var r result
		var first time.Time
		for {
			n, err := c.Read(buf)
			if n > 0 && first.IsZero() {
				first = time.Now()
			}
			r.n += int64(n)
			if err == io.EOF {
				break
			}
			if err != nil {
				r.err = err
				break
			}
		}
		r.elapsed = time.Since(first)
		done <- r
	}()

	var conn *net.TCPConn
	err = l.Client.Do(func() error {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			return err
		}
		conn = c.(*net.TCPConn)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	buf := make([]byte, 64<<10)
	deadline := time.Now().Add(time.Second)
	_ = conn.SetWriteDeadline(deadline)
	for time.Now().Before(deadline) {
		if _, err := conn.Write(buf); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			t.Fatal(err)
		}
	}
	if err := conn.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	mbit := float64(r.n) * 8 / r.elapsed.Seconds() / 1e6
	t.Logf("tbf %d Mbit/s: received %d bytes in %v = %.1f Mbit/s", rate, r.n, r.elapsed.Round(time.Millisecond), mbit)
	// The ceiling is what the tbf promises; the floor only shows traffic
	// flows, since a busy 2-CPU machine cannot always fill the link.
	if mbit < 50 || mbit > 100 {
		t.Errorf("measured %.1f Mbit/s through a %d Mbit/s tbf, want 50 to 100", mbit, rate)
	}
}

func TestCreatorPID(t *testing.T) {
	for _, tc := range []struct {
		name string
		pid  int
		ok   bool
	}{
		{"magnet-123-4-beef-c", 123, true},
		{"magnet-123-4-beef-s", 123, true},
		{"magnet-123-4-beef-x", 0, false},
		{"magnet-123-4-beef-rtr", 123, true},
		{"magnet-123-4-beef-crs", 123, true},
		{"magnet-abc-4-beef-c", 0, false},
		{"magnet-x-123-4-beef-c", 0, false},
		{"other-123-4-beef-c", 0, false},
		{"magnet-123-4-nothex-c", 0, false},
	} {
		pid, ok := creatorPID("magnet", tc.name)
		if pid != tc.pid || ok != tc.ok {
			t.Errorf("creatorPID(%q) = %d, %v; want %d, %v", tc.name, pid, ok, tc.pid, tc.ok)
		}
	}
}

func TestCleanupStale(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	// A pid above pid_max can never be alive.
	dead := "netlabstale-" + strconv.Itoa(1<<23) + "-1-abcd-c"
	mine := "netlabstale-" + strconv.Itoa(os.Getpid()) + "-1-abcd-c"
	for _, ns := range []string{dead, mine} {
		if err := ip("netns", "add", ns); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = deleteNS(ns) })
	}
	CleanupStale("netlabstale")
	if _, err := os.Stat(filepath.Join(netnsDir, dead)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale namespace %s survived: %v", dead, err)
	}
	if _, err := os.Stat(filepath.Join(netnsDir, mine)); err != nil {
		t.Errorf("live namespace %s removed: %v", mine, err)
	}
}

func TestPickSubnet(t *testing.T) {
	seen := map[netip.Prefix]bool{}
	for n := uint32(1); n <= 64; n++ {
		p := pickSubnet(4242, n)
		if seen[p] {
			t.Fatalf("subnet %v repeated at lab %d", p, n)
		}
		seen[p] = true
		if p.Masked() != p || !netip.MustParsePrefix("10.200.0.0/16").Contains(p.Addr()) {
			t.Fatalf("bad subnet %v", p)
		}
	}
}
