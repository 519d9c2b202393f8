// SPDX-License-Identifier: Apache-2.0

package collect

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/archive"
	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/fault"
	"github.com/magnet-tracer/magnet/internal/rotate"
)

// Files of the spool that are not traces: they start with a dot, which no
// pattern may.
const (
	journalName = ".collect-state.json"
	stagingDir  = ".staging"
	shipLock    = ".collect-ship.lock"
	droppedLog  = ".dropped.log"
	namesLog    = ".names"
)

// journal is the shipper's state, kept on disk so that a restart resumes:
// which archives already hold which file. Together with Archive.Has it
// means no file is shipped twice, whatever moment the shipper was killed at.
type journal struct {
	path         string
	Files        map[string]*fileState `json:"files"`
	Shipped      uint64                `json:"shipped"`       // files every archive confirmed, removed locally
	ShippedBytes uint64                `json:"shipped_bytes"` // their archived bytes
	// Per target: what the metrics report across restarts.
	Targets map[string]*targetTotals `json:"targets,omitempty"`
}

type targetTotals struct {
	Shipped      uint64    `json:"shipped"`
	ShippedBytes uint64    `json:"shipped_bytes"`
	Failures     uint64    `json:"failures"`
	LastSuccess  time.Time `json:"last_success,omitzero"`
	LastFailure  time.Time `json:"last_failure,omitzero"`
	LastError    string    `json:"last_error,omitempty"`
}

// target returns the totals of the target named name.
func (j *journal) target(name string) *targetTotals {
	if j.Targets == nil {
		j.Targets = map[string]*targetTotals{}
	}
	if j.Targets[name] == nil {
		j.Targets[name] = &targetTotals{}
	}
	return j.Targets[name]
}

type fileState struct {
	Trace    Blob              `json:"trace"`    // the staged (compressed) trace
	Manifest Blob              `json:"manifest"` // its staged manifest
	Meta     *archive.Manifest `json:"meta"`
	Done     map[string]bool   `json:"done"` // archive name -> trace and manifest in place
}

func loadJournal(path string) (*journal, error) {
	j := &journal{path: path, Files: map[string]*fileState{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return j, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read shipping journal: %w", err)
	}
	if err := json.Unmarshal(data, j); err != nil {
		return nil, fmt.Errorf("shipping journal %s is damaged (%v): move it away to start afresh", path, err)
	}
	if j.Files == nil {
		j.Files = map[string]*fileState{}
	}
	return j, nil
}

// save writes the journal atomically and durably.
func (j *journal) save() error {
	data, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileSync(j.path, data); err != nil {
		return fmt.Errorf("write shipping journal: %w", err)
	}
	return nil
}

// backoff spaces the retries of one archive: RetryInitial, doubling up to
// RetryMax, with jitter so that many hosts do not retry in step.
type backoff struct {
	delay time.Duration
	until time.Time
	fails int
}

func (b *backoff) fail(now time.Time, initial, maxDelay time.Duration) time.Duration {
	if b.delay == 0 {
		b.delay = initial
	} else {
		b.delay = min(2*b.delay, maxDelay)
	}
	d := b.delay + time.Duration(rand.Int64N(int64(b.delay/5)+1))
	b.until = now.Add(d)
	b.fails++
	return d
}

// Shipper ships the finished files of the spool. Each target is shipped to
// by a pass of its own, with its own timeout and backoff: a target that
// hangs (a frozen store) or fails delays no other. A file's local copy goes
// once every target has it.
type Shipper struct {
	cfg     *Config
	pattern *rotate.Pattern
	targets []*target
	// Log receives one line per shipment, failure, retry and stall.
	Log func(format string, args ...any)
	// Now is the clock (tests move it).
	now func() time.Time

	mu      sync.Mutex // guards j, held and the targets' state
	j       *journal
	held    map[string]*heldFile
	wg      sync.WaitGroup // the targets' passes running
	started time.Time
}

// target is one archive and what the shipper knows of it.
type target struct {
	a       Archive
	kind    string
	timeout time.Duration
	b       backoff
	busy    bool // a pass is running
	// The file in flight and since when; stallLogged once it has been
	// said that it stalls.
	current     string
	since       time.Time
	stallLogged bool
	st          TargetStatus
}

// heldFile is a spool file some target is shipping: its open descriptor
// holds the lock that keeps the disk budget from dropping it.
type heldFile struct {
	f    *os.File
	refs int
}

// NewShipper prepares to ship cfg's spool to its targets.
func NewShipper(cfg *Config) (*Shipper, error) {
	p, err := rotate.ParsePattern(filepath.Join(cfg.Spool, cfg.Pattern), cfg.Host)
	if err != nil {
		return nil, err
	}
	if len(cfg.Targets) == 0 {
		return nil, errors.New("no targets to ship to")
	}
	s := &Shipper{cfg: cfg, pattern: p, held: map[string]*heldFile{}, Log: func(string, ...any) {}, now: time.Now, started: time.Now()}
	for _, t := range cfg.Targets {
		a, err := NewArchive(t)
		if err != nil {
			return nil, err
		}
		to := cfg.Ship.Timeout
		if t.Timeout > 0 {
			to = t.Timeout
		}
		s.targets = append(s.targets, &target{a: a, kind: t.Type, timeout: to, st: TargetStatus{Name: a.Name(), Type: t.Type}})
	}
	if err := os.MkdirAll(filepath.Join(cfg.Spool, stagingDir), 0o755); err != nil {
		return nil, fmt.Errorf("create spool: %w", err)
	}
	if s.j, err = loadJournal(filepath.Join(cfg.Spool, journalName)); err != nil {
		return nil, err
	}
	return s, nil
}

// Run ships until ctx ends: a pass over the spool every ship.interval, or
// when wake says a file finished. Each target's pass runs on its own; a
// target still busy (or backing off) is left to itself while the others
// go on. Every second the shipper looks for stalls and retries the targets
// whose backoff ended; every publishEvery it publishes its status
// (SPOOL/.ship-status.json, and the metrics file). Only one shipper runs per spool: Run waits for the
// lock a previous one (still ending) may hold.
func (s *Shipper) Run(ctx context.Context, wake <-chan struct{}) error {
	lock, err := os.OpenFile(filepath.Join(s.cfg.Spool, shipLock), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("shipper lock: %w", err)
	}
	defer lock.Close()
	for unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
	// The passes still running end with ctx; wait for them so that the
	// journal is not written after Run returns.
	defer s.wg.Wait()
	t := time.NewTicker(s.cfg.Ship.Interval)
	defer t.Stop()
	watch := time.NewTicker(min(time.Second, s.cfg.Ship.Interval))
	defer watch.Stop()
	var published time.Time
	files := s.prepare(ctx)
	s.start(ctx, files, false)
	for {
		select {
		case <-ctx.Done():
			s.publish()
			return nil
		case <-wake:
			files = s.prepare(ctx)
			s.start(ctx, files, false)
		case <-t.C:
			files = s.prepare(ctx)
			s.start(ctx, files, false)
		case <-watch.C:
			s.watch()
			// Retry the targets whose backoff ended, without waiting for
			// the next interval.
			s.start(ctx, files, true)
			// Listing the spool takes a lock test per file: every few
			// seconds is enough for a status file (the metrics endpoint
			// reads the state live).
			if time.Since(published) >= publishEvery {
				s.publish()
				published = time.Now()
			}
		}
	}
}

// publishEvery spaces the rewrites of the status and metrics files.
const publishEvery = 5 * time.Second

// Pass ships what it can of the spool's finished files, oldest first, to
// every target not already busy, and returns when those passes end.
func (s *Shipper) Pass(ctx context.Context) {
	files := s.prepare(ctx)
	for _, done := range s.start(ctx, files, false) {
		<-done
	}
	s.publish()
}

// start begins a pass for each target that is idle and not backing off
// (with retryOnly, only for those that failed last and whose backoff has
// ended), and returns a channel per pass started, closed at its end.
func (s *Shipper) start(ctx context.Context, files []string, retryOnly bool) []chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var started []chan struct{}
	for _, t := range s.targets {
		if t.busy || now.Before(t.b.until) || retryOnly && t.b.fails == 0 || ctx.Err() != nil {
			continue
		}
		t.busy = true
		done := make(chan struct{})
		started = append(started, done)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer close(done)
			s.passTarget(ctx, t, files)
			s.mu.Lock()
			t.busy = false
			s.mu.Unlock()
		}()
	}
	return started
}

// prepare lists the spool's finished files, stages those not staged yet,
// forgets those gone (dropped by the budget) and clears what killed runs
// left. It returns the names of the staged files, oldest first.
func (s *Shipper) prepare(ctx context.Context) []string {
	files, err := s.list()
	if err != nil {
		s.Log("list spool: %v", err)
		return nil
	}
	live := map[string]bool{}
	var names []string
	for _, f := range files {
		name := filepath.Base(f.Path)
		live[name] = true
		if ctx.Err() != nil {
			return names
		}
		ok, err := s.stageFile(f.Path)
		if err != nil {
			s.Log("%s: %v", name, err)
		}
		if ok && s.cfg.Dataset.Dir != "" {
			s.addToDataset(f.Path)
		}
		if ok {
			names = append(names, name)
		}
	}
	s.mu.Lock()
	// Forget files gone from the spool (dropped by the budget), and their
	// staged copies.
	changed := false
	for name := range s.j.Files {
		if !live[name] {
			delete(s.j.Files, name)
			changed = true
		}
	}
	if changed {
		if err := s.j.save(); err != nil {
			s.Log("%v", err)
		}
	}
	s.mu.Unlock()
	// A recorder killed while it started a file leaves it under its
	// temporary dot-name (rotate renames it once its start is written).
	if ents, err := os.ReadDir(s.cfg.Spool); err == nil {
		for _, e := range ents {
			p := filepath.Join(s.cfg.Spool, e.Name())
			if !strings.HasPrefix(e.Name(), ".") || !strings.HasSuffix(e.Name(), ".new") {
				continue
			}
			// Between its creation and its lock a new file is young: only
			// an old, unlocked one was left by a killed recorder.
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > time.Minute && !rotate.InUse(p) {
				os.Remove(p)
			}
		}
	}
	ents, _ := os.ReadDir(filepath.Join(s.cfg.Spool, stagingDir))
	for _, e := range ents {
		if !live[stagedBase(e.Name())] {
			os.Remove(filepath.Join(s.cfg.Spool, stagingDir, e.Name()))
		}
	}
	return names
}

// addToDataset writes the finished spool file into the configured Parquet
// dataset, unless it is there already. A failure is logged and retried at
// the next pass; it never holds the shipment back (the archive keeps the
// trace, and `magnet export --dataset` over the archive fills any gap).
func (s *Shipper) addToDataset(path string) {
	st, err := export.WriteDataset(s.cfg.Dataset.Dir, []string{path}, export.DatasetOptions{Partition: s.cfg.Dataset.Partition})
	if err != nil {
		s.Log("dataset %s: %v", s.cfg.Dataset.Dir, err)
		return
	}
	if st.Written > 0 {
		s.Log("added %s to dataset %s (%d events, %d connections)", filepath.Base(path), s.cfg.Dataset.Dir, st.Events, st.Conns)
	}
}

// list is the spool's finished files, oldest first: those no recorder
// writes, and those this shipper holds (its lock hides them from
// rotate.Finished). Both looks are made under s.mu, which hold and release
// need: a file released between them would be in neither, and prepare
// would forget its journal entry (which targets have it).
func (s *Shipper) list() ([]rotate.File, error) {
	s.mu.Lock()
	files, err := rotate.Finished(s.pattern, "")
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	for name := range s.held {
		p := filepath.Join(s.cfg.Spool, name)
		if fi, err := os.Stat(p); err == nil {
			files = append(files, rotate.File{Path: p, Size: fi.Size(), ModTime: fi.ModTime()})
		}
	}
	s.mu.Unlock()
	sort.Slice(files, func(i, j int) bool {
		if !files[i].ModTime.Equal(files[j].ModTime) {
			return files[i].ModTime.Before(files[j].ModTime)
		}
		return files[i].Path < files[j].Path
	})
	return files, nil
}

// hold opens and locks a spool file for shipping (the budget does not drop
// a locked file), or counts one more holder. It says false when the file
// is gone or someone else holds it. Called with s.mu held.
func (s *Shipper) hold(name string) bool {
	if h := s.held[name]; h != nil {
		h.refs++
		return true
	}
	f, err := os.Open(filepath.Join(s.cfg.Spool, name))
	if err != nil {
		return false
	}
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		f.Close()
		return false
	}
	s.held[name] = &heldFile{f: f, refs: 1}
	return true
}

// release undoes a hold. Called with s.mu held.
func (s *Shipper) release(name string) {
	h := s.held[name]
	if h == nil {
		return
	}
	if h.refs--; h.refs == 0 {
		h.f.Close()
		delete(s.held, name)
	}
}

// stageFile stages a spool file unless it is staged already, and says
// whether it is.
func (s *Shipper) stageFile(path string) (bool, error) {
	name := filepath.Base(path)
	s.mu.Lock()
	st := s.j.Files[name]
	if st != nil && s.staged(st) {
		s.mu.Unlock()
		return true, nil
	}
	if !s.hold(name) {
		s.mu.Unlock()
		return false, nil // dropped meanwhile, or held by another
	}
	s.mu.Unlock()
	st, err := s.stage(path)
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.release(name)
	if err != nil {
		return false, err
	}
	s.j.Files[name] = st
	fault.At("ship:after-stage")
	if err := s.j.save(); err != nil {
		return false, err
	}
	return true, nil
}

// doneEverywhere says whether the journal has st confirmed by every archive.
func (s *Shipper) doneEverywhere(st *fileState) bool {
	for _, t := range s.targets {
		if !st.Done[t.a.Name()] {
			return false
		}
	}
	return true
}

// Queue returns the files waiting in the spool and the shipping totals.
func (s *Shipper) Queue() (waiting int, shipped uint64) {
	files, _ := s.list()
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(files), s.j.Shipped
}

// passTarget ships to t every file of files it does not have yet, oldest
// first, until one fails (then t backs off) or ctx ends.
func (s *Shipper) passTarget(ctx context.Context, t *target, files []string) {
	name := t.a.Name()
	for _, file := range files {
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		st := s.j.Files[file]
		if st == nil || st.Done[name] {
			// Every archive confirmed already, by the journal: a run
			// killed after it saved the journal and before the local copy
			// went (or before its log line reached the service). Said, so
			// that every archived file is accounted for in the log as
			// shipped or found shipped.
			if st != nil && s.doneEverywhere(st) && s.hold(file) {
				s.Log("%s already in every archive as %s (the journal of a run before a restart); removing the local copy", file, archiveKey(st.Meta))
				err := s.removeLocal(file, st)
				s.release(file)
				if err != nil {
					s.Log("%s: %v", file, err)
				}
			}
			s.mu.Unlock()
			continue
		}
		if !s.hold(file) {
			s.mu.Unlock()
			continue
		}
		t.current, t.since, t.stallLogged = file, s.now(), false
		s.mu.Unlock()

		key := archiveKey(st.Meta)
		uploaded, err := s.shipTo(ctx, t, key, st)

		s.mu.Lock()
		if t.stallLogged {
			s.Log("ship %s to %s: stall over after %s (%s)", file, name, s.now().Sub(t.since).Round(time.Second), errOr(err, "shipped"))
		}
		t.current, t.stallLogged = "", false
		if err != nil {
			s.release(file)
			if ctx.Err() != nil {
				s.mu.Unlock()
				return
			}
			d := t.b.fail(s.now(), s.cfg.Ship.RetryInitial, s.cfg.Ship.RetryMax)
			tot := s.j.target(name)
			tot.Failures++
			tot.LastFailure = s.now().UTC()
			tot.LastError = err.Error()
			s.Log("ship %s to %s failed (attempt %d, next in %s): %v", file, name, t.b.fails, d.Round(time.Millisecond), err)
			s.mu.Unlock()
			return
		}
		t.b = backoff{}
		tot := s.j.target(name)
		tot.LastSuccess = s.now().UTC()
		tot.Shipped++
		tot.ShippedBytes += uint64(st.Trace.Size)
		fault.At("ship:after-manifest")
		st.Done[name] = true
		err = s.j.save()
		if err == nil {
			if uploaded {
				s.Log("shipped %s to %s as %s (%d bytes, sha256 %s)", file, name, key, st.Trace.Size, st.Trace.SHA256[:16])
			} else {
				s.Log("%s already in %s as %s (shipped before a restart); manifest written", file, name, key)
			}
			if s.doneEverywhere(st) {
				err = s.removeLocal(file, st)
			}
		}
		s.release(file)
		s.mu.Unlock()
		if err != nil {
			s.Log("%s: %v", file, err)
			return
		}
	}
}

func errOr(err error, ok string) string {
	if err != nil {
		return err.Error()
	}
	return ok
}

// removeLocal deletes a file every archive has, and its staged copies.
// Called with s.mu held.
func (s *Shipper) removeLocal(file string, st *fileState) error {
	path := filepath.Join(s.cfg.Spool, file)
	fault.At("ship:after-journal")
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if st.Trace.Path != path {
		os.Remove(st.Trace.Path)
	}
	os.Remove(st.Manifest.Path)
	fault.At("ship:after-delete")
	delete(s.j.Files, file)
	s.j.Shipped++
	s.j.ShippedBytes += uint64(st.Trace.Size)
	return s.j.save()
}

// shipTo puts the trace unless the archive holds it already (a shipment
// that completed before a crash), then its manifest, within the target's
// timeout. uploaded says whether the trace was sent.
func (s *Shipper) shipTo(ctx context.Context, t *target, key string, st *fileState) (uploaded bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	a := t.a
	has, err := a.Has(ctx, key, st.Trace)
	if err != nil {
		return false, err
	}
	if !has {
		if err := a.Put(ctx, key, st.Trace); err != nil {
			return false, err
		}
	}
	fault.At("ship:after-upload")
	// The manifest, written last, commits the file to the archive; putting
	// it again (after a crash) rewrites the same bytes.
	return !has, a.Put(ctx, key+archive.ManifestSuffix, st.Manifest)
}

// Close releases the archives' connections.
func (s *Shipper) Close() {
	for _, t := range s.targets {
		if c, ok := t.a.(io.Closer); ok {
			c.Close()
		}
	}
}

// staged reports whether the staged copies of st are still there, whole.
func (s *Shipper) staged(st *fileState) bool {
	for _, b := range []Blob{st.Trace, st.Manifest} {
		fi, err := os.Stat(b.Path)
		if err != nil || fi.Size() != b.Size {
			return false
		}
	}
	return st.Meta != nil && st.Done != nil
}

// stage describes the trace, compresses it into the staging directory and
// writes its manifest there, with the checksums that verify both.
func (s *Shipper) stage(path string) (*fileState, error) {
	m, err := archive.Describe(path)
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	m.Host = s.cfg.Host
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	m.RawBytes = fi.Size()
	st := &fileState{Meta: m, Done: map[string]bool{}}
	dir := filepath.Join(s.cfg.Spool, stagingDir)
	if *s.cfg.Compress {
		m.File = filepath.Base(path) + ".zst"
		m.Compressed = true
		st.Trace, err = compressFile(path, filepath.Join(dir, m.File))
	} else {
		m.File = filepath.Base(path)
		st.Trace, err = blobOf(path)
	}
	if err != nil {
		return nil, err
	}
	m.Bytes, m.SHA256 = st.Trace.Size, st.Trace.SHA256
	m.ShippedAt = time.Now().UTC()
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	mp := filepath.Join(dir, m.File+archive.ManifestSuffix)
	if err := writeFileSync(mp, append(data, '\n')); err != nil {
		return nil, err
	}
	if st.Manifest, err = blobOf(mp); err != nil {
		return nil, err
	}
	return st, nil
}

// compressFile writes src zstd-compressed to dst (via a .part name) and
// returns dst with its checksums.
func compressFile(src, dst string) (Blob, error) {
	in, err := os.Open(src)
	if err != nil {
		return Blob{}, err
	}
	defer in.Close()
	tmp := dst + ".part"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return Blob{}, err
	}
	defer os.Remove(tmp)
	sh, mh := sha256.New(), md5.New()
	cw := &countWriter{w: io.MultiWriter(out, sh, mh)}
	enc, err := zstd.NewWriter(cw, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		out.Close()
		return Blob{}, err
	}
	if _, err := io.Copy(enc, in); err != nil {
		enc.Close()
		out.Close()
		return Blob{}, fmt.Errorf("compress: %w", err)
	}
	if err := enc.Close(); err != nil {
		out.Close()
		return Blob{}, fmt.Errorf("compress: %w", err)
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return Blob{}, err
	}
	if err := out.Close(); err != nil {
		return Blob{}, err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return Blob{}, err
	}
	return Blob{Path: dst, Size: cw.n, SHA256: hex.EncodeToString(sh.Sum(nil)), MD5: hex.EncodeToString(mh.Sum(nil))}, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func blobOf(path string) (Blob, error) {
	f, err := os.Open(path)
	if err != nil {
		return Blob{}, err
	}
	defer f.Close()
	sh, mh := sha256.New(), md5.New()
	n, err := io.Copy(io.MultiWriter(sh, mh), f)
	if err != nil {
		return Blob{}, err
	}
	return Blob{Path: path, Size: n, SHA256: hex.EncodeToString(sh.Sum(nil)), MD5: hex.EncodeToString(mh.Sum(nil))}, nil
}

// writeFileSync replaces path with data atomically and durably: through a
// .part file that is renamed over path only once every byte of it is
// written and synced, then the directory synced. A failed write (a full
// disk) leaves path as it was.
func writeFileSync(path string, data []byte) error {
	tmp := path + ".part"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(path))
}
