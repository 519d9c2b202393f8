// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"fmt"
	"iter"
)

// Tally is what a caller copying records into a Writer's room knows of them
// already, having read each record's type and time to check it: how many
// records there are of each type, and their smallest and largest time.
// AppendTallied takes a run with its tally instead of walking the run
// again (the recorder's drain: that walk was a tenth of its CPU time).
//
// The zero Tally is empty; Reset empties it again. Add costs a few
// instructions; everything else costs one step per type counted, not per
// record.
type Tally struct {
	notFirst uint64 // ^ the smallest time: the zero value stands for "none yet"
	last     uint64
	n        int // types counted so far, in ids
	ids      [256]uint8
	counts   [256]uint32
}

// Add counts a record of type id and time ts.
func (t *Tally) Add(id uint8, ts uint64) {
	c := t.counts[id]
	if c == 0 {
		t.ids[uint8(t.n)] = id
		t.n++
	}
	t.counts[id] = c + 1
	t.notFirst = max(t.notFirst, ^ts)
	t.last = max(t.last, ts)
}

// Records returns how many records t counts.
func (t *Tally) Records() uint32 {
	var n uint32
	for _, id := range t.ids[:t.n] {
		n += t.counts[id]
	}
	return n
}

// First and Last return the smallest and largest time of the records t
// counts; both are 0 when it counts none.
func (t *Tally) First() uint64 {
	if t.n == 0 {
		return 0
	}
	return ^t.notFirst
}

// Last: see First.
func (t *Tally) Last() uint64 { return t.last }

// Counts yields each type id t counts, in the order first counted, with
// its count.
func (t *Tally) Counts() iter.Seq2[uint8, uint32] {
	return func(yield func(uint8, uint32) bool) {
		for _, id := range t.ids[:t.n] {
			if !yield(id, t.counts[id]) {
				return
			}
		}
	}
}

// Reset empties t.
func (t *Tally) Reset() {
	for _, id := range t.ids[:t.n] {
		t.counts[id] = 0
	}
	t.n, t.notFirst, t.last = 0, 0, 0
}

// AppendTallied is Append for a caller that has checked each record of
// recs itself (a known type, exactly its type's size) and counted them in
// t: the Writer keeps the same counts, block and file time ranges as
// Append would, from t, without a step per record. What it can check in a
// step per type it does: every type t counts is in the dictionary, and
// the records t counts fill recs exactly; otherwise none of recs is
// added. A tally that miscounts records of equal size is not detected.
// t is not changed.
func (w *Writer) AppendTallied(recs []byte, t *Tally) error {
	if w.err != nil {
		return fmt.Errorf("write records: %w", w.err)
	}
	if len(recs) == 0 {
		if t.n != 0 {
			return fmt.Errorf("write records: the tally counts %d records, the run holds none", t.Records())
		}
		w.giveBackRoom()
		return nil
	}
	if err := w.checkRoom(recs); err != nil {
		return err
	}
	var n uint32
	size := 0
	for id, c := range t.Counts() {
		s := int(w.sizes[id])
		if s == 0 {
			return fmt.Errorf("write records: unknown event type %d", id)
		}
		n += c
		size += int(c) * s
	}
	if size != len(recs) {
		return fmt.Errorf("write records: the tally counts %d bytes of records (%d records), the run holds %d", size, n, len(recs))
	}
	for id, c := range t.Counts() {
		w.counts[id] += uint64(c)
	}
	return w.took(recs, n, t.First(), t.Last())
}
