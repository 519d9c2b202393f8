// SPDX-License-Identifier: Apache-2.0

package record

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
)

func TestParseProcNetLine(t *testing.T) {
	for _, c := range []struct {
		line          string
		local, remote string
		state         uint8
		inode         uint64
	}{
		// As Linux 6.x prints them on a little-endian host.
		{"   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41235 1 0000000000000000 100 0 0 10 0",
			"127.0.0.1:8080", "0.0.0.0:0", 10, 41235},
		{"   1: 0201000A:0050 0101000A:D431 01 00000000:00000000 00:00000000 00000000     0        0 99 1 0000000000000000 20 4 30 10 -1",
			"10.0.1.2:80", "10.0.1.1:54321", 1, 99},
		{"   0: 00000000000000000000000000000000:1451 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 7 1 0000000000000000 100 0 0 10 0",
			"[::]:5201", "[::]:0", 10, 7},
		{"   0: 0000000000000000FFFF00000100000A:0050 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 8 2 0000000000000000 0",
			"[::ffff:10.0.0.1]:80", "[::]:0", 7, 8},
		{"   0: 000080FE00000000FF005452005412FE:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 9 1 0000000000000000 100 0 0 10 0",
			"[fe80::5254:ff:fe12:5400]:80", "[::]:0", 10, 9},
	} {
		if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
			t.Skip("the lines are a little-endian host's")
		}
		e, ok := parseProcNetLine(c.line)
		if !ok {
			t.Errorf("%q: not parsed", c.line)
			continue
		}
		if e.local.String() != c.local || e.remote.String() != c.remote || e.state != c.state || e.inode != c.inode {
			t.Errorf("%q: got %s %s %d %d, want %s %s %d %d", c.line, e.local, e.remote, e.state, e.inode, c.local, c.remote, c.state, c.inode)
		}
	}
	for _, bad := range []string{"", "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
		"0: 0100007F:1F90 00000000:0000 0A a b c d e", "0: 0100007:1F90 00000000:0000 0A a b c d e 1", "0: 0100007F:1FZ0 00000000:0000 0A a b c d e 1"} {
		if _, ok := parseProcNetLine(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

func FuzzParseProcNetLine(f *testing.F) {
	f.Add("   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41235 1 0000000000000000 100 0 0 10 0")
	f.Fuzz(func(t *testing.T, line string) { parseProcNetLine(line) })
}

// connOpenOf returns a conn_open ring record (no task) of a socket of this
// process's network namespace.
func connOpenOf(t *testing.T, proto, state uint8, local, remote netip.AddrPort) []byte {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &st); err != nil {
		t.Skipf("no network namespace to read: %v", err)
	}
	ev := make([]byte, connSize)
	binary.NativeEndian.PutUint64(ev[8:], 12345) // cookie
	binary.NativeEndian.PutUint32(ev[24:], uint32(st.Ino))
	ev[connProto], ev[connState], ev[connFamily] = proto, state, 4
	if local.Addr().Is6() {
		ev[connFamily] = 6
	}
	binary.NativeEndian.PutUint16(ev[connLport:], local.Port())
	binary.NativeEndian.PutUint16(ev[connRport:], remote.Port())
	la, ra := local.Addr().AsSlice(), remote.Addr().AsSlice()
	copy(ev[connLaddr:], la)
	copy(ev[connRaddr:], ra)
	return ev
}

// TestOwnersFindThisProcess resolves sockets this test process owns, as
// ss -p would: a TCP listener (v4 and v6) and a UDP socket.
func TestOwnersFindThisProcess(t *testing.T) {
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Skipf("no procfs: %v", err)
	}
	for _, c := range []struct{ network, addr string }{{"tcp4", "127.0.0.1:0"}, {"tcp6", "[::1]:0"}, {"udp4", "127.0.0.1:0"}} {
		var local netip.AddrPort
		proto, state := uint8(protoTCP), uint8(tcpListen)
		if strings.HasPrefix(c.network, "tcp") {
			l, err := net.Listen(c.network, c.addr)
			if err != nil {
				t.Logf("%s: %v", c.network, err)
				continue
			}
			defer l.Close()
			local = l.Addr().(*net.TCPAddr).AddrPort()
		} else {
			u, err := net.ListenPacket(c.network, c.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			local = u.LocalAddr().(*net.UDPAddr).AddrPort()
			proto, state = protoUDP, 7
		}
		remote := netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
		if local.Addr().Is6() {
			remote = netip.AddrPortFrom(netip.IPv6Unspecified(), 0)
		}
		o := newOwners("/proc")
		w, ok := o.of(connOpenOf(t, proto, state, local, remote))
		if !ok {
			t.Fatalf("%s %s: no owner found", c.network, local)
		}
		if int(w.pid) != os.Getpid() || int(w.key.pid) != os.Getpid() || w.key.uid != uint32(os.Getuid()) ||
			strings.TrimRight(string(w.key.comm[:]), "\x00") != strings.TrimSpace(string(comm)) {
			t.Errorf("%s %s: owner %d %d %q, want this process %d %d %q", c.network, local,
				w.pid, w.key.uid, w.key.comm, os.Getpid(), os.Getuid(), comm)
		}
		// A task in the record: nothing to resolve.
		ev := connOpenOf(t, proto, state, local, remote)
		binary.NativeEndian.PutUint32(ev[16:], 7)
		if _, ok := newOwners("/proc").of(ev); ok {
			t.Errorf("%s: an owner for a conn_open that names its task", c.network)
		}
	}
	// A TCP socket that is not a listener is not looked for: its address
	// alone does not name it, and its first send or receive names its owner.
	ev := connOpenOf(t, protoTCP, 1, netip.MustParseAddrPort("127.0.0.1:1"), netip.MustParseAddrPort("127.0.0.1:2"))
	if _, ok := newOwners("/proc").of(ev); ok {
		t.Error("an owner for an established TCP socket")
	}
	// No such socket.
	ev = connOpenOf(t, protoTCP, tcpListen, netip.MustParseAddrPort("127.0.0.1:1"), netip.MustParseAddrPort("0.0.0.0:0"))
	o := newOwners("/proc")
	if _, ok := o.of(ev); ok {
		t.Error("an owner for a listener that does not exist")
	}
	if w, cached := o.cache[12345]; !cached || w != nil {
		t.Error("a failed look-up is not remembered")
	}
}
