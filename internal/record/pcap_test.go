// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/evselect"
	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/kevent"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/pcapfilter"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// pcapEvent identifies an event across recorders of one run: the programs
// of two recorders at one hook run one after the other in the same
// context, so they see the same connection, size, CPU and thread; only
// their clock readings differ.
type pcapEvent struct {
	name       string
	conn       uint64
	size       int32
	cpu        uint16
	tid        uint32
	flags      uint8
	seq, state uint64
}

func eventOf(rec trace.Record) pcapEvent {
	e := pcapEvent{name: rec.Type.Name, conn: rec.Conn(), size: rec.Size(), cpu: rec.CPU(), tid: rec.TID(), flags: rec.Flags()}
	e.seq, _ = rec.Uint("seq")
	e.state, _ = rec.Uint("state")
	return e
}

// pcapTrace is a trace's events up to cut (monotonic ns), its connections'
// first and last tuples, and its events without a connection.
type pcapTrace struct {
	events       []pcapEvent
	first, last  map[uint64]pcapfilter.Conn
	unattributed int
	header       *trace.Header
}

func readPcapTrace(t *testing.T, path string, cut uint64) pcapTrace {
	t.Helper()
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	pt := pcapTrace{first: map[uint64]pcapfilter.Conn{}, last: map[uint64]pcapfilter.Conn{}, header: r.Header()}
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch rec.Type.Name {
		case "task", "iface":
			continue // metadata: each recorder announces what it needs
		case "lost":
			t.Fatalf("%s: events lost: equality needs every event", path)
		}
		if rec.Time() > cut {
			continue
		}
		if rec.Type.Name == "conn_open" {
			fam, _ := rec.Uint("family")
			la, _ := rec.Addr("laddr", fam != 6)
			ra, _ := rec.Addr("raddr", fam != 6)
			lp, _ := rec.Uint("lport")
			rp, _ := rec.Uint("rport")
			proto, _ := rec.Uint("proto")
			c := pcapfilter.Conn{Proto: uint8(proto), Local: netip.AddrPortFrom(la, uint16(lp)), Remote: netip.AddrPortFrom(ra, uint16(rp))}
			if _, ok := pt.first[rec.Conn()]; !ok {
				pt.first[rec.Conn()] = c
			}
			if _, ok := pt.last[rec.Conn()]; !ok || rec.Flags()&export.ConnUpdate != 0 {
				pt.last[rec.Conn()] = c
			}
		}
		if rec.Conn() == 0 {
			pt.unattributed++
		}
		pt.events = append(pt.events, eventOf(rec))
	}
	return pt
}

// diffEvents describes how two multisets of events differ ("" if not).
func diffEvents(got, want []pcapEvent) string {
	n := map[pcapEvent]int{}
	for _, e := range got {
		n[e]++
	}
	for _, e := range want {
		n[e]--
	}
	var lines []string
	for e, d := range n {
		if d != 0 {
			lines = append(lines, fmt.Sprintf("%+d %+v", d, e))
		}
	}
	sort.Strings(lines)
	if len(lines) > 12 {
		lines = append(lines[:12], fmt.Sprintf("... %d more", len(lines)-12))
	}
	return strings.Join(lines, "\n")
}

// diffSkipped is diffEvents for two recordings of the same events, made by
// different recorders whose programs the kernel may have skipped
// (recursion misses, counted per program: missedGot for got's recorder,
// missedWant for want's). Nine recorders' programs run one after the other
// on each hook, each with its own recursion guard, so one recorder can miss
// a run another makes (seen: one tcp_rcv short). The traces differ by
// skips only when, for each event type, the events missing from one are
// no more than the runs its recorder's programs of that type missed (a
// count over every socket, so an upper bound): then the differences are
// returned as skip, else as diff.
func diffSkipped(got, want []pcapEvent, missedGot, missedWant map[string]uint64) (diff, skip string) {
	d := diffEvents(got, want)
	if d == "" {
		return "", ""
	}
	short, extra := map[string]uint64{}, map[string]uint64{}
	n := map[pcapEvent]int{}
	for _, e := range got {
		n[e]++
	}
	for _, e := range want {
		n[e]--
	}
	for e, k := range n {
		if k < 0 {
			short[e.name] += uint64(-k)
		} else if k > 0 {
			extra[e.name] += uint64(k)
		}
	}
	missedOf := func(missed map[string]uint64, name string) uint64 {
		var m uint64
		for _, h := range probe.Hooks {
			if slices.Contains(h.Events, name) {
				m += missed[h.Program]
			}
		}
		return m
	}
	var why []string
	for name, k := range short {
		m := missedOf(missedGot, name)
		if k > m {
			return d, ""
		}
		why = append(why, fmt.Sprintf("%d %s missing where its programs missed %d runs", k, name, m))
	}
	for name, k := range extra {
		m := missedOf(missedWant, name)
		if k > m {
			return d, ""
		}
		why = append(why, fmt.Sprintf("%d %s more than the unfiltered trace, whose programs missed %d runs", k, name, m))
	}
	sort.Strings(why)
	return "", strings.Join(why, "; ")
}

// addIPv6 gives the lab's two ends IPv6 addresses of a /64 made from its
// IPv4 /30, so that concurrent labs differ.
func addIPv6(t *testing.T, lab *netlab.Lab) (client, server netip.Addr) {
	t.Helper()
	b := lab.Subnet.Addr().As4()
	pfx := fmt.Sprintf("fd00:%x:%x:%x::", b[1], b[2], b[3])
	client, server = netip.MustParseAddr(pfx+"1"), netip.MustParseAddr(pfx+"2")
	for _, h := range []struct {
		host netlab.Host
		addr netip.Addr
	}{{lab.Client, client}, {lab.Server, server}} {
		if out, err := exec.Command("ip", "-n", h.host.NS, "addr", "add", h.addr.String()+"/64", "dev", h.host.Iface, "nodad").CombinedOutput(); err != nil {
			t.Fatalf("add %s: %v: %s", h.addr, err, out)
		}
	}
	return client, server
}

// TestPcapEqualsOffline records the server's namespace with no expression
// and, in the same run, with each of several expressions, while TCP and UDP
// go over IPv4 and IPv6 (the magnet workload and iperf3). Each filtered
// trace must hold exactly the events of the unfiltered one whose
// connection the expression selects by the tuple it had when first seen;
// that is the readers' selection (evselect) for every connection whose
// tuple never changed. A UDP socket first seen unconnected (iperf3 -u's
// server) and connected later is the one difference, which the test
// names and checks too.
func TestPcapEqualsOffline(t *testing.T) {
	needRoot(t)
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("iperf3 not installed")
	}
	lab := netlab.ForTest(t, netlab.Options{Name: "mgpcap", RateMbit: 200})
	c6, s6 := addIPv6(t, lab)
	base := uniquePort()
	for range 3 {
		uniquePort()
	}
	pTCP4, pTCP6, pUDP4, pUDP6 := base, base+1, base+2, base+3
	exprs := []string{
		fmt.Sprintf("tcp port %d", pTCP4),
		"udp",
		fmt.Sprintf("host %s and not port %d", lab.Server.Addr, pTCP4),
		"net 10.200.0.0/16",
		"ip6",
		fmt.Sprintf("src host %s or dst host %s", lab.Server.Addr, c6),
		fmt.Sprintf("portrange %d-%d", pTCP6, pUDP4),
		fmt.Sprintf("not (tcp and dst net %s)", netip.PrefixFrom(c6, 64).Masked()),
	}
	groups := event.DefaultGroups
	all := startRecording(t, record.Config{Groups: groups, Filters: record.Filters{NetNS: lab.Server.NS}})
	var recs []*recording
	for _, x := range exprs {
		recs = append(recs, startRecording(t, record.Config{Groups: groups, Filters: record.Filters{NetNS: lab.Server.NS, Pcap: x}}))
	}

	// TCP over IPv4 with the workload; UDP over IPv4 with it.
	tcpAddr := fmt.Sprintf("%s:%d", lab.Server.Addr, pTCP4)
	srv, srvOut := serve(t, lab, lab.Server, "--listen", tcpAddr, "--count", "50", "--size", "10000")
	run(t, lab.Command(lab.Client, magnetBin, "workload", "send", "--to", tcpAddr, "--count", "50", "--size", "10000", "--interval", "1ms"))
	srvOut.Scan()
	srv.Wait()
	udpAddr := fmt.Sprintf("%s:%d", lab.Server.Addr, pUDP4)
	srv, srvOut = serve(t, lab, lab.Server, "--proto", "udp", "--listen", udpAddr, "--count", "50", "--size", "1000")
	run(t, lab.Command(lab.Client, magnetBin, "workload", "send", "--proto", "udp", "--to", udpAddr, "--count", "50", "--size", "1000", "--interval", "1ms"))
	srvOut.Scan()
	srv.Wait()
	// TCP and UDP over IPv6 with iperf3 (its server listens on [::]).
	for _, x := range []struct {
		port int
		args []string
	}{{pTCP6, []string{"-n", "2M"}}, {pUDP6, []string{"-u", "-b", "10M", "-n", "1M"}}} {
		iperf := lab.Command(lab.Server, "iperf3", "-s", "-1", "-p", fmt.Sprint(x.port))
		if err := iperf.Start(); err != nil {
			t.Fatal(err)
		}
		// Connect once the server listens: every recorder has then seen
		// listen(), and a SYN finds the listener in each recorder's
		// table. (A packet that reaches a device on another CPU while the
		// recorders' programs still run, one after the other, for a
		// socket's first event, may find the socket in one table and not
		// yet in the next: that race is between recorders, not of the
		// filter, and the test keeps clear of it.)
		waitListen(t, lab, x.port)
		args := append([]string{"-c", s6.String(), "-p", fmt.Sprint(x.port)}, x.args...)
		if out, err := lab.Command(lab.Client, "iperf3", args...).CombinedOutput(); err != nil {
			iperf.Process.Kill()
			t.Fatalf("iperf3 %v: %v\n%s", args, err, out)
		}
		if err := iperf.Wait(); err != nil {
			t.Fatalf("iperf3 server: %v", err)
		}
	}
	// The lab is quiet once its programs have exited; the events up to
	// now are in every trace, those after it (none are expected) in none
	// of the comparisons.
	time.Sleep(200 * time.Millisecond)
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	cut := uint64(ts.Nano())
	allRes := all.stop(t)
	var results []*record.Result
	for _, r := range recs {
		results = append(results, r.stop(t))
	}

	u := readPcapTrace(t, all.path, cut)
	kinds := map[string]bool{}
	for _, c := range u.last {
		fam := "4"
		if c.Local.Addr().Unmap().Is6() {
			fam = "6"
		}
		kinds[fmt.Sprintf("proto %d ip%s", c.Proto, fam)] = true
	}
	for _, k := range []string{"proto 6 ip4", "proto 6 ip6", "proto 17 ip4", "proto 17 ip6"} {
		if !kinds[k] {
			t.Fatalf("the unfiltered trace lacks a connection of %s: %v", k, kinds)
		}
	}
	for i, x := range exprs {
		e, err := pcapfilter.Parse(x)
		if err != nil {
			t.Fatal(err)
		}
		f := readPcapTrace(t, recs[i].path, cut)
		if got := f.header.Settings.Filters["pcap"]; got != x {
			t.Errorf("%q: the header's filters say pcap %q", x, got)
		}
		if f.unattributed != 0 {
			t.Errorf("%q: %d events without a connection recorded", x, f.unattributed)
		}
		// What the kernel keeps: the connections whose first tuple
		// matches.
		var want []pcapEvent
		selected, changed := 0, 0
		for _, ev := range u.events {
			if c, ok := u.first[ev.conn]; ok && e.Match(c) {
				want = append(want, ev)
			}
		}
		for id, c := range u.first {
			if e.Match(c) {
				selected++
			}
			if e.Match(c) != e.Match(u.last[id]) {
				changed++
			}
		}
		if selected == 0 || selected == len(u.first) {
			t.Errorf("%q selects %d of %d connections: the test wants some of each", x, selected, len(u.first))
		}
		if d, skip := diffSkipped(f.events, want, results[i].MissedBy, allRes.MissedBy); d != "" {
			t.Errorf("%q: filtered trace (%d events) != unfiltered events of the connections it selects (%d):\n%s", x, len(f.events), len(want), d)
		} else if skip != "" {
			t.Logf("%q: the traces differ by runs the kernel skipped: %s", x, skip)
		}
		// The readers' selection (evselect, as parse and report apply
		// the expression) of the unfiltered trace is the filtered trace,
		// on every connection whose tuple never changed.
		sel, err := evselect.New([]trace.Source{{Name: all.path, Paths: []string{all.path}}}, evselect.Options{Pcap: e})
		if err != nil {
			t.Fatal(err)
		}
		stable := func(evs []pcapEvent) []pcapEvent {
			var out []pcapEvent
			for _, ev := range evs {
				if u.first[ev.conn] == u.last[ev.conn] {
					out = append(out, ev)
				}
			}
			return out
		}
		if d, _ := diffSkipped(stable(f.events), stable(readerSelection(t, sel, all.path, cut)), results[i].MissedBy, allRes.MissedBy); d != "" {
			t.Errorf("%q: on connections whose tuple never changed, the filtered trace differs from the readers' selection of the unfiltered one:\n%s", x, d)
		}
		t.Logf("%q: %d of %d connections, %d events of %d; %d connections whose verdict changed when a UDP socket connected", x, selected, len(u.first), len(f.events), len(u.events), changed)
	}
}

// waitListen waits until a TCP socket listens on port in the lab's server.
func waitListen(t *testing.T, lab *netlab.Lab, port int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		out, err := lab.Command(lab.Server, "ss", "-Hltn", fmt.Sprintf("sport = :%d", port)).Output()
		if err != nil {
			t.Fatalf("ss: %v", err)
		}
		if strings.TrimSpace(string(out)) != "" {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("nothing listens on port %d in %s", port, lab.Server.NS)
}

// readerSelection reads the events of the trace at path up to cut that sel
// keeps, as readPcapTrace does.
func readerSelection(t *testing.T, sel *evselect.Selector, path string, cut uint64) []pcapEvent {
	t.Helper()
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out []pcapEvent
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		switch rec.Type.Name {
		case "task", "iface", "lost":
			continue
		}
		if rec.Time() > cut || !sel.Keep(0, rec) {
			continue
		}
		out = append(out, eventOf(rec))
	}
}

// TestPcapCommandLine records as a user types it: magnet record with an
// expression as its argument, on the client's namespace, while the client
// talks TCP to one port and UDP to another. The trace must hold the TCP
// connection and not the UDP one, and its header must name the expression.
func TestPcapCommandLine(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgpcapcli"})
	tcpPort, udpPort := uniquePort(), uniquePort()
	tcpAddr := fmt.Sprintf("%s:%d", lab.Server.Addr, tcpPort)
	udpAddr := fmt.Sprintf("%s:%d", lab.Server.Addr, udpPort)
	tsrv, tout := serve(t, lab, lab.Server, "--listen", tcpAddr, "--count", "20", "--size", "1000")
	usrv, uout := serve(t, lab, lab.Server, "--proto", "udp", "--listen", udpAddr, "--count", "20", "--size", "1000")
	dir := t.TempDir()
	path, ready := dir+"/cli.mgt", dir+"/ready"
	expr := fmt.Sprintf("tcp port %d", tcpPort)
	rec := exec.Command(magnetBin, "record", "-q", "-o", path, "--netns", lab.Client.NS, "--ready-file", ready, "tcp", "port", fmt.Sprint(tcpPort))
	var stderr strings.Builder
	rec.Stderr = &stderr
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if rec.ProcessState == nil {
			rec.Process.Kill()
			rec.Wait()
		}
	}()
	// The recorder writes the ready file once its probes are attached;
	// nothing else says so.
	for i := 0; ; i++ {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if i == 600 {
			t.Fatalf("recorder not ready after 60 s: %s", stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	run(t, lab.Command(lab.Client, magnetBin, "workload", "send", "--to", tcpAddr, "--count", "20", "--size", "1000", "--interval", "1ms"))
	run(t, lab.Command(lab.Client, magnetBin, "workload", "send", "--proto", "udp", "--to", udpAddr, "--count", "20", "--size", "1000", "--interval", "1ms"))
	tout.Scan()
	uout.Scan()
	tsrv.Wait()
	usrv.Wait()
	if !strings.Contains(tout.Text(), "received 20000 bytes") || !strings.Contains(uout.Text(), "received 20000 bytes") {
		t.Fatalf("servers: %q, %q", tout.Text(), uout.Text())
	}
	if err := rec.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := rec.Wait(); err != nil {
		t.Fatalf("record: %v: %s", err, stderr.String())
	}
	h, evs, _ := readTrace(t, path)
	if h.Settings.Filters["pcap"] != expr {
		t.Errorf("header filters %v, want pcap %q", h.Settings.Filters, expr)
	}
	cs := conns(t, path)
	if len(cs) != 1 || cs[0].Proto != "tcp" || int(cs[0].Remote.Port()) != tcpPort {
		t.Fatalf("connections %+v, want the one TCP connection to port %d", cs, tcpPort)
	}
	if s := count(evs, "sock_send", cs[0].ID); s.sum != 20000 {
		t.Errorf("sock_send of the TCP connection: %d bytes, want 20000", s.sum)
	}
	for _, e := range evs {
		if e.conn != 0 && e.conn != cs[0].ID {
			t.Fatalf("an event of connection %d, which the trace does not announce", e.conn)
		}
	}
}

// What an expression cannot keep is refused before anything loads, in one
// line: a bad or too long expression, the sched group and kernel events
// (none of whose events have a connection).
func TestPcapRefused(t *testing.T) {
	for _, tc := range []struct {
		cfg  record.Config
		want string
	}{
		{record.Config{Filters: record.Filters{Pcap: "tcp port"}}, "pcap filter: column 9 (end): port needs a value"},
		{record.Config{Filters: record.Filters{Pcap: strings.Repeat("port 1 or ", 64) + "port 2"}}, "more than 128 tests"},
		{record.Config{Groups: event.DefaultGroups | event.GroupSched, Filters: record.Filters{Pcap: "tcp"}}, "the sched group with a pcap-filter expression"},
		{record.Config{KernelEvents: []kevent.Spec{{Kind: kevent.Tracepoint, System: "napi", Name: "napi_poll"}}, Filters: record.Filters{Pcap: "tcp"}}, "kernel events with a pcap-filter expression"},
	} {
		tc.cfg.Output = t.TempDir() + "/x.mgt"
		tc.cfg.StatusDir = t.TempDir()
		_, err := record.Run(t.Context(), tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%+v: %v, want one line containing %q", tc.cfg.Filters, err, tc.want)
		}
		if _, serr := os.Stat(tc.cfg.Output); serr == nil {
			t.Errorf("%q: the output was created", tc.want)
		}
	}
}

// TestDiffSkipped: traces that differ only by as many events of a type as
// the runs their recorder's programs of that type missed differ by skips;
// one more, or a type whose programs missed nothing, is a difference.
func TestDiffSkipped(t *testing.T) {
	a := pcapEvent{name: "tcp_rcv", conn: 1, seq: 10}
	b := pcapEvent{name: "tcp_rcv", conn: 1, seq: 20}
	x := pcapEvent{name: "dev_xmit", conn: 1, size: 100}
	for _, c := range []struct {
		got, want           []pcapEvent
		missedGot, missWant map[string]uint64
		diff, skip          bool
	}{
		{[]pcapEvent{a, b}, []pcapEvent{a, b}, nil, nil, false, false},
		{[]pcapEvent{a}, []pcapEvent{a, b}, map[string]uint64{"tcp_probe": 1}, nil, false, true},
		{[]pcapEvent{a}, []pcapEvent{a, b}, nil, map[string]uint64{"tcp_probe": 1}, true, false},
		{[]pcapEvent{a, b}, []pcapEvent{a}, nil, map[string]uint64{"tcp_probe": 3}, false, true},
		{[]pcapEvent{}, []pcapEvent{a, b}, map[string]uint64{"tcp_probe": 1}, nil, true, false},
		{[]pcapEvent{a}, []pcapEvent{a, x}, map[string]uint64{"tcp_probe": 5}, nil, true, false},
	} {
		d, s := diffSkipped(c.got, c.want, c.missedGot, c.missWant)
		if (d != "") != c.diff || (s != "") != c.skip {
			t.Errorf("got %v want %v, missed %v/%v: diff %q, skip %q", c.got, c.want, c.missedGot, c.missWant, d, s)
		}
	}
}
