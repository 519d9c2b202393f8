// SPDX-License-Identifier: Apache-2.0

package export_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/export"
)

// pcapngPacket is what the test reads back of an enhanced packet block.
type pcapngPacket struct {
	iface string // the interface's description
	ts    int64
	first byte // the packet's first byte, which identifies it
}

// readPcapng walks the blocks of a little-endian pcapng file: every
// packet's interface must have been described before it.
func readPcapng(t *testing.T, b []byte) (ifaces []string, pkts []pcapngPacket) {
	t.Helper()
	le := binary.LittleEndian
	for len(b) > 0 {
		if len(b) < 12 {
			t.Fatalf("%d bytes left, not a block", len(b))
		}
		typ, n := le.Uint32(b), int(le.Uint32(b[4:]))
		if n < 12 || n > len(b) || le.Uint32(b[n-4:]) != uint32(n) {
			t.Fatalf("block of type %#x: bad length %d", typ, n)
		}
		body := b[8 : n-4]
		switch typ {
		case 1: // IDB: options after 8 bytes; if_description is code 3
			desc := ""
			for o := body[8:]; len(o) >= 4; {
				code, l := le.Uint16(o), int(le.Uint16(o[2:]))
				if code == 0 {
					break
				}
				if code == 3 {
					desc = string(o[4 : 4+l])
				}
				o = o[4+(l+3)/4*4:]
			}
			ifaces = append(ifaces, desc)
		case 6: // EPB
			id := int(le.Uint32(body))
			if id >= len(ifaces) {
				t.Fatalf("packet on interface %d before its description (%d described)", id, len(ifaces))
			}
			ts := int64(le.Uint32(body[4:]))<<32 | int64(le.Uint32(body[8:]))
			pkts = append(pkts, pcapngPacket{ifaces[id], ts, body[20]})
		}
		b = b[n:]
	}
	return ifaces, pkts
}

// TestWritePcapngMerges: the packets of two traces come out in time order
// (mergecap's order), each on an interface of its own trace, described
// once before its first packet; the control ring's late records change
// nothing.
func TestWritePcapngMerges(t *testing.T) {
	const wall = int64(1_700_000_000_000_000_000)
	pkt := func(tm uint64, netns uint32, ifindex int, id byte) recSpec {
		return recSpec{"headers", hdr{time: tm, netns: netns, size: 60}, vals{"ifindex": ifindex, "caplen": 60, "dir": 0, "data": bytes.Repeat([]byte{id}, 60)}}
	}
	a := []recSpec{
		{"iface", hdr{time: t0, netns: 1}, vals{"ifindex": 2, "name": "veth0"}},
		pkt(t0+1000, 1, 2, 1),
		pkt(t0+4000, 1, 2, 4),
		pkt(t0+3000, 1, 2, 3), // another CPU's ring, drained later
		{"sock_send", hdr{time: t0 + 4500, size: 9}, nil},
		pkt(t0+6000, 1, 3, 6),
	}
	b := []recSpec{
		{"iface", hdr{time: t0, netns: 1}, vals{"ifindex": 2, "name": "veth1"}},
		pkt(t0+2000, 1, 2, 2),
		pkt(t0+5000, 1, 2, 5),
	}
	var srcs []export.TableSource
	files := map[string][]byte{"a.mgt": bootTrace(t, "ha", wall, "boot-a", a), "b.mgt": bootTrace(t, "hb", wall, "boot-b", b)}
	for _, name := range []string{"a.mgt", "b.mgt"} {
		srcs = append(srcs, export.TableSource{Name: name, Reader: newReader(t, files[name])})
	}
	var out bytes.Buffer
	n, late, err := export.WritePcapng(&out, srcs)
	if err != nil || n != 6 || late != 0 {
		t.Fatalf("WritePcapng = %d packets, %d late, %v; want 6, 0, nil", n, late, err)
	}
	ifaces, pkts := readPcapng(t, out.Bytes())
	var got []string
	for _, p := range pkts {
		got = append(got, fmt.Sprintf("%d:%s@%d", p.first, p.iface, p.ts-wall-t0))
	}
	want := []string{
		"1:a.mgt netns 1 ifindex 2@1000", "2:b.mgt netns 1 ifindex 2@2000", "3:a.mgt netns 1 ifindex 2@3000",
		"4:a.mgt netns 1 ifindex 2@4000", "5:b.mgt netns 1 ifindex 2@5000", "6:a.mgt netns 1 ifindex 3@6000",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("packets:\n got %s\nwant %s", got, want)
	}
	if len(ifaces) != 3 {
		t.Errorf("%d interfaces described (%q), want 3", len(ifaces), ifaces)
	}

	// tshark reads the merge the same way, interface names included.
	if _, err := exec.LookPath("tshark"); err != nil {
		t.Skip("tshark not installed (scripts/deps.sh installs it): checked the blocks only")
	}
	path := filepath.Join(t.TempDir(), "m.pcapng")
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := exec.Command("tshark", "-r", path, "-T", "fields", "-e", "frame.interface_name", "-e", "frame.interface_id").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	if got, want := strings.Fields(string(res)), "veth0 0 veth1 1 veth0 0 veth0 0 veth1 1 if3 2"; strings.Join(got, " ") != want {
		t.Errorf("tshark: %s, want %s", got, want)
	}
}
