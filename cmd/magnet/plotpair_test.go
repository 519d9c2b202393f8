// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// TestPlotTwoTraces records the two ends of a transfer into two traces, one
// per namespace (--netns), the receiver's with the napi group and GRO on
// its veth (a veth then receives through NAPI), and plots them: the e2e
// figure pairs the sender's socket with the receiver's, the e2e-delay
// figure has a point per segment the report follows end to end, and the
// napi figure draws the receiver's polls. Two traces with no connection in
// common, or napi asked of a trace without it, fail with one line.
func TestPlotTwoTraces(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgplot2", RateMbit: 100})
	if err := lab.Server.Do(func() error { return groOn(lab.Server.Iface) }); err != nil {
		t.Fatalf("GRO on %s: %v", lab.Server.Iface, err)
	}
	dir := t.TempDir()
	port := strconv.Itoa(46000 + os.Getpid()%10000)
	var recs []*exec.Cmd
	traces := map[string]string{}
	for _, h := range []netlab.Host{lab.Client, lab.Server} {
		name, events := "sender", "default"
		if h.NS == lab.Server.NS {
			name, events = "receiver", "default,napi"
		}
		out, ready := filepath.Join(dir, name+".mgt"), filepath.Join(dir, name+".ready")
		traces[name] = out
		rec := exec.Command(bin, "record", "-q", "-o", out, "--netns", h.NS, "--port", port, "--events", events, "--ready-file", ready)
		rec.Stderr = os.Stderr
		if err := rec.Start(); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
		t.Cleanup(func() { rec.Process.Kill(); rec.Wait() })
		waitFor(t, func() bool { _, err := os.Stat(ready); return err == nil })
	}
	rxPackets := func() int {
		out, err := lab.Command(lab.Server, "cat", "/sys/class/net/"+lab.Server.Iface+"/statistics/rx_packets").Output()
		if err != nil {
			t.Fatalf("rx_packets: %v", err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(out)))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	rxBefore := rxPackets()
	addr := lab.Server.Addr.String() + ":" + port
	srv, sc := serveTCP(t, lab, addr)
	if out, err := lab.Command(lab.Client, bin, "workload", "send", "--proto", "tcp", "--to", addr,
		"--count", "100", "--size", "10240", "--interval", "5ms").CombinedOutput(); err != nil {
		t.Fatalf("client: %v %s", err, out)
	}
	sc.Scan()
	srv.Wait()
	rxAfter := rxPackets()
	for _, rec := range recs {
		rec.Process.Signal(os.Interrupt)
		if err := rec.Wait(); err != nil {
			t.Fatalf("record: %v", err)
		}
	}
	snd, rcv := traces["sender"], traces["receiver"]

	// e2e, the default kind for two traces: both ends' bytes, and since
	// the receiver read all the sender wrote, both curves end at one height.
	ends := filepath.Join(dir, "ends.svg")
	if r := magnet(t, "plot", snd, rcv, "-o", ends); r.code != 0 {
		t.Fatalf("plot two traces: %s", r.stderr)
	}
	svg := readString(t, ends)
	wrote, read := lastY(t, svg, "written by the sender (sock_send)"), lastY(t, svg, "read by the receiver (sock_recv)")
	t.Logf("e2e: both curves end at y=%s/%s", wrote, read)
	if wrote != read {
		t.Errorf("the sender's curve ends at y=%v, the receiver's at y=%v: want one height (1,024,000 B each)", wrote, read)
	}
	if !strings.Contains(svg, "in sender.mgt → ") || !strings.Contains(svg, " in receiver.mgt:") {
		t.Errorf("e2e title does not name both traces' ends")
	}

	// e2e-delay: one point per segment the report follows end to end.
	r := magnet(t, "report", "--json", snd, rcv)
	if r.code != 0 {
		t.Fatalf("report: %s", r.stderr)
	}
	var rep struct {
		Connections []struct {
			Path *struct {
				Segments int `json:"segments"`
			} `json:"path"`
		} `json:"connections"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	segments := 0
	for _, c := range rep.Connections {
		if c.Path != nil {
			segments += c.Path.Segments
		}
	}
	delay := filepath.Join(dir, "delay.svg")
	if r := magnet(t, "plot", snd, rcv, "--kind", "e2e-delay", "-o", delay); r.code != 0 {
		t.Fatalf("plot e2e-delay: %s", r.stderr)
	}
	svg = readString(t, delay)
	t.Logf("e2e-delay: %d segments followed", segments)
	for _, s := range []string{"end to end (tcp_xmit → sock_recv)", "at the receiver (dev_recv → sock_recv)"} {
		if n := markers(t, svg, s); segments < 80 || n != segments {
			t.Errorf("series %q: %d points, the report followed %d segments (want >= 80 of 100 sends)", s, n, segments)
		}
	}
	if png := filepath.Join(dir, "delay.png"); magnet(t, "plot", snd, rcv, "--kind", "e2e-delay", "-o", png).code != 0 {
		t.Errorf("plot e2e-delay as png failed")
	}

	// napi: the receiver's polls.
	polls := filepath.Join(dir, "napi.svg")
	if r := magnet(t, "plot", rcv, "--kind", "napi", "-o", polls); r.code != 0 {
		t.Fatalf("plot napi: %s", r.stderr)
	}
	svg = readString(t, polls)
	// The polls took at least every packet the receiving veth counted
	// (the kernel's rx_packets) while recording; other devices' polls
	// (the host's NIC) may add to them: this kernel's napi_poll names no
	// device.
	title := regexp.MustCompile(`packets per NAPI poll: (\d+) polls took (\d+) packets`).FindStringSubmatch(svg)
	if title == nil || markers(t, svg, "polls") == 0 {
		t.Fatalf("napi plot has no polls")
	}
	took, _ := strconv.Atoi(title[2])
	t.Logf("napi: %s; the veth received %d packets", title[0], rxAfter-rxBefore)
	if took < rxAfter-rxBefore {
		t.Errorf("polls took %d packets, the receiving veth counted %d", took, rxAfter-rxBefore)
	}

	// Bad pairs and a missing group: one line, non-zero exit, no file.
	bad := filepath.Join(dir, "bad.svg")
	oneLineError(t, magnet(t, "plot", snd, "../../testdata/bigendian.mgt", "-o", bad), "has its other end in")
	oneLineError(t, magnet(t, "plot", snd, "--kind", "e2e", "-o", bad), "no connection has both its ends in")
	oneLineError(t, magnet(t, "plot", snd, "--kind", "napi", "-o", bad), "record with --groups default,napi")
	oneLineError(t, magnet(t, "plot", snd, rcv, "--kind", "srtt", "-o", bad), "draws one")
	if _, err := os.Stat(bad); err == nil {
		t.Errorf("a failed plot wrote %s", bad)
	}
}

// groOn turns GRO on for an interface of the current namespace
// (ETHTOOL_SGRO), as `ethtool -K IFACE gro on` does.
func groOn(iface string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	val := [2]uint32{0x2c, 1} // ETHTOOL_SGRO, on
	var ifr [40]byte
	copy(ifr[:16], iface)
	*(*uintptr)(unsafe.Pointer(&ifr[16])) = uintptr(unsafe.Pointer(&val))
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return e
	}
	return nil
}

func readString(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// lastY is the y of a polyline series' last point in an SVG chart.
func lastY(t *testing.T, svg, name string) string {
	t.Helper()
	m := regexp.MustCompile(`data-name="` + regexp.QuoteMeta(name) + `"[^>]* points="([^"]*)"`).FindStringSubmatch(svg)
	if m == nil {
		t.Fatalf("no line series %q in the chart", name)
	}
	pts := strings.Fields(m[1])
	if len(pts) < 2 {
		t.Fatalf("series %q has %d points", name, len(pts))
	}
	_, y, _ := strings.Cut(pts[len(pts)-1], ",")
	return y
}

// markers counts the points of a scatter series in an SVG chart.
func markers(t *testing.T, svg, name string) int {
	t.Helper()
	m := regexp.MustCompile(`data-name="` + regexp.QuoteMeta(name) + `"[^>]*>(.*?)</g>`).FindStringSubmatch(svg)
	if m == nil {
		t.Fatalf("no scatter series %q in the chart", name)
	}
	return strings.Count(m[1], "<circle")
}
