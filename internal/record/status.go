// SPDX-License-Identifier: Apache-2.0

package record

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
	if data, err := json.MarshalIndent(&s.st, "", "  "); err == nil {
		s.write(data)
	}
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
