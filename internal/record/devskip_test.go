// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/devskip"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// quietLab is a lab whose veths carry only what the test sends: IPv6 off
// (no neighbour discovery, router solicitation or MLD) and each end's
// neighbour entry set, so no ARP. Then everything tcpdump captures on the
// client's veth is a frame of the test's TCP connections, each of which a
// recording with the acks group makes an event of.
func quietLab(t *testing.T, name string) *netlab.Lab {
	t.Helper()
	lab := netlab.ForTest(t, netlab.Options{Name: name})
	mac := map[string]string{}
	for _, h := range []netlab.Host{lab.Client, lab.Server} {
		runIn(t, lab, h, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
		out, err := lab.Command(h, "ip", "-j", "link", "show", h.Iface).Output()
		if err != nil {
			t.Fatalf("ip link: %v", err)
		}
		var l []struct {
			Address string `json:"address"`
		}
		if err := json.Unmarshal(out, &l); err != nil || len(l) != 1 {
			t.Fatalf("ip link: %v %s", err, out)
		}
		mac[h.NS] = l[0].Address
	}
	runIn(t, lab, lab.Client, "ip", "neigh", "replace", lab.Server.Addr.String(), "lladdr", mac[lab.Server.NS], "dev", lab.Client.Iface, "nud", "permanent")
	runIn(t, lab, lab.Server, "ip", "neigh", "replace", lab.Client.Addr.String(), "lladdr", mac[lab.Client.NS], "dev", lab.Server.Iface, "nud", "permanent")
	return lab
}

func runIn(t *testing.T, lab *netlab.Lab, h netlab.Host, name string, args ...string) {
	t.Helper()
	if out, err := lab.Command(h, name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v %s", name, strings.Join(args, " "), err, out)
	}
}

// devEvents counts the dev_xmit and dev_recv records of one interface.
func devEvents(t *testing.T, path string, netns uint32, ifindex int) (xmit, recv int) {
	t.Helper()
	eachRecord(t, path, func(rec trace.Record) {
		if rec.NetNS() != netns {
			return
		}
		if i, _ := rec.Uint("ifindex"); int(i) != ifindex {
			return
		}
		switch rec.Type.Name {
		case "dev_xmit":
			xmit++
		case "dev_recv":
			recv++
		}
	})
	return xmit, recv
}

// clientVeth is the report's entry for the lab client's veth.
func clientVeth(t *testing.T, rep *devskip.Report, lab *netlab.Lab) devskip.Iface {
	t.Helper()
	if rep == nil {
		t.Fatal("no kernel_skipped report")
	}
	for _, in := range rep.Ifaces {
		if in.NetNS == lab.Client.NetNSInode && int(in.Ifindex) == lab.Client.IfIndex {
			return in
		}
	}
	t.Fatalf("the client's veth is not in the report: %+v", rep.Ifaces)
	return devskip.Iface{}
}

// TestKernelSkippedTruth: the frames the kernel ran no device program for,
// as the recorder counts them against the veth's own counters, are
// exactly tcpdump's frames on that veth less magnet's device events, each
// way. tcpdump's own count equals the veth's counters (tx_packets +
// tx_dropped out, rx_packets in): both count each skb the driver is given
// or passes up, a GSO packet once. bpftrace on the same tracepoints runs
// beside: a program of its own sees no frame magnet's did not.
func TestKernelSkippedTruth(t *testing.T) {
	needRoot(t)
	needTools(t, "iperf3", "tcpdump", "tshark", "bpftrace")
	lab := quietLab(t, "mgskip")
	port := uniquePort()
	srv := iperf3Server(t, lab, lab.Server, port)
	tpf := startTracepointFrames(t, lab.Client.NetNSInode, port)
	capt := startCapture(t, lab, lab.Client, "")
	rec := startRecording(t, record.Config{Filters: record.Filters{NetNS: lab.Client.NS}, Groups: event.DefaultGroups | event.GroupAcks})
	iperf3Client(t, lab, lab.Client, lab.Server.Addr, port, "-t", "2")
	srv.Wait()
	waitClosed(t, lab, port)
	res := rec.stop(t)
	frames := capt.stop(t)
	tp := tpf.stop(t)

	var out, in int
	for _, f := range frames {
		switch {
		case f.src.Addr() == lab.Client.Addr && f.dst.Addr() == lab.Server.Addr:
			out++
		case f.src.Addr() == lab.Server.Addr && f.dst.Addr() == lab.Client.Addr:
			in++
		default:
			t.Errorf("a frame not of the test's connections: %+v", f)
		}
	}
	xmit, recv := devEvents(t, rec.path, lab.Client.NetNSInode, lab.Client.IfIndex)
	v := clientVeth(t, res.KernelSkipped, lab)
	t.Logf("tcpdump %d out, %d in; dev_xmit %d, dev_recv %d; bpftrace %d out, %d in; veth %+v", out, in, xmit, recv, tp["xmit_to"], tp["recv_from"], v)
	for _, l := range res.KernelSkipped.Lines() {
		t.Log(l)
	}
	// Runs of other programs the kernel skipped (tcp_probe's, under
	// load) take nothing from the device events.
	devMissed := res.MissedBy["net_dev_queue"] + res.MissedBy["net_dev_start_xmit"] + res.MissedBy["netif_receive_skb"]
	if len(res.Unrecorded) > 0 || res.Lost > 0 || devMissed > 0 {
		t.Fatalf("unrecorded %v, lost %d, device runs missed %d: the device events are not every run", res.Unrecorded, res.Lost, devMissed)
	}
	if res.Missed > 0 {
		t.Logf("runs of other programs the kernel skipped: %v", res.MissedBy)
	}
	for _, d := range []struct {
		name          string
		dir           devskip.Dir
		tcpdump, evs  int
		bpftraceCount int
	}{
		{"dev_xmit", v.Xmit, out, xmit, tp["xmit_to"]},
		{"dev_recv", v.Recv, in, recv, tp["recv_from"]},
	} {
		if d.dir.NotChecked != "" {
			t.Errorf("%s not checked: %s", d.name, d.dir.NotChecked)
			continue
		}
		if d.dir.Uncertain != 0 {
			t.Errorf("%s: uncertain by %d with no traffic at the start or end", d.name, d.dir.Uncertain)
		}
		if int(d.dir.Handled) != d.tcpdump {
			t.Errorf("%s: the veth counted %d frames, tcpdump %d", d.name, d.dir.Handled, d.tcpdump)
		}
		if int(d.dir.Runs) != d.evs {
			t.Errorf("%s: %d runs, %d events: with nothing filtered, each run makes one", d.name, d.dir.Runs, d.evs)
		}
		if d.dir.Skipped != int64(d.tcpdump-d.evs) {
			t.Errorf("%s: kernel_skipped %d, want tcpdump %d - events %d = %d", d.name, d.dir.Skipped, d.tcpdump, d.evs, d.tcpdump-d.evs)
		}
		if d.bpftraceCount > d.evs {
			t.Errorf("%s: bpftrace saw %d frames, magnet %d", d.name, d.bpftraceCount, d.evs)
		}
	}
	// The veth has no qdisc: each frame sent passed net_dev_queue too.
	if v.Queue.NotChecked != "" || v.Queue.Handled != v.Xmit.Handled {
		t.Errorf("dev_queue %+v: want checked over the %d frames sent", v.Queue, v.Xmit.Handled)
	}
	var want uint64
	for _, in := range res.KernelSkipped.Ifaces {
		for _, d := range []devskip.Dir{in.Xmit, in.Recv, in.Queue} {
			if d.NotChecked == "" && d.Skipped > 0 {
				want += uint64(d.Skipped)
			}
		}
	}
	_, _, sum := readTrace(t, rec.path)
	if sum.KernelSkipped == nil || *sum.KernelSkipped != want || res.KernelSkipped.Skipped != want {
		t.Errorf("summary kernel_skipped %v, result %d, want %d", sum.KernelSkipped, res.KernelSkipped.Skipped, want)
	}
	if _, ok := sum.Extra["kernel_skipped_by_interface"]; !ok {
		t.Error("summary has no kernel_skipped_by_interface")
	}
}

// TestKernelSkippedQuiet: with no traffic, nothing is skipped, and the
// veth is compared (not left unchecked).
func TestKernelSkippedQuiet(t *testing.T) {
	needRoot(t)
	lab := quietLab(t, "mgskipq")
	dir := t.TempDir()
	rec := startRecording(t, record.Config{Filters: record.Filters{NetNS: lab.Client.NS}, Groups: event.DefaultGroups, StatusDir: dir})
	// The status file (magnet status) says it too, once the first
	// comparison, made in the background, is done.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		sts, err := record.ReadStatuses(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(sts) == 1 && sts[0].KernelSkipped != nil {
			// xmit, recv and queue of the veth at least.
			if *sts[0].KernelSkipped != 0 || sts[0].KernelSkippedChecked < 3 {
				t.Errorf("status: kernel_skipped %d over %d comparisons", *sts[0].KernelSkipped, sts[0].KernelSkippedChecked)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no kernel_skipped in the status: %+v", sts)
		}
	}
	res := rec.stop(t)
	v := clientVeth(t, res.KernelSkipped, lab)
	if res.KernelSkipped.Skipped != 0 || res.KernelSkipped.Uncertain != 0 {
		t.Errorf("quiet run: %s", strings.Join(res.KernelSkipped.Lines(), "\n"))
	}
	for name, d := range map[string]devskip.Dir{"dev_xmit": v.Xmit, "dev_recv": v.Recv, "dev_queue": v.Queue} {
		if d.NotChecked != "" || d.Skipped != 0 {
			t.Errorf("%s: %+v", name, d)
		}
	}
	// lo is in the namespace and is said not checked, with why.
	lines := strings.Join(res.KernelSkipped.Lines(), "\n")
	if !strings.Contains(lines, "not checked: lo") {
		t.Errorf("lo not said to be unchecked:\n%s", lines)
	}
}
