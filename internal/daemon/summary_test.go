// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// TestSummaryFigures: conn_summary records feed a connection's figures as
// the events they count would have: bytes and events per layer and
// direction, retransmissions and drops, summed over the intervals.
func TestSummaryFigures(t *testing.T) {
	td := startFake(t, func(c *Config) {
		seeAll(t, c)
		c.Summary = 200 * time.Millisecond
	})
	f := td.fake
	now := monoNow()
	f.send(f.connOpen(t, 7, 100, 100, 0, "app", "10.0.0.1:40000", "10.0.0.2:443", now)...)
	interval := map[string]any{
		"sock_send_bytes": 3000, "sock_send_calls": 3, "sock_recv_bytes": 50, "sock_recv_calls": 1,
		"tcp_xmit_bytes": 4448, "tcp_xmit_skbs": 4, "tcp_rcv_bytes": 50, "tcp_rcv_skbs": 2,
		"dev_xmit_bytes": 4700, "dev_xmit_skbs": 4, "dev_recv_bytes": 150, "dev_recv_skbs": 2,
		"retrans_bytes": 1448, "retrans_segs": 1, "drop_packets": 2,
	}
	f.send(f.rec(t, "conn_summary", now+1e8, 7, 0, 0, interval), f.rec(t, "conn_summary", now+3e8, 7, 0, 0, interval))
	c := td.client(t)
	var cn *magnetclient.Connection
	waitUntil(t, func() bool {
		var err error
		cn, err = c.Connection(context.Background(), 7, magnetclient.Window{})
		return err == nil && cn.Drops.Count == 4
	})
	for _, x := range []struct {
		name   string
		d      magnetclient.Direction
		bytes  int64
		events uint64
	}{
		{"app send", cn.App.Send, 6000, 6}, {"app recv", cn.App.Recv, 100, 2},
		{"tcp send", cn.TCP.Send, 8896, 8}, {"tcp recv", cn.TCP.Recv, 100, 4},
		{"wire send", cn.Wire.Send, 9400, 8}, {"wire recv", cn.Wire.Recv, 300, 4},
	} {
		if x.d.Bytes != x.bytes || x.d.Events != x.events {
			t.Errorf("%s: %d bytes in %d events, want %d in %d", x.name, x.d.Bytes, x.d.Events, x.bytes, x.events)
		}
	}
	if cn.Retransmits.Count != 2 || cn.Retransmits.Bytes != 2896 {
		t.Errorf("retransmits %+v, want 2 of 2896 bytes", cn.Retransmits)
	}
}

// TestSummaryConfig: summary mode loads the summarized groups, all of
// them in the baseline, and refuses what it cannot summarize.
func TestSummaryConfig(t *testing.T) {
	c := DefaultConfig()
	c.Summary = time.Second
	s, err := c.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if want := record.DefaultSummaryGroups | event.GroupSummary; s.available != want || s.baseline != want {
		t.Errorf("available %s, baseline %s; want both %s", s.available, s.baseline, want)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Summary = 10 * time.Millisecond }, "summary 10ms: want an interval of at least 100ms"},
		{func(c *Config) { c.Events.Available = "sock,tcp,conn" }, "summary needs"},
		{func(c *Config) { c.KernelEvents.Tracepoints = []string{"sched:sched_switch"} }, "no kernel events"},
		{func(c *Config) { c.Flight.Window, c.Flight.Output = time.Second, t.TempDir()+"/f.mgt" }, "use one"},
	} {
		c := DefaultConfig()
		c.Summary = time.Second
		tc.edit(&c)
		if _, err := c.resolve(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v, want %q", err, tc.want)
		}
	}
	old, _ := DefaultConfig().resolve()
	if got := restartOnly(old, s); len(got) != 2 || got[1] != "summary" {
		t.Errorf("restartOnly = %v, want events.available and summary", got)
	}
}

// waitUntil polls cond until it holds, for at most 10 s: the fake
// recorder hands records over on its own goroutine.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}
