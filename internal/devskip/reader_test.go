// SPDX-License-Identifier: Apache-2.0

package devskip

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLinkReaderAgainstIP reads a namespace of 81 interfaces (a dump of
// several datagrams) twice through one entry and one socket, and compares
// every interface's name, kind and packet counters with what `ip -s link`
// says of it; after pings over one pair, the second read must show them.
func TestLinkReaderAgainstIP(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a network namespace needs root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (iproute2)")
	}
	name := fmt.Sprintf("mgdsk%d", os.Getpid())
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	run("ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	// No IPv6: its router solicitations and DAD would send frames of
	// their own between the two reads.
	run("ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
	var batch strings.Builder
	for i := range 40 {
		fmt.Fprintf(&batch, "link add va%d type veth peer name vb%d\n", i, i)
	}
	batch.WriteString("addr add 10.206.0.1/24 dev va0\naddr add 10.206.1.1/24 dev vb0\nlink set va0 up\nlink set vb0 up\nlink set lo up\n")
	cmd := exec.Command("ip", "-n", name, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ip -batch: %v: %s", err, out)
	}
	path := "/run/netns/" + name

	var first, second map[uint32]Link
	var ipFirst, ipSecond map[uint32]ipLink
	err := linksInNetNS(path, func(read linkRead) error {
		var err error
		if first, err = read(nil, nil); err != nil {
			return err
		}
		ipFirst = ipLinks(t, name)
		// Three broadcasts out of va0 (this thread is in the namespace):
		// no ARP before them, so va0 sends three frames, vb0 gets them.
		if err := broadcast(3, "va0", [4]byte{10, 206, 0, 255}); err != nil {
			return err
		}
		if second, err = read(nil, nil); err != nil {
			return err
		}
		ipSecond = ipLinks(t, name)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 81 || len(second) != 81 {
		t.Fatalf("read %d then %d interfaces, want 81 (lo and 40 veth pairs)", len(first), len(second))
	}
	for _, c := range []struct {
		ours map[uint32]Link
		ip   map[uint32]ipLink
	}{{first, ipFirst}, {second, ipSecond}} {
		for idx, w := range c.ip {
			l, ok := c.ours[idx]
			if !ok {
				t.Errorf("interface %d (%s) not read", idx, w.Name)
				continue
			}
			want := Link{Name: w.Name, Kind: w.Info.Kind, TxPackets: w.Stats.Tx.Packets, TxDropped: w.Stats.Tx.Dropped, RxPackets: w.Stats.Rx.Packets, RxDropped: w.Stats.Rx.Dropped}
			got := l
			got.GRO, got.XDP = false, false
			if got != want {
				t.Errorf("interface %d: read %+v, ip says %+v", idx, got, want)
			}
		}
	}
	named := func(m map[uint32]Link, name string) Link {
		for _, l := range m {
			if l.Name == name {
				return l
			}
		}
		return Link{}
	}
	if d := named(second, "va0").TxPackets - named(first, "va0").TxPackets; d != 3 {
		t.Errorf("va0 sent %d frames between the reads, want the 3 broadcasts", d)
	}
	if d := named(second, "vb0").RxPackets - named(first, "vb0").RxPackets; d != 3 {
		t.Errorf("vb0 received %d frames between the reads, want the 3 broadcasts", d)
	}
}

// broadcast sends n UDP datagrams to dst out of interface dev, from the
// calling thread's network namespace.
func broadcast(n int, dev string, dst [4]byte) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_BROADCAST, 1); err != nil {
		return err
	}
	if err := unix.BindToDevice(fd, dev); err != nil {
		return err
	}
	for range n {
		if err := unix.Sendto(fd, []byte("magnet"), 0, &unix.SockaddrInet4{Port: 9, Addr: dst}); err != nil {
			return err
		}
	}
	return nil
}

// ipLink is what `ip -s -d -j link` says of an interface.
type ipLink struct {
	Index uint32 `json:"ifindex"`
	Name  string `json:"ifname"`
	Info  struct {
		Kind string `json:"info_kind"`
	} `json:"linkinfo"`
	Stats struct {
		Rx struct{ Packets, Dropped uint64 } `json:"rx"`
		Tx struct{ Packets, Dropped uint64 } `json:"tx"`
	} `json:"stats64"`
}

func ipLinks(t *testing.T, ns string) map[uint32]ipLink {
	t.Helper()
	out, err := exec.Command("ip", "-n", ns, "-s", "-d", "-j", "link").Output()
	if err != nil {
		t.Fatalf("ip link: %v", err)
	}
	var links []ipLink
	if err := json.Unmarshal(out, &links); err != nil {
		t.Fatalf("ip link: %v", err)
	}
	m := map[uint32]ipLink{}
	for _, l := range links {
		m[l.Index] = l
	}
	return m
}
