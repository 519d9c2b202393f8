// SPDX-License-Identifier: Apache-2.0

// Package filter compiles the daemon's subscription filters
// (docs/DAEMON.md#filters): field tests on an event's type, process,
// connection and namespace, cheap enough to run on every event, and an
// optional CEL expression over all of the event's fields, for anything
// else. Filters come from clients, so parsing checks everything and limits
// sizes, and expressions run under a cost limit.
package filter

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/pcapfilter"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// Limits on what a client may ask.
const (
	MaxExprBytes = 4096
	MaxValues    = 1024 // values per key
)

// ErrBad marks every error that is the client's fault.
var ErrBad = errors.New("bad filter")

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBad, fmt.Sprintf(format, args...))
}

// Event is what a filter sees of an event. The hub fills it; Fields is
// called (once) only when an expression needs the event's own fields.
type Event struct {
	Type   event.Type
	Name   string
	TimeNs uint64
	CPU    uint16
	TID    uint32
	PID    uint32
	Comm   string
	UID    int64 // the task's uid, -1 unknown
	NetNS  uint32
	Conn   uint64
	Size   int32
	Flags  uint8

	// The connection, when the event has one and its conn_open was seen.
	HasConn       bool
	Proto         uint8
	Local, Remote netip.AddrPort
	// Its owner, when known.
	HasOwner  bool
	OwnerPID  uint32
	OwnerUID  int64
	OwnerComm string

	Fields func() map[string]any
}

// Filter is a compiled filter. It is safe for concurrent use.
type Filter struct {
	spec    magnetclient.Filter // as given, normalized
	types   [256]bool
	anyType bool
	groups  event.Group // groups the filter asks to enable
	conns   []uint64
	pids    []uint32
	uids    []uint32
	comms   []string
	ports   []uint16
	lports  []uint16
	rports  []uint16
	addrs   []netip.Prefix
	netns   []uint32
	protos  []uint8
	expr    *program
	pcap    *pcapfilter.Expr
}

// Options tell Parse how to resolve names.
type Options struct {
	// NetNS resolves a network namespace name (under /run/netns) to its
	// inode number.
	NetNS func(name string) (uint32, error)
	// Kernel resolves the name of a kernel event chosen at run time (a
	// tracepoint, uprobe or USDT probe the recorder was started with) to
	// its type id; nil: there are none.
	Kernel func(name string) (event.Type, bool)
	// HasField reports whether some event of the recording has a field of
	// this name; nil: not checked. An expression naming a field no event
	// has would match nothing, silently, so Parse refuses it.
	HasField func(name string) bool
}

// Parse checks and compiles a filter.
func Parse(spec magnetclient.Filter, opts Options) (*Filter, error) {
	f := &Filter{spec: spec, anyType: len(spec.Types) == 0 && len(spec.Groups) == 0}
	for _, key := range []struct {
		name string
		n    int
	}{{"types", len(spec.Types)}, {"groups", len(spec.Groups)}, {"conns", len(spec.Conns)},
		{"pids", len(spec.PIDs)}, {"uids", len(spec.UIDs)}, {"comms", len(spec.Comms)},
		{"ports", len(spec.Ports)}, {"lports", len(spec.LocalPorts)}, {"rports", len(spec.RemotePorts)},
		{"addrs", len(spec.Addrs)}, {"netns", len(spec.NetNS)}, {"protos", len(spec.Protos)}} {
		if key.n > MaxValues {
			return nil, bad("%s: %d values, at most %d", key.name, key.n, MaxValues)
		}
	}
	for _, name := range spec.Types {
		in, ok := event.ByName(name)
		if !ok && opts.Kernel != nil {
			if id, ok := opts.Kernel(name); ok {
				f.types[id] = true
				continue
			}
		}
		if !ok {
			return nil, bad("types: unknown event type %q (see docs/EVENTS.md)", name)
		}
		switch in.Type {
		case event.Lost:
			return nil, bad("types: lost is not an event here: losses come as lost lines in every stream")
		case event.Task:
			return nil, bad("types: task records are the recorder's; every event carries its pid and comm")
		case event.Iface:
			return nil, bad("types: iface records are the recorder's; device events carry their ifindex")
		}
		f.types[in.Type] = true
		f.groups |= in.Group
	}
	for _, name := range spec.Groups {
		if strings.HasPrefix(name, "-") || strings.Contains(name, ",") {
			return nil, bad("groups: %q is not a group name", name)
		}
		g, err := event.ParseGroups(name)
		if err != nil {
			return nil, bad("groups: %v", err)
		}
		f.groups |= g
		for _, typ := range event.TypesIn(g &^ event.GroupConn) {
			f.types[typ] = true
		}
		if name == "conn" || name == "all" || name == "default" {
			f.types[event.ConnOpen], f.types[event.ConnClose] = true, true
		}
	}
	f.conns = spec.Conns
	f.pids, f.uids, f.comms = spec.PIDs, spec.UIDs, spec.Comms
	for _, c := range spec.Comms {
		if len(c) > 15 {
			return nil, bad("comms: %q is longer than a command name (15 bytes)", c)
		}
	}
	for _, ps := range [][]uint16{spec.Ports, spec.LocalPorts, spec.RemotePorts} {
		if slices.Contains(ps, 0) {
			return nil, bad("ports: 0 is not a port")
		}
	}
	f.ports, f.lports, f.rports = spec.Ports, spec.LocalPorts, spec.RemotePorts
	for _, a := range spec.Addrs {
		p, err := parsePrefix(a)
		if err != nil {
			return nil, err
		}
		f.addrs = append(f.addrs, p)
	}
	for _, ns := range spec.NetNS {
		ino, err := parseNetNS(ns, opts)
		if err != nil {
			return nil, err
		}
		f.netns = append(f.netns, ino)
	}
	for _, p := range spec.Protos {
		switch strings.ToLower(p) {
		case "tcp":
			f.protos = append(f.protos, 6)
		case "udp":
			f.protos = append(f.protos, 17)
		default:
			return nil, bad("protos: %q (want tcp or udp)", p)
		}
	}
	if spec.Pcap != "" {
		e, err := pcapfilter.Parse(spec.Pcap)
		if err != nil {
			return nil, bad("pcap: %v", strings.TrimPrefix(err.Error(), "pcap filter: "))
		}
		f.pcap = e
	}
	if spec.Expr != "" {
		prg, err := compile(spec.Expr)
		if err != nil {
			return nil, err
		}
		if opts.HasField != nil {
			for _, r := range FieldRefs(spec.Expr) {
				if !opts.HasField(r.Name) {
					return nil, bad("expr: column %d: no event has a field %q", r.Column, r.Name)
				}
			}
		}
		f.expr = prg
	}
	return f, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, bad("addrs: %q is not an address or prefix", s)
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, bad("addrs: %q is not an address or prefix", s)
	}
	a = a.Unmap().WithZone("")
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func parseNetNS(s string, opts Options) (uint32, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return uint32(n), nil
	}
	if s == "" || strings.ContainsAny(s, "/\x00") || s == "." || s == ".." {
		return 0, bad("netns: %q is neither an inode number nor a name under /run/netns", s)
	}
	if opts.NetNS == nil {
		return 0, bad("netns: names cannot be resolved here, give the inode number")
	}
	ino, err := opts.NetNS(s)
	if err != nil {
		return 0, bad("netns: %v", err)
	}
	return ino, nil
}

// Spec returns the filter as given.
func (f *Filter) Spec() magnetclient.Filter { return f.spec }

// Groups returns the event groups the filter asks to enable.
func (f *Filter) Groups() event.Group { return f.groups }

// HasExpr reports whether the filter has an expression (evaluated by
// MatchExpr, after Match).
func (f *Filter) HasExpr() bool { return f.expr != nil }

// WantsAny reports whether the filter names no types or groups: it takes
// whatever groups are enabled.
func (f *Filter) WantsAny() bool { return f.anyType }

// WantsType reports whether events of type t can match.
func (f *Filter) WantsType(t event.Type) bool { return f.anyType || f.types[t] }

// OnlyConnKeys reports whether the filter uses nothing but what a
// connection has (no types, groups or expression): what selects
// connections rather than events.
func (f *Filter) OnlyConnKeys() error {
	switch {
	case len(f.spec.Types) > 0:
		return bad("types select events, not connections")
	case len(f.spec.Groups) > 0:
		return bad("groups select events, not connections")
	case f.spec.Expr != "":
		return bad("expr selects events, not connections")
	}
	return nil
}

// Match applies every test but the expression.
func (f *Filter) Match(e *Event) bool {
	if !f.anyType && !f.types[e.Type] {
		return false
	}
	if len(f.conns) > 0 && !slices.Contains(f.conns, e.Conn) {
		return false
	}
	if len(f.netns) > 0 && !slices.Contains(f.netns, e.NetNS) {
		return false
	}
	if len(f.pids) > 0 || len(f.uids) > 0 || len(f.comms) > 0 {
		// The connection's owner; the task for events without one.
		pid, uid, comm, known := e.PID, e.UID, e.Comm, true
		if e.Conn != 0 {
			pid, uid, comm, known = e.OwnerPID, e.OwnerUID, e.OwnerComm, e.HasOwner
		}
		if !known {
			return false
		}
		if len(f.pids) > 0 && !slices.Contains(f.pids, pid) {
			return false
		}
		if len(f.uids) > 0 && (uid < 0 || !slices.Contains(f.uids, uint32(uid))) {
			return false
		}
		if len(f.comms) > 0 && !slices.Contains(f.comms, comm) {
			return false
		}
	}
	if f.connKeys() {
		if !e.HasConn {
			return false
		}
		return f.matchConn(e.Proto, e.Local, e.Remote)
	}
	return true
}

// connKeys reports whether the filter tests a connection's addresses.
func (f *Filter) connKeys() bool {
	return len(f.ports) > 0 || len(f.lports) > 0 || len(f.rports) > 0 || len(f.addrs) > 0 || len(f.protos) > 0 || f.pcap != nil
}

// MatchConnKeys applies only the tests of a connection's addresses
// (ports, addrs, protos), which need nothing but the connection: a caller
// runs it before building an Event, which most events of a busy host never
// need. hasConn says whether the connection is known (Event.HasConn).
func (f *Filter) MatchConnKeys(hasConn bool, proto uint8, local, remote netip.AddrPort) bool {
	if !f.connKeys() {
		return true
	}
	return hasConn && f.matchConn(proto, local, remote)
}

func (f *Filter) matchConn(proto uint8, local, remote netip.AddrPort) bool {
	lp, rp := local.Port(), remote.Port()
	if len(f.ports) > 0 && !slices.Contains(f.ports, lp) && !slices.Contains(f.ports, rp) {
		return false
	}
	if len(f.lports) > 0 && !slices.Contains(f.lports, lp) {
		return false
	}
	if len(f.rports) > 0 && !slices.Contains(f.rports, rp) {
		return false
	}
	if len(f.protos) > 0 && !slices.Contains(f.protos, proto) {
		return false
	}
	if len(f.addrs) > 0 {
		la, ra := local.Addr().Unmap(), remote.Addr().Unmap()
		if !slices.ContainsFunc(f.addrs, func(p netip.Prefix) bool { return p.Contains(la) || p.Contains(ra) }) {
			return false
		}
	}
	if f.pcap != nil && !f.pcap.Match(pcapfilter.Conn{Proto: proto, Local: local, Remote: remote}) {
		return false
	}
	return true
}

// Conn is what MatchConn sees of a connection.
type Conn struct {
	ID            uint64
	NetNS         uint32
	Opened        bool // its conn_open was seen: Proto, Local, Remote are set
	Proto         uint8
	Local, Remote netip.AddrPort
	HasOwner      bool
	OwnerPID      uint32
	OwnerUID      int64
	OwnerComm     string
}

// MatchConn applies the filter to a connection (for the connection list
// and figure streams; see OnlyConnKeys).
func (f *Filter) MatchConn(c Conn) bool {
	if len(f.conns) > 0 && !slices.Contains(f.conns, c.ID) {
		return false
	}
	if len(f.netns) > 0 && !slices.Contains(f.netns, c.NetNS) {
		return false
	}
	if len(f.pids) > 0 || len(f.uids) > 0 || len(f.comms) > 0 {
		if !c.HasOwner ||
			len(f.pids) > 0 && !slices.Contains(f.pids, c.OwnerPID) ||
			len(f.uids) > 0 && (c.OwnerUID < 0 || !slices.Contains(f.uids, uint32(c.OwnerUID))) ||
			len(f.comms) > 0 && !slices.Contains(f.comms, c.OwnerComm) {
			return false
		}
	}
	if f.connKeys() {
		return c.Opened && f.matchConn(c.Proto, c.Local, c.Remote)
	}
	return true
}

// FromQuery reads a filter from query parameters: the keys of
// magnetclient.Filter, values comma-separated and/or repeated. Keys in
// extra are the caller's and left alone; any other key is an error.
func FromQuery(q url.Values, extra ...string) (magnetclient.Filter, error) {
	var f magnetclient.Filter
	var err error
	list := func(key string) []string {
		var out []string
		for _, v := range q[key] {
			for _, s := range strings.Split(v, ",") {
				if s = strings.TrimSpace(s); s != "" {
					out = append(out, s)
				}
			}
		}
		return out
	}
	nums := func(key string, bits int) []uint64 {
		var out []uint64
		for _, s := range list(key) {
			n, perr := strconv.ParseUint(s, 10, bits)
			if perr != nil && err == nil {
				err = bad("%s: %q is not a number below 2^%d", key, s, bits)
			}
			out = append(out, n)
		}
		return out
	}
	for key, vals := range q {
		switch key {
		case "types":
			f.Types = list(key)
		case "groups":
			f.Groups = list(key)
		case "conns":
			f.Conns = nums(key, 64)
		case "pids":
			f.PIDs = convert[uint32](nums(key, 32))
		case "uids":
			f.UIDs = convert[uint32](nums(key, 32))
		case "comms":
			f.Comms = list(key)
		case "ports":
			f.Ports = convert[uint16](nums(key, 16))
		case "lports":
			f.LocalPorts = convert[uint16](nums(key, 16))
		case "rports":
			f.RemotePorts = convert[uint16](nums(key, 16))
		case "addrs":
			f.Addrs = list(key)
		case "netns":
			f.NetNS = list(key)
		case "protos":
			f.Protos = list(key)
		case "pcap":
			if len(vals) > 1 {
				return f, bad("pcap: give one expression (combine with and)")
			}
			f.Pcap = vals[0]
		case "expr":
			if len(vals) > 1 {
				return f, bad("expr: give one expression (combine with &&)")
			}
			f.Expr = vals[0]
		default:
			if !slices.Contains(extra, key) {
				return f, bad("unknown parameter %q", key)
			}
		}
	}
	return f, err
}

func convert[T uint16 | uint32](in []uint64) []T {
	if in == nil {
		return nil
	}
	out := make([]T, len(in))
	for i, v := range in {
		out[i] = T(v)
	}
	return out
}
