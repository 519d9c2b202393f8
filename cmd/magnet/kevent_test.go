// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// TestKernelEventBadInput: a bad --tracepoint, --uprobe, --usdt or
// --kprobe is one line and a non-zero exit, and a trace already at the
// output path is left as it was.
func TestKernelEventBadInput(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "kept.mgt")
	if err := os.WriteFile(out, []byte("an earlier recording"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
		root bool // needs the kernel (tracefs, perf event sources)
	}{
		{[]string{"--tracepoint", "napi_poll"}, "want SYSTEM:NAME", false},
		{[]string{"--tracepoint", "napi:napi_poll if"}, "empty filter", false},
		{[]string{"--uprobe", "/no/such/bin:f"}, "uprobe", false},
		{[]string{"--uprobe", "/bin/sh"}, "want BINARY:SYMBOL", false},
		{[]string{"--usdt", "/bin/sh:x"}, "want BINARY:PROVIDER:NAME", false},
		{[]string{"--kprobe", "tcp sendmsg"}, "kernel function", false},
		{[]string{"--tracepoint", "napi:no_such_poll"}, "no such tracepoint", true},
		{[]string{"--tracepoint", "napi:napi_poll if work >> 1"}, "napi:napi_poll", true},
		{[]string{"--tracepoint", "napi:napi_poll if dev_name == 3"}, "only integer fields", true},
		{[]string{"--tracepoint", "irq:softirq_entry if vec == -3"}, "unsigned", true},
		{[]string{"--usdt", "/bin/sh:python:gc__start"}, "usdt /bin/sh:python:gc__start", true},
		{[]string{"--kprobe", "tcp_sendmsg"}, "kprobe tcp_sendmsg", true},
		{[]string{"--kprobe", "no_such_kernel_function"}, "no such kernel function", true},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, "_"), func(t *testing.T) {
			if c.root {
				needRoot(t)
			}
			args := append([]string{"record", "-o", out, "--duration", "1s"}, c.args...)
			oneLineError(t, magnet(t, args...), c.want)
			if b, _ := os.ReadFile(out); string(b) != "an earlier recording" {
				t.Fatalf("the file at -o was changed: %q", b)
			}
		})
	}
}

// TestStatusKernelEvents: magnet status lists the kinds of kernel event
// this kernel offers; here tracepoints and uprobes, no kprobes, and fentry
// refused (a root-only test load says so).
func TestStatusKernelEvents(t *testing.T) {
	r := magnet(t, "status", "--status-dir", t.TempDir())
	if r.code != 0 {
		t.Fatalf("status: %s", r.stderr)
	}
	for _, want := range []string{"KERNEL EVENTS", "tracepoint", "uprobe", "usdt", "kprobe", "fentry"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status does not list %q:\n%s", want, r.stdout)
		}
	}
	if _, err := os.Stat("/sys/bus/event_source/devices/kprobe"); err != nil && !strings.Contains(r.stdout, "no kprobes") {
		t.Errorf("this kernel has no kprobes and status does not say so:\n%s", r.stdout)
	}
	if os.Geteuid() == 0 {
		// The kprobe error of record names fentry's state as status does.
		k := magnet(t, "record", "-o", filepath.Join(t.TempDir(), "k.mgt"), "--kprobe", "tcp_sendmsg")
		if refused := strings.Contains(r.stdout, "refuses fentry"); refused && k.code != 0 && !strings.Contains(k.stderr, "refuses fentry") {
			t.Errorf("status says fentry is refused, record --kprobe does not: %s", k.stderr)
		}
	}
}

// TestRecordTracepointParse: --tracepoint end to end through the binary,
// decoded by parse --types with no code for it.
func TestRecordTracepointParse(t *testing.T) {
	needRoot(t)
	out := filepath.Join(t.TempDir(), "tp.mgt")
	r := magnet(t, "record", "-q", "-o", out, "--events", "conn", "--tracepoint", "task:task_rename",
		"--", "sh", "-c", "exec true")
	if r.code != 0 {
		t.Fatalf("record: %s", r.stderr)
	}
	// sh takes the name of what it executes: one rename, sh to true.
	p := magnet(t, "parse", "--types", "task_rename", out)
	if p.code != 0 {
		t.Fatalf("parse: %s", p.stderr)
	}
	lines := strings.Split(strings.TrimSpace(p.stdout), "\n")
	found := false
	for _, l := range lines[1:] {
		if strings.Contains(l, "\ttask_rename\t") && strings.Contains(l, "oldcomm=sh newcomm=true") {
			found = true
		}
	}
	if !found {
		t.Errorf("no task_rename sh -> true in:\n%s", p.stdout)
	}
	// report says which kernel events the trace holds, as many as parse
	// prints, in text and JSON.
	renames := strings.Count(p.stdout, "\ttask_rename\t")
	r = magnet(t, "report", out)
	if want := "kernel events (" + out + "): task_rename " + strconv.Itoa(renames) + "\n"; r.code != 0 || !strings.Contains(r.stdout, want) {
		t.Errorf("report (%d renames parsed): %s%s", renames, r.stdout, r.stderr)
	}
	r = magnet(t, "report", "--json", out)
	var rep struct {
		KernelEvents []struct {
			Events []struct {
				Name    string `json:"name"`
				Group   string `json:"group"`
				Records int    `json:"records"`
			} `json:"events"`
		} `json:"kernel_events"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.KernelEvents) != 1 || len(rep.KernelEvents[0].Events) != 1 || rep.KernelEvents[0].Events[0].Records != renames || rep.KernelEvents[0].Events[0].Group != "tracepoint" {
		t.Errorf("report --json kernel_events %+v, want task_rename %d", rep.KernelEvents, renames)
	}
}

// TestUprobeNginx: the issue's own command, magnet record --uprobe
// /usr/sbin/nginx:ngx_http_finalize_request, on an unmodified nginx
// serving curl in a namespace of the test's. bpftrace on the same
// function is the witness: attached before magnet and detached after it,
// and every request over (nginx's access log has its line: it is written
// after the request is finalized) before magnet stops, so both saw every
// call: the same number, with the same second argument (rc) in the same
// order, at least one call per request.
func TestUprobeNginx(t *testing.T) {
	needRoot(t)
	const nginx = "/usr/sbin/nginx"
	for _, tool := range []string{nginx, "curl", "bpftrace"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s", tool)
		}
	}
	lab := netlab.ForTest(t, netlab.Options{Name: "mgupng"})
	dir := t.TempDir()
	// The namespace is the test's own: a fixed port meets no other.
	listen := lab.Server.Addr.String() + ":8080"
	srv := netlab.StartNginx(t, lab.Server, nginx, dir, listen, "", nil)
	if err := os.WriteFile(filepath.Join(dir, "www", "index.html"), []byte("magnet\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	get := func() bool {
		return lab.Command(lab.Client, "curl", "-sS", "-o", "/dev/null", "--max-time", "5", "http://"+listen+"/").Run() == nil
	}
	waitFor(t, get) // nginx listens
	logLines := func() int {
		b, _ := os.ReadFile(filepath.Join(dir, "access.log"))
		return strings.Count(string(b), "\n")
	}
	waitFor(t, func() bool { return logLines() == 1 })

	bt := exec.Command("bpftrace", "-e", fmt.Sprintf(`BEGIN { printf("READY\n"); }
uprobe:%s:ngx_http_finalize_request /pid == %d/ { printf("F %%d\n", (int64)arg1); }`, nginx, srv.Process.Pid))
	btOut, err := bt.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := bt.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bt.Process.Kill(); bt.Wait() })
	lines := bufio.NewScanner(btOut)
	for lines.Scan() && lines.Text() != "READY" {
	}

	out, ready := filepath.Join(dir, "x.mgt"), filepath.Join(dir, "ready")
	// --pid: other tests may run an nginx of their own meanwhile.
	var recErr bytes.Buffer
	rec := startRecorder(t, &recErr, ready, "-q", "-o", out, "--events", "conn", "--pid", strconv.Itoa(srv.Process.Pid),
		"--uprobe", nginx+":ngx_http_finalize_request")
	const requests = 20
	for i := 0; i < requests; i++ {
		if !get() {
			t.Fatalf("request %d failed", i)
		}
	}
	waitFor(t, func() bool { return logLines() == 1+requests })
	rec.Process.Signal(os.Interrupt)
	if err := rec.Wait(); err != nil {
		t.Fatalf("record: %v: %s", err, recErr.String())
	}
	bt.Process.Signal(os.Interrupt)
	var want []string
	for lines.Scan() {
		if v, ok := strings.CutPrefix(lines.Text(), "F "); ok {
			want = append(want, v)
		}
	}
	bt.Wait()

	p := magnet(t, "parse", "--types", "ngx_http_finalize_request", out)
	if p.code != 0 {
		t.Fatalf("parse: %s", p.stderr)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(p.stdout), "\n")[1:] {
		for _, f := range strings.Fields(l) {
			if v, ok := strings.CutPrefix(f, "arg1="); ok {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					t.Fatalf("arg1 %q", v)
				}
				got = append(got, strconv.FormatInt(int64(n), 10))
			}
		}
	}
	t.Logf("%d requests: %d calls recorded, bpftrace %d; rc values %v", requests, len(got), len(want), got)
	if len(got) < requests || strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("rc of each call, recorded: %v\nbpftrace: %v", got, want)
	}
}
