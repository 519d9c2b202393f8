// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// TestBandwidthCompetingFlow is MAGNeT's Fig. 6/7: a bulk TCP transfer over
// a 100 Mbit/s tbf link, recorded on the receiver, and a competing flow over
// the same link for part of the time. The bandwidth series of the recorded
// connection (the plot's sliding window, at the application and at the
// wire) is within 10 % of the link's rate while the flow is alone, drops to
// what the competitor leaves while the other runs, and recovers after.
//
// The competitor is a constant-bit-rate UDP flow at half the link's rate,
// not a second TCP transfer: on a veth with no propagation delay and a
// 50 ms tbf queue, a TCP newcomer does not win its share within seconds
// (measured on 6.18: a BBR newcomer held 8-18 % of the link for 4.5 s in
// most tries, a Reno one ~3 %; CUBIC cannot be chosen inside a namespace
// whose tcp_allowed_congestion_control is "reno bbr"), so the drop would
// measure TCP's convergence, not magnet. A flow of known rate makes the
// drop an exact expectation: the link's rate less what the competitor got.
//
// By default the transfer takes 8 s with the competitor from second 2 to
// 5, to keep CI short; MAGNET_FULL_BANDWIDTH=1 runs the 10 s
// transfer with the competitor from second 4 to 7. The workload processes
// run at a raised priority: other tests share the CPUs, and a starved
// sender or reader would measure the machine, not the link.
func TestBandwidthCompetingFlow(t *testing.T) {
	needRoot(t)
	x := competing{rate: 100, total: 8 * time.Second, from: 2 * time.Second, until: 5 * time.Second, window: 250 * time.Millisecond}
	if os.Getenv("MAGNET_FULL_BANDWIDTH") == "1" {
		x.total, x.from, x.until, x.window = 10*time.Second, 4*time.Second, 7*time.Second, 500*time.Millisecond
	}
	problems := x.run(t)
	if len(problems) > 0 {
		// Try once more before failing: the link's rate needs a sender, a
		// reader and the softirqs that drain tbf to be scheduled in time,
		// and other test packages run alongside.
		t.Logf("load average %s on %d CPUs; again, after: %v", loadavg(), runtime.NumCPU(), problems)
		problems = x.run(t)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// competing is the experiment: a TCP flow alone over a link of rate Mbit/s
// for total, a UDP flow at half that rate from from to until.
type competing struct {
	rate               int
	total, from, until time.Duration
	window             time.Duration
}

// competitorDatagram is the UDP competitor's payload: with its headers it
// fits a 1500-byte MTU, so no datagram is IP-fragmented and a drop at tbf
// loses one datagram's bytes only.
const competitorDatagram = 1400

// run runs the experiment once and returns what is wrong with the
// recorded connection's bandwidth series.
func (x competing) run(t *testing.T) []string {
	lab := netlab.ForTest(t, netlab.Options{Name: "mgbw", RateMbit: x.rate})
	rate := float64(x.rate)
	dir := t.TempDir()
	base := 46000 + os.Getpid()%9000
	main, other := strconv.Itoa(base), strconv.Itoa(base+1)
	out, ready := filepath.Join(dir, "bw.mgt"), filepath.Join(dir, "ready")
	rec := exec.Command(bin, "record", "-q", "-o", out, "--netns", lab.Server.NS, "--port", main, "--ready-file", ready)
	rec.Stderr = os.Stderr
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Process.Kill(); rec.Wait() })
	waitFor(t, func() bool { _, err := os.Stat(ready); return err == nil })
	mainAddr := lab.Server.Addr.String() + ":" + main
	otherAddr := lab.Server.Addr.String() + ":" + other
	srv, _ := serveTCP(t, lab, mainAddr)
	raisePriority(t, srv)

	start := func(args ...string) *exec.Cmd {
		c := lab.Command(lab.Client, bin, append([]string{"workload", "send"}, args...)...)
		c.Stdout, c.Stderr = io.Discard, os.Stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		raisePriority(t, c)
		return c
	}
	// Half the link's rate, as bursts every 10 ms.
	const tick = 10 * time.Millisecond
	burst := int(math.Round(rate * 1e6 / 2 / 8 / competitorDatagram * tick.Seconds()))
	bursts := int((x.until - x.from) / tick)
	sink, sinkOut := serveUDP(t, lab, otherAddr, burst*bursts)
	raisePriority(t, sink)
	// The experiment's schedule is wall-clock time; where each phase falls
	// in the trace is measured, not assumed.
	begin := time.Now()
	mainFlow := start("--proto", "tcp", "--to", mainAddr, "--flood", x.total.String(), "--size", "65536")
	time.Sleep(time.Until(begin.Add(x.from)))
	otherStart := time.Now()
	otherFlow := start("--proto", "udp", "--to", otherAddr, "--size", strconv.Itoa(competitorDatagram),
		"--burst", strconv.Itoa(burst), "--interval", tick.String(), "--count", strconv.Itoa(burst*bursts))
	if err := otherFlow.Wait(); err != nil {
		t.Fatalf("competing flow: %v", err)
	}
	otherEnd := time.Now()
	if err := mainFlow.Wait(); err != nil {
		t.Fatalf("main flow: %v", err)
	}
	mainEnd := time.Now()
	rec.Process.Signal(os.Interrupt)
	if err := rec.Wait(); err != nil {
		t.Fatalf("record: %v", err)
	}
	// The sink ends once every datagram has arrived, or 2 s after the last
	// one if some were dropped.
	if !sinkOut.Scan() {
		t.Fatalf("UDP sink said nothing: %v", sinkOut.Err())
	}
	var got, reads int64
	if _, err := fmt.Sscanf(sinkOut.Text(), "received %d bytes in %d reads", &got, &reads); err != nil {
		t.Fatalf("UDP sink: %q: %v", sinkOut.Text(), err)
	}
	otherMbit := float64(got) * 8 / otherEnd.Sub(otherStart).Seconds() / 1e6
	t.Logf("competitor: %d datagrams of %d bytes sent, %d arrived: %.1f Mbit/s", burst*bursts, competitorDatagram, reads, otherMbit)

	fig, err := analyze.Plot([]string{out}, "bandwidth", analyze.PlotOptions{Window: x.window})
	if err != nil {
		t.Fatal(err)
	}
	if len(fig.Series) != 2 {
		t.Fatalf("bandwidth plot has %d series, want application and wire", len(fig.Series))
	}
	// The plot's x is seconds since the trace's first record.
	wall0 := firstRecordWall(t, out)
	at := func(w time.Time) float64 { return float64(w.UnixNano()-wall0) / 1e9 }
	margin := 0.5 + x.window.Seconds() // TCP settles, the window fills
	phases := []struct {
		name     string
		from, to float64
	}{
		{"alone", at(begin) + margin, at(otherStart)},
		{"competing", at(otherStart) + margin, at(otherEnd)},
		{"recovered", at(otherEnd) + margin, at(mainEnd) - 0.2},
	}
	var problems []string
	for _, s := range fig.Series {
		var med [3]float64
		for i, ph := range phases {
			med[i] = medianIn(s.X, s.Y, ph.from, ph.to)
			t.Logf("%s, %s (%.2f–%.2f s): median %.1f Mbit/s", s.Name, ph.name, ph.from, ph.to, med[i])
		}
		for _, i := range []int{0, 2} {
			if med[i] < 0.9*rate || med[i] > 1.1*rate {
				problems = append(problems, fmt.Sprintf("%s %s: %.1f Mbit/s, want within 10%% of %.0f", s.Name, phases[i].name, med[i], rate))
			}
		}
		// While the competitor runs, the connection has what the flow had
		// alone less what the competitor got through.
		left := med[0] - otherMbit
		if med[1] < 0.9*left || med[1] > 1.1*left {
			problems = append(problems, fmt.Sprintf("%s while the other flow runs: %.1f Mbit/s, want within 10%% of %.1f (%.1f alone less the competitor's %.1f)", s.Name, med[1], left, med[0], otherMbit))
		}
	}
	return problems
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// raisePriority gives a workload process nice -10.
func raisePriority(t *testing.T, c *exec.Cmd) {
	t.Helper()
	if err := syscall.Setpriority(syscall.PRIO_PROCESS, c.Process.Pid, -10); err != nil {
		t.Fatalf("raise priority: %v", err)
	}
}

// firstRecordWall returns the wall-clock time of a trace's first record, in
// ns since the epoch: where its plots' time axis starts.
func firstRecordWall(t *testing.T, path string) int64 {
	t.Helper()
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rec, err := r.Next()
	if errors.Is(err, io.EOF) {
		t.Fatal("empty trace")
	}
	if err != nil {
		t.Fatal(err)
	}
	return int64(rec.Time()) + r.Header().Clock.WallOffsetNs
}

// medianIn is the median of the ys whose x lies in [from, to].
func medianIn(xs, ys []float64, from, to float64) float64 {
	var in []float64
	for i, x := range xs {
		if x >= from && x <= to {
			in = append(in, ys[i])
		}
	}
	if len(in) == 0 {
		return 0
	}
	sort.Float64s(in)
	return in[len(in)/2]
}

// serveUDP starts a UDP sink for count competitor datagrams on addr in the
// lab's server and returns it with a scanner on the rest of its output,
// the "received" line.
func serveUDP(t *testing.T, lab *netlab.Lab, addr string, count int) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	return serveWorkload(t, lab, "--proto", "udp", "--listen", addr,
		"--count", strconv.Itoa(count), "--size", strconv.Itoa(competitorDatagram))
}
