// SPDX-License-Identifier: Apache-2.0

package analyze_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/trace"
)

type rec struct {
	typ    string
	t      uint64
	size   int32
	flags  uint8
	u32    map[string]uint32
	u64    map[string]uint64
	u8     map[string]uint8
	tid    uint32
	cpu    uint16
	conn   uint64
	laddr  [4]byte
	raddr  [4]byte
	lp, rp uint16
}

// writeTrace writes recs with magnet's real dictionary.
func writeTrace(t testing.TB, recs []rec) string {
	t.Helper()
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		t.Fatal(err)
	}
	h := &trace.Header{Host: "test", Types: types}
	path := filepath.Join(t.TempDir(), "t.mgt")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := trace.NewWriter(f, h, trace.WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		et := h.TypeByName(r.typ)
		b := make([]byte, et.Size)
		ne := binary.NativeEndian
		ne.PutUint64(b[0:], r.t)
		ne.PutUint64(b[8:], r.conn)
		ne.PutUint32(b[16:], r.tid)
		ne.PutUint32(b[20:], uint32(r.size))
		ne.PutUint16(b[28:], r.cpu)
		b[30], b[31] = et.ID, r.flags
		for name, v := range r.u32 {
			f, _ := et.Field(name)
			switch f.Size {
			case 4:
				ne.PutUint32(b[f.Offset:], v)
			case 2:
				ne.PutUint16(b[f.Offset:], uint16(v))
			}
		}
		for name, v := range r.u64 {
			f, _ := et.Field(name)
			ne.PutUint64(b[f.Offset:], v)
		}
		for name, v := range r.u8 {
			f, _ := et.Field(name)
			b[f.Offset] = v
		}
		if r.typ == "conn_open" {
			set := func(name string, v any) {
				f, _ := et.Field(name)
				switch x := v.(type) {
				case uint8:
					b[f.Offset] = x
				case uint16:
					ne.PutUint16(b[f.Offset:], x)
				case [4]byte:
					copy(b[f.Offset:], x[:])
				}
			}
			set("proto", uint8(6))
			set("family", uint8(4))
			set("lport", r.lp)
			set("rport", r.rp)
			set("laddr", r.laddr)
			set("raddr", r.raddr)
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

// TestSendBufferAndRetransmits follows a connection whose sends are
// reported after TCP sent (and the peer acknowledged) their data, as the
// kernel does.
func TestSendBufferAndRetransmits(t *testing.T) {
	const isn = 1000
	ms := uint64(1e6)
	recs := []rec{
		{typ: "conn_open", t: 0, conn: 1, lp: 40000, rp: 80, laddr: [4]byte{10, 0, 0, 1}, raddr: [4]byte{10, 0, 0, 2}},
		{typ: "tcp_xmit", t: 1 * ms, conn: 1, flags: 0x02, u32: map[string]uint32{"seq": isn}},
		{typ: "tcp_xmit", t: 2 * ms, conn: 1, size: 1000, flags: 0x10, u32: map[string]uint32{"seq": isn + 1}},
		{typ: "tcp_xmit", t: 3 * ms, conn: 1, size: 1000, flags: 0x18, u32: map[string]uint32{"seq": isn + 1001}},
		{typ: "sock_send", t: 4 * ms, conn: 1, size: 3000},
		{typ: "tcp_rcv", t: 5 * ms, conn: 1, flags: 0x10, u32: map[string]uint32{"ack": isn + 1001}},
		{typ: "tcp_xmit", t: 6 * ms, conn: 1, size: 1000, flags: 0x10, u32: map[string]uint32{"seq": isn + 1001}, u8: map[string]uint8{"retrans": 1}},
		{typ: "tcp_xmit", t: 7 * ms, conn: 1, size: 1000, flags: 0x18, u32: map[string]uint32{"seq": isn + 2001}},
		{typ: "tcp_rcv", t: 8 * ms, conn: 1, flags: 0x10, u32: map[string]uint32{"ack": isn + 3001}},
		{typ: "dev_xmit", t: 9 * ms, conn: 1, size: 500},
	}
	rep, err := analyze.Modulation([]string{writeTrace(t, recs)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Conns) != 1 {
		t.Fatalf("%d connections", len(rep.Conns))
	}
	c := rep.Conns[0]
	sb := c.SendBuffer
	// Written: 1000 at 2 ms, 2000 at 3 ms, 3000 at 4 ms; acked 1000 at
	// 5 ms, 3000 at 8 ms. Occupancy: 1000, 2000, 3000, 2000, 0.
	if sb == nil || sb.Max != 3000 || sb.Min != 0 || sb.Final != 0 || sb.Samples != 5 {
		t.Fatalf("send buffer %+v", sb)
	}
	// Time-weighted over 2..8 ms: 1000·1 + 2000·1 + 3000·1 + 2000·3 = 12000 over 6 ms.
	if sb.Mean != 2000 {
		t.Errorf("time-weighted mean %v, want 2000", sb.Mean)
	}
	if c.TCP == nil || c.TCP.RetransSegs != 1 || c.TCP.RetransBytes != 1000 {
		t.Errorf("tcp %+v: want 1 retransmitted segment of 1000 B", c.TCP)
	}
	if tp := c.Throughput; tp == nil || tp.AppBytes != 3000 || tp.WireBytes != 500 {
		t.Errorf("throughput %+v", tp)
	}
	var xmit *analyze.LayerStats
	for _, l := range c.Layers {
		if l.Layer == "tcp_xmit" {
			xmit = l
		}
	}
	if xmit == nil || xmit.Count != 4 || xmit.Bytes != 4000 || xmit.Spacing.Mean != 5000.0/3 {
		t.Errorf("tcp_xmit layer %+v (the SYN carries no data and is left out)", xmit)
	}
}
