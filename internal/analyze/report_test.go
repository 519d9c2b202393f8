// SPDX-License-Identifier: Apache-2.0

package analyze_test

import (
	"encoding/binary"
	"testing"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/internal/tracegen"
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
	// Drop reasons as a kernel names them (enum skb_drop_reason).
	h := &trace.Header{Host: "test", Types: types, Enums: map[string]map[string]string{
		"drop_reason": {"2": "NOT_SPECIFIED", "4": "QUEUE_PURGE", "5": "TCP_OLD_DATA", "6": "QDISC_DROP", "7": "SOCKET_RCVBUFF"}}}
	path, w := tracegen.Create(t, "t.mgt", h)
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
			if r.u8["proto"] == 0 {
				set("proto", uint8(6)) // TCP unless the record says
			}
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

// TestSendBufferBeyond4GiB: a connection that writes 6 GiB, 1.5 GiB at a
// time, each acknowledged before the next is written. Its sequence numbers
// wrap after the first 256 MiB and again after 4 GiB more; the occupancy
// must still be 1.5 GiB at most and 0 at the end.
func TestSendBufferBeyond4GiB(t *testing.T) {
	const isn = 0xf0000000
	const chunk = 3 << 29 // 1.5 GiB
	ms := uint64(1e6)
	recs := []rec{
		{typ: "conn_open", t: 0, conn: 1, lp: 40000, rp: 80, laddr: [4]byte{10, 0, 0, 1}, raddr: [4]byte{10, 0, 0, 2}},
		{typ: "tcp_xmit", t: 1 * ms, conn: 1, flags: 0x02, u32: map[string]uint32{"seq": isn}},
	}
	for i := uint64(0); i < 4; i++ {
		at := (10 + 10*i) * ms
		recs = append(recs,
			rec{typ: "sock_send", t: at, conn: 1, size: chunk},
			rec{typ: "tcp_xmit", t: at + ms, conn: 1, size: 1000, flags: 0x10, u32: map[string]uint32{"seq": uint32(isn + 1 + (i+1)*chunk - 1000)}},
			rec{typ: "tcp_rcv", t: at + 2*ms, conn: 1, flags: 0x10, u32: map[string]uint32{"ack": uint32(isn + 1 + (i+1)*chunk)}})
	}
	rep, err := analyze.Modulation([]string{writeTrace(t, recs)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	sb := rep.Conns[0].SendBuffer
	if sb == nil || sb.Max != chunk || sb.Final != 0 || sb.Min != 0 {
		t.Fatalf("send buffer %+v: want max %d B, 0 B at the end", sb, chunk)
	}
}

// TestSendBufferAcksAfterClose: the application writes 3000 B and closes
// with 2000 B unacknowledged; the ACKs that follow reach the closing socket
// where tcp_rcv does not fire. The tcp_state snapshot at close (snd_una
// past the FIN) or conn_close's bytes_acked must count them.
func TestSendBufferAcksAfterClose(t *testing.T) {
	const isn = 5000
	ms := uint64(1e6)
	for _, tc := range []struct {
		name string
		end  []rec
	}{
		{"tcp_state", []rec{{typ: "tcp_state", t: 9 * ms, conn: 1, u32: map[string]uint32{"snd_una": isn + 1 + 3000 + 1, "cwnd": 10}}}},
		{"conn_close", []rec{{typ: "conn_close", t: 9 * ms, conn: 1, u64: map[string]uint64{"bytes_acked": 1 + 3000 + 1}}}}, // its SYN, the data, its FIN
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs := []rec{
				{typ: "conn_open", t: 0, conn: 1, lp: 40000, rp: 80, laddr: [4]byte{10, 0, 0, 1}, raddr: [4]byte{10, 0, 0, 2}},
				{typ: "tcp_xmit", t: 1 * ms, conn: 1, flags: 0x02, u32: map[string]uint32{"seq": isn}},
				{typ: "sock_send", t: 2 * ms, conn: 1, size: 3000},
				{typ: "tcp_xmit", t: 3 * ms, conn: 1, size: 3000, flags: 0x18, u32: map[string]uint32{"seq": isn + 1}},
				{typ: "tcp_rcv", t: 4 * ms, conn: 1, flags: 0x10, u32: map[string]uint32{"ack": isn + 1001}},
				// close(): the FIN, then ACKs no tcp_rcv shows.
				{typ: "tcp_xmit", t: 5 * ms, conn: 1, flags: 0x11, u32: map[string]uint32{"seq": isn + 3001}},
			}
			rep, err := analyze.Modulation([]string{writeTrace(t, append(recs, tc.end...))}, 0)
			if err != nil {
				t.Fatal(err)
			}
			sb := rep.Conns[0].SendBuffer
			if sb == nil || sb.Final != 0 || sb.Max != 3000 {
				t.Fatalf("send buffer %+v: want max 3000 B, everything acknowledged at the end", sb)
			}
		})
	}
}

// TestRetransmittedSegments: a retransmitted skb counts as its GSO
// segments, as the kernel's tcpi_total_retrans and TcpRetransSegs do.
func TestRetransmittedSegments(t *testing.T) {
	const isn = 100
	ms := uint64(1e6)
	recs := []rec{
		{typ: "conn_open", t: 0, conn: 1, lp: 40000, rp: 80, laddr: [4]byte{10, 0, 0, 1}, raddr: [4]byte{10, 0, 0, 2}},
		{typ: "tcp_xmit", t: 1 * ms, conn: 1, flags: 0x02, u32: map[string]uint32{"seq": isn}},
		{typ: "tcp_xmit", t: 2 * ms, conn: 1, size: 4000, flags: 0x10, u32: map[string]uint32{"seq": isn + 1, "gso_segs": 4}},
		{typ: "tcp_xmit", t: 3 * ms, conn: 1, size: 3000, flags: 0x10, u32: map[string]uint32{"seq": isn + 1, "gso_segs": 3}, u8: map[string]uint8{"retrans": 1}},
		{typ: "tcp_xmit", t: 4 * ms, conn: 1, size: 1000, flags: 0x10, u32: map[string]uint32{"seq": isn + 3001, "gso_segs": 1}, u8: map[string]uint8{"retrans": 1}},
		{typ: "conn_close", t: 5 * ms, conn: 1, u32: map[string]uint32{"total_retrans": 4}},
	}
	rep, err := analyze.Modulation([]string{writeTrace(t, recs)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	tcp := rep.Conns[0].TCP
	if tcp == nil || tcp.RetransSegs != 4 || tcp.RetransBytes != 4000 || tcp.KernelRetransSegs != 4 {
		t.Fatalf("tcp %+v: want 4 retransmitted segments of 4000 B, the kernel's count 4", tcp)
	}
}

// TestSendBufferPlotSteps: the occupancy changes only at sends and ACKs,
// so its plot is a step function.
func TestSendBufferPlotSteps(t *testing.T) {
	ms := uint64(1e6)
	recs := []rec{
		{typ: "conn_open", t: 0, conn: 1, lp: 40000, rp: 80, laddr: [4]byte{10, 0, 0, 1}, raddr: [4]byte{10, 0, 0, 2}},
		{typ: "tcp_xmit", t: 1 * ms, conn: 1, flags: 0x02, u32: map[string]uint32{"seq": 9}},
		{typ: "sock_send", t: 2 * ms, conn: 1, size: 3000},
		{typ: "tcp_rcv", t: 5 * ms, conn: 1, flags: 0x10, u32: map[string]uint32{"ack": 10 + 3000}},
	}
	fig, err := analyze.Plot([]string{writeTrace(t, recs)}, "sendbuf", analyze.PlotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(fig.Series) != 1 || !fig.Series[0].Steps || len(fig.Series[0].X) != 2 {
		t.Fatalf("send-buffer series %+v: want 2 samples drawn as steps", fig.Series)
	}
}

// TestDropClasses: drops that lose data are told apart from the kernel
// freeing packets at teardown or duplicates, per connection and for the
// host.
func TestDropClasses(t *testing.T) {
	ms := uint64(1e6)
	recs := []rec{
		{typ: "conn_open", t: 0, conn: 1, lp: 40000, rp: 80, laddr: [4]byte{10, 0, 0, 1}, raddr: [4]byte{10, 0, 0, 2}},
		{typ: "sock_send", t: 1 * ms, conn: 1, size: 100},
	}
	for i, r := range []uint32{6, 6, 7, 2, 4, 4, 5} {
		recs = append(recs, rec{typ: "drop", t: uint64(2+i) * ms, conn: 1, u32: map[string]uint32{"reason": r}})
	}
	rep, err := analyze.Modulation([]string{writeTrace(t, recs)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := analyze.DropClasses{LoseData: 3, Teardown: 4}
	if c := rep.Conns[0].DropClasses; c == nil || *c != want {
		t.Errorf("connection's drop classes %+v, want %+v (drops %v)", c, want, rep.Conns[0].Drops)
	}
	if c := rep.DropClasses; c == nil || *c != want {
		t.Errorf("host's drop classes %+v, want %+v", c, want)
	}
}

// TestLocalResends: the qdisc drops the second segment's first try; TCP
// sends the same bytes again unmarked (snd_nxt never moved past them),
// then retransmits the first segment after a loss in the network. What
// left the host, the network retransmission and the local re-send are
// told apart.
func TestLocalResends(t *testing.T) {
	isn := uint32(0xfffffc00) // the data wraps the sequence space
	ms := uint64(1e6)
	x := func(at uint64, seq uint32, size int32, retrans uint8) rec {
		return rec{typ: "tcp_xmit", t: at * ms, conn: 1, size: size, flags: 0x10, u32: map[string]uint32{"seq": seq, "gso_segs": 1}, u8: map[string]uint8{"retrans": retrans}}
	}
	recs := []rec{
		{typ: "conn_open", t: 0, conn: 1, lp: 40000, rp: 80, laddr: [4]byte{10, 0, 0, 1}, raddr: [4]byte{10, 0, 0, 2}},
		{typ: "tcp_xmit", t: 1 * ms, conn: 1, flags: 0x02, u32: map[string]uint32{"seq": isn}},
		x(2, isn+1, 1000, 0), x(3, isn+1001, 1000, 0), // dropped by the qdisc
		x(4, isn+1001, 1500, 0), // the same bytes and 500 new
		x(5, isn+1, 1000, 1),    // a network retransmission
		x(6, isn+2501, 700, 2),  // marked by the recorder as a re-send after a local drop
	}
	rep, err := analyze.Modulation([]string{writeTrace(t, recs)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	tcp := rep.Conns[0].TCP
	if tcp == nil || tcp.DataBytes != 5200 || tcp.LocalResendBytes != 1700 || tcp.LocalResendEvents != 2 || tcp.WireBytes != 3500 || tcp.RetransBytes != 1000 {
		t.Fatalf("tcp %+v: want 5200 B sent, 1700 B re-sent after local drops (2), 3500 B left the host, 1000 B retransmitted", tcp)
	}
}

// TestLocalDropOfRetransmission: the qdisc drops a retransmission, which
// TCP sends again marked as one: no unmarked re-send reveals the drop, the
// drop event does. What left the host is the first try and the second
// retransmission.
func TestLocalDropOfRetransmission(t *testing.T) {
	ms := uint64(1e6)
	isn := uint32(7)
	down := func(at uint64, retrans uint8, dropped bool) []rec {
		r := []rec{
			{typ: "tcp_xmit", t: at * ms, conn: 1, size: 1000, flags: 0x10, u32: map[string]uint32{"seq": isn + 1, "gso_segs": 1}, u8: map[string]uint8{"retrans": retrans}},
			{typ: "ip_send", t: at*ms + 1000, conn: 1, size: 1052, u32: map[string]uint32{"ip_id": uint32(at)}, u8: map[string]uint8{"family": 4}},
			{typ: "dev_queue", t: at*ms + 2000, conn: 1, size: 1066, u32: map[string]uint32{"gso_segs": 1}},
		}
		if dropped {
			return append(r, rec{typ: "drop", t: at*ms + 3000, conn: 1, size: 1066, u32: map[string]uint32{"reason": 6}})
		}
		return append(r, rec{typ: "dev_xmit", t: at*ms + 50000, conn: 1, size: 1066, u32: map[string]uint32{"gso_segs": 1}})
	}
	recs := []rec{
		{typ: "conn_open", t: 0, conn: 1, lp: 40000, rp: 80, laddr: [4]byte{10, 0, 0, 1}, raddr: [4]byte{10, 0, 0, 2}},
		{typ: "tcp_xmit", t: 1 * ms, conn: 1, flags: 0x02, u32: map[string]uint32{"seq": isn}},
	}
	recs = append(recs, down(2, 0, false)...)
	recs = append(recs, down(3, 1, true)...)
	recs = append(recs, down(4, 1, false)...)
	rep, err := analyze.Modulation([]string{writeTrace(t, recs)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	tcp := rep.Conns[0].TCP
	if tcp == nil || tcp.DataBytes != 3000 || tcp.RetransBytes != 2000 || tcp.LocalResendBytes != 0 || tcp.LocalDropBytes != 1000 || tcp.LocalDropPackets != 1 || tcp.WireBytes != 2000 {
		t.Fatalf("tcp %+v: want 3000 B sent, 2000 B retransmitted, 1000 B dropped on the way down, 2000 B left the host", tcp)
	}
}
