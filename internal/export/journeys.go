// SPDX-License-Identifier: Apache-2.0

package export

// JourneyLayers are the layers a data segment passes, in order, from the
// sender's TCP to the receiver's application: each has a time and an event
// id column in the journeys table.
var JourneyLayers = []string{"tcp_xmit", "ip_send", "dev_queue", "dev_xmit", "dev_recv", "ip_recv", "tcp_rcv", "sock_recv"}

// JourneyColumns are the columns of the journeys table: one row per data
// segment the receiver got, with where each end recorded it. For each
// layer, <layer>_ns is the time of its event (wall clock, as the event
// table's time_ns) and <layer>_id the event's id: its place in its trace
// (0 for the trace's first record, metadata included), null where the
// layer was not recorded for the segment.
var JourneyColumns = journeyColumns()

func journeyColumns() []Column {
	cols := []Column{
		{"trace", KindString}, {"conn", KindUint}, {"peer_trace", KindString}, {"peer", KindUint},
		{"seq", KindUint}, {"payload", KindInt}, {"gso_segs", KindUint}, {"ip_id", KindUint}, {"ip_len", KindInt},
	}
	for _, l := range JourneyLayers {
		cols = append(cols, Column{l + "_ns", KindInt}, Column{l + "_id", KindUint})
	}
	return cols
}

// JourneyTable is the table of JourneyColumns.
func JourneyTable() *Table {
	t := &Table{Columns: JourneyColumns, index: map[string]int{}}
	for i, c := range t.Columns {
		t.index[c.Name] = i
	}
	return t
}
