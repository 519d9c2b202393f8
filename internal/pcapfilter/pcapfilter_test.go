// SPDX-License-Identifier: Apache-2.0

package pcapfilter

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func conn(proto uint8, local, remote string) Conn {
	return Conn{Proto: proto, Local: netip.MustParseAddrPort(local), Remote: netip.MustParseAddrPort(remote)}
}

var (
	tcp4  = conn(6, "10.200.1.1:40000", "10.200.1.2:5201")
	udp4  = conn(17, "10.200.1.1:53000", "10.200.2.9:53")
	tcp6  = conn(6, "[fd00::1]:40001", "[fd00::2]:443")
	udp6  = conn(17, "[fd00::1]:5353", "[fd00:1::7]:5353")
	tcpm  = conn(6, "[::ffff:10.200.1.1]:40002", "[::ffff:10.200.1.2]:80") // a v6 socket speaking IPv4
	conns = map[string]Conn{"tcp4": tcp4, "udp4": udp4, "tcp6": tcp6, "udp6": udp6, "tcpm": tcpm}
)

// Each expression lists the connections it selects, by pcap-filter(7)'s
// meaning with src the local end and dst the remote end.
func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want string
	}{
		{"tcp", "tcp4 tcp6 tcpm"},
		{"udp", "udp4 udp6"},
		{"ip", "tcp4 udp4 tcpm"},
		{"ip6", "tcp6 udp6"},
		{"host 10.200.1.2", "tcp4 tcpm"},
		{"host 10.200.1.1", "tcp4 udp4 tcpm"},
		{"host ::ffff:10.200.1.2", "tcp4 tcpm"},
		{"src host 10.200.1.2", ""},
		{"dst host 10.200.1.2", "tcp4 tcpm"},
		{"src host 10.200.1.1", "tcp4 udp4 tcpm"},
		{"src or dst host 10.200.2.9", "udp4"},
		{"src and dst host fd00::1", ""},
		{"src and dst net 10.200.1.0/24", "tcp4 tcpm"},
		{"net 10.200.0.0/16", "tcp4 udp4 tcpm"},
		{"dst net 10.200.2.0/24", "udp4"},
		{"net 10.200.2.0 mask 255.255.255.0", "udp4"},
		{"net fd00::/16", "tcp6 udp6"},
		{"dst net fd00:1::/32", "udp6"},
		{"port 5201", "tcp4"},
		{"tcp port 5201", "tcp4"},
		{"udp port 5201", ""},
		{"port 53", "udp4"},
		{"src port 53", ""},
		{"dst port 53", "udp4"},
		{"src port 5353", "udp6"},
		{"src and dst port 5353", "udp6"},
		{"portrange 400-500", "tcp6"},
		{"portrange 500-400", "tcp6"},
		{"src portrange 40000-40001", "tcp4 tcp6"},
		{"dst portrange 1-100", "udp4 tcpm"},
		{"tcp dst portrange 1-100", "tcpm"},
		{"ip6 and port 443", "tcp6"},
		{"ip6 port 443", "tcp6"},
		{"ip host 10.200.1.1", "tcp4 udp4 tcpm"},
		{"ip6 host fd00::2", "tcp6"},
		{"not tcp", "udp4 udp6"},
		{"! tcp", "udp4 udp6"},
		{"tcp and not ip6", "tcp4 tcpm"},
		{"tcp && !ip6", "tcp4 tcpm"},
		{"udp or port 80", "udp4 udp6 tcpm"},
		{"udp || port 80", "udp4 udp6 tcpm"},
		{"port 80 or 443", "tcp6 tcpm"},
		{"tcp dst port 80 or 443 or 53", "tcp6 tcpm"},
		{"host 10.200.1.2 or 10.200.2.9", "tcp4 udp4 tcpm"},
		{"not port 80 and not 443", "tcp4 udp4 udp6"},
		{"10.200.2.9", "udp4"},
		{"src 10.200.1.1", "tcp4 udp4 tcpm"},
		{"dst fd00::2", "tcp6"},
		// and and or have equal precedence, left to right (pcap-filter(7)).
		{"udp or tcp and port 443", "tcp6"},
		{"port 443 and tcp or udp", "udp4 tcp6 udp6"},
		{"udp or (tcp and port 443)", "udp4 tcp6 udp6"},
		{"(udp or tcp) and port 443", "tcp6"},
		{"not (tcp or udp)", ""},
		{"not (host 10.200.1.1 or ip6)", ""},
		{"((tcp)) and ((ip6))", "tcp6"},
		{"TCP PORT 5201", "tcp4"},
	} {
		e, err := Parse(tc.expr)
		if err != nil {
			t.Errorf("%q: %v", tc.expr, err)
			continue
		}
		var got []string
		for _, name := range []string{"tcp4", "udp4", "tcp6", "udp6", "tcpm"} {
			if e.Match(conns[name]) {
				got = append(got, name)
			}
		}
		if g := strings.Join(got, " "); g != tc.want {
			t.Errorf("%q (%s) selects [%s], want [%s]", tc.expr, e, g, tc.want)
		}
		// The canonical form means the same.
		e2, err := Parse(e.String())
		if err != nil {
			t.Errorf("%q: canonical %q does not parse: %v", tc.expr, e, err)
		} else if e2.String() != e.String() {
			t.Errorf("%q: canonical %q reparses as %q", tc.expr, e, e2)
		}
	}
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{"", "empty expression"},
		{"   ", "empty expression"},
		{"host", "column 5 (end): host needs a value"},
		{"host example.com", `column 6: "example.com" is not an IP address`},
		{"port http", `column 6: "http" is not a port number`},
		{"port 70000", `column 6: "70000" is not a port number`},
		{"portrange 10", `column 11: "10" is not a port range`},
		{"net 10.1.2.3/8", `has host bits set (did you mean 10.0.0.0/8?)`},
		{"net 10.0.0.0 mask 255.0.255.0", "not a contiguous netmask"},
		{"tcp host 10.0.0.1", "column 1: tcp host: tcp and udp qualify port and portrange only"},
		{"ip host fd00::1", "column 1: ip with an address of the other family"},
		{"ip6 net 10.0.0.0/8", "column 1: ip6 with an address of the other family"},
		{"tcp port 80 udp", `column 13: unexpected "udp" (join primitives with and/or)`},
		{"(tcp", "column 5 (end): missing ) for the ( at column 1"},
		{"tcp)", `column 4: unexpected ")"`},
		{"tcp and", "column 8 (end): expression ends early"},
		{"not", "expression ends early"},
		{"icmp", `column 1: "icmp" is not supported`},
		{"ether host 00:11:22:33:44:55", `"ether" is not supported`},
		{"tcp & udp", `column 5: "&": did you mean "&&"?`},
		{"port 80 $", `column 9: unexpected character '$'`},
		{"tcp and len > 100", `column 9: "len" is not supported: events have no packet length here`},
		{"tcp[13] & 2 != 0", `column 4: unexpected character '[': comparisons and packet bytes are not supported`},
		{"src", "column 4 (end): expected host, net, port or portrange"},
		{"src and", `column 5: expected host, net, port or portrange, got "and"`},
		{"port and 80", `column 6: port needs a value, got "and"`},
		{"and", `column 1: unexpected "and"`},
		{strings.Repeat("(", 100) + "tcp" + strings.Repeat(")", 100), "nested deeper than 64"},
		{strings.Repeat("tcp or ", 1000) + "tcp", "at most 4096"},
	} {
		_, err := Parse(tc.expr)
		if err == nil {
			t.Errorf("%q parsed, want error %q", tc.expr, tc.want)
			continue
		}
		if !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: error %q, want one line containing %q", tc.expr, err, tc.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"tcp port 443 and host 10.0.0.2", "src or dst net fd00::/8", "not (udp or portrange 1-1023)",
		"port 80 or 443", "net 10.0.0.0 mask 255.0.0.0", "!tcp&&ip6||dst 10.1.1.1", "src and dst port 5353"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrSyntax) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("%q: error %q is not one line of ErrSyntax", s, err)
			}
			return
		}
		for _, c := range conns {
			e.Match(c)
		}
		e.Match(Conn{})
		e2, err := Parse(e.String())
		if err != nil {
			t.Fatalf("%q: canonical %q does not parse: %v", s, e, err)
		}
		if e2.String() != e.String() {
			t.Fatalf("%q: canonical %q reparses as %q", s, e, e2)
		}
		for _, c := range conns {
			if e.Match(c) != e2.Match(c) {
				t.Fatalf("%q and its canonical %q differ on %v", s, e, c)
			}
		}
	})
}
