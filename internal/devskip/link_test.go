// SPDX-License-Identifier: Apache-2.0

package devskip

import (
	"encoding/binary"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func attr(t uint16, v []byte) []byte {
	b := make([]byte, 4, align4(4+len(v)))
	binary.NativeEndian.PutUint16(b[0:], uint16(4+len(v)))
	binary.NativeEndian.PutUint16(b[2:], t)
	b = append(b, v...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func message(typ uint16, body []byte) []byte {
	b := make([]byte, unix.NLMSG_HDRLEN)
	binary.NativeEndian.PutUint32(b[0:], uint32(unix.NLMSG_HDRLEN+len(body)))
	binary.NativeEndian.PutUint16(b[4:], typ)
	return append(b, body...)
}

func linkMessage(ifindex uint32, name, kind string, xdp byte, stats []uint64) []byte {
	body := make([]byte, unix.SizeofIfInfomsg)
	binary.NativeEndian.PutUint32(body[4:], ifindex)
	body = append(body, attr(unix.IFLA_IFNAME, append([]byte(name), 0))...)
	if kind != "" {
		body = append(body, attr(unix.IFLA_LINKINFO|0x8000, attr(unix.IFLA_INFO_KIND, []byte(kind)))...)
	}
	body = append(body, attr(unix.IFLA_XDP|0x8000, attr(unix.IFLA_XDP_ATTACHED, []byte{xdp}))...)
	if stats != nil {
		s := make([]byte, 8*len(stats))
		for i, v := range stats {
			binary.NativeEndian.PutUint64(s[8*i:], v)
		}
		body = append(body, attr(unix.IFLA_STATS64, s)...)
	}
	return message(unix.RTM_NEWLINK, body)
}

func dump() []byte {
	// rx_packets, tx_packets, rx_bytes, tx_bytes, rx_errors, tx_errors,
	// rx_dropped, tx_dropped, multicast, ...
	stats := []uint64{11, 22, 0, 0, 0, 0, 3, 4, 0, 0, 0, 0}
	b := linkMessage(1, "lo", "", 0, stats)
	b = append(b, linkMessage(7, "va", "veth", 1, stats)...)
	return append(b, message(unix.NLMSG_DONE, make([]byte, 4))...)
}

func TestParseLinkDump(t *testing.T) {
	links, err := ParseLinkDump(dump())
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint32]Link{
		1: {Name: "lo", RxPackets: 11, TxPackets: 22, RxDropped: 3, TxDropped: 4},
		7: {Name: "va", Kind: "veth", XDP: true, RxPackets: 11, TxPackets: 22, RxDropped: 3, TxDropped: 4},
	}
	if len(links) != len(want) {
		t.Fatalf("links %+v", links)
	}
	for i, l := range want {
		if links[i] != l {
			t.Errorf("link %d: %+v, want %+v", i, links[i], l)
		}
	}
}

func TestParseLinkDumpBad(t *testing.T) {
	good := dump()
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"short header", good[:10]},
		{"message past the end", good[:40]},
		{"short stats", append(linkMessage(2, "x", "veth", 0, []uint64{1, 2}), message(unix.NLMSG_DONE, nil)...)},
		{"error", message(unix.NLMSG_ERROR, make([]byte, 20))},
	} {
		if _, err := ParseLinkDump(tc.b); !errors.Is(err, ErrBadDump) {
			t.Errorf("%s: error %v, want ErrBadDump", tc.name, err)
		}
	}
}

// TestReadLinksHere reads this namespace's interfaces, as root or not:
// lo is in every namespace, and counts what it sends as received.
func TestReadLinksHere(t *testing.T) {
	links, err := readLinksHere()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if l.Name == "lo" {
			if l.Kind != "" || l.TxPackets != l.RxPackets {
				t.Errorf("lo %+v: want no kind, tx = rx", l)
			}
			return
		}
	}
	t.Errorf("no lo among %+v", links)
}

func TestReadLinksNoNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("entering a network namespace needs root")
	}
	if _, err := ReadLinks("/nonexistent/ns"); err == nil {
		t.Error("no error for a namespace that does not exist")
	}
}

func FuzzParseLinkDump(f *testing.F) {
	f.Add(dump())
	f.Add(message(unix.NLMSG_DONE, nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		links, err := ParseLinkDump(b)
		if err != nil && !errors.Is(err, ErrBadDump) {
			t.Errorf("error %v is no ErrBadDump", err)
		}
		if err != nil && links != nil {
			t.Error("links with an error")
		}
	})
}
