// SPDX-License-Identifier: Apache-2.0

package netlab

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// listenUDP opens a UDP socket in h on port 0.
func listenUDP(t *testing.T, h Host) *net.UDPConn {
	t.Helper()
	return listenUDPOn(t, h, h.Addr)
}

// listenUDPOn opens a UDP socket in h's namespace bound to addr, one of h's
// addresses (IPv4 or IPv6).
func listenUDPOn(t *testing.T, h Host, addr netip.Addr) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := h.Do(func() error {
		var err error
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// checkViaRouter sends a datagram from the sender and the cross host to the
// receiver, each from the address addr picks, and checks it arrives from
// that address.
func checkViaRouter(t *testing.T, p *Path, addr func(Host) netip.Addr) {
	t.Helper()
	rcv := listenUDPOn(t, p.Receiver, addr(p.Receiver))
	for _, from := range []Host{p.Sender, p.Cross} {
		snd := listenUDPOn(t, from, addr(from))
		msg := []byte("via the router from " + from.NS)
		if _, err := snd.WriteToUDP(msg, rcv.LocalAddr().(*net.UDPAddr)); err != nil {
			t.Fatal(err)
		}
		_ = rcv.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 200)
		n, src, err := rcv.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("from %s: %v", from.NS, err)
		}
		if string(buf[:n]) != string(msg) || src.Addr().Unmap() != addr(from) {
			t.Fatalf("got %q from %v, want %q from %v", buf[:n], src, msg, addr(from))
		}
	}
}

func TestPathRoutes(t *testing.T) {
	p := PathForTest(t, PathOptions{Name: "netlabtest", Cross: true})
	hosts := map[string]Host{"sender": p.Sender, "router": p.Router, "receiver": p.Receiver, "cross": p.Cross}
	inodes := map[uint32]string{}
	for name, h := range hosts {
		if h.NS == "" || h.IfIndex <= 0 || h.NetNSInode == 0 || !h.Addr.IsValid() {
			t.Fatalf("%s: incomplete host %+v", name, h)
		}
		if !netip.MustParsePrefix("10.201.0.0/16").Contains(h.Addr) {
			t.Fatalf("%s: address %v outside 10.201.0.0/16", name, h.Addr)
		}
		if other, ok := inodes[h.NetNSInode]; ok {
			t.Fatalf("%s and %s share a namespace", name, other)
		}
		inodes[h.NetNSInode] = name
	}
	checkViaRouter(t, p, func(h Host) netip.Addr { return h.Addr })
	out, err := p.Command(p.Router, "tc", "qdisc", "show", "dev", p.Router.Iface).CombinedOutput()
	if err != nil {
		t.Fatalf("tc: %v: %s", err, out)
	}
	if strings.Contains(string(out), "tbf") {
		t.Fatalf("unlimited path has a tbf: %s", out)
	}
	if err := p.SetBottleneck(100, 0, 0); err != nil {
		t.Fatal(err)
	}
	out, _ = p.Command(p.Router, "tc", "qdisc", "show", "dev", p.Router.Iface).CombinedOutput()
	if !strings.Contains(string(out), "tbf") || !strings.Contains(string(out), "100Mbit") {
		t.Fatalf("no 100 Mbit/s tbf after SetBottleneck: %s", out)
	}
	if err := p.RemoveBottleneck(); err != nil {
		t.Fatal(err)
	}
	if err := p.ShapeCross(20e6, 0); err != nil {
		t.Fatal(err)
	}
	out, _ = p.Command(p.Cross, "tc", "qdisc", "show", "dev", p.Cross.Iface).CombinedOutput()
	if !strings.Contains(string(out), "tbf") || !strings.Contains(string(out), "20Mbit") {
		t.Fatalf("no 20 Mbit/s tbf on the cross host: %s", out)
	}
	if err := p.ShapeCross(0, 0); err != nil {
		t.Fatal(err)
	}
	if err := p.ShapeCross(0, 0); err != nil {
		t.Fatalf("removing the shaping twice: %v", err)
	}
	names := []string{p.Sender.NS, p.Router.NS, p.Receiver.NS, p.Cross.NS}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ns := range names {
		if _, err := os.Stat(filepath.Join(netnsDir, ns)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s still there after Close: %v", ns, err)
		}
	}
}

// TestPathBottleneck queues a train of packets at a 100 Mbit/s bottleneck
// and times them on arrival with kernel receive timestamps: they must
// leave no faster than the tbf's rate, Ethernet headers counted. (How
// close to the rate they come depends on how promptly a loaded host
// serves the tbf's timer, so that is only logged.)
func TestPathBottleneck(t *testing.T) {
	const rate = 100
	p := PathForTest(t, PathOptions{Name: "netlabtest", BottleneckMbit: rate})
	rcv := listenUDP(t, p.Receiver)
	snd := listenUDP(t, p.Sender)
	dst := rcv.LocalAddr().(*net.UDPAddr)
	stampsOn(t, rcv)

	// 150 full packets (227 kB) fit the tbf's queue, so however slowly
	// the sender gets them out, they wait there and leave at the rate.
	const payload, n = 1472, 150
	msg := make([]byte, payload)
	for range n {
		if _, err := snd.WriteToUDP(msg, dst); err != nil {
			t.Fatal(err)
		}
	}
	var stamps []int64
	buf := make([]byte, 2000)
	oob := make([]byte, 128)
	_ = rcv.SetReadDeadline(time.Now().Add(10 * time.Second))
	for len(stamps) < n {
		_, oobn, _, _, err := rcv.ReadMsgUDP(buf, oob)
		if err != nil {
			t.Fatalf("after %d packets: %v", len(stamps), err)
		}
		ts, ok := kernelStamp(oob[:oobn])
		if !ok {
			t.Fatal("packet without a kernel timestamp")
		}
		stamps = append(stamps, ts)
	}
	// The first packets leave at once on the bucket's credit.
	const skip = 10
	bps := float64((n-1-skip)*(payload+28)*8) / float64(stamps[n-1]-stamps[skip]) * 1e9
	want := p.BottleneckBits(payload + 28)
	t.Logf("%d packets left the tbf at %.2f Mbit/s of IP (its rate: %.2f)", n, bps/1e6, want/1e6)
	if bps > 1.02*want {
		t.Errorf("packets left at %.2f Mbit/s, above the tbf's %.2f", bps/1e6, want/1e6)
	}
}

// stampsOn asks for kernel receive timestamps on c and waits until the
// kernel gives them: the first socket to ask switches them on through a
// work queue, and until it runs packets are stamped when they are read.
func stampsOn(t *testing.T, c *net.UDPConn) {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	}); err != nil || serr != nil {
		t.Fatalf("SO_TIMESTAMPNS: %v %v", err, serr)
	}
	self := c.LocalAddr().(*net.UDPAddr)
	buf, oob := make([]byte, 64), make([]byte, 128)
	defer c.SetReadDeadline(time.Time{})
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		if _, err := c.WriteToUDP([]byte("stamp?"), self); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		_, oobn, _, _, err := c.ReadMsgUDP(buf, oob)
		read := time.Now().UnixNano()
		if err != nil {
			t.Fatal(err)
		}
		if ts, ok := kernelStamp(oob[:oobn]); ok && read-ts >= int64(time.Millisecond) {
			return
		}
	}
	t.Fatal("the kernel never timestamped packets on arrival")
}

// kernelStamp returns the SCM_TIMESTAMPNS time in oob.
func kernelStamp(oob []byte) (int64, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= 16 {
			return int64(binary.NativeEndian.Uint64(m.Data))*1e9 + int64(binary.NativeEndian.Uint64(m.Data[8:])), true
		}
	}
	return 0, false
}

// TestPathIPv6 routes UDP over IPv6 from the sender and the cross host
// through the router to the receiver, with unique local addresses.
func TestPathIPv6(t *testing.T) {
	p := PathForTest(t, PathOptions{Name: "netlabtest", Cross: true, IPv6: true})
	ula := netip.MustParsePrefix("fd00:201::/32")
	seen := map[netip.Addr]string{}
	for name, h := range map[string]Host{"sender": p.Sender, "router": p.Router, "receiver": p.Receiver, "cross": p.Cross} {
		if !h.Addr6.Is6() || !ula.Contains(h.Addr6) || !h.Addr.Is4() {
			t.Fatalf("%s: addresses %v and %v, want IPv4 and an IPv6 address in %v", name, h.Addr, h.Addr6, ula)
		}
		if other, ok := seen[h.Addr6]; ok {
			t.Fatalf("%s and %s share %v", name, other, h.Addr6)
		}
		seen[h.Addr6] = name
	}
	checkViaRouter(t, p, func(h Host) netip.Addr { return h.Addr6 })
	// Without the option, no host has an IPv6 address of the lab's.
	q := PathForTest(t, PathOptions{Name: "netlabtest"})
	if q.Sender.Addr6.IsValid() || q.Receiver.Addr6.IsValid() {
		t.Fatalf("IPv6 addresses %v, %v on a path without IPv6", q.Sender.Addr6, q.Receiver.Addr6)
	}
}
