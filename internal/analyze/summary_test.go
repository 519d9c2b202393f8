// SPDX-License-Identifier: Apache-2.0

package analyze_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// TestSummaries adds up a connection's conn_summary records and reads its
// srtt histogram; another connection's records stay apart.
func TestSummaries(t *testing.T) {
	path := writeTrace(t, []rec{
		{typ: "conn_open", t: 1e9, conn: 7, laddr: [4]byte{10, 0, 0, 1}, raddr: [4]byte{10, 0, 0, 2}, lp: 4000, rp: 5201},
		{typ: "conn_summary", t: 2e9, conn: 7, u64: map[string]uint64{"start_ns": 1e9, "sock_send_bytes": 1000, "retrans_segs": 2, "rtt_samples": 10, "rtt_sum_us": 1000},
			u32: map[string]uint32{"rtt_hist_6": 4, "rtt_hist_7": 6}},
		{typ: "conn_summary", t: 3e9, conn: 7, u64: map[string]uint64{"start_ns": 2e9, "sock_send_bytes": 500, "rtt_samples": 90, "rtt_sum_us": 9000},
			u32: map[string]uint32{"rtt_hist_6": 90}},
		{typ: "conn_summary", t: 3e9, conn: 8, u64: map[string]uint64{"start_ns": 2e9, "sock_recv_bytes": 10}},
		{typ: "conn_close", t: 3e9 + 1, conn: 7},
	})
	conns, err := analyze.Summaries(trace.Sources([]string{path}), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(conns) != 2 {
		t.Fatalf("%d connections, want 2", len(conns))
	}
	c := conns[0]
	if c.ID != 7 || c.Records != 2 || c.FirstNs != 1e9 || c.LastNs != 3e9 || !c.Closed || c.Local.String() != "10.0.0.1:4000" || c.Proto != "tcp" {
		t.Errorf("connection %+v", c)
	}
	if c.Figures["sock_send_bytes"] != 1500 || c.Figures["retrans_segs"] != 2 || c.Figures["rtt_hist_6"] != 94 {
		t.Errorf("figures %v", c.Figures)
	}
	// 100 samples: 94 in [64, 128) µs, 6 in [128, 256).
	if s := c.SRTT; s == nil || s.Samples != 100 || s.MeanUs != 100 || s.P50BelowUs != 128 || s.P99BelowUs != 256 || s.MaxBelowUs != 256 {
		t.Errorf("srtt %+v", c.SRTT)
	}
	if conns[1].ID != 8 || conns[1].SRTT != nil {
		t.Errorf("second connection %+v", conns[1])
	}
	if only, _ := analyze.Summaries(trace.Sources([]string{path}), 8); len(only) != 1 || only[0].ID != 8 {
		t.Errorf("onlyConn 8: %+v", only)
	}
	var b bytes.Buffer
	analyze.SummaryTable(&b, conns)
	if !strings.Contains(b.String(), "10.0.0.1:4000 -> 10.0.0.2:5201") || !strings.Contains(b.String(), "100 µs") {
		t.Errorf("table:\n%s", b.String())
	}
	if ok, err := analyze.IsSummary(trace.Sources([]string{path})[0]); err != nil || ok {
		t.Errorf("IsSummary of a trace without the header key: %v, %v", ok, err)
	}
}
