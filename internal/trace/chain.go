// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"reflect"
)

// Rotation is what a file of a rotated recording says, in its header's
// extra "rotation" key, about its place in the chain of files. A chain is
// read back as one timeline by OpenChain.
type Rotation struct {
	// Recording is the same random id in every file of one recording.
	Recording string `json:"recording"`
	// Seq numbers the files of the recording from 0.
	Seq int `json:"seq"`
	// Prev is the base name of the previous file; empty for the first.
	Prev string `json:"prev,omitempty"`
	// FirstRecord is the index, in the recording's stream of records, of
	// this file's first own record: the records of the files before it,
	// carried copies not counted.
	FirstRecord uint64 `json:"first_record"`
	// Carried is the number of records at the start of the file that
	// repeat state announced in earlier files (the task, iface and
	// conn_open records still live), so that the file reads on its own.
	// They carry FlagCarried and their original time. A reader of the
	// whole chain skips them.
	Carried uint64 `json:"carried"`
	// PrevLastNs is the largest time_ns of the previous file.
	PrevLastNs uint64 `json:"prev_last_ns,omitempty"`
	// RecordingStartWallNs is when the recording (its first file) started;
	// the header's start_wall_ns is when this file started.
	RecordingStartWallNs int64 `json:"recording_start_wall_ns"`
}

// RotationEnd is what the summary of a rotated file says in its extra
// "rotation" key.
type RotationEnd struct {
	// Next is the base name of the file that continues the recording;
	// empty in the last file.
	Next string `json:"next,omitempty"`
	// Records counts the file's own records (carried copies excluded), so
	// NextRecord = FirstRecord + Records is where the next file continues.
	Records    uint64 `json:"records"`
	NextRecord uint64 `json:"next_record"`
	// Reason says why the file ended: "interval", "size", "end" (the
	// recording ended) or "disk full".
	Reason string `json:"reason"`
}

// FlagCarried marks, in the flags byte of a task, iface or conn_open
// record, a copy of state announced in an earlier file of the chain.
const FlagCarried = 0x80

// RotationKey is the key of Header.Extra and Summary.Extra that holds
// Rotation and RotationEnd.
const RotationKey = "rotation"

// Rotation returns the file's place in a rotated recording, or nil when the
// file is not part of one. For a Reader made by OpenChain it is the first
// file's.
func (r *Reader) Rotation() *Rotation {
	var v struct {
		Extra struct {
			Rotation *Rotation `json:"rotation"`
		} `json:"extra"`
	}
	if json.Unmarshal(r.raw, &v) != nil {
		return nil
	}
	return v.Extra.Rotation
}

// RotationEnd returns what the end block says about the next file, once
// Next has returned io.EOF; nil when the file was cut short or is not part
// of a rotated recording. For a Reader made by OpenChain it is the last
// file's.
func (r *Reader) RotationEnd() *RotationEnd {
	if r.chain != nil {
		return r.chain.cur.RotationEnd()
	}
	var v struct {
		Extra struct {
			Rotation *RotationEnd `json:"rotation"`
		} `json:"extra"`
	}
	if r.rawSummary == nil || json.Unmarshal(r.rawSummary, &v) != nil {
		return nil
	}
	return v.Extra.Rotation
}

// Warnings returns what a Reader made by OpenChain found wrong with the
// chain so far: a missing file, a file cut short before the next began, a
// seam that does not meet. Records are still returned across such gaps.
//
// Once Next has returned io.EOF, it also says what salvage skipped, if
// anything (SetSalvage).
func (r *Reader) Warnings() []string {
	ws := append([]string(nil), r.notes...)
	if r.chain != nil {
		ws = append(ws, r.chain.warnings...)
	}
	if w := r.salvageWarning(); w != "" {
		ws = append(ws, w)
	}
	return ws
}

// Source names one trace to read: a single file, or the files of one
// rotated recording, oldest first, read as one timeline.
type Source struct {
	Name  string   // what to call it in output
	Paths []string // one or more files
	// Since and Until, if not 0, keep the events of [Since, Until) only
	// (wall-clock ns since the Unix epoch; see Reader.SetWindow).
	Since, Until int64
	// Salvage reads on after damaged data (Reader.SetSalvage).
	Salvage bool
	// Keep, if set, makes the selection of records each Open reads
	// (Reader.SetKeep): a new one per reader, since a selection may
	// follow the trace as it is read (the names of its threads).
	Keep func() func(Record) bool
	// Notes are known before reading (files of the recording missing
	// before the first): Warnings returns them first.
	Notes []string
}

// Open opens the source: Open for one file, OpenChain for several.
func (s Source) Open() (*Reader, error) {
	var r *Reader
	var err error
	if len(s.Paths) == 1 {
		r, err = Open(s.Paths[0])
	} else {
		r, err = OpenChain(s.Paths)
	}
	if err != nil {
		return nil, err
	}
	r.SetWindow(s.Since, s.Until)
	r.SetSalvage(s.Salvage)
	if s.Keep != nil {
		r.SetKeep(s.Keep())
	}
	r.notes = s.Notes
	return r, nil
}

// Sources makes a Source of each path, named after it.
func Sources(paths []string) []Source {
	out := make([]Source, len(paths))
	for i, p := range paths {
		out[i] = Source{Name: p, Paths: []string{p}}
	}
	return out
}

// OpenChain opens the files of one rotated recording, oldest first, as one
// Reader: its records are those of every file in turn, without the carried
// copies at the start of the files after the first (the first file's are
// kept, since nothing before them is read). Header is the first file's.
// Every file must belong to the same recording and have the same event
// dictionary. A missing file or one cut short is not an error: the Reader
// goes on with the next file, keeps its carried records, and says so in
// Warnings. Truncated reports on the last file; Summary sums the files'.
func OpenChain(paths []string) (*Reader, error) {
	if len(paths) == 0 {
		return nil, errors.New("open trace chain: no files")
	}
	first, err := Open(paths[0])
	if err != nil {
		return nil, err
	}
	c := &chain{paths: paths, cur: first, rot: first.Rotation()}
	if c.rot != nil {
		c.keep = c.rot.Carried
	}
	if len(paths) > 1 && c.rot == nil {
		first.Close()
		return nil, fmt.Errorf("open trace chain: %s is not a file of a rotated recording", paths[0])
	}
	r := &Reader{hdr: first.hdr, order: first.order, swap: first.swap, idx: first.idx, raw: first.raw, chain: c}
	return r, nil
}

// chain is the state of a Reader made by OpenChain.
type chain struct {
	paths    []string
	i        int     // index of the file being read
	cur      *Reader // the file being read
	rot      *Rotation
	skip     uint64 // carried records still to skip in cur
	keep     uint64 // carried records still to return (not skipped: nothing before them is read), not counted in read
	read     uint64 // own records read from cur
	warnings []string
	sum      Summary // summed over the files that ended properly
	sums     int     // how many did
	skipped  map[string]uint64
	salv     Salvage // what salvage skipped in the files before cur
}

func (r *Reader) chainNext() (Record, error) {
	c := r.chain
	for {
		rec, err := c.cur.next()
		if errors.Is(err, io.EOF) {
			c.endFile()
			if c.i+1 >= len(c.paths) {
				return Record{}, io.EOF
			}
			if err := c.advance(r); err != nil {
				return Record{}, err
			}
			continue
		}
		if err != nil {
			return Record{}, fmt.Errorf("%s: %w", filepath.Base(c.paths[c.i]), err)
		}
		if c.skip > 0 {
			c.skip--
			if c.skipped == nil {
				c.skipped = map[string]uint64{}
			}
			c.skipped[rec.Type.Name]++
			continue
		}
		if c.keep > 0 {
			c.keep--
			return rec, nil
		}
		c.read++
		return rec, nil
	}
}

// endFile adds the finished file's summary to the chain's.
func (c *chain) endFile() {
	s := c.cur.summary
	if s == nil {
		return
	}
	if c.sum.Events == nil {
		c.sum.Events = map[string]uint64{}
	}
	for k, n := range s.Events {
		c.sum.Events[k] += n
	}
	c.sum.Lost += s.Lost
	c.sum.Blocks += s.Blocks
	c.sum.EndWallNs = s.EndWallNs
	c.sum.Extra = s.Extra
	c.sums++
}

// advance closes the current file and opens the next, checking that it
// continues where the current one ended.
func (c *chain) advance(r *Reader) error {
	prevPath, prevRot, prevEnd := c.paths[c.i], c.rot, c.cur.RotationEnd()
	prevCut, _ := c.cur.Truncated()
	add(&c.salv, c.cur.salv)
	c.cur.Close()
	c.i++
	path := c.paths[c.i]
	nr, err := Open(path)
	if err != nil {
		return err
	}
	c.cur = nr
	nr.salvage = r.salvage
	rot := nr.Rotation()
	switch {
	case rot == nil:
		return fmt.Errorf("%s is not a file of a rotated recording and cannot follow %s", path, filepath.Base(prevPath))
	case rot.Recording != prevRot.Recording:
		return fmt.Errorf("%s belongs to recording %s, not %s of %s", path, rot.Recording, prevRot.Recording, filepath.Base(prevPath))
	case !reflect.DeepEqual(nr.hdr.Types, r.hdr.Types):
		return fmt.Errorf("%s has a different event dictionary from %s", path, filepath.Base(c.paths[0]))
	case rot.Seq <= prevRot.Seq:
		return fmt.Errorf("%s (file %d of its recording) cannot follow %s (file %d): give the files oldest first", path, rot.Seq, filepath.Base(prevPath), prevRot.Seq)
	}
	c.skip, c.keep = rot.Carried, 0
	switch {
	case rot.Seq != prevRot.Seq+1:
		c.warnings = append(c.warnings, fmt.Sprintf("files %d to %d of recording %s are missing between %s and %s: their events are not in the timeline",
			prevRot.Seq+1, rot.Seq-1, rot.Recording, filepath.Base(prevPath), filepath.Base(path)))
		c.skip, c.keep = 0, rot.Carried
	case prevCut:
		if want := rot.FirstRecord - prevRot.FirstRecord; c.read < want {
			c.warnings = append(c.warnings, fmt.Sprintf("%s was cut short: %d of its records are missing before %s", filepath.Base(prevPath), want-c.read, filepath.Base(path)))
		}
	case prevEnd != nil && (prevEnd.NextRecord != rot.FirstRecord || c.read != prevEnd.Records):
		c.warnings = append(c.warnings, fmt.Sprintf("the seam between %s and %s does not meet: %s ends at record %d (%d read), %s starts at %d",
			filepath.Base(prevPath), filepath.Base(path), filepath.Base(prevPath), prevEnd.NextRecord, c.read, filepath.Base(path), rot.FirstRecord))
	}
	c.rot, c.read = rot, 0
	return nil
}

func (c *chain) close() error {
	if c.cur == nil {
		return nil
	}
	add(&c.salv, c.cur.salv) // Warnings may still be asked after Close
	err := c.cur.Close()
	c.cur = nil
	return err
}

func (c *chain) summary() *Summary {
	if c.cur == nil || c.cur.summary == nil || c.sums == 0 {
		return nil
	}
	s := c.sum
	s.Events = map[string]uint64{}
	for k, n := range c.sum.Events {
		if n -= c.skipped[k]; n > 0 {
			s.Events[k] = n
		}
	}
	return &s
}
