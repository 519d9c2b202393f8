// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"fmt"
	"net/netip"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// segHead is what a received segment's header says, as tcp_rcv records it
// and tshark reads it: raw sequence numbers and the window in bytes.
type segHead struct {
	seq, ack, wnd uint64
	payload       int
}

func (s segHead) String() string {
	return fmt.Sprintf("seq %d ack %d wnd %d len %d", s.seq, s.ack, s.wnd, s.payload)
}

// TestTCPRcvEqualsTshark: the segments an established sender receives
// (iperf3's ACKs through a 50 Mbit/s bottleneck, so the receiver's window
// grows as it autotunes) are its tcp_rcv records, in order, each with
// tshark's seq, ack, window and payload for a frame on the sender's veth;
// tshark scales the window by the factor it saw in the handshake, magnet
// by the one the kernel keeps. After the sender's close() (FIN_WAIT1,
// tcp_rcv_state_process) the records are sockops'. The frames with no
// record are those the kernel merged in the socket's backlog (no more than
// nstat counts) and the last ones, which reach the kernel's TIME_WAIT
// socket once the full socket closed.
func TestTCPRcvEqualsTshark(t *testing.T) {
	needRoot(t)
	needTools(t, "iperf3", "tcpdump", "tshark")
	lab := netlab.ForTest(t, netlab.Options{Name: "mgrcvwnd", RateMbit: 50})
	port := uniquePort()
	rec := startRecording(t, record.Config{Filters: record.Filters{Port: port}, Groups: event.DefaultGroups})
	srv := iperf3Server(t, lab, lab.Server, port)
	capt := startCapture(t, lab, lab.Client, fmt.Sprintf("tcp port %d", port))
	iperf3Client(t, lab, lab.Client, lab.Server.Addr, port, "-n", "4M")
	srv.Wait()
	waitClosed(t, lab, port)
	capt.stop(t)
	res := rec.stop(t)

	// The data connection: the client's end that sent the most.
	var data netip.AddrPort
	var id uint64
	var most int64
	for _, c := range conns(t, rec.path) {
		if c.NetNS == lab.Client.NetNSInode && c.Proto == "tcp" && int(c.Remote.Port()) == port && c.SentApp > most {
			data, id, most = c.Local, c.ID, c.SentApp
		}
	}
	if id == 0 {
		t.Fatal("no client connection to the server in the trace")
	}
	got := tcpRcvHeads(t, rec.path, id)
	if res.Lost != 0 {
		t.Fatalf("the recording lost %d events (%v): not complete, nothing to compare", res.Lost, res.LostBy)
	}
	// A run of a program the kernel skipped (its recursion guard: the
	// program was already running on the CPU, as when a softirq delivers
	// to the server's socket while the client's backlog is processed in
	// its thread) writes nothing, and is counted: tcp_probe's skipped runs
	// may leave frames with no tcp_rcv (beside other tests: 1 to 33 of
	// tcp_probe's runs missed in 12 of 104 runs, mostly other sockets':
	// once, 2 of the data connection's frames beyond the backlog's
	// merges). Other programs' skips do not touch tcp_rcv.
	probeMissed := res.MissedBy["tcp_probe"]
	if res.Missed != 0 {
		t.Logf("the kernel skipped %d runs of magnet's programs (%v), %d of tcp_probe", res.Missed, res.MissedBy, probeMissed)
	}
	want := tsharkIn(t, capt.path, data)
	windows := map[uint64]bool{}
	for _, s := range want {
		windows[s.wnd] = true
	}
	t.Logf("data connection %s (conn %d): %d tcp_rcv, %d frames in after the SYN-ACK, %d distinct windows", data, id, len(got), len(want), len(windows))
	if len(want) < 100 || len(windows) < 2 {
		t.Fatalf("%d segments with %d distinct windows: too few to test the window", len(want), len(windows))
	}
	// A segment that finds its socket owned by the application waits in
	// the backlog, where the kernel merges it into the one before
	// (tcp_add_backlog; counted in TCPBacklogCoalesce): the merged skb
	// carries the later frame's ack and window, so each record is the last
	// frame of its run, and the frames skipped are merged ones.
	coalesced := nstatCounter(t, lab.Command, lab.Client, "TcpExtTCPBacklogCoalesce")
	j, skipped := 0, 0
	for i, g := range got {
		for j < len(want) && want[j] != g {
			t.Logf("frame %d %v: no tcp_rcv (the next record is %d %v)", j, want[j], i, g)
			j++
			skipped++
		}
		if j == len(want) {
			t.Fatalf("tcp_rcv %d of %d (%v) is no frame tshark saw arrive after the one before it", i, len(got), g)
		}
		j++
	}
	t.Logf("%d frames skipped before the last record (merged in the backlog, or tcp_probe's runs skipped: %d), %d after it (the socket closed); the namespace's TCPBacklogCoalesce %d", skipped, probeMissed, len(want)-j, coalesced)
	if uint64(skipped) > coalesced+probeMissed {
		// Seen 1 run in 10 on a loaded host: one ACK frame that TCP
		// counted (TcpInSegs) has no tcp_rcv, was not merged, and no
		// program run was missed. In 10 other runs bpftrace's count of
		// tcp:tcp_probe firings per socket equalled magnet's records.
		// The same open question as device events missing under load
		// (docs/EVENTS.md).
		out, _ := lab.Command(lab.Client, "nstat", "-a").Output()
		t.Logf("known gap: %d frames have no tcp_rcv, %d more than the kernel merged in socket backlogs and skipped runs of tcp_probe; the client's counters:\n%s", skipped, uint64(skipped)-coalesced-probeMissed, out)
	}
}

// tcpRcvHeads reads the tcp_rcv records of one connection, in time order.
func tcpRcvHeads(t *testing.T, path string, conn uint64) []segHead {
	t.Helper()
	type timed struct {
		t uint64
		s segHead
	}
	var recs []timed
	eachRecord(t, path, func(rec trace.Record) {
		if rec.Type.Name != "tcp_rcv" || rec.Conn() != conn {
			return
		}
		s := segHead{payload: int(rec.Size())}
		var ok [3]bool
		s.seq, ok[0] = rec.Uint("seq")
		s.ack, ok[1] = rec.Uint("ack")
		s.wnd, ok[2] = rec.Uint("wnd")
		if ok != [3]bool{true, true, true} {
			t.Fatalf("tcp_rcv lacks seq, ack or wnd: %v", ok)
		}
		recs = append(recs, timed{rec.Time(), s})
	})
	// The recorder writes each CPU's records in order, CPUs interleaved.
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].t < recs[j].t })
	out := make([]segHead, len(recs))
	for i, r := range recs {
		out[i] = r.s
	}
	return out
}

// tsharkIn reads the frames a capture holds for local after the
// handshake's SYN-ACK, in capture order.
func tsharkIn(t *testing.T, pcap string, local netip.AddrPort) []segHead {
	t.Helper()
	out, err := exec.Command("tshark", "-r", pcap, "-n", "-T", "fields", "-E", "separator=,",
		"-e", "ip.src", "-e", "tcp.srcport", "-e", "ip.dst", "-e", "tcp.dstport",
		"-e", "tcp.flags.syn", "-e", "tcp.seq_raw", "-e", "tcp.ack_raw",
		"-e", "tcp.window_size", "-e", "tcp.len").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	var in []segHead
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, ",")
		if len(f) != 9 {
			t.Fatalf("tshark line %q", line)
		}
		if f[2]+":"+f[3] != local.String() || f[4] == "1" {
			continue
		}
		n := func(s string) uint64 {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				t.Fatalf("tshark line %q: %v", line, err)
			}
			return v
		}
		in = append(in, segHead{seq: n(f[5]), ack: n(f[6]), wnd: n(f[7]), payload: int(n(f[8]))})
	}
	return in
}
