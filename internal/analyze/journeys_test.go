// SPDX-License-Identifier: Apache-2.0

package analyze_test

import (
	"testing"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// rowKeeper keeps the rows written to it.
type rowKeeper struct{ rows [][]export.Value }

func (k *rowKeeper) WriteRow(row []export.Value) error {
	k.rows = append(k.rows, append([]export.Value(nil), row...))
	return nil
}
func (k *rowKeeper) Close() error { return nil }

// journeyRows writes recs as a trace, exports its journeys, and fails
// unless they are want rows; it returns them and each column's index by
// name.
func journeyRows(t *testing.T, recs []rec, want int) ([][]export.Value, map[string]int) {
	t.Helper()
	var k rowKeeper
	n, err := analyze.WriteJourneys(trace.Sources([]string{writeTrace(t, recs)}), &k)
	if err != nil {
		t.Fatal(err)
	}
	if n != uint64(want) || len(k.rows) != want {
		t.Fatalf("%d rows (%d said), want %d: %v", len(k.rows), n, want, k.rows)
	}
	col := map[string]int{}
	for i, c := range export.JourneyColumns {
		col[c.Name] = i
	}
	return k.rows, col
}

// TestJourneysByIdentity follows three segments between two ends of one
// trace; the second one's ip_send is missing. Paired first in, first out,
// the third segment's ip_send would be the second's; by identity the
// second has no journey (it never departed as far as the trace knows) and
// the third's row carries its own tcp_xmit.
func TestJourneysByIdentity(t *testing.T) {
	recs := []rec{
		{typ: "conn_open", conn: 1, lp: 40000, rp: 80, laddr: [4]byte{10, 0, 0, 1}, raddr: [4]byte{10, 0, 0, 2}},
		{typ: "conn_open", conn: 2, lp: 80, rp: 40000, laddr: [4]byte{10, 0, 0, 2}, raddr: [4]byte{10, 0, 0, 1}},
	}
	ids := map[[2]int]int{} // segment, layer → record id
	for s := 0; s < 3; s++ {
		base := uint64(100+100*s) * us
		seq, ipid := uint32(1000+1000*s), uint32(10+s)
		layer := []rec{
			{typ: "tcp_xmit", conn: 1, size: 1000, flags: 0x10, u32: map[string]uint32{"seq": seq, "gso_segs": 1}},
			{typ: "ip_send", conn: 1, size: 1052, u32: map[string]uint32{"ip_id": ipid}, u8: map[string]uint8{"family": 4}},
			{typ: "dev_xmit", conn: 1, size: 1066, u32: map[string]uint32{"gso_segs": 1}},
			{typ: "dev_recv", conn: 2, size: 1052, u32: map[string]uint32{"gso_segs": 1}},
			{typ: "ip_recv", conn: 2, size: 1052, u32: map[string]uint32{"ip_id": ipid}, u8: map[string]uint8{"family": 4}},
			{typ: "tcp_rcv", conn: 2, size: 1000, flags: 0x18, u32: map[string]uint32{"seq": seq}},
			{typ: "sock_recv", conn: 2, size: 1000},
		}
		for i, r := range layer {
			if s == 1 && r.typ == "ip_send" {
				continue // not recorded
			}
			r.t, r.tid, r.cpu = base+uint64(i)*us, 7, 0
			ids[[2]int{s, i}] = len(recs)
			recs = append(recs, r)
		}
	}
	rows, col := journeyRows(t, recs, 2)
	// JourneyLayers index → the segment's layer above (no dev_queue).
	layerOf := []int{0, 1, -1, 2, 3, 4, 5, 6}
	for i, s := range []int{0, 2} {
		r := rows[i]
		if got := r[col["ip_id"]].Uint; got != uint64(10+s) {
			t.Errorf("row %d: ip id %d, want %d", i, got, 10+s)
		}
		if got := r[col["seq"]].Uint; got != uint64(1000+1000*s) {
			t.Errorf("row %d: seq %d", i, got)
		}
		for j, l := range export.JourneyLayers {
			ts, id := r[col[l+"_ns"]], r[col[l+"_id"]]
			if layerOf[j] < 0 {
				if !ts.Null || !id.Null {
					t.Errorf("row %d: %s is %v %v, not recorded", i, l, ts, id)
				}
				continue
			}
			wantID := ids[[2]int{s, layerOf[j]}]
			if id.Null || id.Uint != uint64(wantID) {
				t.Errorf("row %d: %s id %+v, want %d", i, l, id, wantID)
			}
			wantT := int64(uint64(100+100*s)*us + uint64(layerOf[j])*us)
			if ts.Null || ts.Int != wantT {
				t.Errorf("row %d: %s at %+v, want %d", i, l, ts, wantT)
			}
		}
	}
}

// TestJourneysTwoCPUs: two packets reach the receiver's device one after
// the other, each on its own CPU's backlog (veth hands a packet to the
// backlog of the CPU that sent it), and the second CPU takes its packet up
// to IP first. ip_recv follows dev_recv in one kernel call, so the second
// packet's ip_recv is that CPU's latest dev_recv; the first packet, on the
// other CPU, is still on its way up and must not be given up on: both
// packets have a journey.
func TestJourneysTwoCPUs(t *testing.T) {
	recs := []rec{
		{typ: "conn_open", conn: 1, lp: 40000, rp: 80, laddr: [4]byte{10, 0, 0, 1}, raddr: [4]byte{10, 0, 0, 2}},
		{typ: "conn_open", conn: 2, lp: 80, rp: 40000, laddr: [4]byte{10, 0, 0, 2}, raddr: [4]byte{10, 0, 0, 1}},
	}
	for s := 0; s < 2; s++ {
		base := uint64(100+10*s) * us
		seq, ipid := uint32(1000+1000*s), uint32(10+s)
		for i, r := range []rec{
			{typ: "tcp_xmit", conn: 1, size: 1000, flags: 0x10, u32: map[string]uint32{"seq": seq, "gso_segs": 1}},
			{typ: "ip_send", conn: 1, size: 1052, u32: map[string]uint32{"ip_id": ipid}, u8: map[string]uint8{"family": 4}},
			{typ: "dev_xmit", conn: 1, size: 1066, u32: map[string]uint32{"gso_segs": 1}},
		} {
			r.t, r.tid, r.cpu = base+uint64(i)*us, 7, uint16(s)
			recs = append(recs, r)
		}
	}
	// The receiver: dev_recv of the first on CPU 0, of the second on CPU
	// 1; ip_recv of the second, then of the first.
	for _, r := range []rec{
		{typ: "dev_recv", conn: 2, size: 1052, cpu: 0, t: 200 * us, u32: map[string]uint32{"gso_segs": 1}},
		{typ: "dev_recv", conn: 2, size: 1052, cpu: 1, t: 201 * us, u32: map[string]uint32{"gso_segs": 1}},
		{typ: "ip_recv", conn: 2, size: 1052, cpu: 1, t: 202 * us, u32: map[string]uint32{"ip_id": 11}, u8: map[string]uint8{"family": 4}},
		{typ: "ip_recv", conn: 2, size: 1052, cpu: 0, t: 203 * us, u32: map[string]uint32{"ip_id": 10}, u8: map[string]uint8{"family": 4}},
	} {
		r.tid = 0 // softirq over the idle task
		recs = append(recs, r)
	}
	rows, col := journeyRows(t, recs, 2) // one per packet
	got := map[uint64]int64{}
	for _, r := range rows {
		got[r[col["ip_id"]].Uint] = r[col["dev_recv_ns"]].Int - r[col["ip_recv_ns"]].Int
	}
	// Each packet's dev_recv is its own CPU's: 3 µs before its ip_recv
	// on CPU 0, 1 µs on CPU 1.
	if len(got) != 2 || got[10] != -3*int64(us) || got[11] != -1*int64(us) {
		t.Errorf("dev_recv to ip_recv by ip id: %v, want 10: -3 µs, 11: -1 µs", got)
	}
}

// TestJourneysTwoCPUsSender is TestJourneysTwoCPUs on the sender's side:
// tcp_xmit of the first segment on CPU 0, of the second on CPU 1 (an ACK
// processed in a softirq there sends it), and the second reaches IP first.
// Both segments depart and arrive: two rows.
func TestJourneysTwoCPUsSender(t *testing.T) {
	recs := []rec{
		{typ: "conn_open", conn: 1, lp: 40000, rp: 80, laddr: [4]byte{10, 0, 0, 1}, raddr: [4]byte{10, 0, 0, 2}},
		{typ: "conn_open", conn: 2, lp: 80, rp: 40000, laddr: [4]byte{10, 0, 0, 2}, raddr: [4]byte{10, 0, 0, 1}},
		{typ: "tcp_xmit", conn: 1, size: 1000, flags: 0x10, cpu: 0, tid: 7, t: 100 * us, u32: map[string]uint32{"seq": 1000, "gso_segs": 1}},
		{typ: "tcp_xmit", conn: 1, size: 1000, flags: 0x10, cpu: 1, tid: 0, t: 101 * us, u32: map[string]uint32{"seq": 2000, "gso_segs": 1}},
		{typ: "ip_send", conn: 1, size: 1052, cpu: 1, tid: 0, t: 102 * us, u32: map[string]uint32{"ip_id": 11}, u8: map[string]uint8{"family": 4}},
		{typ: "dev_xmit", conn: 1, size: 1066, cpu: 1, tid: 0, t: 103 * us, u32: map[string]uint32{"gso_segs": 1}},
		{typ: "ip_send", conn: 1, size: 1052, cpu: 0, tid: 7, t: 104 * us, u32: map[string]uint32{"ip_id": 10}, u8: map[string]uint8{"family": 4}},
		{typ: "dev_xmit", conn: 1, size: 1066, cpu: 0, tid: 7, t: 105 * us, u32: map[string]uint32{"gso_segs": 1}},
	}
	for i, id := range []uint32{11, 10} {
		for j, r := range []rec{
			{typ: "dev_recv", conn: 2, size: 1052, u32: map[string]uint32{"gso_segs": 1}},
			{typ: "ip_recv", conn: 2, size: 1052, u32: map[string]uint32{"ip_id": id}, u8: map[string]uint8{"family": 4}},
		} {
			r.t, r.cpu = uint64(200+10*i+j)*us, 1
			recs = append(recs, r)
		}
	}
	rows, col := journeyRows(t, recs, 2) // one per segment
	// Each row's tcp_xmit is its own segment's: seq 1000 for ip id 10.
	for _, r := range rows {
		if id, seq := r[col["ip_id"]].Uint, r[col["seq"]].Uint; seq != 1000+1000*(id-10) {
			t.Errorf("ip id %d has the tcp_xmit of seq %d", id, seq)
		}
	}
}
