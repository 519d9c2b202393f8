// SPDX-License-Identifier: Apache-2.0

package export

import (
	"errors"
	"fmt"
	"io"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// ReorderWindow is how many records of each trace a Merge holds to put
// them in time order. The recorder writes its rings in drain order, which
// is only nearly in time order: across CPUs, and the control ring
// (conn_open, conn_close, iface) is drained apart from the event rings, so
// its records come after events of earlier times. 1,024 records, as
// analyze's window, cover that. A window per trace (rather than one after
// the merge) is not diluted by the other traces' records.
// It is a power of two.
const ReorderWindow = 1024

// MergeOptions configure a Merge.
type MergeOptions struct {
	// Meta passes the metadata records (task, iface) on too; they are
	// always taken note of, for the events after them.
	Meta bool
	// FileOrder passes the records on as stored: each trace in file order,
	// the traces one after another, nothing held.
	FileOrder bool
	// Keep, if set, selects the records to pass on (source index, record);
	// the others are dropped as they are read, before the window.
	Keep func(src int, rec trace.Record) bool
}

// Merge reads several traces as one timeline: each trace put in time
// order through a window of ReorderWindow records, the traces merged by
// their time on a common clock (Timeline). Equal times keep the order of
// the sources, then of the file. Memory is bounded by the windows: a
// record further out of order than its window is passed on late (out of
// time order) and counted.
type Merge struct {
	ws        []*recordWindow
	tl        *Timeline
	fileOrder bool
	started   bool // start holds a time
	fixed     bool // start is final: the first windows are read
	start     int64
	last      int64
	emitted   bool
	late      uint64
	err       error
	// pending is the window whose front was passed on last: it refills at
	// the next call, so that the record passed on stays in place until then.
	pending *recordWindow
}

// Held is a record passed on by a Merge, valid until the next call of
// Next.
type Held struct {
	// Source is the index of the record's trace.
	Source int
	// Wall is the record's time on the common clock as wall-clock ns since
	// the Unix epoch (Timeline.Wall).
	Wall int64
	// Rec is the record; Rec.Data is a copy held by the Merge (Rec.Offset
	// is not kept).
	Rec trace.Record
	// Meta says the record is a task or iface record.
	Meta bool
	// Resolver is the record's trace's, as it stands after the records
	// read so far (which may be ahead of this one).
	Resolver *Resolver
	task     *task // nil: not described
}

// Task returns the pid and command of the record's thread as its trace's
// metadata stood where the record was read.
func (h *Held) Task() (pid uint32, comm string, ok bool) {
	if h.task == nil {
		return 0, "", false
	}
	return h.task.pid, h.task.comm, true
}

// NewMerge starts reading sources, placed on one clock by NewTimeline of
// their headers. It reads the first window of each trace; an error then
// is returned by Next after the records read before it.
func NewMerge(sources []TableSource, opts MergeOptions) *Merge {
	hs := make([]*trace.Header, len(sources))
	for i, src := range sources {
		hs[i] = src.Reader.Header()
	}
	m := &Merge{tl: NewTimeline(hs), fileOrder: opts.FileOrder}
	size := ReorderWindow
	if opts.FileOrder {
		size = 1
	}
	for i, src := range sources {
		rw := &recordWindow{index: i, src: src, h: hs[i], rs: NewResolver(hs[i]), ring: make([]Held, size),
			meta: opts.Meta, keep: opts.Keep, m: m}
		for j := range rw.ring {
			rw.ring[j].Source, rw.ring[j].Resolver = i, rw.rs
		}
		m.ws = append(m.ws, rw)
	}
	for _, rw := range m.ws {
		rw.fill()
	}
	m.fixed = true
	return m
}

// Timeline returns the clock the traces were placed on.
func (m *Merge) Timeline() *Timeline { return m.tl }

// Start returns the earliest time (Held.Wall) among the first window of
// every trace, metadata and records not kept included: the zero of a
// relative time column, the same whatever is selected.
func (m *Merge) Start() int64 { return m.start }

// Late returns how many records were passed on out of time order.
func (m *Merge) Late() uint64 { return m.late }

// Next returns the next record in time order, or io.EOF after the last.
// The first error reading a trace, named after it, comes once every record
// read before it (of every trace) has been passed on.
func (m *Merge) Next() (*Held, error) {
	if m.pending != nil {
		m.pending.fill()
		m.pending = nil
	}
	var next *recordWindow
	for _, rw := range m.ws {
		if rw.n == 0 {
			continue
		}
		if m.fileOrder {
			next = rw
			break
		}
		if next == nil || rw.front().Wall < next.front().Wall {
			next = rw
		}
	}
	if next == nil {
		if m.err != nil {
			err := m.err
			m.err = nil
			return nil, err
		}
		return nil, io.EOF
	}
	f := next.front()
	if !m.fileOrder {
		if m.emitted && f.Wall < m.last {
			m.late++
		}
		m.last, m.emitted = max(m.last, f.Wall), true
	}
	next.dropFront() // its slot is the next to fill: at the next call
	m.pending = next
	return f, nil
}

// recordWindow is one trace being read: its metadata observed as records
// are read, so every record is resolved against its own trace's tasks as
// they stood at that point of it, and up to len(ring) records held, sorted
// by time, in a ring whose buffers are reused: records are copied once,
// into their slot (the reader reuses its buffer).
type recordWindow struct {
	index   int
	src     TableSource
	h       *trace.Header
	rs      *Resolver
	ring    []Held
	head, n int
	done    bool
	meta    bool
	keep    func(int, trace.Record) bool
	m       *Merge
	// the thread of the latest record, looked up once for its run of
	// records (until a task record may change it)
	lastTID    uint32
	lastTask   *task
	lastCached bool
}

// at is the i-th record held; len(ring) is a power of two.
func (rw *recordWindow) at(i int) *Held { return &rw.ring[(rw.head+i)&(len(rw.ring)-1)] }

func (rw *recordWindow) front() *Held { return rw.at(0) }

func (rw *recordWindow) dropFront() {
	rw.head = (rw.head + 1) & (len(rw.ring) - 1)
	rw.n--
}

// fill reads records until the window is full or the trace ends, each
// inserted in time order after those of its time or earlier (stable: ties
// keep the file's order). A read error ends the trace and is kept for the
// Merge to return at the end.
func (rw *recordWindow) fill() {
	m := rw.m
	for !rw.done && rw.n < len(rw.ring) {
		rec, err := rw.src.Reader.Next()
		if err != nil {
			rw.done = true
			if !errors.Is(err, io.EOF) && m.err == nil {
				m.err = fmt.Errorf("%s: %w", rw.src.Name, err)
			}
			break
		}
		wall := m.tl.Wall(rw.index, rec.Time())
		if !m.fixed && (!m.started || wall < m.start) {
			m.start, m.started = wall, true
		}
		meta := rw.rs.Observe(rec)
		if meta {
			rw.lastCached = false
		}
		if meta && !rw.meta || rw.keep != nil && !rw.keep(rw.index, rec) {
			continue
		}
		slot := rw.at(rw.n)
		slot.Wall, slot.Rec.Type, slot.Meta = wall, rec.Type, meta
		slot.Rec.Data = append(slot.Rec.Data[:0], rec.Data...)
		if tid := rec.TID(); !rw.lastCached || tid != rw.lastTID {
			rw.lastTask, rw.lastTID, rw.lastCached = rw.rs.task(tid), tid, true
		}
		slot.task = rw.lastTask
		for i := rw.n; i > 0 && rw.at(i-1).Wall > rw.at(i).Wall; i-- {
			a, b := rw.at(i-1), rw.at(i)
			*a, *b = *b, *a
		}
		rw.n++
	}
}
