// SPDX-License-Identifier: Apache-2.0

package filter

import (
	"encoding/json"
	"errors"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

func sockRecv() *Event {
	return &Event{
		Type: event.SockRecv, Name: "sock_recv", TimeNs: 5, CPU: 1, TID: 101, PID: 100, Comm: "softirq-victim", UID: 7,
		NetNS: 4026531840, Conn: 42, Size: 1448,
		HasConn: true, Proto: 6,
		Local:    netip.MustParseAddrPort("10.200.0.2:5201"),
		Remote:   netip.MustParseAddrPort("10.200.0.1:40000"),
		HasOwner: true, OwnerPID: 200, OwnerUID: 1000, OwnerComm: "iperf3",
		Fields: func() map[string]any { return map[string]any{} },
	}
}

func tcpState() *Event {
	e := sockRecv()
	e.Type, e.Name, e.Size = event.TCPState, "tcp_state", 0
	e.Fields = func() map[string]any {
		return map[string]any{"cwnd": int64(20), "srtt_us": int64(1500), "state": "ESTABLISHED"}
	}
	return e
}

func mustParse(t *testing.T, q string) *Filter {
	t.Helper()
	vals, err := url.ParseQuery(q)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := FromQuery(vals)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	f, err := Parse(spec, Options{NetNS: func(name string) (uint32, error) {
		if name == "lab" {
			return 4026531840, nil
		}
		return 0, errors.New("no such namespace")
	}})
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return f
}

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		q    string
		recv bool // matches the sock_recv
		st   bool // matches the tcp_state
	}{
		{"", true, true},
		{"types=sock_recv", true, false},
		{"types=sock_send,tcp_state", false, true},
		{"types=sock_send&types=sock_recv", true, false},
		{"groups=sock", true, false},
		{"groups=tcpstate", false, true},
		{"conns=42", true, true},
		{"conns=43,44", false, false},
		// pid, uid, comm: the connection's owner, not the interrupted task.
		{"pids=200", true, true},
		{"pids=100", false, false},
		{"uids=1000", true, true},
		{"uids=7", false, false},
		{"comms=iperf3", true, true},
		{"ports=5201", true, true},
		{"ports=40000", true, true},
		{"lports=40000", false, false},
		{"rports=40000", true, true},
		{"addrs=10.200.0.0/16", true, true},
		{"addrs=10.200.0.1", true, true},
		{"addrs=::ffff:10.200.0.1", true, true},
		{"addrs=10.201.0.0/16", false, false},
		{"netns=4026531840", true, true},
		{"netns=lab", true, true},
		{"netns=1", false, false},
		{"protos=tcp", true, true},
		{"protos=udp", false, false},
		{"types=sock_recv&ports=5201&pids=200", true, false},
		{"expr=size > 1000", true, false},
		{"expr=fields.cwnd >= 20 %26%26 fields.state == 'ESTABLISHED'", false, true},
		{"expr=owner.comm == 'iperf3' %26%26 owner.uid == 1000", true, true},
		{"expr=comm.startsWith('softirq')", true, true},
		{"expr=raddr == '10.200.0.1' %26%26 lport == 5201 %26%26 proto == 'tcp'", true, true},
		{"expr=type == 'tcp_state' || conn == 7", false, true},
		{"expr=fields.nosuchfield > 1", false, false}, // evaluation error: no match
	} {
		f := mustParse(t, tc.q)
		for _, c := range []struct {
			e    *Event
			want bool
		}{{sockRecv(), tc.recv}, {tcpState(), tc.st}} {
			got := f.Match(c.e) && f.MatchExpr(c.e)
			if got != c.want {
				t.Errorf("%q on %s: %v, want %v", tc.q, c.e.Name, got, c.want)
			}
		}
	}
}

func TestNoConnection(t *testing.T) {
	// A device event without a connection, run by task 100 (uid 7).
	e := &Event{Type: event.DevRecv, Name: "dev_recv", PID: 100, UID: 7, Comm: "ksoftirqd/0", NetNS: 1}
	for q, want := range map[string]bool{
		"":                   true,
		"pids=100":           true, // the task, when there is no connection
		"uids=7":             true,
		"ports=80":           false, // connection keys never match without one
		"protos=tcp":         false,
		"expr=proto == ''":   true,
		"expr=laddr == ''":   true,
		"expr=owner.uid < 0": true,
	} {
		if got := mustParse(t, q).Match(e) && mustParse(t, q).MatchExpr(e); got != want {
			t.Errorf("%q: %v, want %v", q, got, want)
		}
	}
	// A connection whose owner is not known yet: pid filters do not match.
	e = sockRecv()
	e.HasOwner = false
	if mustParse(t, "pids=100").Match(e) {
		t.Error("unknown owner: the interrupted task must not stand for it")
	}
}

func TestGroups(t *testing.T) {
	f := mustParse(t, "types=sock_recv,dev_xmit&groups=sched")
	want := event.GroupSock | event.GroupDev | event.GroupSched | event.GroupConn
	if f.Groups() != want {
		t.Errorf("groups %v, want %v", f.Groups(), want)
	}
	if !f.WantsType(event.SchedSwitch) || !f.WantsType(event.DevXmit) || f.WantsType(event.DevRecv) || f.WantsType(event.ConnOpen) {
		t.Error("types of the groups and the types asked for, nothing else")
	}
	if !mustParse(t, "groups=conn").WantsType(event.ConnOpen) {
		t.Error("groups=conn asks for conn_open")
	}
	if mustParse(t, "").Groups() != 0 {
		t.Error("no types, no groups: nothing to enable")
	}
}

func TestMatchConn(t *testing.T) {
	c := Conn{ID: 42, NetNS: 9, Opened: true, Proto: 17,
		Local: netip.MustParseAddrPort("[fd00::1]:53"), Remote: netip.MustParseAddrPort("[fd00::2]:3333"),
		HasOwner: true, OwnerPID: 5, OwnerUID: 0, OwnerComm: "dns"}
	for q, want := range map[string]bool{
		"":                 true,
		"ports=53":         true,
		"protos=udp":       true,
		"addrs=fd00::/64":  true,
		"addrs=fd01::/64":  false,
		"uids=0&comms=dns": true,
		"pids=6":           false,
		"netns=9&conns=42": true,
	} {
		if got := mustParse(t, q).MatchConn(c); got != want {
			t.Errorf("%q: %v, want %v", q, got, want)
		}
	}
	if err := mustParse(t, "types=sock_recv").OnlyConnKeys(); err == nil {
		t.Error("types must be refused for connections")
	}
}

func TestBad(t *testing.T) {
	for q, want := range map[string]string{
		"types=nosuch":                   "unknown event type",
		"types=lost":                     "lost lines",
		"types=task":                     "recorder",
		"types=iface":                    "recorder",
		"groups=nosuch":                  "unknown event group",
		"groups=-dev":                    "not a group name",
		"pids=x":                         "not a number",
		"pids=-1":                        "not a number",
		"ports=70000":                    "not a number",
		"ports=0":                        "0 is not a port",
		"conns=18446744073709551616":     "not a number",
		"addrs=10.0.0.0/33":              "not an address",
		"addrs=host.example":             "not an address",
		"netns=../etc":                   "neither an inode",
		"netns=missing":                  "no such namespace",
		"protos=sctp":                    "want tcp or udp",
		"comms=averyveryverylongcommand": "longer than a command name",
		"expr=size >":                    "expr:",
		"expr=size %2B 1":                "must be true or false",
		"expr=nosuchvar == 1":            "undeclared reference",
		"expr=a&expr=b":                  "one expression",
		"color=blue":                     "unknown parameter",
	} {
		vals, err := url.ParseQuery(q)
		if err != nil {
			t.Fatal(err)
		}
		spec, err := FromQuery(vals)
		if err == nil {
			_, err = Parse(spec, Options{NetNS: func(string) (uint32, error) { return 0, errors.New("no such namespace") }})
		}
		if err == nil {
			t.Errorf("%q accepted", q)
			continue
		}
		if !errors.Is(err, ErrBad) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: error %q, want one line with %q", q, err, want)
		}
	}
	long := magnetclient.Filter{Expr: strings.Repeat("1 == 1 && ", 500) + "true"}
	if _, err := Parse(long, Options{}); err == nil || !errors.Is(err, ErrBad) {
		t.Errorf("expression over %d bytes: %v", MaxExprBytes, err)
	}
	if _, err := FromQuery(url.Values{"queue": {"5"}}, "queue"); err != nil {
		t.Errorf("the caller's own keys are left alone: %v", err)
	}
}

// TestCostLimit stops an expression that would do a lot of work per event.
func TestCostLimit(t *testing.T) {
	f, err := Parse(magnetclient.Filter{Expr: "[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, [1,2,3,4,5,6,7,8,9,10].all(e, a+b+c+d+e > 0)))))"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if f.MatchExpr(sockRecv()) {
		t.Error("an evaluation over the cost limit must not match")
	}
}

// FuzzParse feeds the filter parser what clients can send: a query string
// and a JSON body. Nothing may panic; every refusal is ErrBad.
func FuzzParse(f *testing.F) {
	f.Add("types=sock_recv&ports=5201", `{"types":["tcp_state"],"expr":"fields.cwnd > 10"}`)
	f.Add("expr=size%20%3E%201000&addrs=10.0.0.0/8", `{"addrs":["::1"],"netns":["lab"]}`)
	f.Add("groups=sched,conn&pids=1,2,3", `{"conns":[1,2],"protos":["udp"],"expr":"owner.comm == 'x'"}`)
	f.Add("pcap=tcp%20port%20443%20and%20host%2010.0.0.2", `{"pcap":"not (udp or src net fd00::/8)"}`)
	f.Fuzz(func(t *testing.T, query, body string) {
		opts := Options{NetNS: func(string) (uint32, error) { return 0, errors.New("none") }}
		check := func(spec magnetclient.Filter) {
			flt, err := Parse(spec, opts)
			if err != nil {
				if !errors.Is(err, ErrBad) {
					t.Fatalf("error not marked bad: %v", err)
				}
				return
			}
			e := sockRecv()
			_ = flt.Match(e) && flt.MatchExpr(e)
		}
		if vals, err := url.ParseQuery(query); err == nil {
			if spec, err := FromQuery(vals); err == nil {
				check(spec)
			} else if !errors.Is(err, ErrBad) {
				t.Fatalf("query error not marked bad: %v", err)
			}
		}
		var req magnetclient.Request
		if json.Unmarshal([]byte(body), &req) == nil {
			check(req.Filter)
		}
	})
}

// Filters with the same expression share its program, and a memo
// evaluates it once per event with the same answers as MatchExpr.
func TestExprMemo(t *testing.T) {
	parse := func(expr string) *Filter {
		f, err := Parse(magnetclient.Filter{Expr: expr}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	a, b, c := parse("size > 100"), parse("size > 100"), parse("size > 1000")
	if a.expr != b.expr || a.expr == c.expr {
		t.Fatalf("programs: a %p b %p c %p; want a and b shared, c its own", a.expr, b.expr, c.expr)
	}
	none := parse("")
	for _, size := range []int32{50, 500, 5000} {
		e := &Event{Size: size}
		var memo ExprMemo
		for round := 0; round < 2; round++ {
			for _, f := range []*Filter{a, b, c, none} {
				if got, want := f.MatchExprMemo(e, &memo), f.MatchExpr(e); got != want {
					t.Errorf("size %d, %q, round %d: memo says %v, MatchExpr %v", size, f.spec.Expr, round, got, want)
				}
			}
		}
		if memo.n != 2 {
			t.Errorf("size %d: %d results remembered, want 2 (one per distinct expression)", size, memo.n)
		}
	}
}

// MatchConnKeys agrees with Match on the address tests, and passes a
// filter without them whatever the connection.
func TestMatchConnKeys(t *testing.T) {
	l, r := netip.MustParseAddrPort("10.0.0.1:40000"), netip.MustParseAddrPort("10.0.0.2:5201")
	for _, tc := range []struct {
		spec magnetclient.Filter
		want bool
	}{
		{magnetclient.Filter{}, true},
		{magnetclient.Filter{PIDs: []uint32{7}}, true}, // not an address test
		{magnetclient.Filter{Ports: []uint16{5201}}, true},
		{magnetclient.Filter{Ports: []uint16{9}}, false},
		{magnetclient.Filter{RemotePorts: []uint16{40000}}, false},
		{magnetclient.Filter{Addrs: []string{"10.0.0.0/24"}, Protos: []string{"tcp"}}, true},
		{magnetclient.Filter{Protos: []string{"udp"}}, false},
	} {
		f, err := Parse(tc.spec, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := f.MatchConnKeys(true, 6, l, r); got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.spec, got, tc.want)
		}
		noKeys := len(tc.spec.Ports)+len(tc.spec.RemotePorts)+len(tc.spec.Addrs)+len(tc.spec.Protos) == 0
		if got := f.MatchConnKeys(false, 0, netip.AddrPort{}, netip.AddrPort{}); got != noKeys {
			t.Errorf("%+v, unknown connection: %v, want %v", tc.spec, got, noKeys)
		}
	}
}

// The pcap key means what it means to the readers (internal/pcapfilter):
// src is the local end; an event without a connection never matches.
func TestPcap(t *testing.T) {
	e := sockRecv() // local 10.200.0.2:5201, remote 10.200.0.1:40000, tcp
	for expr, want := range map[string]bool{
		"tcp port 5201":                          true,
		"udp":                                    false,
		"src port 5201 and dst port 40000":       true,
		"dst host 10.200.0.2":                    false,
		"host 10.200.0.2 and not ip6":            true,
		"net 10.200.0.0/24 and portrange 1-1024": false,
	} {
		f := mustParse(t, "pcap="+url.QueryEscape(expr))
		if got := f.Match(e); got != want {
			t.Errorf("%q: %v, want %v", expr, got, want)
		}
		if got := f.MatchConnKeys(true, e.Proto, e.Local, e.Remote); got != want {
			t.Errorf("%q: MatchConnKeys %v, want %v", expr, got, want)
		}
		if got := f.MatchConn(Conn{Opened: true, Proto: e.Proto, Local: e.Local, Remote: e.Remote}); got != want {
			t.Errorf("%q: MatchConn %v, want %v", expr, got, want)
		}
	}
	none := &Event{Type: event.DevRecv, Name: "dev_recv"}
	if mustParse(t, "pcap=not+udp").Match(none) {
		t.Error("an event without a connection matched a pcap expression")
	}
	_, err := Parse(magnetclient.Filter{Pcap: "tcp port"}, Options{})
	if !errors.Is(err, ErrBad) || !strings.Contains(err.Error(), "pcap: column 9 (end): port needs a value") {
		t.Errorf("bad pcap expression: %v", err)
	}
}

// TestFieldRefs: the fields an expression names, each with the column of
// its name, and Parse refusing those HasField does not know.
func TestFieldRefs(t *testing.T) {
	got := FieldRefs(`fields.srtt_us > 1 && fields["cwnd"] < 10 || size > 0`)
	want := []FieldRef{{"srtt_us", 8}, {"cwnd", 31}}
	if !slices.Equal(got, want) {
		t.Errorf("FieldRefs: %+v, want %+v", got, want)
	}
	known := func(name string) bool { return name == "srtt_us" }
	if _, err := Parse(magnetclient.Filter{Expr: "fields.srtt_us > 1"}, Options{HasField: known}); err != nil {
		t.Errorf("known field: %v", err)
	}
	_, err := Parse(magnetclient.Filter{Expr: "fields.srtt > 1"}, Options{HasField: known})
	if want := `expr: column 8: no event has a field "srtt"`; err == nil || !errors.Is(err, ErrBad) || !strings.Contains(err.Error(), want) {
		t.Errorf("unknown field: %v, want %q", err, want)
	}
	if _, err := Parse(magnetclient.Filter{Expr: "fields.srtt > 1"}, Options{}); err != nil {
		t.Errorf("without HasField nothing is checked: %v", err)
	}
}

// TestExprErrorPosition: a CEL error is one line naming the column, as
// the pcap-filter parser's; conn.rport, conn being the connection id,
// gets a hint at the variables that hold the tuple.
func TestExprErrorPosition(t *testing.T) {
	for _, c := range []struct{ expr, want string }{
		{"size >", "bad filter: expr: column 7: Syntax error"},
		{"nosuch == 1", "bad filter: expr: column 1: undeclared reference to 'nosuch'"},
		{"size > 1 &&\nnosuch", "bad filter: expr: line 2 column 1: undeclared reference"},
		{"conn.rport == 5201", "expr: column 5: type 'int' does not support field selection (conn is the connection id; the connection's tuple is proto, laddr, lport, raddr, rport)"},
	} {
		_, err := Parse(magnetclient.Filter{Expr: c.expr}, Options{})
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %v, want one line with %q", c.expr, err, c.want)
		}
	}
}
