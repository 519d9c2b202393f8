// SPDX-License-Identifier: Apache-2.0

package pcapfilter

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
)

// checkCompiled fails t unless e's program, in the model of the kernel's
// interpreter, gives Match's verdict on c, and every jump goes forward.
func checkCompiled(t *testing.T, e *Expr, prog []Insn, c Conn) {
	t.Helper()
	for i, in := range prog {
		for _, j := range []uint16{in.JT, in.JF} {
			if j != Accept && j != Reject && (int(j) <= i || int(j) >= len(prog)) {
				t.Fatalf("%q: instruction %d jumps to %d (program of %d)", e.Source(), i, j, len(prog))
			}
		}
	}
	if got, want := Run(prog, TupleOf(c)), e.Match(c); got != want {
		t.Fatalf("%q (%s) on %v %v-%v: compiled %v, Match %v\n%+v", e.Source(), e, c.Proto, c.Local, c.Remote, got, want, prog)
	}
}

func TestCompileMatches(t *testing.T) {
	for _, s := range []string{"tcp", "udp", "ip", "ip6", "host 10.200.1.2", "src host 10.200.1.1",
		"dst net 10.200.2.0/24", "src and dst net 10.200.1.0/24", "net fd00::/16", "dst net fd00:1::/32",
		"port 5201", "udp port 5201", "src and dst port 5353", "portrange 400-500", "not tcp",
		"tcp port 5201 or udp and not ip6", "host ::ffff:10.200.1.2", "net 0.0.0.0/0", "net ::/0",
		"not (host 10.200.1.2 or port 53) and ip", "port 80 or 443 or 5201"} {
		e, err := Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		prog, err := e.Compile()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range conns {
			checkCompiled(t, e, prog, c)
		}
	}
}

func TestCompileTooLong(t *testing.T) {
	e, err := Parse(strings.Repeat("port 1 or ", 64) + "port 2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Compile(); !errors.Is(err, ErrTooLong) {
		t.Fatalf("65 two-ended tests compiled: %v", err)
	}
}

// Pools small enough that random expressions and tuples often meet.
var (
	poolAddrs = []string{"10.1.0.1", "10.1.2.3", "10.2.0.1", "fd00::1", "fd00:1::2", "::ffff:10.1.2.3", "0.0.0.0", "::"}
	poolNets  = []string{"10.1.0.0/16", "10.0.0.0/8", "10.1.2.0/24", "fd00::/16", "fd00:1::/32", "0.0.0.0/0", "::/0", "10.1.2.3/32"}
	poolPorts = []uint16{0, 53, 443, 5201, 40000}
)

// randExpr writes a random expression of pcap-filter's primitives.
func randExpr(r *rand.Rand, depth int) string {
	if depth > 0 && r.IntN(3) > 0 {
		a, b := randExpr(r, depth-1), randExpr(r, depth-1)
		switch r.IntN(5) {
		case 0:
			return "not (" + a + ")"
		case 1, 2:
			return "(" + a + ") and (" + b + ")"
		default:
			return "(" + a + ") or (" + b + ")"
		}
	}
	d := []string{"", "src ", "dst ", "src or dst ", "src and dst "}[r.IntN(5)]
	switch r.IntN(6) {
	case 0:
		return []string{"tcp", "udp", "ip", "ip6"}[r.IntN(4)]
	case 1:
		return d + "host " + poolAddrs[r.IntN(len(poolAddrs))]
	case 2:
		return d + "net " + poolNets[r.IntN(len(poolNets))]
	case 3:
		return []string{"", "tcp ", "udp "}[r.IntN(3)] + d + "port " + fmt.Sprint(poolPorts[r.IntN(len(poolPorts))])
	case 4:
		lo, hi := poolPorts[r.IntN(len(poolPorts))], poolPorts[r.IntN(len(poolPorts))]
		return d + fmt.Sprintf("portrange %d-%d", lo, hi)
	}
	return d + "port " + fmt.Sprint(poolPorts[r.IntN(len(poolPorts))]) + " or " + fmt.Sprint(poolPorts[r.IntN(len(poolPorts))])
}

func randConn(r *rand.Rand) Conn {
	ap := func() netip.AddrPort {
		return netip.AddrPortFrom(netip.MustParseAddr(poolAddrs[r.IntN(len(poolAddrs))]), poolPorts[r.IntN(len(poolPorts))])
	}
	return Conn{Proto: []uint8{6, 17, 1}[r.IntN(3)], Local: ap(), Remote: ap()}
}

// The compiled program decides as Match does, on random expressions and
// connections drawn from the same few addresses, networks and ports.
func TestCompileRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		s := randExpr(r, 3)
		e, err := Parse(s)
		if err != nil {
			// Random families meet ("ip6 and ..." never errs, but a
			// family-qualified address of the other family would).
			continue
		}
		prog, err := e.Compile()
		if errors.Is(err, ErrTooLong) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for range 8 {
			checkCompiled(t, e, prog, randConn(r))
		}
	}
}

// FuzzCompile checks the compilation against Match on any expression that
// parses and any connection.
func FuzzCompile(f *testing.F) {
	f.Add("tcp port 443 and host 10.0.0.2", uint8(6), []byte{10, 0, 0, 2}, []byte{10, 0, 0, 1}, uint16(443), uint16(40000))
	f.Add("src and dst net fd00::/8 or not udp", uint8(17), make([]byte, 16), []byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, uint16(53), uint16(53))
	f.Add("portrange 1-1023 and not ip6", uint8(6), []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3}, []byte{10, 1, 2, 4}, uint16(80), uint16(1024))
	f.Fuzz(func(t *testing.T, s string, proto uint8, la, ra []byte, lp, rp uint16) {
		e, err := Parse(s)
		if err != nil {
			return
		}
		prog, err := e.Compile()
		if errors.Is(err, ErrTooLong) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		addr := func(b []byte) netip.Addr {
			if len(b) >= 16 {
				return netip.AddrFrom16([16]byte(b[:16]))
			}
			var a [4]byte
			copy(a[:], b)
			return netip.AddrFrom4(a)
		}
		c := Conn{Proto: proto, Local: netip.AddrPortFrom(addr(la), lp), Remote: netip.AddrPortFrom(addr(ra), rp)}
		checkCompiled(t, e, prog, c)
		for _, c := range conns {
			checkCompiled(t, e, prog, c)
		}
	})
}
