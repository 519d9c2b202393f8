// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// Polls is the polls table of one or more traces (export.PollColumns):
// which connections' packets each NAPI poll delivered, as the report's
// receive path places them.
type Polls struct {
	names  []string
	devs   []string
	polls  []pollRow
	shares []rxShare
	wall0  int64
	// Lost is the irq/napi events the recorders lost, over all traces:
	// polls are missing, and packets placed in a later poll than theirs.
	Lost uint64
}

type pollRow struct {
	t, id        uint64
	work, budget uint32
	from, to     uint32 // its connections: shares[from:to]
	cpu, src     uint16
	dev          uint32
}

// ReadPolls reads the traces and places their connections' received
// packets in NAPI polls with the walk that makes the report's receive
// path. A trace set without a napi_poll event is an error that says how to
// record them. The polls are held in memory (40 bytes each, and 16 a
// connection in a poll) to be written in time order across CPUs.
func ReadPolls(ins []trace.Source) (*Polls, error) {
	s, err := openStream(ins)
	if err != nil {
		return nil, err
	}
	defer s.close()
	p := &Polls{wall0: s.tl.Wall(0, 0)}
	rx := make([]*rxTracker, len(s.srcs))
	for i, src := range s.srcs {
		rx[i] = newRxTracker(src.h, src.offset)
		p.names = append(p.names, filepath.Base(src.path))
	}
	s.onOther = func(i int, id uint64, rec trace.Record) {
		if rx[i] != nil {
			rx[i].other(id, rec)
		}
	}
	s.onEvent = func(e *ev) {
		if e.kind == kDevRecv && rx[e.src] != nil && e.cs != nil {
			rx[e.src].dev(e.t, e.cs.id, e.cpu)
		}
	}
	if err := s.run(); err != nil {
		return nil, err
	}
	devIndex := map[string]uint32{}
	for i, src := range s.srcs {
		rp := rx[i].finish(src.path, src.last-src.first, func(np *napiPoll) {
			d, ok := devIndex[np.dev]
			if !ok {
				d = uint32(len(p.devs))
				p.devs = append(p.devs, np.dev)
				devIndex[np.dev] = d
			}
			from := uint32(len(p.shares))
			p.shares = append(p.shares, np.conns...)
			p.polls = append(p.polls, pollRow{t: np.t, id: np.id, work: np.work, budget: np.budget,
				from: from, to: uint32(len(p.shares)), cpu: np.cpu, src: uint16(i), dev: d})
		})
		if rp != nil {
			p.Lost += rp.Lost
		}
	}
	if len(p.polls) == 0 {
		return nil, fmt.Errorf("no napi_poll events in %s: record with --groups default,irq,napi to list NAPI polls", strings.Join(p.names, ", "))
	}
	// Each CPU's polls come in time order; the table interleaves them.
	sort.SliceStable(p.polls, func(i, j int) bool { return p.polls[i].t < p.polls[j].t })
	return p, nil
}

// Write writes the table's rows to rw, in time order (equal times in the
// order of the traces, then of CPUs), and returns how many it wrote.
func (p *Polls) Write(rw export.RowWriter) (uint64, error) {
	var n uint64
	row := make([]export.Value, 0, len(export.PollColumns))
	null := export.Value{Null: true}
	for i := range p.polls {
		pr := &p.polls[i]
		shares := p.shares[pr.from:pr.to]
		row = append(row[:0], export.Value{Str: p.names[pr.src]}, export.Value{Uint: uint64(pr.cpu)},
			export.Value{Int: int64(pr.t) + p.wall0}, export.Value{Uint: pr.id}, export.Value{Str: p.devs[pr.dev]},
			export.Value{Int: int64(pr.work)}, export.Value{Int: int64(pr.budget)}, export.Value{Uint: uint64(len(shares))})
		head := len(row)
		if len(shares) == 0 {
			if err := rw.WriteRow(append(row, null, null)); err != nil {
				return n, err
			}
			n++
			continue
		}
		for _, sh := range shares {
			row = append(row[:head], export.Value{Uint: sh.conn}, export.Value{Uint: sh.packets})
			if err := rw.WriteRow(row); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}
