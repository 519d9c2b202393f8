// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"encoding/binary"
	"time"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/live"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// The recorder hands the hub its records in drain order: the control
// ring's (conn_open, conn_close, lost) before older events of the per-CPU
// rings, each ring in its CPU's order. Streams are in time order, as
// users of LTTng or bpftrace expect, and an unprivileged user needs it to
// see its connections' conn_open and conn_close at all: a connection is
// the user's only from its first socket call, which in drain order comes
// after its conn_close. Two stages put it right:
//
//   - reorder: the hub keeps each batch's records back until the recorder
//     says (record.DrainedSink) that it wrote every record up to their time,
//     less reorderSlack, then processes them in time order (ties in drain
//     order). Root's streams, the connection table and figures see time
//     order, at most one hand-over later than drain order would.
//   - hold: a client that does not see all gets a connection's events only
//     once it owns the connection. An accepted connection has no owner
//     until the server's first socket call, after conn_open and the
//     handshake; the events of such a young connection are held, and every
//     later event for those clients with them (their streams stay in time
//     order), until its owner is known or holdFor after it was opened.
//     Held events are never offered to anyone who could not see them
//     without holding: the owner decides, when it is known.

// reorderSlack is how much older than the recorder's complete time a
// record may still come: a program between reserving and committing a
// record when its ring was read, and tcp_xmit timed by TCP's clock at the
// device (at most 1 ms before it is written, docs/EVENTS.md).
const reorderSlack = uint64(time.Millisecond)

// holdFor bounds how long the events of a connection without an owner are
// held for clients that do not see all: how long after conn_open a
// server's first socket call (the read of the request, mostly) may come
// for its user to still get the connection's first events.
const holdFor = uint64(500 * time.Millisecond)

// maxReorder and maxHeld bound the records kept back (each a few hundred
// bytes at most), and maxKeptBatches the batches they keep from the
// recorder (256 KiB each: a record timed far ahead, which no bug should
// make, would otherwise keep its batch each): past them the oldest go on,
// out of order if need be.
const (
	maxReorder     = 1 << 18
	maxHeld        = 1 << 16
	maxKeptBatches = 64
)

// pending is a record kept back by the reorder stage: it points into its
// batch, which goes back to the recorder once all of its records are out.
type pending struct {
	time uint64
	data []byte
	b    *batch
}

// reorder is the records kept back, in time order (ties in arrival
// order) from recs[head]. Drain order is nearly time order: the events
// rings are merged by time, and only the control ring's records, written
// first, and the records of the pass after are out of place, by a few
// records. So a record is appended and moved back past the younger ones
// (a search and one copy when they are many): BenchmarkHubNoSubscribers
// took ~30 ns per event more than drain order did (81-84 against 47-55),
// a heap ~90.
type reorder struct {
	recs []pending
	head int
	// opening: the conn_open records kept back, by connection, with
	// their time: an event of the connection timed before it (tcp_xmit
	// by TCP's clock) waits for it, since the hub needs the connection's
	// addresses first.
	opening map[uint64]uint64
	last    uint64 // the time of the last record passed on
	late    uint64 // records passed on after a younger one
}

func (q *reorder) len() int { return len(q.recs) - q.head }

func (q *reorder) push(p pending) {
	// Records passed on are cleared (they point to their batch) in bulk
	// here, not one by one as they go: that cost the hub ~10 ns per event.
	if q.head > 0 && q.head == len(q.recs) {
		clear(q.recs)
		q.recs, q.head = q.recs[:0], 0
	} else if q.head > 4096 && q.head > len(q.recs)/2 {
		n := copy(q.recs, q.recs[q.head:])
		clear(q.recs[n:])
		q.recs, q.head = q.recs[:n], 0
	}
	q.recs = append(q.recs, p)
	i := len(q.recs) - 1
	if i == q.head || q.recs[i-1].time <= p.time {
		return
	}
	// The first kept record younger than p, looked for from the end.
	j := i - 1
	for steps := 0; j > q.head && q.recs[j-1].time > p.time; j-- {
		if steps++; steps == 32 {
			lo, hi := q.head, j
			for lo < hi {
				m := int(uint(lo+hi) >> 1)
				if q.recs[m].time > p.time {
					hi = m
				} else {
					lo = m + 1
				}
			}
			j = lo
			break
		}
	}
	copy(q.recs[j+1:], q.recs[j:i])
	q.recs[j] = p
}

// add keeps batch b's records back (a thread new to the hub excepted).
func (h *hub) add(b *batch) {
	q := &h.order
	buf := b.buf
	for len(buf) >= trace.CommonSize {
		et := h.types[buf[30]]
		if et == nil || et.Size < trace.CommonSize || et.Size > len(buf) {
			h.badRecord(buf)
			break
		}
		rec := buf[:et.Size]
		buf = buf[et.Size:]
		t := binary.NativeEndian.Uint64(rec[0:8])
		switch typ := event.Type(rec[30]); {
		case typ == event.Task:
			// A thread new to the hub is named at once: the recorder names
			// it before the first of its events it writes, which may be
			// younger than others of the thread still in their ring. A
			// known thread's new name or ids (exec, setuid) apply from
			// their time on.
			if _, known := h.tasks[binary.NativeEndian.Uint32(rec[16:20])]; !known {
				h.record(trace.Record{Type: et, Data: rec})
				continue
			}
		case typ == event.ConnOpen:
			if q.opening == nil {
				q.opening = map[uint64]uint64{}
			}
			q.opening[binary.NativeEndian.Uint64(rec[8:16])] = t
		default:
			if len(q.opening) > 0 {
				if conn := binary.NativeEndian.Uint64(rec[8:16]); conn != 0 {
					if ot, ok := q.opening[conn]; ok && t < ot {
						t = ot
					}
				}
			}
		}
		b.pending++
		q.push(pending{time: t, data: rec, b: b})
	}
	if b.pending > 0 {
		b.kept = true
		h.keptBatches++
	}
	h.recycle(b)
}

// release processes, in time order, the records kept back up to time
// upTo, and as many more as the bound on kept records needs.
func (h *hub) release(upTo uint64) {
	q := &h.order
	for q.head < len(q.recs) && (q.recs[q.head].time <= upTo || q.len() > maxReorder || h.keptBatches > maxKeptBatches) {
		p := q.recs[q.head]
		q.head++
		if p.time < q.last {
			q.late++
		} else {
			q.last = p.time
		}
		if p.data[30] == uint8(event.ConnOpen) {
			conn := binary.NativeEndian.Uint64(p.data[8:16])
			if ot, ok := q.opening[conn]; ok && ot == p.time {
				delete(q.opening, conn)
			}
		}
		h.record(trace.Record{Type: h.types[p.data[30]], Data: p.data})
		p.b.pending--
		h.recycle(p.b)
	}
	h.releaseHeld(max(upTo, q.last), false)
}

// recycle gives a batch whose records are all out back to the recorder.
func (h *hub) recycle(b *batch) {
	if b.pending > 0 || !b.handed {
		return
	}
	if b.kept {
		b.kept = false
		h.keptBatches--
	}
	b.buf, b.handed = b.buf[:0], false
	select {
	case h.free <- b:
	default:
	}
}

// heldEvent is an event kept back for the clients that do not see all.
type heldEvent struct {
	typ  event.Type
	rec  trace.Record // its own copy
	tk   task
	c    *live.Conn
	time uint64
}

// decided says whether the owner of a held event's connection is known,
// or will not be in time.
func decided(c *live.Conn, now uint64) bool {
	return c == nil || c.Owner != nil || c.OpenNs == 0 || now >= c.OpenNs+holdFor
}

// dispatch hands an event to the subscriptions: at once to those that see
// all, and to the others once its connection's owner is decided (in time
// order with their other events).
func (h *hub) dispatch(typ event.Type, rec trace.Record, tk task, c *live.Conn) {
	set := h.subs.Load()
	if !set.users[typ] {
		h.offer(set.byType[typ], typ, rec, tk, c, true, true)
		return
	}
	if len(h.held) == 0 && decided(c, rec.Time()) {
		h.offer(set.byType[typ], typ, rec, tk, c, true, true)
		return
	}
	h.offer(set.byType[typ], typ, rec, tk, c, true, false)
	if len(h.held) >= maxHeld {
		h.releaseHeld(0, true)
	}
	data := make([]byte, len(rec.Data))
	copy(data, rec.Data)
	h.held = append(h.held, heldEvent{typ: typ, rec: trace.Record{Type: rec.Type, Data: data}, tk: tk, c: c, time: rec.Time()})
}

// releaseHeld passes on, to the clients that do not see all, the held
// events whose owner is decided at time now, oldest first; one is forced
// out when force is set.
func (h *hub) releaseHeld(now uint64, force bool) {
	n := 0
	for n < len(h.held) {
		e := &h.held[n]
		if !force && !decided(e.c, now) {
			break
		}
		force = false
		h.offer(h.subs.Load().byType[e.typ], e.typ, e.rec, e.tk, e.c, false, true)
		*e = heldEvent{}
		n++
	}
	if n > 0 {
		h.held = h.held[:copy(h.held, h.held[n:])]
	}
}
