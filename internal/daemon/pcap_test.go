// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// TestPcapFilter: a stream and the connection list select by a
// pcap-filter expression as the readers do (docs/FILTERS.md): src is the
// local end, and an event without a connection matches nothing.
func TestPcapFilter(t *testing.T) {
	// A user who does not see all never sees a conn_open (the connection
	// has no owner before its first socket call, docs/DAEMON.md#access):
	// this test is about the expression, so it sees all.
	td := startFake(t, func(c *Config) { seeAll(t, c) })
	c := td.client(t)
	ctx := context.Background()
	uid := uint32(os.Geteuid())

	s := collect(must[*magnetclient.Stream](t)(c.Subscribe(ctx, magnetclient.Filter{Pcap: "tcp src port 6000 or dst host 10.0.0.9"}, 0)))
	f := td.fake
	t0 := monotonicNs() - uint64(2*time.Second)
	f.send(f.connOpen(t, 42, 100, 100, uid, "recv", "10.0.0.2:5201", "10.0.0.1:40000", t0)...)
	f.send(f.connOpen(t, 43, 101, 101, uid, "recv2", "10.0.0.2:6000", "10.0.0.1:40001", t0)...)
	for i := range 5 {
		f.send(f.rec(t, "sock_recv", t0+uint64(i+1)*ms, 42, 100, 1000, nil))
		f.send(f.rec(t, "sock_recv", t0+uint64(i+1)*ms, 43, 101, 2000, nil))
		f.send(f.rec(t, "sock_recv", t0+uint64(i+1)*ms, 0, 101, 3000, nil))
	}
	// conn 43's conn_open, then its five sock_recv.
	evs, _ := s.events(t, 6)
	for i, e := range evs {
		if e.Conn != 43 || i > 0 && e.Size != 2000 {
			t.Fatalf("pcap expression matched %+v", e)
		}
	}
	s.quiet(t, 50*time.Millisecond)
	list := must[[]magnetclient.Connection](t)(c.Connections(ctx, magnetclient.Filter{Pcap: "port 5201"}, magnetclient.Window{}))
	if len(list) != 1 || list[0].ID != 42 {
		t.Errorf("connections of port 5201: %+v", list)
	}
	if _, err := c.Subscribe(ctx, magnetclient.Filter{Pcap: "tcp port"}, 0); err == nil {
		t.Error("a bad pcap expression was accepted")
	} else if want := "pcap: column 9 (end): port needs a value"; !strings.Contains(err.Error(), want) {
		t.Errorf("bad pcap expression: %v, want %q", err, want)
	}
}

// TestExprUnknownField: an expression naming a field no event of the
// recording has is refused with its column, as the readers refuse it
// (docs/FILTERS.md), not accepted to match nothing; a field of the
// recording's dictionary passes.
func TestExprUnknownField(t *testing.T) {
	td := startFake(t, nil)
	c := td.client(t)
	ctx := context.Background()
	_, err := c.Subscribe(ctx, magnetclient.Filter{Expr: "size > 0 && fields.srtt > 1000"}, 0)
	if want := `expr: column 20: no event has a field "srtt"`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("fields.srtt: %v, want %q", err, want)
	}
	if _, err := c.Subscribe(ctx, magnetclient.Filter{Expr: `fields["no_such"] == 1`}, 0); err == nil || !strings.Contains(err.Error(), `no event has a field "no_such"`) {
		t.Errorf(`fields["no_such"]: %v`, err)
	}
	s, err := c.Subscribe(ctx, magnetclient.Filter{Expr: "fields.srtt_us > 1000"}, 0)
	if err != nil {
		t.Fatalf("fields.srtt_us: %v", err)
	}
	s.Close()
}
