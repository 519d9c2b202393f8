// SPDX-License-Identifier: Apache-2.0

// Package witness runs bpftrace on the kernel tracepoints magnet's device
// and drop programs attach to (net:net_dev_queue, net:net_dev_start_xmit,
// net:netif_receive_skb, skb:kfree_skb), beside a test, as ground truth
// magnet did not compute: which packets of a port, on which device, a
// program on those tracepoints could see. Under load the kernel now and
// then runs no program of these tracepoints for a packet tcpdump captures
// on the same device (docs/EVENTS.md, Loss accounting); a test then
// asserts magnet = witness, and tcpdump − magnet = tcpdump − witness,
// which is the kernel's skip.
//
// bpftrace's programs are perf tracepoint programs, which the kernel also
// skips while another BPF program of that kind runs on the CPU; it counts
// those skips in the programs' recursion_misses, which Counts.Missed
// carries, so a test can tell that case apart.
package witness

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/bits"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// Hook is a tracepoint the witness counts packets on.
type Hook uint8

// The tracepoints of magnet's device events.
const (
	Queue Hook = 1 // net:net_dev_queue: dev_queue
	Xmit  Hook = 2 // net:net_dev_start_xmit: dev_xmit
	Recv  Hook = 3 // net:netif_receive_skb: dev_recv
)

var hookTracepoints = map[Hook]string{Queue: "net_dev_queue", Xmit: "net_dev_start_xmit", Recv: "netif_receive_skb"}

// Options says what the witness counts.
type Options struct {
	// NetNS: the inodes of the network namespaces whose devices count.
	NetNS []uint32
	// Port: a TCP or UDP port; packets with it at either end count.
	Port int
	// Hooks: the tracepoints counted; none means Xmit and Recv.
	Hooks []Hook
	// Frames: also count each packet by its TCP sequence number and
	// length, for frame-by-frame comparisons.
	Frames bool
	// Drops: also count skb:kfree_skb of packets on the namespaces'
	// devices, of every port, by the kernel's drop reason.
	Drops bool
}

// Key is one class of packets a hook saw: on which device, which way.
type Key struct {
	Hook         Hook
	NetNS        uint32
	IfIndex      int
	Proto        uint8 // 6 TCP, 17 UDP
	SPort, DPort uint16
}

// Tally is a count of packets and of their bytes (skb->len at the
// tracepoint: dev_xmit's size includes the link-layer header, dev_recv's
// does not, as in magnet's events).
type Tally struct{ N, Bytes int64 }

// Frame is one packet as the frame-by-frame counts key it: its TCP
// sequence number (host order; 0 for UDP) and skb->len.
type Frame struct {
	Seq uint32
	Len int
}

// DropKey is one class of drops: on which device, for what reason, of
// which ports (0 when the packet is not TCP or UDP over IP).
type DropKey struct {
	NetNS        uint32
	IfIndex      int
	Reason       string // enum skb_drop_reason without SKB_DROP_REASON_
	Proto        uint8
	SPort, DPort uint16
}

// Counts is what the witness saw.
type Counts struct {
	Packets map[Key]Tally
	Frames  map[Key]map[Frame]int // with Options.Frames
	Drops   map[DropKey]int       // with Options.Drops
	// Missed: runs of the witness's tracepoint programs the kernel
	// skipped (their recursion_misses), for any packet of the host.
	Missed uint64
}

// Match selects keys; a zero field matches any value.
type Match struct {
	Hook         Hook
	NetNS        uint32
	IfIndex      int
	Proto        uint8
	SPort, DPort uint16
}

func (m Match) matches(k Key) bool {
	return (m.Hook == 0 || m.Hook == k.Hook) && (m.NetNS == 0 || m.NetNS == k.NetNS) &&
		(m.IfIndex == 0 || m.IfIndex == k.IfIndex) && (m.Proto == 0 || m.Proto == k.Proto) &&
		(m.SPort == 0 || m.SPort == k.SPort) && (m.DPort == 0 || m.DPort == k.DPort)
}

// Sum adds up the packets of the keys m matches.
func (c *Counts) Sum(m Match) Tally {
	var t Tally
	for k, v := range c.Packets {
		if m.matches(k) {
			t.N += v.N
			t.Bytes += v.Bytes
		}
	}
	return t
}

// FramesOf returns how many times each frame was seen, over the keys m
// matches.
func (c *Counts) FramesOf(m Match) map[Frame]int {
	out := map[Frame]int{}
	for k, fs := range c.Frames {
		if m.matches(k) {
			for f, n := range fs {
				out[f] += n
			}
		}
	}
	return out
}

// DropsOf adds up the drops with reason on device ifindex of netns (0:
// any device) whose packets have port at either end (0: any packet).
func (c *Counts) DropsOf(netns uint32, ifindex int, reason string, port int) int {
	n := 0
	for k, v := range c.Drops {
		if k.NetNS == netns && (ifindex == 0 || k.IfIndex == ifindex) && k.Reason == reason &&
			(port == 0 || int(k.SPort) == port || int(k.DPort) == port) {
			n += v
		}
	}
	return n
}

// be16 is a port as a __be16 field reads on this host (little-endian).
func be16(p int) uint16 { return bits.ReverseBytes16(uint16(p)) }

// Script returns the bpftrace program for o. Each packet's headers are
// read from skb->head at the offsets the stack set (no IP options or IPv6
// extension headers: the labs send none).
func Script(o Options) string {
	var nsConds []string
	for _, ns := range o.NetNS {
		nsConds = append(nsConds, fmt.Sprintf("$ns == %d", ns))
	}
	nsCond := strings.Join(nsConds, " || ")
	if nsCond == "" {
		nsCond = "0"
	}
	// parse sets $proto and $t (the TCP or UDP header: the ports are at
	// the same offsets) of $s.
	const parse = `$l4 = (uint64)0; $proto = (uint8)0;
    if ($s->protocol == 8) { $ip = (struct iphdr *)($s->head + $s->network_header); $proto = $ip->protocol; $l4 = $s->network_header + 20; }
    if ($s->protocol == 56710) { $ip6 = (struct ipv6hdr *)($s->head + $s->network_header); $proto = $ip6->nexthdr; $l4 = $s->network_header + 40; }
    $t = (struct tcphdr *)($s->head + $l4);
`
	var b strings.Builder
	hooks := o.Hooks
	if len(hooks) == 0 {
		hooks = []Hook{Xmit, Recv}
	}
	p := be16(o.Port)
	for _, h := range hooks {
		key := fmt.Sprintf("%d, $ns, $s->dev->ifindex, $proto, $t->source, $t->dest", h)
		fmt.Fprintf(&b, "tracepoint:net:%s { $s = (struct sk_buff *)args->skbaddr; $ns = $s->dev->nd_net.net->ns.inum;\n  if (%s) {\n    %s", hookTracepoints[h], nsCond, parse)
		fmt.Fprintf(&b, "    if (($proto == 6 || $proto == 17) && ($t->source == %d || $t->dest == %d)) {\n", p, p)
		fmt.Fprintf(&b, "      @n[%s] = count(); @b[%s] = sum($s->len);\n", key, key)
		if o.Frames {
			fmt.Fprintf(&b, "      $seq = (uint32)0; if ($proto == 6) { $seq = $t->seq; }\n      @f[%s, $seq, $s->len] = count();\n", key)
		}
		b.WriteString("    } } }\n")
	}
	if o.Drops {
		// A packet freed with no device (a socket's, on its way in after
		// the device is let go, or out before one is chosen) counts in
		// its socket's namespace, with ifindex 0.
		fmt.Fprintf(&b, "tracepoint:skb:kfree_skb { $s = (struct sk_buff *)args->skbaddr; $ns = (uint32)0; $if = (int32)0;\n"+
			"  if ($s->dev != 0) { $ns = $s->dev->nd_net.net->ns.inum; $if = $s->dev->ifindex; }\n"+
			"  else { if ($s->sk != 0) { $ns = $s->sk->__sk_common.skc_net.net->ns.inum; } }\n"+
			"  if (%s) {\n    %s", nsCond, parse)
		b.WriteString("    $sp = (uint16)0; $dp = (uint16)0; if ($proto == 6 || $proto == 17) { $sp = $t->source; $dp = $t->dest; }\n")
		b.WriteString("    @d[$ns, $if, args->reason, $proto, $sp, $dp] = count(); } }\n")
	}
	// The interval probe, attached after the others, says when they are
	// all attached (its first tick), and its output wakes bpftrace's
	// event loop, which otherwise, with nothing to print, can sleep
	// through the SIGINT that tells it to stop.
	b.WriteString("interval:ms:100 { printf(\"tick\\n\"); }\n")
	return b.String()
}

var reMapLine = regexp.MustCompile(`^@(\w+)\[([^\]]*)\]: (\d+)$`)

// Parse reads what bpftrace printed at its end (its maps) into Counts.
// reasons names the kernel's drop reasons by value.
func Parse(out string, reasons map[int]string) (*Counts, error) {
	c := &Counts{Packets: map[Key]Tally{}, Frames: map[Key]map[Frame]int{}, Drops: map[DropKey]int{}}
	for _, line := range strings.Split(out, "\n") {
		m := reMapLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		var k []uint64
		for _, f := range strings.Split(m[2], ",") {
			v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("bpftrace line %q: %w", line, err)
			}
			k = append(k, v)
		}
		v, _ := strconv.ParseInt(m[3], 10, 64)
		want := map[string]int{"n": 6, "b": 6, "f": 8, "d": 6}[m[1]]
		if want == 0 {
			continue
		}
		if len(k) != want {
			return nil, fmt.Errorf("bpftrace line %q: %d keys, want %d", line, len(k), want)
		}
		if m[1] == "d" {
			reason, ok := reasons[int(k[2])]
			if !ok {
				reason = strconv.FormatUint(k[2], 10)
			}
			c.Drops[DropKey{NetNS: uint32(k[0]), IfIndex: int(k[1]), Reason: reason, Proto: uint8(k[3]),
				SPort: bits.ReverseBytes16(uint16(k[4])), DPort: bits.ReverseBytes16(uint16(k[5]))}] += int(v)
			continue
		}
		key := Key{Hook: Hook(k[0]), NetNS: uint32(k[1]), IfIndex: int(k[2]), Proto: uint8(k[3]),
			SPort: bits.ReverseBytes16(uint16(k[4])), DPort: bits.ReverseBytes16(uint16(k[5]))}
		switch m[1] {
		case "n":
			t := c.Packets[key]
			t.N += v
			c.Packets[key] = t
		case "b":
			t := c.Packets[key]
			t.Bytes += v
			c.Packets[key] = t
		case "f":
			if c.Frames[key] == nil {
				c.Frames[key] = map[Frame]int{}
			}
			c.Frames[key][Frame{Seq: bits.ReverseBytes32(uint32(k[6])), Len: int(k[7])}] += int(v)
		}
	}
	return c, nil
}

// Witness is a running bpftrace.
type Witness struct {
	cmd     *exec.Cmd
	out     *bufio.Reader
	reasons map[int]string
}

// need skips the test without root, bpftrace or bpftool, and fails it on
// CI, where scripts/deps.sh installs them.
func need(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the bpftrace witness needs root")
	}
	for _, tool := range []string{"bpftrace", "bpftool"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing on CI (scripts/deps.sh installs it)", tool)
			}
			t.Skipf("%s not installed (scripts/deps.sh installs it)", tool)
		}
	}
}

// Start runs bpftrace with o's script for the test and returns once every
// probe is attached.
func Start(t testing.TB, o Options) *Witness {
	t.Helper()
	need(t)
	w := &Witness{}
	if o.Drops {
		var err error
		if w.reasons, err = DropReasons(); err != nil {
			t.Fatal(err)
		}
	}
	// One key per frame of a transfer: far more than bpftrace's default
	// of 4096 keys a map.
	w.cmd, w.out = StartBpftrace(t, Script(o), "BPFTRACE_MAP_KEYS_MAX=1000000")
	return w
}

// StartBpftrace starts `bpftrace -e script` with env added to this
// process's, and returns once the script printed the line "tick": a
// script prints it from an interval probe, which bpftrace attaches after
// every other probe, so by then all of them are attached (bpftrace's own
// "Attaching" line comes too early). The process is killed when the test
// ends if it still runs.
func StartBpftrace(t testing.TB, script string, env ...string) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	if _, err := exec.LookPath("bpftrace"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("bpftrace is missing on CI (scripts/deps.sh installs it)")
		}
		t.Skip("bpftrace not installed (scripts/deps.sh installs it)")
	}
	cmd := exec.Command("bpftrace", "-e", script)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("bpftrace: %v", err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	out := bufio.NewReader(stdout)
	started := make(chan error, 1)
	go func() {
		for {
			l, err := out.ReadString('\n')
			if err != nil {
				started <- fmt.Errorf("bpftrace ended before its first tick: %w", err)
				return
			}
			if l == "tick\n" {
				started <- nil
				return
			}
		}
	}()
	select {
	case err := <-started:
		if err != nil {
			cmd.Wait()
			t.Fatalf("%v\n%s", err, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("bpftrace not attached after 60 s\n%s", stderr.String())
	}
	return cmd, out
}

// Stop reads the skips of bpftrace's programs, ends it, and returns what
// it counted.
func (w *Witness) Stop(t testing.TB) *Counts {
	t.Helper()
	missed, err := w.missed()
	if err != nil {
		t.Fatalf("bpftrace's programs: %v", err)
	}
	out := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(w.out)
		out <- b
	}()
	var b []byte
	for try := 0; b == nil; try++ {
		if try == 3 {
			w.cmd.Process.Kill()
			t.Fatal("bpftrace did not stop on SIGINT")
		}
		w.cmd.Process.Signal(os.Interrupt)
		select {
		case b = <-out:
		case <-time.After(20 * time.Second):
		}
	}
	if err := w.cmd.Wait(); err != nil {
		t.Fatalf("bpftrace: %v\n%s", err, b)
	}
	c, err := Parse(string(b), w.reasons)
	if err != nil {
		t.Fatal(err)
	}
	c.Missed = missed
	var n int64
	for _, v := range c.Packets {
		n += v.N
	}
	t.Logf("witness: %d packets of the port on the tracepoints, %d drops keys; its programs' runs the kernel skipped (recursion_misses): %d", n, len(c.Drops), missed)
	return c
}

// missed sums the recursion_misses of bpftrace's tracepoint programs,
// found through the perf events it attached them with (bpftool perf).
func (w *Witness) missed() (uint64, error) {
	out, err := exec.Command("bpftool", "perf", "-j").Output()
	if err != nil {
		return 0, fmt.Errorf("bpftool perf: %w", err)
	}
	var links []struct {
		PID    int    `json:"pid"`
		ProgID uint32 `json:"prog_id"`
		FdType string `json:"fd_type"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		return 0, fmt.Errorf("bpftool perf: %w", err)
	}
	var total uint64
	n := 0
	for _, l := range links {
		// bpftool names the thread that holds the event: one of
		// bpftrace's.
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/task/%d", w.cmd.Process.Pid, l.PID)); err != nil || l.FdType != "tracepoint" {
			continue
		}
		p, err := ebpf.NewProgramFromID(ebpf.ProgramID(l.ProgID))
		if err != nil {
			return 0, fmt.Errorf("program %d: %w", l.ProgID, err)
		}
		s, err := p.Stats()
		p.Close()
		if err != nil {
			return 0, fmt.Errorf("program %d statistics: %w", l.ProgID, err)
		}
		total += s.RecursionMisses
		n++
	}
	if n == 0 {
		return 0, fmt.Errorf("bpftool perf lists no tracepoint of bpftrace (pid %d)", w.cmd.Process.Pid)
	}
	return total, nil
}

// DropReasons names the values of the kernel's enum skb_drop_reason (from
// its BTF) without the SKB_DROP_REASON_ prefix, as magnet's events do.
func DropReasons() (map[int]string, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, fmt.Errorf("kernel BTF: %w", err)
	}
	var e *btf.Enum
	if err := spec.TypeByName("skb_drop_reason", &e); err != nil {
		return nil, fmt.Errorf("enum skb_drop_reason in the kernel's BTF: %w", err)
	}
	m := map[int]string{}
	for _, v := range e.Values {
		m[int(v.Value)] = strings.TrimPrefix(v.Name, "SKB_DROP_REASON_")
	}
	return m, nil
}

// Subtract returns the frames of a (by how many times each was seen) that
// b does not have, and those of b that a does not have.
func Subtract(a, b map[Frame]int) (aOnly, bOnly []Frame) {
	for f, n := range a {
		for range n - b[f] {
			aOnly = append(aOnly, f)
		}
	}
	for f, n := range b {
		for range n - a[f] {
			bOnly = append(bOnly, f)
		}
	}
	sort := func(fs []Frame) {
		slices.SortFunc(fs, func(x, y Frame) int {
			if x.Seq != y.Seq {
				return int(int64(x.Seq) - int64(y.Seq))
			}
			return x.Len - y.Len
		})
	}
	sort(aOnly)
	sort(bOnly)
	return aOnly, bOnly
}
