// SPDX-License-Identifier: Apache-2.0

package devskip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/sockowner"
)

// Link is what an interface says of itself (rtnetlink, RTM_GETLINK).
type Link struct {
	Name string
	Kind string // IFLA_INFO_KIND: "veth", "bridge", ...; "" for a physical device or lo
	XDP  bool   // an XDP program is attached
	GRO  bool   // generic receive offload is on (veth then receives in NAPI and merges)
	// From IFLA_STATS64 (struct rtnl_link_stats64).
	TxPackets, TxDropped, RxPackets, RxDropped uint64
}

// ErrBadDump is wrapped by parse errors of a link dump.
var ErrBadDump = errors.New("bad link dump")

// ReadLinks reads every interface of the network namespace at nsPath
// (a path that opens it: /proc/PID/ns/net, /run/netns/NAME), by ifindex.
func ReadLinks(nsPath string) (map[uint32]Link, error) {
	var links map[uint32]Link
	err := linksInNetNS(nsPath, func(read linkRead) error {
		var err error
		links, err = read(nil, nil)
		return err
	})
	return links, err
}

// linksIn enters the network namespace at path and calls fn with a reader
// of its interfaces, which fn may call as often as it likes while there.
type linksIn func(path string, fn func(read linkRead) error) error

// linkRead reads the interfaces' counters, calling before (if not nil)
// right before it asks the kernel for them and after (if not nil) as soon
// as the kernel gave them, before the rest of the work (parsing, asking
// each veth for GRO): the runs read in those are as near the counters as
// can be. An error from either is read's.
type linkRead func(before, after func() error) (map[uint32]Link, error)

// linksInNetNS is linksIn for the host: one entry into the namespace and
// one pair of sockets for all of fn's reads. A snapshot reads a namespace
// whose runs moved up to Tries times, and entering it, opening and binding
// a netlink socket each time was most of what a recorder did each second
// under traffic.
func linksInNetNS(path string, fn func(read linkRead) error) error {
	return sockowner.InNetNS(path, func() error {
		var lr linkReader
		defer lr.close()
		return fn(lr.read)
	})
}

// readLinksHere reads the interfaces of the calling thread's network
// namespace.
func readLinksHere() (map[uint32]Link, error) {
	var lr linkReader
	defer lr.close()
	return lr.read(nil, nil)
}

// linkReader reads the interfaces of the network namespace its sockets
// were opened in (that of the calling thread at its first read).
type linkReader struct {
	nl, eth int // netlink and ethtool sockets; 0 until opened
	seq     uint32
	buf     []byte // one datagram of the dump
	dump    []byte // the dump's messages
}

func (lr *linkReader) close() {
	if lr.nl > 0 {
		unix.Close(lr.nl)
	}
	if lr.eth > 0 {
		unix.Close(lr.eth)
	}
}

// read dumps the links (RTM_GETLINK) between before and after, then asks each veth whether GRO is
// on: only veth is compared (Compare), so only veth needs its GRO flag.
func (lr *linkReader) read(before, after func() error) (map[uint32]Link, error) {
	b, err := lr.dumpLinks(before)
	if err != nil {
		return nil, err
	}
	if after != nil {
		if err := after(); err != nil {
			return nil, err
		}
	}
	links, err := ParseLinkDump(b)
	if err != nil {
		return nil, err
	}
	for i, l := range links {
		if l.Kind != "veth" {
			continue
		}
		if lr.eth == 0 {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return nil, fmt.Errorf("socket for ethtool: %w", err)
			}
			lr.eth = fd
		}
		gro, err := groOn(lr.eth, l.Name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", l.Name, err)
		}
		l.GRO = gro
		links[i] = l
	}
	return links, nil
}

// dumpLinks sends an RTM_GETLINK dump request and returns the messages of
// the answer, up to and with NLMSG_DONE (or an NLMSG_ERROR), as
// syscall.NetlinkRIB does, on a socket kept for the next dump.
func (lr *linkReader) dumpLinks(before func() error) ([]byte, error) {
	if lr.nl == 0 {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
		if err != nil {
			return nil, fmt.Errorf("dump links: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("dump links: %w", err)
		}
		lr.nl = fd
		// The kernel fills a dump's datagrams up to the largest read it
		// saw, at most 32 KiB: one this large takes the fewest reads.
		lr.buf = make([]byte, 32<<10)
	}
	lr.seq++
	var req [unix.NLMSG_HDRLEN + unix.SizeofRtGenmsg]byte
	binary.NativeEndian.PutUint32(req[0:4], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:6], unix.RTM_GETLINK)
	binary.NativeEndian.PutUint16(req[6:8], unix.NLM_F_DUMP|unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(req[8:12], lr.seq)
	req[unix.NLMSG_HDRLEN] = unix.AF_UNSPEC
	if before != nil {
		if err := before(); err != nil {
			return nil, err
		}
	}
	if err := unix.Sendto(lr.nl, req[:], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("dump links: %w", err)
	}
	lr.dump = lr.dump[:0]
	for {
		n, _, err := unix.Recvfrom(lr.nl, lr.buf, 0)
		if err != nil {
			return nil, fmt.Errorf("dump links: %w", err)
		}
		b := lr.buf[:n]
		for len(b) >= unix.NLMSG_HDRLEN {
			m := binary.NativeEndian.Uint32(b[0:4])
			typ := binary.NativeEndian.Uint16(b[4:6])
			seq := binary.NativeEndian.Uint32(b[8:12])
			if m < unix.NLMSG_HDRLEN || uint64(m) > uint64(len(b)) {
				return nil, fmt.Errorf("%w: message length %d with %d bytes left", ErrBadDump, m, len(b))
			}
			msg := b[:min(len(b), align4(int(m)))]
			b = b[len(msg):]
			if seq != lr.seq {
				continue // the end of an earlier dump cut short by an error
			}
			lr.dump = append(lr.dump, msg...)
			if typ == unix.NLMSG_DONE || typ == unix.NLMSG_ERROR {
				return lr.dump, nil
			}
		}
	}
}

// groOn asks ETHTOOL_GGRO of interface name.
func groOn(fd int, name string) (bool, error) {
	val := struct{ cmd, data uint32 }{cmd: unix.ETHTOOL_GGRO}
	var ifr [unix.IFNAMSIZ + 24]byte
	copy(ifr[:unix.IFNAMSIZ-1], name)
	*(*uintptr)(unsafe.Pointer(&ifr[unix.IFNAMSIZ])) = uintptr(unsafe.Pointer(&val))
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
		return false, fmt.Errorf("ethtool GRO: %w", e)
	}
	return val.data != 0, nil
}

// ParseLinkDump reads the RTM_NEWLINK messages of an RTM_GETLINK dump, as
// NetlinkRIB returns it (messages up to NLMSG_DONE), by ifindex.
func ParseLinkDump(b []byte) (map[uint32]Link, error) {
	out := map[uint32]Link{}
	for len(b) > 0 {
		if len(b) < unix.NLMSG_HDRLEN {
			return nil, fmt.Errorf("%w: %d bytes left, short of a message header", ErrBadDump, len(b))
		}
		n := binary.NativeEndian.Uint32(b[0:4])
		typ := binary.NativeEndian.Uint16(b[4:6])
		if n < unix.NLMSG_HDRLEN || uint64(n) > uint64(len(b)) {
			return nil, fmt.Errorf("%w: message length %d with %d bytes left", ErrBadDump, n, len(b))
		}
		msg := b[unix.NLMSG_HDRLEN:n]
		b = b[min(len(b), align4(int(n))):]
		switch typ {
		case unix.NLMSG_DONE:
			return out, nil
		case unix.NLMSG_ERROR:
			return nil, fmt.Errorf("%w: error message", ErrBadDump)
		case unix.RTM_NEWLINK:
		default:
			continue
		}
		if len(msg) < unix.SizeofIfInfomsg {
			return nil, fmt.Errorf("%w: link message of %d bytes", ErrBadDump, len(msg))
		}
		ifindex := binary.NativeEndian.Uint32(msg[4:8])
		var l Link
		err := walkAttrs(msg[unix.SizeofIfInfomsg:], func(t uint16, v []byte) error {
			switch t {
			case unix.IFLA_IFNAME:
				l.Name = cString(v)
			case unix.IFLA_STATS64:
				// rx_packets, tx_packets, rx_bytes, tx_bytes, rx_errors,
				// tx_errors, rx_dropped, tx_dropped, ...
				if len(v) < 8*8 {
					return fmt.Errorf("%w: IFLA_STATS64 of %d bytes", ErrBadDump, len(v))
				}
				u := func(i int) uint64 { return binary.NativeEndian.Uint64(v[8*i:]) }
				l.RxPackets, l.TxPackets, l.RxDropped, l.TxDropped = u(0), u(1), u(6), u(7)
			case unix.IFLA_LINKINFO:
				return walkAttrs(v, func(t uint16, v []byte) error {
					if t == unix.IFLA_INFO_KIND {
						l.Kind = cString(v)
					}
					return nil
				})
			case unix.IFLA_XDP:
				return walkAttrs(v, func(t uint16, v []byte) error {
					if t == unix.IFLA_XDP_ATTACHED && len(v) > 0 && v[0] != 0 /* XDP_ATTACHED_NONE */ {
						l.XDP = true
					}
					return nil
				})
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("interface %d: %w", ifindex, err)
		}
		out[ifindex] = l
	}
	return out, nil
}

// walkAttrs calls fn with each route attribute in b (type without the
// nested and byte-order flags).
func walkAttrs(b []byte, fn func(t uint16, v []byte) error) error {
	for len(b) > 0 {
		if len(b) < unix.SizeofRtAttr {
			return fmt.Errorf("%w: %d bytes left, short of an attribute header", ErrBadDump, len(b))
		}
		n := int(binary.NativeEndian.Uint16(b[0:2]))
		t := binary.NativeEndian.Uint16(b[2:4]) & nlaTypeMask
		if n < unix.SizeofRtAttr || n > len(b) {
			return fmt.Errorf("%w: attribute length %d with %d bytes left", ErrBadDump, n, len(b))
		}
		if err := fn(t, b[unix.SizeofRtAttr:n]); err != nil {
			return err
		}
		b = b[min(len(b), align4(n)):]
	}
	return nil
}

// nlaTypeMask leaves out NLA_F_NESTED and NLA_F_NET_BYTEORDER.
const nlaTypeMask = 0x3fff

func align4(n int) int { return (n + 3) &^ 3 }

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
