// SPDX-License-Identifier: Apache-2.0

// Package event is magnet's event catalogue: every event type's id, name,
// group, the kernel hook it comes from and what it measures. The binary
// layouts come from bpf/events.h through the Go types bpf2go generates; this
// package only names and describes them.
package event

import (
	"fmt"
	"sort"
	"strings"
)

// Type is an event type id, as in enum mg_type of bpf/events.h. The
// constants, and the groups', are generated from it (types_gen.go).
type Type uint8

// Group is a set of event types enabled together (enum mg_group).
type Group uint32

// DefaultGroups is what `magnet record` records without --events: the
// socket, TCP and device layers, connection lifecycle, TCP state and drops.
// tcp_send is not in it: it comes once per skb a send call fills (3 per 64
// KiB send), from the costliest program, run in the sender's process under
// the socket lock, and says little that sock_send and tcp_xmit do not. ip
// is not in it either: the device events carry the IP header's facts (id,
// TTL, TOS, protocol) and the TCP sequence number, and the ip group's
// cgroup_skb programs run for every packet of every cgroup, two runs and
// two records per packet for a time stamp between TCP and the device.
const DefaultGroups = GroupSock | GroupTCP | GroupTCPState | GroupDev | GroupDrop | GroupConn

var groupNames = []struct {
	name string
	g    Group
	help string
}{
	{"sock", GroupSock, "socket layer: sock_send, sock_recv"},
	{"tcp", GroupTCP, "TCP: tcp_xmit, tcp_rcv, tcp_retrans"},
	{"tcpstate", GroupTCPState, "TCP state snapshots: tcp_state"},
	{"ip", GroupIP, "IP layer (opt-in; dev_* carry the IP facts): ip_send, ip_recv"},
	{"dev", GroupDev, "device layer: dev_queue, dev_xmit, dev_recv"},
	{"drop", GroupDrop, "packet drops with the kernel's reason: drop"},
	{"conn", GroupConn, "connection lifecycle: conn_open, conn_close (always on)"},
	{"sched", GroupSched, "scheduler (opt-in): sched_switch, sched_wakeup, sched_fork, sched_exit"},
	{"headers", GroupHeaders, "packet headers at the device (opt-in): headers"},
	{"rate", GroupRate, "the kernel's delivery-rate sample after each ACK (opt-in, one per ACK): tcp_rate"},
	{"tcpsend", GroupTCPSend, "TCP taking data from a send call, one per skb it fills (opt-in): tcp_send"},
	{"summary", GroupSummary, "per-connection figures per interval, written by record --summary instead of events: conn_summary"},
	{"acks", GroupAcks, "with ip and dev: their events for pure ACKs too (opt-in; tcp_xmit and tcp_rcv have every ACK)"},
}

// ParseGroups parses a comma-separated --events value. "default" stands for
// DefaultGroups and "all" for every group; a leading "-" removes a group
// ("default,-dev"). Connection lifecycle is always included, because every
// other event needs it to be attributed.
func ParseGroups(s string) (Group, error) {
	var g Group
	if strings.TrimSpace(s) == "" {
		return DefaultGroups, nil
	}
	// A list that starts by removing a group ("-dev") removes it from the
	// default set, as perf and bpftrace users expect.
	if strings.HasPrefix(strings.TrimSpace(s), "-") {
		g = DefaultGroups
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		remove := strings.HasPrefix(part, "-")
		part = strings.TrimPrefix(part, "-")
		var v Group
		switch part {
		case "default":
			v = DefaultGroups
		case "all":
			v = AllGroups()
		default:
			found := false
			for _, gn := range groupNames {
				if gn.name == part {
					v, found = gn.g, true
				}
			}
			if !found {
				return 0, fmt.Errorf("unknown event group %q (want %s)", part, strings.Join(GroupNames(), ", "))
			}
		}
		if remove {
			g &^= v
		} else {
			g |= v
		}
	}
	return g | GroupConn, nil
}

// AllGroups returns every group of events the BPF programs write:
// summary is not one (its records come from the recorder in summary
// mode, `record --summary`).
func AllGroups() Group {
	var g Group
	for _, gn := range groupNames {
		g |= gn.g
	}
	return g &^ GroupSummary
}

// GroupNames lists the group names accepted by ParseGroups.
func GroupNames() []string {
	var out []string
	for _, gn := range groupNames {
		out = append(out, gn.name)
	}
	return append(out, "default", "all")
}

// GroupHelp describes each group, one per line, for --help.
func GroupHelp() string {
	var b strings.Builder
	for _, gn := range groupNames {
		fmt.Fprintf(&b, "  %-9s %s\n", gn.name, gn.help)
	}
	return b.String()
}

// Names returns the names of the groups in g.
func (g Group) Names() []string {
	var out []string
	for _, gn := range groupNames {
		if g&gn.g != 0 {
			out = append(out, gn.name)
		}
	}
	return out
}

// String joins the group names with commas.
func (g Group) String() string { return strings.Join(g.Names(), ",") }

// Info describes one event type.
type Info struct {
	Type  Type
	Name  string
	Group Group
	// Hook is the kernel hook that produces it; Measures says what it means.
	Hook     string
	Measures string
}

// Catalogue lists every event type in id order.
var Catalogue = []Info{
	{SockSend, "sock_send", GroupSock, "tp_btf/sock_send_length", "bytes the application handed to a TCP or UDP socket in one send call (size < 0: the call's error)"},
	{SockRecv, "sock_recv", GroupSock, "tp_btf/sock_recv_length", "bytes the application took from a socket in one receive call (MSG_PEEK excluded)"},
	{TCPSend, "tcp_send", GroupTCPSend, "tp_btf/tcp_sendmsg_locked", "TCP takes data from a send call into an skb; size = bytes it can take in this step"},
	{TCPXmit, "tcp_xmit", GroupTCP, "fentry/__tcp_transmit_skb where allowed, else cgroup_skb/egress (sockops BPF_SOCK_OPS_HDR_OPT_LEN_CB without it); tp_btf/net_dev_queue with --xmit-at-device", "a segment (or TSO super-segment) TCP hands down to IP: seq, payload bytes, flags"},
	{TCPRcv, "tcp_rcv", GroupTCP, "tp_btf/tcp_probe", "a segment arriving at an established TCP socket from IP: seq, ack, payload bytes"},
	{TCPState, "tcp_state", GroupTCPState, "tp_btf/tcp_probe, tcp_retransmit_skb, inet_sock_set_state", "snapshot of TCP's state: cwnd, ssthresh, srtt, windows, in flight, retransmits (once per srtt, and on every loss-recovery change)"},
	{TCPRetrans, "tcp_retrans", GroupTCP, "tp_btf/tcp_retransmit_skb", "a segment TCP retransmits (size < 0: the transmit error)"},
	{IPSend, "ip_send", GroupIP, "cgroup_skb/egress", "an IP packet leaving a socket (before fragmentation): id, TTL, TOS, length"},
	{IPRecv, "ip_recv", GroupIP, "cgroup_skb/ingress", "an IP packet reaching a socket (after reassembly): id, TTL, TOS, length"},
	{DevQueue, "dev_queue", GroupDev, "tp_btf/net_dev_queue", "a packet handed to a device's qdisc (only where the tx queue has one that can queue: not on noqueue devices such as veth, lo)"},
	{DevXmit, "dev_xmit", GroupDev, "tp_btf/net_dev_start_xmit", "a packet handed to the device driver"},
	{DevRecv, "dev_recv", GroupDev, "tp_btf/netif_receive_skb", "a packet the device layer receives (after GRO)"},
	{Drop, "drop", GroupDrop, "tp_btf/kfree_skb", "a packet freed with a drop reason (enum skb_drop_reason)"},
	{ConnOpen, "conn_open", GroupConn, "first sight of a socket at any hook", "a TCP or UDP socket magnet has not seen before: protocol, addresses, ports"},
	{ConnClose, "conn_close", GroupConn, "tp_btf/inet_sock_set_state (TCP_CLOSE), cgroup/sock_release (UDP)", "a connection ends: bytes acked and received, retransmits"},
	{SchedSwitch, "sched_switch", GroupSched, "tp_btf/sched_switch", "a context switch: prev is the event's task, next in the fields"},
	{SchedWakeup, "sched_wakeup", GroupSched, "tp_btf/sched_wakeup", "a task is woken"},
	{SchedFork, "sched_fork", GroupSched, "tp_btf/sched_process_fork", "a task forks"},
	{SchedExit, "sched_exit", GroupSched, "tp_btf/sched_process_exit", "a task exits"},
	{Lost, "lost", GroupConn, "ring buffer full", "events dropped because a ring buffer was full: how many, of which types, on which CPU, between which times"},
	{Headers, "headers", GroupHeaders, "tp_btf/net_dev_start_xmit, netif_receive_skb", "the first 128 bytes of a packet at the device, from its link-layer header"},
	{Task, "task", GroupConn, "recorder", "a thread's process id and command name, written before its first event"},
	{Iface, "iface", GroupConn, "first sight of an interface", "a network interface's name in a network namespace"},
	{TCPRate, "tcp_rate", GroupRate, "tp_btf/tcp_probe, the tcp_xmit hook (cgroup_skb/egress, fentry or sockops), inet_sock_set_state (the next hook after the ACK)", "the kernel's delivery-rate sample after an ACK that delivered data: delivered, lost, rate_delivered segments over rate_interval_us, app-limited (size = segments newly delivered)"},
	{ConnSummary, "conn_summary", GroupSummary, "recorder", "summary mode (record --summary), from the summaries map: a connection's figures over one interval: bytes and segments read from its TCP socket, retransmissions, drops, srtt and cwnd histograms sampled at each read, IP and device packets if asked for (size = the interval in ms)"},
}

// ByType returns the catalogue entry of t.
func ByType(t Type) (Info, bool) {
	for _, in := range Catalogue {
		if in.Type == t {
			return in, true
		}
	}
	return Info{}, false
}

// ByName returns the catalogue entry named name.
func ByName(name string) (Info, bool) {
	for _, in := range Catalogue {
		if in.Name == name {
			return in, true
		}
	}
	return Info{}, false
}

// TypesIn returns the event types of the groups in g, sorted by id.
func TypesIn(g Group) []Type {
	var out []Type
	for _, in := range Catalogue {
		if in.Group&g != 0 {
			out = append(out, in.Type)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
