// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/internal/witness"
)

// lossyPath is a routed path whose bottleneck (200 Mbit/s, a 32 KiB queue)
// drops a bulk TCP flow's packets in the router: real losses, which the
// sender retransmits, unlike drops in its own qdisc, which TCP learns of
// at once and sends again unmarked.
func lossyPath(t *testing.T) *netlab.Path {
	t.Helper()
	return netlab.PathForTest(t, netlab.PathOptions{BottleneckMbit: 200, QueueBytes: 32 << 10})
}

// pathIperf3Server starts `iperf3 -s -1` in the path's receiver and returns
// once it listens.
func pathIperf3Server(t *testing.T, p *netlab.Path, port int) *exec.Cmd {
	t.Helper()
	return startIperf3Server(t, p.Command(p.Receiver, "iperf3", "-s", "-1", "--forceflush", "-p", strconv.Itoa(port)))
}

// iperf3Result is what an iperf3 client says of its transfer: the bytes
// it wrote and retransmitted, and the bytes the server says it read.
type iperf3Result struct {
	sent, retrans, received uint64
}

// pathIperf3Send sends n bytes from the path's sender to the receiver's
// iperf3 server and returns what iperf3 says of the transfer.
func pathIperf3Send(t *testing.T, p *netlab.Path, port int, n string) iperf3Result {
	t.Helper()
	out, err := p.Command(p.Sender, "iperf3", "-c", p.Receiver.Addr.String(), "-p", strconv.Itoa(port), "-n", n, "-J").Output()
	if err != nil {
		t.Fatalf("iperf3 client: %v\n%s", err, out)
	}
	var res struct {
		End struct {
			SumSent struct {
				Bytes       uint64 `json:"bytes"`
				Retransmits uint64 `json:"retransmits"`
			} `json:"sum_sent"`
			SumReceived struct {
				Bytes uint64 `json:"bytes"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("iperf3 client output: %v\n%s", err, out)
	}
	return iperf3Result{res.End.SumSent.Bytes, res.End.SumSent.Retransmits, res.End.SumReceived.Bytes}
}

// nstatCounter reads one of the kernel's SNMP counters in h's namespace,
// absolute (the namespace is the test's own, so that is its traffic's).
func nstatCounter(t *testing.T, command func(h netlab.Host, name string, args ...string) *exec.Cmd, h netlab.Host, name string) uint64 {
	t.Helper()
	out, err := command(h, "nstat", "-a", "-z", "-s", name).Output()
	if err != nil {
		t.Fatalf("nstat: %v", err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == name {
			n, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatalf("nstat line %q: %v", l, err)
			}
			return n
		}
	}
	t.Fatalf("nstat has no %s:\n%s", name, out)
	return 0
}

// pathQuiet waits until no socket of port in the path's end hosts is still
// exchanging packets (each is gone or in TIME-WAIT).
func pathQuiet(t *testing.T, p *netlab.Path, port int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		busy := ""
		for _, h := range []netlab.Host{p.Sender, p.Receiver} {
			out, err := p.Command(h, "ss", "-Htan").Output()
			if err != nil {
				t.Fatalf("ss: %v", err)
			}
			for _, l := range strings.Split(string(out), "\n") {
				f := strings.Fields(l)
				if len(f) < 5 || f[0] == "TIME-WAIT" || f[0] == "LISTEN" {
					continue
				}
				if strings.HasSuffix(f[3], ":"+strconv.Itoa(port)) || strings.HasSuffix(f[4], ":"+strconv.Itoa(port)) {
					busy = l
				}
			}
		}
		if busy == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a socket of port %d stays open: %s", port, busy)
		}
		// ss cannot wait for a state change; the kernel reaches it within
		// a few round trips.
		time.Sleep(20 * time.Millisecond)
	}
}

// summaryConn is what a summary trace says of one connection.
type summaryConn struct {
	netns         uint32
	lport, rport  uint64
	records       int
	sum           map[string]uint64 // conn_summary fields added up
	closed        bool
	totalRetrans  uint64 // conn_close's
	closeReceived uint64 // conn_close's bytes_received
	lastEnd       uint64 // the previous record's time
}

// readSummaries reads a summary trace's connections, checking on the way
// what holds for every conn_summary record: its histograms count its
// samples, and its interval starts where the connection's previous one
// ended.
func readSummaries(t *testing.T, path string) map[uint64]*summaryConn {
	t.Helper()
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, ok := r.Header().Extra["summary_interval_ns"]; !ok {
		t.Errorf("header has no summary_interval_ns: %v", r.Header().Extra)
	}
	conns := map[uint64]*summaryConn{}
	of := func(id uint64) *summaryConn {
		c := conns[id]
		if c == nil {
			c = &summaryConn{sum: map[string]uint64{}}
			conns[id] = c
		}
		return c
	}
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch rec.Type.Name {
		case "conn_open":
			c := of(rec.Conn())
			c.netns = rec.NetNS()
			c.lport, _ = rec.Uint("lport")
			c.rport, _ = rec.Uint("rport")
		case "conn_close":
			c := of(rec.Conn())
			c.closed = true
			c.totalRetrans, _ = rec.Uint("total_retrans")
			c.closeReceived, _ = rec.Uint("bytes_received")
		case "conn_summary":
			c := of(rec.Conn())
			c.records++
			var rtt, cwnd uint64
			for _, f := range rec.Type.Fields {
				v, _ := rec.FieldUint(f)
				c.sum[f.Name] += v
				if strings.HasPrefix(f.Name, "rtt_hist_") {
					rtt += v
				}
				if strings.HasPrefix(f.Name, "cwnd_hist_") {
					cwnd += v
				}
			}
			// One sample per read of the socket that found segments
			// exchanged since the previous: the interval's, and the
			// release's and the close's when they fell in the interval.
			samples, _ := rec.Uint("rtt_samples")
			if rtt != samples || cwnd != samples || samples > 3 {
				t.Errorf("conn %d: conn_summary at %d: rtt_hist %d, cwnd_hist %d, rtt_samples %d: want the histograms to count the samples, at most three (the interval's read, the release's and the close's)", rec.Conn(), rec.Time(), rtt, cwnd, samples)
			}
			start, _ := rec.Uint("start_ns")
			if c.lastEnd != 0 && start < c.lastEnd || start >= rec.Time() {
				t.Errorf("conn %d: conn_summary [%d, %d] after one ending at %d", rec.Conn(), start, rec.Time(), c.lastEnd)
			}
			c.lastEnd = rec.Time()
		case "tcp_xmit", "tcp_rcv", "sock_send", "sock_recv", "ip_send", "ip_recv", "dev_xmit", "dev_recv", "tcp_state":
			t.Errorf("a %s event in a summary trace", rec.Type.Name)
		}
	}
	return conns
}

// TestSummaryTruth records an iperf3 transfer across a lossy bottleneck in
// summary mode and holds the figures against what magnet does not
// compute: the application's byte count at both ends, the kernel's
// retransmission counts (nstat TcpRetransSegs of the sender's namespace,
// and each connection's tcpi_total_retrans at close, which conn_close
// reads), and the TCP payload tcpdump sees leave the sender. The sock and
// tcp figures are read from the sockets (at intervals and at close), the
// device's counted per packet (dev, asked for: not in the default).
func TestSummaryTruth(t *testing.T) {
	needRoot(t)
	needTools(t, "iperf3", "nstat", "ss")
	p := lossyPath(t)
	port := uniquePort()
	needTools(t, "tcpdump", "tshark")
	pathIperf3Server(t, p, port)
	capt := startCaptureWith(t, p.Command, p.Sender, "tcp port "+strconv.Itoa(port))
	rec := startRecording(t, record.Config{Summary: 200 * time.Millisecond, Groups: record.DefaultSummaryGroups | event.GroupDev, Filters: record.Filters{Port: port}})
	res3 := pathIperf3Send(t, p, port, "24M")
	sent, appRetrans := res3.sent, res3.retrans
	pathQuiet(t, p, port)
	res := rec.stop(t)
	frames := capt.stop(t)
	if res.Lost != 0 {
		t.Errorf("lost %d (%v)", res.Lost, res.LostBy)
	}
	conns := readSummaries(t, rec.path)

	var data, recv *summaryConn
	var retrans, closeRetrans uint64
	for _, c := range conns {
		if c.netns == p.Receiver.NetNSInode && (recv == nil || c.sum["sock_recv_bytes"] > recv.sum["sock_recv_bytes"]) {
			recv = c
		}
	}
	for id, c := range conns {
		if c.netns != p.Sender.NetNSInode {
			continue
		}
		if c.records == 0 && c.sum["sock_send_bytes"] == 0 {
			continue
		}
		if !c.closed {
			t.Errorf("sender's conn %d (port %d) has no conn_close", id, c.lport)
		}
		retrans += c.sum["retrans_segs"]
		closeRetrans += c.totalRetrans
		if data == nil || c.sum["sock_send_bytes"] > data.sum["sock_send_bytes"] {
			data = c
		}
	}
	if data == nil {
		t.Fatalf("no sender connection in the trace: %+v", conns)
	}
	// iperf3 writes a 37-byte cookie on each stream before the data it
	// counts.
	if got, want := data.sum["sock_send_bytes"], sent+37; got != want {
		t.Errorf("data connection's sock_send_bytes %d, iperf3 sent %d + 37", got, sent)
	}
	var payload uint64
	for _, f := range frames {
		if f.src.Port() == uint16(data.lport) && f.dst.Port() == uint16(data.rport) {
			payload += uint64(f.payload)
		}
	}
	if got := data.sum["tcp_xmit_bytes"]; got != payload {
		t.Errorf("data connection's tcp_xmit_bytes %d; tcpdump saw %d bytes of TCP payload leave the sender", got, payload)
	}
	// What the receiving application read, as its iperf3 server counts
	// it (the cookie aside). iperf3 ends a test by closing its data
	// streams with what is still in flight (a reset), so that is less
	// than what was written; the kernel's bytes_received at the close
	// (conn_close) covers that tail too, and the summary's last read of
	// the socket is at that close.
	if recv == nil {
		t.Fatal("no receiver connection in the trace")
	}
	if got, want := recv.sum["sock_recv_bytes"], res3.received+37; got != want {
		t.Errorf("receiver's sock_recv_bytes %d, iperf3's server read %d + 37", got, res3.received)
	}
	if got, want := recv.sum["tcp_rcv_bytes"], recv.closeReceived; got != want || got < recv.sum["sock_recv_bytes"] {
		t.Errorf("receiver's tcp_rcv_bytes %d, its conn_close bytes_received %d, sock_recv_bytes %d", got, want, recv.sum["sock_recv_bytes"])
	}
	want := nstatCounter(t, p.Command, p.Sender, "TcpRetransSegs")
	if want == 0 {
		t.Fatalf("no retransmission in the sender's namespace (iperf3: %d): the bottleneck did not drop, nothing to check", appRetrans)
	}
	if retrans != want {
		t.Errorf("retrans_segs over the sender's connections %d, nstat TcpRetransSegs %d", retrans, want)
	}
	if closeRetrans != want {
		t.Errorf("conn_close total_retrans over the sender's connections %d, nstat TcpRetransSegs %d", closeRetrans, want)
	}
	// The device layer of the sender's connections: the frames of each
	// one's tuple leaving the sender's veth, as tcpdump saw them there
	// (the tap runs in the same xmit call as net_dev_start_xmit: the same
	// skbs, GSO packets whole). Exact, but for an open defect of every
	// mode (docs/EVENTS.md, "under load, runs of 1-5 frames have no
	// device event": the program did not run for them, and the kernel
	// counted no skipped run). On the loaded development VM that was 2
	// to 44 frames of ~2,500 in a transfer; a shortfall up to 5 % is
	// logged as that defect, and more, or any frame too many, fails.
	for id, c := range conns {
		if c.netns != p.Sender.NetNSInode || c.records == 0 {
			continue
		}
		var n, b uint64
		for _, f := range frames {
			if f.src.Port() == uint16(c.lport) && f.dst.Port() == uint16(c.rport) {
				n++
				b += uint64(f.len)
			}
		}
		got, gotB := c.sum["dev_xmit_skbs"], c.sum["dev_xmit_bytes"]
		switch {
		case got == n && gotB == b:
		case got < n && gotB < b && (n-got)*20 <= n:
			t.Logf("open defect (device runs missing under load): conn %d (port %d): dev_xmit %d skbs, %d bytes; tcpdump: %d frames, %d bytes", id, c.lport, got, gotB, n, b)
		default:
			t.Errorf("conn %d (port %d): dev_xmit %d skbs, %d bytes; tcpdump: %d frames, %d bytes", id, c.lport, got, gotB, n, b)
		}
	}
	// What a user reads: magnet report's summary table, as JSON.
	var rep struct {
		Summaries []struct {
			NetNS   uint32            `json:"netns"`
			Figures map[string]uint64 `json:"figures"`
		} `json:"summary_connections"`
	}
	out, err := exec.Command(magnetBin, "report", "--json", rec.path).Output()
	if err != nil {
		t.Fatalf("magnet report: %v", err)
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("magnet report --json: %v\n%s", err, out)
	}
	var reported uint64
	for _, c := range rep.Summaries {
		if c.NetNS == p.Sender.NetNSInode {
			reported += c.Figures["retrans_segs"]
		}
	}
	if reported != want {
		t.Errorf("magnet report's retrans_segs over the sender's connections %d, nstat %d", reported, want)
	}
	if data.records < 2 {
		t.Errorf("the data connection has %d conn_summary records; a transfer of a second at 200 ms intervals should have several", data.records)
	}
	t.Logf("sent %d; data conn: %d records, %v", sent, data.records, fmt.Sprint(data.sum["sock_send_bytes"], " sock bytes, ", data.sum["retrans_segs"], " retrans segs, ", data.sum["rtt_samples"], " rtt samples"))
	t.Logf("retransmitted segments: nstat %d, summary %d, conn_close %d, iperf3 %d; trace %d bytes; events %v; missed runs %v", want, retrans, closeRetrans, appRetrans, res.Bytes, res.Events, res.MissedBy)
}

// qdiscDrops reads tc -s's drop count of h's root qdisc.
func qdiscDrops(t *testing.T, lab *netlab.Lab, h netlab.Host) uint64 {
	t.Helper()
	out, err := lab.Command(h, "tc", "-s", "-j", "qdisc", "show", "dev", h.Iface, "root").Output()
	if err != nil {
		t.Fatalf("tc -s qdisc: %v", err)
	}
	var qs []struct {
		Drops uint64 `json:"drops"`
	}
	if err := json.Unmarshal(out, &qs); err != nil || len(qs) == 0 {
		t.Fatalf("tc -s -j qdisc show: %v\n%s", err, out)
	}
	return qs[0].Drops
}

// TestSummaryQdiscDrops: a sender whose own tbf queue is short (100 kB)
// drops in its qdisc; every such drop frees an skb at the device with
// reason QDISC_DROP, of its socket or, for the ACKs and resets the
// kernel's TCP control socket sends once the connection has closed, of
// that control socket, found by address. So drop_dev_packets over the
// sender's connections in summary mode is tc -s's count of the qdisc's
// drops, exactly, and each of them loses data (drop_lost_packets; the
// other drops of the connections, at teardown, do not).
func TestSummaryQdiscDrops(t *testing.T) {
	needRoot(t)
	needTools(t, "iperf3", "tc")
	lab := netlab.ForTest(t, netlab.Options{RateMbit: 100})
	if out, err := exec.Command("tc", "-n", lab.Client.NS, "qdisc", "replace", "dev", lab.Client.Iface, "root", "tbf",
		"rate", "100mbit", "burst", "65536", "limit", "100000").CombinedOutput(); err != nil {
		t.Fatalf("tc: %v\n%s", err, out)
	}
	port := uniquePort()
	iperf3Server(t, lab, lab.Server, port)
	drops0 := qdiscDrops(t, lab, lab.Client)
	// The kernel now and then runs no program of kfree_skb for a drop
	// (docs/EVENTS.md, Loss accounting): bpftrace on it is the witness of
	// what a program there could see. Only the port's drops count: the
	// namespace's own IPv6 packets (router solicitations, MLD reports of
	// a new interface) meet the same full queue now and then (one run in
	// about 40), and are no connection's.
	bt := witness.Start(t, witness.Options{NetNS: []uint32{lab.Client.NetNSInode}, Port: port, Drops: true})
	rec := startRecording(t, record.Config{Summary: 200 * time.Millisecond, Filters: record.Filters{Port: port}})
	iperf3Client(t, lab, lab.Client, lab.Server.Addr, port, "-n", "20M")
	waitClosed(t, lab, port)
	res := rec.stop(t)
	wit := bt.Stop(t)
	seen := wit.DropsOf(lab.Client.NetNSInode, 0, "QDISC_DROP", port)
	if other := wit.DropsOf(lab.Client.NetNSInode, 0, "QDISC_DROP", 0) - seen; other > 0 {
		t.Logf("the qdisc also dropped %d packets of no connection", other)
	}
	want := qdiscDrops(t, lab, lab.Client) - drops0
	if want == 0 {
		t.Fatal("the sender's qdisc dropped nothing: nothing to check")
	}
	var got, lost, all uint64
	for _, c := range readSummaries(t, rec.path) {
		if c.netns == lab.Client.NetNSInode {
			got += c.sum["drop_dev_packets"]
			lost += c.sum["drop_lost_packets"]
			all += c.sum["drop_packets"]
		}
	}
	if lost < got || all < lost {
		t.Errorf("drops over the sender's connections: %d in all, %d losing data, %d at a device; want all ≥ losing data ≥ at a device (qdisc drops lose data)", all, lost, got)
	}
	// bpftrace's program is a perf one, which the kernel also skips
	// while another such program runs on the CPU: it may see fewer than
	// magnet, never more.
	if got < uint64(seen) || got > want {
		t.Errorf("drop_dev_packets over the sender's connections %d; bpftrace on kfree_skb saw %d QDISC_DROP in the sender's netns; tc -s qdisc: %d dropped; lost %d; missed runs %v; unrecorded %v", got, seen, want, res.Lost, res.MissedBy, res.Unrecorded)
	}
	if uint64(seen) < want {
		t.Logf("the kernel ran no program of kfree_skb for %d of the qdisc's %d drops (bpftrace on it saw %d, magnet %d)", want-uint64(seen), want, seen, got)
	}
	t.Logf("qdisc drops: tc %d, summary %d at a device, %d losing data, %d in all; lost %d; missed runs %v", want, got, lost, all, res.Lost, res.MissedBy)
}

// TestSummaryShortConnections: connections that open and close between
// two reads of the sockets (the interval is longer than the test) are
// counted in full by the read at their close. Each of 24 clients writes a
// request of its own size, half-closes, reads the server's reply to the
// end and closes; the server reads to the end, replies and closes. Each
// side's bytes in summary mode are what the applications counted, the
// FINs read as end of stream not counted as data (the clients read their
// replies after TCP_CLOSE: the server's FIN moved them to TIME_WAIT), and
// each connection has one record, whose srtt samples are the release's
// and the close's.
func TestSummaryShortConnections(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{})
	// Nothing is lost on the veth, so each side's TCP bytes are its
	// application's, with no retransmission: unless an ACK comes later
	// than the loss probe's timeout (two round trips, ~10 ms here), which
	// a loaded host does now and then (CI: one 1448-byte probe in 24
	// connections). Loss probes off (tcp_early_retrans 0), a re-send needs
	// the retransmission timer (200 ms at least).
	for _, h := range []netlab.Host{lab.Client, lab.Server} {
		run(t, lab.Command(h, "sysctl", "-qw", "net.ipv4.tcp_early_retrans=0"))
	}
	ln, port := listenOnServer(t, lab)
	const conns = 24
	var served sync.WaitGroup
	var serverRead, serverWrote atomic.Int64
	served.Add(conns)
	go func() {
		for range conns {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer served.Done()
				defer c.Close()
				n, _ := io.Copy(io.Discard, c)
				serverRead.Add(n)
				reply := make([]byte, 1000+n/3)
				m, _ := c.Write(reply)
				serverWrote.Add(int64(m))
			}()
		}
	}()

	rec := startRecording(t, record.Config{Summary: time.Minute, Filters: record.Filters{Port: port}})
	var clientWrote, clientRead int64
	for i := range conns {
		c := dialServer(t, lab, port)
		n, err := c.Write(make([]byte, 1+i*7919))
		clientWrote += int64(n)
		if err != nil {
			t.Fatal(err)
		}
		c.(*net.TCPConn).CloseWrite()
		m, err := io.Copy(io.Discard, c)
		clientRead += m
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	served.Wait()
	waitClosed(t, lab, port)
	res := rec.stop(t)
	if res.Lost != 0 {
		t.Errorf("lost %d (%v)", res.Lost, res.LostBy)
	}
	if serverRead.Load() != clientWrote || serverWrote.Load() != clientRead {
		t.Fatalf("the applications disagree: clients wrote %d, the server read %d; it wrote %d, the clients read %d", clientWrote, serverRead.Load(), serverWrote.Load(), clientRead)
	}
	type side struct{ conns, sent, recvd int64 }
	var cl, sv side
	for id, c := range readSummaries(t, rec.path) {
		var s *side
		switch {
		case c.netns == lab.Client.NetNSInode && c.rport == uint64(port):
			s = &cl
		case c.netns == lab.Server.NetNSInode && c.lport == uint64(port) && c.rport != 0:
			s = &sv
		default:
			continue
		}
		s.conns++
		s.sent += int64(c.sum["sock_send_bytes"])
		s.recvd += int64(c.sum["sock_recv_bytes"])
		// Read at its release and at its close, whichever comes
		// first finding segments exchanged, and no interval between.
		if n := c.sum["rtt_samples"]; !c.closed || c.records != 1 || n < 1 || n > 2 {
			t.Errorf("conn %d (ports %d-%d): closed %v, %d records, %d srtt samples; want one record, with the release's and the close's samples", id, c.lport, c.rport, c.closed, c.records, n)
		}
		if c.sum["tcp_xmit_bytes"] != c.sum["sock_send_bytes"] || c.sum["tcp_rcv_bytes"] != c.sum["sock_recv_bytes"] || c.sum["retrans_segs"] != 0 {
			t.Errorf("conn %d: tcp sent %d, received %d, retransmitted %d segments; the application wrote %d and read %d (nothing lost on the veth)", id, c.sum["tcp_xmit_bytes"], c.sum["tcp_rcv_bytes"], c.sum["retrans_segs"], c.sum["sock_send_bytes"], c.sum["sock_recv_bytes"])
		}
	}
	if cl.conns != conns || sv.conns != conns {
		t.Errorf("%d client and %d server connections in the trace, want %d each", cl.conns, sv.conns, conns)
	}
	if cl.sent != clientWrote || sv.recvd != clientWrote || sv.sent != clientRead || cl.recvd != clientRead {
		t.Errorf("clients sent %d, read %d; server read %d, sent %d; the applications: requests %d bytes, replies %d", cl.sent, cl.recvd, sv.recvd, sv.sent, clientWrote, clientRead)
	}
	t.Logf("%d connections: requests %d bytes, replies %d", conns, clientWrote, clientRead)
}

// TestSummaryEstablishedBefore: a connection established, and moving
// data, before the recording starts is found at the start (no state change
// announces it) and its figures count from there: what the client writes
// and the server reads after the start, as the applications count it, and
// TCP's bytes the same (nothing is lost on the veth).
func TestSummaryEstablishedBefore(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{})
	ln, port := listenOnServer(t, lab)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	c := dialServer(t, lab, port)
	defer c.Close()
	s, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	defer s.Close()
	// Before: 300,000 bytes written and read.
	const before, after = 300000, 1234567
	go c.Write(make([]byte, before))
	if _, err := io.ReadFull(s, make([]byte, before)); err != nil {
		t.Fatal(err)
	}

	rec := startRecording(t, record.Config{Summary: 200 * time.Millisecond, Filters: record.Filters{Port: port}})
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, after))
		c.Close()
		wrote <- err
	}()
	n, err := io.Copy(io.Discard, s)
	if err != nil || n != after {
		t.Fatalf("the server read %d bytes after the start (%v), want %d", n, err, after)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	s.Close()
	waitClosed(t, lab, port)
	res := rec.stop(t)
	if res.Lost != 0 {
		t.Errorf("lost %d (%v)", res.Lost, res.LostBy)
	}
	var client, server *summaryConn
	for _, x := range readSummaries(t, rec.path) {
		switch {
		case x.netns == lab.Client.NetNSInode && x.rport == uint64(port):
			client = x
		case x.netns == lab.Server.NetNSInode && x.lport == uint64(port) && x.rport != 0:
			server = x
		}
	}
	if client == nil || server == nil {
		t.Fatalf("client %v, server %v: want both connections in the trace", client, server)
	}
	for _, x := range []struct {
		who  string
		c    *summaryConn
		name string
	}{
		{"client", client, "sock_send_bytes"}, {"client", client, "tcp_xmit_bytes"},
		{"server", server, "sock_recv_bytes"}, {"server", server, "tcp_rcv_bytes"},
	} {
		if got := x.c.sum[x.name]; got != after {
			t.Errorf("%s's %s %d, want the %d bytes moved after the start", x.who, x.name, got, after)
		}
		if !x.c.closed {
			t.Errorf("%s has no conn_close", x.who)
		}
	}
	t.Logf("client: %d records, %v; server: %d records", client.records, client.sum["sock_send_bytes"], server.records)
}

// TestSummaryBesideFullRecording: another recorder on the host that
// records tcp asks sockops for every segment of every socket, and every
// sockops program attached then runs for them, the summary recorder's
// included: that one must still write no tcp_xmit, and its figures stay
// what the applications counted.
func TestSummaryBesideFullRecording(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{})
	ln, port := listenOnServer(t, lab)
	read := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(read)
			return
		}
		n, _ := io.Copy(io.Discard, c)
		c.Close()
		read <- n
	}()
	full := startRecording(t, record.Config{Groups: event.GroupTCP | event.GroupConn, Filters: record.Filters{Port: port}})
	sum := startRecording(t, record.Config{Summary: 200 * time.Millisecond, Filters: record.Filters{Port: port}})
	const size = 2000000
	c := dialServer(t, lab, port)
	n, err := c.Write(make([]byte, size))
	c.Close()
	if err != nil || n != size {
		t.Fatalf("wrote %d: %v", n, err)
	}
	if got := <-read; got != size {
		t.Fatalf("the server read %d bytes, want %d", got, size)
	}
	waitClosed(t, lab, port)
	sum.stop(t)
	res := full.stop(t)
	if res.Events["tcp_xmit"] == 0 {
		t.Fatalf("the full recording has no tcp_xmit (%v): the socket was not flagged, nothing to check", res.Events)
	}
	// TCP's bytes are the application's plus its retransmissions: none
	// on a veth that loses nothing, unless a loaded host answers later
	// than the loss probe's timeout (CI did once: 50,296 bytes). The
	// retransmissions must then be the kernel's own count (nstat).
	var sent, xmit, rbytes, rsegs uint64
	for _, x := range readSummaries(t, sum.path) {
		if x.netns == lab.Client.NetNSInode && x.rport == uint64(port) {
			sent += x.sum["sock_send_bytes"]
			xmit += x.sum["tcp_xmit_bytes"]
			rbytes += x.sum["retrans_bytes"]
			rsegs += x.sum["retrans_segs"]
		}
	}
	if sent != size || xmit != size+rbytes {
		t.Errorf("client's sock_send_bytes %d, tcp_xmit_bytes %d, retrans_bytes %d; it wrote %d", sent, xmit, rbytes, size)
	}
	if want := nstatCounter(t, lab.Command, lab.Client, "TcpRetransSegs"); rsegs != want {
		t.Errorf("client's retrans_segs %d, nstat TcpRetransSegs %d", rsegs, want)
	}
}

// listenOnServer listens on a TCP port the kernel picks in the lab's server
// namespace, closed with the test.
func listenOnServer(t *testing.T, lab *netlab.Lab) (net.Listener, int) {
	t.Helper()
	var ln net.Listener
	if err := lab.Server.Do(func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(lab.Server.Addr, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, ln.Addr().(*net.TCPAddr).Port
}

// dialServer connects from the lab's client namespace to port on its
// server.
func dialServer(t *testing.T, lab *netlab.Lab, port int) net.Conn {
	t.Helper()
	var c net.Conn
	if err := lab.Client.Do(func() (err error) {
		c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(lab.Server.Addr, uint16(port)).String(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return c
}
