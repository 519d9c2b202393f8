// SPDX-License-Identifier: Apache-2.0

package analyze_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// TestPerfettoTracks writes a trace with context switches on two CPUs (and
// a loss of them), a TCP connection's sends, ACKs and tcp_state snapshots,
// and a UDP socket's send, and reads the Perfetto JSON back: a slice per
// thread between two switches on its CPU's track, counters of cwnd, srtt
// and send-buffer occupancy with the events' values, and the UDP socket's
// track.
func TestPerfettoTracks(t *testing.T) {
	sw := func(tus uint64, cpu uint16, prev, next uint32) rec {
		return rec{typ: "sched_switch", t: tus * us, cpu: cpu, tid: prev, u32: map[string]uint32{"next_tid": next, "next_pid": next, "prev_state": 1}}
	}
	recs := []rec{
		sw(0, 0, 0, 100),
		{typ: "conn_open", t: 1 * us, conn: 1, lp: 40000, rp: 80, laddr: [4]byte{10, 0, 0, 1}, raddr: [4]byte{10, 0, 0, 2}},
		{typ: "tcp_xmit", t: 1 * us, conn: 1, flags: 0x02, u32: map[string]uint32{"seq": 999}},
		{typ: "sock_send", t: 2 * us, conn: 1, size: 3000},
		{typ: "tcp_xmit", t: 3 * us, conn: 1, flags: 0x10, size: 1448, u32: map[string]uint32{"seq": 1000}},
		sw(4, 1, 0, 300),
		{typ: "tcp_rcv", t: 5 * us, conn: 1, flags: 0x10, u32: map[string]uint32{"seq": 1, "ack": 2448}},
		{typ: "tcp_state", t: 6 * us, conn: 1, u32: map[string]uint32{"cwnd": 10, "srtt_us": 50, "snd_una": 2448}},
		{typ: "conn_open", t: 7 * us, conn: 2, lp: 5000, rp: 53, laddr: [4]byte{10, 0, 0, 1}, raddr: [4]byte{10, 0, 0, 3}, u8: map[string]uint8{"proto": 17}},
		{typ: "sock_send", t: 8 * us, conn: 2, size: 100},
		{typ: "tcp_state", t: 9 * us, conn: 1, u32: map[string]uint32{"cwnd": 12, "srtt_us": 40, "snd_una": 4448}},
		sw(30, 0, 100, 200),
		sw(40, 1, 300, 0),
		sw(50, 0, 200, 0),
		{typ: "lost", t: 60 * us, cpu: 1, u32: map[string]uint32{"n_sched_switch": 1, "total": 1}, u64: map[string]uint64{"first_ns": 60 * us, "last_ns": 60 * us}},
		sw(70, 1, 300, 0), // after the loss: what ran since is not known
		sw(80, 1, 0, 5),
	}
	var out bytes.Buffer
	if _, err := analyze.WritePerfetto(&out, []string{writeTrace(t, recs)}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []struct {
			Ph   string         `json:"ph"`
			Name string         `json:"name"`
			Cat  string         `json:"cat"`
			Tid  int            `json:"tid"`
			Ts   float64        `json:"ts"`
			Dur  float64        `json:"dur"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out.String())
	}
	tracks := map[int]string{}
	var slices_, counters, udp []string
	for _, e := range doc.TraceEvents {
		switch {
		case e.Ph == "M" && e.Name == "thread_name":
			tracks[e.Tid] = e.Args["name"].(string)
		case e.Ph == "X" && e.Cat == "sched":
			slices_ = append(slices_, fmt.Sprintf("%s: %s %g+%g", tracks[e.Tid], e.Name, e.Ts, e.Dur))
		case e.Ph == "C":
			for k, v := range e.Args {
				counters = append(counters, fmt.Sprintf("%s %g: %v %s", e.Name, e.Ts, v, k))
			}
		case e.Cat == "udp":
			udp = append(udp, fmt.Sprintf("%s: %s %s %g %v", tracks[e.Tid], e.Ph, e.Name, e.Ts, e.Args["bytes"]))
		}
	}
	wantSlices := []string{"CPU 0: tid 100 0+30", "CPU 1: tid 300 4+36", "CPU 0: tid 200 30+20", "CPU 1: idle 70+10"}
	wantCounters := []string{
		"conn 1 send buffer 2: 3000 bytes", // written, nothing acknowledged
		"conn 1 send buffer 5: 1552 bytes", // the ACK of the first 1448
		"conn 1 cwnd 6: 10 segments", "conn 1 srtt 6: 50 us",
		"conn 1 send buffer 9: 0 bytes", // snd_una: all 3000 (and more) acknowledged
		"conn 1 cwnd 9: 12 segments", "conn 1 srtt 9: 40 us",
	}
	wantUDP := []string{"conn 2 sock_send: i sock_send 8 100"}
	if !slices.Equal(slices_, wantSlices) {
		t.Errorf("CPU slices\n got %q\nwant %q", slices_, wantSlices)
	}
	slices.Sort(counters)
	slices.Sort(wantCounters)
	if !slices.Equal(counters, wantCounters) {
		t.Errorf("counters\n got %q\nwant %q", counters, wantCounters)
	}
	if !slices.Equal(udp, wantUDP) {
		t.Errorf("UDP\n got %q\nwant %q", udp, wantUDP)
	}
}

// TestPerfettoTracksTruth records a real transfer between two namespaces
// with the sched group and checks the Perfetto export against the trace's
// own events: on each CPU's track, one slice per pair of consecutive
// context switches (none lost), ending at the second; on each connection
// end's cwnd and srtt counters, the tcp_state values in order.
func TestPerfettoTracksTruth(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgpftracks"})
	port := 20000 + os.Getpid()%20000 + 4
	path := recordDuring(t, port, event.DefaultGroups|event.GroupSched, func() { transfer(t, lab.Command, lab.Client, lab.Server, port, 64, 64<<10) })

	// The truth: the trace's records, read directly.
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	switches := map[uint16]int{}
	cwnd, srtt := map[uint64][]string{}, map[uint64][]string{}
	lostSched := false
	for {
		rec, err := r.Next()
		if err != nil {
			break
		}
		switch rec.Type.Name {
		case "sched_switch":
			switches[rec.CPU()]++
		case "tcp_state":
			c, _ := rec.Uint("cwnd")
			cwnd[rec.Conn()] = append(cwnd[rec.Conn()], strconv.FormatUint(c, 10))
			r, _ := rec.Uint("srtt_us")
			srtt[rec.Conn()] = append(srtt[rec.Conn()], strconv.FormatUint(r, 10))
		case "lost":
			n1, _ := rec.Uint("n_sched_switch")
			n2, _ := rec.Uint("n_sched_wakeup")
			lostSched = lostSched || n1+n2 > 0
		}
	}
	r.Close()
	if lostSched {
		t.Skip("the recorder lost sched events: slices cannot be counted against the switches")
	}
	var out bytes.Buffer
	if _, err := analyze.WritePerfetto(&out, []string{path}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []struct {
			Ph   string         `json:"ph"`
			Name string         `json:"name"`
			Cat  string         `json:"cat"`
			Tid  int            `json:"tid"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	tracks := map[int]string{}
	perCPU := map[string]int{}
	got, gotSrtt := map[uint64][]string{}, map[uint64][]string{}
	for _, e := range doc.TraceEvents {
		switch {
		case e.Ph == "M" && e.Name == "thread_name":
			tracks[e.Tid] = e.Args["name"].(string)
		case e.Ph == "X" && e.Cat == "sched":
			perCPU[tracks[e.Tid]]++
		case e.Ph == "C" && strings.HasSuffix(e.Name, " cwnd"):
			var conn uint64
			fmt.Sscanf(e.Name, "conn %d cwnd", &conn)
			got[conn] = append(got[conn], fmt.Sprint(e.Args["segments"]))
		case e.Ph == "C" && strings.HasSuffix(e.Name, " srtt"):
			var conn uint64
			fmt.Sscanf(e.Name, "conn %d srtt", &conn)
			gotSrtt[conn] = append(gotSrtt[conn], fmt.Sprint(e.Args["us"]))
		}
	}
	if len(switches) == 0 || len(cwnd) == 0 {
		t.Fatalf("the trace has %d CPUs with switches, %d connections with tcp_state", len(switches), len(cwnd))
	}
	for cpu, n := range switches {
		if name := fmt.Sprintf("CPU %d", cpu); perCPU[name] != n-1 {
			t.Errorf("%s: %d slices, the trace has %d context switches", name, perCPU[name], n)
		}
	}
	for conn, want := range cwnd {
		if !slices.Equal(got[conn], want) {
			t.Errorf("conn %d cwnd counter %v, tcp_state %v", conn, got[conn], want)
		}
		if !slices.Equal(gotSrtt[conn], srtt[conn]) {
			t.Errorf("conn %d srtt counter %v, tcp_state %v", conn, gotSrtt[conn], srtt[conn])
		}
	}
	t.Logf("switches per CPU %v, slices %v; cwnd values of %d connections", switches, perCPU, len(cwnd))
}

// TestPerfettoUDPTruth sends 300 datagrams of 1,000 bytes between two
// namespaces (the receiver stops once it has them all, so none was lost)
// and reads the Perfetto export: on the sending socket's tracks, one
// sock_send instant per datagram of 1,000 bytes, and a dev_xmit of the
// frame's length (1,042: 14 Ethernet, 20 IP, 8 UDP) for each, the new
// socket's first included; on the receiving socket's, one dev_recv of the
// IP packet's length (1,028: the device pulled the Ethernet header,
// EVENTS.md) and one
// sock_recv of 1,000 bytes per datagram: what the application sent and
// the receiver's own count. The receiver reads without blocking: its
// reads that found nothing are sock_recv instants too, their bytes the
// call's -EAGAIN.
func TestPerfettoUDPTruth(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgpfudp"})
	port := 20000 + os.Getpid()%20000 + 5
	const count, size = 300, 1000
	var received int64
	path := recordDuring(t, port, event.DefaultGroups, func() {
		// Paced: a burst could overflow the receiver's buffer, and the
		// test wants every datagram delivered, not a loss to explain.
		received = workloadTransfer(t, lab.Command, lab.Client, lab.Server, "udp", port, count, size, "200us",
			"--count", strconv.Itoa(count), "--size", strconv.Itoa(size))
	})
	if received != count*size {
		t.Fatalf("the receiver got %d bytes, want %d", received, count*size)
	}
	var out bytes.Buffer
	if _, err := analyze.WritePerfetto(&out, []string{path}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []struct {
			Ph   string         `json:"ph"`
			Name string         `json:"name"`
			Cat  string         `json:"cat"`
			Pid  int            `json:"pid"`
			Tid  int            `json:"tid"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	// layer -> bytes -> instants
	got := map[string]map[float64]int{}
	for _, e := range doc.TraceEvents {
		if e.Cat != "udp" || e.Ph != "i" {
			continue
		}
		if got[e.Name] == nil {
			got[e.Name] = map[float64]int{}
		}
		b, _ := e.Args["bytes"].(float64)
		got[e.Name][b]++
	}
	// Every datagram has its dev_xmit, the new socket's first included
	// (it reaches the device before any socket-layer event of it: the
	// device program takes the socket's cookie then).
	var xmits int
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for {
		rc, err := r.Next()
		if err != nil {
			break
		}
		if rc.Type.Name == "dev_xmit" && rc.Size() == size+42 {
			xmits++
		}
	}
	r.Close()
	if xmits != count {
		t.Errorf("the trace has %d dev_xmit of the %d datagrams", xmits, count)
	}
	eagain := got["sock_recv"][-float64(syscall.EAGAIN)]
	delete(got["sock_recv"], -float64(syscall.EAGAIN))
	want := map[string]map[float64]int{
		"sock_send": {size: count}, "dev_xmit": {size + 42: count},
		"dev_recv": {size + 28: count}, "sock_recv": {size: count},
	}
	for layer, w := range want {
		if !maps.Equal(got[layer], w) {
			t.Errorf("UDP %s instants by bytes: %v, want %v", layer, got[layer], w)
		}
	}
	t.Logf("UDP instants by layer and bytes: %v; %d reads found nothing (-EAGAIN); the trace's dev_xmit of the datagrams %d", got, eagain, xmits)
}
