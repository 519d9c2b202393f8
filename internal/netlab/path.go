// SPDX-License-Identifier: Apache-2.0

package netlab

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
)

// Interface names of a Path. Like those of a Lab, each lives in its own
// namespace.
const (
	hostIface       = "veth0" // the only interface of the sender, receiver and cross host
	routerToSender  = "tosnd"
	routerToRecv    = "torcv" // the bottleneck
	routerToCross   = "tocrs"
	pathFrameHeader = 14 // Ethernet header tc counts in every packet on a veth
)

// pathBase is the /16 every path takes its /28 from; each of its /30s is
// one link.
var pathBase = netip.MustParseAddr("10.201.0.0")

// Namespace name suffixes of a Path, one per role.
const (
	roleSender   = "snd"
	roleRouter   = "rtr"
	roleReceiver = "rcv"
	roleCross    = "crs"
)

// PathOptions configures NewPath.
type PathOptions struct {
	// Name is the prefix of the namespace names; DefaultName if empty.
	// A unique suffix is added as for Options.Name.
	Name string
	// BottleneckMbit limits the router's egress toward the receiver with a
	// tc tbf qdisc; 0 leaves the path unlimited.
	BottleneckMbit int
	// BurstBytes is the tbf bucket; 0 means BurstFor(BottleneckMbit). A
	// bucket of about one frame makes tbf behave like a link of that rate:
	// a packet leaves only once the previous one would have been
	// serialized. A large bucket lets bursts through at once, so over
	// short times the path carries more than its rate.
	BurstBytes int
	// QueueBytes is the tbf queue limit; 0 means 50 ms at the bottleneck
	// rate, at least 256 KiB.
	QueueBytes int
	// Cross adds a fourth namespace joined to the router by its own link,
	// whose traffic toward the receiver shares the bottleneck but not the
	// sender's link: cross traffic injected at the router.
	Cross bool
	// IPv6 gives every link an IPv6 /64 too (unique local addresses,
	// fd00::/8, without duplicate address detection so that they work at
	// once), routed like the IPv4 ones: each host's Addr6 is set.
	IPv6 bool
}

// MaxFrame is the largest frame on a path's links, as tbf counts it.
const MaxFrame = 1500 + pathFrameHeader

// BurstFor returns the bottleneck bucket used when none is given: two
// full frames, or 30 µs worth of the rate if that is more. One frame is
// the least that lets every packet through, but then a tbf timer that
// fires late (its dequeue runs in a softirq, which a busy host defers to
// ksoftirqd) costs rate at once; the second frame absorbs a delay of one
// frame time. Any more would let bursts through faster than the rate: a
// probe stream of S bytes would see up to B/S more bandwidth than there
// is.
func BurstFor(rateMbit int) int {
	return max(2*MaxFrame, rateMbit*1000*1000/8*30/1000/1000)
}

// Path is a routed path of network namespaces: sender → router → receiver,
// each hop its own veth link and /30, the router forwarding between them,
// optionally with a cross-traffic host also joined to the router. The
// bottleneck, when set, is a tbf on the router's egress toward the receiver.
// Create one with NewPath and release it with Close.
type Path struct {
	// Sender, Receiver and Cross are the end hosts; Cross.NS is empty
	// unless PathOptions.Cross was set. Their Iface is their only link.
	Sender, Receiver, Cross Host
	// Router is the middle namespace; its Addr and Iface are its side of
	// the receiver's link, whose egress is the bottleneck.
	Router Host
	// BottleneckMbit, BurstBytes and QueueBytes describe the tbf in
	// place; BottleneckMbit is 0 when the path is unlimited.
	BottleneckMbit, BurstBytes, QueueBytes int

	mu          sync.Mutex
	created     []string
	crossShaped bool
}

// pathCounter numbers the paths made by this process.
var pathCounter atomic.Uint32

// NewPath creates a routed path. On failure it removes whatever it made.
// The caller must Close the returned Path.
func NewPath(opts PathOptions) (*Path, error) {
	prefix := opts.Name
	if prefix == "" {
		prefix = DefaultName
	}
	if !validName(prefix) {
		return nil, fmt.Errorf("netlab: invalid name %q (use letters, digits, '-', '_', '.')", prefix)
	}
	if opts.BottleneckMbit < 0 || opts.BurstBytes < 0 || opts.QueueBytes < 0 {
		return nil, errors.New("netlab: negative bottleneck rate, burst or queue")
	}
	n := pathCounter.Add(1)
	var rnd [2]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("netlab: random name suffix: %w", err)
	}
	base := fmt.Sprintf("%s-%d-%d-%s", prefix, os.Getpid(), n, hex.EncodeToString(rnd[:]))
	p := &Path{
		Sender:   Host{NS: base + "-" + roleSender, Iface: hostIface},
		Router:   Host{NS: base + "-" + roleRouter, Iface: routerToRecv},
		Receiver: Host{NS: base + "-" + roleReceiver, Iface: hostIface},
	}
	if opts.Cross {
		p.Cross = Host{NS: base + "-" + roleCross, Iface: hostIface}
	}
	if err := p.setup(pathSubnet(uint32(os.Getpid()), n), opts); err != nil {
		if cerr := p.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, fmt.Errorf("netlab: %w", err)
	}
	return p, nil
}

// pathBase6 is the /32 of unique local addresses every path's IPv6 links
// take their /64s from: fd00:201:<path>:<link>::/64, path being the
// index its IPv4 /28 has in pathBase.
var pathBase6 = netip.MustParseAddr("fd00:201::")

// link6 returns the IPv6 /64 of link i of the path whose IPv4 block is
// block.
func link6(block netip.Prefix, i int) netip.Prefix {
	b4 := block.Addr().As4()
	idx := uint16(b4[2])<<4 | uint16(b4[3])>>4
	b := pathBase6.As16()
	b[4], b[5] = byte(idx>>8), byte(idx)
	b[6], b[7] = 0, byte(i)
	return netip.PrefixFrom(netip.AddrFrom16(b), 64)
}

// pathSubnet returns the /28 of path number n of process pid. Paths live
// in namespaces of their own, so two paths that get the same /28 still
// share nothing.
func pathSubnet(pid, n uint32) netip.Prefix {
	const slots = 1 << 12 // /28s in a /16
	idx := (pid*16 + n) % slots
	b := pathBase.As4()
	b[2] = byte(idx >> 4)
	b[3] = byte(idx&15) * 16
	return netip.PrefixFrom(netip.AddrFrom4(b), 28)
}

// link is one /30 of a path: host a (first address) and host b (second).
type link struct {
	a, b         *Host
	aDev, bDev   string
	subnet       netip.Prefix
	aAddr, bAddr netip.Addr
}

func (p *Path) setup(block netip.Prefix, opts PathOptions) error {
	hosts := []*Host{&p.Sender, &p.Router, &p.Receiver}
	if p.Cross.NS != "" {
		hosts = append(hosts, &p.Cross)
	}
	for _, h := range hosts {
		if err := ip("netns", "add", h.NS); err != nil {
			return err
		}
		p.mu.Lock()
		p.created = append(p.created, h.NS)
		p.mu.Unlock()
		if opts.IPv6 {
			// Without duplicate address detection on the links made
			// from now on, their link-local addresses, which neighbour
			// discovery speaks from, work at once instead of after a
			// second or two.
			if err := h.Do(func() error {
				return os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0\n"), 0o644)
			}); err != nil {
				return fmt.Errorf("turn off duplicate address detection in %s: %w", h.NS, err)
			}
		}
	}
	quarter := func(i int) netip.Prefix {
		b := block.Addr().As4()
		b[3] += byte(4 * i)
		return netip.PrefixFrom(netip.AddrFrom4(b), 30)
	}
	// The router is host a of every link; the end host is b.
	router := p.Router // a copy whose Iface varies per link
	links := []link{
		{a: &router, b: &p.Sender, aDev: routerToSender, bDev: hostIface, subnet: quarter(0)},
		{a: &router, b: &p.Receiver, aDev: routerToRecv, bDev: hostIface, subnet: quarter(1)},
	}
	if p.Cross.NS != "" {
		links = append(links, link{a: &router, b: &p.Cross, aDev: routerToCross, bDev: hostIface, subnet: quarter(2)})
	}
	for i := range links {
		l := &links[i]
		l.aAddr = l.subnet.Addr().Next()
		l.bAddr = l.aAddr.Next()
		// Made in the end host's namespace with the peer sent straight to
		// the router: the host's own namespace is never touched.
		if err := ip("-n", l.b.NS, "link", "add", l.bDev, "type", "veth",
			"peer", "name", l.aDev, "netns", l.a.NS); err != nil {
			return err
		}
		bits := strconv.Itoa(l.subnet.Bits())
		for _, side := range []struct {
			ns, dev string
			addr    netip.Addr
		}{{l.a.NS, l.aDev, l.aAddr}, {l.b.NS, l.bDev, l.bAddr}} {
			if err := ip("-n", side.ns, "addr", "add", side.addr.String()+"/"+bits, "dev", side.dev); err != nil {
				return err
			}
			if err := ip("-n", side.ns, "link", "set", side.dev, "up"); err != nil {
				return err
			}
		}
		l.b.Addr = l.bAddr
		if err := ip("-n", l.b.NS, "route", "add", "default", "via", l.aAddr.String()); err != nil {
			return err
		}
		if l.aDev == routerToRecv {
			p.Router.Addr = l.aAddr
		}
		if opts.IPv6 {
			a6, err := p.addLink6(l, link6(block, i))
			if err != nil {
				return err
			}
			if l.aDev == routerToRecv {
				p.Router.Addr6 = a6
			}
		}
	}
	for _, h := range hosts {
		if err := ip("-n", h.NS, "link", "set", "lo", "up"); err != nil {
			return err
		}
	}
	if err := p.Router.Do(func() error {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil || !opts.IPv6 {
			return err
		}
		return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1\n"), 0o644)
	}); err != nil {
		return fmt.Errorf("enable forwarding in %s: %w", p.Router.NS, err)
	}
	if opts.BottleneckMbit > 0 {
		if err := p.SetBottleneck(opts.BottleneckMbit, opts.BurstBytes, opts.QueueBytes); err != nil {
			return err
		}
	}
	for _, h := range hosts {
		if err := h.fill(); err != nil {
			return err
		}
	}
	return nil
}

// addLink6 gives link l the IPv6 subnet sub: the router ::1, the end
// host ::2 (its Addr6) with a default route through the router. It
// returns the router's address. The addresses skip duplicate address
// detection, which would leave them unusable for a second or more.
func (p *Path) addLink6(l *link, sub netip.Prefix) (netip.Addr, error) {
	a := sub.Addr().Next()
	b := a.Next()
	for _, side := range []struct {
		ns, dev string
		addr    netip.Addr
	}{{l.a.NS, l.aDev, a}, {l.b.NS, l.bDev, b}} {
		if err := ip("-n", side.ns, "-6", "addr", "add", side.addr.String()+"/64", "dev", side.dev, "nodad"); err != nil {
			return netip.Addr{}, err
		}
	}
	if err := ip("-n", l.b.NS, "-6", "route", "add", "default", "via", a.String()); err != nil {
		return netip.Addr{}, err
	}
	l.b.Addr6 = b
	return a, nil
}

// SetBottleneck puts (or replaces) the tbf on the router's egress toward
// the receiver: rateMbit Mbit/s, a bucket of burst bytes (0: BurstFor)
// and a queue of queue bytes (0: 50 ms at the rate, at least 256 KiB).
// tbf counts every packet with its 14-byte Ethernet header.
func (p *Path) SetBottleneck(rateMbit, burst, queue int) error {
	if rateMbit <= 0 || burst < 0 || queue < 0 {
		return fmt.Errorf("bottleneck: rate %d Mbit/s, burst %d, queue %d: want a positive rate", rateMbit, burst, queue)
	}
	if burst == 0 {
		burst = BurstFor(rateMbit)
	}
	if queue == 0 {
		queue = max(rateMbit*1000*1000/8*50/1000, 256<<10)
	}
	err := run("tc", "-n", p.Router.NS, "qdisc", "replace", "dev", routerToRecv, "root", "tbf",
		"rate", strconv.Itoa(rateMbit)+"mbit", "burst", strconv.Itoa(burst), "limit", strconv.Itoa(queue))
	if err != nil {
		return err
	}
	p.BottleneckMbit, p.BurstBytes, p.QueueBytes = rateMbit, burst, queue
	return nil
}

// RemoveBottleneck takes the tbf off the router's egress.
func (p *Path) RemoveBottleneck() error {
	if p.BottleneckMbit == 0 {
		return nil
	}
	if err := run("tc", "-n", p.Router.NS, "qdisc", "del", "dev", routerToRecv, "root"); err != nil {
		return err
	}
	p.BottleneckMbit, p.BurstBytes, p.QueueBytes = 0, 0, 0
	return nil
}

// BottleneckBits returns the bit rate, counted as tbf counts (with the
// 14-byte Ethernet header), that the bottleneck offers to IP packets of
// ipBytes bytes: BottleneckMbit scaled by ipBytes/(ipBytes+14). It is 0 on
// an unlimited path.
func (p *Path) BottleneckBits(ipBytes int) float64 {
	return float64(p.BottleneckMbit) * 1e6 * FrameShare(ipBytes)
}

// FrameShare returns the share of a veth frame that an IP packet of ipBytes
// bytes is: ipBytes/(ipBytes+14).
func FrameShare(ipBytes int) float64 {
	return float64(ipBytes) / float64(ipBytes+pathFrameHeader)
}

// Close deletes the path's namespaces, which takes the links with them.
// It is safe to call more than once and after a failed setup.
func (p *Path) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	var left []string
	for _, ns := range p.created {
		if err := deleteNS(ns); err != nil {
			errs = append(errs, err)
			left = append(left, ns)
		}
	}
	p.created = left
	return errors.Join(errs...)
}

// Command returns a command that runs name with args inside h's network
// namespace, through ip netns exec.
func (p *Path) Command(h Host, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// isPathRole reports whether s is the role suffix of a Path namespace.
func isPathRole(s string) bool {
	switch s {
	case roleSender, roleRouter, roleReceiver, roleCross:
		return true
	}
	return false
}

// ShapeCross paces the cross host's egress toward the router with a tbf
// at bps bits per second (Ethernet headers counted) and a bucket of burst
// bytes (0: two full frames), so that a sender that writes as fast as
// its socket lets it makes constant-rate cross traffic. bps 0 removes the
// shaping.
func (p *Path) ShapeCross(bps float64, burst int) error {
	if p.Cross.NS == "" {
		return errors.New("shape cross traffic: the path has no cross host")
	}
	if bps < 0 || burst < 0 {
		return fmt.Errorf("shape cross traffic: negative rate %v or burst %d", bps, burst)
	}
	if bps == 0 {
		if !p.crossShaped {
			return nil
		}
		if err := run("tc", "-n", p.Cross.NS, "qdisc", "del", "dev", hostIface, "root"); err != nil {
			return err
		}
		p.crossShaped = false
		return nil
	}
	if burst == 0 {
		burst = 2 * MaxFrame
	}
	// The queue only needs to keep the bucket busy; the sender blocks on
	// its socket buffer long before it fills.
	err := run("tc", "-n", p.Cross.NS, "qdisc", "replace", "dev", hostIface, "root", "tbf",
		"rate", strconv.FormatInt(int64(bps), 10)+"bit", "burst", strconv.Itoa(burst), "limit", strconv.Itoa(1<<20))
	if err != nil {
		return err
	}
	p.crossShaped = true
	return nil
}
