// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
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

// pathIperf3Send sends n bytes from the path's sender to the receiver's
// iperf3 server and returns what iperf3 says it sent and retransmitted.
func pathIperf3Send(t *testing.T, p *netlab.Path, port int, n string) (sent, retrans uint64) {
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
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("iperf3 client output: %v\n%s", err, out)
	}
	return res.End.SumSent.Bytes, res.End.SumSent.Retransmits
}

// nstatCounter reads one of the kernel's SNMP counters in h's namespace,
// absolute (the namespace is the test's own, so that is its traffic's).
func nstatCounter(t *testing.T, p *netlab.Path, h netlab.Host, name string) uint64 {
	t.Helper()
	out, err := p.Command(h, "nstat", "-a", "-z", "-s", name).Output()
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
	netns        uint32
	lport, rport uint64
	records      int
	sum          map[string]uint64 // conn_summary fields added up
	closed       bool
	totalRetrans uint64 // conn_close's
	lastEnd      uint64 // the previous record's time
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
			samples, _ := rec.Uint("rtt_samples")
			segs, _ := rec.Uint("tcp_rcv_skbs")
			if rtt != samples || cwnd != samples || samples > segs {
				t.Errorf("conn %d: conn_summary at %d: rtt_hist %d, cwnd_hist %d, rtt_samples %d, tcp_rcv_skbs %d: want the histograms to count the samples, at most one per segment received", rec.Conn(), rec.Time(), rtt, cwnd, samples, segs)
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
// compute: the application's byte count, the kernel's retransmission
// counts (nstat TcpRetransSegs of the sender's namespace, and each
// connection's tcpi_total_retrans at close, which conn_close reads).
func TestSummaryTruth(t *testing.T) {
	needRoot(t)
	needTools(t, "iperf3", "nstat", "ss")
	p := lossyPath(t)
	port := uniquePort()
	needTools(t, "tcpdump", "tshark")
	pathIperf3Server(t, p, port)
	capt := startCaptureWith(t, p.Command, p.Sender, "tcp port "+strconv.Itoa(port))
	rec := startRecording(t, record.Config{Summary: 200 * time.Millisecond, Filters: record.Filters{Port: port}})
	sent, appRetrans := pathIperf3Send(t, p, port, "24M")
	pathQuiet(t, p, port)
	res := rec.stop(t)
	frames := capt.stop(t)
	if res.Lost != 0 {
		t.Errorf("lost %d (%v)", res.Lost, res.LostBy)
	}
	conns := readSummaries(t, rec.path)

	var data *summaryConn
	var retrans, closeRetrans uint64
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
	if data.sum["tcp_xmit_bytes"] < data.sum["sock_send_bytes"] {
		t.Errorf("tcp_xmit_bytes %d below sock_send_bytes %d", data.sum["tcp_xmit_bytes"], data.sum["sock_send_bytes"])
	}
	want := nstatCounter(t, p, p.Sender, "TcpRetransSegs")
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
	// what a program there could see.
	bt := startBpftraceCounts(t, fmt.Sprintf(`tracepoint:skb:kfree_skb /args->reason == %d/ {
  $s = (struct sk_buff *)args->skbaddr;
  if ($s->dev != 0 && $s->dev->nd_net.net->ns.inum == %d) { @qdisc = count(); } }
`, qdiscDropReason(t), lab.Client.NetNSInode))
	rec := startRecording(t, record.Config{Summary: 200 * time.Millisecond, Filters: record.Filters{Port: port}})
	iperf3Client(t, lab, lab.Client, lab.Server.Addr, port, "-n", "20M")
	waitClosed(t, lab, port)
	res := rec.stop(t)
	seen := bt.stop(t)["qdisc"]
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

// qdiscDropReason is SKB_DROP_REASON_QDISC_DROP's value on this kernel.
func qdiscDropReason(t *testing.T) int {
	t.Helper()
	out, err := exec.Command("bpftool", "btf", "dump", "file", "/sys/kernel/btf/vmlinux", "format", "c").Output()
	if err != nil {
		t.Skipf("bpftool: %v", err)
	}
	m := regexp.MustCompile(`\bSKB_DROP_REASON_QDISC_DROP = (\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatal("no SKB_DROP_REASON_QDISC_DROP in the kernel's BTF")
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}
