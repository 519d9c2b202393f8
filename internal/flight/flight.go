// SPDX-License-Identifier: Apache-2.0

// Package flight is magnet's flight recorder (`magnet record --flight`),
// LTTng's snapshot mode for network events: the recording's records are
// kept in memory, in chunks covering at least the last Window, and nothing
// is written until a trigger (a retransmission, a drop that loses a
// connection's data, a smoothed RTT above a bound, a signal or a call).
// Then a trace file is written with the Window before the trigger, and
// goes on After past it. Each file reads on its own: it starts with copies
// of the state still live (task, iface and conn_open records, flagged
// trace.FlagCarried, as a rotated file does), and its summary says which
// triggers made it, the window it holds and what of that window it lacks.
package flight

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/outfile"
	"github.com/magnet-tracer/magnet/internal/rotate"
	"github.com/magnet-tracer/magnet/internal/streamfile"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// ExtraKey is the key of the flight recorder's figures in a file's header
// extra (Window) and summary extra (Result).
const ExtraKey = "flight"

// DefaultMemory bounds the records kept in memory: at the ~40 bytes an
// event takes in a trace, 30 s of 200,000 events a second.
const DefaultMemory = 256 << 20

// chunkBytes is the unit in which memory is kept and reused.
const chunkBytes = 1 << 20

// pageBytes is the stride at which New touches the arena so that the
// kernel backs every page before the recording starts.
const pageBytes = 4096

// MinMemory is the least Options.Memory: a few chunks. Memory is used in
// whole chunks: a bound that is not a multiple of chunkBytes is rounded
// down.
const MinMemory = 4 * chunkBytes

// drainSlack is how long after a capture's end time it stays open: records
// made before that time may reach the recorder that much later (it reads
// the rings at least every second).
const drainSlack = 2 * time.Second

// Triggers are the conditions that write a file.
type Triggers struct {
	Retrans bool          // a tcp_retrans event
	Drop    bool          // a drop event whose reason loses data (analyze.DropLosesData: not teardown, not a duplicate)
	RTT     time.Duration // a tcp_state whose srtt is above this; 0 = none
}

// ParseTriggers parses --trigger: a comma-separated list of retrans, drop
// and rtt>DURATION.
func ParseTriggers(s string) (Triggers, error) {
	var t Triggers
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		switch {
		case part == "":
		case part == "retrans":
			t.Retrans = true
		case part == "drop":
			t.Drop = true
		case strings.HasPrefix(part, "rtt>"):
			d, err := time.ParseDuration(strings.TrimPrefix(part, "rtt>"))
			if err != nil || d <= 0 {
				return Triggers{}, fmt.Errorf("trigger %q: want rtt>DURATION, e.g. rtt>50ms", part)
			}
			t.RTT = d
		default:
			return Triggers{}, fmt.Errorf("unknown trigger %q (want retrans, drop, rtt>DURATION)", part)
		}
	}
	return t, nil
}

// String is the --trigger syntax of t.
func (t Triggers) String() string {
	var parts []string
	if t.Retrans {
		parts = append(parts, "retrans")
	}
	if t.Drop {
		parts = append(parts, "drop")
	}
	if t.RTT > 0 {
		parts = append(parts, "rtt>"+t.RTT.String())
	}
	return strings.Join(parts, ",")
}

// Groups are the event groups the triggers need recorded.
func (t Triggers) Groups() event.Group {
	var g event.Group
	if t.Retrans {
		g |= event.GroupTCP
	}
	if t.Drop {
		g |= event.GroupDrop
	}
	if t.RTT > 0 {
		g |= event.GroupTCPState
	}
	return g
}

// Options configure a Sink.
type Options struct {
	// Output names the files: x.mgt gives x-<UTC time of the trigger>.mgt,
	// never one that exists.
	Output string
	// Name, if set, names the files instead of Output: the path of a file
	// started at now (a rotation pattern's, so that a collect spool's
	// shipper takes it). It gets "-N" before its extension when the path
	// exists or Taken says it was used.
	Name func(now time.Time) string
	// Taken, if set, says whether a path was used before (even if it is
	// gone since: shipped); OnStart is called with each path taken.
	Taken   func(path string) bool
	OnStart func(path string)
	// Window is how much before a trigger a file holds.
	Window time.Duration
	// After is how long past the last trigger it goes on.
	After time.Duration
	// Memory bounds the bytes of records kept; 0 = DefaultMemory. It is
	// all taken, and written to, when the Sink is made: between triggers
	// the recorder then only copies records into memory the kernel already
	// backs, and never takes a page fault for a new chunk.
	Memory int64
	// Triggers are the conditions in the records that write a file;
	// Trigger adds others (signals, calls).
	Triggers Triggers
	// Log, if set, gets a line for each file started and finished.
	Log func(format string, args ...any)
	// OnFinish, if set, is called with each file's path once it is closed.
	OnFinish func(path string)
	// Now is the wall clock (tests); nil means time.Now.
	Now func() time.Time
}

// chunk is a run of records in drain order.
type chunk struct {
	buf         []byte
	first, last uint64 // smallest and largest record time
	records     uint64
}

// Window is what a file's header says of the flight recording.
type Window struct {
	WindowNs int64  `json:"window_ns"`
	AfterNs  int64  `json:"after_ns"`
	Triggers string `json:"triggers"`
}

// Result is what a file's summary says of its capture: the triggers that
// made it and the interval it holds. The file holds every record the
// recorder drained with a time in [FromNs, ToNs) (the last trigger's time
// + After), the state live at FromNs (carried records), and the records
// past ToNs drained before it closed. What of the asked window it lacks: memory
// evictions (EvictedRecords, in chunks that ended after AskedFromNs; the
// window then starts after them) and the kernel's losses, in the file as
// lost records (Summary.Lost).
type Result struct {
	// Triggers are the first maxFired triggers of the file; Fired counts
	// them all by reason.
	Triggers        []Fired           `json:"triggers"`
	Fired           map[string]uint64 `json:"fired"`
	AskedFromNs     uint64            `json:"asked_from_ns"`
	FromNs          uint64            `json:"from_ns"`
	ToNs            uint64            `json:"to_ns"`
	Carried         uint64            `json:"carried"`
	EvictedRecords  uint64            `json:"evicted_records"`
	EvictedToNs     uint64            `json:"evicted_to_ns,omitempty"`
	RecordsInWindow uint64            `json:"records"`
}

// Fired is one trigger.
type Fired struct {
	Reason string `json:"reason"`  // retrans, drop, rtt, signal, api, ...
	TimeNs uint64 `json:"time_ns"` // CLOCK_MONOTONIC
	Conn   uint64 `json:"conn,omitempty"`
}

// maxFired is how many triggers a file's result lists one by one: a
// retransmission trigger fires at every one.
const maxFired = 16

// capture is a file being written.
type capture struct {
	path   string
	file   *os.File
	sf     *streamfile.Writer
	w      *trace.Writer
	res    Result
	counts map[string]uint64
	lost   uint64
}

// Sink is a record.Sink that keeps records in memory and writes files on
// triggers. It is not safe for concurrent use, except Trigger.
type Sink struct {
	opts  Options
	hdr   *trace.Header
	sizes [256]int
	names [256]string
	// watched are the types observe looks at: state a file repeats, and
	// those the triggers test.
	watched [256]bool
	srtt    trace.Field // tcp_state's srtt_us
	reason  trace.Field // drop's reason
	// harmless are the drop reasons (by value) that lose no data.
	harmless map[uint32]bool
	// arena is all the memory records are kept in, allocated and
	// touched once; each chunk is a slot of it, reused in place, and so
	// are the chunks themselves: keeping records allocates nothing.
	arena  []byte
	chunks []*chunk // oldest first; the last is being filled
	free   []*chunk // the slots not in chunks
	newest uint64
	// The state a file repeats, by key; a conn_close removes its conn
	// once it is older than any window.
	tasks  map[uint32][]byte
	ifaces map[uint64][]byte
	conns  map[uint64][]byte
	closed map[uint64]uint64 // conn → time of its conn_close
	// evicted: chunks dropped for memory before they left the window.
	evicted []chunkMark
	cap     *capture
	taken   map[string]bool
	bytes   int64 // of finished files
	err     error

	mu      sync.Mutex
	pending []Fired  // from Trigger
	files   []string // written so far
}

type chunkMark struct {
	last    uint64
	records uint64
}

// New returns a flight recorder Sink for a recording whose header is hdr.
func New(hdr *trace.Header, opts Options) (*Sink, error) {
	if opts.Window <= 0 {
		return nil, errors.New("flight: the window must be positive")
	}
	if opts.After < 0 {
		return nil, errors.New("flight: the time after a trigger must not be negative")
	}
	if opts.Memory == 0 {
		opts.Memory = DefaultMemory
	}
	if opts.Memory < MinMemory {
		return nil, fmt.Errorf("flight: memory %d: want at least %d bytes", opts.Memory, MinMemory)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	s := &Sink{opts: opts, hdr: hdr, tasks: map[uint32][]byte{}, ifaces: map[uint64][]byte{},
		conns: map[uint64][]byte{}, closed: map[uint64]uint64{}, taken: map[string]bool{}}
	// The arena is one allocation: the garbage collector does not scan
	// it (it holds no pointers) and it lives as long as the Sink. Writing
	// a byte on each page makes the kernel back it now rather than at a
	// first touch in the middle of a recording.
	s.arena = make([]byte, opts.Memory/chunkBytes*chunkBytes)
	for off := 0; off < len(s.arena); off += pageBytes {
		s.arena[off] = 1
	}
	s.chunks = make([]*chunk, 0, len(s.arena)/chunkBytes)
	for off := len(s.arena); off > 0; off -= chunkBytes {
		s.free = append(s.free, &chunk{buf: s.arena[off-chunkBytes : off-chunkBytes : off]})
	}
	for _, t := range hdr.Types {
		s.sizes[t.ID] = t.Size
		s.names[t.ID] = t.Name
	}
	for _, t := range []event.Type{event.Task, event.Iface, event.ConnOpen, event.ConnClose} {
		s.watched[t] = true
	}
	s.watched[event.TCPRetrans] = opts.Triggers.Retrans
	s.watched[event.Drop] = opts.Triggers.Drop
	s.watched[event.TCPState] = opts.Triggers.RTT > 0
	if opts.Triggers.Drop {
		dt := hdr.TypeByID(uint8(event.Drop))
		if dt == nil {
			return nil, errors.New("flight: the trace has no drop type for the drop trigger")
		}
		if f, ok := dt.Field("reason"); ok && f.Size == 4 {
			s.reason = f
		} else {
			return nil, errors.New("flight: drop has no reason")
		}
		// Reasons as the running kernel names them (the header's
		// enums); one it does not name counts as losing data.
		s.harmless = map[uint32]bool{}
		for v, name := range hdr.Enums["drop_reason"] {
			n, err := strconv.ParseUint(v, 10, 32)
			if err == nil && !analyze.DropLosesData(name) {
				s.harmless[uint32(n)] = true
			}
		}
	}
	if opts.Triggers.RTT > 0 {
		st := hdr.TypeByID(uint8(event.TCPState))
		if st == nil {
			return nil, errors.New("flight: the trace has no tcp_state type for rtt>")
		}
		for _, f := range st.Fields {
			if f.Name == "srtt_us" {
				s.srtt = f
			}
		}
		if s.srtt.Size != 4 {
			return nil, errors.New("flight: tcp_state has no srtt_us")
		}
	}
	return s, nil
}

// Files returns the files written so far; safe from any goroutine.
func (s *Sink) Files() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.files)
}

// Trigger asks for a file as if a trigger fired now (a signal, an API
// call); safe from any goroutine. The recorder's next write or flush (at
// least every second) acts on it.
func (s *Sink) Trigger(reason string) {
	s.mu.Lock()
	s.pending = append(s.pending, Fired{Reason: reason, TimeNs: monotonic()})
	s.mu.Unlock()
}

func monotonic() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// Bytes is what the files written so far hold.
func (s *Sink) Bytes() int64 {
	n := s.bytes
	if s.cap != nil {
		n += s.cap.w.Bytes()
	}
	return n
}

// Write takes one record.
func (s *Sink) Write(rec []byte) error {
	if s.err != nil {
		return s.err
	}
	if len(rec) > chunkBytes {
		return fmt.Errorf("flight: a record of %d bytes is more than a chunk (%d)", len(rec), chunkBytes)
	}
	c := s.room(len(rec))
	off := len(c.buf)
	c.buf = append(c.buf, rec...)
	return s.took(c, c.buf[off:])
}

// Room lends room for records the caller copies in itself; AppendTallied
// takes them.
func (s *Sink) Room(max int) ([]byte, error) {
	if s.err != nil {
		return nil, s.err
	}
	if max > chunkBytes {
		return nil, fmt.Errorf("flight: room for %d bytes asked: more than a chunk (%d)", max, chunkBytes)
	}
	c := s.room(max)
	n := len(c.buf)
	return c.buf[n:n:min(n+max, cap(c.buf))], nil
}

// AppendTallied takes the records the caller put in the room Room lent.
func (s *Sink) AppendTallied(recs []byte, t *trace.Tally) error {
	if s.err != nil {
		return s.err
	}
	if len(recs) == 0 {
		return nil
	}
	c := s.chunks[len(s.chunks)-1]
	n := len(c.buf)
	if n+len(recs) > cap(c.buf) || &c.buf[:n+1][n] != &recs[0] {
		return errors.New("flight: records not in the room lent")
	}
	c.buf = c.buf[:n+len(recs)]
	if s.cap != nil {
		return s.took(c, c.buf[n:])
	}
	// Between triggers the chunk takes the run's times and count from the
	// tally, and the run is walked only if it holds a record that keeps
	// state or may fire a trigger, and then only those are looked at.
	if c.records == 0 || t.First() < c.first {
		c.first = t.First()
	}
	c.last = max(c.last, t.Last())
	c.records += uint64(t.Records())
	s.newest = max(s.newest, t.Last())
	walk := false
	for id := range t.Counts() {
		walk = walk || s.watched[id]
	}
	if !walk {
		return nil
	}
	var fired []Fired
	for off := 0; off < len(recs); {
		typ := recs[off+30]
		size := s.sizes[typ]
		if size == 0 || off+size > len(recs) {
			return fmt.Errorf("flight: a record of type %d that the dictionary does not fit", typ)
		}
		if s.watched[typ] {
			rec := recs[off : off+size]
			if f, ok := s.observe(rec, binary.NativeEndian.Uint64(rec)); ok {
				fired = append(fired, f)
			}
		}
		off += size
	}
	return s.fireAll(fired)
}

// room returns the chunk to put n (at most chunkBytes) more bytes in,
// starting a new one in a free slot if the last is full. With no slot
// free, the oldest chunk's is taken although it is still in the window
// (memory is over its bound: the window falls short, and files say so).
func (s *Sink) room(n int) *chunk {
	if len(s.chunks) > 0 {
		if c := s.chunks[len(s.chunks)-1]; cap(c.buf)-len(c.buf) >= n {
			return c
		}
	}
	s.evict()
	if len(s.free) == 0 {
		old := s.chunks[0]
		s.evicted = append(s.evicted, chunkMark{last: old.last, records: old.records})
		s.dropOldest()
	}
	k := len(s.free)
	c := s.free[k-1]
	s.free = s.free[:k-1]
	*c = chunk{buf: c.buf[:0]}
	s.chunks = append(s.chunks, c)
	return c
}

// dropOldest gives the oldest chunk's slot back. The chunks move down
// rather than being resliced so that appending never reallocates: at most
// a few hundred pointers, once per chunk filled.
func (s *Sink) dropOldest() {
	s.free = append(s.free, s.chunks[0])
	n := copy(s.chunks, s.chunks[1:])
	s.chunks = s.chunks[:n]
}

// evict gives back the slots of the oldest chunks while they are older
// than any window a trigger could ask for now. A chunk a capture still
// needs (none: a capture writes records as they come) is not special.
func (s *Sink) evict() {
	for len(s.chunks) > 1 {
		c := s.chunks[0]
		old := s.newest > uint64(s.opts.Window)+uint64(drainSlack) && c.last < s.newest-uint64(s.opts.Window)-uint64(drainSlack)
		if !old {
			break
		}
		s.dropOldest()
	}
	// Marks older than any window are of no use any more.
	for len(s.evicted) > 0 && s.newest > uint64(s.opts.Window) && s.evicted[0].last < s.newest-uint64(s.opts.Window) {
		s.evicted = s.evicted[1:]
	}
}

// took handles records just added to chunk c: their times and counts,
// the live state, the capture being written, and the triggers.
func (s *Sink) took(c *chunk, recs []byte) error {
	var fired []Fired
	for off := 0; off < len(recs); {
		size := s.sizes[recs[off+30]]
		if size == 0 || off+size > len(recs) {
			return fmt.Errorf("flight: a record of type %d that the dictionary does not fit", recs[off+30])
		}
		rec := recs[off : off+size]
		off += size
		ts := binary.NativeEndian.Uint64(rec)
		if c.records == 0 || ts < c.first {
			c.first = ts
		}
		c.last = max(c.last, ts)
		c.records++
		s.newest = max(s.newest, ts)
		if f, ok := s.observe(rec, ts); ok {
			fired = append(fired, f)
		}
		if s.cap != nil {
			if err := s.capture(rec, ts); err != nil {
				return err
			}
		}
	}
	return s.fireAll(fired)
}

func (s *Sink) fireAll(fired []Fired) error {
	for _, f := range fired {
		if err := s.fire(f); err != nil {
			return err
		}
	}
	return nil
}

// observe keeps the state a file must repeat and says whether rec fires a
// trigger.
func (s *Sink) observe(rec []byte, ts uint64) (Fired, bool) {
	ne := binary.NativeEndian
	conn := ne.Uint64(rec[8:16])
	switch event.Type(rec[30]) {
	case event.Task:
		tid := ne.Uint32(rec[16:20])
		s.tasks[tid] = keep(s.tasks[tid], rec)
	case event.Iface:
		key := uint64(ne.Uint32(rec[24:28]))<<32 | uint64(ne.Uint32(rec[32:36]))
		s.ifaces[key] = keep(s.ifaces[key], rec)
	case event.ConnOpen:
		if _, ok := s.conns[conn]; !ok || rec[31]&0x01 != 0 {
			s.conns[conn] = slices.Clone(rec)
		}
		delete(s.closed, conn)
	case event.ConnClose:
		s.closed[conn] = ts
	case event.TCPRetrans:
		if s.opts.Triggers.Retrans {
			return Fired{Reason: "retrans", TimeNs: ts, Conn: conn}, true
		}
	case event.Drop:
		if s.opts.Triggers.Drop && !s.harmless[ne.Uint32(rec[s.reason.Offset:])] {
			return Fired{Reason: "drop", TimeNs: ts, Conn: conn}, true
		}
	case event.TCPState:
		if s.opts.Triggers.RTT > 0 && uint64(ne.Uint32(rec[s.srtt.Offset:]))*1000 > uint64(s.opts.Triggers.RTT) {
			return Fired{Reason: "rtt", TimeNs: ts, Conn: conn}, true
		}
	}
	return Fired{}, false
}

func keep(old, rec []byte) []byte {
	if cap(old) >= len(rec) {
		return append(old[:0], rec...)
	}
	return slices.Clone(rec)
}

// fire acts on a trigger: a capture being written goes on to the
// trigger's time + After; otherwise a new file starts.
func (s *Sink) fire(f Fired) error {
	if s.cap != nil {
		if len(s.cap.res.Triggers) < maxFired {
			s.cap.res.Triggers = append(s.cap.res.Triggers, f)
		}
		s.cap.res.Fired[f.Reason]++
		s.cap.res.ToNs = max(s.cap.res.ToNs, f.TimeNs+uint64(s.opts.After))
		return nil
	}
	return s.start(f)
}

// start writes a new file: header, the live state, then every record kept
// from the window before f, and leaves it open for what comes until
// f.TimeNs + After.
func (s *Sink) start(f Fired) error {
	asked := uint64(0)
	if f.TimeNs > uint64(s.opts.Window) {
		asked = f.TimeNs - uint64(s.opts.Window)
	}
	res := Result{Triggers: []Fired{f}, Fired: map[string]uint64{f.Reason: 1}, AskedFromNs: asked, FromNs: asked, ToNs: f.TimeNs + uint64(s.opts.After)}
	for _, m := range s.evicted {
		if m.last >= asked {
			res.EvictedRecords += m.records
			res.EvictedToNs = max(res.EvictedToNs, m.last)
			res.FromNs = max(res.FromNs, m.last+1)
		}
	}
	now := s.opts.Now()
	path := s.nextPath(now)
	s.taken[path] = true
	if s.opts.OnStart != nil {
		s.opts.OnStart(path)
	}
	file, err := outfile.Create(path, outfile.Options{Lock: true})
	if err != nil {
		return s.fail(fmt.Errorf("flight: %w", err))
	}
	hdr := *s.hdr
	hdr.StartWallNs = now.UnixNano()
	hdr.Extra = maps.Clone(s.hdr.Extra)
	if hdr.Extra == nil {
		hdr.Extra = map[string]any{}
	}
	hdr.Extra[ExtraKey] = Window{WindowNs: int64(s.opts.Window), AfterNs: int64(s.opts.After), Triggers: s.opts.Triggers.String()}
	sf := streamfile.New(file, streamfile.Options{})
	w, err := trace.NewWriter(sf, &hdr, trace.WriterOptions{})
	if err != nil {
		sf.Close()
		file.Close()
		return s.fail(fmt.Errorf("flight: start %s: %w", path, err))
	}
	s.cap = &capture{path: path, file: file, sf: sf, w: w, res: res, counts: map[string]uint64{}}
	for _, rec := range s.carried(res.FromNs) {
		if err := w.Write(rec); err != nil {
			return s.fail(fmt.Errorf("flight: write %s: %w", path, err))
		}
		s.cap.res.Carried++
	}
	s.opts.Log("trigger %s: writing %s (%s before it)", f.Reason, path, s.opts.Window)
	for _, c := range s.chunks {
		if c.records == 0 || c.last < res.FromNs {
			continue
		}
		for off := 0; off < len(c.buf); {
			rec := c.buf[off : off+s.sizes[c.buf[off+30]]]
			off += len(rec)
			if err := s.capture(rec, binary.NativeEndian.Uint64(rec)); err != nil {
				return err
			}
		}
	}
	return nil
}

// capture writes rec to the file being written unless it is older than
// the file's window. Records past its end (ToNs) are written too while the
// file is open: a later trigger may move the end past them, and the drain
// gives records of different CPUs only nearly in time order.
func (s *Sink) capture(rec []byte, ts uint64) error {
	c := s.cap
	if ts < c.res.FromNs {
		return nil
	}
	if err := c.w.Write(rec); err != nil {
		return s.fail(fmt.Errorf("flight: write %s: %w", c.path, err))
	}
	name := s.names[rec[30]]
	c.counts[name]++
	c.res.RecordsInWindow++
	if event.Type(rec[30]) == event.Lost {
		c.lost += uint64(binary.NativeEndian.Uint32(rec[48:52]))
	}
	return nil
}

// carried returns copies of the state live at from and announced before
// it (what is announced later is in the window): tasks, interfaces, and
// the connections not closed before it, flagged, oldest first.
func (s *Sink) carried(from uint64) [][]byte {
	var desc, conns [][]byte
	before := func(r []byte) bool { return binary.NativeEndian.Uint64(r) < from }
	for _, r := range s.tasks {
		if before(r) {
			desc = append(desc, r)
		}
	}
	for _, r := range s.ifaces {
		if before(r) {
			desc = append(desc, r)
		}
	}
	for conn, r := range s.conns {
		if t, ok := s.closed[conn]; ok && t < from || !before(r) {
			continue
		}
		conns = append(conns, r)
	}
	return trace.Carried(desc, conns)
}

// nextPath names the file of a trigger at now: Output's stem, the UTC
// time to the millisecond, its extension; never one that exists.
func (s *Sink) nextPath(now time.Time) string {
	taken := func(p string) bool { return s.taken[p] || s.opts.Taken != nil && s.opts.Taken(p) }
	if s.opts.Name != nil {
		return rotate.Unique(s.opts.Name(now), taken)
	}
	ext := filepath.Ext(s.opts.Output)
	if ext == "" {
		ext = ".mgt"
	}
	stem := strings.TrimSuffix(s.opts.Output, filepath.Ext(s.opts.Output))
	p := stem + "-" + now.UTC().Format("20060102T150405.000Z") + ext
	return rotate.Unique(p, taken)
}

// Flush acts on triggers asked for by Trigger, ends a capture whose time
// is over (and whose records have had time to be drained), and forgets
// closed connections older than any window.
func (s *Sink) Flush() error {
	if s.err != nil {
		return s.err
	}
	s.mu.Lock()
	pending := s.pending
	s.pending = nil
	s.mu.Unlock()
	for _, f := range pending {
		if err := s.fire(f); err != nil {
			return err
		}
	}
	now := monotonic()
	if s.cap != nil && now > s.cap.res.ToNs+uint64(drainSlack) {
		if err := s.finish(nil); err != nil {
			return err
		}
	}
	if s.cap != nil {
		if err := s.cap.w.Flush(); err != nil {
			return s.fail(fmt.Errorf("flight: write %s: %w", s.cap.path, err))
		}
	}
	if now > uint64(s.opts.Window+drainSlack) {
		for conn, t := range s.closed {
			if t < now-uint64(s.opts.Window+drainSlack) {
				delete(s.closed, conn)
				delete(s.conns, conn)
			}
		}
	}
	s.evict()
	return nil
}

// finish ends the file being written. sum, if not nil, is the recording's
// (it ended): its figures beyond this file's are kept in its extra.
func (s *Sink) finish(sum *trace.Summary) error {
	c := s.cap
	s.cap = nil
	out := trace.Summary{EndWallNs: s.opts.Now().UnixNano(), Events: c.counts, Lost: c.lost}
	out.Extra = map[string]any{ExtraKey: c.res}
	if sum != nil {
		// The recording ended before the capture's time did: the file
		// holds what was drained until then.
		c.res.ToNs = min(c.res.ToNs, s.newest+1)
		out.Extra[ExtraKey] = c.res
		out.Extra["recording"] = map[string]any{"events": sum.Events, "lost": sum.Lost, "extra": sum.Extra}
	}
	err := c.w.Close(&out)
	if err == nil {
		err = c.sf.Close()
	}
	if err == nil {
		err = c.file.Sync()
	}
	s.bytes += c.w.Bytes()
	if cerr := c.file.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return s.fail(fmt.Errorf("flight: end %s: %w", c.path, err))
	}
	s.mu.Lock()
	s.files = append(s.files, c.path)
	s.mu.Unlock()
	s.opts.Log("wrote %s: %d records in [%s, %s] around %v trigger(s), %d evicted from memory", c.path,
		c.res.RecordsInWindow, strconv.FormatUint(c.res.FromNs, 10), strconv.FormatUint(c.res.ToNs, 10), c.res.Fired, c.res.EvictedRecords)
	if s.opts.OnFinish != nil {
		s.opts.OnFinish(c.path)
	}
	return nil
}

// Close ends the recording: a trigger asked for and not yet acted on is,
// and a file being written is ended with what was drained.
func (s *Sink) Close(sum *trace.Summary) error {
	if s.err != nil {
		return s.err
	}
	s.mu.Lock()
	pending := s.pending
	s.pending = nil
	s.mu.Unlock()
	for _, f := range pending {
		if err := s.fire(f); err != nil {
			return err
		}
	}
	if s.cap != nil {
		if err := s.finish(sum); err != nil {
			return err
		}
	}
	s.err = errClosed
	s.chunks, s.free, s.arena = nil, nil, nil
	return nil
}

var errClosed = errors.New("flight: sink is closed")

// fail ends the file being written as far as it goes and makes every
// later call fail with err.
func (s *Sink) fail(err error) error {
	if s.cap != nil {
		s.cap.sf.Close()
		s.cap.file.Close()
		s.cap = nil
	}
	s.err = err
	return err
}
