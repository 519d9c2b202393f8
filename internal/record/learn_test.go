// SPDX-License-Identifier: Apache-2.0

package record_test

// Sockets that existed before the recording started: the recorder learns
// them at start (internal/record/learn.go). The servers and clients here
// are separate processes (this test binary run again as a helper): the
// recorder's own process is never traced at the socket layer.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// learnHelperEnv makes this test binary a helper process of the tests
// below (TestLearnHelper); its value is the helper's role and arguments.
const learnHelperEnv = "MAGNET_LEARN_HELPER"

// bodySize is what the helper's HTTP server serves.
const bodySize = 1 << 20

// TestLearnHelper is the helper process: run by the tests below, never on
// its own. Roles (the value of learnHelperEnv):
//   - "http": a Go net/http server on ":0" (dual-stack, as Go listens on
//     ":PORT"), serving bodySize bytes;
//   - "sink": accepts one connection on ":0", reads its first N bytes and
//     says so, then reads to the end and says how much;
//   - "source ADDR N1 N2": connects, writes N1 bytes, waits for a line on
//     its standard input, writes N2 bytes and closes;
//   - "udprecv N": reads N datagrams on a UDP socket bound to ":0" and
//     says how many bytes they held.
//
// Each says "listening PORT" or what it did on its standard output, and
// exits when its standard input closes.
func TestLearnHelper(t *testing.T) {
	role := os.Getenv(learnHelperEnv)
	if role == "" {
		t.Skip("the helper process of TestLearnPreexisting*, run by them")
	}
	f := strings.Fields(role)
	lc := net.ListenConfig{KeepAlive: -1} // no keepalive probe on the wire
	switch f[0] {
	case "http":
		ln, err := lc.Listen(t.Context(), "tcp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("listening %d\n", ln.Addr().(*net.TCPAddr).Port)
		body := make([]byte, bodySize)
		go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(body) }))
		io.Copy(io.Discard, os.Stdin)
	case "sink":
		n1, _ := strconv.Atoi(f[1])
		ln, err := lc.Listen(t.Context(), "tcp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("listening %d\n", ln.Addr().(*net.TCPAddr).Port)
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, n1)); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("got %d\n", n1)
		rest, err := io.Copy(io.Discard, c)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		fmt.Printf("total %d\n", int64(n1)+rest)
		io.Copy(io.Discard, os.Stdin)
	case "source":
		n1, _ := strconv.Atoi(f[2])
		n2, _ := strconv.Atoi(f[3])
		d := net.Dialer{KeepAlive: -1}
		c, err := d.Dial("tcp", f[1])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(make([]byte, n1)); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("sent %d\n", n1)
		in := bufio.NewReader(os.Stdin)
		if _, err := in.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(make([]byte, n2)); err != nil {
			t.Fatal(err)
		}
		c.Close()
		fmt.Printf("done %d\n", n2)
		io.Copy(io.Discard, in)
	case "udprecv":
		// "udprecv N": reads N datagrams on a socket bound to ":0".
		n, _ := strconv.Atoi(f[1])
		pc, err := lc.ListenPacket(t.Context(), "udp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("listening %d\n", pc.LocalAddr().(*net.UDPAddr).Port)
		buf := make([]byte, 65536)
		total := 0
		for range n {
			m, _, err := pc.ReadFrom(buf)
			if err != nil {
				t.Fatal(err)
			}
			total += m
		}
		fmt.Printf("got %d\n", total)
		io.Copy(io.Discard, os.Stdin)
	default:
		t.Fatalf("unknown helper role %q", role)
	}
}

// helper is a running helper process.
type helper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

// startHelper runs TestLearnHelper in h as role.
func startHelper(t *testing.T, lab *netlab.Lab, h netlab.Host, role string) *helper {
	t.Helper()
	cmd := lab.Command(h, os.Args[0], "-test.run=^TestLearnHelper$")
	cmd.Env = append(os.Environ(), learnHelperEnv+"="+role)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	hp := &helper{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return hp
}

// expect reads the helper's next line and returns its number after prefix.
func (hp *helper) expect(t *testing.T, prefix string) int {
	t.Helper()
	if !hp.out.Scan() {
		t.Fatalf("helper %v ended before saying %q", hp.cmd.Args, prefix)
	}
	n, err := strconv.Atoi(strings.TrimPrefix(hp.out.Text(), prefix+" "))
	if err != nil || !strings.HasPrefix(hp.out.Text(), prefix+" ") {
		t.Fatalf("helper said %q, want %q and a number", hp.out.Text(), prefix)
	}
	return n
}

var reSSUser = regexp.MustCompile(`users:\(\("([^"]+)",pid=(\d+),`)

// ssListener returns the owner ss -ltnp names for the listener of port in h.
func ssListener(t *testing.T, lab *netlab.Lab, h netlab.Host, port int) (comm string, pid uint32) {
	t.Helper()
	out, err := lab.Command(h, "ss", "-ltnpH", "sport = :"+strconv.Itoa(port)).Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	m := reSSUser.FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("ss names no owner of the listener of port %d: %q", port, out)
	}
	p, _ := strconv.Atoi(m[2])
	return m[1], uint32(p)
}

// learnedConns returns the connections of the trace whose conn_open says
// they were learned at start.
func learnedConns(t *testing.T, path string) map[uint64]bool {
	t.Helper()
	out := map[uint64]bool{}
	for _, c := range conns(t, path) {
		if c.Learned {
			out[c.ID] = true
		}
	}
	return out
}

// TestLearnPreexistingListener: a Go net/http server listening on ":PORT"
// (a dual-stack socket) before the recording starts, which records the
// default groups only (no IP layer). The listener must be in the
// connection table with the owner ss -ltnp names, and every frame tcpdump
// sees on the server's veth must have its device event (pure ACKs aside:
// the default groups leave them out), the SYNs included: they reach the
// listener, found by address only. The SYNs are checked exactly; the
// other frames may be short of tcpdump's only by the frames the kernel ran
// no tracepoint program for (bpftrace on the same tracepoints, devKernel).
func TestLearnPreexistingListener(t *testing.T) {
	needRoot(t)
	needTools(t, "tcpdump", "tshark", "curl", "ss", "bpftrace")
	lab := netlab.ForTest(t, netlab.Options{Name: "mglearnl", RateMbit: 100})
	srv := startHelper(t, lab, lab.Server, "http")
	port := srv.expect(t, "listening")
	ssComm, ssPID := ssListener(t, lab, lab.Server, port)
	tpf := startTracepointFrames(t, lab.Server.NetNSInode, port)
	capt := startCapture(t, lab, lab.Server, fmt.Sprintf("tcp port %d", port))
	rec := startRecording(t, record.Config{Filters: record.Filters{Port: port}, Groups: event.DefaultGroups})
	const requests = 3
	url := fmt.Sprintf("http://%s:%d/", lab.Server.Addr, port)
	for range requests {
		out := run(t, lab.Command(lab.Client, "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{size_download}", url))
		if out != fmt.Sprintf("200 %d", bodySize) {
			t.Fatalf("curl: %q, want 200 and %d bytes", out, bodySize)
		}
	}
	waitClosed(t, lab, port)
	frames := capt.stop(t)
	res := rec.stop(t)
	kernelIn, kernelOut := devKernel(t, tpf, frames, port)

	t.Logf("learned at start: %+v", res.Learned)
	if res.Learned.Err != "" || res.Learned.Announced < 1 || res.Learned.Owned < 1 {
		t.Errorf("learning: %+v, want the listener announced with its owner", res.Learned)
	}
	_, evs, sum := readTrace(t, rec.path)
	if ls, _ := sum.Extra["learned_at_start"].(map[string]any); ls["announced"] != float64(res.Learned.Announced) || ls["sockets"] != float64(res.Learned.Sockets) {
		t.Errorf("trace summary's learned_at_start %v, the result %+v", ls, res.Learned)
	}
	listeners, accepted := serverConns(conns(t, rec.path), lab, "tcp", port)
	if len(listeners) != 1 || len(accepted) != requests {
		t.Fatalf("server connections: %d listeners, %d accepted; want the listener and %d accepted", len(listeners), len(accepted), requests)
	}
	l := listeners[0]
	if !learnedConns(t, rec.path)[l.ID] {
		t.Errorf("%s: not announced as learned at start", describeConn(l))
	}
	if l.PID != ssPID || l.Comm != ssComm || l.PID != uint32(srv.cmd.Process.Pid) {
		t.Errorf("%s: ss -ltnp names %s pid %d (the server is pid %d)", describeConn(l), ssComm, ssPID, srv.cmd.Process.Pid)
	}
	if !l.Local.Addr().IsUnspecified() || !l.Local.Addr().Is6() {
		t.Errorf("%s: want Go's dual-stack listener on [::]", describeConn(l))
	}

	// Every connection's SYN is the listener's only dev_recv without the
	// acks group (the handshake's last ACK is a pure ACK).
	syns := 0
	for _, f := range frames {
		if f.proto == "tcp" && int(f.dst.Port()) == port && f.flags&0x12 == 0x02 {
			syns++
		}
	}
	if got := count(evs, "dev_recv", l.ID).n; syns != requests || got != syns {
		t.Errorf("listener dev_recv = %d; tcpdump: %d SYNs (%d requests)", got, syns, requests)
	}
	local := netip.AddrPortFrom(lab.Server.Addr, uint16(port))
	var wantIn, wantOut, gotIn, gotOut int
	for remote, c := range accepted {
		in, _ := framesWithout(frames, remote, local)
		out, _ := framesWithout(frames, local, remote)
		wantIn += in
		wantOut += out
		gotIn += count(evs, "dev_recv", c.ID).n
		gotOut += count(evs, "dev_xmit", c.ID).n
	}
	// The SYNs reach the listener; the SYN-ACKs leave from it (a request
	// socket, found by address).
	gotIn += count(evs, "dev_recv", l.ID).n
	gotOut += count(evs, "dev_xmit", l.ID).n
	if sum.Lost != 0 {
		t.Errorf("lost %d events", sum.Lost)
	}
	checkDevFrames(t, "dev_recv on the server's veth, pure ACKs aside", gotIn, wantIn, kernelIn)
	checkDevFrames(t, "dev_xmit on the server's veth, pure ACKs aside", gotOut, wantOut, kernelOut)
	if t.Failed() {
		logDevDiagnosis(t, evs, sum)
		for _, c := range accepted {
			t.Logf("%s", describeConn(c))
		}
	}
}

// TestLearnPreexistingConnection: a connection established, with a first
// part of its data already sent and read, when the recording starts; its
// later bytes must be attributed to it at both ends, which the recorder
// learned at start in their owners' names: the application's own counts
// at the socket, tcpdump's frames at the device.
func TestLearnPreexistingConnection(t *testing.T) {
	needRoot(t)
	needTools(t, "tcpdump", "tshark")
	lab := netlab.ForTest(t, netlab.Options{Name: "mglearnc", RateMbit: 100})
	const first, later = 1 << 20, 3 << 20
	sink := startHelper(t, lab, lab.Server, fmt.Sprintf("sink %d", first))
	port := sink.expect(t, "listening")
	addr := netip.AddrPortFrom(lab.Server.Addr, uint16(port))
	source := startHelper(t, lab, lab.Client, fmt.Sprintf("source %s %d %d", addr, first, later))
	source.expect(t, "sent")
	sink.expect(t, "got")
	tpf := startTracepointFrames(t, lab.Server.NetNSInode, port)
	capt := startCapture(t, lab, lab.Server, fmt.Sprintf("tcp port %d", port))
	rec := startRecording(t, record.Config{Filters: record.Filters{Port: port}, Groups: event.DefaultGroups})
	if _, err := io.WriteString(source.stdin, "go on\n"); err != nil {
		t.Fatal(err)
	}
	if n := source.expect(t, "done"); n != later {
		t.Fatalf("source wrote %d bytes, want %d", n, later)
	}
	if n := sink.expect(t, "total"); n != first+later {
		t.Fatalf("sink read %d bytes, want %d", n, first+later)
	}
	waitClosed(t, lab, port)
	frames := capt.stop(t)
	res := rec.stop(t)
	kernelIn, kernelOut := devKernel(t, tpf, frames, port)

	t.Logf("learned at start: %+v", res.Learned)
	cs := conns(t, rec.path)
	client, server := ends(t, cs, lab, port)
	learned := learnedConns(t, rec.path)
	for _, c := range []struct {
		c   *export.Conn
		pid int
	}{{client, source.cmd.Process.Pid}, {server, sink.cmd.Process.Pid}} {
		if !learned[c.c.ID] {
			t.Errorf("%s: not announced as learned at start", describeConn(c.c))
		}
		if c.c.PID != uint32(c.pid) {
			t.Errorf("%s: want the owner, pid %d", describeConn(c.c), c.pid)
		}
	}
	if client.SentApp != later || server.RecvApp != later {
		t.Errorf("socket bytes after the start: client sent %d, server received %d; the applications: %d", client.SentApp, server.RecvApp, later)
	}
	_, evs, sum := readTrace(t, rec.path)
	from := netip.AddrPortFrom(lab.Client.Addr, client.Local.Port())
	in, _ := framesWithout(frames, from, addr)
	out, _ := framesWithout(frames, addr, from)
	if sum.Lost != 0 {
		t.Errorf("lost %d events", sum.Lost)
	}
	checkDevFrames(t, "server's dev_recv, pure ACKs aside", count(evs, "dev_recv", server.ID).n, in, kernelIn)
	checkDevFrames(t, "server's dev_xmit, pure ACKs aside", count(evs, "dev_xmit", server.ID).n, out, kernelOut)
	if t.Failed() {
		logDevDiagnosis(t, evs, sum)
	}
}

// devKernel stops the tracepoint witness and returns the frames of the
// port tcpdump captured on the server's veth that the kernel ran no
// tracepoint program for, in and out (tcpdump's count less bpftrace's).
func devKernel(t *testing.T, tpf *tracepointFrames, frames []frame, port int) (in, out int) {
	t.Helper()
	tp := tpf.stop(t)
	for _, f := range frames {
		switch {
		case f.proto == "tcp" && int(f.dst.Port()) == port:
			in++
		case f.proto == "tcp" && int(f.src.Port()) == port:
			out++
		}
	}
	in -= tp["recv_to"]
	out -= tp["xmit_from"]
	if in < 0 || out < 0 {
		t.Logf("bpftrace saw more frames than tcpdump (%d in, %d out more): other traffic on the port in the namespace?", -in, -out)
	}
	return max(in, 0), max(out, 0)
}

// logDevDiagnosis says where device events went, for a count short of
// tcpdump's.
func logDevDiagnosis(t *testing.T, evs []ev, sum *trace.Summary) {
	t.Helper()
	t.Logf("dev_recv by connection@netns: %v", byConn(evs, "dev_recv"))
	t.Logf("dev_xmit by connection@netns: %v", byConn(evs, "dev_xmit"))
	if sum.Missed != nil {
		t.Logf("program runs the kernel skipped: %d", *sum.Missed)
	}
	produced, _ := sum.Extra["produced"].(map[string]any)
	t.Logf("produced by the programs: dev_recv %v, dev_xmit %v; in the trace %d, %d", produced["dev_recv"], produced["dev_xmit"], sum.Events["dev_recv"], sum.Events["dev_xmit"])
}

// TestLearnFilters: the filters judge a socket learned at start as one met
// live. Two Go servers listen before the recordings start, A in the lab's
// server namespace and B in its client namespace; each recording must
// announce exactly the listeners its filter selects, in their owners'
// names. The pid filter judges the owner the walk of /proc found.
func TestLearnFilters(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mglearnf", RateMbit: 100})
	a := startHelper(t, lab, lab.Server, "http")
	portA := a.expect(t, "listening")
	b := startHelper(t, lab, lab.Client, "http")
	portB := b.expect(t, "listening")
	type want struct{ a, b bool }
	for _, c := range []struct {
		name string
		f    record.Filters
		want want
	}{
		{"none", record.Filters{}, want{true, true}},
		{"pid", record.Filters{PID: a.cmd.Process.Pid}, want{true, false}},
		{"netns", record.Filters{NetNS: lab.Client.NS}, want{false, true}},
		{"port", record.Filters{Port: portA}, want{true, false}},
		{"expression", record.Filters{Pcap: fmt.Sprintf("tcp port %d", portB)}, want{false, true}},
		{"expression_excludes", record.Filters{Pcap: fmt.Sprintf("not port %d", portB)}, want{true, false}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := startRecording(t, record.Config{Filters: c.f, Groups: event.DefaultGroups})
			res := rec.stop(t)
			if res.Learned.Err != "" {
				t.Fatalf("learning: %s", res.Learned.Err)
			}
			var got want
			for _, cn := range conns(t, rec.path) {
				if cn.Proto != "tcp" || cn.Remote.Port() != 0 {
					continue
				}
				var hp *helper
				switch {
				case cn.NetNS == lab.Server.NetNSInode && int(cn.Local.Port()) == portA:
					got.a, hp = true, a
				case cn.NetNS == lab.Client.NetNSInode && int(cn.Local.Port()) == portB:
					got.b, hp = true, b
				default:
					continue
				}
				if !cn.Learned || cn.PID != uint32(hp.cmd.Process.Pid) {
					t.Errorf("%s: want learned at start, owned by pid %d", describeConn(cn), hp.cmd.Process.Pid)
				}
			}
			if got != c.want {
				t.Errorf("listeners announced: A %v, B %v; want A %v, B %v (learned: %+v)", got.a, got.b, c.want.a, c.want.b, res.Learned)
			}
		})
	}
}

// TestLearnPreexistingUDP: a UDP socket bound (to [::]:PORT, dual-stack)
// before the recording starts receives datagrams from an IPv4 client. It
// must be announced as learned, in its owner's name, and every datagram
// tcpdump sees arrive must be its dev_recv and, read by the application,
// its sock_recv.
func TestLearnPreexistingUDP(t *testing.T) {
	needRoot(t)
	needTools(t, "tcpdump", "tshark")
	lab := netlab.ForTest(t, netlab.Options{Name: "mglearnu", RateMbit: 100})
	const datagrams, size = 20, 500
	srv := startHelper(t, lab, lab.Server, fmt.Sprintf("udprecv %d", datagrams))
	port := srv.expect(t, "listening")
	capt := startCapture(t, lab, lab.Server, fmt.Sprintf("udp port %d", port))
	rec := startRecording(t, record.Config{Filters: record.Filters{Port: port}, Groups: event.DefaultGroups})
	err := lab.Client.Do(func() error {
		c, err := net.Dial("udp", netip.AddrPortFrom(lab.Server.Addr, uint16(port)).String())
		if err != nil {
			return err
		}
		defer c.Close()
		for range datagrams {
			if _, err := c.Write(make([]byte, size)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := srv.expect(t, "got"); n != datagrams*size {
		t.Fatalf("server read %d bytes, want %d", n, datagrams*size)
	}
	frames := capt.stop(t)
	res := rec.stop(t)

	t.Logf("learned at start: %+v", res.Learned)
	_, evs, sum := readTrace(t, rec.path)
	var s *export.Conn
	for _, c := range conns(t, rec.path) {
		if c.NetNS == lab.Server.NetNSInode && c.Proto == "udp" && int(c.Local.Port()) == port {
			if s != nil {
				t.Fatalf("two server sockets: %s and %s", describeConn(s), describeConn(c))
			}
			s = c
		}
	}
	if s == nil {
		t.Fatal("the server's UDP socket is not in the connection table")
	}
	if !s.Learned || s.PID != uint32(srv.cmd.Process.Pid) {
		t.Errorf("%s: want learned at start, owned by pid %d", describeConn(s), srv.cmd.Process.Pid)
	}
	in := 0
	for _, f := range frames {
		if f.proto == "udp" && f.dst.Addr() == lab.Server.Addr && int(f.dst.Port()) == port {
			in++
		}
	}
	if got := count(evs, "dev_recv", s.ID).n; in != datagrams || got != in {
		t.Errorf("%s: dev_recv = %d; tcpdump: %d datagrams (%d sent)", describeConn(s), got, in, datagrams)
	}
	// Go's reads that find nothing yet return -EAGAIN (sock_recv of size
	// -11) before the runtime waits: the datagrams are the reads of size > 0.
	reads := 0
	for _, e := range evs {
		if e.name == "sock_recv" && e.conn == s.ID && e.size > 0 {
			reads++
		}
	}
	if got := positiveSum(evs, "sock_recv", s.ID); reads != datagrams || got != datagrams*size {
		t.Errorf("%s: sock_recv %d reads, %d bytes; the server read %d datagrams, %d bytes", describeConn(s), reads, got, datagrams, datagrams*size)
	}
	if sum.Lost != 0 {
		t.Errorf("lost %d events", sum.Lost)
	}
}
