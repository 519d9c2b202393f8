// SPDX-License-Identifier: Apache-2.0

package export

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// Conn is one row of the connection table.
type Conn struct {
	ID     uint64         `json:"id"` // the socket's cookie, as in every event's conn column
	Proto  string         `json:"proto"`
	Local  netip.AddrPort `json:"local"`
	Remote netip.AddrPort `json:"remote"`
	NetNS  uint32         `json:"netns"`
	// PID and Comm own the socket: the task of its first socket-layer
	// event, else the task current when it was first seen.
	PID  uint32 `json:"pid"`
	Comm string `json:"comm"`
	// Peer is the other end's id when both ends are in the trace.
	Peer    uint64 `json:"peer,omitempty"`
	OpenNs  uint64 `json:"open_ns"`
	CloseNs uint64 `json:"close_ns,omitempty"`
	Events  uint64 `json:"events"`
	SentApp int64  `json:"app_bytes_sent"`     // sum of sock_send sizes > 0
	RecvApp int64  `json:"app_bytes_received"` // sum of sock_recv sizes > 0
	// PeerTrace names the trace that holds the peer, when it is not this
	// connection's own (two hosts recorded apart).
	PeerTrace string `json:"peer_trace,omitempty"`
	// Learned says the socket existed when recording started: the
	// recorder learned it then (conn_open flag ConnLearned), and its owner
	// is the process holding it, as ss -p finds it.
	Learned  bool `json:"learned,omitempty"`
	ownerSet bool
}

// ConnUpdate is conn_open's flag for an announcement with new addresses
// (bpf/events.h MG_CONN_UPDATE): they replace the connection's.
const ConnUpdate = 0x01

// ConnLearned is conn_open's flag for a socket that existed when recording
// started, learned then (bpf/events.h MG_CONN_LEARNED).
const ConnLearned = 0x02

// Observe updates c with one of its records (one whose conn is c.ID, not a
// metadata record); rs has seen the trace's metadata up to rec.
func (c *Conn) Observe(rs *Resolver, rec trace.Record) {
	switch rec.Type.Name {
	case "conn_open":
		// A UDP socket that connected after it was announced (at bind)
		// is announced again with its new addresses, flagged as an
		// update; any other repeat is an announcement again after a map
		// eviction: keep the first.
		if c.Proto != "" && rec.Flags()&ConnUpdate == 0 {
			return
		}
		fam, _ := rec.Uint("family")
		la, _ := rec.Addr("laddr", fam != 6)
		ra, _ := rec.Addr("raddr", fam != 6)
		lp, _ := rec.Uint("lport")
		rp, _ := rec.Uint("rport")
		proto, _ := rec.Uint("proto")
		c.Proto = protoName(proto)
		c.Local = netip.AddrPortFrom(la, uint16(lp))
		c.Remote = netip.AddrPortFrom(ra, uint16(rp))
		c.NetNS = rec.NetNS()
		if !c.ownerSet {
			c.PID, c.Comm, _ = rs.Task(rec.TID())
		}
		if rec.Flags()&ConnLearned != 0 {
			c.Learned = true
			// The process holding the socket, not whichever task
			// happens to make its next system call.
			c.ownerSet = rec.TID() != 0
		}
		return
	case "conn_close":
		c.CloseNs = rec.Time()
		return
	case "sock_send", "sock_recv":
		if !c.ownerSet {
			c.PID, c.Comm, _ = rs.Task(rec.TID())
			c.ownerSet = true
		}
		if n := rec.Size(); n > 0 {
			if rec.Type.Name == "sock_send" {
				c.SentApp += int64(n)
			} else {
				c.RecvApp += int64(n)
			}
		}
	}
	c.Events++
}

// Conns reads the whole trace and builds its connection table, sorted by
// first appearance, and returns the time of the first record. The error, if
// any, comes with the table built so far.
func Conns(r *trace.Reader) ([]*Conn, uint64, error) {
	var start uint64
	started := false
	rs := NewResolver(r.Header())
	byID := map[uint64]*Conn{}
	var order []*Conn
	get := func(id uint64, t uint64) *Conn {
		c := byID[id]
		if c == nil {
			c = &Conn{ID: id, OpenNs: t}
			byID[id] = c
			order = append(order, c)
		}
		return c
	}
	var err error
	for {
		var rec trace.Record
		rec, err = r.Next()
		if err != nil {
			break
		}
		if !started {
			start, started = rec.Time(), true
		}
		if rs.Observe(rec) || rec.Conn() == 0 {
			continue
		}
		get(rec.Conn(), rec.Time()).Observe(rs, rec)
	}
	PairConns(order)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return order, start, err
}

// PairConns links the two ends of a connection recorded on one host (or in
// two namespaces of it): same protocol, each one's local is the other's
// remote. A tuple can recur (a port reused later, the same addresses in two
// namespaces), so each end pairs with the unpaired candidate opened nearest
// in time. A UDP server bound without a remote pairs with its clients' first.
// Connections that already have a peer are left as they are.
func PairConns(cs []*Conn) {
	type key struct {
		proto         string
		local, remote netip.AddrPort
	}
	idx := map[key][]*Conn{}
	// Unmapped: the dual-stack end of an IPv4 connection has v4-mapped
	// addresses, its IPv4 peer plain ones.
	for _, c := range cs {
		if c.Local.Port() != 0 {
			k := key{c.Proto, unmapped(c.Local), unmapped(c.Remote)}
			idx[k] = append(idx[k], c)
		}
	}
	nearest := func(c *Conn, cands []*Conn) *Conn {
		var best *Conn
		for _, p := range cands {
			if p == c || p.Peer != 0 {
				continue
			}
			if best == nil || absDiff(p.OpenNs, c.OpenNs) < absDiff(best.OpenNs, c.OpenNs) {
				best = p
			}
		}
		return best
	}
	for _, c := range cs {
		if c.Peer != 0 || c.Remote.Port() == 0 {
			continue
		}
		p := nearest(c, idx[key{c.Proto, unmapped(c.Remote), unmapped(c.Local)}])
		if p == nil {
			// An unconnected server: bound to the address, or to the wildcard.
			unbound := netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
			if c.Local.Addr().Is6() {
				unbound = netip.AddrPortFrom(netip.IPv6Unspecified(), 0)
			}
			p = nearest(c, idx[key{c.Proto, unmapped(c.Remote), unbound}])
			if p == nil {
				wild := netip.AddrPortFrom(unbound.Addr(), c.Remote.Port())
				p = nearest(c, idx[key{c.Proto, wild, unbound}])
			}
			if p != nil && p.Proto != "udp" {
				p = nil // a TCP listener is not the peer: its accepted socket is
			}
		}
		if p != nil {
			c.Peer = p.ID
			if p.Remote.Port() != 0 {
				p.Peer = c.ID
			} else if p.Peer == 0 {
				p.Peer = c.ID // an unconnected server: paired with its first client
			}
		}
	}
}

func absDiff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

// endpoint prints "-" for an end never announced (its conn_open lost).
func endpoint(ap netip.AddrPort) string {
	if !ap.IsValid() {
		return "-"
	}
	return ap.String()
}

func protoName(p uint64) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	}
	return strconv.FormatUint(p, 10)
}

// WriteConns prints the connection table, aligned for a terminal.
func WriteConns(w io.Writer, cs []*Conn, start uint64) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join([]string{"conn", "proto", "local", "remote", "netns", "pid", "comm", "peer", "open", "close", "events", "app_sent", "app_recv"}, "\t"))
	cs = slices.Clone(cs)
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].OpenNs < cs[j].OpenNs })
	rel := func(ns uint64) string {
		if ns == 0 {
			return "-"
		}
		return strconv.FormatFloat(float64(int64(ns)-int64(start))/1e9, 'f', 6, 64)
	}
	for _, c := range cs {
		peer := "-"
		if c.Peer != 0 {
			peer = strconv.FormatUint(c.Peer, 10)
		}
		comm := c.Comm
		if comm == "" {
			comm = "-"
		}
		proto := c.Proto
		if proto == "" {
			proto = "?"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%d\n",
			c.ID, proto, endpoint(c.Local), endpoint(c.Remote), c.NetNS, c.PID, sanitize(comm), peer, rel(c.OpenNs), rel(c.CloseNs), c.Events, c.SentApp, c.RecvApp)
	}
	return tw.Flush()
}

// PeerIndex pairs the ends of connections as their conn_open records come,
// across any number of traces: same protocol, each end's local address and
// port the other's remote. An end pairs with an unpaired candidate of its
// own trace when there is one (one recorder saw both ends, e.g. in two
// namespaces of one host), else with the candidate of another trace that
// opened last (the other host's recording). Ends without a remote port
// (unconnected UDP) are left to PairConns.
type PeerIndex struct {
	names []string
	open  map[peerKey][]peerCand
}

type peerKey struct {
	proto         string
	local, remote netip.AddrPort
}

type peerCand struct {
	src int
	c   *Conn
}

// NewPeerIndex returns an index for connections of the traces named names
// (indexed by the src given to Add).
func NewPeerIndex(names []string) *PeerIndex {
	return &PeerIndex{names: names, open: map[peerKey][]peerCand{}}
}

// Add takes connection c of trace src once its addresses are known and
// pairs it if its other end is already in the index, setting Peer (and
// PeerTrace across traces) on both. It reports the peer's trace and the
// peer, or -1 and nil.
func (x *PeerIndex) Add(src int, c *Conn) (int, *Conn) {
	if c.Peer != 0 || c.Local.Port() == 0 || c.Remote.Port() == 0 {
		return -1, nil
	}
	local, remote := unmapped(c.Local), unmapped(c.Remote)
	k := peerKey{c.Proto, remote, local}
	cands := x.open[k]
	best := -1
	for i := len(cands) - 1; i >= 0; i-- {
		if cands[i].src == src {
			best = i
			break
		}
		if best < 0 {
			best = i
		}
	}
	if best < 0 {
		own := peerKey{c.Proto, local, remote}
		x.open[own] = append(x.open[own], peerCand{src, c})
		return -1, nil
	}
	p := cands[best]
	x.open[k] = append(cands[:best:best], cands[best+1:]...)
	if len(x.open[k]) == 0 {
		delete(x.open, k)
	}
	c.Peer, p.c.Peer = p.c.ID, c.ID
	if p.src != src {
		c.PeerTrace, p.c.PeerTrace = x.name(p.src), x.name(src)
	}
	return p.src, p.c
}

// unmapped is ap with an IPv4-mapped IPv6 address as plain IPv4: an
// AF_INET6 socket talking to an IPv4 peer records its addresses mapped.
func unmapped(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func (x *PeerIndex) name(src int) string {
	if src < len(x.names) {
		return x.names[src]
	}
	return strconv.Itoa(src)
}

// PairTraces pairs the connections of several traces' tables (one per
// trace, as Conns returns them) whose ends were recorded apart, in the
// order they opened on the common timeline (offsets[i] added to trace i's
// times). Ends already paired inside their own trace are left alone.
func PairTraces(tables [][]*Conn, names []string, offsets []int64) {
	type ref struct {
		src int
		c   *Conn
		t   int64
	}
	var all []ref
	for i, cs := range tables {
		for _, c := range cs {
			if c.Peer == 0 {
				all = append(all, ref{i, c, int64(c.OpenNs) + offsets[i]})
			}
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].t < all[j].t })
	x := NewPeerIndex(names)
	for _, r := range all {
		x.Add(r.src, r.c)
	}
}
