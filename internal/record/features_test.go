// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// ftp runs the FTP pattern with count messages over proto and waits for
// the server to have everything.
func ftp(t *testing.T, lab *netlab.Lab, proto string, port, count int) {
	t.Helper()
	addr := fmt.Sprintf("%s:%d", lab.Server.Addr, port)
	srv, srvOut := serve(t, lab, lab.Server, "--proto", proto, "--listen", addr, "--count", fmt.Sprint(count), "--size", "10240")
	run(t, lab.Command(lab.Client, magnetBin, "workload", "send", "--proto", proto, "--to", addr,
		"--count", fmt.Sprint(count), "--size", "10240", "--interval", "5ms"))
	srvOut.Scan()
	srv.Wait()
}

// TestSchedEvents: the opt-in sched group, for a recorded command.
func TestSchedEvents(t *testing.T) {
	needRoot(t)
	rec := startRecording(t, record.Config{
		Groups:  event.DefaultGroups | event.GroupSched,
		Command: []string{"sh", "-c", "sleep 0.05; sleep 0.05"},
	})
	<-rec.done
	if rec.err != nil {
		t.Fatal(rec.err)
	}
	res := rec.res
	for _, name := range []string{"sched_switch", "sched_wakeup", "sched_fork", "sched_exit"} {
		if res.Events[name] == 0 {
			t.Errorf("no %s events for a command that forks and sleeps (events %v)", name, res.Events)
		}
	}
	// Every forked child of the command exits within the recording.
	forked, exited := map[uint64]bool{}, map[uint32]bool{}
	eachRecord(t, rec.path, func(rc trace.Record) {
		switch rc.Type.Name {
		case "sched_fork":
			c, _ := rc.Uint("child_tid")
			forked[c] = true
		case "sched_exit":
			exited[rc.TID()] = true
		}
	})
	for c := range forked {
		if !exited[uint32(c)] {
			t.Errorf("child %d forked but no sched_exit", c)
		}
	}
	// The sched plot has a series per CPU that switched.
	fig, err := analyze.Plot([]string{rec.path}, "sched", analyze.PlotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	points := 0
	for _, s := range fig.Series {
		points += len(s.X)
	}
	if len(fig.Series) == 0 || points == 0 {
		t.Errorf("sched plot: %d series, %d points", len(fig.Series), points)
	}
}

// TestHeadersEvents: the opt-in headers group snaps each packet's first
// bytes at the device, from the Ethernet header: every packet, pure ACKs
// too (pcap export needs them), one per device event with the acks group.
func TestHeadersEvents(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mghdr"})
	port := uniquePort()
	rec := startRecording(t, record.Config{Groups: event.DefaultGroups | event.GroupHeaders | event.GroupAcks, Filters: record.Filters{Port: port}})
	ftp(t, lab, "tcp", port, 5)
	res := rec.stop(t)
	if res.Events["headers"] != res.Events["dev_xmit"]+res.Events["dev_recv"] {
		t.Errorf("headers %d, want one per dev_xmit + dev_recv (%d + %d)", res.Events["headers"], res.Events["dev_xmit"], res.Events["dev_recv"])
	}
	server := lab.Server.Addr.As4()
	seen := 0
	eachRecord(t, rec.path, func(rc trace.Record) {
		if rc.Type.Name != "headers" {
			return
		}
		caplen, _ := rc.Uint("caplen")
		data, _ := rc.Bytes("data")
		if caplen < 14+20+20 || caplen > 128 {
			t.Fatalf("caplen %d", caplen)
		}
		if et := binary.BigEndian.Uint16(data[12:14]); et != 0x0800 {
			t.Fatalf("ethertype %#x, want IPv4", et)
		}
		src, dst := [4]byte(data[26:30]), [4]byte(data[30:34])
		if src != server && dst != server {
			t.Fatalf("packet %v -> %v does not involve the server %v", src, dst, server)
		}
		seen++
	})
	if seen == 0 {
		t.Fatal("no headers records")
	}
}

// TestDropsAndNetnsFilter: datagrams to a port nobody listens on are
// dropped with the kernel's reason, NO_SOCKET; --netns keeps only the
// server's namespace.
func TestDropsAndNetnsFilter(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgdrop"})
	rec := startRecording(t, record.Config{Filters: record.Filters{NetNS: lab.Server.NS}})
	addr := fmt.Sprintf("%s:%d", lab.Server.Addr, uniquePort())
	// The ICMP port-unreachable answer makes a later send fail: how many
	// datagrams left does not matter, each that arrives must be dropped.
	_ = lab.Command(lab.Client, magnetBin, "workload", "send", "--proto", "udp", "--to", addr,
		"--count", "5", "--size", "100", "--interval", "1ms").Run()
	rec.stop(t)
	h, evs, _ := readTrace(t, rec.path)
	for _, e := range evs {
		if e.name != "task" && e.netns != lab.Server.NetNSInode {
			t.Fatalf("%s in netns %d, filter was %d", e.name, e.netns, lab.Server.NetNSInode)
		}
	}
	reasons := h.Enums["drop_reason"]
	noSocket, arrived := 0, 0
	eachRecord(t, rec.path, func(rc trace.Record) {
		if rc.Type.Name == "dev_recv" && rc.Size() == 100+8+20 {
			arrived++
		}
		if rc.Type.Name == "drop" {
			v, _ := rc.Uint("reason")
			if reasons[fmt.Sprint(v)] == "NO_SOCKET" {
				noSocket++
			}
		}
	})
	if arrived == 0 || noSocket != arrived {
		t.Errorf("%d NO_SOCKET drops for %d datagrams that arrived", noSocket, arrived)
	}
}

// TestPortFilterLeavesOthersOut: under --port, connections on other ports
// (TCP, which the programs no longer keep in their tables, and UDP, which
// they still do) leave no event at any layer, while the recorded
// connection's packets are still found by address at the device.
func TestPortFilterLeavesOthersOut(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgportf"})
	port, other, otherUDP := uniquePort(), uniquePort(), uniquePort()
	rec := startRecording(t, record.Config{Filters: record.Filters{Port: port}, Groups: event.DefaultGroups | event.GroupIP})
	ftp(t, lab, "tcp", other, 5)
	ftp(t, lab, "udp", otherUDP, 5)
	ftp(t, lab, "tcp", port, 20)
	ftp(t, lab, "tcp", other, 5)
	rec.stop(t)

	_, evs, sum := readTrace(t, rec.path)
	cs := conns(t, rec.path)
	client, server := ends(t, cs, lab, port)
	ours := map[uint64]bool{client.ID: true, server.ID: true}
	for _, c := range cs {
		// The listener receives the SYN and the handshake's ACK.
		listener := c.NetNS == lab.Server.NetNSInode && int(c.Local.Port()) == port && c.Remote.Port() == 0
		if !ours[c.ID] && !listener {
			t.Fatalf("connection %+v recorded under --port %d", c, port)
		}
		ours[c.ID] = true
	}
	for _, e := range evs {
		if e.conn != 0 && !ours[e.conn] {
			t.Fatalf("%s on conn %d, which is not port %d's", e.name, e.conn, port)
		}
		if e.conn == 0 && (strings.HasPrefix(e.name, "dev_") || strings.HasPrefix(e.name, "ip_") ||
			strings.HasPrefix(e.name, "tcp_") || strings.HasPrefix(e.name, "sock_")) {
			t.Fatalf("unattributed %s under a port filter", e.name)
		}
	}
	if s := count(evs, "sock_send", client.ID); s.n != 20 || s.sum != 20*10240 {
		t.Errorf("client sock_send %d events %d bytes, want 20, %d", s.n, s.sum, 20*10240)
	}
	devRecv, ipRecv := count(evs, "dev_recv", server.ID), count(evs, "ip_recv", server.ID)
	if ipRecv.n == 0 || devRecv.n < ipRecv.n {
		t.Errorf("server dev_recv %d, ip_recv %d: packets found by address not attributed", devRecv.n, ipRecv.n)
	}
	if sum.Lost != 0 {
		t.Errorf("lost %d events", sum.Lost)
	}
}

// TestPIDFilter records one process: its connection and nothing else.
func TestPIDFilter(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgpid"})
	port := uniquePort()
	addr := fmt.Sprintf("%s:%d", lab.Server.Addr, port)
	srv, srvOut := serve(t, lab, lab.Server, "--proto", "tcp", "--listen", addr)
	// The client waits for a line on stdin, then execs the sender: its pid
	// is known before it makes a socket.
	client := lab.Command(lab.Client, "sh", "-c", "read go; exec "+magnetBin+" workload send --proto tcp --to "+addr+" --count 10 --size 10240 --interval 1ms")
	stdin, err := client.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	defer client.Process.Kill()
	// ip netns exec execs sh in place, so the pid is the sender's.
	rec := startRecording(t, record.Config{Filters: record.Filters{PID: client.Process.Pid}})
	fmt.Fprintln(stdin, "go")
	if err := client.Wait(); err != nil {
		t.Fatal(err)
	}
	srvOut.Scan()
	srv.Wait()
	rec.stop(t)
	_, evs, _ := readTrace(t, rec.path)
	cs := conns(t, rec.path)
	if len(cs) != 1 || cs[0].NetNS != lab.Client.NetNSInode || int(cs[0].Remote.Port()) != port {
		t.Fatalf("want only the client's connection, got %+v", cs)
	}
	if s := count(evs, "sock_send", cs[0].ID); s.n != 10 || s.sum != 102400 {
		t.Errorf("sock_send %d events %d bytes, want 10, 102400", s.n, s.sum)
	}
}

// TestMissingHook: without one hook, its events are missing, reported, and
// the rest recorded as usual. Without tcp_probe, tcp_rcv comes only from
// sockets that left ESTABLISHED (sockops writes those): here the ACKs and
// FINs of the closing ends, none carrying data (the server takes all of
// it while established, before the client's FIN).
func TestMissingHook(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgmiss"})
	port := uniquePort()
	rec := startRecording(t, record.Config{Filters: record.Filters{Port: port}, Groups: event.DefaultGroups | event.GroupIP, DisableHooks: []string{"tcp_probe"}})
	ftp(t, lab, "tcp", port, 5)
	res := rec.stop(t)
	_, evs, _ := readTrace(t, rec.path)
	for _, e := range evs {
		if e.name == "tcp_rcv" && e.size != 0 {
			t.Errorf("tcp_rcv of %d bytes without tcp_probe: data reached an established socket", e.size)
			break
		}
	}
	for _, name := range []string{"sock_send", "sock_recv", "tcp_xmit", "ip_send", "ip_recv", "dev_xmit", "dev_recv"} {
		if res.Events[name] == 0 {
			t.Errorf("no %s events with tcp_probe missing", name)
		}
	}
	found := false
	for _, h := range res.Hooks {
		if h.Program == "tcp_probe" {
			found = !h.Attached && h.Reason != ""
		}
	}
	if !found {
		t.Errorf("tcp_probe not reported unavailable")
	}
	h, _, _ := readTrace(t, rec.path)
	if hooks, _ := h.Extra["hooks"].(map[string]any); !strings.HasPrefix(fmt.Sprint(hooks["tp_btf/tcp_probe"]), "unavailable") {
		t.Errorf("trace header does not say tcp_probe was unavailable: %v", h.Extra["hooks"])
	}
}

// TestDiskFull: the output's file system fills up; the recording stops with
// a clear error and what was written stays readable.
func TestDiskFull(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgfull"})
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	port := uniquePort()
	path := filepath.Join(dir, "full.mgt")
	rec := startRecording(t, record.Config{Output: path, Filters: record.Filters{Port: port}})
	addr := fmt.Sprintf("%s:%d", lab.Server.Addr, port)
	srv, srvOut := serve(t, lab, lab.Server, "--proto", "tcp", "--listen", addr)
	cli := lab.Command(lab.Client, magnetBin, "workload", "send", "--proto", "tcp", "--to", addr, "--flood", "2s", "--size", "256")
	if out, err := cli.CombinedOutput(); err != nil {
		t.Fatalf("client: %v %s", err, out)
	}
	srvOut.Scan()
	srv.Wait()
	<-rec.done
	if rec.err == nil || !strings.Contains(rec.err.Error(), "no space left on device") {
		t.Fatalf("record error = %v, want no space left on device", rec.err)
	}
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	n := 0
	for {
		_, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reading the trace of a full disk: %v", err)
		}
		n++
	}
	if cut, _ := r.Truncated(); !cut || n == 0 {
		t.Fatalf("want a cut-short trace with records, got cut=%v records=%d", cut, n)
	}
	rec.err = nil // the expected error; let cleanup pass
}

// eachRecord calls fn for every record of the trace at path, and returns
// the trace's summary (nil if the trace has none: cut short).
func eachRecord(t *testing.T, path string, fn func(trace.Record)) *trace.Summary {
	t.Helper()
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for {
		rc, err := r.Next()
		if errors.Is(err, io.EOF) {
			return r.Summary()
		}
		if err != nil {
			t.Fatal(err)
		}
		fn(rc)
	}
}

// TestStopMidFlood stops a recording while a flood fills a large ring:
// everything still buffered is drained, so recorded + lost == produced.
func TestStopMidFlood(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgmid"})
	port := uniquePort()
	rec := startRecording(t, record.Config{Filters: record.Filters{Port: port}, BufferBytes: 64 << 20})
	addr := fmt.Sprintf("%s:%d", lab.Server.Addr, port)
	srv, srvOut := serve(t, lab, lab.Server, "--proto", "tcp", "--listen", addr)
	cli := lab.Command(lab.Client, magnetBin, "workload", "send", "--proto", "tcp", "--to", addr, "--flood", "2s", "--size", "64")
	stdout, err := cli.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cli.Process.Kill(); cli.Wait() }()
	// Stop once the flood is well under way: the trace file has grown.
	waitForSize(t, rec.path, 1<<20)
	res := rec.stop(t)
	io.Copy(io.Discard, stdout)
	cli.Wait()
	srvOut.Scan()
	srv.Wait()
	var recorded uint64
	for name, n := range res.Events {
		if name != "task" && name != "lost" {
			recorded += n
		}
	}
	var produced uint64
	for _, n := range res.Produced {
		produced += n
	}
	if recorded+res.Lost != produced {
		t.Fatalf("recorded %d + lost %d != produced %d", recorded, res.Lost, produced)
	}
	t.Logf("stopped mid-flood: %d recorded, %d lost, %d produced", recorded, res.Lost, produced)
}

func waitForSize(t *testing.T, path string, size int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if fi, err := os.Stat(path); err == nil && fi.Size() >= size {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not reach %d bytes", path, size)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// countingSink is a Sink that keeps records in memory, as the daemon and
// rotation do, and counts them by type.
type countingSink struct {
	hdr    *trace.Header
	counts map[string]uint64
	bytes  int64
	closed *trace.Summary
}

func (s *countingSink) Write(rec []byte) error {
	s.counts[s.hdr.TypeByID(rec[30]).Name]++
	s.bytes += int64(len(rec))
	return nil
}
func (s *countingSink) Flush() error                   { return nil }
func (s *countingSink) Close(sum *trace.Summary) error { s.closed = sum; return nil }
func (s *countingSink) Bytes() int64                   { return s.bytes }

// TestCustomSink: with NewSink set, the records go to the sink, none to a
// file, and the sink sees exactly what the result counts.
func TestCustomSink(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgsink"})
	port := uniquePort()
	sink := &countingSink{counts: map[string]uint64{}}
	var loaded bool
	rec := startRecording(t, record.Config{
		Output:  filepath.Join(t.TempDir(), "never-created.mgt"),
		Filters: record.Filters{Port: port},
		NewSink: func(h *trace.Header) (record.Sink, error) { sink.hdr = h; return sink, nil },
		Loaded:  func(p *probe.Probe) { loaded = p != nil },
	})
	ftp(t, lab, "tcp", port, 5)
	res := rec.stop(t)
	if !loaded {
		t.Error("Loaded was not called with the probe")
	}
	if _, err := os.Stat(rec.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("output file exists with a custom sink: %v", err)
	}
	if sink.closed == nil {
		t.Fatal("sink not closed")
	}
	if sink.counts["sock_send"] != 5 {
		t.Errorf("sink saw %d sock_send, want 5", sink.counts["sock_send"])
	}
	for name, n := range res.Events {
		if sink.counts[name] != n {
			t.Errorf("%s: sink saw %d, result says %d", name, sink.counts[name], n)
		}
	}
	if res.Bytes != sink.bytes {
		t.Errorf("result bytes %d, sink %d", res.Bytes, sink.bytes)
	}
}
