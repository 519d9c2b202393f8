// SPDX-License-Identifier: Apache-2.0

package devskip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
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
	err := sockowner.InNetNS(nsPath, func() error {
		var err error
		links, err = readLinksHere()
		return err
	})
	return links, err
}

// readLinksHere reads the interfaces of the calling thread's network
// namespace.
func readLinksHere() (map[uint32]Link, error) {
	b, err := syscall.NetlinkRIB(unix.RTM_GETLINK, unix.AF_UNSPEC)
	if err != nil {
		return nil, fmt.Errorf("dump links: %w", err)
	}
	links, err := ParseLinkDump(b)
	if err != nil {
		return nil, err
	}
	// Only veth is compared (Compare), so only veth needs its GRO flag.
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket for ethtool: %w", err)
	}
	defer unix.Close(fd)
	for i, l := range links {
		if l.Kind != "veth" {
			continue
		}
		gro, err := groOn(fd, l.Name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", l.Name, err)
		}
		l.GRO = gro
		links[i] = l
	}
	return links, nil
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
