// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// TestUDPFirstDatagram: a new UDP socket's first datagram reaches the
// device before any socket-layer event of it (sock_send fires when
// sendmsg returns), and a socket bound by connect() runs no post_bind
// program: the device program meets a socket with no cookie yet. Every
// UDP frame tcpdump captures leaving the sender's veth must still be a
// dev_xmit of the sending socket's connection (and, with the ip group, an
// ip_send of it; with a qdisc, a dev_queue), of the frame's length; the recorder counts no packet of
// the client's netns unrecorded for want of a connection; the connection's
// conn_open comes before its first event, and its owner is the sender
// (the task of its first socket-layer event), not whatever task the
// device ran on. Senders: magnet's workload (a Go program dialing a fresh
// socket) and iperf3 -u; a quiet lab (no ARP, no IPv6) so that the veth
// carries only the test's frames.
func TestUDPFirstDatagram(t *testing.T) {
	needRoot(t)
	needTools(t, "iperf3", "tcpdump", "tshark")
	for _, c := range []struct {
		name   string
		ns     string
		groups event.Group
		iperf3 bool
		tbf    bool // a qdisc on the client's veth: dev_queue too
	}{
		{"go", "mgudp1g", event.DefaultGroups, false, false},
		{"go+ip", "mgudp1i", event.DefaultGroups | event.GroupIP, false, false},
		{"go+tbf", "mgudp1t", event.DefaultGroups, false, true},
		{"iperf3", "mgudp1p", event.DefaultGroups, true, false},
		{"iperf3+ip", "mgudp1q", event.DefaultGroups | event.GroupIP, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			lab := quietLab(t, c.ns)
			if c.tbf {
				// Faster than the sender: the qdisc holds datagrams
				// without dropping any.
				runIn(t, lab, lab.Client, "tc", "qdisc", "replace", "dev", lab.Client.Iface, "root", "tbf",
					"rate", "100mbit", "burst", "64kb", "latency", "100ms")
			}
			var port int
			var wait func()
			var comm string
			if c.iperf3 {
				// iperf3 takes no port 0: the test's own.
				port = uniquePort()
				srv := iperf3Server(t, lab, lab.Server, port)
				wait = func() { srv.Wait() }
				comm = "iperf3"
			} else {
				srv, sc := serve(t, lab, lab.Server, "--proto", "udp", "--listen", netip.AddrPortFrom(lab.Server.Addr, 0).String(), "--count", "50", "--size", "700")
				ap, err := netip.ParseAddrPort(strings.TrimPrefix(sc.Text(), "listening "))
				if err != nil {
					t.Fatalf("server said %q: %v", sc.Text(), err)
				}
				port = int(ap.Port())
				wait = func() {
					if !sc.Scan() || !strings.HasPrefix(sc.Text(), "received 35000 bytes") {
						t.Errorf("server: %q, want all 50 datagrams of 700 bytes", sc.Text())
					}
					srv.Wait()
				}
				comm = "magnet"
			}
			capt := startCapture(t, lab, lab.Client, "udp port "+strconv.Itoa(port))
			// The client's netns only: the recorder counts unrecorded packets
			// of the recorded netns, and the quiet lab's client has no
			// packet but the test's.
			rec := startRecording(t, record.Config{Filters: record.Filters{NetNS: lab.Client.NS, Port: port}, Groups: c.groups})
			if c.iperf3 {
				iperf3Client(t, lab, lab.Client, lab.Server.Addr, port, "-u", "-b", "10M", "-l", "1000", "-n", "100K")
			} else {
				run(t, lab.Command(lab.Client, magnetBin, "workload", "send", "--proto", "udp",
					"--to", netip.AddrPortFrom(lab.Server.Addr, uint16(port)).String(),
					"--count", "50", "--size", "700", "--interval", "1ms"))
			}
			wait()
			res := rec.stop(t)
			frames := capt.stop(t)

			// The frames out of the client, by source port (the socket).
			out := map[uint16][]int{}
			for _, f := range frames {
				if f.proto == "udp" && f.src.Addr() == lab.Client.Addr && int(f.dst.Port()) == port {
					out[f.src.Port()] = append(out[f.src.Port()], f.len)
				}
			}
			if len(out) == 0 {
				t.Fatal("tcpdump saw no datagram leave the client: the test compares nothing")
			}
			if n := res.Unrecorded["dev_no_connection"]; n != 0 {
				t.Errorf("unrecorded dev_no_connection %d, want 0 (all: %v)", n, res.Unrecorded)
			}
			if res.Lost > 0 || res.Missed > 0 {
				t.Logf("lost %d, missed %v: the comparison may be short", res.Lost, res.MissedBy)
			}
			cs := conns(t, rec.path)
			for sport, lens := range out {
				var id uint64
				for _, cn := range cs {
					if cn.Proto == "udp" && cn.NetNS == lab.Client.NetNSInode && cn.Local.Port() == sport {
						if id != 0 {
							t.Fatalf("two connections of local port %d", sport)
						}
						id = cn.ID
						if cn.Comm != comm {
							t.Errorf("socket of port %d: owner %d %q, want the sender %q", sport, cn.PID, cn.Comm, comm)
						}
					}
				}
				if id == 0 {
					t.Fatalf("no connection of the client's UDP port %d (tcpdump: %d datagrams)", sport, len(lens))
				}
				var xmit, queue, ipSend []int
				first, open := -1, -1
				i := 0
				eachRecord(t, rec.path, func(r trace.Record) {
					defer func() { i++ }()
					if r.Conn() != id {
						return
					}
					if r.Type.Name == "conn_open" {
						if open < 0 {
							open = i
						}
						return
					}
					if first < 0 {
						first = i
					}
					switch r.Type.Name {
					case "dev_xmit":
						if ifx, _ := r.Uint("ifindex"); int(ifx) == lab.Client.IfIndex {
							xmit = append(xmit, int(r.Size()))
						}
					case "dev_queue":
						if ifx, _ := r.Uint("ifindex"); int(ifx) == lab.Client.IfIndex {
							queue = append(queue, int(r.Size()))
						}
					case "ip_send":
						ipSend = append(ipSend, int(r.Size())+14)
					}
				})
				if open < 0 || first < open {
					t.Errorf("socket %d: conn_open at record %d, its first event at %d", id, open, first)
				}
				if !slices.Equal(xmit, lens) {
					t.Errorf("socket %d (port %d): dev_xmit lengths %v; tcpdump's frames %v", id, sport, brief(xmit), brief(lens))
				}
				if c.tbf && !slices.Equal(queue, lens) {
					t.Errorf("socket %d (port %d): dev_queue lengths %v; tcpdump's frames %v", id, sport, brief(queue), brief(lens))
				}
				if c.groups&event.GroupIP != 0 && !slices.Equal(ipSend, lens) {
					t.Errorf("socket %d (port %d): ip_send lengths + 14 %v; tcpdump's frames %v", id, sport, brief(ipSend), brief(lens))
				}
				t.Logf("socket %d (port %d, %s): tcpdump %d datagrams out, dev_xmit %d, dev_queue %d, ip_send %d", id, sport, comm, len(lens), len(xmit), len(queue), len(ipSend))
			}
		})
	}
}

// brief shows a list of frame lengths as its first few and its count.
func brief(l []int) string {
	if len(l) <= 4 {
		return fmt.Sprint(l)
	}
	return fmt.Sprintf("%v... (%d)", l[:4], len(l))
}

// TestTCPFirstSegment: sockops gives a connecting socket its cookie
// before its SYN leaves (TCP_CONNECT_CB), whatever the groups. Where
// sockops is not loaded (--disable-hook tcp_segments, or a kernel without it)
// and the tcp group is off, nothing else does before the SYN (the state
// change the recorder reads, to ESTABLISHED, comes after it): the SYN is
// the first packet of a socket with no cookie at the device. Both ways,
// the SYN tcpdump captures leaving the client's veth must be the
// connection's first dev_xmit, of its length, after its conn_open, and
// every frame of the connection but its pure ACKs (which the dev group
// leaves out) a dev_xmit of it; nothing in the client's netns unrecorded
// for want of a connection; the owner is the sender.
func TestTCPFirstSegment(t *testing.T) {
	needRoot(t)
	needTools(t, "tcpdump", "tshark")
	for _, c := range []struct {
		name    string
		ns      string
		disable []string
	}{
		{"sockops", "mgtcp1s", nil},
		{"no-sockops", "mgtcp1n", []string{"tcp_segments"}},
	} {
		t.Run(c.name, func(t *testing.T) { testTCPFirstSegment(t, c.ns, c.disable) })
	}
}

func testTCPFirstSegment(t *testing.T, ns string, disable []string) {
	lab := quietLab(t, ns)
	srv, sc := serve(t, lab, lab.Server, "--proto", "tcp", "--listen", netip.AddrPortFrom(lab.Server.Addr, 0).String())
	ap, err := netip.ParseAddrPort(strings.TrimPrefix(sc.Text(), "listening "))
	if err != nil {
		t.Fatalf("server said %q: %v", sc.Text(), err)
	}
	port := int(ap.Port())
	capt := startCapture(t, lab, lab.Client, "tcp port "+strconv.Itoa(port))
	rec := startRecording(t, record.Config{Filters: record.Filters{NetNS: lab.Client.NS, Port: port},
		Groups: event.GroupSock | event.GroupDev | event.GroupConn, DisableHooks: disable})
	run(t, lab.Command(lab.Client, magnetBin, "workload", "send", "--proto", "tcp", "--to", ap.String(), "--count", "20", "--size", "3000"))
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "received 60000 bytes") {
		t.Errorf("server: %q, want 60000 bytes", sc.Text())
	}
	srv.Wait()
	waitClosed(t, lab, port)
	res := rec.stop(t)
	frames := capt.stop(t)

	var lens []int
	var sport uint16
	for _, f := range frames {
		if f.src.Addr() != lab.Client.Addr || int(f.dst.Port()) != port {
			continue
		}
		// SYN, FIN, RST or data: what the dev group records.
		if f.flags&0x07 == 0 && f.payload == 0 {
			continue
		}
		if f.flags&0x02 != 0 {
			sport = f.src.Port()
		}
		lens = append(lens, f.len)
	}
	if sport == 0 || len(lens) == 0 {
		t.Fatalf("tcpdump saw no SYN leave the client: %d frames", len(frames))
	}
	if n := res.Unrecorded["dev_no_connection"]; n != 0 {
		t.Errorf("unrecorded dev_no_connection %d, want 0 (all: %v)", n, res.Unrecorded)
	}
	var id uint64
	for _, cn := range conns(t, rec.path) {
		if cn.Proto == "tcp" && cn.NetNS == lab.Client.NetNSInode && cn.Local.Port() == sport {
			id = cn.ID
			if cn.Comm != "magnet" {
				t.Errorf("client socket: owner %d %q, want the sender", cn.PID, cn.Comm)
			}
		}
	}
	if id == 0 {
		t.Fatalf("no connection of the client's port %d", sport)
	}
	var xmit []int
	first, open, i := -1, -1, 0
	eachRecord(t, rec.path, func(r trace.Record) {
		defer func() { i++ }()
		if r.Conn() != id {
			return
		}
		switch {
		case r.Type.Name == "conn_open":
			if open < 0 {
				open = i
			}
		case first < 0:
			first = i
		}
		if r.Type.Name == "dev_xmit" {
			xmit = append(xmit, int(r.Size()))
		}
	})
	if open < 0 || first < open {
		t.Errorf("conn_open at record %d, the connection's first event at %d", open, first)
	}
	if !slices.Equal(xmit, lens) {
		t.Errorf("dev_xmit lengths %v; tcpdump's frames (SYN first, pure ACKs aside) %v", xmit, lens)
	}
	t.Logf("client socket %d (port %d): tcpdump %d frames (SYN of %d bytes first), dev_xmit %d", id, sport, len(lens), lens[0], len(xmit))
}
