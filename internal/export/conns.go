// SPDX-License-Identifier: Apache-2.0

package export

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
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
	Peer     uint64 `json:"peer,omitempty"`
	OpenNs   uint64 `json:"open_ns"`
	CloseNs  uint64 `json:"close_ns,omitempty"`
	Events   uint64 `json:"events"`
	SentApp  int64  `json:"app_bytes_sent"`     // sum of sock_send sizes > 0
	RecvApp  int64  `json:"app_bytes_received"` // sum of sock_recv sizes > 0
	ownerSet bool
}

// Conns reads the whole trace and builds its connection table, sorted by
// first appearance, and returns the time of the first record. The error, if
// any, comes with the table built so far.
func Conns(r *trace.Reader) ([]*Conn, uint64, error) {
	var start uint64
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
		if start == 0 {
			start = rec.Time()
		}
		if rs.Observe(rec) || rec.Conn() == 0 {
			continue
		}
		c := get(rec.Conn(), rec.Time())
		switch rec.Type.Name {
		case "conn_open":
			if c.Proto != "" {
				break // announced again after a map eviction: keep the first
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
		case "conn_close":
			c.CloseNs = rec.Time()
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
		if rec.Type.Name != "conn_open" && rec.Type.Name != "conn_close" {
			c.Events++
		}
	}
	pairConns(order)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return order, start, err
}

// pairConns links the two ends of a connection recorded on one host (or in
// two namespaces of it): same protocol, each one's local is the other's
// remote.
func pairConns(cs []*Conn) {
	type key struct {
		proto         string
		local, remote netip.AddrPort
	}
	idx := map[key]*Conn{}
	for _, c := range cs {
		if c.Local.Port() != 0 && c.Remote.Port() != 0 {
			idx[key{c.Proto, c.Local, c.Remote}] = c
		}
	}
	for _, c := range cs {
		if c.Peer != 0 || c.Remote.Port() == 0 {
			continue
		}
		if p, ok := idx[key{c.Proto, c.Remote, c.Local}]; ok && p != c {
			c.Peer, p.Peer = p.ID, c.ID
			continue
		}
		// An unconnected (UDP) server socket: bound locally, no remote.
		for _, p := range cs {
			if p != c && p.Peer == 0 && p.Proto == c.Proto && p.Local == c.Remote && p.Remote.Port() == 0 {
				c.Peer, p.Peer = p.ID, c.ID
				break
			}
		}
	}
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
			c.ID, proto, c.Local, c.Remote, c.NetNS, c.PID, sanitize(comm), peer, rel(c.OpenNs), rel(c.CloseNs), c.Events, c.SentApp, c.RecvApp)
	}
	return tw.Flush()
}
