// SPDX-License-Identifier: Apache-2.0

package export

// PollColumns are the columns of the polls table: one row per NAPI poll
// and connection whose received packets (dev_recv) it delivered, and one
// row, conn and packets null, per poll that delivered none of a recorded
// connection. poll_ns is the poll's end (napi_poll fires when a poll
// returns), wall clock as the event table's time_ns; poll_id is the
// napi_poll record's place in its trace (0 for the trace's first record,
// metadata included); dev, work and budget are napi_poll's fields; conns
// is how many connections the poll delivered packets of.
var PollColumns = []Column{
	{"trace", KindString}, {"cpu", KindUint}, {"poll_ns", KindInt}, {"poll_id", KindUint},
	{"dev", KindString}, {"work", KindInt}, {"budget", KindInt}, {"conns", KindUint},
	{"conn", KindUint}, {"packets", KindUint},
}

// PollTable is the table of PollColumns.
func PollTable() *Table {
	t := &Table{Columns: PollColumns, index: map[string]int{}}
	for i, c := range t.Columns {
		t.index[c.Name] = i
	}
	return t
}
