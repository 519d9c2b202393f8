// SPDX-License-Identifier: Apache-2.0

// Package summary turns the kernel's per-connection figures of a summary
// recording (`magnet record --summary`) into conn_summary records: every
// interval, for each connection whose figures moved, what moved since its
// previous record. The BPF programs only ever add to the figures (per CPU,
// without atomics); they are never reset from here, since a reset races
// with the adds it would erase, so each record is a difference of totals.
package summary

import (
	"encoding/binary"
	"fmt"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// Source is where the figures live: the probe's summaries map.
type Source interface {
	// ReadSummaries calls fn with each connection's struct
	// mg_conn_summary, one per CPU.
	ReadSummaries(fn func(cookie uint64, perCPU [][]byte) error) error
	// ForgetSummary deletes a connection's figures and returns them as
	// they were when deleted (one value per CPU, as ReadSummaries gives
	// them; none if there were none), so that what a program added
	// between the last read and the delete is not lost.
	ForgetSummary(cookie uint64) ([][]byte, error)
}

// Collector writes conn_summary records from a Source.
type Collector struct {
	src    Source
	typ    *trace.EventType
	counts []trace.Field // the fields that count (all but start_ns)
	conns  map[uint64]*conn
	// gone: the network namespaces of connections forgotten lately, by
	// cookie, for a packet that comes after (an ACK or a drop of a
	// closed connection's, found by its addresses), whose figures the
	// programs make anew: they are recorded in its netns and forgotten
	// again.
	gone map[uint64]goneConn
	last uint64 // when the previous pass read the figures
	pass uint64
	sum  []byte
	rec  []byte
	// Records counts the conn_summary records written.
	Records uint64
	// Forgotten counts the closed connections whose figures were deleted.
	Forgotten uint64
}

// goneConn is a forgotten connection's netns, and when it was forgotten.
type goneConn struct {
	netns uint32
	at    uint64
}

// goneFor is how long a forgotten connection's netns is kept: longer than
// Linux's TIME_WAIT (60 s), during which the last ACKs of a connection
// may still come.
const goneFor = 120e9

// conn is what the collector knows of a connection.
type conn struct {
	totals []byte // the figures at its last record, summed over CPUs
	netns  uint32
	closed bool   // its conn_close was seen
	seen   uint64 // the last pass that found its figures
}

// New returns a collector of src's figures whose records have the layout
// typ (the trace's conn_summary) and whose first interval starts at start
// (CLOCK_MONOTONIC, ns).
func New(src Source, typ *trace.EventType, start uint64) (*Collector, error) {
	if typ == nil || typ.ID != uint8(event.ConnSummary) {
		return nil, fmt.Errorf("summary: the trace has no conn_summary type")
	}
	c := &Collector{src: src, typ: typ, conns: map[uint64]*conn{}, gone: map[uint64]goneConn{}, last: start}
	for _, f := range typ.Fields {
		if f.Name == "start_ns" {
			continue
		}
		if f.Kind != trace.KindUint || (f.Size != 4 && f.Size != 8) || f.Offset+f.Size > typ.Size {
			return nil, fmt.Errorf("summary: conn_summary field %s (%s, %d bytes) is not a counter", f.Name, f.Kind, f.Size)
		}
		c.counts = append(c.counts, f)
	}
	c.sum = make([]byte, typ.Size)
	c.rec = make([]byte, typ.Size)
	return c, nil
}

func (c *Collector) of(cookie uint64) *conn {
	x := c.conns[cookie]
	if x == nil {
		x = &conn{totals: make([]byte, c.typ.Size)}
		if g, ok := c.gone[cookie]; ok {
			// Figures made anew after the connection was forgotten.
			x.netns, x.closed = g.netns, true
			delete(c.gone, cookie)
		}
		c.conns[cookie] = x
	}
	return x
}

// Opened notes a connection's network namespace (from its conn_open),
// which its records carry in their header.
func (c *Collector) Opened(cookie uint64, netns uint32) {
	c.of(cookie).netns = netns
}

// Closed notes that a connection ended (its conn_close): once its figures
// have not moved for a whole interval, they are written a last time and
// deleted from the map. Packets may still come after the close (the last
// ACKs, a reset), so they are not deleted at once.
func (c *Collector) Closed(cookie uint64) {
	x := c.of(cookie)
	x.closed = true
}

// Collect reads the figures and writes, through write, a conn_summary
// record for each connection whose figures moved since its previous one,
// for the interval from the previous Collect to now (CLOCK_MONOTONIC).
// rec is reused once write returns. It returns how many it wrote.
func (c *Collector) Collect(now uint64, write func(rec []byte) error) (int, error) {
	n := 0
	c.pass++
	var forget []uint64
	err := c.src.ReadSummaries(func(cookie uint64, perCPU [][]byte) error {
		if err := c.sumOf(perCPU); err != nil {
			return err
		}
		x := c.of(cookie)
		x.seen = c.pass
		if !c.delta(x, cookie, now) {
			// Closed, and nothing moved for a whole interval since
			// its last record.
			if x.closed {
				forget = append(forget, cookie)
			}
			return nil
		}
		if err := write(c.rec); err != nil {
			return err
		}
		copy(x.totals, c.sum)
		c.Records++
		n++
		return nil
	})
	if err != nil {
		return n, err
	}
	// Deleted after the walk: deleting while iterating a hash map can make
	// the walk start over. What moved since the walk read the figures
	// (a packet of the closed connection meanwhile) goes in a last record.
	for _, cookie := range forget {
		perCPU, err := c.src.ForgetSummary(cookie)
		if err != nil {
			return n, err
		}
		x := c.conns[cookie]
		if len(perCPU) > 0 {
			if err := c.sumOf(perCPU); err != nil {
				return n, err
			}
			if c.delta(x, cookie, now) {
				if err := write(c.rec); err != nil {
					return n, err
				}
				c.Records++
				n++
			}
		}
		c.gone[cookie] = goneConn{netns: x.netns, at: now}
		delete(c.conns, cookie)
		c.Forgotten++
	}
	for cookie, x := range c.conns {
		if x.closed && x.seen != c.pass {
			delete(c.conns, cookie) // closed without a figure in the map
		}
	}
	for cookie, g := range c.gone {
		if now-g.at > goneFor {
			delete(c.gone, cookie)
		}
	}
	c.last = now
	return n, nil
}

// sumOf puts the sum over CPUs of a connection's figures in c.sum.
func (c *Collector) sumOf(perCPU [][]byte) error {
	clear(c.sum)
	for _, v := range perCPU {
		if len(v) < c.typ.Size {
			return fmt.Errorf("summary: a value of %d bytes, want %d", len(v), c.typ.Size)
		}
		for _, f := range c.counts {
			add(c.sum, v, f)
		}
	}
	return nil
}

// delta fills c.rec with the record of connection x (cookie) for the
// interval ending at now: c.sum less x's totals. It says whether any
// figure moved.
func (c *Collector) delta(x *conn, cookie uint64, now uint64) bool {
	clear(c.rec)
	moved := false
	for _, f := range c.counts {
		if sub(c.rec, c.sum, x.totals, f) {
			moved = true
		}
	}
	if !moved {
		return false
	}
	ne := binary.NativeEndian
	ne.PutUint64(c.rec[0:], now)
	ne.PutUint64(c.rec[8:], cookie)
	ne.PutUint32(c.rec[20:], uint32(min((now-c.last)/1e6, 1<<31-1)))
	ne.PutUint32(c.rec[24:], x.netns)
	c.rec[30] = uint8(event.ConnSummary)
	for _, f := range c.typ.Fields {
		if f.Name == "start_ns" {
			ne.PutUint64(c.rec[f.Offset:], c.last)
		}
	}
	return true
}

func add(dst, v []byte, f trace.Field) {
	ne := binary.NativeEndian
	o := f.Offset
	if f.Size == 8 {
		ne.PutUint64(dst[o:], ne.Uint64(dst[o:])+ne.Uint64(v[o:]))
	} else {
		ne.PutUint32(dst[o:], ne.Uint32(dst[o:])+ne.Uint32(v[o:]))
	}
}

// sub puts a - b of field f into dst and says whether it is not zero. A
// figure below its previous total (a socket's, read while the kernel
// changed it: bpf/lib/summary.h says why that is not expected) is taken
// as not having moved, and a keeps the total, so that no record carries
// a wrapped difference.
func sub(dst, a, b []byte, f trace.Field) bool {
	ne := binary.NativeEndian
	o := f.Offset
	if f.Size == 8 {
		x, y := ne.Uint64(a[o:]), ne.Uint64(b[o:])
		if x < y {
			ne.PutUint64(a[o:], y)
			x = y
		}
		ne.PutUint64(dst[o:], x-y)
		return x != y
	}
	x, y := ne.Uint32(a[o:]), ne.Uint32(b[o:])
	if x < y {
		ne.PutUint32(a[o:], y)
		x = y
	}
	ne.PutUint32(dst[o:], x-y)
	return x != y
}
