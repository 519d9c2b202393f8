// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// TestReportSched records the FTP pattern between two namespaces with the
// sched group and checks the report's sched section against the trace, the
// reader's split of the socket wait, the HTML page and the sched plot.
func TestReportSched(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgsched"})
	dir := t.TempDir()
	out, ready := filepath.Join(dir, "sched.mgt"), filepath.Join(dir, "ready")
	port := 30000 + (os.Getpid()+7)%10000
	rec := exec.Command(bin, "record", "-q", "-o", out, "--port", fmt.Sprint(port), "--events", "default,sched", "--ready-file", ready)
	var recErr bytes.Buffer
	rec.Stderr = &recErr
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if rec.ProcessState == nil {
			rec.Process.Kill()
			rec.Wait()
		}
	}()
	waitFor(t, func() bool { _, err := os.Stat(ready); return err == nil })

	addr := fmt.Sprintf("%s:%d", lab.Server.Addr, port)
	_, srvOut := serveTCP(t, lab, addr)
	cli := lab.Command(lab.Client, bin, "workload", "send", "--proto", "tcp", "--to", addr, "--count", "50", "--size", "10240", "--interval", "5ms")
	if o, err := cli.CombinedOutput(); err != nil {
		t.Fatalf("client: %v %s", err, o)
	}
	if !srvOut.Scan() || !strings.HasPrefix(srvOut.Text(), "received 512000 bytes") {
		t.Fatalf("server: %q", srvOut.Text())
	}
	rec.Process.Signal(syscall.SIGTERM)
	if err := rec.Wait(); err != nil {
		t.Fatalf("record: %v\n%s", err, recErr.String())
	}

	// The trace's own count of context switches, to check the report by.
	p := magnet(t, "parse", "--events", "sched_switch", out)
	if p.code != 0 {
		t.Fatalf("parse: %s", p.stderr)
	}
	switches := strings.Count(p.stdout, "\tsched_switch\t")

	r := magnet(t, "report", "--json", out)
	if r.code != 0 {
		t.Fatalf("report: %s", r.stderr)
	}
	type durations struct {
		Count                  int
		Mean, Median, P99, Max float64
	}
	type cpu struct {
		CPU         int       `json:"cpu"`
		Switches    int       `json:"switches"`
		PerSecond   float64   `json:"switches_per_s"`
		Between     durations `json:"between_switches_us"`
		WakeupToRun durations `json:"wakeup_to_run_us"`
		Lost        int       `json:"lost"`
	}
	var rep struct {
		Connections []struct {
			Receive *struct {
				SocketWaitUs float64 `json:"socket_wait_us"`
				Reader       *struct {
					FollowedUs float64 `json:"followed_us"`
					OnCPUUs    float64 `json:"on_cpu_us"`
					RunnableUs float64 `json:"runnable_us"`
					AsleepUs   float64 `json:"asleep_us"`
					Followed   float64 `json:"followed_share"`
				} `json:"reader"`
			} `json:"receive_time"`
		} `json:"connections"`
		Sched []struct {
			SpanS float64 `json:"span_s"`
			CPUs  []cpu   `json:"cpus"`
			All   cpu     `json:"all"`
			Lost  int     `json:"lost"`
		} `json:"sched"`
		Warnings []string `json:"warnings"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Sched) != 1 {
		t.Fatalf("%d sched sections, want 1", len(rep.Sched))
	}
	st := rep.Sched[0]
	sum := 0
	for _, c := range st.CPUs {
		sum += c.Switches
		if c.Between.Count > c.Switches || c.Between.Median > c.Between.P99 || c.Between.P99 > c.Between.Max {
			t.Errorf("cpu %d: time between switches %+v of %d switches", c.CPU, c.Between, c.Switches)
		}
		if w := c.WakeupToRun; w.Count > 0 && (w.Median > w.P99 || w.P99 > w.Max || w.Mean > w.Max) {
			t.Errorf("cpu %d: wakeup to run %+v", c.CPU, w)
		}
	}
	if switches == 0 || sum != switches || st.All.Switches != switches || st.All.CPU != -1 {
		t.Errorf("switches: %d in the trace, %d over the CPUs, %d in all", switches, sum, st.All.Switches)
	}
	if st.All.WakeupToRun.Count == 0 || st.SpanS <= 0 || math.Abs(st.All.PerSecond-float64(switches)/st.SpanS) > 1e-6*st.All.PerSecond {
		t.Errorf("all CPUs %+v over %v s", st.All, st.SpanS)
	}
	if st.Lost > 0 && !strings.Contains(strings.Join(rep.Warnings, "\n"), "sched events were lost") {
		t.Errorf("%d sched events lost without a warning", st.Lost)
	}
	// The receiving connection: where its reader was while data waited.
	split := false
	for _, c := range rep.Connections {
		if c.Receive == nil || c.Receive.Reader == nil {
			continue
		}
		split = true
		w := c.Receive.Reader
		if w.FollowedUs <= 0 || math.Abs(w.OnCPUUs+w.RunnableUs+w.AsleepUs-w.FollowedUs) > 1e-6*w.FollowedUs ||
			w.FollowedUs > c.Receive.SocketWaitUs*(1+1e-9) || w.Followed <= 0 || w.Followed > 1 {
			t.Errorf("reader split %+v of a %v µs socket wait", *w, c.Receive.SocketWaitUs)
		}
	}
	if !split {
		t.Errorf("no connection splits its socket wait by the reader's state")
	}

	text := magnet(t, "report", out)
	for _, want := range []string{"sched (", "wake→run µs", "reader during that wait: off-CPU"} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, text.stdout)
		}
	}
	page := filepath.Join(dir, "report.html")
	if r := magnet(t, "report", out, "--html", page); r.code != 0 {
		t.Fatalf("report --html: %s", r.stderr)
	}
	if data, err := os.ReadFile(page); err != nil || !strings.Contains(string(data), "Scheduler: context switches per CPU") {
		t.Errorf("HTML report has no sched table (%v)", err)
	}
	// The sched plot as PNG: a series per CPU that switched.
	png := filepath.Join(dir, "sched.png")
	if r := magnet(t, "plot", out, "--kind", "sched", "-o", png); r.code != 0 {
		t.Fatalf("plot sched: %s", r.stderr)
	}
	busy := 0 // the first CPUs with enough markers to tell from the legend's
	for busy < len(st.CPUs) && st.CPUs[busy].Between.Count >= 20 {
		busy++
	}
	if busy == 0 {
		t.Fatalf("no CPU switched 20 times: %+v", st.CPUs)
	}
	checkPNG(t, png, busy, true)
}
