// SPDX-License-Identifier: Apache-2.0

package export_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// exported copies the exported fields of c, so that rows compare with
// reflect.DeepEqual against literals.
func exported(c *export.Conn) export.Conn {
	return export.Conn{
		ID: c.ID, Proto: c.Proto, Local: c.Local, Remote: c.Remote, NetNS: c.NetNS,
		PID: c.PID, Comm: c.Comm, Peer: c.Peer, OpenNs: c.OpenNs, CloseNs: c.CloseNs,
		Events: c.Events, SentApp: c.SentApp, RecvApp: c.RecvApp,
	}
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// wantConns is the connection table of the test trace.
var wantConns = []export.Conn{
	{ID: 11, Proto: "tcp", Local: ap("10.0.0.1:40000"), Remote: ap("10.0.0.2:80"), NetNS: 100,
		PID: 5, Comm: "curl", Peer: 12, OpenNs: t0 + 1000, CloseNs: t0 + 4_000_000_000,
		Events: 4, SentApp: 1000, RecvApp: 500},
	{ID: 12, Proto: "tcp", Local: ap("10.0.0.2:80"), Remote: ap("10.0.0.1:40000"), NetNS: 200,
		PID: 9, Comm: "nginx", Peer: 11, OpenNs: t0 + 2000,
		Events: 2, SentApp: 500, RecvApp: 1000},
	{ID: 21, Proto: "udp", Local: ap("10.0.0.1:5000"), Remote: ap("10.0.0.2:53"), NetNS: 100,
		PID: 8, Comm: "my app\t1", Peer: 22, OpenNs: t0 + 3_000_000_000,
		Events: 2, SentApp: 40},
	{ID: 22, Proto: "udp", Local: ap("10.0.0.2:53"), Remote: ap("0.0.0.0:0"), NetNS: 200,
		PID: 9, Comm: "nginx", Peer: 21, OpenNs: t0 + 3_000_000_500,
		Events: 1, RecvApp: 40},
}

func checkConns(t *testing.T, got []*export.Conn, want []export.Conn) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("got %d rows, want %d", len(got), len(want))
	}
	for i := 0; i < min(len(got), len(want)); i++ {
		if g := exported(got[i]); !reflect.DeepEqual(g, want[i]) {
			t.Errorf("row %d:\n got %+v\nwant %+v", i, g, want[i])
		}
	}
}

func TestConns(t *testing.T) {
	file, _ := buildTrace(t)
	cs, start, err := export.Conns(newReader(t, file))
	if err != nil {
		t.Fatalf("Conns: %v", err)
	}
	if start != t0 {
		t.Errorf("start = %d, want %d", start, uint64(t0))
	}
	checkConns(t, cs, wantConns)
}

// TestConnsCorrupt damages the second block: Conns returns the rows built
// from the first and the reader's error.
func TestConnsCorrupt(t *testing.T) {
	file, second := buildTrace(t)
	file[second+40] ^= 0x01
	cs, start, err := export.Conns(newReader(t, file))
	if !errors.Is(err, trace.ErrCorrupt) {
		t.Fatalf("Conns error = %v, want ErrCorrupt", err)
	}
	if !strings.Contains(err.Error(), "checksum mismatch") {
		t.Errorf("Conns error = %q, want a checksum mismatch", err)
	}
	if start != t0 {
		t.Errorf("start = %d, want %d", start, uint64(t0))
	}
	want := []export.Conn{wantConns[0], wantConns[1]}
	// Only the first block's events: no close, no sock_recv on 11, no
	// sock_send on 12.
	want[0].CloseNs, want[0].Events, want[0].RecvApp = 0, 3, 0
	want[1].Events, want[1].SentApp = 1, 0
	checkConns(t, cs, want)
}

func TestConnsTruncated(t *testing.T) {
	file, second := buildTrace(t)
	cs, _, err := export.Conns(newReader(t, file[:second+10]))
	if err != nil {
		t.Fatalf("Conns on a cut-short trace: %v, want no error", err)
	}
	if len(cs) != 2 || cs[0].ID != 11 || cs[1].ID != 12 || cs[0].Peer != 12 || cs[1].Peer != 11 {
		t.Errorf("cut-short trace: got rows %+v, want 11 and 12, paired", cs)
	}
}

// TestConnsPairing covers pairConns through small traces.
func TestConnsPairing(t *testing.T) {
	open := func(conn uint64, time uint64, proto int, local, remote string) recSpec {
		l, r := ap(local), ap(remote)
		fam := 4
		if l.Addr().Is6() {
			fam = 6
		}
		return recSpec{"conn_open", hdr{time: time, conn: conn},
			vals{"proto": proto, "family": fam, "lport": int(l.Port()), "rport": int(r.Port()), "laddr": l.Addr(), "raddr": r.Addr()}}
	}
	for _, tc := range []struct {
		name  string
		recs  []recSpec
		peers map[uint64]uint64
	}{
		{"ipv6 tcp", []recSpec{
			open(1, 10, 6, "[fd00::1]:3000", "[fd00::2]:443"),
			open(2, 20, 6, "[fd00::2]:443", "[fd00::1]:3000"),
		}, map[uint64]uint64{1: 2, 2: 1}},
		{"different protocols", []recSpec{
			open(1, 10, 6, "10.0.0.1:3000", "10.0.0.2:53"),
			open(2, 20, 17, "10.0.0.2:53", "10.0.0.1:3000"),
		}, map[uint64]uint64{}},
		{"server first", []recSpec{
			open(1, 10, 17, "10.0.0.2:53", "0.0.0.0:0"),
			open(2, 20, 17, "10.0.0.1:3000", "10.0.0.2:53"),
		}, map[uint64]uint64{1: 2, 2: 1}},
		// An unconnected server pairs with one client only.
		{"two clients", []recSpec{
			open(1, 10, 17, "10.0.0.2:53", "0.0.0.0:0"),
			open(2, 20, 17, "10.0.0.1:3000", "10.0.0.2:53"),
			open(3, 30, 17, "10.0.0.1:3001", "10.0.0.2:53"),
		}, map[uint64]uint64{1: 2, 2: 1}},
		// The connected reverse end wins over an unconnected socket.
		{"connected wins", []recSpec{
			open(1, 10, 17, "10.0.0.2:53", "0.0.0.0:0"),
			open(2, 20, 17, "10.0.0.1:3000", "10.0.0.2:53"),
			open(3, 30, 17, "10.0.0.2:53", "10.0.0.1:3000"),
		}, map[uint64]uint64{2: 3, 3: 2}},
		{"no peer", []recSpec{
			open(1, 10, 6, "10.0.0.1:3000", "10.0.0.9:80"),
		}, map[uint64]uint64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := testHeader(t)
			var buf bytes.Buffer
			w, err := trace.NewWriter(&buf, h, trace.WriterOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, rs := range tc.recs {
				if err := w.Write(encode(t, h, rs)); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Close(nil); err != nil {
				t.Fatal(err)
			}
			cs, _, err := export.Conns(newReader(t, buf.Bytes()))
			if err != nil {
				t.Fatal(err)
			}
			if len(cs) != len(tc.recs) {
				t.Fatalf("got %d rows, want %d", len(cs), len(tc.recs))
			}
			for _, c := range cs {
				if c.Peer != tc.peers[c.ID] {
					t.Errorf("conn %d: peer %d, want %d", c.ID, c.Peer, tc.peers[c.ID])
				}
			}
		})
	}
}

var connsHeader = []string{"conn", "proto", "local", "remote", "netns", "pid", "comm", "peer", "open", "close", "events", "app_sent", "app_recv"}

func TestWriteConns(t *testing.T) {
	file, _ := buildTrace(t)
	cs, start, err := export.Conns(newReader(t, file))
	if err != nil {
		t.Fatal(err)
	}
	// WriteConns orders rows by open time, whatever the order it gets.
	rev := []*export.Conn{cs[3], cs[2], cs[1], cs[0]}
	var out bytes.Buffer
	if err := export.WriteConns(&out, rev, start); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	want := [][]string{
		connsHeader,
		{"11", "tcp", "10.0.0.1:40000", "10.0.0.2:80", "100", "5", "curl", "12", "0.000001", "4.000000", "4", "1000", "500"},
		{"12", "tcp", "10.0.0.2:80", "10.0.0.1:40000", "200", "9", "nginx", "11", "0.000002", "-", "2", "500", "1000"},
		{"21", "udp", "10.0.0.1:5000", "10.0.0.2:53", "100", "8", "my_app_1", "22", "3.000000", "-", "2", "40", "0"},
		{"22", "udp", "10.0.0.2:53", "0.0.0.0:0", "200", "9", "nginx", "21", "3.000001", "-", "1", "0", "40"},
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	// Columns are aligned: every cell of a column starts at the same byte.
	starts := cellStarts(lines[0])
	for i, line := range lines {
		if got := strings.Fields(line); !reflect.DeepEqual(got, want[i]) {
			t.Errorf("line %d = %q, want %q", i+1, got, want[i])
		}
		if got := cellStarts(line); !reflect.DeepEqual(got, starts) {
			t.Errorf("line %d: cells start at %v, header's at %v:\n%s", i+1, got, starts, out.String())
		}
	}
}

func cellStarts(line string) []int {
	var out []int
	for i := range line {
		if line[i] != ' ' && (i == 0 || line[i-1] == ' ') {
			out = append(out, i)
		}
	}
	return out
}

func TestWriteConnsUnknown(t *testing.T) {
	// A socket seen only through events, its conn_open lost: no protocol,
	// no owner, no addresses.
	cs := []*export.Conn{{ID: 7, OpenNs: 3000, Events: 1}}
	var out bytes.Buffer
	if err := export.WriteConns(&out, cs, 1000); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2:\n%s", len(lines), out.String())
	}
	got := strings.Fields(lines[1])
	if len(got) < 11 || got[0] != "7" || got[1] != "?" {
		t.Fatalf("row = %q, want conn 7 and proto ?", got)
	}
	// The address columns are not checked here: see the report on how
	// WriteConns prints a zero netip.AddrPort.
	want := []string{"0", "0", "-", "-", "0.000002", "-", "1", "0", "0"}
	if tail := got[len(got)-len(want):]; !reflect.DeepEqual(tail, want) {
		t.Errorf("row ends %q, want %q", tail, want)
	}
}

func TestPairTraces(t *testing.T) {
	conn := func(id uint64, local, remote string, open uint64) *export.Conn {
		return &export.Conn{ID: id, Proto: "tcp", Local: ap(local), Remote: ap(remote), OpenNs: open}
	}
	// The sender's trace and the receiver's, on clocks 1 s apart; the
	// tuple recurs later (a port reused), and the receiver's trace also
	// holds a loopback pair of its own.
	sender := []*export.Conn{conn(1, "10.0.0.1:40000", "10.0.0.2:80", 100), conn(2, "10.0.0.1:40000", "10.0.0.2:80", 5000)}
	receiver := []*export.Conn{
		conn(11, "10.0.0.2:80", "10.0.0.1:40000", 1_000_000_150),
		conn(12, "10.0.0.2:80", "10.0.0.1:40000", 1_000_005_050),
		conn(13, "127.0.0.1:9000", "127.0.0.1:50000", 1_000_000_000),
		conn(14, "127.0.0.1:50000", "127.0.0.1:9000", 1_000_000_001),
	}
	export.PairConns(receiver) // as Conns does for each trace
	export.PairTraces([][]*export.Conn{sender, receiver}, []string{"s.mgt", "r.mgt"}, []int64{0, -1_000_000_000})
	want := map[*export.Conn][2]any{
		sender[0]: {uint64(11), "r.mgt"}, sender[1]: {uint64(12), "r.mgt"},
		receiver[0]: {uint64(1), "s.mgt"}, receiver[1]: {uint64(2), "s.mgt"},
		receiver[2]: {uint64(14), ""}, receiver[3]: {uint64(13), ""},
	}
	for c, w := range want {
		if c.Peer != w[0] || c.PeerTrace != w[1] {
			t.Errorf("conn %d: peer %d in %q, want %v in %q", c.ID, c.Peer, c.PeerTrace, w[0], w[1])
		}
	}
}

func TestPeerIndexPrefersOwnTrace(t *testing.T) {
	x := export.NewPeerIndex([]string{"a", "b"})
	other := &export.Conn{ID: 1, Proto: "tcp", Local: ap("10.0.0.1:1"), Remote: ap("10.0.0.2:2")}
	own := &export.Conn{ID: 2, Proto: "tcp", Local: ap("10.0.0.1:1"), Remote: ap("10.0.0.2:2")}
	x.Add(1, other)
	x.Add(0, own)
	c := &export.Conn{ID: 3, Proto: "tcp", Local: ap("10.0.0.2:2"), Remote: ap("10.0.0.1:1")}
	if src, p := x.Add(0, c); src != 0 || p != own || c.PeerTrace != "" {
		t.Fatalf("paired with %v of trace %d (%q), want its own trace's end", p, src, c.PeerTrace)
	}
}

func TestTimeline(t *testing.T) {
	h := func(boot string, wall int64) *trace.Header {
		return &trace.Header{Clock: trace.Clock{WallOffsetNs: wall}, Extra: map[string]any{"boot_id": boot}}
	}
	tl := export.NewTimeline([]*trace.Header{h("a", 1000), h("a", 1003), h("b", 5000), {}})
	if fmt.Sprint(tl.Offsets) != "[0 0 4000 -1000]" {
		t.Fatalf("offsets %v, want [0 0 4000 -1000]", tl.Offsets)
	}
	if !tl.SameClock(0, 1) || tl.SameClock(0, 2) || tl.SameClock(3, 3) != true || tl.SameClock(2, 3) {
		t.Fatalf("same clock wrong")
	}
}

func TestPeerIndexUnmaps(t *testing.T) {
	x := export.NewPeerIndex([]string{"a", "b"})
	v6 := &export.Conn{ID: 1, Proto: "tcp", Local: ap("[::ffff:10.0.0.1]:40000"), Remote: ap("[::ffff:10.0.0.2]:80")}
	v4 := &export.Conn{ID: 2, Proto: "tcp", Local: ap("10.0.0.2:80"), Remote: ap("10.0.0.1:40000")}
	x.Add(0, v6)
	if _, p := x.Add(1, v4); p != v6 {
		t.Fatalf("an AF_INET6 end with IPv4-mapped addresses does not pair with its IPv4 peer")
	}
}
