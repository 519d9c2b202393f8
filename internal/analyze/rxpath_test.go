// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"encoding/binary"
	"encoding/json"
	"testing"

	"github.com/magnet-tracer/magnet/internal/trace"
)

func rxHeader() *trace.Header {
	u := func(name string, off int) trace.Field {
		return trace.Field{Name: name, Offset: off, Size: 4, Kind: trace.KindUint}
	}
	i := func(name string, off int) trace.Field {
		return trace.Field{Name: name, Offset: off, Size: 4, Kind: trace.KindInt}
	}
	return &trace.Header{Types: []trace.EventType{
		{ID: 64, Name: "irq_handler_entry", Group: "irq", Size: 40, Fields: []trace.Field{i("irq", 32)}},
		{ID: 65, Name: "irq_handler_exit", Group: "irq", Size: 40, Fields: []trace.Field{i("irq", 32)}},
		{ID: 66, Name: "softirq_entry", Group: "irq", Size: 40, Fields: []trace.Field{u("vec", 32)}},
		{ID: 67, Name: "softirq_exit", Group: "irq", Size: 40, Fields: []trace.Field{u("vec", 32)}},
		{ID: 68, Name: "napi_poll", Group: "napi", Size: 40, Fields: []trace.Field{i("work", 32), i("budget", 36)}},
		{ID: 69, Name: "softirq_entry_2", Group: "tracepoint", Size: 40, Fields: []trace.Field{u("vec", 32)}},
	}}
}

// TestRxPathTimes: the receive path's times, polls and connections from a
// hand-made sequence on two CPUs, given out of time order as a recorder
// may store them.
func TestRxPathTimes(t *testing.T) {
	h := rxHeader()
	rt := newRxTracker(h, 0)
	rec := func(id uint8, tm uint64, cpu uint16, a, b int32) trace.Record {
		d := make([]byte, 40)
		binary.NativeEndian.PutUint64(d, tm)
		binary.NativeEndian.PutUint16(d[28:], cpu)
		d[30] = id
		binary.NativeEndian.PutUint32(d[32:], uint32(a))
		binary.NativeEndian.PutUint32(d[36:], uint32(b))
		return trace.Record{Type: h.TypeByID(id), Data: d}
	}
	// CPU 0: irq 30 for 2 µs; NET_RX 1000-1900 with two polls (8 then 64
	// packets, the second using its whole budget); connection 7's packets
	// at 1100 and 1500 (one in each poll), connection 9's at 1200; a
	// user's own softirq_entry tracepoint, not the group's, is ignored.
	// CPU 1: NET_TX 500-600.
	for _, r := range []trace.Record{
		rec(68, 1400, 0, 8, 64),
		rec(64, 100, 0, 30, 0),
		rec(65, 2100, 0, 30, 0),
		rec(66, 1000, 0, 3, 0),
		rec(69, 1000, 0, 3, 0),
		rec(68, 1800, 0, 64, 64),
		rec(67, 1900, 0, 3, 0),
		rec(66, 500, 1, 2, 0),
		rec(67, 600, 1, 2, 0),
	} {
		rt.other(0, r)
	}
	rt.dev(1100, 7, 0)
	rt.dev(1200, 9, 0)
	rt.dev(1500, 7, 0)
	rt.dev(3000, 9, 0) // outside any softirq: in no poll
	rp := rt.finish("x", 10000, nil)
	if len(rp.CPUs) != 2 {
		t.Fatalf("%d CPUs", len(rp.CPUs))
	}
	c0, c1 := rp.CPUs[0], rp.CPUs[1]
	if c0.HardIRQNs != 2000 || c0.HardIRQs != 1 || c0.NetRxNs != 900 || c0.NetRx != 1 || c0.NapiNs != 800 || c0.Polls != 2 || c0.Packets != 72 || c0.FullPolls != 1 {
		t.Errorf("cpu 0: %+v", c0)
	}
	if c1.NetTxNs != 100 || c1.NetTx != 1 || c1.Polls != 0 || c1.NetTxShare != 0.01 {
		t.Errorf("cpu 1: %+v", c1)
	}
	if rp.All.Packets != 72 || rp.All.NapiShare != 0.08 || rp.PacketsPerPoll[8] != 1 || rp.PacketsPerPoll[64] != 1 {
		t.Errorf("all: %+v, per poll %v", rp.All, rp.PacketsPerPoll)
	}
	if len(rp.Conns) != 2 || *rp.Conns[0] != (RxConn{Conn: 7, Packets: 2, Polls: 2, PerPoll: 1, SharedPolls: 1}) || *rp.Conns[1] != (RxConn{Conn: 9, Packets: 1, Polls: 1, PerPoll: 1, SharedPolls: 1, OutsidePolls: 1}) {
		t.Errorf("connections: %+v %+v", rp.Conns[0], rp.Conns[1])
	}
	if newRxTracker(&trace.Header{}, 0) != nil {
		t.Error("a trace without irq or napi events has a receive path")
	}
}

// TestRxPathNICs: the receive path shows, beside the polls, the receive
// coalescing and GRO hostcheck read of each interface that was up, from
// the trace header (extra.hostcheck); loopback and interfaces that were
// down are left out, and an interface whose driver would not say keeps
// hostcheck's reason.
func TestRxPathNICs(t *testing.T) {
	h := rxHeader()
	var hc any
	if err := json.Unmarshal([]byte(`{"interfaces": [
		{"name": "lo", "up": true, "loopback": true},
		{"name": "eth1", "up": false, "coalesce": {"rx_usecs": 3}},
		{"name": "eth0", "up": true, "offloads": {"gro": true}, "coalesce": {"rx_usecs": 50, "rx_frames": 32, "adaptive_rx": true}},
		{"name": "veth0", "up": true, "offloads": {"gro": false}, "coalesce_error": "unsupported by driver"}
	]}`), &hc); err != nil {
		t.Fatal(err)
	}
	h.Extra = map[string]any{"hostcheck": hc}
	got := nicsOf(h)
	if len(got) != 2 {
		t.Fatalf("%d interfaces: %+v, want eth0 and veth0", len(got), got)
	}
	e, v := got[0], got[1]
	if e.Name != "eth0" || !e.GRO || e.RxUsecs == nil || *e.RxUsecs != 50 || e.RxFrames == nil || *e.RxFrames != 32 || e.AdaptiveRx == nil || !*e.AdaptiveRx || e.Error != "" {
		t.Errorf("eth0: %+v", e)
	}
	if v.Name != "veth0" || v.GRO || v.RxUsecs != nil || v.Error != "unsupported by driver" {
		t.Errorf("veth0: %+v", v)
	}
	rt := newRxTracker(h, 0)
	if rp := rt.finish("x", 1000, nil); len(rp.NICs) != 2 {
		t.Errorf("receive path NICs: %+v", rp.NICs)
	}
}
