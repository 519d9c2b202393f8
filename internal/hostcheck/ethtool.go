// SPDX-License-Identifier: Apache-2.0

package hostcheck

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// errUnsupported reports that a driver does not implement an ethtool query.
var errUnsupported = errors.New("unsupported by driver")

// ethtoolGenlVersion is ETHTOOL_GENL_VERSION from <linux/ethtool_netlink.h>.
const ethtoolGenlVersion = 1

// speedUnknown is SPEED_UNKNOWN from <linux/ethtool.h>.
const speedUnknown = 0xffffffff

// Names of the netdev features, as the kernel spells them in
// net/ethtool/common.c, that change what a packet timestamp means.
const (
	featureGRO   = "rx-gro"
	featureGROHW = "rx-gro-hw"
	featureLRO   = "rx-lro"
	featureGSO   = "tx-generic-segmentation"
	featureTSO   = "tx-tcp-segmentation"
)

// ethtoolConn is a generic netlink socket talking to the kernel's "ethtool"
// family. It belongs to the network namespace of the thread that opened it.
// The caller must Close it.
type ethtoolConn struct {
	fd     int
	seq    uint32
	family uint16
}

// dialEthtool opens a generic netlink socket and resolves the ethtool
// family (Linux 5.6 and later).
func dialEthtool() (*ethtoolConn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_GENERIC)
	if err != nil {
		return nil, fmt.Errorf("open generic netlink socket: %w", err)
	}
	c := &ethtoolConn{fd: fd}
	// A reply never takes long; the timeout only guards against a kernel
	// that never answers.
	tv := unix.Timeval{Sec: 2}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		c.Close()
		return nil, fmt.Errorf("set netlink receive timeout: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		c.Close()
		return nil, fmt.Errorf("bind generic netlink socket: %w", err)
	}
	name := append([]byte(unix.ETHTOOL_GENL_NAME), 0)
	attrs, err := c.request(unix.GENL_ID_CTRL, unix.CTRL_CMD_GETFAMILY, 1,
		appendAttr(nil, unix.CTRL_ATTR_FAMILY_NAME, name))
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("look up genetlink family %q: %w", unix.ETHTOOL_GENL_NAME, err)
	}
	id, ok := attrs[unix.CTRL_ATTR_FAMILY_ID]
	if !ok || len(id) < 2 {
		c.Close()
		return nil, fmt.Errorf("look up genetlink family %q: no family id in reply", unix.ETHTOOL_GENL_NAME)
	}
	c.family = binary.NativeEndian.Uint16(id)
	return c, nil
}

// Close releases the socket.
func (c *ethtoolConn) Close() error {
	return unix.Close(c.fd)
}

// linkSpeed returns the link speed of the interface with the given index in
// Mb/s, 0 when the driver does not know it (no carrier, virtual device).
func (c *ethtoolConn) linkSpeed(ifindex int) (int64, error) {
	attrs, err := c.ethtool(unix.ETHTOOL_MSG_LINKMODES_GET, ifindex, unix.ETHTOOL_FLAG_COMPACT_BITSETS)
	if err != nil {
		return 0, err
	}
	v, ok := attrs[unix.ETHTOOL_A_LINKMODES_SPEED]
	if !ok || len(v) < 4 {
		return 0, nil
	}
	s := binary.NativeEndian.Uint32(v)
	if s == speedUnknown {
		return 0, nil
	}
	return int64(s), nil
}

// offloads returns the active receive and segmentation offloads of the
// interface with the given index.
func (c *ethtoolConn) offloads(ifindex int) (*Offloads, error) {
	attrs, err := c.ethtool(unix.ETHTOOL_MSG_FEATURES_GET, ifindex, 0)
	if err != nil {
		return nil, err
	}
	v, ok := attrs[unix.ETHTOOL_A_FEATURES_ACTIVE]
	if !ok {
		return nil, errors.New("no active feature set in reply")
	}
	active, err := parseBitset(v)
	if err != nil {
		return nil, fmt.Errorf("parse active features: %w", err)
	}
	return &Offloads{
		GRO:   active[featureGRO],
		GROHW: active[featureGROHW],
		LRO:   active[featureLRO],
		GSO:   active[featureGSO],
		TSO:   active[featureTSO],
	}, nil
}

// coalesce returns the receive interrupt coalescing settings of the
// interface with the given index. Settings the driver does not report are
// left nil.
func (c *ethtoolConn) coalesce(ifindex int) (*Coalesce, error) {
	attrs, err := c.ethtool(unix.ETHTOOL_MSG_COALESCE_GET, ifindex, 0)
	if err != nil {
		return nil, err
	}
	var co Coalesce
	if v, ok := attrs[unix.ETHTOOL_A_COALESCE_RX_USECS]; ok && len(v) >= 4 {
		u := binary.NativeEndian.Uint32(v)
		co.RxUsecs = &u
	}
	if v, ok := attrs[unix.ETHTOOL_A_COALESCE_RX_MAX_FRAMES]; ok && len(v) >= 4 {
		f := binary.NativeEndian.Uint32(v)
		co.RxFrames = &f
	}
	if v, ok := attrs[unix.ETHTOOL_A_COALESCE_USE_ADAPTIVE_RX]; ok && len(v) >= 1 {
		a := v[0] != 0
		co.AdaptiveRx = &a
	}
	return &co, nil
}

// ethtool sends one ethtool GET request for ifindex and returns the
// top-level attributes of the reply. A driver without the operation
// yields errUnsupported.
func (c *ethtoolConn) ethtool(cmd uint8, ifindex int, flags uint32) (map[uint16][]byte, error) {
	var hdr []byte
	hdr = appendAttr(hdr, unix.ETHTOOL_A_HEADER_DEV_INDEX, binary.NativeEndian.AppendUint32(nil, uint32(ifindex)))
	if flags != 0 {
		hdr = appendAttr(hdr, unix.ETHTOOL_A_HEADER_FLAGS, binary.NativeEndian.AppendUint32(nil, flags))
	}
	// Every ethtool request has its header nest as attribute 1.
	req := appendAttr(nil, 1|unix.NLA_F_NESTED, hdr)
	attrs, err := c.request(c.family, cmd, ethtoolGenlVersion, req)
	if errors.Is(err, unix.EOPNOTSUPP) {
		return nil, errUnsupported
	}
	return attrs, err
}

// request sends a generic netlink request and returns the attributes of
// its single reply.
func (c *ethtoolConn) request(family uint16, cmd, version uint8, attrs []byte) (map[uint16][]byte, error) {
	c.seq++
	msg := make([]byte, unix.NLMSG_HDRLEN+unix.GENL_HDRLEN, unix.NLMSG_HDRLEN+unix.GENL_HDRLEN+len(attrs))
	msg = append(msg, attrs...)
	binary.NativeEndian.PutUint32(msg[0:4], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:6], family)
	binary.NativeEndian.PutUint16(msg[6:8], unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(msg[8:12], c.seq)
	msg[unix.NLMSG_HDRLEN] = cmd
	msg[unix.NLMSG_HDRLEN+1] = version
	if err := unix.Sendto(c.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("send netlink request: %w", err)
	}
	buf := make([]byte, 64*1024)
	for {
		n, _, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("receive netlink reply: %w", os.NewSyscallError("recvfrom", err))
		}
		for b := buf[:n]; len(b) >= unix.NLMSG_HDRLEN; {
			l := int(binary.NativeEndian.Uint32(b[0:4]))
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				return nil, fmt.Errorf("parse netlink reply: bad message length %d", l)
			}
			typ := binary.NativeEndian.Uint16(b[4:6])
			seq := binary.NativeEndian.Uint32(b[8:12])
			data := b[unix.NLMSG_HDRLEN:l]
			b = b[min(nlmsgAlign(l), len(b)):]
			if seq != c.seq {
				continue // a late answer to an earlier request
			}
			switch typ {
			case unix.NLMSG_ERROR:
				if len(data) < 4 {
					return nil, errors.New("short netlink error message")
				}
				if code := int32(binary.NativeEndian.Uint32(data)); code != 0 {
					return nil, unix.Errno(-code)
				}
				return nil, errors.New("netlink acknowledged without a reply")
			case unix.NLMSG_DONE:
				return nil, errors.New("netlink reply ended without data")
			default:
				if len(data) < unix.GENL_HDRLEN {
					return nil, errors.New("short generic netlink reply")
				}
				return parseAttrs(data[unix.GENL_HDRLEN:])
			}
		}
	}
}

// nlmsgAlign rounds n up to the netlink message alignment of 4 bytes.
func nlmsgAlign(n int) int {
	return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1)
}

// appendAttr appends one netlink attribute, padded to 4 bytes, to b.
func appendAttr(b []byte, typ uint16, value []byte) []byte {
	l := unix.NLA_HDRLEN + len(value)
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, value...)
	for range nlaAlign(l) - l {
		b = append(b, 0)
	}
	return b
}

// nlaAlign rounds n up to the netlink attribute alignment of 4 bytes.
func nlaAlign(n int) int {
	return (n + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
}

// parseAttrs splits b into netlink attributes keyed by type, with the
// nested and byte-order flags masked off. A later attribute of the same
// type replaces an earlier one.
func parseAttrs(b []byte) (map[uint16][]byte, error) {
	attrs := make(map[uint16][]byte)
	err := walkAttrs(b, func(typ uint16, v []byte) { attrs[typ] = v })
	return attrs, err
}

// walkAttrs calls fn for every netlink attribute in b, in order.
func walkAttrs(b []byte, fn func(typ uint16, value []byte)) error {
	for len(b) >= unix.NLA_HDRLEN {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		typ := binary.NativeEndian.Uint16(b[2:4]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < unix.NLA_HDRLEN || l > len(b) {
			return fmt.Errorf("netlink attribute %d: bad length %d", typ, l)
		}
		fn(typ, b[unix.NLA_HDRLEN:l])
		b = b[min(nlaAlign(l), len(b)):]
	}
	return nil
}

// parseBitset reads an ethtool bitset in its verbose form (bits listed by
// name) and returns the names of the bits that are set. In a list
// (ETHTOOL_A_BITSET_NOMASK) every listed bit is set; otherwise a bit is set
// when it carries ETHTOOL_A_BITSET_BIT_VALUE.
func parseBitset(b []byte) (map[string]bool, error) {
	top, err := parseAttrs(b)
	if err != nil {
		return nil, err
	}
	_, list := top[unix.ETHTOOL_A_BITSET_NOMASK]
	bits, ok := top[unix.ETHTOOL_A_BITSET_BITS]
	if !ok {
		if _, compact := top[unix.ETHTOOL_A_BITSET_VALUE]; compact {
			return nil, errors.New("compact bitset without bit names")
		}
		return map[string]bool{}, nil // an empty list
	}
	set := make(map[string]bool)
	var bitErr error
	err = walkAttrs(bits, func(typ uint16, v []byte) {
		if typ != unix.ETHTOOL_A_BITSET_BITS_BIT {
			return
		}
		bit, err := parseAttrs(v)
		if err != nil {
			bitErr = err
			return
		}
		name, ok := bit[unix.ETHTOOL_A_BITSET_BIT_NAME]
		if !ok {
			return
		}
		_, value := bit[unix.ETHTOOL_A_BITSET_BIT_VALUE]
		set[cString(name)] = list || value
	})
	if err == nil {
		err = bitErr
	}
	return set, err
}

// cString returns b up to its first NUL byte.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
