// SPDX-License-Identifier: Apache-2.0

// Package archive is where many hosts' traces meet: the layout the collect
// service ships to (HOST/YYYY-MM-DD/FILE.mgt.zst, each beside a manifest
// FILE.mgt.zst.json), and the selection of traces by host and time that
// `magnet archive ls` and every analysis command use, with the rotated files
// of one recording grouped into one chain, read as one timeline.
package archive

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// ManifestSuffix is added to an archived trace's name to name its manifest.
const ManifestSuffix = ".json"

// Manifest describes one archived trace. The collect service writes it
// after the trace, so a trace without a manifest is not (yet) archived.
type Manifest struct {
	Host        string `json:"host"`
	File        string `json:"file"`     // base name in the archive, e.g. web1-20250301T100000.mgt.zst
	Original    string `json:"original"` // base name on the recording host
	StartWallNs int64  `json:"start_wall_ns"`
	// EndWallNs is 0 when the file was cut short (its recorder died).
	EndWallNs  int64             `json:"end_wall_ns,omitempty"`
	Recording  string            `json:"recording,omitempty"` // trace.Rotation.Recording
	Seq        int               `json:"seq"`
	Events     map[string]uint64 `json:"events,omitempty"`
	Lost       uint64            `json:"lost"`
	RawBytes   int64             `json:"raw_bytes"`           // size of the trace uncompressed
	Bytes      int64             `json:"bytes"`               // size of the archived (compressed) file
	SHA256     string            `json:"sha256"`              // of the archived file
	CutShort   bool              `json:"cut_short,omitempty"` // no end block
	ShippedAt  time.Time         `json:"shipped_at"`
	Compressed bool              `json:"compressed"`
}

// Start and End return the manifest's times; End is zero when unknown.
func (m *Manifest) Start() time.Time { return time.Unix(0, m.StartWallNs) }

// End is the zero time when the file was cut short.
func (m *Manifest) End() time.Time {
	if m.EndWallNs == 0 {
		return time.Time{}
	}
	return time.Unix(0, m.EndWallNs)
}

// Key is where a trace goes in the archive: HOST/YYYY-MM-DD/NAME, the date
// (UTC) of its start. name is the archived file's base name.
func Key(host string, start time.Time, name string) string {
	return path.Join(safe(host), start.UTC().Format("2006-01-02"), name)
}

// safe keeps a host name usable as one path element.
func safe(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '/' || r == '\\' || r < ' ' {
			return '_'
		}
		return r
	}, s)
	if s == "" || s == "." || s == ".." {
		return "_"
	}
	return s
}

// Describe reads the trace at p (plain or zstd) to the end and says what it
// holds: host, times, chain position, events. The archive fields (File,
// Bytes, SHA256) are left for the caller.
func Describe(p string) (*Manifest, error) {
	r, err := trace.Open(p)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	m := headerManifest(r, p)
	// Counted as read: a file cut short (its recorder killed) has no
	// summary, and its manifest must still say what it holds.
	counted := map[string]uint64{}
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		counted[rec.Type.Name]++
	}
	if cut, _ := r.Truncated(); cut {
		m.CutShort = true
	}
	if s := r.Summary(); s != nil {
		m.EndWallNs, m.Events, m.Lost = s.EndWallNs, s.Events, s.Lost
	} else if len(counted) > 0 {
		m.Events = counted
	}
	if fi, err := os.Stat(p); err == nil && !r.Compressed() {
		m.RawBytes = fi.Size()
	}
	return m, nil
}

func headerManifest(r *trace.Reader, p string) *Manifest {
	h := r.Header()
	m := &Manifest{Host: h.Host, File: filepath.Base(p), Original: filepath.Base(p), StartWallNs: h.StartWallNs, Compressed: r.Compressed()}
	if rot := r.Rotation(); rot != nil {
		m.Recording, m.Seq = rot.Recording, rot.Seq
	}
	return m
}

// Entry is one trace found by Scan: its manifest (from the archive, or made
// from its header) and where it is.
type Entry struct {
	Manifest
	Path string `json:"path"`
	// given: named by the user as a file, not found in a directory or
	// an archive; the files before it are then not missing, just not asked
	// for.
	given bool
}

// IsTrace reports whether a file name is one of a trace (.mgt, .mgt.zst).
func IsTrace(name string) bool {
	return !strings.HasPrefix(name, ".") && (strings.HasSuffix(name, ".mgt") || strings.HasSuffix(name, ".mgt.zst"))
}

// Scan finds the traces under dir: an archive (manifests beside them), or
// any directory of .mgt/.mgt.zst files (their headers are read; their end is
// then unknown). A trace the collect service is still uploading (no manifest
// yet, a dot-name) is left out.
func Scan(dir string) ([]Entry, error) {
	var out []Entry
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != dir && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !IsTrace(d.Name()) {
			return nil
		}
		e, err := entryOf(p)
		if err != nil {
			return err
		}
		if e != nil {
			out = append(out, *e)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", dir, err)
	}
	return out, nil
}

// entryOf describes one trace file: its manifest when there is one, else
// its header. A compressed file without a manifest in an archive is an
// upload not yet committed... or an archive made by hand: its header says.
func entryOf(p string) (*Entry, error) {
	if data, err := os.ReadFile(p + ManifestSuffix); err == nil {
		var m Manifest
		if err := json.Unmarshal(data, &m); err != nil {
			return nil, fmt.Errorf("manifest %s: %w", p+ManifestSuffix, err)
		}
		return &Entry{Manifest: m, Path: p}, nil
	}
	r, err := trace.Open(p)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	m := headerManifest(r, p)
	if fi, err := os.Stat(p); err == nil {
		m.Bytes = fi.Size()
	}
	return &Entry{Manifest: *m, Path: p}, nil
}

// Selection chooses traces by host and time.
type Selection struct {
	Hosts        []string  // empty = every host
	Since, Until time.Time // zero = open
	// SSHOptions are how to reach an ssh:// archive (ssh -o options), not
	// a filter.
	SSHOptions []string
	// Skip, if set, leaves out a selected file its caller has no use for
	// (already converted), before it is downloaded from an archive.
	Skip func(e *Entry) bool
}

// ErrNoMatch is returned by Resolve when no trace is left to read.
var ErrNoMatch = errors.New("no trace matches the selection")

// Empty reports whether the selection keeps everything.
func (s Selection) Empty() bool { return len(s.Hosts) == 0 && s.Since.IsZero() && s.Until.IsZero() }

// Match reports whether the trace of e may hold events of the selection.
// end is the trace's end, or zero when unknown (then it may reach on).
func (s Selection) Match(host string, start, end time.Time) bool {
	if len(s.Hosts) > 0 && !contains(s.Hosts, host) {
		return false
	}
	if !s.Until.IsZero() && !start.Before(s.Until) {
		return false
	}
	if !s.Since.IsZero() && !end.IsZero() && !end.After(s.Since) {
		return false
	}
	return true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Chain is the selected files of one recording, oldest first.
type Chain struct {
	Host      string
	Recording string // empty for a file of no rotated recording
	Entries   []Entry
	// Notes say what is known missing before the first file: the
	// recording's files before the first one found at all.
	Notes []string `json:"notes,omitempty"`
}

// Start returns the start of the chain's first file.
func (c *Chain) Start() time.Time { return c.Entries[0].Start() }

// Select keeps the entries the selection wants and groups them into chains
// (one per recording, files ordered by their number), in the order their
// first file came (Scan's: host, then date). A file's unknown end is taken to be the start of the next file of
// its recording.
func Select(entries []Entry, sel Selection) []*Chain {
	byRec := map[string]*Chain{}
	var chains []*Chain
	for _, e := range entries {
		k := e.Host + "\x00" + e.Recording
		if e.Recording == "" {
			k = "\x00" + e.Path
		}
		c := byRec[k]
		if c == nil {
			c = &Chain{Host: e.Host, Recording: e.Recording}
			byRec[k] = c
			chains = append(chains, c)
		}
		c.Entries = append(c.Entries, e)
	}
	var out []*Chain
	for _, c := range chains {
		sort.SliceStable(c.Entries, func(i, j int) bool {
			if c.Entries[i].Seq != c.Entries[j].Seq {
				return c.Entries[i].Seq < c.Entries[j].Seq
			}
			return c.Entries[i].StartWallNs < c.Entries[j].StartWallNs
		})
		// The recording's first files are not there at all (dropped by a
		// disk budget, lost): said when the selection starts with the
		// first one there is, since nothing then says it.
		first := c.Entries[0]
		var keep []Entry
		for i, e := range c.Entries {
			end := e.End()
			if end.IsZero() && i+1 < len(c.Entries) {
				end = c.Entries[i+1].Start()
			}
			if sel.Match(e.Host, e.Start(), end) {
				keep = append(keep, e)
			}
		}
		if len(keep) > 0 {
			if c.Recording != "" && first.Seq > 0 && keep[0].Path == first.Path && !first.given {
				c.Notes = append(c.Notes, fmt.Sprintf("files 0 to %d of recording %s are missing before %s: their events are not in the timeline",
					first.Seq-1, c.Recording, path.Base(first.Path)))
			}
			c.Entries = keep
			out = append(out, c)
		}
	}
	return out
}

// Missing says which files of the chain's recording are not there: its
// Notes (files before the first one found), then each run of file
// numbers missing between two of its files. A reader says the same as it
// reads; a listing has no other way to tell.
func (c *Chain) Missing() []string {
	out := slices.Clone(c.Notes)
	if c.Recording == "" {
		return out
	}
	for i := 1; i < len(c.Entries); i++ {
		a, b := c.Entries[i-1], c.Entries[i]
		switch {
		case b.Seq == a.Seq+2:
			out = append(out, fmt.Sprintf("file %d of recording %s is missing between %s and %s: its events are not in the timeline",
				a.Seq+1, c.Recording, path.Base(a.Path), path.Base(b.Path)))
		case b.Seq > a.Seq+2:
			out = append(out, fmt.Sprintf("files %d to %d of recording %s are missing between %s and %s: their events are not in the timeline",
				a.Seq+1, b.Seq-1, c.Recording, path.Base(a.Path), path.Base(b.Path)))
		}
	}
	return out
}

// Source turns a chain into what the analyses read, with the selection's
// time window.
func (c *Chain) Source(sel Selection) trace.Source {
	src := trace.Source{Name: c.Entries[0].Path, Notes: c.Notes}
	for _, e := range c.Entries {
		src.Paths = append(src.Paths, e.Path)
	}
	if n := len(c.Entries); n > 1 {
		src.Name = fmt.Sprintf("%s+%d", c.Entries[0].Path, n-1)
	}
	if !sel.Since.IsZero() {
		src.Since = sel.Since.UnixNano()
	}
	if !sel.Until.IsZero() {
		src.Until = sel.Until.UnixNano()
	}
	return src
}
