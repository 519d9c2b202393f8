// SPDX-License-Identifier: Apache-2.0

package netlab

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// listenUDP opens a UDP socket in h on port 0.
func listenUDP(t *testing.T, h Host) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := h.Do(func() error {
		var err error
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(h.Addr, 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
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
	rcv := listenUDP(t, p.Receiver)
	for _, from := range []Host{p.Sender, p.Cross} {
		snd := listenUDP(t, from)
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
		if string(buf[:n]) != string(msg) || src.Addr() != from.Addr {
			t.Fatalf("got %q from %v, want %q from %v", buf[:n], src, msg, from.Addr)
		}
	}
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

// TestPathBottleneck floods UDP through a 100 Mbit/s bottleneck and checks
// the receiver gets no more than the tbf's rate, Ethernet headers counted.
func TestPathBottleneck(t *testing.T) {
	if testing.Short() {
		t.Skip("half a second of UDP flood")
	}
	const rate = 100
	p := PathForTest(t, PathOptions{Name: "netlabtest", BottleneckMbit: rate})
	rcv := listenUDP(t, p.Receiver)
	snd := listenUDP(t, p.Sender)
	dst := rcv.LocalAddr().(*net.UDPAddr)

	const payload = 1472
	got := make(chan float64, 1)
	go func() {
		buf := make([]byte, 2000)
		var first, last time.Time
		var bytes int
		for {
			_ = rcv.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			n, err := rcv.Read(buf)
			if err != nil {
				break
			}
			now := time.Now()
			if first.IsZero() {
				first = now
			} else {
				bytes += n + 28
			}
			last = now
		}
		got <- float64(bytes) * 8 / last.Sub(first).Seconds()
	}()
	// Offer as much as the sender can for half a second: far more than
	// 100 Mbit/s, unless the machine is starved, which only lowers what
	// arrives. The tbf must never let through more than its rate.
	msg := make([]byte, payload)
	for start := time.Now(); time.Since(start) < 500*time.Millisecond; {
		if _, err := snd.WriteToUDP(msg, dst); err != nil {
			t.Fatal(err)
		}
	}
	bps := <-got
	want := p.BottleneckBits(payload + 28)
	t.Logf("received %.2f Mbit/s of IP through a %d Mbit/s tbf (expected %.2f)", bps/1e6, rate, want/1e6)
	if bps < 0.5*want || bps > 1.02*want {
		t.Errorf("received %.2f Mbit/s, want at most %.2f (+2 %%) and, unless the machine is starved, near it", bps/1e6, want/1e6)
	}
}
