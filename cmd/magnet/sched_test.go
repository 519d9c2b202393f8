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
	"runtime"
	"strconv"
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
	p := magnet(t, "parse", "--types", "sched_switch", out)
	if p.code != 0 {
		t.Fatalf("parse: %s", p.stderr)
	}
	switches := strings.Count(p.stdout, "\tsched_switch\t")
	timed := checkSwitchTimes(t, p.stdout)

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
		Switch      durations `json:"context_switch_us"`
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
	// Every timed switch in the trace, and only those, is in the report.
	if cs := st.All.Switch; cs.Count != timed || cs.Median <= 0 || cs.Median > cs.P99 || cs.P99 > cs.Max {
		t.Errorf("context-switch time %+v, %d timed switches in the trace", cs, timed)
	}
	t.Logf("context-switch time µs: %+v", st.All.Switch)
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
	for _, want := range []string{"sched (", "wake→run µs", "context-switch time: sched_entry_tp to sched_exit_tp", "reader during that wait: off-CPU"} {
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

// checkSwitchTimes checks the time in the scheduler that each sched_switch
// record of `magnet parse` output carries, by exact relations to the times
// of the CPU's switches (which bpf_ktime_get_ns stamps from the same clock),
// and returns how many records carry a whole context-switch time.
//
// pick_ns runs from this __schedule()'s entry, after the CPU's previous
// switch, so it is shorter than the time since that switch;
// last_switch_ns is the previous switch's entry to exit, which lie between
// the switch before it and this one.
func checkSwitchTimes(t *testing.T, parsed string) (timed int) {
	t.Helper()
	type last struct{ t1, t2 float64 } // the CPU's latest two switches, s
	cpus := map[string]*last{}
	n, picked := 0, 0
	for _, line := range strings.Split(parsed, "\n") {
		f := strings.Split(line, "\t")
		if len(f) < 10 || f[7] != "sched_switch" {
			continue
		}
		n++
		at, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			t.Fatalf("time in %q: %v", line, err)
		}
		var pick, whole float64
		for _, kv := range strings.Fields(f[9]) {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "pick_ns":
				pick, _ = strconv.ParseFloat(v, 64)
			case "last_switch_ns":
				whole, _ = strconv.ParseFloat(v, 64)
			}
		}
		c := cpus[f[1]]
		if c == nil {
			c = &last{}
			cpus[f[1]] = c
		}
		// 1e-9: the text has ns resolution.
		if pick > 0 {
			picked++
			if c.t1 > 0 && pick/1e9 > at-c.t1+1e-9 {
				t.Errorf("cpu %s at %.9f: pick_ns %v, but the CPU switched %.9f s before", f[1], at, pick, at-c.t1)
			}
		}
		if whole > 0 {
			timed++
			if c.t2 > 0 && whole/1e9 > at-c.t2+1e-9 {
				t.Errorf("cpu %s at %.9f: last_switch_ns %v spans more than the last two switches (%.9f s)", f[1], at, whole, at-c.t2)
			}
		}
		c.t2, c.t1 = c.t1, at
	}
	// The entry and exit programs are attached before sched_switch and
	// detached after it, so only a CPU already inside __schedule() then
	// has a switch without pick_ns. Without last_switch_ns: each CPU's
	// first, and those after a switch to a new task, which starts outside
	// __schedule() (no sched_exit_tp); the workload forks little.
	if n == 0 || n-picked > runtime.NumCPU() || timed < n*9/10 {
		t.Errorf("%d switches: %d with pick_ns, %d with last_switch_ns", n, picked, timed)
	}
	t.Logf("%d switches: %d with pick_ns, %d with last_switch_ns", n, picked, timed)
	return timed
}

// TestContextSwitchTime checks the context-switch time against perf's own
// measure of a pipe ping-pong pinned to one CPU: each of its round trips
// is two context switches on that CPU (plus two writes and two reads), so
// the recorder must see at least two timed switches per round trip, and
// two switches take less than a round trip.
func TestContextSwitchTime(t *testing.T) {
	needRoot(t)
	perf, err := exec.LookPath("perf")
	if err != nil {
		t.Skip("needs perf (perf bench sched pipe)")
	}
	const loops = 20000
	out := filepath.Join(t.TempDir(), "pipe.mgt")
	r := magnet(t, "record", "-q", "-o", out, "--events", "sched", "--",
		"taskset", "-c", "0", perf, "bench", "sched", "pipe", "-l", fmt.Sprint(loops))
	if r.code != 0 {
		t.Fatalf("record: %s", r.stderr)
	}
	var usPerOp float64
	for _, line := range strings.Split(r.stdout, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == "usecs/op" {
			usPerOp, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	if usPerOp <= 0 {
		t.Fatalf("no usecs/op in perf's output:\n%s", r.stdout)
	}
	rep := magnet(t, "report", "--json", out)
	if rep.code != 0 {
		t.Fatalf("report: %s", rep.stderr)
	}
	type durations struct {
		Count                  int
		Mean, Median, P99, Max float64
	}
	var v struct {
		Sched []struct {
			CPUs []struct {
				CPU      int       `json:"cpu"`
				Switches int       `json:"switches"`
				Switch   durations `json:"context_switch_us"`
			} `json:"cpus"`
			Lost int `json:"lost"`
		} `json:"sched"`
	}
	if err := json.Unmarshal([]byte(rep.stdout), &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Sched) != 1 || v.Sched[0].Lost > 0 {
		t.Fatalf("sched sections %+v", v.Sched)
	}
	for _, c := range v.Sched[0].CPUs {
		if c.CPU != 0 {
			continue
		}
		t.Logf("perf: %.3f µs per round trip; cpu 0: %d switches, context-switch time µs %+v", usPerOp, c.Switches, c.Switch)
		// Untimed: the CPU's first switch, and the switch into each new
		// task (taskset's exec, perf's two threads) that starts outside
		// __schedule(); 10 leaves room for those.
		if c.Switch.Count < 2*loops || c.Switch.Count < c.Switches-10 {
			t.Errorf("%d timed of %d switches for %d round trips", c.Switch.Count, c.Switches, loops)
		}
		if c.Switch.Median <= 0 || 2*c.Switch.Median >= usPerOp {
			t.Errorf("median context switch %.3f µs, but a round trip of two took %.3f µs", c.Switch.Median, usPerOp)
		}
		return
	}
	t.Fatalf("no switches on cpu 0: %+v", v.Sched[0].CPUs)
}
