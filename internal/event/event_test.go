// SPDX-License-Identifier: Apache-2.0

package event

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseGroups(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Group
	}{
		{"", DefaultGroups},
		{"  ", DefaultGroups},
		{"default", DefaultGroups},
		{"default,sched", DefaultGroups | GroupSched},
		{"default, sched ,headers", DefaultGroups | GroupSched | GroupHeaders},
		{"default,-dev", DefaultGroups &^ GroupDev},
		{"all", GroupSock | GroupTCP | GroupTCPState | GroupIP | GroupDev | GroupDrop | GroupConn | GroupSched | GroupHeaders | GroupRate | GroupTCPSend | GroupAcks},
		{"all,-sched,-headers,-rate,-tcpsend,-acks", DefaultGroups | GroupIP},
		{"all,-sched,-headers,-rate,-tcpsend,-acks,-ip", DefaultGroups},
		{"default,acks", DefaultGroups | GroupAcks},
		{"default,rate", DefaultGroups | GroupRate},
		{"default,tcpsend", DefaultGroups | GroupTCPSend},
		{"tcpsend", GroupTCPSend | GroupConn},
		{"tcp", GroupTCP | GroupConn}, // tcp_send is not in tcp
		{"sock", GroupSock | GroupConn},
		{"tcp,ip", GroupTCP | GroupIP | GroupConn},
		// conn cannot be removed: every other event needs it.
		{"default,-conn", DefaultGroups},
		{"sock,-sock", GroupConn},
	} {
		got, err := ParseGroups(tc.in)
		if err != nil {
			t.Errorf("ParseGroups(%q): %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("ParseGroups(%q) = %#x (%s), want %#x (%s)", tc.in, uint32(got), got, uint32(tc.want), tc.want)
		}
	}
}

func TestParseGroupsErrors(t *testing.T) {
	for _, in := range []string{"bogus", "default,bogus", "-bogus"} {
		g, err := ParseGroups(in)
		if err == nil {
			t.Errorf("ParseGroups(%q) = %s, want an error", in, g)
			continue
		}
		if !strings.Contains(err.Error(), `unknown event group "bogus"`) {
			t.Errorf("ParseGroups(%q) error = %q, want it to name the unknown group", in, err)
		}
		if !strings.Contains(err.Error(), "sock, tcp, tcpstate, ip, dev, drop, conn, sched, headers, rate, tcpsend, summary, acks, default, all") {
			t.Errorf("ParseGroups(%q) error = %q, want it to list the valid names", in, err)
		}
		if g != 0 {
			t.Errorf("ParseGroups(%q) returned group %#x with its error, want 0", in, uint32(g))
		}
	}
}

func TestAllGroups(t *testing.T) {
	if got, want := AllGroups(), Group(1<<13-1)&^GroupSummary; got != want {
		t.Errorf("AllGroups() = %#x, want %#x", uint32(got), uint32(want))
	}
}

func TestGroupNames(t *testing.T) {
	want := []string{"sock", "tcp", "tcpstate", "ip", "dev", "drop", "conn", "sched", "headers", "rate", "tcpsend", "summary", "acks", "default", "all"}
	if got := GroupNames(); !reflect.DeepEqual(got, want) {
		t.Errorf("GroupNames() = %q, want %q", got, want)
	}
}

func TestGroupString(t *testing.T) {
	for _, tc := range []struct {
		g     Group
		names []string
		str   string
	}{
		{0, nil, ""},
		{GroupSock, []string{"sock"}, "sock"},
		{GroupSched | GroupSock, []string{"sock", "sched"}, "sock,sched"},
		{DefaultGroups, []string{"sock", "tcp", "tcpstate", "dev", "drop", "conn"}, "sock,tcp,tcpstate,dev,drop,conn"},
		{AllGroups(), []string{"sock", "tcp", "tcpstate", "ip", "dev", "drop", "conn", "sched", "headers", "rate", "tcpsend", "acks"}, "sock,tcp,tcpstate,ip,dev,drop,conn,sched,headers,rate,tcpsend,acks"},
		// Bits no group has are ignored.
		{GroupHeaders | 1<<20, []string{"headers"}, "headers"},
	} {
		if got := tc.g.Names(); !reflect.DeepEqual(got, tc.names) {
			t.Errorf("Group(%#x).Names() = %q, want %q", uint32(tc.g), got, tc.names)
		}
		if got := tc.g.String(); got != tc.str {
			t.Errorf("Group(%#x).String() = %q, want %q", uint32(tc.g), got, tc.str)
		}
	}
}

// TestGroupStringRoundTrip checks that String's output parses back to the
// same set, for every group alone (conn is always added by ParseGroups).
func TestGroupStringRoundTrip(t *testing.T) {
	for _, name := range GroupNames() {
		g, err := ParseGroups(name)
		if err != nil {
			t.Fatalf("ParseGroups(%q): %v", name, err)
		}
		back, err := ParseGroups(g.String())
		if err != nil {
			t.Fatalf("ParseGroups(%q): %v", g.String(), err)
		}
		if back != g {
			t.Errorf("%q parses to %s, which parses back to %s", name, g, back)
		}
	}
}

func TestGroupHelp(t *testing.T) {
	help := GroupHelp()
	lines := strings.Split(strings.TrimSuffix(help, "\n"), "\n")
	if len(lines) != 13 {
		t.Fatalf("GroupHelp has %d lines, want 13:\n%s", len(lines), help)
	}
	if want := "  sock      socket layer: sock_send, sock_recv"; lines[0] != want {
		t.Errorf("GroupHelp line 1 = %q, want %q", lines[0], want)
	}
	if want := "  tcpstate  TCP state snapshots: tcp_state"; lines[2] != want {
		t.Errorf("GroupHelp line 3 = %q, want %q", lines[2], want)
	}
}

func TestCatalogue(t *testing.T) {
	// Its size is events.h's (TestCatalogueMatchesEventsH): adding an
	// event needs no change here.
	ids := map[Type]string{}
	names := map[string]Type{}
	for i, in := range Catalogue {
		if prev, ok := ids[in.Type]; ok {
			t.Errorf("id %d used by %s and %s", in.Type, prev, in.Name)
		}
		ids[in.Type] = in.Name
		if prev, ok := names[in.Name]; ok {
			t.Errorf("name %s used by ids %d and %d", in.Name, prev, in.Type)
		}
		names[in.Name] = in.Type
		// Catalogue is documented to be in id order, and ids are dense.
		if in.Type != Type(i+1) {
			t.Errorf("Catalogue[%d] is %s with id %d, want id %d", i, in.Name, in.Type, i+1)
		}
		if in.Type == 0 || in.Type >= NumTypes {
			t.Errorf("%s: id %d outside 1..%d", in.Name, in.Type, NumTypes-1)
		}
		if in.Name == "" || in.Hook == "" || in.Measures == "" {
			t.Errorf("%d: incomplete entry %+v", in.Type, in)
		}
		if len(in.Group.Names()) != 1 {
			t.Errorf("%s: group %#x is not exactly one group", in.Name, uint32(in.Group))
		}

		byType, ok := ByType(in.Type)
		if !ok || !reflect.DeepEqual(byType, in) {
			t.Errorf("ByType(%d) = %+v, %v; want %+v", in.Type, byType, ok, in)
		}
		byName, ok := ByName(in.Name)
		if !ok || !reflect.DeepEqual(byName, in) {
			t.Errorf("ByName(%q) = %+v, %v; want %+v", in.Name, byName, ok, in)
		}
	}
	if in, ok := ByType(0); ok {
		t.Errorf("ByType(0) = %+v, want not found", in)
	}
	if in, ok := ByType(Type(len(Catalogue) + 1)); ok {
		t.Errorf("ByType(%d) = %+v, want not found", len(Catalogue)+1, in)
	}
	if in, ok := ByName("nope"); ok {
		t.Errorf(`ByName("nope") = %+v, want not found`, in)
	}
}

// TestConstants pins the ids, which are written into every trace.
func TestConstants(t *testing.T) {
	want := map[string]Type{
		"sock_send": SockSend, "sock_recv": SockRecv, "tcp_send": TCPSend, "tcp_xmit": TCPXmit,
		"tcp_rcv": TCPRcv, "tcp_state": TCPState, "tcp_retrans": TCPRetrans, "ip_send": IPSend,
		"ip_recv": IPRecv, "dev_queue": DevQueue, "dev_xmit": DevXmit, "dev_recv": DevRecv,
		"drop": Drop, "conn_open": ConnOpen, "conn_close": ConnClose, "sched_switch": SchedSwitch,
		"sched_wakeup": SchedWakeup, "sched_fork": SchedFork, "sched_exit": SchedExit, "lost": Lost,
		"headers": Headers, "task": Task, "iface": Iface,
	}
	for name, id := range want {
		in, ok := ByName(name)
		if !ok {
			t.Errorf("ByName(%q) not found", name)
			continue
		}
		if in.Type != id {
			t.Errorf("%s has id %d, want %d", name, in.Type, id)
		}
	}
}

func TestTypesIn(t *testing.T) {
	for _, tc := range []struct {
		g    Group
		want []Type
	}{
		{0, nil},
		{GroupSock, []Type{SockSend, SockRecv}},
		{GroupTCP, []Type{TCPXmit, TCPRcv, TCPRetrans}},
		{GroupTCPSend, []Type{TCPSend}},
		{GroupDev | GroupSock, []Type{SockSend, SockRecv, DevQueue, DevXmit, DevRecv}},
		{GroupConn, []Type{ConnOpen, ConnClose, Lost, Task, Iface}},
		{GroupSched, []Type{SchedSwitch, SchedWakeup, SchedFork, SchedExit}},
	} {
		if got := TypesIn(tc.g); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("TypesIn(%s) = %v, want %v", tc.g, got, tc.want)
		}
	}
	if got := TypesIn(AllGroups() | GroupSummary); len(got) != len(Catalogue) {
		t.Errorf("TypesIn(all) has %d types, want %d", len(got), len(Catalogue))
	}
}

func TestSnake(t *testing.T) {
	for in, want := range map[string]string{
		"Seq":          "seq",
		"SrttUs":       "srtt_us",
		"IpId":         "ip_id",
		"L3proto":      "l3proto",
		"GsoSegs":      "gso_segs",
		"CaState":      "ca_state",
		"TotalRetrans": "total_retrans",
		"NextComm":     "next_comm",
	} {
		if got := snake(in); got != want {
			t.Errorf("snake(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseGroupsLeadingRemoval(t *testing.T) {
	g, err := ParseGroups("-dev")
	if err != nil {
		t.Fatal(err)
	}
	if want := DefaultGroups &^ GroupDev; g != want {
		t.Fatalf("ParseGroups(-dev) = %s, want %s", g, want)
	}
}

// TestCatalogueMatchesEventsH: every type of enum mg_type (types_gen.go)
// has a catalogue entry of the same name, and the catalogue nothing more.
func TestCatalogueMatchesEventsH(t *testing.T) {
	for typ, name := range cNames {
		if in, ok := ByType(typ); !ok || in.Name != name {
			t.Errorf("type %d (%s in events.h): catalogue has %+v", typ, name, in)
		}
	}
	if len(Catalogue) != len(cNames) {
		t.Errorf("catalogue has %d types, events.h %d", len(Catalogue), len(cNames))
	}
}
