// SPDX-License-Identifier: Apache-2.0

package record

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/magnet-tracer/magnet/internal/probe"
)

// DefaultStatusDir holds one status file per running recorder, which
// `magnet status` reads: MAGNeT's /proc/net/magnet, as files.
const DefaultStatusDir = "/run/magnet"

// Status is what a running recorder publishes about itself.
type Status struct {
	PID    int    `json:"pid"`
	Output string `json:"output"` // the file being written
	// Previous is the file finished last, when the recording rotates.
	Previous    string            `json:"previous,omitempty"`
	Started     time.Time         `json:"started"`
	Updated     time.Time         `json:"updated"`
	Events      []string          `json:"events"`
	Filters     map[string]string `json:"filters,omitempty"`
	Command     []string          `json:"command,omitempty"`
	BufferBytes int               `json:"buffer_bytes"`
	BufferUsed  int               `json:"buffer_used"`
	Recorded    uint64            `json:"recorded"`
	Lost        uint64            `json:"lost"`
	Missed      uint64            `json:"missed"` // program runs the kernel skipped (Result.Missed)
	// KernelSkipped: device program runs the kernel did not make for
	// frames the recorded interfaces counted (Result.KernelSkipped), and
	// the directions compared; nil until the first comparison is done.
	KernelSkipped        *uint64            `json:"kernel_skipped,omitempty"`
	KernelSkippedChecked int                `json:"kernel_skipped_checked,omitempty"`
	Written              int64              `json:"bytes_written"`
	Hooks                []probe.HookStatus `json:"hooks"`
}

// statusFile is rewritten in place, once a second: creating a file and
// renaming it over the last took ~87 µs a time where /run is ext4 (this
// VM's), a write to an open one ~0.4 µs (docs/BENCH.md at d71bc17, "The drain, eighth
// round"). A reader can then catch a write half done: ReadStatuses reads
// again when what it read does not parse.
type statusFile struct {
	path string
	f    *os.File
	size int // bytes in the file: a shorter status is padded to it
	st   Status
	r    *recorder
	buf  []byte
	enc  statusEncoding
}

func newStatusFile(cfg Config, p *probe.Probe, r *recorder) *statusFile {
	s := &statusFile{r: r, st: Status{
		PID: os.Getpid(), Output: cfg.Output, Started: time.Now(), Events: cfg.Groups.Names(),
		Filters: filterSettings(cfg.Filters), Command: cfg.Command, BufferBytes: cfg.BufferBytes, Hooks: p.Status,
	}}
	s.st.Output = absPath(cfg.Output)
	if err := os.MkdirAll(cfg.StatusDir, 0o755); err == nil {
		path := filepath.Join(cfg.StatusDir, fmt.Sprintf("record-%d.json", os.Getpid()))
		if f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644); err == nil {
			s.path, s.f = path, f
			s.update()
		}
	}
	return s
}

// filesSink is a Sink that writes a chain of files (rotate.Sink): the
// status names the file being written, not the first.
type filesSink interface {
	Path() string
	Previous() string
}

func absPath(p string) string {
	if p == "" {
		return ""
	}
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

// update rewrites the file atomically (write, then rename).
func (s *statusFile) update() {
	if s.path == "" {
		return
	}
	s.st.Updated = time.Now()
	s.st.BufferUsed = s.r.bufferUsed()
	s.st.Recorded = s.r.total
	s.st.Lost = s.r.lost
	if _, missed, err := s.r.probe.MissedRuns(); err == nil {
		s.st.Missed = missed
	}
	if s.r.devCheckErr == nil {
		// In the background: reading every namespace's interfaces takes
		// milliseconds the drain must not wait for.
		s.r.devCheck.CheckLater()
		if rep, ok := s.r.devCheck.Latest(); ok {
			s.st.KernelSkipped, s.st.KernelSkippedChecked = &rep.Skipped, rep.Checked()
		}
	}
	s.st.Written = s.r.w.Bytes()
	if fs, ok := s.r.w.(filesSink); ok {
		s.st.Output, s.st.Previous = absPath(fs.Path()), absPath(fs.Previous())
	}
	s.enc.buf = s.st.appendJSON(s.enc.buf[:0], &s.enc)
	s.write(s.enc.buf)
}

// statusEncoding holds what appendJSON reuses between updates: the
// encoded forms of the fields that do not change while recording.
type statusEncoding struct {
	buf []byte
	// static: the fields from events to command, and the hooks, as
	// json.MarshalIndent writes them, for the Status they were made for.
	events, hooks []byte
	forEvents     *Status
	// paths: the last output and previous paths, encoded.
	output, previous     string
	outputJSON, prevJSON []byte
}

// appendJSON appends st as json.MarshalIndent(st, "", "  ") writes it
// (TestStatusJSON holds them equal): encoding the whole Status by
// reflection each second, hooks and all, was a fifth of an idle
// recorder's CPU time, the fields that change are a few numbers.
func (st *Status) appendJSON(b []byte, e *statusEncoding) []byte {
	if e.forEvents != st {
		e.forEvents = st
		e.events = staticFields(st, func(c *Status) { c.Output, c.Previous, c.Hooks = "", "", nil }, `"events"`, `"buffer_bytes"`)
		e.hooks = staticFields(st, func(c *Status) {}, `"hooks"`, "\n}")
		e.output, e.previous = "\x00", "\x00" // encode them again
	}
	if e.events == nil || e.hooks == nil {
		data, _ := json.MarshalIndent(st, "", "  ")
		return append(b, data...)
	}
	str := func(cached *string, enc *[]byte, v string) []byte {
		if *cached != v || *enc == nil {
			*cached = v
			*enc, _ = json.Marshal(v)
		}
		return *enc
	}
	num := func(b []byte, name string, v uint64) []byte {
		b = append(b, ",\n  \""...)
		b = append(b, name...)
		b = append(b, "\": "...)
		return strconv.AppendUint(b, v, 10)
	}
	b = append(b, "{\n  \"pid\": "...)
	b = strconv.AppendInt(b, int64(st.PID), 10)
	b = append(b, ",\n  \"output\": "...)
	b = append(b, str(&e.output, &e.outputJSON, st.Output)...)
	if st.Previous != "" {
		b = append(b, ",\n  \"previous\": "...)
		b = append(b, str(&e.previous, &e.prevJSON, st.Previous)...)
	}
	b = append(b, ",\n  \"started\": \""...)
	b = st.Started.AppendFormat(b, time.RFC3339Nano)
	b = append(b, "\",\n  \"updated\": \""...)
	b = st.Updated.AppendFormat(b, time.RFC3339Nano)
	b = append(b, "\",\n  "...)
	b = append(b, e.events...)
	b = append(b, "\"buffer_bytes\": "...)
	b = strconv.AppendInt(b, int64(st.BufferBytes), 10)
	b = append(b, ",\n  \"buffer_used\": "...)
	b = strconv.AppendInt(b, int64(st.BufferUsed), 10)
	b = num(b, "recorded", st.Recorded)
	b = num(b, "lost", st.Lost)
	b = num(b, "missed", st.Missed)
	if st.KernelSkipped != nil {
		b = num(b, "kernel_skipped", *st.KernelSkipped)
	}
	if st.KernelSkippedChecked != 0 {
		b = append(b, ",\n  \"kernel_skipped_checked\": "...)
		b = strconv.AppendInt(b, int64(st.KernelSkippedChecked), 10)
	}
	b = append(b, ",\n  \"bytes_written\": "...)
	b = strconv.AppendInt(b, st.Written, 10)
	b = append(b, ",\n  "...)
	return append(b, e.hooks...)
}

// staticFields returns the text json.MarshalIndent writes for a copy of
// st (changed by clear) from the field named from up to to.
func staticFields(st *Status, clear func(*Status), from, to string) []byte {
	c := *st
	clear(&c)
	data, err := json.MarshalIndent(&c, "", "  ")
	if err != nil {
		return nil
	}
	i := bytes.Index(data, []byte(from))
	j := bytes.Index(data[i+1:], []byte(to))
	if i < 0 || j < 0 {
		return nil
	}
	if to == "\n}" {
		return data[i:] // to the end
	}
	return data[i : i+1+j]
}

// write puts data in the file, at its start.
func (s *statusFile) write(data []byte) {
	// One write of the whole file, padded with blanks (which JSON allows
	// after a value) to its size: nothing of a longer status before stays.
	s.buf = append(append(s.buf[:0], data...), '\n')
	for len(s.buf) < s.size {
		s.buf = append(s.buf, ' ')
	}
	n, _ := s.f.WriteAt(s.buf, 0)
	s.size = max(s.size, n)
}

func (s *statusFile) remove() {
	if s.path != "" {
		s.f.Close()
		os.Remove(s.path)
	}
}

// ReadStatuses returns the status of every recorder running on this host;
// files left by recorders that died are removed.
func ReadStatuses(dir string) ([]Status, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "record-*.json"))
	if err != nil {
		return nil, err
	}
	var out []Status
	for _, p := range paths {
		st, ok := readStatus(p)
		if !ok {
			continue
		}
		if st.PID <= 0 || !alive(st.PID) {
			os.Remove(p)
			continue
		}
		out = append(out, st)
	}
	return out, nil
}

// readStatus reads one status file. The recorder rewrites it in place, so
// a read can catch a write half done and not parse: it reads again, a few
// times (a write takes about a microsecond, once a second).
func readStatus(path string) (Status, bool) {
	for range 5 {
		data, err := os.ReadFile(path)
		if err != nil {
			return Status{}, false
		}
		var st Status
		if json.Unmarshal(data, &st) == nil {
			return st, true
		}
	}
	return Status{}, false
}

func alive(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil
}
