// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// TestParsePcapFilter records a real TCP v4, TCP v6 and UDP transfer
// between two namespaces, then checks that `parse TRACE EXPR` prints
// exactly the lines of the unfiltered parse whose connection the test's
// own reading of the connection table selects, for several expressions.
func TestParsePcapFilter(t *testing.T) {
	needRoot(t)
	if err := netlab.Available(); err != nil {
		t.Skip(err)
	}
	lab := netlab.ForTest(t, netlab.Options{Name: "mgpcapf"})
	// The lab's link has IPv4 only; give it IPv6 (nodad: usable at once).
	c6, s6 := "fd00:200:"+strconv.Itoa(os.Getpid()%9000)+"::1", "fd00:200:"+strconv.Itoa(os.Getpid()%9000)+"::2"
	for _, a := range []struct{ ns, iface, addr string }{{lab.Client.NS, lab.Client.Iface, c6}, {lab.Server.NS, lab.Server.Iface, s6}} {
		if out, err := exec.Command("ip", "-n", a.ns, "addr", "add", a.addr+"/64", "dev", a.iface, "nodad").CombinedOutput(); err != nil {
			t.Fatalf("ip addr add: %v %s", err, out)
		}
	}
	dir := t.TempDir()
	trace, ready := filepath.Join(dir, "f.mgt"), filepath.Join(dir, "ready")
	rec := exec.Command(bin, "record", "-q", "-o", trace, "--netns", lab.Client.NS, "--ready-file", ready)
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { rec.Process.Kill(); rec.Wait() }()
	waitFor(t, func() bool { _, err := os.Stat(ready); return err == nil })
	port := 30000 + os.Getpid()%10000
	for i, x := range []struct{ proto, addr string }{
		{"tcp", lab.Server.Addr.String() + ":" + strconv.Itoa(port)},
		{"tcp", "[" + s6 + "]:" + strconv.Itoa(port+1)},
		{"udp", lab.Server.Addr.String() + ":" + strconv.Itoa(port+2)},
	} {
		srv, sc := serveWorkload(t, lab, "--proto", x.proto, "--listen", x.addr, "--count", "5", "--size", "1000")
		if out, err := lab.Command(lab.Client, bin, "workload", "send", "--proto", x.proto, "--to", x.addr, "--count", "5", "--size", "1000", "--interval", "1ms").CombinedOutput(); err != nil {
			t.Fatalf("client %d: %v %s", i, err, out)
		}
		sc.Scan()
		srv.Wait()
	}
	rec.Process.Signal(os.Interrupt)
	if err := rec.Wait(); err != nil {
		t.Fatalf("record: %v", err)
	}

	var conns []struct {
		ID            uint64
		Proto         string
		Local, Remote netip.AddrPort
	}
	r := magnet(t, "parse", "--conns", "--json", trace)
	if r.code != 0 {
		t.Fatalf("parse --conns: %s", r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), &conns); err != nil {
		t.Fatal(err)
	}
	all := magnet(t, "parse", trace)
	if all.code != 0 {
		t.Fatalf("parse: %s", all.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(all.stdout, "\n"), "\n")
	connCol := slices.Index(strings.Split(lines[0], "\t"), "conn")
	c4, srv4 := lab.Client.Addr, lab.Server.Addr
	v6 := func(a netip.Addr) bool { return a.Is6() && !a.Is4In6() }
	for _, tc := range []struct {
		expr string
		want func(proto string, l, r netip.AddrPort) bool
	}{
		{"tcp", func(p string, l, r netip.AddrPort) bool { return p == "tcp" }},
		{"udp", func(p string, l, r netip.AddrPort) bool { return p == "udp" }},
		{"ip6", func(p string, l, r netip.AddrPort) bool { return v6(l.Addr()) }},
		{"tcp and ip", func(p string, l, r netip.AddrPort) bool { return p == "tcp" && !v6(l.Addr()) }},
		{"host " + srv4.String(), func(p string, l, r netip.AddrPort) bool { return r.Addr().Unmap() == srv4 || l.Addr().Unmap() == srv4 }},
		{"src host " + c4.String(), func(p string, l, r netip.AddrPort) bool { return l.Addr().Unmap() == c4 }},
		{"dst host " + s6, func(p string, l, r netip.AddrPort) bool { return r.Addr() == netip.MustParseAddr(s6) }},
		{"net fd00::/8", func(p string, l, r netip.AddrPort) bool { return v6(l.Addr()) }},
		{"dst port " + strconv.Itoa(port+2), func(p string, l, r netip.AddrPort) bool { return r.Port() == uint16(port+2) }},
		{"tcp port " + strconv.Itoa(port) + " or " + strconv.Itoa(port+1), func(p string, l, r netip.AddrPort) bool {
			return p == "tcp" && (r.Port() == uint16(port) || r.Port() == uint16(port+1))
		}},
		{"portrange " + strconv.Itoa(port+1) + "-" + strconv.Itoa(port+2), func(p string, l, r netip.AddrPort) bool {
			return r.Port() >= uint16(port+1) && r.Port() <= uint16(port+2)
		}},
		{"not udp and not ip6", func(p string, l, r netip.AddrPort) bool { return p == "tcp" && !v6(l.Addr()) }},
	} {
		sel := map[string]bool{}
		for _, c := range conns {
			if c.Proto != "" && tc.want(c.Proto, c.Local, c.Remote) {
				sel[strconv.FormatUint(c.ID, 10)] = true
			}
		}
		if len(sel) == 0 {
			t.Errorf("%q: the test selects no connection of %d: the recording lacks one", tc.expr, len(conns))
			continue
		}
		want := []string{lines[0]}
		for _, l := range lines[1:] {
			// Lost records stay: a selection must not hide losses.
			if f := strings.Split(l, "\t"); sel[f[connCol]] || f[connCol+1] == "lost" {
				want = append(want, l)
			}
		}
		got := magnet(t, "parse", trace, tc.expr)
		if got.code != 0 {
			t.Errorf("%q: %s", tc.expr, got.stderr)
			continue
		}
		if g := strings.Split(strings.TrimSuffix(got.stdout, "\n"), "\n"); !slices.Equal(g, want) {
			t.Errorf("%q: %d lines, want %d (of %d, %d connections)", tc.expr, len(g), len(want), len(lines), len(sel))
		} else {
			t.Logf("%q: %d of %d lines, %d of %d connections", tc.expr, len(want)-1, len(lines)-1, len(sel), len(conns))
		}
	}
	// The daemon's CEL means the same over the same connections.
	for pcap, cel := range map[string]string{
		"udp":                              `proto == "udp"`,
		"dst port " + strconv.Itoa(port+1): "rport == " + strconv.Itoa(port+1),
		"src host " + c4.String():          `laddr == "` + c4.String() + `"`,
	} {
		a, b := magnet(t, "parse", trace, pcap), magnet(t, "parse", trace, "--filter", cel)
		if a.code != 0 || b.code != 0 || a.stdout != b.stdout {
			t.Errorf("parse %q and parse --filter %q differ (exit %d %d: %s%s)", pcap, cel, a.code, b.code, a.stderr, b.stderr)
		}
	}
	// --conns lists the connections an expression selects.
	if r := magnet(t, "parse", "--conns", trace, "ip6"); r.code != 0 || strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stdout, s6) {
		t.Errorf("parse --conns ip6: want the header and one connection, to %s:\n%s%s", s6, r.stdout, r.stderr)
	}
	// export and report select the same events.
	udp := magnet(t, "parse", trace, "udp")
	csv := magnet(t, "export", trace, "--format", "csv", "-o", "-", "udp")
	if csv.code != 0 || strings.Count(csv.stdout, "\n") != strings.Count(udp.stdout, "\n") {
		t.Errorf("export udp: %d rows (exit %d, %s), parse udp: %d lines", strings.Count(csv.stdout, "\n"), csv.code, csv.stderr, strings.Count(udp.stdout, "\n"))
	}
	if rep := magnet(t, "report", trace, "ip6"); rep.code != 0 || strings.Count(rep.stdout, "\nconnection ") != 1 || !strings.Contains(rep.stdout, s6) {
		t.Errorf("report ip6: want one connection, to %s; exit %d %s\n%s", s6, rep.code, rep.stderr, rep.stdout)
	}
	// plot draws only selected events: the busiest connection among those
	// the expression keeps, and none when it keeps none.
	var v6conn uint64
	for _, c := range conns {
		if v6(c.Local.Addr()) && c.Proto == "tcp" && c.Remote.Port() == uint16(port+1) {
			v6conn = c.ID
		}
	}
	if v6conn == 0 {
		t.Fatalf("no IPv6 TCP connection among %+v", conns)
	}
	svg := filepath.Join(dir, "ip6.svg")
	if r := magnet(t, "plot", trace, "ip6", "--kind", "sendbuf", "-o", svg); r.code != 0 {
		t.Errorf("plot ip6: %s", r.stderr)
	} else if b, _ := os.ReadFile(svg); !strings.Contains(string(b), "connection "+strconv.FormatUint(v6conn, 10)) {
		t.Errorf("plot ip6 did not draw the IPv6 connection %d", v6conn)
	}
	oneLineError(t, magnet(t, "plot", trace, "port 9", "--kind", "sendbuf", "-o", svg), "no connection's events in")
	// The same through "--", and errors.
	if a, b := magnet(t, "parse", trace, "udp"), magnet(t, "parse", trace, "--", "udp"); a.stdout != b.stdout || a.code != 0 {
		t.Errorf("parse TRACE udp and parse TRACE -- udp differ")
	}
	oneLineError(t, magnet(t, "parse", trace, "tcp", "port"), "column 9 (end): port needs a value")
	oneLineError(t, magnet(t, "parse", trace, "--filter", "fields.no_such_field > 1"), `no event in the traces has a field "no_such_field"`)
	oneLineError(t, magnet(t, "parse", filepath.Join(dir, "missing.mgt"), "tcp"), "missing.mgt: no such file")
}
