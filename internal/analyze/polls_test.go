// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/internal/tracegen"
)

// pollRec is a record of pollTrace: a dev_recv of conn, or an irq/napi
// event (its int fields at 44 and 48: vec, or work and budget).
type pollRec struct {
	typ      string
	t        uint64
	cpu      uint16
	conn     uint64
	a, b     int32
	dev      string
	wantRows []string // a poll's rows, as pollRowText prints them
}

// pollTrace writes recs, after two connections' conn_open records (ids 0
// and 1), as a trace with magnet's dictionary and the irq and napi groups'
// types laid out as the recorder lays them, and returns the file: each
// record's place is 2 more than its index in recs.
func pollTrace(t *testing.T, recs []pollRec) string {
	t.Helper()
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		t.Fatal(err)
	}
	i32 := func(name string, off int) trace.Field {
		return trace.Field{Name: name, Offset: off, Size: 4, Kind: trace.KindInt}
	}
	types = append(types,
		trace.EventType{ID: 64, Name: "napi_poll", Group: "napi", Size: 120, Fields: []trace.Field{
			{Name: "dev_name", Offset: 56, Size: 64, Kind: trace.KindStr}, i32("work", 44), i32("budget", 48)}},
		trace.EventType{ID: 65, Name: "softirq_entry", Group: "irq", Size: 48, Fields: []trace.Field{{Name: "vec", Offset: 44, Size: 4, Kind: trace.KindUint}}},
		trace.EventType{ID: 66, Name: "softirq_exit", Group: "irq", Size: 48, Fields: []trace.Field{{Name: "vec", Offset: 44, Size: 4, Kind: trace.KindUint}}},
	)
	h := &trace.Header{Host: "test", Types: types}
	path, w := tracegen.Create(t, "rx.mgt", h)
	ne := binary.NativeEndian
	for _, c := range []uint64{1, 2} {
		et := h.TypeByName("conn_open")
		b := make([]byte, et.Size)
		ne.PutUint64(b[8:], c)
		b[30] = et.ID
		pf, _ := et.Field("proto")
		b[pf.Offset] = 6
		if err := w.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range recs {
		et := h.TypeByName(r.typ)
		b := make([]byte, et.Size)
		ne.PutUint64(b[0:], r.t)
		ne.PutUint64(b[8:], r.conn)
		ne.PutUint16(b[28:], r.cpu)
		b[30] = et.ID
		if et.ID >= firstKernelID {
			ne.PutUint32(b[44:], uint32(r.a))
		}
		if r.typ == "napi_poll" {
			ne.PutUint32(b[48:], uint32(r.b))
			copy(b[56:], r.dev)
		}
		if err := w.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(&trace.Summary{}); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPollsTable places two connections' packets in the NAPI polls of two
// CPUs, the records given per CPU as a recorder's rings store them: each
// packet in the poll that ends next on its CPU after it (napi_poll fires
// when a poll returns), none in a poll before its softirq's first or after
// its last; a poll that delivered no connection's packet is one row with
// conn null. The report's per-connection figures come from the same walk.
func TestPollsTable(t *testing.T) {
	recs := []pollRec{
		// CPU 0: a NET_RX softirq, 1000-1900, with three polls.
		{typ: "softirq_entry", t: 1000, a: 3},
		{typ: "dev_recv", t: 1100, conn: 1},
		{typ: "dev_recv", t: 1200, conn: 2},
		{typ: "dev_recv", t: 1250, conn: 1},
		{typ: "napi_poll", t: 1400, a: 3, b: 64, dev: "veth1", wantRows: []string{"veth1 3/64 conns 2: 1 2", "veth1 3/64 conns 2: 2 1"}},
		{typ: "dev_recv", t: 1500, conn: 1},
		{typ: "napi_poll", t: 1800, a: 64, b: 64, dev: "veth1", wantRows: []string{"veth1 64/64 conns 1: 1 1"}},
		{typ: "napi_poll", t: 1850, a: 0, b: 64, dev: "lo", wantRows: []string{"lo 0/64 conns 0: null"}},
		{typ: "dev_recv", t: 1870, conn: 2}, // after the softirq's last poll
		{typ: "softirq_exit", t: 1900, a: 3},
		// CPU 1: polls outside a softirq the recording saw (a NAPI
		// thread's): a packet before the CPU's first poll is in none.
		{typ: "dev_recv", t: 1250, conn: 1, cpu: 1},
		{typ: "napi_poll", t: 1300, a: 2, b: 64, dev: "eth0", cpu: 1, wantRows: []string{"eth0 2/64 conns 0: null"}},
		{typ: "dev_recv", t: 1350, conn: 2, cpu: 1},
		{typ: "napi_poll", t: 1600, a: 1, b: 64, dev: "eth0", cpu: 1, wantRows: []string{"eth0 1/64 conns 1: 2 1"}},
	}
	p, err := ReadPolls(trace.Sources([]string{pollTrace(t, recs)}))
	if err != nil {
		t.Fatal(err)
	}
	var k rowSink
	n, err := p.Write(&k)
	if err != nil {
		t.Fatal(err)
	}
	// The rows in time order, each poll's id its record's place (after
	// the two conn_open records).
	var want []string
	for _, tm := range []uint64{1300, 1400, 1600, 1800, 1850} {
		for i, r := range recs {
			if r.typ == "napi_poll" && r.t == tm {
				for _, w := range r.wantRows {
					want = append(want, fmt.Sprintf("rx.mgt cpu %d at %d id %d %s", r.cpu, r.t, i+2, w))
				}
			}
		}
	}
	if n != uint64(len(k.rows)) || strings.Join(k.rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("%d rows (%d said):\n%s\nwant:\n%s", len(k.rows), n, strings.Join(k.rows, "\n"), strings.Join(want, "\n"))
	}
	rep, err := ModulationOf(trace.Sources([]string{pollTrace(t, recs)}), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.ReceivePath) != 1 || len(rep.ReceivePath[0].Conns) != 2 {
		t.Fatalf("receive path: %+v", rep.ReceivePath)
	}
	c1, c2 := *rep.ReceivePath[0].Conns[0], *rep.ReceivePath[0].Conns[1]
	if c1 != (RxConn{Conn: 1, Packets: 3, Polls: 2, PerPoll: 1.5, SharedPolls: 1, OutsidePolls: 1}) ||
		c2 != (RxConn{Conn: 2, Packets: 2, Polls: 2, PerPoll: 1, SharedPolls: 1, OutsidePolls: 1}) {
		t.Errorf("connections: %+v, %+v", c1, c2)
	}
}

// TestPollsNone: traces without a napi_poll event have no polls table,
// with one line saying how to record them.
func TestPollsNone(t *testing.T) {
	path := pollTrace(t, []pollRec{{typ: "softirq_entry", t: 1000, a: 3}, {typ: "dev_recv", t: 1100, conn: 1}})
	_, err := ReadPolls(trace.Sources([]string{path}))
	if err == nil || err.Error() != "no napi_poll events in rx.mgt: record with --groups default,irq,napi to list NAPI polls" {
		t.Errorf("error %v", err)
	}
}

// rowSink keeps the polls table's rows as text.
type rowSink struct{ rows []string }

func (k *rowSink) WriteRow(row []export.Value) error {
	col := map[string]export.Value{}
	for i, c := range export.PollColumns {
		col[c.Name] = row[i]
	}
	s := fmt.Sprintf("%s cpu %d at %d id %d %s %d/%d conns %d: ", col["trace"].Str, col["cpu"].Uint, col["poll_ns"].Int,
		col["poll_id"].Uint, col["dev"].Str, col["work"].Int, col["budget"].Int, col["conns"].Uint)
	if col["conn"].Null != col["packets"].Null {
		return fmt.Errorf("conn %+v, packets %+v", col["conn"], col["packets"])
	}
	if col["conn"].Null {
		s += "null"
	} else {
		s += fmt.Sprintf("%d %d", col["conn"].Uint, col["packets"].Uint)
	}
	k.rows = append(k.rows, s)
	return nil
}
func (k *rowSink) Close() error { return nil }
