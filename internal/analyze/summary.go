// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sort"
	"strings"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// SummaryKey is the header extra key of a summary recording (`magnet
// record --summary`): its interval in nanoseconds.
const SummaryKey = "summary_interval_ns"

// SummaryConn is one connection of a summary recording: its conn_summary
// records added up.
type SummaryConn struct {
	Trace  string         `json:"trace"`
	ID     uint64         `json:"id"`
	Proto  string         `json:"proto,omitempty"`
	Local  netip.AddrPort `json:"local"`
	Remote netip.AddrPort `json:"remote"`
	NetNS  uint32         `json:"netns"`
	// Records is how many conn_summary records the connection has, over
	// [FirstNs, LastNs] (CLOCK_MONOTONIC).
	Records int    `json:"records"`
	FirstNs uint64 `json:"first_ns"`
	LastNs  uint64 `json:"last_ns"`
	Closed  bool   `json:"closed"`
	// Figures holds every field of conn_summary added up, the histograms'
	// buckets (rtt_hist_I, cwnd_hist_I) included.
	Figures map[string]uint64 `json:"figures"`
	// SRTT is read from the srtt histogram: bucket i counts [2^i, 2^(i+1))
	// µs, so a quantile is known to within its bucket; these are the
	// buckets' upper ends.
	SRTT *SummaryRTT `json:"srtt,omitempty"`
}

// SummaryRTT is what a connection's srtt histogram says.
type SummaryRTT struct {
	Samples    uint64  `json:"samples"`
	MeanUs     float64 `json:"mean_us"`
	P50BelowUs uint64  `json:"p50_below_us"`
	P99BelowUs uint64  `json:"p99_below_us"`
	MaxBelowUs uint64  `json:"max_below_us"`
}

// IsSummary says whether the trace at src was recorded in summary mode.
func IsSummary(src trace.Source) (bool, error) {
	r, err := src.Open()
	if err != nil {
		return false, err
	}
	defer r.Close()
	_, ok := r.Header().Extra[SummaryKey]
	return ok, nil
}

// Summaries reads the conn_summary records of the sources and adds them up
// per connection, named by their conn_open; onlyConn, if not 0, keeps one.
// Busiest connections (application bytes both ways) first.
func Summaries(ins []trace.Source, onlyConn uint64) ([]*SummaryConn, error) {
	var out []*SummaryConn
	for _, in := range ins {
		conns, err := summariesOf(in, onlyConn)
		out = append(out, conns...)
		if err != nil {
			return out, err
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return appBytes(out[i]) > appBytes(out[j]) })
	return out, nil
}

func appBytes(c *SummaryConn) uint64 {
	return c.Figures["sock_send_bytes"] + c.Figures["sock_recv_bytes"]
}

func summariesOf(in trace.Source, onlyConn uint64) ([]*SummaryConn, error) {
	r, err := in.Open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	byID := map[uint64]*SummaryConn{}
	var order []*SummaryConn
	of := func(id uint64) *SummaryConn {
		c := byID[id]
		if c == nil {
			c = &SummaryConn{Trace: in.Name, ID: id, Figures: map[string]uint64{}}
			byID[id] = c
			order = append(order, c)
		}
		return c
	}
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", in.Name, err)
		}
		if onlyConn != 0 && rec.Conn() != onlyConn {
			continue
		}
		switch rec.Type.Name {
		case "conn_open":
			c := of(rec.Conn())
			c.NetNS = rec.NetNS()
			fam, _ := rec.Uint("family")
			lp, _ := rec.Uint("lport")
			rp, _ := rec.Uint("rport")
			la, _ := rec.Addr("laddr", fam == 4)
			ra, _ := rec.Addr("raddr", fam == 4)
			c.Local, c.Remote = netip.AddrPortFrom(la, uint16(lp)), netip.AddrPortFrom(ra, uint16(rp))
			if p, ok := rec.Uint("proto"); ok {
				c.Proto = map[uint64]string{6: "tcp", 17: "udp"}[p]
			}
		case "conn_close":
			of(rec.Conn()).Closed = true
		case "conn_summary":
			c := of(rec.Conn())
			if c.Records == 0 {
				c.FirstNs, _ = rec.Uint("start_ns")
			}
			c.Records++
			c.LastNs = max(c.LastNs, rec.Time())
			for _, f := range rec.Type.Fields {
				if f.Name == "start_ns" {
					continue
				}
				v, _ := rec.FieldUint(f)
				c.Figures[f.Name] += v
			}
		}
	}
	var out []*SummaryConn
	for _, c := range order {
		if c.Records == 0 {
			continue
		}
		c.SRTT = srttOf(c.Figures)
		out = append(out, c)
	}
	return out, nil
}

// srttOf reads the srtt histogram of figures.
func srttOf(fig map[string]uint64) *SummaryRTT {
	n := fig["rtt_samples"]
	if n == 0 {
		return nil
	}
	s := &SummaryRTT{Samples: n, MeanUs: float64(fig["rtt_sum_us"]) / float64(n)}
	var cum uint64
	for i := 0; ; i++ {
		v, ok := fig[fmt.Sprintf("rtt_hist_%d", i)]
		if !ok {
			break
		}
		if v == 0 {
			continue
		}
		cum += v
		upper := uint64(2) << i
		if s.P50BelowUs == 0 && cum*2 >= n {
			s.P50BelowUs = upper
		}
		if s.P99BelowUs == 0 && cum*100 >= n*99 {
			s.P99BelowUs = upper
		}
		s.MaxBelowUs = upper
	}
	return s
}

// SummaryTable writes the connections of a summary recording, one line
// each: what the application and each layer carried, retransmissions,
// drops and srtt.
func SummaryTable(w io.Writer, conns []*SummaryConn) {
	fmt.Fprintf(w, "%-8s %-4s %-44s %7s %12s %12s %12s %12s %9s %7s %12s\n",
		"conn", "", "local -> remote", "records", "app sent", "app recv", "tcp xmit", "dev xmit", "retrans", "drops", "srtt mean")
	// drops: those that lose data (drop_lost_packets), as the event
	// report's classes count them.
	for _, c := range conns {
		srtt := "-"
		if c.SRTT != nil {
			srtt = fmt.Sprintf("%.0f µs", c.SRTT.MeanUs)
		}
		f := c.Figures
		fmt.Fprintf(w, "%-8d %-4s %-44s %7d %12d %12d %12d %12d %9d %7d %12s\n", c.ID, c.Proto,
			strings.TrimSpace(c.Local.String()+" -> "+c.Remote.String()), c.Records,
			f["sock_send_bytes"], f["sock_recv_bytes"], f["tcp_xmit_bytes"], f["dev_xmit_bytes"],
			f["retrans_segs"], f["drop_lost_packets"], srtt)
	}
}
