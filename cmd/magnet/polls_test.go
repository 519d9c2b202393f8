// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// TestExportPolls records two iperf3 streams at once from one namespace to
// another over veth (GRO on the receiver's veth, so it receives through
// NAPI) with --groups default,irq,napi, and exports the polls table as a
// user would. The table and the report's receive path come from one walk:
// per connection, the table's packets over its polls are the report's
// packets, its polls the report's polls, those with another connection
// the report's shared polls. The polls are the napi_poll events magnet
// parse lists and the event table holds (time, CPU, fields), each
// delivering at most its work (GRO makes one packet of several the driver
// took). tcpdump on the receiver's veth is the witness of the
// connections' packets: a packet socket sees each packet as the stack
// receives it after GRO, as dev_recv does, so each connection's packets in
// and out of polls are what tcpdump captured from its peer, less the pure
// ACKs dev_recv leaves out (the listener's: the SYNs).
func TestExportPolls(t *testing.T) {
	needRoot(t)
	for _, tool := range []string{"iperf3", "tcpdump"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing on CI (scripts/deps.sh installs it)", tool)
			}
			t.Skipf("%s not installed", tool)
		}
	}
	lab := netlab.ForTest(t, netlab.Options{Name: "mgpolls", RateMbit: 100})
	if err := lab.Server.Do(func() error { return groOn(lab.Server.Iface) }); err != nil {
		t.Fatalf("GRO on %s: %v", lab.Server.Iface, err)
	}
	dir := t.TempDir()
	port := strconv.Itoa(47000 + os.Getpid()%10000)
	pcap := filepath.Join(dir, "wire.pcap")
	dump := lab.Command(lab.Server, "tcpdump", "-i", lab.Server.Iface, "-s", "128", "-B", "65536", "--immediate-mode", "-U",
		"-w", pcap, "-Q", "in", "tcp", "port", port)
	dumpErr, err := dump.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := dump.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dump.Process.Kill(); dump.Wait() })
	dumpSaid := bufio.NewScanner(dumpErr)
	for dumpSaid.Scan() && !strings.Contains(dumpSaid.Text(), "listening on") {
	}
	tr, ready := filepath.Join(dir, "rx.mgt"), filepath.Join(dir, "ready")
	rec := exec.Command(bin, "record", "-q", "-o", tr, "--netns", lab.Server.NS, "--groups", "default,irq,napi", "--ready-file", ready)
	rec.Stderr = os.Stderr
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Process.Kill(); rec.Wait() })
	waitFor(t, func() bool { _, err := os.Stat(ready); return err == nil })
	srv := lab.Command(lab.Server, "iperf3", "-s", "-1", "--forceflush", "-p", port)
	srvOut, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	srvSaid := bufio.NewScanner(srvOut)
	for srvSaid.Scan() && !strings.Contains(srvSaid.Text(), "Server listening") {
	}
	if out, err := lab.Command(lab.Client, "iperf3", "-c", lab.Server.Addr.String(), "-p", port, "-P", "2", "-n", "4M").CombinedOutput(); err != nil {
		t.Fatalf("iperf3: %v %s", err, out)
	}
	srv.Wait()
	// The client's last segments may still be in flight when both
	// iperf3s have exited (a closed socket sends what it holds): stop
	// recording only once no socket of the test's port is left but in
	// TIME_WAIT, so that the recording saw every frame tcpdump will.
	waitFor(t, func() bool {
		for _, h := range []netlab.Host{lab.Client, lab.Server} {
			out, err := lab.Command(h, "ss", "-Htan", "exclude", "time-wait", "( sport = :"+port+" or dport = :"+port+" )").Output()
			if err != nil || strings.TrimSpace(string(out)) != "" {
				return false
			}
		}
		return true
	})
	rec.Process.Signal(os.Interrupt)
	if err := rec.Wait(); err != nil {
		t.Fatalf("record: %v", err)
	}
	dump.Process.Signal(os.Interrupt)
	dump.Wait()

	out := filepath.Join(dir, "polls.csv")
	if r := magnet(t, "export", tr, "--table", "polls", "-f", "csv", "-o", out); r.code != 0 {
		t.Fatalf("export: %s", r.stderr)
	}
	rows := delimitedRows(t, out, ',')
	num := func(r map[string]any, col string) uint64 {
		s, _ := r[col].(string)
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("row %v: %s %q", r, col, s)
		}
		return n
	}
	type pollSum struct{ rows, conns, work, packets uint64 }
	polls := map[uint64]*pollSum{}
	type connSum struct{ packets, polls, shared uint64 }
	conns := map[uint64]*connSum{}
	for _, r := range rows {
		id := num(r, "poll_id")
		p := polls[id]
		if p == nil {
			p = &pollSum{conns: num(r, "conns"), work: num(r, "work")}
			polls[id] = p
		}
		p.rows++
		if _, ok := r["conn"]; !ok {
			if p.conns != 0 {
				t.Errorf("poll %d: a row without a connection, conns %d", id, p.conns)
			}
			continue
		}
		n := num(r, "packets")
		p.packets += n
		c := conns[num(r, "conn")]
		if c == nil {
			c = &connSum{}
			conns[num(r, "conn")] = c
		}
		c.packets += n
		c.polls++
		if p.conns > 1 {
			c.shared++
		}
	}
	for id, p := range polls {
		if want := max(p.conns, 1); p.rows != want {
			t.Errorf("poll %d: %d rows, conns %d", id, p.rows, p.conns)
		}
		if p.packets > p.work {
			t.Errorf("poll %d: delivered %d packets, took %d", id, p.packets, p.work)
		}
	}
	napi := strings.Count(magnet(t, "parse", "--types", "napi_poll", tr).stdout, "\tnapi_poll\t")
	if len(polls) != napi || napi == 0 {
		t.Errorf("%d polls in the table, %d napi_poll events in the trace", len(polls), napi)
	}
	// The polls are the event table's napi_poll rows: the same times,
	// CPUs, devices, work and budgets.
	evs := filepath.Join(dir, "napi.csv")
	if r := magnet(t, "export", tr, "--types", "napi_poll", "-f", "csv", "--no-conns", "-o", evs); r.code != 0 {
		t.Fatalf("export events: %s", r.stderr)
	}
	key := func(r map[string]any, at string) string {
		return fmt.Sprint(r[at], r["cpu"], r["dev"], r["work"], r["budget"])
	}
	events := map[string]int{}
	for _, r := range delimitedRows(t, evs, ',') {
		r["dev"] = r["dev_name"]
		events[key(r, "time_ns")]++
	}
	seen := map[uint64]bool{}
	for _, r := range rows {
		if id := num(r, "poll_id"); !seen[id] {
			seen[id] = true
			events[key(r, "poll_ns")]--
		}
	}
	for k, n := range events {
		if n != 0 {
			t.Errorf("napi_poll %s: %d more in the event table than in the polls table", k, n)
		}
	}

	// The report's receive path, from the same walk.
	r := magnet(t, "report", "--json", tr)
	if r.code != 0 {
		t.Fatalf("report: %s", r.stderr)
	}
	var rep struct {
		Lost        uint64 `json:"lost"`
		Connections []struct {
			Conn struct {
				ID     uint64 `json:"id"`
				Remote string `json:"remote"`
			} `json:"conn"`
		} `json:"connections"`
		ReceivePath []struct {
			Conns []struct {
				Conn, Packets, Polls uint64
				Shared               uint64 `json:"shared_polls"`
				Outside              uint64 `json:"outside_polls"`
			} `json:"connections"`
		} `json:"receive_path"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.ReceivePath) != 1 {
		t.Fatalf("%d receive paths", len(rep.ReceivePath))
	}
	remote := map[uint64]string{}
	for _, c := range rep.Connections {
		if ap, err := netip.ParseAddrPort(c.Conn.Remote); err == nil {
			remote[c.Conn.ID] = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()
		}
	}
	// A SYN goes to the listener (remote [::]:0 or 0.0.0.0:0), not to
	// the connection it makes.
	wire, syns := tcpdumpFrom(t, pcap, lab.Client.Addr.String())
	for id, r := range remote {
		if strings.HasSuffix(r, ":0") {
			wire[r] = syns
			t.Logf("connection %d is the listener: it received the %d SYNs", id, syns)
		}
	}
	// A frame the kernel ran no netif_receive_skb program for is missing
	// too: the recorder counts such skips against the interfaces' own
	// counters (kernel_skipped), which bound the shortfall.
	skipped := kernelSkipped(t, tr)
	var short uint64
	busy := 0
	for _, c := range rep.ReceivePath[0].Conns {
		got := conns[c.Conn]
		if got == nil {
			got = &connSum{}
		}
		if got.packets != c.Packets || got.polls != c.Polls || got.shared != c.Shared {
			t.Errorf("connection %d: the table has %d packets in %d polls, %d shared; the report %d in %d, %d shared",
				c.Conn, got.packets, got.polls, got.shared, c.Packets, c.Polls, c.Shared)
		}
		delete(conns, c.Conn)
		// A dev_recv the recorder lost (its ring full: counted) is
		// missing from both the table and the report.
		if w := wire[remote[c.Conn]]; c.Packets+c.Outside > w {
			t.Errorf("connection %d (from %s): %d packets in polls and %d outside; tcpdump captured %d", c.Conn, remote[c.Conn], c.Packets, c.Outside, w)
		} else if got := c.Packets + c.Outside; got < w {
			short += w - got
			t.Logf("connection %d (from %s): %d packets in polls and %d outside; tcpdump captured %d", c.Conn, remote[c.Conn], c.Packets, c.Outside, w)
		}
		if c.Packets >= 100 {
			busy++
		}
		t.Logf("connection %d from %s: %d packets in %d polls (%d shared with another connection), %d outside polls; tcpdump %d",
			c.Conn, remote[c.Conn], c.Packets, c.Polls, c.Shared, c.Outside, wire[remote[c.Conn]])
	}
	if short > 0 && rep.Lost == 0 && short > skipped {
		t.Errorf("%d frames tcpdump captured have no dev_recv; nothing lost, the kernel skipped %d device program runs", short, skipped)
	}
	for id := range conns {
		t.Errorf("connection %d is in the table, not in the report", id)
	}
	if busy < 2 {
		t.Errorf("%d connections took 100 packets or more: want iperf3's two streams", busy)
	}
	t.Logf("%d rows, %d polls (napi_poll events %d)", len(rows), len(polls), napi)

	// Every table format holds the CSV's rows.
	want := fmt.Sprint(rows)
	for _, f := range []string{"tsv", "jsonl", "parquet"} {
		got := tableRows(t, tr, "polls", f, filepath.Join(dir, "polls."+f))
		if fmt.Sprint(got) != want {
			t.Errorf("%s: %d rows differ from the csv's %d", f, len(got), len(rows))
		}
	}
}

// tcpdumpFrom counts the packets in a capture sent from addr, by the
// sender's address and port, but for SYNs, which it counts apart, and
// pure ACKs, which it leaves out as dev_recv does.
func tcpdumpFrom(t *testing.T, pcap, addr string) (map[string]uint64, uint64) {
	t.Helper()
	count := func(filter string) []string {
		out, err := exec.Command("tcpdump", "-r", pcap, "-n", "-q", "src host "+addr+" and "+filter).Output()
		if err != nil {
			t.Fatalf("tcpdump -r: %v", err)
		}
		return strings.Split(strings.TrimSpace(string(out)), "\n")
	}
	n := map[string]uint64{}
	// dev_recv leaves pure ACKs out (no payload, none of SYN, FIN, RST)
	// unless the acks group is on.
	for _, line := range count("tcp[tcpflags] & tcp-syn == 0 and (tcp[tcpflags] & (tcp-fin|tcp-rst) != 0 or ip[2:2] - ((ip[0] & 0xf) << 2) - ((tcp[12] & 0xf0) >> 2) > 0)") {
		// 15:04:05.000000 IP 10.200.0.1.40000 > 10.200.0.2.5201: tcp 1448
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		i := strings.LastIndexByte(f[2], '.')
		n[f[2][:i]+":"+f[2][i+1:]]++
	}
	syns := 0
	for _, line := range count("tcp[tcpflags] & tcp-syn != 0") {
		if line != "" {
			syns++
		}
	}
	return n, uint64(syns)
}

// kernelSkipped reads the trace's count of device program runs the kernel
// did not make (the recorder's comparison with the interfaces' counters).
func kernelSkipped(t *testing.T, path string) uint64 {
	t.Helper()
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for {
		if _, err := r.Next(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if s := r.Summary(); s != nil && s.KernelSkipped != nil {
		return *s.KernelSkipped
	}
	t.Fatal("the trace has no kernel_skipped count")
	return 0
}
