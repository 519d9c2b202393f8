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
// and rotate.Sink's Room and AppendTallied): one pass over each record and
// no call per record. The drain has checked and counted each record on its
// way (a trace.Tally), so the sink does not walk the run again. The Sinks
// that look at each record (the daemon) take them one by one through
// Write.
type blockSink interface {
	Sink
	Room(max int) ([]byte, error)
	AppendTallied(recs []byte, t *trace.Tally) error
}

// runRoom is how much room the drain asks the block sink for at a time:
// the writer prefetches the room ahead of the records once per call, so
// this is also the step of that prefetch. Each time the room fills, its
// records are handed over (AppendTallied) and new room asked for: at
// 1 KiB, every ~25 records, that was a fifth of the drain's time in
// BenchmarkDrain. At 8 KiB (with the writer's prefetch 16 KiB ahead, so
// the room is still fetched a room's length before it is filled) two
// recorders on the same floods took 0.92 ± 0.06 (64 KiB messages) and
// 0.93 ± 0.04 (64-byte) of the CPU time per event of 1 KiB's (bench
// --cost --compare-with, 5 × 3 s each order; 4 KiB: 0.94, 0.94).
const runRoom = 8 << 10

// copyRun takes records from the head of events ring i as long as each is
// the oldest of all rings (its time ≤ limit, the oldest time among the
// other rings' heads) and committed. An event of a known type and size
// goes straight into the block sink's room, after the task record its
// struct mg_task calls for, if any (see handle); a lost record (whose
// count is added up) or a bad one, or every record when the sink takes
// them one by one, goes through handle. It returns how many records and
// ring bytes it took, and the time of the ring's next record when the run
// ended at one (more), rather than where the ring's view ends (a record
// being written, or nothing more yet).
// Discarded frames on the way are stepped over.
//
// This is the drain's hot path, one pass over records another CPU has
// just written: per record, a frame header, the time, the type byte and
// a copy.
func (r *recorder) copyRun(i int, limit uint64) (records, used int, next uint64, more bool, err error) {
	cur := &r.cur[i]
	view := cur.unread[cur.read:]
	off := 0
	copying := r.bs != nil
	copied := 0 // records copied; handle counts the others in r.total
	// The room and how much of it the run filled are kept here, and put
	// back in r.room only when something else may use the room: a store
	// of a slice into the heap is three words and a write barrier's check
	// per record.
	room, filled := r.room, len(r.room)
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
			t := binary.NativeEndian.Uint64(rec)
			if t > limit && copied+records > 0 {
				next, more = t, true
				break
			}
			typ := rec[30]
			size := r.copySizes[typ]
			if copying && size != 0 && n == size {
				if filled+n > cap(room) {
					r.room = room[:filled]
					err = r.openRoom()
					room, filled = r.room, len(r.room)
					if err != nil {
						break
					}
				}
				if filled+n <= cap(room) {
					// The common sizes in line, a word at a time: a
					// call to memmove for each record cost as much as
					// the rest of its copy. (An array assignment is no
					// help: the compiler cannot tell that a slice's
					// memory does not overlap another's, and calls
					// memmove.)
					dst := room[filled : filled+n]
					switch n {
					case 32:
						copy32((*[32]byte)(dst), (*[32]byte)(rec))
					case 40:
						d, s := (*[40]byte)(dst), (*[40]byte)(rec)
						copy32((*[32]byte)(d[:32]), (*[32]byte)(s[:32]))
						copy8((*[8]byte)(d[32:]), (*[8]byte)(s[32:]))
					case 48:
						d, s := (*[48]byte)(dst), (*[48]byte)(rec)
						copy32((*[32]byte)(d[:32]), (*[32]byte)(s[:32]))
						copy16((*[16]byte)(d[32:]), (*[16]byte)(s[32:]))
					default:
						copy(dst, rec)
					}
					filled += n
					r.tally.Add(typ, t)
					copied++
					off += step
					continue
				}
			} else if copying && size != 0 && n == size+r.taskSuffix {
				// Out of the loop above, which it would slow down for
				// every record.
				var ok bool
				if room, filled, ok, err = r.copyWithTask(room, filled, rec, size); ok {
					copied++
					off += step
					continue
				}
				if err != nil {
					break
				}
			}
		}
		r.room = room[:filled]
		err = r.appendRoom()
		room, filled = nil, 0
		if err != nil {
			break
		}
		if err = r.handle(rec); err != nil {
			break
		}
		records++
		off += step
	}
	r.room = room[:filled]
	r.total += uint64(copied)
	records += copied
	r.events[i].Skip(off)
	cur.read += off
	return records, off, next, more, err
}

// copyWithTask copies ring record rec, an event of size bytes followed by
// struct mg_task, into room after filled, preceded by the task record
// handle would write for it (a thread new to the trace, or changed), if
// any: copyRun's way for such records. It returns the room, opened anew
// if rec did not fit, how much of it is filled, and whether it copied
// rec; if not, rec goes through handle.
func (r *recorder) copyWithTask(room []byte, filled int, rec []byte, size int) ([]byte, int, bool, error) {
	need := size
	tid, k := taskOf(rec, size)
	task := tid != 0 && !r.knownTask(tid, k) // tid 0: see handle
	if task {
		need += r.taskSize
	}
	if filled+need > cap(room) {
		r.room = room[:filled]
		err := r.openRoom()
		room, filled = r.room, len(r.room)
		if err != nil || filled+need > cap(room) {
			return room, filled, false, err
		}
	}
	t := binary.NativeEndian.Uint64(rec)
	if task {
		b := room[filled : filled+r.taskSize]
		clear(b) // lent room holds what was there before
		putTask(b, rec, tid, k)
		r.rememberTask(tid, k)
		r.tally.Add(uint8(event.Task), t)
		filled += r.taskSize
	}
	copy(room[filled:filled+size], rec)
	r.tally.Add(rec[30], t)
	return room, filled + size, true, nil
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
	for typ, n := range r.tally.Counts() {
		r.counts[typ] += uint64(n)
	}
	err := r.bs.AppendTallied(room, &r.tally)
	r.tally.Reset()
	if err != nil {
		return r.stopOnWrite(err)
	}
	return nil
}

// copy32, copy16 and copy8 copy their size a word at a time, in line:
// see copyRun.
func copy32(dst, src *[32]byte) {
	a, b := binary.NativeEndian.Uint64(src[0:8]), binary.NativeEndian.Uint64(src[8:16])
	c, d := binary.NativeEndian.Uint64(src[16:24]), binary.NativeEndian.Uint64(src[24:32])
	binary.NativeEndian.PutUint64(dst[0:8], a)
	binary.NativeEndian.PutUint64(dst[8:16], b)
	binary.NativeEndian.PutUint64(dst[16:24], c)
	binary.NativeEndian.PutUint64(dst[24:32], d)
}

func copy16(dst, src *[16]byte) {
	a, b := binary.NativeEndian.Uint64(src[0:8]), binary.NativeEndian.Uint64(src[8:16])
	binary.NativeEndian.PutUint64(dst[0:8], a)
	binary.NativeEndian.PutUint64(dst[8:16], b)
}

func copy8(dst, src *[8]byte) {
	binary.NativeEndian.PutUint64(dst[:], binary.NativeEndian.Uint64(src[:]))
}
