// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"path/filepath"

	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// The layers of a journey, indexes of pathSeg.st (export.JourneyLayers).
const (
	jTCPXmit = iota
	jIPSend
	jDevQueue
	jDevXmit
	jDevRecv
	jIPRecv
	jTCPRcv
	jSockRecv
	numJourneyLayers
)

// stamp is the event a segment was seen by at one layer: its time on the
// common timeline and its id plus one (0: not seen).
type stamp struct{ t, id1 uint64 }

func stampOf(e *ev) stamp { return stamp{e.t, e.id + 1} }

// WriteJourneys writes one row of export.JourneyTable per data segment a
// receiver got whose sender is in the traces too: each layer's event,
// matched by identity as the report's hops are (IPv4 id or TCP sequence
// number across the wire; within a host, the kernel call or the packet's
// id and length), not first in, first out. Rows come as each segment's way
// up ends: when the application read it, or at the end of the traces. It
// keeps, per connection, only the segments on their way (bounded queues),
// and returns how many rows it wrote.
func WriteJourneys(ins []trace.Source, rw export.RowWriter) (uint64, error) {
	s, err := openStream(ins)
	if err != nil {
		return 0, err
	}
	defer s.close()
	names := make([]string, len(ins))
	for i, in := range ins {
		names[i] = filepath.Base(in.Name)
	}
	var n uint64
	var werr error
	row := make([]export.Value, len(export.JourneyColumns))
	emit := func(ps *pathSeg, to *connState) {
		if werr != nil {
			return
		}
		journeyRow(row, ps, to, names, s.tl.Wall(0, 0))
		if werr = rw.WriteRow(row); werr == nil {
			n++
		}
	}
	s.newConn = func(cs *connState) {
		cs.hops = newHopTracker(cs)
		cs.hops.onJourney = emit
	}
	s.onEvent = func(e *ev) {
		if cs := e.cs; cs != nil && !cs.notTCP && werr == nil {
			cs.hops.step(e)
		}
	}
	err = s.run()
	for _, src := range s.srcs {
		for _, cs := range src.order {
			if cs.hops != nil {
				cs.hops.flushJourneys()
			}
		}
	}
	if werr != nil {
		return n, werr
	}
	return n, err
}

// journeyRow fills row with the journey of ps to the end to; wall0 turns
// the common timeline into wall-clock time.
func journeyRow(row []export.Value, ps *pathSeg, to *connState, names []string, wall0 int64) {
	from := ps.from.cs
	null := export.Value{Null: true}
	ipid := null
	if ps.hasID {
		ipid = export.Value{Uint: uint64(ps.ipid)}
	}
	row = append(row[:0],
		export.Value{Str: names[from.src.index]}, export.Value{Uint: from.id},
		export.Value{Str: names[to.src.index]}, export.Value{Uint: to.id},
		export.Value{Uint: uint64(ps.seq)}, export.Value{Int: int64(ps.size)}, export.Value{Uint: uint64(max(ps.gso, 1))},
		ipid, export.Value{Int: int64(ps.ipLen)})
	for _, st := range ps.st {
		if st.id1 == 0 {
			row = append(row, null, null)
			continue
		}
		row = append(row, export.Value{Int: int64(st.t) + wall0}, export.Value{Uint: st.id1 - 1})
	}
}
