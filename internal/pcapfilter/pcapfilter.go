// SPDX-License-Identifier: Apache-2.0

// Package pcapfilter parses the connection part of pcap-filter(7)
// expressions ("tcp port 443 and host 10.0.0.2"), the language of tcpdump,
// pwru and retis, and tests them against a connection's tuple. magnet's
// events are not packets: an expression selects connections, and an event
// matches when its connection does (docs/FILTERS.md). The parser checks
// everything and names the column of the first error: expressions come from
// users and from the daemon's clients.
package pcapfilter

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// MaxBytes bounds an expression; MaxDepth bounds its nesting.
const (
	MaxBytes = 4096
	MaxDepth = 64
)

// ErrSyntax marks every parse error.
var ErrSyntax = errors.New("pcap filter")

// Conn is what an expression sees of a connection: its protocol (6 TCP,
// 17 UDP) and its ends, the local one (this host's socket) first.
type Conn struct {
	Proto         uint8
	Local, Remote netip.AddrPort
}

// Expr is a compiled expression. It is immutable and safe for concurrent
// use.
type Expr struct {
	root node
	src  string
}

// String returns the expression in canonical form, fully parenthesized.
func (e *Expr) String() string { return e.root.String() }

// Source returns the expression as given.
func (e *Expr) Source() string { return e.src }

// Match reports whether c matches the expression.
func (e *Expr) Match(c Conn) bool {
	c.Local = netip.AddrPortFrom(c.Local.Addr().Unmap(), c.Local.Port())
	c.Remote = netip.AddrPortFrom(c.Remote.Addr().Unmap(), c.Remote.Port())
	return e.root.match(&c)
}

type node interface {
	match(*Conn) bool
	String() string
}

type andNode struct{ a, b node }
type orNode struct{ a, b node }
type notNode struct{ a node }

func (n andNode) match(c *Conn) bool { return n.a.match(c) && n.b.match(c) }
func (n orNode) match(c *Conn) bool  { return n.a.match(c) || n.b.match(c) }
func (n notNode) match(c *Conn) bool { return !n.a.match(c) }
func (n andNode) String() string     { return "(" + n.a.String() + " and " + n.b.String() + ")" }
func (n orNode) String() string      { return "(" + n.a.String() + " or " + n.b.String() + ")" }
func (n notNode) String() string     { return "not " + n.a.String() }

// dir is a primitive's direction qualifier. magnet's src is the
// connection's local end, dst its remote end (docs/FILTERS.md).
type dir uint8

const (
	dirEither dir = iota // none given, or "src or dst"
	dirSrc
	dirDst
	dirBoth // "src and dst"
)

func (d dir) prefix() string {
	return [...]string{"", "src ", "dst ", "src and dst "}[d]
}

// ends tests f on the ends d names.
func (d dir) ends(c *Conn, f func(netip.AddrPort) bool) bool {
	switch d {
	case dirSrc:
		return f(c.Local)
	case dirDst:
		return f(c.Remote)
	case dirBoth:
		return f(c.Local) && f(c.Remote)
	}
	return f(c.Local) || f(c.Remote)
}

// protoNode is "ip", "ip6", "tcp" or "udp" alone.
type protoNode struct{ name string }

func (n protoNode) match(c *Conn) bool {
	switch n.name {
	case "tcp":
		return c.Proto == 6
	case "udp":
		return c.Proto == 17
	case "ip":
		return c.Local.Addr().Is4()
	case "ip6":
		return c.Local.Addr().Is6()
	}
	return false
}
func (n protoNode) String() string { return n.name }

type netNode struct {
	d      dir
	prefix netip.Prefix
	host   bool // written as host: printed without the length
}

func (n netNode) match(c *Conn) bool {
	return n.d.ends(c, func(ap netip.AddrPort) bool { return n.prefix.Contains(ap.Addr()) })
}
func (n netNode) String() string {
	if n.host {
		return n.d.prefix() + "host " + n.prefix.Addr().String()
	}
	return n.d.prefix() + "net " + n.prefix.String()
}

type portNode struct {
	d      dir
	lo, hi uint16
}

func (n portNode) match(c *Conn) bool {
	// Ports belong to TCP and UDP; pcap's "port" means either.
	if c.Proto != 6 && c.Proto != 17 {
		return false
	}
	return n.d.ends(c, func(ap netip.AddrPort) bool { return ap.Port() >= n.lo && ap.Port() <= n.hi })
}
func (n portNode) String() string {
	if n.lo == n.hi {
		return n.d.prefix() + "port " + strconv.Itoa(int(n.lo))
	}
	return n.d.prefix() + "portrange " + strconv.Itoa(int(n.lo)) + "-" + strconv.Itoa(int(n.hi))
}

// Parse compiles a pcap-filter expression. An empty expression is an
// error: callers treat "no expression" themselves.
func Parse(src string) (*Expr, error) {
	if len(src) > MaxBytes {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrSyntax, len(src), MaxBytes)
	}
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks, src: src}
	if len(toks) == 0 {
		return nil, fmt.Errorf("%w: empty expression", ErrSyntax)
	}
	n, err := p.or(0)
	if err != nil {
		return nil, err
	}
	if p.i < len(p.toks) {
		t := p.toks[p.i]
		return nil, p.errAt(t, "unexpected %q (join primitives with and/or)", t.s)
	}
	return &Expr{root: n, src: src}, nil
}

type token struct {
	s   string
	pos int // byte offset in the source
}

func lex(src string) ([]token, error) {
	var toks []token
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '(' || c == ')' || c == '!':
			toks = append(toks, token{src[i : i+1], i})
			i++
		case c == '&' || c == '|':
			if i+1 >= len(src) || src[i+1] != c {
				return nil, fmt.Errorf("%w: column %d: %q: did you mean %q?", ErrSyntax, i+1, string(c), string(c)+string(c))
			}
			toks = append(toks, token{src[i : i+2], i})
			i += 2
		case isWord(c):
			j := i
			for j < len(src) && isWord(src[j]) {
				j++
			}
			toks = append(toks, token{src[i:j], i})
			i = j
		case strings.IndexByte("<>=[]", c) >= 0:
			// pcap-filter's arithmetic ("len > 100", "tcp[13] & 2 != 0")
			// is about packets: name the word it applies to when that is
			// one magnet refuses anyway.
			if n := len(toks); n > 0 {
				if why, bad := unsupported[strings.ToLower(toks[n-1].s)]; bad {
					return nil, fmt.Errorf("%w: column %d: %q is not supported: %s", ErrSyntax, toks[n-1].pos+1, toks[n-1].s, why)
				}
			}
			return nil, fmt.Errorf("%w: column %d: unexpected character %q: comparisons and packet bytes are not supported (an expression selects connections by protocol, address and port)", ErrSyntax, i+1, rune(c))
		default:
			return nil, fmt.Errorf("%w: column %d: unexpected character %q", ErrSyntax, i+1, rune(c))
		}
	}
	return toks, nil
}

func isWord(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == ':' || c == '/' || c == '-' || c == '_'
}

type parser struct {
	toks []token
	i    int
	src  string
	// last holds the qualifiers of the latest primitive with a value:
	// pcap-filter lets a bare value after and/or reuse them ("port 80 or
	// 443" is "port 80 or port 443").
	last *quals
}

type quals struct {
	proto string // "", ip, ip6, tcp, udp
	d     dir
	typ   string // host, net, port, portrange
}

func (p *parser) errAt(t token, format string, args ...any) error {
	return fmt.Errorf("%w: column %d: %s", ErrSyntax, t.pos+1, fmt.Sprintf(format, args...))
}

func (p *parser) errEnd(format string, args ...any) error {
	return fmt.Errorf("%w: column %d (end): %s", ErrSyntax, len(p.src)+1, fmt.Sprintf(format, args...))
}

func (p *parser) peek() (token, bool) {
	if p.i < len(p.toks) {
		return p.toks[p.i], true
	}
	return token{}, false
}

func (p *parser) peekIs(words ...string) bool {
	t, ok := p.peek()
	if !ok {
		return false
	}
	for _, w := range words {
		if strings.EqualFold(t.s, w) {
			return true
		}
	}
	return false
}

// or parses primitives joined by and/or: pcap-filter(7) gives the two equal
// precedence, left to right ("a or b and c" is "(a or b) and c"), unlike
// most languages.
func (p *parser) or(depth int) (node, error) {
	n, err := p.unary(depth)
	if err != nil {
		return nil, err
	}
	for p.peekIs("or", "||", "and", "&&") {
		isAnd := p.peekIs("and", "&&")
		p.i++
		m, err := p.unary(depth)
		if err != nil {
			return nil, err
		}
		if isAnd {
			n = andNode{n, m}
		} else {
			n = orNode{n, m}
		}
	}
	return n, nil
}

func (p *parser) unary(depth int) (node, error) {
	t, ok := p.peek()
	if !ok {
		return nil, p.errEnd("expression ends early")
	}
	if depth >= MaxDepth {
		return nil, p.errAt(t, "nested deeper than %d", MaxDepth)
	}
	switch {
	case strings.EqualFold(t.s, "not") || t.s == "!":
		p.i++
		n, err := p.unary(depth + 1)
		if err != nil {
			return nil, err
		}
		return notNode{n}, nil
	case t.s == "(":
		p.i++
		n, err := p.or(depth + 1)
		if err != nil {
			return nil, err
		}
		if c, ok := p.peek(); !ok {
			return nil, p.errEnd("missing ) for the ( at column %d", t.pos+1)
		} else if c.s != ")" {
			return nil, p.errAt(c, "expected ), got %q", c.s)
		}
		p.i++
		return n, nil
	}
	return p.primitive()
}

var protos = map[string]bool{"ip": true, "ip6": true, "tcp": true, "udp": true}

// unsupported names pcap-filter keywords magnet has nothing for, so that
// they get a clear error rather than "not an address".
var unsupported = map[string]string{
	"ether": "magnet sees sockets, not link-layer headers", "arp": "magnet sees sockets, not ARP",
	"rarp": "magnet sees sockets, not ARP", "icmp": "magnet records TCP and UDP connections",
	"icmp6": "magnet records TCP and UDP connections", "sctp": "magnet records TCP and UDP connections",
	"vlan": "magnet sees sockets, not link-layer headers", "less": "events have no packet length here",
	"greater": "events have no packet length here", "len": "events have no packet length here",
	"gateway": "magnet sees sockets, not link-layer headers", "broadcast": "magnet sees sockets, not link-layer headers",
	"multicast": "magnet sees sockets, not link-layer headers", "proto": "give tcp or udp",
	"inbound": "give src or dst", "outbound": "give src or dst", "mask": `write net A.B.C.D/LEN (or "net A.B.C.D mask M" after net)`,
}

// primitive parses [proto] [dir] [type] [value], or a bare value that
// reuses the latest qualifiers.
func (p *parser) primitive() (node, error) {
	start, _ := p.peek()
	var q quals
	var given bool // any qualifier written
	if t, _ := p.peek(); protos[strings.ToLower(t.s)] {
		q.proto, given = strings.ToLower(t.s), true
		p.i++
	}
	if p.peekIs("src", "dst") {
		t, _ := p.peek()
		given = true
		q.d = dirSrc
		if strings.EqualFold(t.s, "dst") {
			q.d = dirDst
		}
		p.i++
		// "src or dst" and "src and dst" are one qualifier when a type
		// keyword follows them.
		if p.peekIs("or", "and") && p.i+1 < len(p.toks) && p.isDirWord(p.toks[p.i+1].s) && p.i+2 < len(p.toks) {
			other := strings.ToLower(p.toks[p.i+1].s)
			if (q.d == dirSrc) != (other == "src") {
				if strings.EqualFold(p.toks[p.i].s, "or") {
					q.d = dirEither
				} else {
					q.d = dirBoth
				}
				p.i += 2
			}
		}
	}
	if p.peekIs("host", "net", "port", "portrange") {
		t, _ := p.peek()
		q.typ, given = strings.ToLower(t.s), true
		p.i++
	}
	t, ok := p.peek()
	valueNext := ok && !p.isKeyword(t.s)
	switch {
	case !given && valueNext && p.last != nil:
		q = *p.last // "port 80 or 443"
	case !given:
		if !ok {
			return nil, p.errEnd("expression ends early")
		}
		if why, bad := unsupported[strings.ToLower(t.s)]; bad {
			return nil, p.errAt(t, "%q is not supported: %s", t.s, why)
		}
		if p.isKeyword(t.s) {
			return nil, p.errAt(t, "unexpected %q", t.s)
		}
		// A value with no qualifier: pcap takes it as a host.
		q.typ = "host"
	case q.typ == "" && !valueNext:
		// A protocol alone ("tcp"), or a direction with nothing after it.
		if q.d != dirEither || q.proto == "" {
			if ok {
				return nil, p.errAt(t, "expected host, net, port or portrange, got %q", t.s)
			}
			return nil, p.errEnd("expected host, net, port or portrange")
		}
		return protoNode{q.proto}, nil
	case q.typ == "":
		q.typ = "host" // "src 10.0.0.1"
	}
	if !ok || !valueNext {
		if ok {
			return nil, p.errAt(t, "%s needs a value, got %q", q.typ, t.s)
		}
		return nil, p.errEnd("%s needs a value", q.typ)
	}
	p.i++
	var n node
	switch q.typ {
	case "host":
		a, err := netip.ParseAddr(t.s)
		if err != nil || a.Zone() != "" {
			return nil, p.errAt(t, "%q is not an IP address (host names are not resolved)", t.s)
		}
		a = a.Unmap()
		n = netNode{d: q.d, prefix: netip.PrefixFrom(a, a.BitLen()), host: true}
	case "net":
		pfx, err := p.netValue(t)
		if err != nil {
			return nil, err
		}
		n = netNode{d: q.d, prefix: pfx}
	case "port":
		v, err := strconv.ParseUint(t.s, 10, 16)
		if err != nil {
			return nil, p.errAt(t, "%q is not a port number 0-65535 (port names are not resolved)", t.s)
		}
		n = portNode{d: q.d, lo: uint16(v), hi: uint16(v)}
	case "portrange":
		los, his, found := strings.Cut(t.s, "-")
		lo, err1 := strconv.ParseUint(los, 10, 16)
		hi, err2 := strconv.ParseUint(his, 10, 16)
		if !found || err1 != nil || err2 != nil {
			return nil, p.errAt(t, "%q is not a port range LOW-HIGH of numbers 0-65535", t.s)
		}
		if lo > hi {
			lo, hi = hi, lo // as pcap-filter does
		}
		n = portNode{d: q.d, lo: uint16(lo), hi: uint16(hi)}
	}
	if q.proto != "" {
		if (q.proto == "tcp" || q.proto == "udp") && q.typ != "port" && q.typ != "portrange" {
			return nil, p.errAt(start, "%s %s: tcp and udp qualify port and portrange only (write \"%s and %s ...\")", q.proto, q.typ, q.proto, q.typ)
		}
		if err := p.checkFamily(q.proto, n, start); err != nil {
			return nil, err
		}
		n = andNode{protoNode{q.proto}, n}
	}
	qq := q
	p.last = &qq
	return n, nil
}

// checkFamily refuses "ip host ::1" and "ip6 net 10.0.0.0/8", as pcap does.
func (p *parser) checkFamily(proto string, n node, at token) error {
	nn, ok := n.(netNode)
	if !ok {
		return nil
	}
	if proto == "ip" && !nn.prefix.Addr().Is4() || proto == "ip6" && !nn.prefix.Addr().Is6() {
		return p.errAt(at, "%s with an address of the other family never matches", proto)
	}
	return nil
}

// netValue parses "A.B.C.D/LEN", "A:B::/LEN", a bare address, or
// "A.B.C.D mask M.M.M.M".
func (p *parser) netValue(t token) (netip.Prefix, error) {
	var pfx netip.Prefix
	if strings.Contains(t.s, "/") {
		var err error
		pfx, err = netip.ParsePrefix(t.s)
		if err != nil {
			return pfx, p.errAt(t, "%q is not a network ADDRESS/LENGTH", t.s)
		}
	} else {
		a, err := netip.ParseAddr(t.s)
		if err != nil || a.Zone() != "" {
			return pfx, p.errAt(t, "%q is not a network ADDRESS/LENGTH", t.s)
		}
		pfx = netip.PrefixFrom(a, a.BitLen())
		if p.peekIs("mask") {
			p.i++
			m, ok := p.peek()
			if !ok {
				return pfx, p.errEnd("mask needs a value")
			}
			p.i++
			ma, err := netip.ParseAddr(m.s)
			if err != nil || !ma.Is4() || !a.Is4() {
				return pfx, p.errAt(m, "%q is not an IPv4 netmask for an IPv4 network", m.s)
			}
			bits, ok := maskBits(ma.As4())
			if !ok {
				return pfx, p.errAt(m, "%q is not a contiguous netmask", m.s)
			}
			pfx = netip.PrefixFrom(a, bits)
		}
	}
	if pfx.Addr().Is4In6() {
		pfx = netip.PrefixFrom(pfx.Addr().Unmap(), max(pfx.Bits()-96, 0))
	}
	if pfx.Masked() != pfx {
		// pcap-filter refuses host bits set in a network, a likely typo.
		return pfx, p.errAt(t, "%q has host bits set (did you mean %s?)", t.s, pfx.Masked())
	}
	return pfx, nil
}

func maskBits(m [4]byte) (int, bool) {
	v := uint32(m[0])<<24 | uint32(m[1])<<16 | uint32(m[2])<<8 | uint32(m[3])
	n := 0
	for v&(1<<31) != 0 {
		n++
		v <<= 1
	}
	return n, v == 0
}

func (p *parser) isDirWord(s string) bool {
	return strings.EqualFold(s, "src") || strings.EqualFold(s, "dst")
}

func (p *parser) isKeyword(s string) bool {
	switch strings.ToLower(s) {
	case "and", "or", "not", "(", ")", "!", "&&", "||", "src", "dst", "host", "net", "port", "portrange", "mask",
		"ip", "ip6", "tcp", "udp":
		return true
	}
	_, bad := unsupported[strings.ToLower(s)]
	return bad
}
