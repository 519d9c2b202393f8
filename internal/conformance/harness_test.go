// SPDX-License-Identifier: Apache-2.0

package conformance_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	mgt "github.com/magnet-tracer/magnet/internal/trace"
)

// bin is the magnet binary built for this run, driven as a user types it.
var bin string

func TestMain(m *testing.M) {
	code := func() int {
		if os.Geteuid() != 0 || os.Getenv(clientEnv) != "" {
			return m.Run() // every test skips, or this is a client process: nothing to build
		}
		dir, err := os.MkdirTemp("", "magnet-conformance-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		bin = filepath.Join(dir, "magnet")
		if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/magnet").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build magnet: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// need skips the test without root and without the tools; on CI, where
// scripts/deps.sh installs them, a missing tool fails it instead, so a
// skip can never hide a broken check.
func need(t *testing.T, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF and builds network namespaces")
	}
	for _, tool := range append([]string{"ip", "tc", "tcpdump", "tshark", "nstat", "bpftrace", "bpftool"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing on CI (scripts/deps.sh installs it)", tool)
			}
			t.Skipf("%s not installed (scripts/deps.sh installs it)", tool)
		}
	}
}

// Each namespace of a lab gets these IPv6 addresses besides netlab's
// IPv4 ones; they are private to the lab's two namespaces.
var (
	client6 = netip.MustParseAddr("fd00:6d67::1")
	server6 = netip.MustParseAddr("fd00:6d67::2")
)

// newLab builds a client and a server namespace joined by a veth pair,
// rate-limited by netlab's tbf on both ends, with IPv6 addresses added
// (nodad: usable at once, no duplicate address detection to wait for).
func newLab(t *testing.T, name string, rateMbit int) *netlab.Lab {
	t.Helper()
	lab := netlab.ForTest(t, netlab.Options{Name: name, RateMbit: rateMbit})
	for _, h := range []struct {
		host netlab.Host
		addr netip.Addr
	}{{lab.Client, client6}, {lab.Server, server6}} {
		run(t, "ip", "-n", h.host.NS, "addr", "add", h.addr.String()+"/64", "dev", h.host.Iface, "nodad")
	}
	return lab
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// everyFrame records the default groups and the device events of pure
// ACKs too (acks): every frame is compared with what tshark sees on the
// veth, ACKs included. Not the IP layer (opt-in): without it, no hook has
// the socket of a listener that existed before recording began, which the
// recorder learns at start (the servers here start before it). The default
// set without acks is checked against tcpdump by internal/record's
// TestClosingAttributed/fin-default.
var everyFrame = []string{"-e", "default,acks"}

// port returns a port for scenario n (0-9) of this process: other packages'
// tests record at the same time, and --port keeps them apart.
func port(n int) int { return 20000 + (os.Getpid()%2000)*10 + n }

// recorder is a running `magnet record`.
type recorder struct {
	cmd    *exec.Cmd
	path   string
	stderr bytes.Buffer
	wait   chan error
}

// record starts magnet record with args and returns once its probes are
// attached (its --ready-file exists).
func record(t *testing.T, args ...string) *recorder {
	t.Helper()
	dir := t.TempDir()
	r := &recorder{path: filepath.Join(dir, "trace.mgt")}
	ready := filepath.Join(dir, "ready")
	r.cmd = exec.Command(bin, append([]string{"record", "-q", "-o", r.path, "--ready-file", ready}, args...)...)
	r.cmd.Stderr = &r.stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	t.Cleanup(func() {
		if r.cmd.ProcessState == nil {
			r.cmd.Process.Kill()
			<-done
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("record exited before it was ready: %v\n%s", err, r.stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("record not ready after 60 s\n%s", r.stderr.String())
		}
	}
	r.wait = done
	return r
}

// stop ends the recording (SIGINT: drain and close) and returns the trace.
func (r *recorder) stop(t *testing.T) *trace {
	t.Helper()
	r.cmd.Process.Signal(os.Interrupt)
	if err := <-r.wait; err != nil {
		t.Fatalf("record: %v\n%s", err, r.stderr.String())
	}
	missed := checkAccounted(t, r.path)
	tr := load(t, r.path)
	tr.missed = missed
	return tr
}

// capture is a tcpdump on one interface of one namespace, writing a pcap
// file that tshark reads back.
type capture struct {
	cmd    *exec.Cmd
	path   string
	lines  chan string
	host   netlab.Host
	stderr []string
}

// startCapture starts tcpdump on h's veth with a BPF filter and returns
// once it says it is listening. The snap length is short: lengths come from
// the packet headers, not from the bytes captured.
func startCapture(t *testing.T, h netlab.Host, filter string) *capture {
	t.Helper()
	c := &capture{path: filepath.Join(t.TempDir(), "cap.pcap"), lines: make(chan string, 16), host: h}
	c.cmd = exec.Command("ip", "netns", "exec", h.NS, "tcpdump", "-i", h.Iface, "-n", "-s", "200", "-U", "--immediate-mode", "-Z", "root", "-w", c.path, filter)
	se, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			c.cmd.Process.Kill()
			c.cmd.Wait()
		}
	})
	go func() {
		sc := bufio.NewScanner(se)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("tcpdump on %s ended: %q", h.Iface, c.stderr)
			}
			c.stderr = append(c.stderr, l)
			if strings.Contains(l, "listening on") {
				return c
			}
		case <-timeout:
			t.Fatalf("tcpdump on %s not listening after 30 s: %q", h.Iface, c.stderr)
		}
	}
}

// frame is one packet tshark read from a capture.
type frame struct {
	len          int // frame.len: the skb as the tap saw it, link-layer header included
	src, dst     netip.Addr
	sport, dport int
	udp          bool
	tcpLen       int // tcp.len: TCP payload bytes
	flags        uint16
	seq, ack     int64  // tcp.seq, tcp.ack: relative to the initial sequence numbers
	seqRaw       uint32 // tcp.seq_raw: the sequence number in the header, as magnet's dev events and the witness carry it
}

// stop ends tcpdump and returns the frames tshark reads from its file. A
// capture that lost packets is no ground truth: the test fails.
func (c *capture) stop(t *testing.T) []frame {
	t.Helper()
	c.cmd.Process.Signal(os.Interrupt)
	for l := range c.lines {
		c.stderr = append(c.stderr, l)
	}
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("tcpdump: %v: %q", err, c.stderr)
	}
	t.Logf("tcpdump on %s: %q", c.host.Iface, c.stderr)
	for _, l := range c.stderr {
		if strings.HasSuffix(l, "dropped by kernel") && !strings.HasPrefix(l, "0 ") {
			t.Fatalf("tcpdump on %s lost packets, no ground truth: %q", c.host.Iface, c.stderr)
		}
	}
	out, err := exec.Command("tshark", "-r", c.path, "-n", "-T", "fields", "-E", "separator=,",
		"-e", "frame.len", "-e", "ip.src", "-e", "ipv6.src", "-e", "ip.dst", "-e", "ipv6.dst",
		"-e", "tcp.srcport", "-e", "tcp.dstport", "-e", "udp.srcport", "-e", "udp.dstport",
		"-e", "tcp.len", "-e", "tcp.flags", "-e", "tcp.seq", "-e", "tcp.ack", "-e", "tcp.seq_raw").Output()
	if err != nil {
		t.Fatalf("tshark -r %s: %v", c.path, err)
	}
	var frames []frame
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != 14 {
			t.Fatalf("tshark line %q: want 14 fields", line)
		}
		var fr frame
		fr.len, _ = strconv.Atoi(f[0])
		fr.src, _ = netip.ParseAddr(first(f[1], f[2]))
		fr.dst, _ = netip.ParseAddr(first(f[3], f[4]))
		if f[5] != "" {
			fr.sport, _ = strconv.Atoi(f[5])
			fr.dport, _ = strconv.Atoi(f[6])
			fr.tcpLen, _ = strconv.Atoi(f[9])
			fl, _ := strconv.ParseUint(strings.TrimPrefix(f[10], "0x"), 16, 16)
			fr.flags = uint16(fl)
			fr.seq, _ = strconv.ParseInt(f[11], 10, 64)
			fr.ack, _ = strconv.ParseInt(f[12], 10, 64)
			raw, _ := strconv.ParseUint(f[13], 10, 32)
			fr.seqRaw = uint32(raw)
		} else {
			fr.udp = true
			fr.sport, _ = strconv.Atoi(f[7])
			fr.dport, _ = strconv.Atoi(f[8])
		}
		frames = append(frames, fr)
	}
	return frames
}

func first(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// nstat returns the namespace's SNMP and netstat counters, absolute, as
// nstat(8) prints them (-a absolute, -s no history, -z zeros too).
func nstat(t *testing.T, h netlab.Host) map[string]uint64 {
	t.Helper()
	out := run(t, "ip", "netns", "exec", h.NS, "nstat", "-asz")
	m := map[string]uint64{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if v, err := strconv.ParseUint(f[1], 10, 64); err == nil {
			m[f[0]] = v
		}
	}
	if _, ok := m["TcpRetransSegs"]; !ok {
		t.Fatalf("nstat in %s has no TcpRetransSegs:\n%s", h.NS, out)
	}
	return m
}

// delta is after minus before, per counter.
func delta(before, after map[string]uint64) map[string]uint64 {
	d := map[string]uint64{}
	for k, v := range after {
		d[k] = v - before[k]
	}
	return d
}

// qdiscStats returns tc -s's counters of the root qdisc of h's veth.
func qdiscStats(t *testing.T, h netlab.Host) (kind string, packets, drops uint64) {
	t.Helper()
	out := run(t, "tc", "-n", h.NS, "-s", "-j", "qdisc", "show", "dev", h.Iface, "root")
	var qs []struct {
		Kind    string `json:"kind"`
		Packets uint64 `json:"packets"`
		Drops   uint64 `json:"drops"`
	}
	if err := json.Unmarshal([]byte(out), &qs); err != nil || len(qs) == 0 {
		t.Fatalf("tc -s -j qdisc show dev %s: %v\n%s", h.Iface, err, out)
	}
	return qs[0].Kind, qs[0].Packets, qs[0].Drops
}

// ev is one event as magnet export --format jsonl writes it.
type ev struct {
	Time          int64  `json:"time_ns"`
	PID           uint32 `json:"pid"`
	Comm          string `json:"comm"`
	NetNS         uint32 `json:"netns"`
	Conn          uint64 `json:"conn"`
	Event         string `json:"event"`
	Size          int64  `json:"size"`
	IfIndex       uint32 `json:"ifindex"`
	GSOSegs       int64  `json:"gso_segs"`
	Retrans       int64  `json:"retrans"`
	Reason        string `json:"reason"`
	BytesAcked    uint64 `json:"bytes_acked"`
	BytesReceived uint64 `json:"bytes_received"`
	TotalRetrans  uint64 `json:"total_retrans"`
	Delivered     uint64 `json:"delivered"`
	Flags         string `json:"tcpflags"`
	Seq           uint32 `json:"seq"` // dev_*: the TCP header's sequence number
}

// conn is a row of magnet parse --conns --json.
type conn struct {
	ID      uint64         `json:"id"`
	Proto   string         `json:"proto"`
	Local   netip.AddrPort `json:"local"`
	Remote  netip.AddrPort `json:"remote"`
	NetNS   uint32         `json:"netns"`
	PID     uint32         `json:"pid"`
	Comm    string         `json:"comm"`
	Peer    uint64         `json:"peer"`
	CloseNs uint64         `json:"close_ns"`
	Sent    int64          `json:"app_bytes_sent"`
	Recv    int64          `json:"app_bytes_received"`
}

// report is the part of magnet report --json the tests compare.
type report struct {
	Connections []struct {
		Conn   conn `json:"conn"`
		Layers []struct {
			Layer string `json:"layer"`
			Count uint64 `json:"count"`
			Bytes int64  `json:"bytes"`
		} `json:"layers"`
		Throughput *struct {
			AppBytes  int64 `json:"app_bytes"`
			WireBytes int64 `json:"wire_bytes"`
		} `json:"throughput"`
		TCP *struct {
			RetransSegs  uint64 `json:"retransmitted_segments"`
			RetransBytes int64  `json:"retransmitted_bytes"`
		} `json:"tcp"`
		Drops map[string]uint64 `json:"drops"`
		Path  *struct {
			Peer         uint64 `json:"peer"`
			Departed     uint64 `json:"departed"`
			Matched      uint64 `json:"matched"`
			DataDeparted uint64 `json:"data_departed"`
			Segments     uint64 `json:"segments"`
		} `json:"path"`
		SendBuffer *struct {
			Max   int64 `json:"max_bytes"`
			Min   int64 `json:"min_bytes"`
			Final int64 `json:"final_bytes"`
		} `json:"send_buffer"`
	} `json:"connections"`
	Lost     uint64            `json:"lost"`
	Drops    map[string]uint64 `json:"drops"`
	Warnings []string          `json:"warnings"`
}

// trace is a finished recording, read back through the binary.
type trace struct {
	path   string
	events []ev
	conns  map[uint64]conn
	report report
	// missed: runs of the recorder's device and drop programs the
	// kernel skipped (their recursion_misses, from the trace summary).
	missed uint64
}

func load(t *testing.T, path string) *trace {
	t.Helper()
	tr := &trace{path: path, conns: map[uint64]conn{}}
	cmd := exec.Command(bin, "export", "-f", "jsonl", "--no-conns", "-o", "-", path)
	var se bytes.Buffer
	cmd.Stderr = &se
	so, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(so)
	for {
		var e ev
		if err := dec.Decode(&e); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("export jsonl: %v", err)
		}
		tr.events = append(tr.events, e)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("export jsonl: %v\n%s", err, se.String())
	}
	var conns []conn
	if err := json.Unmarshal(magnetOut(t, "parse", "--conns", "--json", path), &conns); err != nil {
		t.Fatalf("parse --conns --json: %v", err)
	}
	for _, c := range conns {
		tr.conns[c.ID] = c
	}
	if err := json.Unmarshal(magnetOut(t, "report", "--json", path), &tr.report); err != nil {
		t.Fatalf("report --json: %v", err)
	}
	if tr.report.Lost != 0 {
		t.Fatalf("the recording lost %d events: figures would not be exact", tr.report.Lost)
	}
	return tr
}

func magnetOut(t testing.TB, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var se bytes.Buffer
	cmd.Stderr = &se
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("magnet %s: %v\n%s", strings.Join(args, " "), err, se.String())
	}
	return out
}

// find returns the connections of the trace that match.
func (tr *trace) find(match func(conn) bool) []conn {
	var cs []conn
	for _, c := range tr.conns {
		if match(c) {
			cs = append(cs, c)
		}
	}
	return cs
}

// only returns the one connection that matches, failing otherwise.
func (tr *trace) only(t testing.TB, what string, match func(conn) bool) conn {
	t.Helper()
	cs := tr.find(match)
	if len(cs) != 1 {
		t.Fatalf("%d connections are %s, want 1: %+v", len(cs), what, cs)
	}
	return cs[0]
}

// closeOf returns the conn_close event of connection id.
func (tr *trace) closeOf(id uint64) (ev, bool) {
	for _, e := range tr.events {
		if e.Event == "conn_close" && e.Conn == id {
			return e, true
		}
	}
	return ev{}, false
}

// reportOf returns the report's section of connection id.
func (tr *trace) reportOf(t testing.TB, id uint64) int {
	t.Helper()
	for i, c := range tr.report.Connections {
		if c.Conn.ID == id {
			return i
		}
	}
	t.Fatalf("the report has no connection %d", id)
	return -1
}

// layer returns count and bytes of a layer in the report of connection id.
func (tr *trace) layer(t testing.TB, id uint64, name string) (uint64, int64) {
	t.Helper()
	for _, l := range tr.report.Connections[tr.reportOf(t, id)].Layers {
		if l.Layer == name {
			return l.Count, l.Bytes
		}
	}
	return 0, 0
}

// devEvents returns the dev_xmit or dev_recv events on h's veth.
func (tr *trace) devEvents(kind string, h netlab.Host, match func(ev) bool) (n, bytes, segs int64) {
	for _, e := range tr.events {
		if e.Event == kind && e.NetNS == h.NetNSInode && e.IfIndex == uint32(h.IfIndex) && (match == nil || match(e)) {
			n++
			bytes += e.Size
			segs += e.GSOSegs
		}
	}
	return
}

// unmap turns a v4-mapped IPv6 address (an AF_INET6 socket's IPv4 peer)
// into the IPv4 address on the wire.
func unmap(a netip.Addr) netip.Addr { return a.Unmap() }

// framesOf returns the frames of one direction of conn c, as seen from c's
// end: out = sent by c, in = sent to it.
func framesOf(frames []frame, c conn, out bool) []frame {
	var fs []frame
	l, r := c.Local, c.Remote
	for _, f := range frames {
		src := netip.AddrPortFrom(f.src, uint16(f.sport))
		dst := netip.AddrPortFrom(f.dst, uint16(f.dport))
		lu := netip.AddrPortFrom(unmap(l.Addr()), l.Port())
		ru := netip.AddrPortFrom(unmap(r.Addr()), r.Port())
		if f.udp != (c.Proto == "udp") {
			continue
		}
		if (out && src == lu && dst == ru) || (!out && src == ru && dst == lu) {
			fs = append(fs, f)
		}
	}
	return fs
}

// waitListening polls ss in h until something listens on TCP port p: the
// servers started here (nginx) say nothing when they are ready.
func waitListening(t *testing.T, h netlab.Host, p int, proto string) {
	t.Helper()
	flag := "-ltnH"
	if proto == "udp" {
		flag = "-lunH"
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, _ := exec.Command("ip", "netns", "exec", h.NS, "ss", flag, "sport", "= :"+strconv.Itoa(p)).Output()
		if strings.TrimSpace(string(out)) != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s port %d in %s after 20 s", proto, p, h.NS)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lineWaiter collects a process's output lines and waits for one.
type lineWaiter struct {
	mu    sync.Mutex
	lines []string
	ch    chan string
}

func newLineWaiter(r io.Reader) *lineWaiter {
	w := &lineWaiter{ch: make(chan string, 64)}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			w.mu.Lock()
			w.lines = append(w.lines, sc.Text())
			w.mu.Unlock()
			select {
			case w.ch <- sc.Text():
			default:
			}
		}
		close(w.ch)
	}()
	return w
}

func (w *lineWaiter) waitFor(t *testing.T, what string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-w.ch:
			if !ok {
				t.Fatalf("output ended before %q: %q", what, w.all())
			}
			if strings.Contains(l, what) {
				return
			}
		case <-timeout:
			t.Fatalf("no %q after 30 s: %q", what, w.all())
		}
	}
}

func (w *lineWaiter) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.lines...)
}

// stopProc ends a server the test started (SIGTERM) and waits for it.
func stopProc(cmd *exec.Cmd) {
	if cmd.ProcessState != nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
}

// openBugs names the comparisons that show a defect of magnet not fixed
// yet, and what it is. Such a comparison still runs and says what it
// found; while it fails, it is reported as skipped with its failure and
// the defect, so the rest of the suite guards what is already right. When
// a comparison here passes, the log says so: take it off the list.
var openBugs = map[string]string{}

// check runs one comparison of magnet with its ground truth as a subtest.
func check(t *testing.T, name string, fn func(t testing.TB)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		bug, open := openBugs[name]
		if !open {
			fn(t)
			return
		}
		x := &openCheck{T: t, bug: bug}
		defer x.finish()
		fn(x)
	})
}

// openCheck stands for the *testing.T of a comparison listed in openBugs:
// its failures are collected and reported as one skip.
type openCheck struct {
	*testing.T
	bug     string
	failed  []string
	stopped bool
}

func (x *openCheck) Error(args ...any) { x.failed = append(x.failed, fmt.Sprint(args...)) }
func (x *openCheck) Errorf(format string, args ...any) {
	x.failed = append(x.failed, fmt.Sprintf(format, args...))
}
func (x *openCheck) Fail()                             { x.failed = append(x.failed, "failed") }
func (x *openCheck) Failed() bool                      { return len(x.failed) > 0 }
func (x *openCheck) Fatal(args ...any)                 { x.Error(args...); x.FailNow() }
func (x *openCheck) Fatalf(format string, args ...any) { x.Errorf(format, args...); x.FailNow() }
func (x *openCheck) FailNow() {
	if len(x.failed) == 0 {
		x.failed = append(x.failed, "failed")
	}
	x.stopped = true
	x.T.Skipf("open defect (%s): %s", x.bug, strings.Join(x.failed, "; "))
}

func (x *openCheck) finish() {
	switch {
	case x.stopped:
	case len(x.failed) > 0:
		x.T.Skipf("open defect (%s): %s", x.bug, strings.Join(x.failed, "; "))
	default:
		x.T.Logf("passed this run although listed as an open defect (%s)", x.bug)
	}
}

// checkAccounted fails the test when the recorder wrote fewer events of a
// type than the BPF side produced, less those counted as lost: an event
// lost between the kernel and the file without a loss record.
func checkAccounted(t *testing.T, path string) (missed uint64) {
	t.Helper()
	rd, err := mgt.Open(path)
	if err != nil {
		t.Fatalf("open trace: %v", err)
	}
	defer rd.Close()
	inFile := map[string]uint64{}
	for {
		rec, err := rd.Next()
		if err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("read trace: %v", err)
		}
		if rec.Type != nil {
			inFile[rec.Type.Name]++
		}
	}
	sum := rd.Summary()
	if sum == nil {
		t.Fatalf("trace %s has no summary", path)
	}
	// Only the device and drop programs' skipped runs can make their
	// events differ from the witness's (tcp_probe's, the usual ones,
	// cannot).
	byProg, _ := sum.Extra["missed_by_program"].(map[string]any)
	for _, prog := range []string{"net_dev_queue", "net_dev_start_xmit", "netif_receive_skb", "kfree_skb"} {
		n, _ := byProg[prog].(float64)
		missed += uint64(n)
	}
	if sum.Missed != nil && *sum.Missed > 0 {
		t.Logf("program runs the kernel skipped: %d, by program %v; of the device and drop programs: %d", *sum.Missed, sum.Extra["missed_by_program"], missed)
	}
	produced, _ := sum.Extra["produced"].(map[string]any)
	lostBy, _ := sum.Extra["lost_by_type"].(map[string]any)
	if u := sum.Extra["unrecorded"]; u != nil {
		t.Logf("packets seen and not recorded, by reason: %v", u)
	}
	for name, v := range produced {
		p, _ := v.(float64)
		l, _ := lostBy[name].(float64)
		if uint64(p) != inFile[name]+uint64(l) || inFile[name] != sum.Events[name] {
			t.Errorf("%s: produced %d, in the file %d (the summary says %d), lost %d", name, uint64(p), inFile[name], sum.Events[name], uint64(l))
		} else if strings.HasPrefix(name, "dev_") {
			t.Logf("%s: produced %d = in the file %d + lost %d", name, uint64(p), inFile[name], uint64(l))
		}
	}
	return missed
}

// journey is a row of magnet export --table journeys: a data segment one
// end sent that the other end got, and the layers it was followed through
// (a layer's time is absent where it was not).
type journey struct {
	Conn     uint64 `json:"conn"`
	Peer     uint64 `json:"peer"`
	Seq      uint32 `json:"seq"`
	Payload  int64  `json:"payload"`
	DevRecv  *int64 `json:"dev_recv_ns"`
	SockRecv *int64 `json:"sock_recv_ns"`
}

// journeys exports the trace's journeys table.
func (tr *trace) journeys(t testing.TB) []journey {
	t.Helper()
	var js []journey
	dec := json.NewDecoder(bytes.NewReader(magnetOut(t, "export", "--table", "journeys", "-f", "jsonl", "-o", "-", tr.path)))
	for {
		var j journey
		if err := dec.Decode(&j); err == io.EOF {
			return js
		} else if err != nil {
			t.Fatalf("export --table journeys: %v", err)
		}
		js = append(js, j)
	}
}
