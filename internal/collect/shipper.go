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
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/archive"
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

// Shipper ships the finished files of the spool.
type Shipper struct {
	cfg      *Config
	pattern  *rotate.Pattern
	archives []Archive
	j        *journal
	backoffs map[string]*backoff
	// Log receives one line per shipment, failure and retry.
	Log func(format string, args ...any)
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
	s := &Shipper{cfg: cfg, pattern: p, backoffs: map[string]*backoff{}, Log: func(string, ...any) {}}
	for _, t := range cfg.Targets {
		a, err := NewArchive(t)
		if err != nil {
			return nil, err
		}
		s.archives = append(s.archives, a)
		s.backoffs[a.Name()] = &backoff{}
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
// when wake says a file finished. Only one shipper runs per spool: Run
// waits for the lock a previous one (still ending) may hold.
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
	t := time.NewTicker(s.cfg.Ship.Interval)
	defer t.Stop()
	for {
		s.Pass(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-t.C:
		}
	}
}

// Pass ships what it can of the spool's finished files, oldest first.
func (s *Shipper) Pass(ctx context.Context) {
	files, err := rotate.Finished(s.pattern, "")
	if err != nil {
		s.Log("list spool: %v", err)
		return
	}
	live := map[string]bool{}
	for _, f := range files {
		live[filepath.Base(f.Path)] = true
		if ctx.Err() != nil {
			return
		}
		if err := s.shipFile(ctx, f.Path); err != nil {
			s.Log("%s: %v", filepath.Base(f.Path), err)
		}
	}
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
}

// doneEverywhere says whether the journal has st confirmed by every archive.
func (s *Shipper) doneEverywhere(st *fileState) bool {
	for _, a := range s.archives {
		if !st.Done[a.Name()] {
			return false
		}
	}
	return true
}

// Queue returns the files waiting in the spool and the shipping totals.
func (s *Shipper) Queue() (waiting int, shipped uint64) {
	files, _ := rotate.Finished(s.pattern, "")
	return len(files), s.j.Shipped
}

func (s *Shipper) shipFile(ctx context.Context, path string) error {
	name := filepath.Base(path)
	f, err := os.Open(path)
	if err != nil {
		return nil // dropped meanwhile
	}
	defer f.Close()
	// Held while shipping: the budget does not drop a file being shipped.
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return nil
	}
	st := s.j.Files[name]
	if st == nil || !s.staged(st) {
		if st, err = s.stage(path); err != nil {
			return err
		}
		s.j.Files[name] = st
		fault.At("ship:after-stage")
		if err := s.j.save(); err != nil {
			return err
		}
	}
	key := archiveKey(st.Meta)
	// Every archive confirmed already, by the journal: a run killed after
	// it saved the journal and before the local copy went (or before its
	// log line reached the service). Said, so that every archived file is
	// accounted for in the log as shipped or found shipped.
	if s.doneEverywhere(st) {
		s.Log("%s already in every archive as %s (the journal of a run before a restart); removing the local copy", name, key)
	}
	now := time.Now()
	for _, a := range s.archives {
		if st.Done[a.Name()] {
			continue
		}
		b := s.backoffs[a.Name()]
		if now.Before(b.until) {
			continue
		}
		uploaded, err := s.shipTo(ctx, a, key, st)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			d := b.fail(time.Now(), s.cfg.Ship.RetryInitial, s.cfg.Ship.RetryMax)
			s.Log("ship %s to %s failed (attempt %d, next in %s): %v", name, a.Name(), b.fails, d.Round(time.Millisecond), err)
			continue
		}
		*b = backoff{}
		fault.At("ship:after-manifest")
		st.Done[a.Name()] = true
		if err := s.j.save(); err != nil {
			return err
		}
		if uploaded {
			s.Log("shipped %s to %s as %s (%d bytes, sha256 %s)", name, a.Name(), key, st.Trace.Size, st.Trace.SHA256[:16])
		} else {
			s.Log("%s already in %s as %s (shipped before a restart); manifest written", name, a.Name(), key)
		}
	}
	if !s.doneEverywhere(st) {
		return nil
	}
	// Every archive has it: the local copy can go.
	fault.At("ship:after-journal")
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if st.Trace.Path != path {
		os.Remove(st.Trace.Path)
	}
	os.Remove(st.Manifest.Path)
	fault.At("ship:after-delete")
	delete(s.j.Files, name)
	s.j.Shipped++
	s.j.ShippedBytes += uint64(st.Trace.Size)
	return s.j.save()
}

// shipTo puts the trace unless the archive holds it already (a shipment
// that completed before a crash), then its manifest. uploaded says whether
// the trace was sent.
func (s *Shipper) shipTo(ctx context.Context, a Archive, key string, st *fileState) (uploaded bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Ship.Timeout)
	defer cancel()
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
	for _, a := range s.archives {
		if c, ok := a.(io.Closer); ok {
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
