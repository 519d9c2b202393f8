// SPDX-License-Identifier: Apache-2.0

package conformance_test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/witness"
)

// iperfResult is the part of iperf3 -J's output (the client's) compared:
// its own byte counts, and the server's, which it reports back.
type iperfResult struct {
	End struct {
		SumSent struct {
			Bytes       int64 `json:"bytes"`
			Retransmits int64 `json:"retransmits"`
			Packets     int64 `json:"packets"` // UDP
		} `json:"sum_sent"`
		SumReceived struct {
			Bytes       int64 `json:"bytes"`
			Packets     int64 `json:"packets"`      // UDP: the highest sequence number seen
			LostPackets int64 `json:"lost_packets"` // UDP: sequence numbers not seen
		} `json:"sum_received"`
	} `json:"end"`
	Error string `json:"error"`
}

// startIperf3Server starts a one-off iperf3 server in h and returns once
// it says it listens.
func startIperf3Server(t *testing.T, h netlab.Host, p int, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + h.NS, "iperf3", "-s", "-1", "--forceflush", "-p", strconv.Itoa(p)}, args...)...)
	so, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopProc(cmd) })
	newLineWaiter(so).waitFor(t, "Server listening on "+strconv.Itoa(p))
	return cmd
}

// runIperf3Client runs the client in h to completion and returns its
// report.
func runIperf3Client(t *testing.T, h netlab.Host, args ...string) iperfResult {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", h.NS, "iperf3", "-J"}, args...)...).Output()
	var res iperfResult
	if jerr := json.Unmarshal(out, &res); jerr != nil || err != nil || res.Error != "" {
		t.Fatalf("iperf3 %s: %v %v %s\n%s", strings.Join(args, " "), err, jerr, res.Error, out)
	}
	return res
}

// settled waits until no socket of port p in the lab is in a state other
// than TIME-WAIT (or LISTEN), and the qdiscs are empty: every packet of
// the scenario is on both sides of the wire. ss and tc are polled: no event
// says "the last FIN's ACK has been delivered".
func settled(t *testing.T, lab *netlab.Lab, p int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, h := range []netlab.Host{lab.Client, lab.Server} {
		for {
			out, _ := exec.Command("ip", "netns", "exec", h.NS, "ss", "-tanH", "state", "all", "( sport = :"+strconv.Itoa(p)+" or dport = :"+strconv.Itoa(p)+" )").Output()
			busy := false
			for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				f := strings.Fields(l)
				if len(f) > 0 && f[0] != "TIME-WAIT" && f[0] != "LISTEN" {
					busy = true
				}
			}
			q := run(t, "tc", "-n", h.NS, "-s", "qdisc", "show", "dev", h.Iface, "root")
			if !busy && strings.Contains(q, "backlog 0b 0p") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("port %d in %s not settled after 20 s:\n%s\n%s", p, h.NS, out, q)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestIperf3TCP sends 20 MiB with iperf3 over a 100 Mbit/s link, IPv4,
// IPv6 and an IPv4 client to iperf3's default dual-stack server (an
// AF_INET6 socket on [::] whose accepted sockets have v4-mapped
// addresses), and compares magnet's figures with iperf3's, tshark's on the
// server's veth, and nstat's of each namespace.
func TestIperf3TCP(t *testing.T) {
	need(t, "iperf3", "ss")
	const total = 20 << 20
	for i, sc := range []struct {
		name string
		bind func(*netlab.Lab) []string // the server's -B, if any
		to   func(*netlab.Lab) netip.Addr
		mss  int64 // MTU 1500 less IP and TCP headers and the timestamp option
		// queue, when set, shortens the client's tbf queue to this many
		// bytes, so that its qdisc drops and TCP retransmits.
		queue int
	}{
		{"ipv4_shallow_queue", func(l *netlab.Lab) []string { return []string{"-B", l.Server.Addr.String()} }, func(l *netlab.Lab) netip.Addr { return l.Server.Addr }, 1448, 100000},
		{"ipv6", func(l *netlab.Lab) []string { return []string{"-B", server6.String()} }, func(*netlab.Lab) netip.Addr { return server6 }, 1428, 0},
		{"ipv4_to_dual_stack", func(*netlab.Lab) []string { return nil }, func(l *netlab.Lab) netip.Addr { return l.Server.Addr }, 1448, 0},
	} {
		t.Run(sc.name, func(t *testing.T) {
			lab := newLab(t, "mgconf", 100)
			p := port(i)
			if sc.queue > 0 {
				run(t, "tc", "-n", lab.Client.NS, "qdisc", "replace", "dev", lab.Client.Iface, "root", "tbf",
					"rate", "100mbit", "burst", "65536", "limit", strconv.Itoa(sc.queue))
			}
			srv := startIperf3Server(t, lab.Server, p, sc.bind(lab)...)
			nsC0, nsS0 := nstat(t, lab.Client), nstat(t, lab.Server)
			_, _, drops0 := qdiscStats(t, lab.Client)
			capS := startCapture(t, lab.Server, "tcp port "+strconv.Itoa(p))
			wit := startWitness(t, lab, p)
			rec := record(t, append(everyFrame, "--port", strconv.Itoa(p))...)
			res := runIperf3Client(t, lab.Client, "-c", sc.to(lab).String(), "-p", strconv.Itoa(p), "-n", strconv.Itoa(total))
			srv.Wait()
			settled(t, lab, p)
			frames := capS.stop(t)
			tr := rec.stop(t)
			seen := wit.Stop(t)
			dC, dS := delta(nsC0, nstat(t, lab.Client)), delta(nsS0, nstat(t, lab.Server))
			_, _, drops1 := qdiscStats(t, lab.Client)
			checkTCPTransfer(t, tcpCheck{
				lab: lab, port: p, tr: tr, frames: frames, nsClient: dC, nsServer: dS, mss: sc.mss,
				sent: res.End.SumSent.Bytes, received: res.End.SumReceived.Bytes, total: total,
				appRetrans: res.End.SumSent.Retransmits, serverPID: srv.Process.Pid, serverComm: "iperf3",
				preamble:   37, // iperf3's cookie, written on each stream before the data it counts
				qdiscDrops: int64(drops1 - drops0), seen: seen,
			})
		})
	}
}

// tcpCheck is one TCP transfer from the lab's client to its server and its
// ground truth.
type tcpCheck struct {
	lab                *netlab.Lab
	port               int
	tr                 *trace
	frames             []frame // captured on the server's veth
	nsClient, nsServer map[string]uint64
	mss                int64
	// sent and received: the applications' own counts of the bulk
	// connection's payload; total: what was asked for.
	sent, received, total int64
	// appRetrans: the sender's own count of retransmitted segments
	// (iperf3 reads tcpi_total_retrans after its last write), -1 if none.
	appRetrans int64
	serverPID  int
	serverComm string
	// preamble: bytes the application writes on the bulk connection
	// besides those it counts.
	preamble int64
	// qdiscDrops: tc -s's drop count of the sender's root qdisc over the
	// transfer.
	qdiscDrops int64
	// download: the bulk data flows server to client (HTTP), not client
	// to server (iperf3).
	download bool
	// seen: what bpftrace on magnet's device and drop tracepoints saw
	// over the recording (startWitness).
	seen *witness.Counts
}

// bulk returns the two ends of the scenario's bulk connection: the client's
// and the server's socket that carried most data.
func (c tcpCheck) bulk(t testing.TB) (cli, srv conn) {
	t.Helper()
	var best int64 = -1
	for _, x := range c.tr.conns {
		if x.Proto == "tcp" && x.NetNS == c.lab.Client.NetNSInode && x.Remote.Port() == uint16(c.port) && x.Sent+x.Recv > best {
			cli, best = x, x.Sent+x.Recv
		}
	}
	if best < 0 {
		t.Fatalf("no client connection to port %d in the trace: %+v", c.port, c.tr.conns)
	}
	srv = c.tr.only(t, "the server end of the bulk connection", func(x conn) bool {
		return x.Proto == "tcp" && x.NetNS == c.lab.Server.NetNSInode && x.Local.Port() == uint16(c.port) &&
			x.Remote.Port() == cli.Local.Port()
	})
	return cli, srv
}

func checkTCPTransfer(t *testing.T, c tcpCheck) {
	cli, srv := c.bulk(t)
	sender, receiver := cli, srv
	senderNS, senderHost, receiverHost := c.nsClient, c.lab.Client, c.lab.Server
	if c.download {
		sender, receiver = srv, cli
		senderNS, senderHost, receiverHost = c.nsServer, c.lab.Server, c.lab.Client
	}
	// seenOf returns what the witness saw of end's tuple at hook on host's
	// veth: sent by end (out) or to it.
	seenOf := func(hook witness.Hook, host netlab.Host, end conn, out bool) map[witness.Frame]int {
		m := witness.Match{Hook: hook, NetNS: host.NetNSInode, IfIndex: host.IfIndex, Proto: 6, SPort: end.Local.Port(), DPort: end.Remote.Port()}
		if !out {
			m.SPort, m.DPort = m.DPort, m.SPort
		}
		return c.seen.FramesOf(m)
	}
	devCheck := func(what string, magnet witness.Tally, fs, tuple []frame, seen map[witness.Frame]int, recv bool) devWitness {
		return devWitness{what: what, magnet: magnet, fs: fs, tuple: tuple, seen: seen, recv: recv,
			witnessMissed: c.seen.Missed, magnetMissed: c.tr.missed}
	}
	// own returns the frames of end's tuple that end's socket sent (out)
	// or received, leaving out on the server's side those its listener
	// handles: the SYN and the ACK that completes the handshake arrive
	// before the accepted socket exists, and the SYN-ACK is sent by a
	// request socket.
	own := func(end conn, out bool) []frame {
		fs := framesOf(c.frames, end, out)
		if end.NetNS != c.lab.Server.NetNSInode {
			return fs
		}
		if !out {
			return withoutHandshake(fs)
		}
		var kept []frame
		for _, f := range fs {
			if f.flags&0x02 == 0 {
				kept = append(kept, f)
			}
		}
		return kept
	}

	// Socket layer: what the applications say they sent and received.
	// (iperf3's server counts what it read until the client's TEST_END,
	// then closes with data still unread: the connection ends in a reset,
	// and the receiver's count is below what was sent.)
	check(t, "socket_bytes_equal_app_counts", func(t testing.TB) {
		if c.sent != c.total {
			t.Fatalf("the application sent %d bytes, asked for %d: no ground truth", c.sent, c.total)
		}
		if sender.Sent != c.sent+c.preamble {
			t.Errorf("sender's sock_send bytes %d, the application sent %d + %d", sender.Sent, c.sent, c.preamble)
		}
		if receiver.Recv != c.received+c.preamble {
			t.Errorf("receiver's sock_recv bytes %d, the application received %d + %d", receiver.Recv, c.received, c.preamble)
		}
	})

	// TCP at close: conn_close reads tcp_sock's counters as the socket
	// reaches TCP_CLOSE. bytes_received is rcv_nxt's advance past the
	// peer's SYN (the data, and a FIN): the highest acknowledgment number
	// the end sent, relative to the peer's initial sequence number, less
	// the SYN's 1. bytes_acked is snd_una's advance: the highest
	// acknowledgment number the end took in (a reset's is not processed),
	// relative to its own initial sequence number, less 1 on the passive
	// end (tcp_create_openreq_child starts snd_una past the SYN) and not
	// on the active end (tcp_connect starts it at the SYN, and the
	// SYN-ACK's acknowledgment moves it by 1). An end whose application
	// closed first is handed to a TIME_WAIT mini socket as soon as an ACK
	// of its FIN comes alone (tcp_rcv_state_process, FIN_WAIT1 of an
	// orphan): the peer's FIN comes after TCP_CLOSE, and rcv_nxt never
	// counts it. iperf3's transfers end in a reset that races the
	// client's FIN, and which end took which FIN is not on one capture:
	// there only the data directions are compared (what the sender saw
	// acknowledged, what the receiver took in).
	check(t, "conn_close_bytes_equal_tshark_acks", func(t testing.TB) {
		for _, end := range []conn{sender, receiver} {
			e, ok := c.tr.closeOf(end.ID)
			if !ok {
				t.Errorf("no conn_close for %d (%s)", end.ID, end.Local)
				continue
			}
			acked, received := tcpAcks(c.frames, end, end.NetNS == c.lab.Client.NetNSInode)
			if (c.download || end == sender) && e.BytesAcked != uint64(acked) {
				t.Errorf("%s: conn_close bytes_acked %d; tshark's acknowledgment numbers say %d", end.Local, e.BytesAcked, acked)
			}
			if (c.download || end == receiver) && e.BytesReceived != uint64(received) {
				t.Errorf("%s: conn_close bytes_received %d; tshark's acknowledgment numbers say %d", end.Local, e.BytesReceived, received)
			}
		}
	})

	// Retransmissions: the kernel's own count of the sender's namespace
	// (TcpRetransSegs counts segments: a GSO packet of n segments sent
	// again counts n), the sender's tcpi_total_retrans, and magnet's.
	check(t, "retransmitted_segments_equal_nstat", func(t testing.TB) {
		var closeSum, reportSum uint64
		for _, x := range c.tr.conns {
			if x.NetNS != sender.NetNS || x.Proto != "tcp" {
				continue
			}
			if e, ok := c.tr.closeOf(x.ID); ok {
				closeSum += e.TotalRetrans
			}
			if r := c.tr.report.Connections[c.tr.reportOf(t, x.ID)]; r.TCP != nil {
				reportSum += r.TCP.RetransSegs
			}
		}
		want := senderNS["TcpRetransSegs"]
		if closeSum != want {
			t.Errorf("conn_close total_retrans over the sender's connections %d, nstat TcpRetransSegs %d", closeSum, want)
		}
		if reportSum != want {
			t.Errorf("report retransmitted_segments over the sender's connections %d, nstat TcpRetransSegs %d", reportSum, want)
		}
		// iperf3 reads tcpi_total_retrans when it has written its last
		// byte, with up to a send buffer still to send (and retransmit):
		// a lower bound, not the count at close.
		if c.appRetrans >= 0 {
			if e, _ := c.tr.closeOf(sender.ID); e.TotalRetrans < uint64(c.appRetrans) {
				t.Errorf("sender's conn_close total_retrans %d, below the tcpi_total_retrans %d the application read earlier", e.TotalRetrans, c.appRetrans)
			}
		}
		t.Logf("retransmitted segments: nstat %d, conn_close %d, report %d, app %d", want, closeSum, reportSum, c.appRetrans)
	})

	// Drops: every packet the sender's qdisc dropped (tc -s) is a drop
	// event on the sender's veth, with the qdisc's reason.
	check(t, "qdisc_drops_equal_tc", func(t testing.TB) {
		var n int64
		reasons := map[string]int{}
		for _, e := range c.tr.events {
			if e.Event == "drop" && e.NetNS == senderHost.NetNSInode && e.IfIndex == uint32(senderHost.IfIndex) {
				n++
				reasons[e.Reason]++
			}
		}
		if reasons["QDISC_DROP"] != int(n) {
			t.Errorf("drop events on the sender's veth %v: want only the qdisc's", reasons)
		}
		dropWitness(t, "QDISC_DROP drop events on the sender's veth", n,
			int64(c.seen.DropsOf(senderHost.NetNSInode, senderHost.IfIndex, "QDISC_DROP", c.port)),
			int64(c.seen.DropsOf(senderHost.NetNSInode, senderHost.IfIndex, "QDISC_DROP", 0)),
			c.qdiscDrops, c.seen.Missed, c.tr.missed)
	})

	// The report's drops: per connection, by the kernel's reason; over
	// the sender's connections the qdisc's are tc -s's, and host-wide too.
	check(t, "report_drops_equal_tc", func(t testing.TB) {
		var conns uint64
		for _, r := range c.tr.report.Connections {
			if r.Conn.NetNS == senderHost.NetNSInode {
				conns += r.Drops["QDISC_DROP"]
			}
		}
		seen := int64(c.seen.DropsOf(senderHost.NetNSInode, senderHost.IfIndex, "QDISC_DROP", c.port))
		seenAll := int64(c.seen.DropsOf(senderHost.NetNSInode, senderHost.IfIndex, "QDISC_DROP", 0))
		dropWitness(t, "report: QDISC_DROP over the sender's connections", int64(conns), seen, seenAll, c.qdiscDrops, c.seen.Missed, c.tr.missed)
		// Host-wide: the qdisc is the only one of the lab that drops.
		dropWitness(t, "report: QDISC_DROP host-wide", int64(c.tr.report.Drops["QDISC_DROP"]), seen, seenAll, c.qdiscDrops, c.seen.Missed, c.tr.missed)
	})

	// The device layer against tcpdump on the server's veth: the tap sees
	// the very skbs the device hooks see (GSO super-packets whole, as veth
	// passes them), after the qdisc on the way out. dev_xmit's size
	// includes the Ethernet header, dev_recv's does not (eth_type_trans
	// pulled it): frame.len = size + 14 there.
	check(t, "server_veth_frames_equal_tshark", func(t testing.TB) {
		var in, out []frame
		for _, f := range c.frames {
			if c.lab.Server.Addr == f.dst || server6 == f.dst {
				in = append(in, f)
			} else {
				out = append(out, f)
			}
		}
		on := func(hook witness.Hook) map[witness.Frame]int {
			return c.seen.FramesOf(witness.Match{Hook: hook, NetNS: c.lab.Server.NetNSInode, IfIndex: c.lab.Server.IfIndex, Proto: 6})
		}
		mn, mb, _ := c.tr.devEvents("dev_recv", c.lab.Server, nil)
		devCheck("dev_recv on the server's veth", witness.Tally{N: mn, Bytes: mb}, in, in, on(witness.Recv), true).check(t)
		mn, mb, _ = c.tr.devEvents("dev_xmit", c.lab.Server, nil)
		devCheck("dev_xmit on the server's veth", witness.Tally{N: mn, Bytes: mb}, out, out, on(witness.Xmit), false).check(t)
	})

	// Per connection, the report's device layers: the sender's dev_xmit
	// are the frames of its tuple toward the receiver (the same skbs cross
	// the veth pair), SYN and FIN included.
	check(t, "report_sender_dev_xmit_equals_tshark", func(t testing.TB) {
		mn, mb := c.tr.layer(t, sender.ID, "dev_xmit")
		devCheck("report: the sender's dev_xmit", witness.Tally{N: int64(mn), Bytes: mb}, own(sender, true),
			framesOf(c.frames, sender, true), seenOf(witness.Xmit, senderHost, sender, true), false).check(t)
	})

	// The receiver's dev_recv: the frames of its tuple toward it.
	check(t, "report_receiver_dev_recv_equals_tshark", func(t testing.TB) {
		mn, mb := c.tr.layer(t, receiver.ID, "dev_recv")
		devCheck("report: the receiver's dev_recv", witness.Tally{N: int64(mn), Bytes: mb}, own(receiver, false),
			framesOf(c.frames, receiver, false), seenOf(witness.Recv, receiverHost, receiver, false), true).check(t)
	})

	// Frame by frame: each dev_xmit of the sender is a frame of its tuple
	// tshark saw, by the TCP sequence number and length both carry, and
	// each frame of the tuple is one dev_xmit unless the witness did not
	// see it either (the kernel ran no program of net_dev_start_xmit for
	// it). A dev_xmit's gso_segs is the segments the frame is on a wire,
	// which tcp_set_skb_tso_segs() makes ceil(payload / mss), at least 1.
	check(t, "dev_xmit_frame_by_frame_equals_tshark", func(t testing.TB) {
		fs := own(sender, true)
		got := map[witness.Frame]int{}
		segsOf := map[witness.Frame]int64{}
		for _, f := range fs {
			segsOf[frameKey(f, false)] = max(1, (int64(f.tcpLen)+c.mss-1)/c.mss)
		}
		var segs, wire int64
		bad := 0
		for _, e := range c.tr.events {
			if e.Event != "dev_xmit" || e.Conn != sender.ID {
				continue
			}
			k := witness.Frame{Seq: e.Seq, Len: int(e.Size)}
			got[k]++
			want, ok := segsOf[k]
			segs += e.GSOSegs
			wire += want
			if ok && e.GSOSegs != want {
				if bad++; bad <= 5 {
					t.Errorf("dev_xmit seq %d size %d: gso_segs %d; tshark's frame is %d segments at MSS %d", e.Seq, e.Size, e.GSOSegs, want, c.mss)
				}
			}
		}
		if len(got) == 0 || len(fs) == 0 {
			t.Fatalf("no dev_xmit of the sender (%d) or no frame of its tuple (%d)", len(got), len(fs))
		}
		d := devCheck("the sender's dev_xmit frames", witness.Tally{}, fs, framesOf(c.frames, sender, true), seenOf(witness.Xmit, senderHost, sender, true), false)
		saw, _ := seenBy(d.fs, d.seen, false)
		for k, n := range got {
			d.magnet.N += int64(n)
			d.magnet.Bytes += int64(n * k.Len)
		}
		d.check(t)
		if notCaptured, _ := witness.Subtract(got, multiset(fs, false)); len(notCaptured) > 0 {
			t.Errorf("dev_xmit frames (seq, length) of the sender tcpdump did not capture: %v", notCaptured[:min(8, len(notCaptured))])
		}
		if d.witnessMissed == 0 && d.magnetMissed == 0 {
			magnetOnly, witnessOnly := witness.Subtract(got, multiset(saw, false))
			if len(magnetOnly) > 0 || len(witnessOnly) > 0 {
				t.Errorf("dev_xmit frames (seq, length) magnet has and the witness did not see in tshark's: %v; the other way: %v",
					magnetOnly[:min(8, len(magnetOnly))], witnessOnly[:min(8, len(witnessOnly))])
			}
		}
		t.Logf("%d frames, %d wire segments (sum of gso_segs %d)", d.magnet.N, wire, segs)
	})

	// Every data packet the sender's device handed over (a departure the
	// report follows: one whose tcp_xmit it paired with its device
	// events) is followed over the wire to the receiving application (one
	// recorder saw both ends: one clock), except, exactly:
	//   - data the application never read: iperf3's server closes its
	//     socket with data unread, so each departure not followed whose
	//     data ends past the receiver's read count (tshark's sequence
	//     numbers, relative, less the SYN's 1) is one;
	//   - a spurious retransmission: data the receiver had acknowledged
	//     before the frame passed the capture, which TCP drops as old;
	//   - a departure whose arrival the kernel ran no netif_receive_skb
	//     program for: it is matched at the peer only if its dev_recv
	//     exists, so the data departures not matched are at most the data
	//     frames the witness saw leave the sender and not arrive, and none
	//     when there is no such frame.
	check(t, "report_follows_every_data_packet", func(t testing.TB) {
		r := c.tr.report.Connections[c.tr.reportOf(t, sender.ID)]
		if r.Path == nil {
			t.Fatalf("the report follows no packet of the sender %d", sender.ID)
		}
		if r.Path.Peer != receiver.ID || r.Path.DataDeparted == 0 {
			t.Fatalf("peer %d (want %d), %d data packets departed", r.Path.Peer, receiver.ID, r.Path.DataDeparted)
		}
		var data []frame
		bySeq := map[uint32]frame{}
		for _, f := range own(sender, true) {
			if f.tcpLen > 0 {
				data = append(data, f)
				bySeq[f.seqRaw] = f
			}
		}
		departed, _ := seenBy(data, seenOf(witness.Xmit, senderHost, sender, true), false)
		_, notArrived := seenBy(departed, seenOf(witness.Recv, receiverHost, receiver, false), true)

		// dup: the data frames of the sender (by index in the capture)
		// that the receiver had acknowledged all of before the frame
		// passed the capture: a spurious retransmission, which TCP
		// drops as old data on arrival (no reader takes it as such).
		dup := map[uint32]bool{}
		var acked int64
		for _, f := range c.frames {
			switch direction(f, sender) {
			case -1:
				if f.flags&0x10 != 0 {
					acked = max(acked, f.ack-1)
				}
			case 1:
				if f.tcpLen > 0 && f.seq-1+int64(f.tcpLen) <= acked {
					dup[f.seqRaw] = true
				}
			}
		}
		// The journeys of the sender's data segments the receiver got.
		var matched, unread, dups uint64
		for _, j := range c.tr.journeys(t) {
			if j.Conn != sender.ID || j.Peer != receiver.ID {
				continue
			}
			matched++
			if j.SockRecv != nil {
				continue
			}
			f, ok := bySeq[j.Seq]
			if !ok {
				t.Errorf("a journey not followed to the reader, seq %d payload %d: no such data frame in tshark's", j.Seq, j.Payload)
				continue
			}
			if dup[j.Seq] {
				dups++
				continue
			}
			if end := f.seq - 1 + int64(f.tcpLen); end <= receiver.Recv {
				t.Errorf("a journey not followed to the reader: seq %d (relative %d) payload %d, within the %d bytes the application read",
					j.Seq, f.seq, j.Payload, receiver.Recv)
				continue
			}
			unread++
		}
		notMatched := r.Path.DataDeparted - matched
		if notMatched > uint64(len(notArrived)) {
			t.Errorf("%d data departures not matched at the peer; the witness saw %d data frames leave and not arrive (the kernel's skip): %s",
				notMatched, len(notArrived), describe(notArrived))
		}
		if r.Path.Segments != matched-unread-dups {
			t.Errorf("%d of %d data departures followed to the reader; %d matched at the peer, of which %d carry data the application never read and %d data already acknowledged",
				r.Path.Segments, r.Path.DataDeparted, matched, unread, dups)
		}
		t.Logf("data departures %d = followed %d + matched but never read %d + matched, already acknowledged %d + not matched %d (the witness saw %d data frames leave and not arrive)",
			r.Path.DataDeparted, r.Path.Segments, unread, dups, notMatched, len(notArrived))
	})

	// The send buffer: bytes written less bytes acknowledged. At the end
	// that is what the sender wrote less the data the receiver's highest
	// acknowledgment covers (on the wire, relative to the sender's
	// initial sequence number, less the SYN's 1, and not the FIN): 0
	// after an orderly close, what the reset left unacknowledged after
	// iperf3's.
	check(t, "report_send_buffer_equals_tshark_acks", func(t testing.TB) {
		r := c.tr.report.Connections[c.tr.reportOf(t, sender.ID)]
		var acked int64
		for _, f := range framesOf(c.frames, sender, false) {
			if f.flags&0x04 == 0 && f.flags&0x10 != 0 {
				acked = max(acked, f.ack-1)
			}
		}
		acked = min(acked, sender.Sent)
		if r.SendBuffer == nil || r.SendBuffer.Final != sender.Sent-acked || r.SendBuffer.Min < 0 || r.SendBuffer.Max > sender.Sent {
			t.Errorf("send buffer %+v; the sender wrote %d bytes, tshark's acknowledgments cover %d: want final %d, min >= 0, max <= %d",
				r.SendBuffer, sender.Sent, acked, sender.Sent-acked, sender.Sent)
		}
	})

	// Each connection's handshake reaches the listener: the SYN and the
	// handshake's last ACK arrive before the accepted socket exists, so
	// they are the listener's dev_recv. The server started before the
	// recording, so no hook ever has the listener's socket (the IP layer,
	// whose ingress hook had it, is not recorded): the recorder learned it
	// at start.
	check(t, "listener_dev_recv_equals_handshakes", func(t testing.TB) {
		l := c.tr.only(t, "the server's listener", func(x conn) bool {
			return x.Proto == "tcp" && x.NetNS == c.lab.Server.NetNSInode && x.Local.Port() == uint16(c.port) && x.Remote.Port() == 0
		})
		// Each connection's SYN and the first pure ACK after it, as the
		// listener's veth received them.
		var in, hs []frame
		syns := 0
		state := map[int]int{} // by client port: 1 after the SYN, 2 after its ACK
		for _, f := range c.frames {
			if f.udp || f.dport != c.port {
				continue
			}
			in = append(in, f)
			switch {
			case f.flags&0x12 == 0x02:
				syns++
				state[f.sport] = 1
				hs = append(hs, f)
			case state[f.sport] == 1 && f.tcpLen == 0 && f.flags&0x17 == 0x10:
				state[f.sport] = 2
				hs = append(hs, f)
			}
		}
		var got witness.Tally
		for _, e := range c.tr.events {
			if e.Event == "dev_recv" && e.Conn == l.ID {
				got.N++
				got.Bytes += e.Size
			}
		}
		if syns == 0 || len(hs) != 2*syns {
			t.Fatalf("tshark: %d SYNs to port %d and %d handshake frames: want a SYN and an ACK each", syns, c.port, len(hs))
		}
		devCheck(fmt.Sprintf("listener %d's dev_recv (%d handshakes)", l.ID, syns), got, hs, in,
			c.seen.FramesOf(witness.Match{Hook: witness.Recv, NetNS: c.lab.Server.NetNSInode, IfIndex: c.lab.Server.IfIndex, Proto: 6, DPort: uint16(c.port)}), true).check(t)
	})

	// The listening socket belongs to the server process.
	check(t, "listener_owner", func(t testing.TB) {
		l := c.tr.only(t, "the server's listener", func(x conn) bool {
			return x.Proto == "tcp" && x.NetNS == c.lab.Server.NetNSInode && x.Local.Port() == uint16(c.port) && x.Remote.Port() == 0
		})
		if int(l.PID) != c.serverPID || l.Comm != c.serverComm {
			t.Errorf("listener %d owned by pid %d %q, the server is pid %d %q", l.ID, l.PID, l.Comm, c.serverPID, c.serverComm)
		}
	})
}

// withoutHandshake drops a connection's SYN and the first pure ACK after
// it from the frames a client sent.
func withoutHandshake(fs []frame) []frame {
	var out []frame
	dropped := 0
	for _, f := range fs {
		if dropped < 2 && (f.flags&0x02 != 0 || (dropped == 1 && f.tcpLen == 0 && f.flags&0x10 != 0)) {
			dropped++
			continue
		}
		out = append(out, f)
	}
	return out
}

// direction says whether frame f was sent by end (+1), to it (-1), or
// belongs to another connection (0).
func direction(f frame, end conn) int {
	if f.udp != (end.Proto == "udp") {
		return 0
	}
	src := netip.AddrPortFrom(f.src, uint16(f.sport))
	dst := netip.AddrPortFrom(f.dst, uint16(f.dport))
	l := netip.AddrPortFrom(end.Local.Addr().Unmap(), end.Local.Port())
	r := netip.AddrPortFrom(end.Remote.Addr().Unmap(), end.Remote.Port())
	switch {
	case src == l && dst == r:
		return 1
	case src == r && dst == l:
		return -1
	}
	return 0
}

// tcpAcks returns what end's bytes_acked and bytes_received must be at
// TCP_CLOSE, from the acknowledgment numbers in the capture (see
// conn_close_bytes_equal_tshark_acks). Every application here closes its
// socket (an orphan once its FIN is sent).
func tcpAcks(frames []frame, end conn, active bool) (acked, received int64) {
	syn := int64(1)
	if active {
		syn = 0
	}
	finSeq := int64(-1)
	peerFIN, orphanedFirst, decided := false, false, false
	for _, f := range frames {
		switch direction(f, end) {
		case 1:
			if f.flags&0x10 != 0 {
				received = max(received, f.ack-1)
			}
			if f.flags&0x01 != 0 && finSeq < 0 {
				finSeq = f.seq + int64(f.tcpLen)
			}
		case -1:
			if f.flags&0x04 == 0 && f.flags&0x10 != 0 {
				acked = max(acked, f.ack-syn)
			}
			if f.flags&0x01 != 0 {
				peerFIN = true
				decided = true
			}
			if !decided && finSeq >= 0 && f.flags&0x10 != 0 && f.ack > finSeq {
				orphanedFirst, decided = true, true
			}
		}
	}
	if peerFIN && orphanedFirst {
		received-- // the peer's FIN, taken by the TIME_WAIT socket
	}
	return acked, received
}
