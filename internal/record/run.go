// SPDX-License-Identifier: Apache-2.0

package record

import (
	"encoding/binary"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/ring"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// blockSink is a Sink whose records the drain may copy in itself, many at
// a time, straight from a ring into the block being built (trace.Writer's
// Room and Append): one pass over each record and no call per record. The
// Sinks that look at each record (rotation, the daemon) take them one by
// one through Write.
type blockSink interface {
	Sink
	Room(max int) ([]byte, error)
	Append(recs []byte) error
}

// runRoom is how much room the drain asks the block sink for at a time:
// the writer prefetches the room ahead of the records once per call, so
// this is also the step of that prefetch.
const runRoom = 1 << 10

// copyRun takes records from the head of events ring i as long as each is
// the oldest of all rings (its time ≤ limit, the oldest time among the
// other rings' heads) and committed. A record that needs nothing but its
// copy (no struct mg_task after it, which may call for a task record
// before it; not a lost record, whose count is added up; of a known type
// and size) goes straight into the block sink's room; any other, or every
// record when the sink takes them one by one, goes through handle. It
// returns how many records and ring bytes it took, and the time of the
// ring's next record when the run ended at one (more), rather than where
// the ring's view ends (a record being written, or nothing more yet).
// Discarded frames on the way are stepped over.
//
// This is the drain's hot path, one pass over records another CPU has
// just written: per record, a frame header, the time, the type byte and
// a copy.
func (r *recorder) copyRun(i int, limit uint64) (records, used int, next uint64, more bool, err error) {
	cur := &r.cur[i]
	view := cur.unread
	off := 0
	copying := r.bs != nil
	copied := 0 // records copied; handle counts the others in r.total
	for {
		n, step, st := ring.Frame(view[off:])
		if st == ring.Busy {
			break
		}
		if st == ring.Empty {
			off += step
			continue
		}
		rec := view[off+ring.FrameHeaderSize : off+ring.FrameHeaderSize+n]
		if n >= trace.CommonSize {
			// The first record goes whatever its time: the drain's heap
			// chose this ring as holding the oldest, and a run that took
			// nothing would be asked again forever.
			if t := binary.NativeEndian.Uint64(rec); t > limit && copied+records > 0 {
				next, more = t, true
				break
			}
			if typ := rec[30]; copying && n == r.sizes[typ] && typ != uint8(event.Lost) {
				if len(r.room)+n > cap(r.room) {
					if err = r.openRoom(); err != nil {
						break
					}
				}
				if room := r.room; len(room)+n <= cap(room) {
					r.room = append(room, rec...)
					r.counts[typ]++
					copied++
					off += step
					continue
				}
			}
		}
		if err = r.appendRoom(); err != nil {
			break
		}
		if err = r.handle(rec); err != nil {
			break
		}
		records++
		off += step
	}
	r.total += uint64(copied)
	records += copied
	r.events[i].Skip(off)
	cur.unread = view[off:]
	return records, off, next, more, err
}

// openRoom hands the records in the room to the block sink and asks it for
// new room.
func (r *recorder) openRoom() error {
	if err := r.appendRoom(); err != nil {
		return err
	}
	room, err := r.bs.Room(runRoom)
	if err != nil {
		return r.stopOnWrite(err)
	}
	r.room = room
	return nil
}

// appendRoom hands the records in the room to the block sink and closes
// the room: nothing else may be written to the sink while it is open.
func (r *recorder) appendRoom() error {
	if r.room == nil {
		return nil
	}
	room := r.room
	r.room = nil
	if err := r.bs.Append(room); err != nil {
		return r.stopOnWrite(err)
	}
	return nil
}
