// SPDX-License-Identifier: Apache-2.0

// Package rotate writes a recording as a chain of trace files, switching
// to a new file at a record boundary after an interval or a size, so that no
// event is lost or written twice at the seam. Each file reads on its own:
// it starts with copies of the state still live (the task, iface and
// conn_open records announced earlier), flagged trace.FlagCarried and
// counted in the header's rotation.carried. Headers and summaries link the
// files (trace.Rotation, trace.RotationEnd), and trace.OpenChain reads them
// back as one timeline.
//
// The file being written is held under an exclusive flock(2); every other
// file of the pattern is finished (complete, or cut short by a crash of its
// recorder) and may be shipped or deleted. Old files go when there are more
// than Keep of them, or when the files of the pattern outgrow Budget or the
// file system runs out of room.
package rotate

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/fault"
	"github.com/magnet-tracer/magnet/internal/outfile"
	"github.com/magnet-tracer/magnet/internal/streamfile"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// ErrDiskFull means the file system of the output had no room left even
// after the policy dropped what it could: the recording must stop. The
// current file was closed properly before.
var ErrDiskFull = errors.New("disk full")

// Options configure a rotating Sink.
type Options struct {
	// Pattern names the files (see Pattern).
	Pattern *Pattern
	// Interval starts a new file after this long; 0 = never by time.
	Interval time.Duration
	// MaxBytes starts a new file before one would grow past this size;
	// 0 = never by size.
	MaxBytes int64
	// Keep is how many finished files of the pattern to keep; older ones
	// are deleted. 0 keeps them all.
	Keep int
	// Budget bounds the bytes of all files of the pattern, the current one
	// included: the oldest finished files are deleted to stay within it.
	// 0 = no bound.
	Budget int64
	// Extra, if set, returns bytes kept beside the pattern's files that
	// count against Budget too (the shipper's compressed staging copies).
	// Dropping a file must free its share: OnDrop is where to do it.
	Extra func() int64
	// DropOnFull deletes the oldest finished files when the file system
	// runs out of room; without it the recording stops (ErrDiskFull).
	DropOnFull bool
	// Taken, if set, reports names used before that must not be used
	// again although no file has them any more (the collect service's
	// spool remembers the names it shipped and deleted: a new recording
	// starting within the same second would otherwise reuse the last one's
	// name, and its file replace the other in the archive).
	Taken func(path string) bool
	// OnStart, if set, is called with the path of each file once it is in
	// place.
	OnStart func(path string)
	// OnFinish, if set, is called with the path of each file once it is
	// closed and unlocked.
	OnFinish func(path string)
	// OnDrop, if set, is called for each finished file deleted by Keep,
	// Budget or a full disk, with why ("keep", "budget", "disk full").
	OnDrop func(path string, size int64, why string)
	// Log, if set, receives one line for each file started, finished or
	// dropped.
	Log func(format string, args ...any)
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
	// BlockSize is passed to the trace writer (tests); 0 = the default.
	BlockSize int
}

// reserve is kept free on the file system so that the current file can
// always be ended properly: its last block and the end block.
const reserve = 2*trace.DefaultBlockSize + 64<<10

// Sink is a record.Sink that rotates. It is not safe for concurrent use,
// except for Bytes and Stats.
type Sink struct {
	opts    Options
	hdr     *trace.Header
	rot     trace.Rotation
	typeOf  [256]string
	sizes   [256]int
	watched [256]bool // types observe keeps state of; the others only move lastNs
	maxSize int       // the largest record type
	file    *os.File
	w       *trace.Writer
	path    string
	prev    string // the file finished last
	started time.Time
	// due is set when a flush found the interval over: the next record
	// starts the next file, so that a recording stopping right after the
	// interval does not end with a file holding none of its own records.
	due  bool
	used map[string]bool // names this recording has used

	own        uint64 // own records in the current file
	lostInFile uint64
	lostBefore uint64
	lastNs     uint64

	// The state a new file repeats, by key; a conn_close removes its conn.
	tasks  map[uint32][]byte
	ifaces map[uint64][]byte
	conns  map[uint64][]byte

	closedBytes atomic.Int64 // bytes of the files already finished
	files       atomic.Int64
	dropped     atomic.Int64
	droppedB    atomic.Int64
	err         error
}

// Stats is what a Sink did so far.
type Stats struct {
	Files        int64 // files started
	Dropped      int64 // finished files deleted by Keep, Budget or a full disk
	DroppedBytes int64
}

// New starts the first file of a rotated recording with header hdr.
func New(hdr *trace.Header, opts Options) (*Sink, error) {
	if opts.Pattern == nil {
		return nil, errors.New("rotate: no output pattern")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	if err := os.MkdirAll(opts.Pattern.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create output directory: %w", err)
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	s := &Sink{
		opts: opts, hdr: hdr, used: map[string]bool{},
		rot:   trace.Rotation{Recording: hex.EncodeToString(id[:]), RecordingStartWallNs: hdr.StartWallNs},
		tasks: map[uint32][]byte{}, ifaces: map[uint64][]byte{}, conns: map[uint64][]byte{},
	}
	for _, t := range hdr.Types {
		s.typeOf[t.ID] = t.Name
		s.sizes[t.ID] = t.Size
		switch t.Name {
		case "task", "iface", "conn_open", "conn_close", "lost":
			s.watched[t.ID] = true
		}
		s.maxSize = max(s.maxSize, t.Size)
	}
	if err := s.start(opts.Now()); err != nil {
		return nil, err
	}
	return s, nil
}

// Path returns the file being written (after Close: the last one).
func (s *Sink) Path() string { return s.path }

// Previous returns the file finished last before the current one; "" while
// the first is being written.
func (s *Sink) Previous() string { return s.prev }

// Recording returns the id every file of this recording carries.
func (s *Sink) Recording() string { return s.rot.Recording }

// Stats returns the counts so far; safe from any goroutine.
func (s *Sink) Stats() Stats {
	return Stats{Files: s.files.Load(), Dropped: s.dropped.Load(), DroppedBytes: s.droppedB.Load()}
}

// Bytes returns the bytes written to every file of the recording.
func (s *Sink) Bytes() int64 {
	n := s.closedBytes.Load()
	if w := s.w; w != nil {
		n += w.Bytes()
	}
	return n
}

// Write takes one record; a file that reached MaxBytes is ended first.
func (s *Sink) Write(rec []byte) error {
	if s.err != nil {
		return s.err
	}
	if s.due {
		if err := s.rotate("interval"); err != nil {
			return err
		}
	}
	if s.opts.MaxBytes > 0 && s.own > 0 && s.w.Bytes()+int64(s.w.Buffered()+len(rec)+64) > s.opts.MaxBytes {
		if err := s.rotate("size"); err != nil {
			return err
		}
	}
	// A block write is coming: make sure there is room for it and for
	// ending the file after it.
	if s.w.Buffered()+len(rec) >= s.blockSize() {
		if err := s.room(int64(s.w.Buffered() + len(rec))); err != nil {
			return s.stop(err)
		}
	}
	if err := s.w.Write(rec); err != nil {
		s.err = err
		return err
	}
	s.own++
	s.observe(rec)
	return nil
}

// Room lends room in the current file's block for records the caller
// copies in itself, a run at a time (the recorder's drain, from the kernel's
// rings); Append takes them. It does what Write does before a record: the
// file is ended first when the interval is over or when it holds records
// and fewer than max bytes are left before MaxBytes, and the disk is
// checked for the block write that may follow. The room is at most the
// bytes left before MaxBytes, so a file ends no later than with Write.
func (s *Sink) Room(max int) ([]byte, error) {
	if s.err != nil {
		return nil, s.err
	}
	if s.due {
		if err := s.rotate("interval"); err != nil {
			return nil, err
		}
	}
	if s.opts.MaxBytes > 0 && s.own > 0 {
		left := s.opts.MaxBytes - s.w.Bytes() - int64(s.w.Buffered()) - 64
		if left < int64(s.maxSize) {
			if err := s.rotate("size"); err != nil {
				return nil, err
			}
		} else {
			max = int(min(int64(max), left))
		}
	}
	if s.w.Buffered()+max >= s.blockSize() {
		if err := s.room(int64(s.w.Buffered() + max)); err != nil {
			return nil, s.stop(err)
		}
	}
	room, err := s.w.Room(max)
	if err != nil {
		s.err = err
		return nil, err
	}
	return room, nil
}

// AppendTallied takes the records copied into the room Room lent, which
// the caller has checked and counted in t (trace.Writer.AppendTallied).
// Only a run holding a type whose records a new file repeats, or a lost
// record, is walked record by record.
func (s *Sink) AppendTallied(recs []byte, t *trace.Tally) error {
	if s.err != nil {
		return s.err
	}
	if err := s.w.AppendTallied(recs, t); err != nil {
		return err // nothing was taken, the file goes on
	}
	s.own += uint64(t.Records())
	s.lastNs = max(s.lastNs, t.Last())
	for id := range t.Counts() {
		if s.watched[id] {
			for off := 0; off < len(recs); off += s.sizes[recs[off+30]] {
				s.observe(recs[off : off+s.sizes[recs[off+30]]])
			}
			break
		}
	}
	return nil
}

// Flush writes the current block out. Once Interval has passed, the next
// record starts a new file; a second Flush with no record in between (an
// idle recording) starts it itself. The recorder calls Flush every
// FlushEvery, also when no event comes, so time rotation does not wait for
// traffic — and a recording that ends right after the interval ends in the
// file that has its last records, not in a new empty one.
func (s *Sink) Flush() error {
	if s.err != nil {
		return s.err
	}
	if s.due {
		return s.rotate("interval")
	}
	if s.opts.Interval > 0 && s.opts.Now().Sub(s.started) >= s.opts.Interval {
		s.due = true
	}
	if b := s.w.Buffered(); b > 0 {
		if err := s.room(int64(b)); err != nil {
			return s.stop(err)
		}
	}
	if err := s.w.Flush(); err != nil {
		s.err = err
		return err
	}
	return nil
}

// Close ends the last file with the recording's summary.
func (s *Sink) Close(sum *trace.Summary) error {
	if s.err != nil {
		return s.err
	}
	if err := s.finish(sum, "end", ""); err != nil {
		s.err = err
		return err
	}
	s.err = errClosed
	return nil
}

var errClosed = errors.New("rotate: sink is closed")

func (s *Sink) blockSize() int {
	if s.opts.BlockSize > 0 {
		return s.opts.BlockSize
	}
	return trace.DefaultBlockSize
}

// observe keeps the state a new file must repeat.
func (s *Sink) observe(rec []byte) {
	ts := binary.NativeEndian.Uint64(rec[0:8])
	s.lastNs = max(s.lastNs, ts)
	switch s.typeOf[rec[30]] {
	case "task":
		s.tasks[binary.NativeEndian.Uint32(rec[16:20])] = keep(s.tasks[binary.NativeEndian.Uint32(rec[16:20])], rec)
	case "iface":
		key := uint64(binary.NativeEndian.Uint32(rec[24:28]))<<32 | uint64(binary.NativeEndian.Uint32(rec[32:36]))
		s.ifaces[key] = keep(s.ifaces[key], rec)
	case "conn_open":
		conn := binary.NativeEndian.Uint64(rec[8:16])
		// The first announcement is the one readers keep, unless a later
		// one updates its addresses (conn_open flag 0x01).
		if _, ok := s.conns[conn]; !ok || rec[31]&0x01 != 0 {
			s.conns[conn] = slices.Clone(rec)
		}
	case "conn_close":
		delete(s.conns, binary.NativeEndian.Uint64(rec[8:16]))
	case "lost":
		s.lostInFile += uint64(binary.NativeEndian.Uint32(rec[48:52]))
	}
}

// keep copies rec into old's storage when it fits.
func keep(old, rec []byte) []byte {
	if cap(old) >= len(rec) {
		return append(old[:0], rec...)
	}
	return slices.Clone(rec)
}

// rotate ends the current file and starts the next.
func (s *Sink) rotate(reason string) error {
	// Room for the next file's start, checked before this one names it
	// as its successor.
	if err := s.room(int64(s.w.Buffered()) + reserve); err != nil {
		return s.stop(err)
	}
	now := s.opts.Now()
	next := s.nextPath(now)
	if err := s.finish(nil, reason, filepath.Base(next)); err != nil {
		s.err = err
		return err
	}
	fault.At("rotate:after-finish")
	s.due = false
	s.prev = s.path
	s.rot.Seq++
	s.rot.Prev = filepath.Base(s.path)
	s.rot.FirstRecord += s.own
	s.rot.PrevLastNs = s.lastNs
	s.lostBefore += s.lostInFile
	s.own, s.lostInFile = 0, 0
	if err := s.startAt(now, next); err != nil {
		s.err = err
		return err
	}
	fault.At("rotate:after-rename")
	return nil
}

func (s *Sink) nextPath(now time.Time) string {
	return Unique(s.opts.Pattern.Expand(now, s.rot.Seq+1), s.taken)
}

func (s *Sink) start(now time.Time) error {
	return s.startAt(now, Unique(s.opts.Pattern.Expand(now, s.rot.Seq), s.taken))
}

// taken reports a name this recording used, or one Options.Taken forbids.
func (s *Sink) taken(p string) bool {
	return s.used[p] || (s.opts.Taken != nil && s.opts.Taken(p))
}

// startAt creates the file at path: written under a dot-name, locked, then
// renamed, so that no one ever sees it unlocked and unfinished.
func (s *Sink) startAt(now time.Time, path string) error {
	s.used[path] = true
	carried := s.carried()
	s.rot.Carried = uint64(len(carried))
	hdr := *s.hdr
	hdr.StartWallNs = now.UnixNano()
	hdr.Extra = maps.Clone(s.hdr.Extra)
	if hdr.Extra == nil {
		hdr.Extra = map[string]any{}
	}
	hdr.Extra[trace.RotationKey] = s.rot

	if err := s.room(int64(reserve)); err != nil {
		return s.stop(err)
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".new")
	// Through outfile: in a shared directory a link planted at the
	// dot-name is not followed, and a name another process holds is not
	// taken from it.
	f, err := outfile.Create(tmp, outfile.Options{Lock: true})
	if err != nil {
		return err
	}
	w, err := trace.NewWriter(streamfile.New(f, streamfile.Options{Queue: -1}), &hdr, trace.WriterOptions{BlockSize: s.opts.BlockSize})
	if err == nil {
		for _, rec := range carried {
			if err = w.Write(rec); err != nil {
				break
			}
		}
	}
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		if s.rot.Seq > 0 {
			fault.At("rotate:before-rename")
		}
		err = os.Rename(tmp, path)
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("start %s: %w", path, err)
	}
	s.file, s.w, s.path, s.started = f, w, path, now
	s.files.Add(1)
	if s.opts.OnStart != nil {
		s.opts.OnStart(path)
	}
	s.opts.Log("started %s (file %d of recording %s, %d records carried)", path, s.rot.Seq, s.rot.Recording, len(carried))
	return nil
}

// carried returns copies of the live state, oldest first, flagged.
func (s *Sink) carried() [][]byte {
	var desc, conns [][]byte
	for _, r := range s.tasks {
		desc = append(desc, r)
	}
	for _, r := range s.ifaces {
		desc = append(desc, r)
	}
	for _, r := range s.conns {
		conns = append(conns, r)
	}
	return trace.Carried(desc, conns)
}

// finish ends the current file: summary, fsync, unlock, then the policy.
func (s *Sink) finish(sum *trace.Summary, reason, next string) error {
	var out trace.Summary
	if sum != nil {
		out = *sum
		// The recorder's loss total covers the whole recording; this file
		// holds what was not in the files before.
		if out.Lost >= s.lostBefore {
			out.Lost -= s.lostBefore
		}
	} else {
		out.Lost = s.lostInFile
	}
	out.EndWallNs = s.opts.Now().UnixNano()
	out.Extra = maps.Clone(out.Extra)
	if out.Extra == nil {
		out.Extra = map[string]any{}
	}
	out.Extra[trace.RotationKey] = trace.RotationEnd{Next: next, Records: s.own, NextRecord: s.rot.FirstRecord + s.own, Reason: reason}
	err := s.w.Close(&out)
	if err == nil {
		err = s.file.Sync()
	}
	s.closedBytes.Add(s.w.Bytes())
	cerr := s.file.Close() // releases the lock
	if err == nil {
		err = cerr
	}
	path := s.path
	s.w, s.file = nil, nil
	if err != nil {
		return fmt.Errorf("end %s: %w", path, err)
	}
	s.opts.Log("finished %s (%s): %d records", path, reason, s.own)
	if s.opts.OnFinish != nil {
		s.opts.OnFinish(path)
	}
	s.prune()
	return nil
}

// stop ends the current file properly after a full disk and makes every
// later call fail.
func (s *Sink) stop(cause error) error {
	if s.w != nil {
		if err := s.finish(nil, "disk full", ""); err != nil {
			s.opts.Log("ending %s on a full disk: %v", s.path, err)
		}
	}
	s.err = fmt.Errorf("%w: %w", ErrDiskFull, cause)
	return s.err
}

// room makes sure the file system has n bytes free beyond the reserve,
// dropping the oldest finished files when the policy allows.
func (s *Sink) room(n int64) error {
	for {
		free, err := freeBytes(s.opts.Pattern.Dir)
		if err != nil || free >= n+reserve {
			return nil // a file system that cannot tell is not policed
		}
		if !s.opts.DropOnFull || !s.dropOldest("disk full") {
			return fmt.Errorf("%s has %d bytes free, %d needed", s.opts.Pattern.Dir, free, n+reserve)
		}
	}
}

// prune applies Keep and Budget after a file finished.
func (s *Sink) prune() {
	if s.opts.Keep > 0 {
		fs, _ := Finished(s.opts.Pattern, "")
		for i := 0; i < len(fs)-s.opts.Keep; i++ {
			s.drop(fs[i], "keep")
		}
	}
	if s.opts.Budget > 0 {
		for {
			total := int64(0)
			if s.w != nil {
				total += s.w.Bytes()
			}
			if s.opts.Extra != nil {
				total += s.opts.Extra()
			}
			fs, _ := Finished(s.opts.Pattern, "")
			for _, f := range fs {
				total += f.Size
			}
			if total <= s.opts.Budget || len(fs) == 0 {
				return
			}
			s.drop(fs[0], "budget")
		}
	}
}

func (s *Sink) dropOldest(why string) bool {
	fs, _ := Finished(s.opts.Pattern, s.path)
	if len(fs) == 0 {
		return false
	}
	return s.drop(fs[0], why)
}

func (s *Sink) drop(f File, why string) bool {
	if err := os.Remove(f.Path); err != nil {
		s.opts.Log("could not drop %s: %v", f.Path, err)
		return false
	}
	s.dropped.Add(1)
	s.droppedB.Add(f.Size)
	s.opts.Log("dropped %s (%d bytes): %s", f.Path, f.Size, why)
	if s.opts.OnDrop != nil {
		s.opts.OnDrop(f.Path, f.Size, why)
	}
	return true
}

func freeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// File is a finished file of a pattern.
type File struct {
	Path    string
	Size    int64
	ModTime time.Time
}

// Finished lists the files of pattern p that no recorder is writing,
// oldest first (by modification time, then name); except is left out.
func Finished(p *Pattern, except string) ([]File, error) {
	ents, err := os.ReadDir(p.Dir)
	if err != nil {
		return nil, err
	}
	var out []File
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || name[0] == '.' || !p.Matches(name) {
			continue
		}
		path := filepath.Join(p.Dir, name)
		if path == except || InUse(path) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, File{Path: path, Size: fi.Size(), ModTime: fi.ModTime()})
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].ModTime.Equal(out[j].ModTime) {
			return out[i].ModTime.Before(out[j].ModTime)
		}
		return out[i].Path < out[j].Path
	})
	return out, nil
}

// InUse reports whether a recorder holds path: it is the file being
// written. A file whose recorder died is not in use: the kernel dropped the
// lock with the process.
func InUse(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
	if err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

func lockFile(f *os.File) error {
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
}
