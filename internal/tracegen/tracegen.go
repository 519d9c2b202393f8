// SPDX-License-Identifier: Apache-2.0

// Package tracegen writes synthetic traces: what magnet would record of bulk
// TCP transfers between two hosts, event by event and layer by layer, with
// the real event dictionary. Benchmarks use them to measure the analyses on
// traces of any size without a kernel, and tests use them where exact,
// known timings are needed (per-hop delays, the wire between two traces).
// Tests also build their own trace files (Create) and rotated recordings
// under a clock they move (NewRotated) with it.
//
// Each connection sends packets of Segs×MSS bytes (one GSO packet each)
// from the sender to the receiver: sock_send, tcp_send, tcp_xmit, ip_send,
// dev_queue, dev_xmit on the sender; dev_recv, ip_recv, tcp_rcv, sock_recv
// on the receiver; a pure ACK back every second packet, and a tcp_state
// snapshot every fourth ACK. Every hop takes a fixed time (Hop), the wire
// takes Wire, so the delays a report finds are known in advance.
package tracegen

import (
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// Options describe the traffic. Zero fields take the defaults in brackets.
type Options struct {
	// Events stops the transfer once about this many records were written
	// (1,000,000).
	Events int
	// Conns is the number of concurrent connections (4).
	Conns int
	// RateMbit is each connection's rate on the wire (1000).
	RateMbit int
	// Segs is the number of MSS-sized segments per GSO packet (4).
	Segs int
	// Message is the size of each application write (65536).
	Message int
	// Hop is the time between two layers of one host's stack (2 µs).
	Hop time.Duration
	// Wire is the time from the sender's dev_xmit to the receiver's
	// dev_recv (20 µs).
	Wire time.Duration
	// ReceiverClockOffset, in a pair of traces (WritePair), is how far the
	// receiver's clock is ahead of the sender's: a second machine with its
	// own boot. 0 means the two traces come from one machine and share
	// its clock, as when recorded in two namespaces of one host.
	ReceiverClockOffset time.Duration
	// NoQueue leaves out dev_queue, as magnet records a device whose tx
	// queue has no qdisc (veth, lo): dev_xmit follows ip_send.
	NoQueue bool
	// OldDevice writes the device records as traces did before they
	// carried the IP header's facts: 40 bytes, ifindex and gso_segs only,
	// so that readers are tested on both layouts.
	OldDevice bool
}

// MSS is the payload of one segment.
const MSS = 1448

// Addresses and ports of connection i: the sender is SenderAddr:40000+i,
// the receiver ReceiverAddr:5201.
var (
	SenderAddr   = netip.MustParseAddr("10.200.0.1")
	ReceiverAddr = netip.MustParseAddr("10.200.0.2")
)

// Namespace inodes of the two hosts.
const (
	SenderNetNS   = 4026530001
	ReceiverNetNS = 4026530002
)

// ConnID returns the connection id (socket cookie) of connection i's
// sending or receiving end.
func ConnID(i int, receiver bool) uint64 {
	if receiver {
		return uint64(2*i + 2)
	}
	return uint64(2*i + 1)
}

// BootID is the boot id written into the headers of synthetic traces from
// one machine.
const BootID = "7d3c1b2a-0000-4000-8000-000000000001"

func (o Options) withDefaults() Options {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.Events, 1_000_000)
	def(&o.Conns, 4)
	def(&o.RateMbit, 1000)
	def(&o.Segs, 4)
	def(&o.Message, 65536)
	if o.Hop <= 0 {
		o.Hop = 2 * time.Microsecond
	}
	if o.Wire <= 0 {
		o.Wire = 20 * time.Microsecond
	}
	return o
}

// Write writes one trace holding both ends of every connection, as one
// recorder on a host sees two namespaces. It returns the number of records
// written.
func Write(w io.Writer, opts Options) (int, error) {
	return write([]io.Writer{w}, opts)
}

// WritePair writes the sender's end to sender and the receiver's end to
// receiver, as two recorders, one per host, see them.
func WritePair(sender, receiver io.Writer, opts Options) (int, error) {
	return write([]io.Writer{sender, receiver}, opts)
}

// ev is one event to write, in the order of its time.
type ev struct {
	t      uint64
	typ    event.Type
	host   int // 0 sender, 1 receiver
	conn   uint64
	size   int32
	flags  uint8
	a, b   uint32 // per type: seq and ack, ip id, gso segments
	seqNum uint64 // tie-break: keeps equal times in generation order
}

type evHeap []ev

func (h evHeap) Len() int { return len(h) }
func (h evHeap) Less(i, j int) bool {
	return h[i].t < h[j].t || h[i].t == h[j].t && h[i].seqNum < h[j].seqNum
}
func (h evHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *evHeap) Push(x any)   { *h = append(*h, x.(ev)) }
func (h *evHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// conn is one connection's transfer state.
type conn struct {
	i            int
	next         uint64 // time of the next packet
	seq, ack     uint32 // sender's next seq, receiver's next seq (its ISN side)
	sndID, rcvID uint16 // IP ids of each end
	inMessage    int
	packets      int
	opens        uint64 // when the receiver's end is announced
	opened       bool
}

const (
	senderISN   = 1_000_000
	receiverISN = 5_000_000
	start       = uint64(1_000_000_000) // 1 s after boot
	tidSender   = 100
	tidReceiver = 200
)

type encoder struct {
	h   *trace.Header
	ws  []*trace.Writer
	buf [256]byte
	off map[fieldKey]int
	n   int
	// offset added to the receiver's times when it has its own clock
	shift uint64
}

type fieldKey struct{ typ, name string }

// field returns the offset of a field, from the dictionary; a name that is
// not there is a bug in this package.
func (e *encoder) field(typ, name string) int {
	k := fieldKey{typ, name}
	if o, ok := e.off[k]; ok {
		return o
	}
	et := e.h.TypeByName(typ)
	f, ok := et.Field(name)
	if !ok {
		panic("tracegen: no field " + typ + "." + name)
	}
	e.off[k] = f.Offset
	return f.Offset
}

func write(outs []io.Writer, opts Options) (int, error) {
	opts = opts.withDefaults()
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		return 0, err
	}
	if opts.OldDevice {
		for i := range types {
			if t := &types[i]; strings.HasPrefix(t.Name, "dev_") {
				t.Size, t.Fields = 40, t.Fields[:2]
			}
		}
	}
	e := &encoder{off: map[fieldKey]int{}}
	if len(outs) == 2 && opts.ReceiverClockOffset != 0 {
		e.shift = uint64(opts.ReceiverClockOffset)
	}
	const wall = int64(1_750_000_000_000_000_000) // 2025-06-15, minus the 1 s of uptime
	for host, out := range outs {
		h := &trace.Header{
			Host:  "synth",
			Clock: trace.Clock{Source: "CLOCK_MONOTONIC", ResolutionNs: 1, WallOffsetNs: wall},
			Types: types, StartWallNs: wall + int64(start),
			Settings: trace.Settings{Events: (event.DefaultGroups | event.GroupIP).Names()},
			Extra:    map[string]any{"boot_id": BootID},
		}
		if len(outs) == 2 {
			h.Host = []string{"synth-sender", "synth-receiver"}[host]
			if e.shift != 0 && host == 1 {
				// Another machine: its own boot, and a monotonic clock
				// that reads shift more at the same wall time.
				h.Extra["boot_id"] = "7d3c1b2a-0000-4000-8000-000000000002"
				h.Clock.WallOffsetNs -= int64(e.shift)
			}
		}
		w, err := trace.NewWriter(out, h, trace.WriterOptions{})
		if err != nil {
			return 0, err
		}
		e.h = h
		e.ws = append(e.ws, w)
	}
	err = e.run(len(outs) == 2, opts)
	for _, w := range e.ws {
		if cerr := w.Close(&trace.Summary{}); err == nil {
			err = cerr
		}
	}
	return e.n, err
}

func (e *encoder) run(pair bool, o Options) error {
	hostOf := func(h int) int {
		if pair {
			return h
		}
		return 0
	}
	hop := uint64(o.Hop)
	wire := uint64(o.Wire)
	pktBytes := o.Segs * MSS
	gap := uint64(float64(pktBytes+66) * 8 / float64(o.RateMbit) * 1e3) // ns per packet
	var q evHeap
	var seqNum uint64
	push := func(x ev) {
		if x.typ == event.DevQueue && o.NoQueue {
			return
		}
		seqNum++
		x.seqNum = seqNum
		heap.Push(&q, x)
	}
	// Metadata first: tasks, interfaces, connections.
	for host := range 2 {
		tid, comm := uint32(tidSender), "sender"
		if host == 1 {
			tid, comm = tidReceiver, "receiver"
		}
		if err := e.task(hostOf(host), start, tid, comm, host); err != nil {
			return err
		}
		if err := e.iface(hostOf(host), start, host); err != nil {
			return err
		}
	}
	conns := make([]*conn, o.Conns)
	for i := range conns {
		// The handshake first, then data; connections start spread over
		// one packet's time.
		t0 := start + uint64(i)*gap/uint64(o.Conns)
		c := &conn{i: i, next: t0 + 20*hop + 3*wire, seq: senderISN + 1, ack: receiverISN + 1,
			sndID: uint16(1000 * (i + 1)), rcvID: uint16(30000 + 100*i)}
		conns[i] = c
		s, r := ConnID(i, false), ConnID(i, true)
		if err := e.connOpen(hostOf(0), t0, c.i, 0); err != nil {
			return err
		}
		// SYN (the listener's events belong to another socket: left out).
		push(ev{t: t0 + hop, typ: event.TCPXmit, host: 0, conn: s, flags: 0x02, a: senderISN, b: 1})
		push(ev{t: t0 + 2*hop, typ: event.IPSend, host: 0, conn: s, size: 60, a: uint32(c.sndID)})
		push(ev{t: t0 + 3*hop, typ: event.DevQueue, host: 0, conn: s, size: 74, b: 1})
		push(ev{t: t0 + 4*hop, typ: event.DevXmit, host: 0, conn: s, size: 74, b: 1})
		c.sndID++
		// SYN-ACK, from the receiver's request socket: seen arriving only.
		sa := t0 + 8*hop + 2*wire
		push(ev{t: sa, typ: event.DevRecv, host: 0, conn: s, size: 60, b: 1})
		push(ev{t: sa + hop, typ: event.IPRecv, host: 0, conn: s, size: 60, a: uint32(c.rcvID)})
		c.rcvID++
		// The handshake's ACK, which the receiver takes in SYN_RECV (no
		// tcp_rcv) and announces its connection at.
		push(ev{t: sa + 2*hop, typ: event.TCPXmit, host: 0, conn: s, flags: 0x10, a: senderISN + 1, b: 1})
		push(ev{t: sa + 3*hop, typ: event.IPSend, host: 0, conn: s, size: 52, a: uint32(c.sndID)})
		push(ev{t: sa + 4*hop, typ: event.DevQueue, host: 0, conn: s, size: 66, b: 1})
		push(ev{t: sa + 5*hop, typ: event.DevXmit, host: 0, conn: s, size: 66, b: 1})
		push(ev{t: sa + 5*hop + wire, typ: event.DevRecv, host: 1, conn: r, size: 52, b: 1})
		push(ev{t: sa + 6*hop + wire, typ: event.IPRecv, host: 1, conn: r, size: 52, a: uint32(c.sndID)})
		c.sndID++
		c.opens = sa + 5*hop + wire - 1
	}
	flush := func(until uint64) error {
		for len(q) > 0 && q[0].t <= until {
			if err := e.emit(hostOf(q[0].host), heap.Pop(&q).(ev)); err != nil {
				return err
			}
		}
		return nil
	}
	for e.n < o.Events {
		c := conns[0]
		for _, x := range conns[1:] {
			if x.next < c.next {
				c = x
			}
		}
		for _, x := range conns {
			if !x.opened && x.opens <= c.next {
				if err := flush(x.opens); err != nil {
					return err
				}
				if err := e.connOpen(hostOf(1), x.opens, x.i, 1); err != nil {
					return err
				}
				x.opened = true
			}
		}
		if err := flush(c.next); err != nil {
			return err
		}
		t := c.next
		s, r := ConnID(c.i, false), ConnID(c.i, true)
		size := int32(pktBytes)
		// Sender: the application's write is taken by TCP and sent.
		push(ev{t: t, typ: event.TCPSend, host: 0, conn: s, size: size})
		push(ev{t: t + hop, typ: event.TCPXmit, host: 0, conn: s, size: size, flags: 0x18, a: c.seq, b: uint32(o.Segs)})
		push(ev{t: t + 2*hop, typ: event.IPSend, host: 0, conn: s, size: size + 52, a: uint32(c.sndID)})
		push(ev{t: t + 3*hop, typ: event.DevQueue, host: 0, conn: s, size: size + 66, b: uint32(o.Segs)})
		dx := t + 4*hop
		push(ev{t: dx, typ: event.DevXmit, host: 0, conn: s, size: size + 66, b: uint32(o.Segs)})
		c.inMessage += int(size)
		if c.inMessage >= o.Message {
			push(ev{t: dx + hop, typ: event.SockSend, host: 0, conn: s, size: int32(o.Message)})
			c.inMessage -= o.Message
		}
		// Receiver: up the stack, read by the application.
		dr := dx + wire
		push(ev{t: dr, typ: event.DevRecv, host: 1, conn: r, size: size + 52, b: uint32(o.Segs)})
		push(ev{t: dr + hop, typ: event.IPRecv, host: 1, conn: r, size: size + 52, a: uint32(c.sndID)})
		push(ev{t: dr + 2*hop, typ: event.TCPRcv, host: 1, conn: r, size: size, flags: 0x18, a: c.seq, b: c.ack})
		push(ev{t: dr + 5*hop, typ: event.SockRecv, host: 1, conn: r, size: size})
		c.seq += uint32(size)
		c.sndID += uint16(o.Segs)
		c.packets++
		if c.packets%2 == 0 {
			// A pure ACK back.
			a := dr + 3*hop
			push(ev{t: a, typ: event.TCPXmit, host: 1, conn: r, flags: 0x10, a: c.ack, b: 1})
			push(ev{t: a + hop, typ: event.IPSend, host: 1, conn: r, size: 52, a: uint32(c.rcvID)})
			push(ev{t: a + 2*hop, typ: event.DevQueue, host: 1, conn: r, size: 66, b: 1})
			push(ev{t: a + 3*hop, typ: event.DevXmit, host: 1, conn: r, size: 66, b: 1})
			back := a + 3*hop + wire
			push(ev{t: back, typ: event.DevRecv, host: 0, conn: s, size: 52, b: 1})
			push(ev{t: back + hop, typ: event.IPRecv, host: 0, conn: s, size: 52, a: uint32(c.rcvID)})
			push(ev{t: back + 2*hop, typ: event.TCPRcv, host: 0, conn: s, flags: 0x10, a: c.ack, b: c.seq})
			if c.packets%8 == 0 {
				push(ev{t: back + 2*hop, typ: event.TCPState, host: 0, conn: s, a: c.seq - uint32(2*size), b: c.seq})
			}
			c.rcvID++
		}
		c.next += gap
	}
	if err := flush(^uint64(0)); err != nil {
		return err
	}
	var end uint64
	for _, c := range conns {
		end = max(end, c.next)
	}
	for _, c := range conns {
		for host := range 2 {
			if err := e.connClose(hostOf(host), end+uint64(c.i), c, host); err != nil {
				return err
			}
		}
	}
	return nil
}

// record starts a record of type typ in e.buf and returns it.
func (e *encoder) record(typ event.Type, t, conn uint64, tid uint32, size int32, netns uint32, flags uint8) []byte {
	et := e.h.TypeByID(uint8(typ))
	b := e.buf[:et.Size]
	clear(b)
	ne := binary.NativeEndian
	ne.PutUint64(b[0:], t)
	ne.PutUint64(b[8:], conn)
	ne.PutUint32(b[16:], tid)
	ne.PutUint32(b[20:], uint32(size))
	ne.PutUint32(b[24:], netns)
	ne.PutUint16(b[28:], 0)
	b[30], b[31] = uint8(typ), flags
	return b
}

func netnsOf(host int) uint32 {
	if host == 1 {
		return ReceiverNetNS
	}
	return SenderNetNS
}

func (e *encoder) put(w int, b []byte) error {
	e.n++
	return e.ws[w].Write(b)
}

func (e *encoder) task(w int, t uint64, tid uint32, comm string, host int) error {
	b := e.record(event.Task, t, 0, tid, 0, netnsOf(host), 0)
	binary.NativeEndian.PutUint32(b[e.field("task", "pid"):], tid)
	copy(b[e.field("task", "comm"):], comm)
	return e.put(w, b)
}

func (e *encoder) iface(w int, t uint64, host int) error {
	b := e.record(event.Iface, t, 0, 0, 0, netnsOf(host), 0)
	binary.NativeEndian.PutUint32(b[e.field("iface", "ifindex"):], 2)
	copy(b[e.field("iface", "name"):], fmt.Sprintf("veth%d", host))
	return e.put(w, b)
}

func (e *encoder) connOpen(w int, t uint64, i, host int) error {
	tid := uint32(tidSender)
	local, remote := netip.AddrPortFrom(SenderAddr, uint16(40000+i)), netip.AddrPortFrom(ReceiverAddr, 5201)
	if host == 1 {
		tid, local, remote = tidReceiver, remote, local
	}
	b := e.record(event.ConnOpen, t, ConnID(i, host == 1), tid, 0, netnsOf(host), 0)
	ne := binary.NativeEndian
	b[e.field("conn_open", "proto")] = 6
	b[e.field("conn_open", "family")] = 4
	b[e.field("conn_open", "state")] = 1
	ne.PutUint16(b[e.field("conn_open", "lport"):], local.Port())
	ne.PutUint16(b[e.field("conn_open", "rport"):], remote.Port())
	la, ra := local.Addr().As4(), remote.Addr().As4()
	copy(b[e.field("conn_open", "laddr"):], la[:])
	copy(b[e.field("conn_open", "raddr"):], ra[:])
	return e.put(w, b)
}

func (e *encoder) connClose(w int, t uint64, c *conn, host int) error {
	tid := uint32(tidSender)
	if host == 1 {
		tid = tidReceiver
		t += e.shift
	}
	b := e.record(event.ConnClose, t, ConnID(c.i, host == 1), tid, 0, netnsOf(host), 0)
	ne := binary.NativeEndian
	moved := uint64(c.seq - senderISN - 1)
	if host == 0 {
		ne.PutUint64(b[e.field("conn_close", "bytes_acked"):], moved)
	} else {
		ne.PutUint64(b[e.field("conn_close", "bytes_received"):], moved)
	}
	b[e.field("conn_close", "state")] = 1
	return e.put(w, b)
}

var errUnknown = errors.New("tracegen: unknown event")

func (e *encoder) emit(w int, x ev) error {
	tid := uint32(tidSender)
	if x.host == 1 {
		tid = tidReceiver
	}
	switch x.typ {
	case event.DevRecv, event.IPRecv, event.TCPRcv:
		tid = 0 // softirq on an idle CPU
	}
	t := x.t
	if x.host == 1 {
		t += e.shift // the receiver's own clock
	}
	b := e.record(x.typ, t, x.conn, tid, x.size, netnsOf(x.host), x.flags)
	ne := binary.NativeEndian
	b[28] = uint8(x.host) // cpu
	switch x.typ {
	case event.SockSend, event.SockRecv, event.TCPSend:
	case event.TCPXmit:
		ne.PutUint32(b[e.field("tcp_xmit", "seq"):], x.a)
		ne.PutUint16(b[e.field("tcp_xmit", "gso_segs"):], uint16(x.b))
	case event.TCPRcv:
		ne.PutUint32(b[e.field("tcp_rcv", "seq"):], x.a)
		ne.PutUint32(b[e.field("tcp_rcv", "ack"):], x.b)
	case event.IPSend, event.IPRecv:
		name := typeName(x.typ)
		ne.PutUint16(b[e.field(name, "ip_id"):], uint16(x.a))
		b[e.field(name, "ttl")] = 64
		b[e.field(name, "proto")] = 6
		b[e.field(name, "family")] = 4
	case event.DevQueue, event.DevXmit, event.DevRecv:
		name := typeName(x.typ)
		ne.PutUint32(b[e.field(name, "ifindex"):], 2)
		ne.PutUint16(b[e.field(name, "gso_segs"):], uint16(x.b))
	case event.TCPState:
		ne.PutUint32(b[e.field("tcp_state", "cwnd"):], 10)
		ne.PutUint32(b[e.field("tcp_state", "ssthresh"):], 0x7fffffff)
		ne.PutUint32(b[e.field("tcp_state", "srtt_us"):], 50)
		ne.PutUint32(b[e.field("tcp_state", "snd_una"):], x.a)
		ne.PutUint32(b[e.field("tcp_state", "snd_nxt"):], x.b)
		ne.PutUint32(b[e.field("tcp_state", "mss"):], MSS)
		b[e.field("tcp_state", "state")] = 1
	default:
		return fmt.Errorf("%w %d", errUnknown, x.typ)
	}
	return e.put(w, b)
}

func typeName(t event.Type) string {
	in, _ := event.ByType(t)
	return in.Name
}
