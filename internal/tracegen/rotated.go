// SPDX-License-Identifier: Apache-2.0

package tracegen

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/rotate"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// WallOffset is the clock offset of the headers Header makes:
// wall time = record time_ns + WallOffset.
const WallOffset = int64(1_000_000_000_000_000_000)

// Header returns the header of a trace of host starting at start, with
// the real event dictionary and the clock offset WallOffset.
func Header(t testing.TB, host string, start time.Time) *trace.Header {
	t.Helper()
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		t.Fatal(err)
	}
	return &trace.Header{Host: host, StartWallNs: start.UnixNano(), Types: types, Clock: trace.Clock{WallOffsetNs: WallOffset}}
}

// Record returns a zeroed record of the named type of h, stamped with the
// time of wall time at.
func Record(h *trace.Header, typ string, at time.Time) []byte {
	ty := h.TypeByName(typ)
	rec := make([]byte, ty.Size)
	rec[30] = ty.ID
	binary.NativeEndian.PutUint64(rec, uint64(at.UnixNano()-WallOffset))
	return rec
}

// Create starts a trace of header h in a file name of a temporary
// directory of the test; the file is closed at the end of the test.
func Create(t testing.TB, name string, h *trace.Header) (path string, w *trace.Writer) {
	t.Helper()
	path = filepath.Join(t.TempDir(), name)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	w, err = trace.NewWriter(f, h, trace.WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return path, w
}

// Rotated is a recording rotated into one-minute files under a clock the
// caller moves (Now), so that which record lands in which file is known
// in advance. Tests of chains, archives and datasets build on it.
type Rotated struct {
	Header *trace.Header
	Now    time.Time
	t      testing.TB
	sink   *rotate.Sink
	paths  []string
}

// NewRotated starts a recording of host at start under dir, its files
// named by pattern (a rotate pattern relative to dir, "%h-%n.mgt").
func NewRotated(t testing.TB, dir, host, pattern string, start time.Time) *Rotated {
	t.Helper()
	r := &Rotated{Header: Header(t, host, start), Now: start, t: t}
	p, err := rotate.ParsePattern(filepath.Join(dir, pattern), host)
	if err != nil {
		t.Fatal(err)
	}
	r.sink, err = rotate.New(r.Header, rotate.Options{Pattern: p, Interval: time.Minute, Now: func() time.Time { return r.Now },
		OnStart: func(path string) { r.paths = append(r.paths, path) }})
	if err != nil {
		t.Fatal(err)
	}
	r.paths = append(r.paths, r.sink.Path())
	return r
}

// Record returns a zeroed record of the named type stamped with Now.
func (r *Rotated) Record(typ string) []byte { return Record(r.Header, typ, r.Now) }

// Write writes rec as it is.
func (r *Rotated) Write(rec []byte) {
	r.t.Helper()
	if err := r.sink.Write(rec); err != nil {
		r.t.Fatal(err)
	}
}

// EverySecond writes rec n times, a second apart from Now on, each
// stamped with its time and flushed (which rotates at each minute).
func (r *Rotated) EverySecond(rec []byte, n int) {
	r.t.Helper()
	for i := 0; i < n; i++ {
		binary.NativeEndian.PutUint64(rec, uint64(r.Now.UnixNano()-WallOffset))
		r.Write(rec)
		r.Now = r.Now.Add(time.Second)
		if err := r.sink.Flush(); err != nil {
			r.t.Fatal(err)
		}
	}
}

// Close ends the recording and returns its files, oldest first.
func (r *Rotated) Close() []string {
	r.t.Helper()
	if err := r.sink.Close(nil); err != nil {
		r.t.Fatal(err)
	}
	// OnStart may name the first file again.
	var out []string
	seen := map[string]bool{}
	for _, p := range r.paths {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}
