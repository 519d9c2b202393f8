// SPDX-License-Identifier: Apache-2.0

package conformance_test

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/witness"
)

// TestIperf3UDP sends 10 MiB of 1,400-byte datagrams with iperf3 -u at
// 200 Mbit/s into a 100 Mbit/s link with a short queue, to a server with a
// small receive buffer: the client's qdisc drops and the server's socket
// overflows. magnet's datagram, frame and drop counts are compared with
// iperf3's, tshark's on the server's veth, tc -s's and nstat's.
func TestIperf3UDP(t *testing.T) {
	need(t, "iperf3", "ss", "nsenter")
	const total, size = 10 << 20, 1400
	lab := newLab(t, "mgconfu", 100)
	p := port(4)
	// A queue of a few datagrams: the client's socket buffer (-w 32K)
	// would otherwise hold the sender back before netlab's 50 ms queue
	// fills, and the qdisc would drop nothing.
	run(t, "tc", "-n", lab.Client.NS, "qdisc", "replace", "dev", lab.Client.Iface, "root", "tbf",
		"rate", "100mbit", "burst", "65536", "limit", "8000")
	srv := startIperf3Server(t, lab.Server, p)
	nsC0, nsS0 := nstat(t, lab.Client), nstat(t, lab.Server)
	_, _, drops0 := qdiscStats(t, lab.Client)
	capS := startCapture(t, lab.Server, "udp port "+strconv.Itoa(p))
	wit := startWitness(t, lab, p)
	rec := record(t, "--port", strconv.Itoa(p))
	res := runIperf3Client(t, lab.Client, "-c", lab.Server.Addr.String(), "-p", strconv.Itoa(p), "-u", "-b", "200M",
		"-l", strconv.Itoa(size), "-n", strconv.Itoa(total), "-w", "32K")
	srv.Wait()
	settled(t, lab, p)
	frames := capS.stop(t)
	tr := rec.stop(t)
	seen := wit.Stop(t)
	dC, dS := delta(nsC0, nstat(t, lab.Client)), delta(nsS0, nstat(t, lab.Server))
	_, _, drops1 := qdiscStats(t, lab.Client)
	qdrops := int64(drops1 - drops0)
	t.Logf("iperf3: sent %d datagrams, %d bytes; the server counted %d lost of %d; tc drops %d; client %v; server UdpInDatagrams %d UdpRcvbufErrors %d UdpNoPorts %d",
		res.End.SumSent.Packets, res.End.SumSent.Bytes, res.End.SumReceived.LostPackets, res.End.SumReceived.Packets, qdrops,
		map[string]uint64{"UdpOutDatagrams": dC["UdpOutDatagrams"], "UdpSndbufErrors": dC["UdpSndbufErrors"]},
		dS["UdpInDatagrams"], dS["UdpRcvbufErrors"], dS["UdpNoPorts"])

	udp := func(h netlab.Host) []conn {
		return tr.find(func(c conn) bool { return c.Proto == "udp" && c.NetNS == h.NetNSInode })
	}
	clients, servers := udp(lab.Client), udp(lab.Server)

	// iperf3's client counts the datagrams it sent (each send call
	// succeeds, also when the qdisc drops the datagram: without
	// IP_RECVERR the kernel counts UdpSndbufErrors and returns the
	// length), and sends one 4-byte datagram before them to open the
	// stream.
	check(t, "client_sends_equal_iperf3", func(t testing.TB) {
		// iperf3 sends whole datagrams until it has sent at least -n.
		if res.End.SumSent.Bytes != res.End.SumSent.Packets*size || res.End.SumSent.Bytes < total {
			t.Fatalf("iperf3 sent %d datagrams, %d bytes, asked for %d: no ground truth", res.End.SumSent.Packets, res.End.SumSent.Bytes, total)
		}
		var n, b int64
		for _, c := range clients {
			for _, e := range tr.events {
				if e.Conn == c.ID && e.Event == "sock_send" && e.Size > 0 {
					n++
					b += e.Size
				}
			}
		}
		if n != res.End.SumSent.Packets+1 || b != res.End.SumSent.Bytes+4 {
			t.Errorf("client's sock_send: %d calls, %d bytes; iperf3 sent %d datagrams, %d bytes, + its 4-byte hello", n, b, res.End.SumSent.Packets, res.End.SumSent.Bytes)
		}
		// UdpOutDatagrams counts the datagrams the device layer took,
		// UdpSndbufErrors those the qdisc refused.
		if uint64(n) != dC["UdpOutDatagrams"]+dC["UdpSndbufErrors"] {
			t.Errorf("client's sock_send calls %d; nstat UdpOutDatagrams %d + UdpSndbufErrors %d", n, dC["UdpOutDatagrams"], dC["UdpSndbufErrors"])
		}
	})

	// The server: every datagram the kernel delivered to a socket
	// (UdpInDatagrams) is one sock_recv, and iperf3 read them all.
	check(t, "server_receives_equal_nstat", func(t testing.TB) {
		var n, b int64
		for _, c := range servers {
			for _, e := range tr.events {
				if e.Conn == c.ID && e.Event == "sock_recv" && e.Size > 0 {
					n++
					b += e.Size
				}
			}
		}
		got := res.End.SumReceived.Packets - res.End.SumReceived.LostPackets
		if uint64(n) != dS["UdpInDatagrams"] {
			t.Errorf("server's sock_recv calls %d, nstat UdpInDatagrams %d", n, dS["UdpInDatagrams"])
		}
		if n != got+1 || b != got*size+4 {
			t.Errorf("server's sock_recv: %d calls, %d bytes; iperf3 received %d datagrams of %d bytes, + the 4-byte hello", n, b, got, size)
		}
	})

	// Drops: the client's qdisc (tc -s, and UdpSndbufErrors, which the
	// kernel counts for each datagram the qdisc refused) and the server's
	// full receive buffer (UdpRcvbufErrors).
	check(t, "drops_equal_tc_and_nstat", func(t testing.TB) {
		var qdisc, rcvbuf int64
		for _, e := range tr.events {
			if e.Event != "drop" {
				continue
			}
			if e.NetNS == lab.Client.NetNSInode && e.IfIndex == uint32(lab.Client.IfIndex) && e.Reason == "QDISC_DROP" {
				qdisc++
			}
			if e.NetNS == lab.Server.NetNSInode && e.Reason == "SOCKET_RCVBUFF" {
				rcvbuf++
			}
		}
		if qdrops == 0 {
			t.Errorf("the client's qdisc dropped nothing: the check compares nothing")
		}
		if uint64(qdrops) != dC["UdpSndbufErrors"] {
			t.Errorf("tc -s qdisc %d; nstat UdpSndbufErrors %d", qdrops, dC["UdpSndbufErrors"])
		}
		dropWitness(t, "QDISC_DROP drop events on the client's veth", qdisc,
			int64(seen.DropsOf(lab.Client.NetNSInode, lab.Client.IfIndex, "QDISC_DROP", p)),
			int64(seen.DropsOf(lab.Client.NetNSInode, lab.Client.IfIndex, "QDISC_DROP", 0)), qdrops, seen.Missed, tr.missed)
		dropWitness(t, "SOCKET_RCVBUFF drop events in the server (nstat UdpRcvbufErrors)", rcvbuf,
			int64(seen.DropsOf(lab.Server.NetNSInode, 0, "SOCKET_RCVBUFF", p)),
			int64(seen.DropsOf(lab.Server.NetNSInode, 0, "SOCKET_RCVBUFF", 0)), int64(dS["UdpRcvbufErrors"]), seen.Missed, tr.missed)
		t.Logf("drops: qdisc %d (tc %d), receive buffer %d (nstat %d)", qdisc, qdrops, rcvbuf, dS["UdpRcvbufErrors"])
	})

	// The report's drops by reason: the qdisc's on the client's socket,
	// the receive buffer's on the server's, and host-wide.
	check(t, "report_drops_equal_tc_and_nstat", func(t testing.TB) {
		var qdisc, rcvbuf uint64
		for _, r := range tr.report.Connections {
			switch r.Conn.NetNS {
			case lab.Client.NetNSInode:
				qdisc += r.Drops["QDISC_DROP"]
			case lab.Server.NetNSInode:
				rcvbuf += r.Drops["SOCKET_RCVBUFF"]
			}
		}
		host := tr.report.Drops
		r, rAll := int64(seen.DropsOf(lab.Server.NetNSInode, 0, "SOCKET_RCVBUFF", p)), int64(seen.DropsOf(lab.Server.NetNSInode, 0, "SOCKET_RCVBUFF", 0))
		dropWitness(t, "report: SOCKET_RCVBUFF on the server's sockets (nstat UdpRcvbufErrors)", int64(rcvbuf), r, rAll, int64(dS["UdpRcvbufErrors"]), seen.Missed, tr.missed)
		dropWitness(t, "report: SOCKET_RCVBUFF host-wide (nstat UdpRcvbufErrors)", int64(host["SOCKET_RCVBUFF"]), r, rAll, int64(dS["UdpRcvbufErrors"]), seen.Missed, tr.missed)
		q, qAll := int64(seen.DropsOf(lab.Client.NetNSInode, lab.Client.IfIndex, "QDISC_DROP", p)), int64(seen.DropsOf(lab.Client.NetNSInode, lab.Client.IfIndex, "QDISC_DROP", 0))
		dropWitness(t, "report: QDISC_DROP on the client's sockets", int64(qdisc), q, qAll, qdrops, seen.Missed, tr.missed)
		dropWitness(t, "report: QDISC_DROP host-wide", int64(host["QDISC_DROP"]), q, qAll, qdrops, seen.Missed, tr.missed)
	})

	// Every datagram on the server's veth is a dev_recv, of the server's
	// socket that took the client's stream: iperf3 connects its listening
	// socket to the client after the hello and opens a new one on the
	// same port, so from then on the connected socket's tuple is the one
	// that matches.
	check(t, "server_dev_recv_equals_tshark", func(t testing.TB) {
		var in []frame
		for _, f := range frames {
			if f.dst == lab.Server.Addr {
				in = append(in, f)
			}
		}
		// The recording's --port also selects iperf3's TCP control
		// connection, on the same port; the capture (udp port P) does
		// not. Every dev_recv of the server's veth is one or the other.
		protoOf := map[uint64]string{}
		for _, c := range tr.conns {
			protoOf[c.ID] = c.Proto
		}
		mn, mb, _ := tr.devEvents("dev_recv", lab.Server, func(e ev) bool { return protoOf[e.Conn] == "udp" })
		recvd := seen.FramesOf(witness.Match{Hook: witness.Recv, NetNS: lab.Server.NetNSInode, IfIndex: lab.Server.IfIndex, Proto: 17})
		dw := devWitness{what: "UDP dev_recv on the server's veth", magnet: witness.Tally{N: mn, Bytes: mb}, fs: in, tuple: in, seen: recvd,
			recv: true, witnessMissed: seen.Missed, magnetMissed: tr.missed}
		skipped := dw.check(t)
		n, b := int64(len(in)-len(skipped)), tally(in, true).Bytes-tally(skipped, true).Bytes
		// The sender's side: the datagrams that left the client are its
		// UdpOutDatagrams, each a net_dev_start_xmit the witness saw
		// unless the kernel skipped it, and each a dev_xmit, the
		// stream's first included: iperf3's 4-byte hello (a frame of 46
		// bytes), whose socket, bound by connect() (an autobind, which
		// runs no post_bind program), has no cookie yet when the
		// datagram reaches the device (the device program takes it).
		xmit := map[witness.Frame]int{}
		for _, e := range tr.events {
			if e.Event == "dev_xmit" && e.NetNS == lab.Client.NetNSInode && e.IfIndex == uint32(lab.Client.IfIndex) && protoOf[e.Conn] == "udp" {
				xmit[witness.Frame{Len: int(e.Size)}]++
			}
		}
		xseen := seen.FramesOf(witness.Match{Hook: witness.Xmit, NetNS: lab.Client.NetNSInode, IfIndex: lab.Client.IfIndex, Proto: 17})
		if seen.Missed == 0 && tr.missed == 0 {
			magnetOnly, witnessOnly := witness.Subtract(xmit, xseen)
			if len(magnetOnly) > 0 || len(witnessOnly) > 0 {
				t.Errorf("the client's UDP dev_xmit (by length) the witness did not see: %v; the witness saw and magnet has none of: %v", magnetOnly, witnessOnly)
			}
		}
		var xn int
		for _, n := range xseen {
			xn += n
		}
		t.Logf("the client's UDP dev_xmit: witness %d; its UdpOutDatagrams: %d", xn, dC["UdpOutDatagrams"])
		control, _, _ := tr.devEvents("dev_recv", lab.Server, func(e ev) bool { return protoOf[e.Conn] == "tcp" })
		all, _, _ := tr.devEvents("dev_recv", lab.Server, nil)
		if control == 0 || all != mn+control {
			t.Errorf("dev_recv on the server's veth: %d, of which UDP %d and iperf3's TCP control connection %d: want no other", all, mn, control)
		}
		var stream conn
		for _, c := range servers {
			if c.Recv > stream.Recv {
				stream = c
			}
		}
		cli := in[len(in)-1]
		want := netip.AddrPortFrom(cli.src, uint16(cli.sport))
		if stream.Local.Port() != uint16(p) || netip.AddrPortFrom(stream.Remote.Addr().Unmap(), stream.Remote.Port()) != want {
			t.Errorf("the server's stream socket %d is %s → %s; tshark says %s:%d ← %s", stream.ID, stream.Local, stream.Remote, lab.Server.Addr, p, want)
		}
		sn, sb := tr.layer(t, stream.ID, "dev_recv")
		if seen.Missed == 0 && tr.missed == 0 && (int64(sn) != n || sb != b) {
			t.Errorf("report: the server's stream socket's dev_recv %d, %d bytes; tshark's frames the witness saw: %d, %d bytes", sn, sb, n, b)
		}
	})

	// Every UDP socket of the scenario was closed before the recording
	// ended (iperf3 exited), and each has its conn_close.
	check(t, "udp_sockets_closed", func(t testing.TB) {
		for _, c := range append(clients, servers...) {
			if _, ok := tr.closeOf(c.ID); !ok {
				t.Errorf("UDP socket %d (%s → %s, pid %d %s) has no conn_close", c.ID, c.Local, c.Remote, c.PID, c.Comm)
			}
		}
		if len(servers) != 2 {
			t.Errorf("%d UDP sockets in the server, want iperf3's 2 (the one it connected to the client and its new listener): %+v", len(servers), servers)
		}
	})
}

// TestUDPNoPorts sends datagrams to a port nothing listens on: the
// kernel counts each in UdpNoPorts and frees it with the reason
// NO_SOCKET. The recording is of the server's namespace only (--netns),
// so that device events and drops no socket owns are recorded.
func TestUDPNoPorts(t *testing.T) {
	need(t)
	const n = 25
	lab := newLab(t, "mgconfp", 0)
	p := port(8)
	ns0 := nstat(t, lab.Server)
	capS := startCapture(t, lab.Server, "udp port "+strconv.Itoa(p))
	wit := startWitness(t, lab, p)
	rec := record(t, "--netns", lab.Server.NS)
	var uc *net.UDPConn
	if err := lab.Client.Do(func() (err error) {
		uc, err = net.ListenUDP("udp4", nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(lab.Server.Addr, uint16(p)))
	for i := range n {
		if _, err := uc.WriteToUDP([]byte(fmt.Sprintf("datagram %d", i)), to); err != nil {
			t.Fatal(err)
		}
	}
	// Delivery on a veth runs in the sender's softirq; the counter is the
	// ground truth, polled until it has them all.
	deadline := time.Now().Add(10 * time.Second)
	for delta(ns0, nstat(t, lab.Server))["UdpNoPorts"] < n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	frames := capS.stop(t)
	tr := rec.stop(t)
	seen := wit.Stop(t)
	d := delta(ns0, nstat(t, lab.Server))
	var in int
	for _, f := range frames {
		if f.dst == lab.Server.Addr {
			in++
		}
	}
	if d["UdpNoPorts"] != n || in != n {
		t.Fatalf("nstat UdpNoPorts %d, tshark %d datagrams; sent %d: no ground truth", d["UdpNoPorts"], in, n)
	}
	var drops, recv int
	for _, e := range tr.events {
		if e.NetNS != lab.Server.NetNSInode {
			continue
		}
		if e.Event == "drop" && e.Reason == "NO_SOCKET" && e.Conn == 0 {
			drops++
		}
		// The IP packet: 20 + 8 + "datagram 0".."datagram 24".
		if e.Event == "dev_recv" && e.Conn == 0 && e.IfIndex == uint32(lab.Server.IfIndex) && (e.Size == 38 || e.Size == 39) {
			recv++
		}
	}
	// The kernel may run no program of kfree_skb or netif_receive_skb
	// for a datagram: the witness says for which.
	dropWitness(t, "NO_SOCKET drop events in the server", int64(drops),
		int64(seen.DropsOf(lab.Server.NetNSInode, lab.Server.IfIndex, "NO_SOCKET", p)),
		int64(seen.DropsOf(lab.Server.NetNSInode, lab.Server.IfIndex, "NO_SOCKET", p)), n, seen.Missed, tr.missed)
	var datagrams []frame
	for _, f := range frames {
		if f.dst == lab.Server.Addr {
			datagrams = append(datagrams, f)
		}
	}
	var recvBytes int64
	for _, e := range tr.events {
		if e.NetNS == lab.Server.NetNSInode && e.Event == "dev_recv" && e.Conn == 0 && e.IfIndex == uint32(lab.Server.IfIndex) && (e.Size == 38 || e.Size == 39) {
			recvBytes += e.Size
		}
	}
	devWitness{what: "unattributed dev_recv of the datagrams on the server's veth", magnet: witness.Tally{N: int64(recv), Bytes: recvBytes},
		fs: datagrams, tuple: datagrams, recv: true, witnessMissed: seen.Missed, magnetMissed: tr.missed,
		seen: seen.FramesOf(witness.Match{Hook: witness.Recv, NetNS: lab.Server.NetNSInode, IfIndex: lab.Server.IfIndex, Proto: 17})}.check(t)
}
