// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"encoding/json"
	"fmt"
	"sort"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// RxPath is the receive path of one trace recorded with the irq and napi
// groups (magnet record --groups default,irq,napi): per CPU, the time in
// network devices' hard interrupts, in NET_RX and NET_TX softirqs and in
// NAPI polls; how many packets each poll took (interrupt coalescing at
// work); and which connections' packets arrived in which polls.
type RxPath struct {
	Trace string   `json:"trace"`
	SpanS float64  `json:"span_s"`
	CPUs  []*RxCPU `json:"cpus"`
	All   *RxCPU   `json:"all"`
	// PacketsPerPoll is the distribution of napi_poll's work: polls by
	// packets taken, 0 to the budget.
	PacketsPerPoll map[int]uint64 `json:"packets_per_poll"`
	Conns          []*RxConn      `json:"connections,omitempty"`
	// NICs is what the recording host's hostcheck read of its interfaces'
	// receive coalescing and GRO, beside which the polls are read.
	NICs []NICCoalesce `json:"nics,omitempty"`
	Lost uint64        `json:"lost,omitempty"` // irq/napi events lost: figures are short
}

// NICCoalesce is an interface's receive interrupt coalescing (ethtool),
// from the trace header's hostcheck report.
type NICCoalesce struct {
	Name       string  `json:"name"`
	GRO        bool    `json:"gro"`
	RxUsecs    *uint32 `json:"rx_usecs,omitempty"`
	RxFrames   *uint32 `json:"rx_frames,omitempty"`
	AdaptiveRx *bool   `json:"adaptive_rx,omitempty"`
	Error      string  `json:"error,omitempty"` // why the coalescing is unknown
}

// nicsOf reads the interfaces' coalescing from a trace header's
// extra.hostcheck; loopback and interfaces that are down are left out.
func nicsOf(h *trace.Header) []NICCoalesce {
	raw, err := json.Marshal(h.Extra["hostcheck"])
	if err != nil {
		return nil
	}
	var hc struct {
		Interfaces []struct {
			Name     string `json:"name"`
			Up       bool   `json:"up"`
			Loopback bool   `json:"loopback"`
			Offloads *struct {
				GRO bool `json:"gro"`
			} `json:"offloads"`
			Coalesce *struct {
				RxUsecs    *uint32 `json:"rx_usecs"`
				RxFrames   *uint32 `json:"rx_frames"`
				AdaptiveRx *bool   `json:"adaptive_rx"`
			} `json:"coalesce"`
			CoalesceError string `json:"coalesce_error"`
		} `json:"interfaces"`
	}
	if json.Unmarshal(raw, &hc) != nil {
		return nil
	}
	var out []NICCoalesce
	for _, in := range hc.Interfaces {
		if in.Loopback || !in.Up {
			continue
		}
		n := NICCoalesce{Name: in.Name, Error: in.CoalesceError}
		if in.Offloads != nil {
			n.GRO = in.Offloads.GRO
		}
		if c := in.Coalesce; c != nil {
			n.RxUsecs, n.RxFrames, n.AdaptiveRx = c.RxUsecs, c.RxFrames, c.AdaptiveRx
		}
		out = append(out, n)
	}
	return out
}

// RxCPU is one CPU's (or, with CPU -1, all CPUs') receive-path time.
type RxCPU struct {
	CPU int `json:"cpu"`
	// Time in ns and share of the trace's span: hard interrupts of the
	// network devices' lines, NET_RX and NET_TX softirqs, and NAPI polls
	// (from the softirq's start or the previous poll's end to the poll's
	// end: napi_poll fires when a poll returns).
	HardIRQNs    uint64  `json:"hardirq_ns"`
	HardIRQShare float64 `json:"hardirq_share"`
	NetRxNs      uint64  `json:"net_rx_ns"`
	NetRxShare   float64 `json:"net_rx_share"`
	NetTxNs      uint64  `json:"net_tx_ns"`
	NetTxShare   float64 `json:"net_tx_share"`
	NapiNs       uint64  `json:"napi_ns"`
	NapiShare    float64 `json:"napi_share"`
	HardIRQs     uint64  `json:"hardirqs"`
	NetRx        uint64  `json:"net_rx"`
	NetTx        uint64  `json:"net_tx"`
	Polls        uint64  `json:"polls"`
	Packets      uint64  `json:"packets"`
	FullPolls    uint64  `json:"full_polls"` // polls that used their whole budget: more was waiting
	PerPoll      Summary `json:"packets_per_poll"`
	perPoll      Dist
}

// RxConn is how one connection's received packets (dev_recv) fell into
// NAPI polls.
type RxConn struct {
	Conn uint64 `json:"conn"`
	// Packets is the connection's dev_recv placed in a poll: between the
	// previous poll's end (or its NET_RX softirq's start) and a poll's end
	// on the same CPU.
	Packets uint64  `json:"packets"`
	Polls   uint64  `json:"polls"`
	PerPoll float64 `json:"packets_per_poll"`
	// SharedPolls is how many of its polls delivered packets of other
	// connections too: connections coalesced into one poll.
	SharedPolls uint64 `json:"shared_polls"`
	// OutsidePolls is its dev_recv placed in no poll: outside a NET_RX
	// softirq with no poll before it on the CPU, after the last poll of
	// a softirq, or before the first poll the recording saw on the CPU.
	OutsidePolls uint64 `json:"outside_polls,omitempty"`
}

type rxKind uint8

const (
	rxIRQEntry rxKind = iota
	rxIRQExit
	rxSoftEntry
	rxSoftExit
	rxPoll
	rxDev
)

type rxEvent struct {
	t    uint64
	conn uint64 // dev_recv's connection; napi_poll's record id
	v, w uint32 // irq or vec; napi_poll's work
	bud  uint32 // napi_poll's budget
	cpu  uint16
	dev  uint16 // napi_poll's device, an index of rxTracker.devs
	kind rxKind
}

// napiPoll is one NAPI poll as the walk placed packets in it.
type napiPoll struct {
	t, id        uint64 // its end on the timeline; its record's place in the trace
	work, budget uint32
	cpu          uint16
	dev          string
	// conns are the connections whose packets it delivered, in the order
	// of their first packet in it.
	conns []rxShare
}

// rxShare is a connection's packets in one poll.
type rxShare struct{ conn, packets uint64 }

// rxTracker gathers one trace's receive-path events as they are read (in
// file order) and puts each CPU's in time order at the end.
type rxTracker struct {
	kinds                  [256]rxKind
	has                    [256]bool
	irq, vec, work, budget [256]trace.Field
	devName                [256]trace.Field
	lostF                  []trace.Field
	devs                   []string // napi_poll's device names, interned
	devIndex               map[string]uint16
	any                    bool
	evs                    []rxEvent
	lost                   uint64
	offset                 int64 // the trace's place on the report's timeline
	nics                   []NICCoalesce
}

func newRxTracker(h *trace.Header, offset int64) *rxTracker {
	rt := &rxTracker{offset: offset, devIndex: map[string]uint16{}}
	for _, t := range h.Types {
		var k rxKind
		switch {
		case t.Group == "irq" && t.Name == "irq_handler_entry":
			k = rxIRQEntry
		case t.Group == "irq" && t.Name == "irq_handler_exit":
			k = rxIRQExit
		case t.Group == "irq" && t.Name == "softirq_entry":
			k = rxSoftEntry
		case t.Group == "irq" && t.Name == "softirq_exit":
			k = rxSoftExit
		case t.Group == "napi" && t.Name == "napi_poll":
			k = rxPoll
		case t.Name == "kevent_lost":
			for _, f := range t.Fields {
				switch f.Name {
				case "n_irq_handler_entry", "n_irq_handler_exit", "n_softirq_entry", "n_softirq_exit", "n_napi_poll":
					rt.lostF = append(rt.lostF, f)
				}
			}
			continue
		default:
			continue
		}
		rt.kinds[t.ID], rt.has[t.ID], rt.any = k, true, true
		rt.irq[t.ID], _ = t.Field("irq")
		rt.vec[t.ID], _ = t.Field("vec")
		rt.work[t.ID], _ = t.Field("work")
		rt.budget[t.ID], _ = t.Field("budget")
		rt.devName[t.ID], _ = t.Field("dev_name")
	}
	if !rt.any {
		return nil
	}
	rt.nics = nicsOf(h)
	return rt
}

// other takes a record the report has no other use for; recID is its
// place in its trace.
func (rt *rxTracker) other(recID uint64, rec trace.Record) {
	id := rec.TypeID()
	if rec.Type != nil && rec.Type.Name == "kevent_lost" {
		for _, f := range rt.lostF {
			n, _ := rec.FieldUint(f)
			rt.lost += n
		}
		return
	}
	if !rt.has[id] {
		return
	}
	e := rxEvent{t: uint64(max(int64(rec.Time())+rt.offset, 0)), cpu: rec.CPU(), kind: rt.kinds[id]}
	switch e.kind {
	case rxIRQEntry, rxIRQExit:
		v, _ := rec.FieldInt(rt.irq[id])
		e.v = uint32(v)
	case rxSoftEntry, rxSoftExit:
		v, _ := rec.FieldUint(rt.vec[id])
		e.v = uint32(v)
	case rxPoll:
		w, _ := rec.FieldInt(rt.work[id])
		b, _ := rec.FieldInt(rt.budget[id])
		e.w, e.bud = uint32(max(w, 0)), uint32(max(b, 0))
		e.conn, e.dev = recID, rt.devOf(rec, rt.devName[id])
	}
	rt.evs = append(rt.evs, e)
}

// devOf interns the device name napi_poll record rec carries in field f.
func (rt *rxTracker) devOf(rec trace.Record, f trace.Field) uint16 {
	name, _ := rec.Value(f).(string)
	if i, ok := rt.devIndex[name]; ok {
		return i
	}
	if len(rt.devs) > 0xffff {
		return 0 // beyond any host's devices: the first name stands in
	}
	i := uint16(len(rt.devs))
	rt.devs = append(rt.devs, name)
	rt.devIndex[name] = i
	return i
}

// dev takes a dev_recv of connection conn, at time t on cpu.
func (rt *rxTracker) dev(t, conn uint64, cpu uint16) {
	if conn != 0 {
		rt.evs = append(rt.evs, rxEvent{t: t, conn: conn, cpu: cpu, kind: rxDev})
	}
}

const (
	vecNetTx = 2
	vecNetRx = 3
)

// finish walks each CPU's events in time order, placing every dev_recv in
// the poll it arrived in, and returns the trace's receive path. onPoll, if
// not nil, is called with each poll, the connections' packets it delivered
// included; the poll is valid only during the call. This walk is the one
// place packets are put in polls: the report's figures and the polls
// table (WritePolls) both come from it.
func (rt *rxTracker) finish(path string, span uint64, onPoll func(*napiPoll)) *RxPath {
	if rt == nil {
		return nil
	}
	sort.SliceStable(rt.evs, func(i, j int) bool {
		a, b := &rt.evs[i], &rt.evs[j]
		if a.cpu != b.cpu {
			return a.cpu < b.cpu
		}
		return a.t < b.t
	})
	rp := &RxPath{Trace: path, SpanS: float64(span) / 1e9, PacketsPerPoll: map[int]uint64{}, Lost: rt.lost, All: &RxCPU{CPU: -1}, NICs: rt.nics}
	conns := map[uint64]*RxConn{}
	var order []uint64
	var cpu *RxCPU
	var irqAt, softAt [4]uint64 // entry times; 0 = not inside
	var irqNum uint32
	var pollFrom uint64 // start of the poll that ends next
	var napiNs uint64   // poll time of the NET_RX softirq under way
	// poll.conns gathers the connections' packets since pollFrom: the
	// poll that ends next delivered them.
	var poll napiPoll
	unplaced := func() { // packets that no poll ends after
		for _, sh := range poll.conns {
			conns[sh.conn].OutsidePolls += sh.packets
		}
		poll.conns = poll.conns[:0]
	}
	for i := range rt.evs {
		e := &rt.evs[i]
		if cpu == nil || int(e.cpu) != cpu.CPU {
			unplaced()
			cpu = &RxCPU{CPU: int(e.cpu)}
			rp.CPUs = append(rp.CPUs, cpu)
			irqAt, softAt, pollFrom, napiNs = [4]uint64{}, [4]uint64{}, 0, 0
		}
		switch e.kind {
		case rxIRQEntry:
			irqAt[0], irqNum = e.t, e.v
		case rxIRQExit:
			if irqAt[0] != 0 && irqNum == e.v && e.t >= irqAt[0] {
				cpu.HardIRQNs += e.t - irqAt[0]
				cpu.HardIRQs++
			}
			irqAt[0] = 0
		case rxSoftEntry:
			if e.v == vecNetRx || e.v == vecNetTx {
				softAt[e.v] = e.t
			}
			if e.v == vecNetRx {
				pollFrom, napiNs = e.t, 0
			}
		case rxSoftExit:
			if (e.v == vecNetRx || e.v == vecNetTx) && softAt[e.v] != 0 && e.t >= softAt[e.v] {
				d := e.t - softAt[e.v]
				if e.v == vecNetRx {
					cpu.NetRxNs += d
					cpu.NetRx++
					// Poll time counts only within a softirq seen
					// whole, so that it stays within NET_RX time
					// when entries or exits were lost.
					cpu.NapiNs += napiNs
				} else {
					cpu.NetTxNs += d
					cpu.NetTx++
				}
			}
			if e.v < 4 {
				softAt[e.v] = 0
			}
			if e.v == vecNetRx {
				pollFrom, napiNs = 0, 0
				unplaced() // after the softirq's last poll: in none
			}
		case rxPoll:
			cpu.Polls++
			cpu.Packets += uint64(e.w)
			if e.bud > 0 && e.w >= e.bud {
				cpu.FullPolls++
			}
			cpu.perPoll.Add(float64(e.w))
			rp.All.perPoll.Add(float64(e.w))
			rp.PacketsPerPoll[int(e.w)]++
			if pollFrom != 0 && softAt[vecNetRx] != 0 && e.t >= pollFrom {
				napiNs += e.t - pollFrom
			}
			pollFrom = e.t
			for _, sh := range poll.conns {
				rc := conns[sh.conn]
				rc.Packets += sh.packets
				rc.Polls++
				if len(poll.conns) > 1 {
					rc.SharedPolls++
				}
			}
			if onPoll != nil {
				poll.t, poll.id, poll.work, poll.budget, poll.cpu, poll.dev = e.t, e.conn, e.w, e.bud, e.cpu, rt.devs[e.dev]
				onPoll(&poll)
			}
			poll.conns = poll.conns[:0]
		case rxDev:
			rc := conns[e.conn]
			if rc == nil {
				rc = &RxConn{Conn: e.conn}
				conns[e.conn] = rc
				order = append(order, e.conn)
			}
			if pollFrom == 0 && softAt[vecNetRx] == 0 {
				rc.OutsidePolls++
				break
			}
			k := 0
			for k < len(poll.conns) && poll.conns[k].conn != e.conn {
				k++
			}
			if k == len(poll.conns) {
				poll.conns = append(poll.conns, rxShare{conn: e.conn})
			}
			poll.conns[k].packets++
		}
	}
	unplaced()
	share := func(ns uint64) float64 {
		if span == 0 {
			return 0
		}
		return float64(ns) / float64(span)
	}
	for _, c := range rp.CPUs {
		a := rp.All
		a.HardIRQNs += c.HardIRQNs
		a.NetRxNs += c.NetRxNs
		a.NetTxNs += c.NetTxNs
		a.NapiNs += c.NapiNs
		a.HardIRQs += c.HardIRQs
		a.NetRx += c.NetRx
		a.NetTx += c.NetTx
		a.Polls += c.Polls
		a.Packets += c.Packets
		a.FullPolls += c.FullPolls
	}
	for _, c := range append(rp.CPUs, rp.All) {
		c.HardIRQShare, c.NetRxShare, c.NetTxShare, c.NapiShare = share(c.HardIRQNs), share(c.NetRxNs), share(c.NetTxNs), share(c.NapiNs)
		c.PerPoll = summarise(&c.perPoll)
	}
	// The all-CPU share is of one CPU's time, summed: it may pass 1.
	for _, id := range order {
		rc := conns[id]
		if rc.Packets == 0 {
			continue
		}
		if rc.Polls > 0 {
			rc.PerPoll = float64(rc.Packets) / float64(rc.Polls)
		}
		rp.Conns = append(rp.Conns, rc)
	}
	return rp
}

// PlotNapi builds the figure of the packets each NAPI poll took: polls by
// packets taken, from 0 to the budget. A trace without napi_poll events is
// an error that says how to record them.
func PlotNapi(in trace.Source) (*Figure, error) {
	rep, err := ModulationOf([]trace.Source{in}, 0)
	if err != nil {
		return nil, err
	}
	var rp *RxPath
	if len(rep.ReceivePath) > 0 {
		rp = rep.ReceivePath[0]
	}
	if rp == nil || rp.All.Polls == 0 {
		return nil, fmt.Errorf("%s has no napi_poll events: record with --groups default,napi to plot packets per poll", in.Name)
	}
	fig := &Figure{Title: fmt.Sprintf("packets per NAPI poll: %d polls took %d packets (mean %.1f a poll)", rp.All.Polls, rp.All.Packets, rp.All.PerPoll.Mean),
		XLabel: "packets taken by the poll", YLabel: "polls (log scale)", LogY: true, Warnings: rep.Warnings}
	ks := make([]int, 0, len(rp.PacketsPerPoll))
	for k := range rp.PacketsPerPoll {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	s := Named{Name: "polls", Scatter: true}
	for _, k := range ks {
		s.X, s.Y = append(s.X, float64(k)), append(s.Y, float64(rp.PacketsPerPoll[k]))
	}
	fig.Series = []Named{s}
	return fig, nil
}
