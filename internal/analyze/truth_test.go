// SPDX-License-Identifier: Apache-2.0

package analyze_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/internal/witness"
)

// These tests record real transfers between network namespaces and compare
// the report with what the kernel and the applications say on their own.
// The workloads run as separate processes (the magnet binary's workload
// command), because the recorder never traces its own process.
var magnetBin string

func TestMain(m *testing.M) {
	code := func() int {
		// A helper process of the verdict tests (the test binary re-run
		// as a sender or receiver) records nothing: no binary to build.
		if os.Geteuid() == 0 && os.Getenv("MAGNET_VERDICT_ROLE") == "" {
			dir, err := os.MkdirTemp("", "magnet-analyze-bin-")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer os.RemoveAll(dir)
			magnetBin = filepath.Join(dir, "magnet")
			out, err := exec.Command("go", "build", "-o", magnetBin, "../../cmd/magnet").CombinedOutput()
			if err != nil {
				fmt.Fprintf(os.Stderr, "build magnet: %v\n%s", err, out)
				return 1
			}
		}
		return m.Run()
	}()
	os.Exit(code)
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("recording needs root (CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN)")
	}
}

// needTools skips the test when a tool it takes the truth from is missing,
// and fails it on CI, where scripts/deps.sh installs them.
func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing on CI (scripts/deps.sh installs it)", tool)
			}
			t.Skipf("%s not installed (scripts/deps.sh installs it)", tool)
		}
	}
}

// recordDuring records the port's traffic while fn runs and returns the
// trace's path.
func recordDuring(t *testing.T, port int, groups event.Group, fn func()) string {
	t.Helper()
	return recordDuringAt(t, port, groups, "", fn)
}

// recordDuringAt is recordDuring with tcp_xmit read at the device or not
// (record.Config.XmitAtDevice).
func recordDuringAt(t *testing.T, port int, groups event.Group, xmitAt string, fn func()) string {
	t.Helper()
	cfg := record.Config{Output: filepath.Join(t.TempDir(), "trace.mgt"), StatusDir: t.TempDir(),
		Filters: record.Filters{Port: port}, Groups: groups, XmitAtDevice: xmitAt == "device"}
	if xmitAt == "sockops" {
		// Where IP egress cannot be had, sockops' per-segment callback
		// serves tcp_xmit.
		cfg.DisableHooks = []string{"ip_egress"}
	}
	ready := make(chan struct{})
	cfg.Ready = func() { close(ready) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := record.Run(ctx, cfg)
		done <- err
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("recorder ended before it was ready: %v", err)
	}
	fn()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("record: %v", err)
	}
	return cfg.Output
}

// command runs a program in a host's namespace (netlab's Lab.Command or
// Path.Command).
type command func(h netlab.Host, name string, args ...string) *exec.Cmd

// transfer sends count messages of size bytes from snd to rcv, back to
// back, and returns the bytes the receiver read.
func transfer(t *testing.T, cmd command, snd, rcv netlab.Host, port, count, size int) int64 {
	t.Helper()
	return workloadTransfer(t, cmd, snd, rcv, "tcp", port, count, size, "0")
}

// workloadTransfer runs magnet workload serve on rcv (with serveArgs) and
// send on snd over proto, count messages of size bytes interval apart, and
// returns the bytes the server says it received.
func workloadTransfer(t *testing.T, cmd command, snd, rcv netlab.Host, proto string, port, count, size int, interval string, serveArgs ...string) int64 {
	t.Helper()
	addr := netip.AddrPortFrom(rcv.Addr, uint16(port)).String()
	srv := cmd(rcv, magnetBin, append([]string{"workload", "serve", "--proto", proto, "--listen", addr}, serveArgs...)...)
	stdout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if srv.ProcessState == nil {
			srv.Process.Kill()
			srv.Wait()
		}
	}()
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "listening ") {
		t.Fatalf("server did not start: %q", sc.Text())
	}
	out, err := cmd(snd, magnetBin, "workload", "send", "--proto", proto, "--to", addr,
		"--count", strconv.Itoa(count), "--size", strconv.Itoa(size), "--interval", interval).CombinedOutput()
	if err != nil {
		t.Fatalf("send: %v\n%s", err, out)
	}
	var got int64
	if !sc.Scan() {
		t.Fatal("server said nothing after the transfer")
	}
	if _, err := fmt.Sscanf(sc.Text(), "received %d bytes", &got); err != nil {
		t.Fatalf("server: %q", sc.Text())
	}
	srv.Wait()
	return got
}

// nstat returns a counter of the SNMP MIBs of the namespace ns, as nstat(8)
// reads it: the namespace is fresh, so the absolute value is its traffic's.
func nstat(t *testing.T, ns, name string) uint64 {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "nstat", "-saz", name).CombinedOutput()
	if err != nil {
		t.Fatalf("nstat: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == name {
			n, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatalf("nstat: %q", line)
			}
			return n
		}
	}
	t.Fatalf("nstat has no %s:\n%s", name, out)
	return 0
}

// TestTransferTruth sends 16 MiB through a 20 Mbit/s bottleneck with a
// shallow queue (15,000 bytes at the router), which drops segments in the
// network, so that TCP retransmits; the sender closes with megabytes still
// in flight, whose ACKs reach a closing socket. The sender's report must
// count the retransmitted segments as the kernel does (nstat
// TcpRetransSegs of the sender's namespace, where this is the only
// connection) and end with nothing unacknowledged (the receiver read every
// byte).
func TestTransferTruth(t *testing.T) {
	needRoot(t)
	needTools(t, "nstat")
	p := netlab.PathForTest(t, netlab.PathOptions{Name: "mgtruth", BottleneckMbit: 20, QueueBytes: 15000})
	port := 20000 + os.Getpid()%20000
	const count, size = 256, 64 << 10
	var got int64
	path := recordDuring(t, port, event.DefaultGroups, func() { got = transfer(t, p.Command, p.Sender, p.Receiver, port, count, size) })
	if got != count*size {
		t.Fatalf("receiver read %d bytes, want %d", got, count*size)
	}
	truth := nstat(t, p.Sender.NS, "TcpRetransSegs")
	rep, err := analyze.Modulation([]string{path}, 0)
	if err != nil {
		t.Fatal(err)
	}
	snd := connTo(rep, p.Sender.NetNSInode, port)
	if snd == nil || snd.TCP == nil || snd.SendBuffer == nil {
		t.Fatalf("no sender connection with TCP figures in the report: %+v", snd)
	}
	t.Logf("nstat TcpRetransSegs %d; report: %d segments retransmitted (%d B), kernel's count %d; send buffer %+v",
		truth, snd.TCP.RetransSegs, snd.TCP.RetransBytes, snd.TCP.KernelRetransSegs, *snd.SendBuffer)
	if truth == 0 {
		t.Fatal("the bottleneck caused no retransmission: the test proves nothing")
	}
	if snd.TCP.RetransSegs != truth || snd.TCP.KernelRetransSegs != truth {
		t.Errorf("retransmitted segments %d, kernel's count %d; nstat TcpRetransSegs %d", snd.TCP.RetransSegs, snd.TCP.KernelRetransSegs, truth)
	}
	if snd.SendBuffer.Final != 0 {
		t.Errorf("%d B left unacknowledged at the end; the receiver read all %d", snd.SendBuffer.Final, got)
	}
}

// capture runs tcpdump on the interface iface of host h, for TCP port
// port, until stop is called; stop returns the capture file. tcpdump in
// immediate mode hands every packet over as it comes (tshark's dumpcap
// left the end of a transfer in the kernel's ring when stopped).
func capture(t *testing.T, h netlab.Host, iface string, port int) (stop func() string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "wire.pcap")
	cmd := exec.Command("ip", "netns", "exec", h.NS, "tcpdump", "-i", iface, "-s", "128", "-B", "65536",
		"--immediate-mode", "-U", "-w", file, "tcp", "port", strconv.Itoa(port))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// tcpdump says "listening on" once it captures; the rest of what it
	// says comes when it stops.
	sc := bufio.NewScanner(stderr)
	listening := make(chan bool, 1)
	said := make(chan string, 1)
	go func() {
		var rest []string
		for sc.Scan() {
			if len(listening) == 0 && strings.Contains(sc.Text(), "listening on") {
				listening <- true
				continue
			}
			rest = append(rest, sc.Text())
		}
		said <- strings.Join(rest, "; ")
	}()
	select {
	case <-listening:
	case s := <-said:
		cmd.Wait()
		t.Fatalf("tcpdump did not start: %s", s)
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("tcpdump did not start within 30 s: %s", <-said)
	}
	stopped := false
	stop = func() string {
		if !stopped {
			stopped = true
			cmd.Process.Signal(os.Interrupt)
			cmd.Wait()
			if s := <-said; !strings.Contains(s, " 0 packets dropped by kernel") {
				t.Fatalf("tcpdump lost packets, the capture is no truth: %s", s)
			}
		}
		return file
	}
	t.Cleanup(func() { stop() })
	return stop
}

// tsharkPayload sums the TCP payload of the packets in file sent to port,
// as tshark reads them, and counts the packets.
func tsharkPayload(t *testing.T, file string, port int) (bytes int64, packets int) {
	t.Helper()
	out, err := exec.Command("tshark", "-r", file, "-T", "fields", "-e", "tcp.len",
		"-Y", fmt.Sprintf("tcp.dstport == %d", port)).Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	for _, f := range strings.Fields(string(out)) {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("tshark: %q", f)
		}
		bytes += n
		packets++
	}
	return bytes, packets
}

// tcDropped returns the packets the root qdisc of dev in ns dropped, as
// tc -s says.
func tcDropped(t *testing.T, ns, dev string) uint64 {
	t.Helper()
	out, err := exec.Command("tc", "-n", ns, "-s", "qdisc", "show", "dev", dev, "root").CombinedOutput()
	if err != nil {
		t.Fatalf("tc: %v\n%s", err, out)
	}
	i := strings.Index(string(out), "dropped ")
	if i < 0 {
		t.Fatalf("tc -s shows no drops:\n%s", out)
	}
	var n uint64
	fmt.Sscanf(string(out[i:]), "dropped %d", &n)
	return n
}

// TestLocalDropTruth sends 16 MiB through a shallow tbf queue on the
// sender's own device (50 Mbit/s, 200,000 bytes), which drops segments
// before they leave the host: TCP sends them again without counting a
// retransmission. The report's payload that left the host must be what
// tcpdump captured on the device (tshark counting it); its drops that lose data, the qdisc's
// drops (tc -s); its retransmitted segments, nstat TcpRetransSegs.
func TestLocalDropTruth(t *testing.T) {
	needRoot(t)
	needTools(t, "nstat", "tcpdump", "tshark")
	lab := netlab.ForTest(t, netlab.Options{Name: "mglocal"})
	if out, err := exec.Command("tc", "-n", lab.Client.NS, "qdisc", "replace", "dev", lab.Client.Iface, "root", "tbf",
		"rate", "50mbit", "burst", "100000", "limit", "200000").CombinedOutput(); err != nil {
		t.Fatalf("tc: %v\n%s", err, out)
	}
	port := 20000 + os.Getpid()%20000 + 1
	const count, size = 256, 64 << 10
	stop := capture(t, lab.Client, lab.Client.Iface, port)
	// The kernel now and then runs no program of skb:kfree_skb for a drop
	// (docs/EVENTS.md, Loss accounting): bpftrace there is the witness
	// of what magnet's program could see.
	wit := witness.Start(t, witness.Options{NetNS: []uint32{lab.Client.NetNSInode}, Port: port, Drops: true})
	var got int64
	path := recordDuring(t, port, event.DefaultGroups|event.GroupIP|event.GroupHeaders, func() { got = transfer(t, lab.Command, lab.Client, lab.Server, port, count, size) })
	seen := wit.Stop(t)
	wire, packets := tsharkPayload(t, stop(), port)
	if got != count*size {
		t.Fatalf("receiver read %d bytes, want %d", got, count*size)
	}
	retrans := nstat(t, lab.Client.NS, "TcpRetransSegs")
	qdrops := tcDropped(t, lab.Client.NS, lab.Client.Iface)
	rep, err := analyze.Modulation([]string{path}, 0)
	if err != nil {
		t.Fatal(err)
	}
	snd := connTo(rep, lab.Client.NetNSInode, port)
	if snd == nil || snd.TCP == nil {
		t.Fatalf("no sender connection with TCP figures in the report: %+v", snd)
	}
	tcp := snd.TCP
	var lose uint64
	if snd.DropClasses != nil {
		lose = snd.DropClasses.LoseData
	}
	t.Logf("captured: %d B in %d packets; tc dropped %d; nstat TcpRetransSegs %d; report: sent %d B, left the host %d B, retransmitted %d B (%d segments), re-sent after local drops %d B (%d times), dropped on the way down %d packets (%d B); drops %v",
		wire, packets, qdrops, retrans, tcp.DataBytes, tcp.WireBytes, tcp.RetransBytes, tcp.RetransSegs, tcp.LocalResendBytes, tcp.LocalResendEvents, tcp.LocalDropPackets, tcp.LocalDropBytes, snd.Drops)
	if qdrops == 0 || tcp.LocalResendEvents == 0 {
		t.Fatal("the local queue dropped nothing: the test proves nothing")
	}
	if tcp.WireBytes != wire {
		t.Errorf("report: %d B left the host; tcpdump on %s captured %d B", tcp.WireBytes, lab.Client.Iface, wire)
	}
	// Every drop the witness saw, magnet saw (more only by the witness's
	// own skipped runs); tc's count less both is the kernel's skip.
	witnessed := uint64(seen.DropsOf(lab.Client.NetNSInode, 0, "QDISC_DROP", port))
	if witnessed > qdrops || lose < witnessed || lose > witnessed+seen.Missed {
		t.Errorf("report: %d drops that lose data; bpftrace on kfree_skb saw %d (its programs skipped %d runs); the qdisc dropped %d", lose, witnessed, seen.Missed, qdrops)
	}
	if skipped := qdrops - min(qdrops, lose); skipped > 0 {
		t.Logf("the kernel ran no program of kfree_skb for %d of the qdisc's %d drops (bpftrace saw %d, magnet %d)", skipped, qdrops, witnessed, lose)
	}
	// A segment re-sent after a drop magnet's program saw is marked as
	// such; after a drop the kernel skipped, it is not.
	if tcp.LocalDropPackets != lose || tcp.LocalDropBytes > tcp.LocalResendBytes || lose == qdrops && tcp.LocalDropBytes != tcp.LocalResendBytes {
		t.Errorf("report: %d packets (%d B) dropped on the way down, %d B re-sent after local drops; %d drops that lose data, the qdisc dropped %d",
			tcp.LocalDropPackets, tcp.LocalDropBytes, tcp.LocalResendBytes, lose, qdrops)
	}
	if tcp.RetransSegs != retrans {
		t.Errorf("report: %d segments retransmitted; nstat TcpRetransSegs %d", tcp.RetransSegs, retrans)
	}
	checkLocalResendMarks(t, path, snd.Conn.ID, tcp.LocalResendBytes, qdrops-min(qdrops, lose))
	// The queue: every packet that left went through dev_queue→dev_xmit;
	// the dropped ones never reach dev_xmit and must not shift the pairs.
	var queue *analyze.HopStats
	for _, h := range snd.Hops {
		if h.Hop == "dev_queue→dev_xmit" {
			queue = h
		}
	}
	for _, h := range snd.Hops {
		t.Logf("%s: %d segments, median %.1f µs", h.Hop, h.Count, h.Delay.Median)
	}
	for _, w := range rep.Warnings {
		t.Logf("warning: %s", w)
	}
	all, truth := ipSendToDevTruth(t, path, snd.Conn.ID)
	sort.Float64s(truth)
	if queue == nil || len(truth) == 0 {
		t.Fatalf("hop %+v, %d packets paired by ip id", queue, len(truth))
	}
	med := truth[(len(truth)-1)/2]
	t.Logf("dev_queue→dev_xmit: report median %.1f µs over %d segments; ip_send to the device by ip id %.1f µs over the %d of %d packets with their dev_queue in the trace",
		queue.Delay.Median, queue.Count, med, len(truth), len(all))
	if queue.Count != uint64(len(truth)) || len(all) > packets {
		t.Errorf("report: %d segments through the queue; by ip id %d packets went from ip_send to the device, %d with their dev_queue; tcpdump captured %d packets",
			queue.Count, len(all), len(truth), packets)
	}
	// The truth adds ip_send→dev_queue (one kernel call, a few µs) to the
	// queue's milliseconds; the report's quantiles come from buckets of
	// 1/128 octave (0.8 %).
	if d := queue.Delay.Median - med; d > med*0.01 || d < -med*0.01-10 {
		t.Errorf("report: queue median %.1f µs; ip_send to the device by ip id %.1f µs", queue.Delay.Median, med)
	}
}

// checkLocalResendMarks checks the recorder's own mark of segments sent
// again after a local drop (tcp_xmit retrans 2) against the connection's
// sequence numbers in a trace that lost nothing: a segment of new data
// (retrans 0 or 2) wholly below the highest sequence sent before it is
// such a re-send, and one that reaches past it is not; every one must be
// marked so and none other. A segment across that end is new data in part
// (the report splits it: its re-sent part is in resent but not in marked).
// skipped is the qdisc's drops the kernel ran no kfree_skb program for
// (tc's count less what the witness and magnet saw): the recorder cannot
// mark what follows those, so unmarked re-sends are allowed only then.
func checkLocalResendMarks(t *testing.T, path string, conn uint64, resent int64, skipped uint64) {
	t.Helper()
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var hi uint32
	var have bool
	var marked, wrong, missed int64
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Conn() != conn || rec.Type.Name != "tcp_xmit" || rec.Size() <= 0 {
			continue
		}
		seq, _ := rec.Uint("seq")
		rt, _ := rec.Uint("retrans")
		end := uint32(seq) + uint32(rec.Size())
		below := have && int32(hi-end) >= 0
		switch {
		case rt == 2 && below:
			marked += int64(rec.Size())
		case rt == 2:
			wrong++
		case rt == 0 && below:
			missed++
		}
		if !have || int32(end-hi) > 0 {
			hi, have = end, true
		}
	}
	t.Logf("re-sent after local drops: %d B marked by the recorder, %d B in the report", marked, resent)
	if wrong != 0 || missed != 0 && skipped == 0 {
		t.Errorf("tcp_xmit retrans 2: %d segments marked that reach past the highest sequence sent before them; %d re-sent wholly and not marked", wrong, missed)
	} else if missed != 0 {
		t.Logf("tcp_xmit retrans 2: %d segments re-sent wholly and not marked, after the %d drops the kernel ran no program for", missed, skipped)
	}
	if marked == 0 || marked > resent {
		t.Errorf("recorder marked %d B re-sent after local drops; the report counts %d B", marked, resent)
	}
}

// ipSendToDevTruth pairs, in the trace at path, each ip_send of the
// connection conn with the egress headers record of the same IPv4 id (the
// packet's identity, read from its captured IP header) and returns the
// delays in µs: the truth the report's per-hop delays must match; queued
// holds those of the pairs whose ip_send was followed, in the same call (the same
// CPU and thread, before its next ip_send), by the packet's dev_queue: a
// trace can miss a dev_queue (a BPF program the kernel skipped), and then
// the report has no dev_queue→dev_xmit for the packet.
func ipSendToDevTruth(t *testing.T, path string, conn uint64) (delays, queued []float64) {
	t.Helper()
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	type sent struct {
		at     uint64
		size   int32
		queued bool
	}
	byID := map[uint16]*sent{}
	inCall := map[uint64]*sent{} // by CPU and thread: the latest ip_send
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Conn() != conn {
			continue
		}
		call := uint64(rec.CPU())<<32 | uint64(rec.TID())
		switch rec.Type.Name {
		case "ip_send":
			id, _ := rec.Uint("ip_id")
			p := &sent{at: rec.Time(), size: rec.Size()}
			byID[uint16(id)], inCall[call] = p, p
		case "dev_queue":
			if p := inCall[call]; p != nil && rec.Size() == p.size+14 {
				p.queued = true
			}
			delete(inCall, call)
		case "headers":
			dir, _ := rec.Uint("dir")
			data, _ := rec.Bytes("data")
			// Ethernet (14) then IPv4: the id is at 4..5 of the IP header.
			if dir != 0 || len(data) < 14+20 || binary.BigEndian.Uint16(data[12:]) != 0x0800 {
				continue
			}
			id := binary.BigEndian.Uint16(data[14+4:])
			if p := byID[id]; p != nil && rec.Time() >= p.at {
				d := float64(rec.Time()-p.at) / 1e3
				delays = append(delays, d)
				if p.queued {
					queued = append(queued, d)
				}
				delete(byID, id)
			}
		}
	}
	return delays, queued
}

// TestHopsTruth sends 16 MiB between two namespaces over a veth without a
// qdisc, records the sender with packet headers, and compares the report's
// ip_send→dev_xmit median with the one from pairing each ip_send with its
// device transmission by IPv4 id.
func TestHopsTruth(t *testing.T) {
	checkHopTruth(t, "mghops", 2, event.DefaultGroups|event.GroupIP|event.GroupHeaders, "ip_send→dev_xmit", "ip id",
		func(path string, conn uint64) []float64 { d, _ := ipSendToDevTruth(t, path, conn); return d })
}

// checkHopTruth sends 16 MiB between two namespaces over a veth without a
// qdisc, recording the sender with groups, and compares the report's
// median of hop with the one truth finds from the captured headers
// (pairing by what says so in how), and their counts.
func checkHopTruth(t *testing.T, name string, portOffset int, groups event.Group, hop, how string, truth func(path string, conn uint64) []float64) {
	t.Helper()
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: name})
	port := 20000 + os.Getpid()%20000 + portOffset
	const count, size = 256, 64 << 10
	path := recordDuring(t, port, groups, func() { transfer(t, lab.Command, lab.Client, lab.Server, port, count, size) })
	rep, err := analyze.Modulation([]string{path}, 0)
	if err != nil {
		t.Fatal(err)
	}
	snd := connTo(rep, lab.Client.NetNSInode, port)
	if snd == nil {
		t.Fatal("no sender connection in the report")
	}
	var hs *analyze.HopStats
	for _, h := range snd.Hops {
		if h.Hop == hop {
			hs = h
		}
		if groups&event.GroupIP == 0 && strings.Contains(h.Hop, "ip_") {
			t.Errorf("hop %s in a trace without the ip group", h.Hop)
		}
	}
	d := truth(path, snd.Conn.ID)
	sort.Float64s(d)
	if hs == nil || len(d) == 0 {
		t.Fatalf("hop %+v, %d packets paired by %s", hs, len(d), how)
	}
	med := d[(len(d)-1)/2]
	t.Logf("%s: report median %.2f µs over %d segments; by %s %.2f µs over %d packets", hop, hs.Delay.Median, hs.Count, how, med, len(d))
	// The report's quantiles come from buckets of 1/128 octave (0.8 %);
	// the lower and upper middle values of an even count may differ too.
	lo, hi := d[(len(d)-1)/2], d[len(d)/2]
	if hs.Delay.Median < lo*0.99 || hs.Delay.Median > hi*1.01 {
		t.Errorf("report median %.2f µs; the truth from %s %.2f µs", hs.Delay.Median, how, med)
	}
	if hs.Count != uint64(len(d)) {
		t.Errorf("report pairs %d segments; %d packets paired by %s", hs.Count, len(d), how)
	}
}

// xmitToDevTruth pairs, in the trace at path, each tcp_xmit of the
// connection conn that carries data, a SYN or a FIN with the egress headers
// record of the same TCP sequence number (read from the captured TCP
// header, not from the device record's seq) and returns the delays in µs.
func xmitToDevTruth(t *testing.T, path string, conn uint64) []float64 {
	t.Helper()
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	bySeq := map[uint32]uint64{}
	var delays []float64
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Conn() != conn {
			continue
		}
		switch rec.Type.Name {
		case "tcp_xmit":
			if rec.Size() > 0 || rec.Flags()&0x03 != 0 {
				seq, _ := rec.Uint("seq")
				bySeq[uint32(seq)] = rec.Time()
			}
		case "headers":
			dir, _ := rec.Uint("dir")
			data, _ := rec.Bytes("data")
			if dir != 0 || len(data) < 14+20 || binary.BigEndian.Uint16(data[12:]) != 0x0800 {
				continue
			}
			ip := data[14:]
			ihl := int(ip[0]&0x0f) * 4
			if len(ip) < ihl+20 {
				continue
			}
			th := ip[ihl:]
			payload := int(binary.BigEndian.Uint16(ip[2:])) - ihl - int(th[12]>>4)*4
			if payload <= 0 && th[13]&0x03 == 0 {
				continue // a pure ACK: no device event
			}
			seq := binary.BigEndian.Uint32(th[4:])
			if at, ok := bySeq[seq]; ok && rec.Time() >= at {
				delays = append(delays, float64(rec.Time()-at)/1e3)
				delete(bySeq, seq)
			}
		}
	}
	return delays
}

// TestHopsNoIPTruth records the sender with the default groups, which have
// no IP layer, over a veth without a qdisc: the report takes each segment
// from tcp_xmit straight to dev_xmit, paired by the device record's TCP
// sequence number; the truth pairs tcp_xmit with the captured header's.
func TestHopsNoIPTruth(t *testing.T) {
	checkHopTruth(t, "mghopsnoip", 3, event.DefaultGroups|event.GroupHeaders, "tcp_xmit→dev_xmit", "seq",
		func(path string, conn uint64) []float64 { return xmitToDevTruth(t, path, conn) })
}

// TestXmitSegmentsTruth checks tcp_xmit skb by skb, in the sender's
// namespace, where the transfer (through a bottleneck that makes TCP
// retransmit) is the only TCP traffic.
//
// Read at IP egress (the default where fentry is refused), at TCP (sockops,
// or fentry), against the kernel's own counters: TCP counts a segment in
// TcpOutSegs when it sends it past snd_nxt or it carries no sequence space
// (a pure ACK), and in TcpRetransSegs when it retransmits it, both as
// tcp_skb_pcount (gso_segs). The tcp_xmit records must sum to both exactly:
// the same rule applied to their seq, size and flags (the highest sequence
// sent standing for snd_nxt) for the first, retrans 1 for the second. A
// missing, doubled or GSO-miscounted tcp_xmit shows here.
//
// Read at the device (XmitAtDevice), against tcpdump on the sender's
// device: one tcp_xmit per packet captured (veth hands GSO skbs whole to
// the capture, as to net_dev_queue), with the same TCP payload in all, and
// then TCP's counters exactly too. Never more than either; fewer is a known
// gap under load (docs/EVENTS.md), which skips with its figures.
func TestXmitSegmentsTruth(t *testing.T) {
	needRoot(t)
	needTools(t, "nstat", "tcpdump", "tshark")
	for i, at := range []string{"ip", "ip6", "sockops", "device"} {
		t.Run(at, func(t *testing.T) { xmitSegmentsTruth(t, i, at) })
	}
}

func xmitSegmentsTruth(t *testing.T, i int, xmitAt string) {
	atDev := xmitAt == "device"
	p := netlab.PathForTest(t, netlab.PathOptions{Name: fmt.Sprintf("mgxmit%d", i), BottleneckMbit: 20, QueueBytes: 15000,
		IPv6: xmitAt == "ip6"})
	rcv := p.Receiver
	if xmitAt == "ip6" {
		// IP egress is ip6_finish_output's there.
		rcv.Addr, xmitAt = p.Receiver.Addr6, "ip"
	}
	port := 20000 + os.Getpid()%20000 + 4
	const count, size = 128, 64 << 10
	var stop func() string
	if atDev {
		stop = capture(t, p.Sender, p.Sender.Iface, port)
	}
	path := recordDuringAt(t, port, event.DefaultGroups, xmitAt, func() { transfer(t, p.Command, p.Sender, rcv, port, count, size) })
	outSegs := nstat(t, p.Sender.NS, "TcpOutSegs")
	retransSegs := nstat(t, p.Sender.NS, "TcpRetransSegs")
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var recs []trace.Record
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Type.Name == "tcp_xmit" && rec.NetNS() == p.Sender.NetNSInode {
			rec.Data = append([]byte(nil), rec.Data...)
			recs = append(recs, rec)
		}
	}
	// In time order, the skbs of one connection come in the order TCP
	// sent them (at the device, stamped with TCP's clock: docs/EVENTS.md).
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].Time() < recs[j].Time() })
	type conn struct {
		hi   uint32
		have bool
	}
	conns := map[uint64]*conn{}
	var out, retrans uint64
	var payload int64
	for _, rec := range recs {
		seq64, _ := rec.Uint("seq")
		segs, _ := rec.Uint("gso_segs")
		mark, _ := rec.Uint("retrans")
		seq, flags := uint32(seq64), rec.Flags()
		payload += int64(max(rec.Size(), 0))
		end := seq + uint32(max(rec.Size(), 0))
		if flags&0x02 != 0 { // SYN
			end++
		}
		if flags&0x01 != 0 { // FIN
			end++
		}
		c := conns[rec.Conn()]
		if c == nil {
			c = &conn{}
			conns[rec.Conn()] = c
		}
		if !c.have || int32(end-c.hi) > 0 || end == seq {
			out += segs
		}
		if !c.have || int32(end-c.hi) > 0 {
			c.hi, c.have = end, true
		}
		if mark == 1 {
			retrans += segs
		}
	}
	t.Logf("%d tcp_xmit records, %d B: %d segments sent first (nstat TcpOutSegs %d), %d retransmitted (nstat TcpRetransSegs %d)",
		len(recs), payload, out, outSegs, retrans, retransSegs)
	if retransSegs == 0 {
		t.Fatal("the bottleneck caused no retransmission: the test proves nothing")
	}
	if atDev {
		wire, packets := tsharkPayload(t, stop(), port)
		t.Logf("tcpdump on the sender's device: %d packets, %d B", packets, wire)
		if len(recs) > packets || payload > wire || out > outSegs || retrans > retransSegs {
			t.Fatalf("tcp_xmit at the device: %d records, %d B, %d segments sent, %d retransmitted; more than the device carried (%d packets, %d B) or TCP counted (%d, %d)",
				len(recs), payload, out, retrans, packets, wire, outSegs, retransSegs)
		}
		if len(recs) < packets || payload < wire {
			// Open defect: under this machine's load some packets reach
			// the capture (dev_queue_xmit_nit) with no net_dev_queue and
			// no net_dev_start_xmit run of ours, and bpftrace on
			// net:net_dev_queue does not see them either; the TCP-side
			// hooks do (the tcp subtest). docs/EVENTS.md.
			t.Skipf("known gap: the device carried %d packets, %d B more than net_dev_queue saw; TCP counted %d segments sent, %d retransmitted more",
				packets-len(recs), wire-payload, outSegs-out, retransSegs-retrans)
		}
		if out != outSegs || retrans != retransSegs {
			t.Errorf("tcp_xmit: %d segments sent, %d retransmitted; nstat TcpOutSegs %d, TcpRetransSegs %d", out, retrans, outSegs, retransSegs)
		}
		return
	}
	if out != outSegs || retrans != retransSegs {
		t.Errorf("tcp_xmit: %d segments sent, %d retransmitted; nstat TcpOutSegs %d, TcpRetransSegs %d", out, retrans, outSegs, retransSegs)
	}
}

// connTo is the report's connection in network namespace netns whose
// remote port is port (the sender's, in these tests), or nil.
func connTo(rep *analyze.Report, netns uint32, port int) *analyze.ConnReport {
	var found *analyze.ConnReport
	for _, c := range rep.Conns {
		if c.Conn.NetNS == netns && int(c.Conn.Remote.Port()) == port {
			found = c
		}
	}
	return found
}
