// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"errors"
	"fmt"
	"io"
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
// a 100 Mbit/s tbf link, recorded on the receiver, and a second bulk flow
// over the same link for part of the time. The bandwidth series of the
// recorded connection (the plot's sliding window, at the application and
// at the wire) is within 10 % of the link's rate while the flow is alone,
// drops while the other runs, and recovers after.
//
// By default the transfer takes 7 s with the competitor from second 2 to
// 4.5, to keep CI short; MAGNET_FULL_BANDWIDTH=1 runs the 10 s
// transfer with the competitor from second 4 to 7. The workload processes
// run at a raised priority: other tests share the CPUs, and a starved
// sender or reader would measure the machine, not the link.
func TestBandwidthCompetingFlow(t *testing.T) {
	needRoot(t)
	// The namespaces inherit the host's congestion control, BBR here: a BBR
	// flow that starts against one holding the link took ~11 % of it for
	// its first 2 s (2 of 2 tries at load 1.4), so the other flow runs
	// 4.5 s and its first 2 s are left out of the competing phase.
	x := competing{rate: 100, total: 9 * time.Second, from: 2 * time.Second, until: 6500 * time.Millisecond, window: 250 * time.Millisecond}
	if os.Getenv("MAGNET_FULL_BANDWIDTH") == "1" {
		x.total, x.from, x.until, x.window = 10*time.Second, 4*time.Second, 7*time.Second, 500*time.Millisecond
	}
	problems := x.run(t)
	if len(problems) > 0 {
		// Try once more before failing, for two reasons outside magnet:
		// the link's rate needs a sender, a reader and the softirqs that
		// drain tbf to be scheduled in time (other test packages run
		// alongside), and CUBIC against an incumbent that has filled a
		// 50 ms tbf queue sometimes takes most of the short CI window to
		// win its share (seen: the incumbent at 87.5 of 100 Mbit/s over
		// the whole 2.5 s at load 4 on 2 CPUs).
		t.Logf("load average %s on %d CPUs; again, after: %v", loadavg(), runtime.NumCPU(), problems)
		problems = x.run(t)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// competing is the experiment: a flow alone over a link of rate Mbit/s for
// total, another flow from from to until.
type competing struct {
	rate               int
	total, from, until time.Duration
	window             time.Duration
}

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
	for _, addr := range []string{mainAddr, otherAddr} {
		srv, _ := serveTCP(t, lab, addr)
		raisePriority(t, srv)
	}

	flood := func(addr string, d time.Duration) *exec.Cmd {
		c := lab.Command(lab.Client, bin, "workload", "send", "--proto", "tcp", "--to", addr, "--flood", d.String(), "--size", "65536")
		c.Stdout, c.Stderr = io.Discard, os.Stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		raisePriority(t, c)
		return c
	}
	// The experiment's schedule is wall-clock time; where each phase falls
	// in the trace is measured, not assumed.
	start := time.Now()
	mainFlow := flood(mainAddr, x.total)
	time.Sleep(time.Until(start.Add(x.from)))
	otherStart := time.Now()
	otherFlow := flood(otherAddr, x.until-x.from)
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
		{"alone", at(start) + margin, at(otherStart)},
		{"competing", at(otherStart) + 2 + x.window.Seconds(), at(otherEnd)}, // the newcomer ramps up
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
		// How fast the two flows converge to halves varies (CUBIC, a
		// 50 ms tbf queue): what must show is a drop below the band of
		// the flow alone, not a particular share.
		if med[1] > 0.85*rate || med[1] < 0.1*rate {
			problems = append(problems, fmt.Sprintf("%s while the other flow runs: %.1f Mbit/s, want a drop below the flow alone (between 10 and 85 Mbit/s)", s.Name, med[1]))
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
