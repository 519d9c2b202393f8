// SPDX-License-Identifier: Apache-2.0

package pcapfilter

import (
	"fmt"
	"net/netip"
)

// The recorder judges each socket once, in BPF, by its tuple (bpf/lib/filter.h):
// Compile turns an expression into a short program of tests, each with
// the instruction to go to when it holds and when it does not, in the
// manner of classic BPF. Every jump goes forward, so a program of n
// instructions ends within n steps: the kernel's interpreter is a bounded
// loop the verifier checks once.

// MaxInsns bounds a compiled program: the size of the array the recorder
// writes into the BPF object before load (PCAP_MAX_INSNS in
// bpf/lib/filter.h).
const MaxInsns = 128

// Operations of an instruction (PCAP_OP_* in bpf/lib/filter.h).
const (
	OpProto  uint8 = 1 // the connection's protocol is Val
	OpFamily uint8 = 2 // the end's address is of family Val (4 or 6)
	OpNet    uint8 = 3 // the end's address is of family Val and in Addr/Mask
	OpPort   uint8 = 4 // TCP or UDP, and the end's port is in Lo-Hi
)

// Jump targets past the program.
const (
	Accept uint16 = 0xffff
	Reject uint16 = 0xfffe
)

// Ends of a connection an instruction tests.
const (
	EndLocal  uint8 = 0
	EndRemote uint8 = 1
)

// Insn is one test. Addr and Mask are the address bytes in network order,
// an IPv4 address in the first four with the rest zero: the same bytes as
// the kernel's tuple (bpf/lib/conn.h tuple_addr).
type Insn struct {
	Op, End, Val uint8
	Lo, Hi       uint16
	JT, JF       uint16
	Addr, Mask   [16]byte
}

// ErrTooLong is returned by Compile for an expression longer than the
// recorder takes.
var ErrTooLong = fmt.Errorf("compiles to more than %d tests", MaxInsns)

// Compile returns e as a program for the recorder's interpreter (Run is
// its model in Go).
func (e *Expr) Compile() ([]Insn, error) {
	c := &compiler{}
	t, f := c.label(), c.label()
	c.labels[t], c.labels[f] = int(Accept), int(Reject)
	c.node(e.root, t, f)
	if len(c.code) > MaxInsns {
		return nil, fmt.Errorf("%w (%d)", ErrTooLong, len(c.code))
	}
	out := make([]Insn, len(c.code))
	for i, p := range c.code {
		out[i] = p.insn
		out[i].JT = uint16(c.labels[p.jt])
		out[i].JF = uint16(c.labels[p.jf])
	}
	return out, nil
}

type pending struct {
	insn   Insn
	jt, jf int // labels
}

type compiler struct {
	code   []pending
	labels []int // label -> instruction index (or Accept/Reject)
}

func (c *compiler) label() int {
	c.labels = append(c.labels, -1)
	return len(c.labels) - 1
}

// place puts label l at the next instruction: every use of it comes before,
// so every jump goes forward.
func (c *compiler) place(l int) { c.labels[l] = len(c.code) }

func (c *compiler) emit(in Insn, t, f int) {
	c.code = append(c.code, pending{in, t, f})
}

// node compiles n to go to label t when it holds, f when not.
func (c *compiler) node(n node, t, f int) {
	switch n := n.(type) {
	case andNode:
		mid := c.label()
		c.node(n.a, mid, f)
		c.place(mid)
		c.node(n.b, t, f)
	case orNode:
		mid := c.label()
		c.node(n.a, t, mid)
		c.place(mid)
		c.node(n.b, t, f)
	case notNode:
		c.node(n.a, f, t)
	case protoNode:
		switch n.name {
		case "tcp":
			c.emit(Insn{Op: OpProto, Val: 6}, t, f)
		case "udp":
			c.emit(Insn{Op: OpProto, Val: 17}, t, f)
		case "ip":
			c.emit(Insn{Op: OpFamily, End: EndLocal, Val: 4}, t, f)
		case "ip6":
			c.emit(Insn{Op: OpFamily, End: EndLocal, Val: 6}, t, f)
		}
	case netNode:
		in := Insn{Op: OpNet, Val: 6}
		a := n.prefix.Addr()
		if a.Is4() {
			in.Val = 4
			a4 := a.As4()
			copy(in.Addr[:], a4[:])
		} else {
			in.Addr = a.As16()
		}
		for i := 0; i < n.prefix.Bits(); i++ {
			in.Mask[i/8] |= 0x80 >> (i % 8)
		}
		c.ends(n.d, in, t, f)
	case portNode:
		c.ends(n.d, Insn{Op: OpPort, Lo: n.lo, Hi: n.hi}, t, f)
	default:
		panic(fmt.Sprintf("pcapfilter: compile %T", n))
	}
}

// ends compiles a test of the ends d names: either is one or the other,
// both one and the other.
func (c *compiler) ends(d dir, in Insn, t, f int) {
	local, remote := in, in
	local.End, remote.End = EndLocal, EndRemote
	switch d {
	case dirSrc:
		c.emit(local, t, f)
	case dirDst:
		c.emit(remote, t, f)
	case dirBoth:
		mid := c.label()
		c.emit(local, mid, f)
		c.place(mid)
		c.emit(remote, t, f)
	default:
		mid := c.label()
		c.emit(local, t, mid)
		c.place(mid)
		c.emit(remote, t, f)
	}
}

// Tuple is what the kernel's interpreter sees of a socket: its protocol,
// and for each end (local, remote) the family of its address (4 for an
// IPv4 address, also one v4-mapped in an IPv6 socket), the address as in
// Insn.Addr, and the port.
type Tuple struct {
	Proto uint8
	Fam   [2]uint8
	Port  [2]uint16
	Addr  [2][16]byte
}

// TupleOf returns c as the interpreter sees it.
func TupleOf(c Conn) Tuple {
	t := Tuple{Proto: c.Proto}
	for i, ap := range []netip.AddrPort{c.Local, c.Remote} {
		a := ap.Addr().Unmap()
		t.Port[i] = ap.Port()
		if a.Is4() {
			t.Fam[i] = 4
			a4 := a.As4()
			copy(t.Addr[i][:], a4[:])
		} else {
			t.Fam[i] = 6
			t.Addr[i] = a.As16()
		}
	}
	return t
}

// Run is the kernel's interpreter (pcap_run in bpf/lib/filter.h) in Go:
// whether prog accepts t. A jump that does not go forward rejects, as
// there.
func Run(prog []Insn, t Tuple) bool {
	pc := 0
	for steps := 0; steps < MaxInsns && pc < len(prog); steps++ {
		in := &prog[pc]
		var ok bool
		e := in.End & 1
		switch in.Op {
		case OpProto:
			ok = t.Proto == in.Val
		case OpFamily:
			ok = t.Fam[e] == in.Val
		case OpNet:
			ok = t.Fam[e] == in.Val
			for i := 0; i < 16 && ok; i++ {
				ok = t.Addr[e][i]&in.Mask[i] == in.Addr[i]
			}
		case OpPort:
			ok = (t.Proto == 6 || t.Proto == 17) && t.Port[e] >= in.Lo && t.Port[e] <= in.Hi
		}
		next := in.JF
		if ok {
			next = in.JT
		}
		switch {
		case next == Accept:
			return true
		case next == Reject, int(next) <= pc:
			return false
		}
		pc = int(next)
	}
	return false
}
