// SPDX-License-Identifier: Apache-2.0

// End-to-end tests: the built binary, as a user types it.
package main_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

var bin string

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "magnet-e2e-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		os.Chmod(dir, 0o755) // an unprivileged user runs it too
		bin = filepath.Join(dir, "magnet")
		if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

type result struct {
	stdout, stderr string
	code           int
}

func magnet(t *testing.T, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{o.String(), e.String(), code}
}

// oneLineError asserts a failure with a single, clear line on stderr.
func oneLineError(t *testing.T, r result, want string) {
	t.Helper()
	if r.code == 0 {
		t.Fatalf("exit 0, want failure; stderr %q", r.stderr)
	}
	msg := strings.TrimRight(r.stderr, "\n")
	if strings.Contains(msg, "\n") || strings.Contains(msg, "panic") || strings.Contains(msg, "goroutine") {
		t.Fatalf("want one error line, got:\n%s", r.stderr)
	}
	if !strings.HasPrefix(msg, "magnet: ") || !strings.Contains(msg, want) {
		t.Fatalf("error %q does not say %q", msg, want)
	}
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	notTrace := filepath.Join(dir, "notes.txt")
	os.WriteFile(notTrace, []byte("hello, this is not a trace at all\n"), 0o644)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"record"}, "output file is required"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--events", "sock,bogus"}, `unknown event group "bogus"`},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--buffer", "3000"}, "power of two"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--buffer", "lots"}, "bad size"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--wakeup-fill", "120"}, "--wakeup-fill: 120: want a per cent between 0 and 100"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--poll-interval", "10us"}, "--poll-interval 10µs: want between 1ms and 1m"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--flush-every", "0s"}, "--flush-every 0s: want between 1ms and 1m"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--flush-every", "2h"}, "--flush-every 2h0m0s: want between 1ms and 1m"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--rotate", "1s", "--flush-every", "2s"}, "--flush-every 2s: longer than --rotate 1s"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--port", "70000"}, "port 70000"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--netns", "magnet-no-such-ns"}, "netns magnet-no-such-ns"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--cgroup", dir}, "not in a cgroup2 hierarchy"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "ls"}, "after --"},
		// An argument before -- is a pcap-filter expression.
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "stray"}, "pcap filter: column 1"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--filter", "size >"}, "--filter: bad filter: expr: column 7: Syntax error"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--filter", " "}, "--filter is empty"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--summary=50ms"}, "--summary 50ms: want an interval of at least 100ms"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--summary", "--events", "default,sched"}, "sched cannot be summarized"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--flight", "10ms"}, "--flight 10ms: want a window of at least 1s"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--flight", "30s", "--trigger", "loss"}, `unknown trigger "loss"`},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--trigger", "retrans"}, "need --flight"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--flight", "30s", "--summary"}, "cannot be combined with --summary"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--flight", "30s", "--events", "sock", "--trigger", "retrans"}, "needs the tcp events"},
		{[]string{"record", "-o", filepath.Join(dir, "x-%Y.mgt"), "--flight", "30s"}, "is a pattern"},
		{[]string{"parse", notTrace}, "not a magnet trace (bad magic at offset 0)"},
		{[]string{"parse", filepath.Join(dir, "missing.mgt")}, "no such file"},
		{[]string{"parse", "--time", "martian", notTrace}, "unknown time format"},
		{[]string{"nosuchcommand"}, "unknown command"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, "_"), func(t *testing.T) {
			oneLineError(t, magnet(t, c.args...), c.want)
		})
	}
}

func TestRecordUnwritableOutput(t *testing.T) {
	needRoot(t)
	oneLineError(t, magnet(t, "record", "-o", "/proc/magnet-cannot-write-here.mgt", "--duration", "1s"), "create output")
}

func TestRecordWithoutPrivileges(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	cmd := exec.Command(bin, "record", "-o", filepath.Join(dir, "x.mgt"), "--duration", "1s")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var e bytes.Buffer
	cmd.Stderr = &e
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	oneLineError(t, result{stderr: e.String(), code: code}, "need CAP_BPF")
}

// TestBigEndianTrace reads the committed trace written in big-endian order.
func TestBigEndianTrace(t *testing.T) {
	r := magnet(t, "parse", "../../testdata/bigendian.mgt")
	if r.code != 0 {
		t.Fatalf("parse big-endian trace: %s", r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "time\tcpu\tpid\ttid\tcomm\tnetns\tconn\tevent\tsize") {
		t.Fatalf("unexpected output:\n%s", r.stdout)
	}
	if !strings.Contains(r.stdout, "tcp_xmit") {
		t.Fatalf("no tcp_xmit in:\n%s", r.stdout)
	}
}

func TestRecordCommandExitCode(t *testing.T) {
	needRoot(t)
	out := filepath.Join(t.TempDir(), "cmd.mgt")
	r := magnet(t, "record", "-q", "-o", out, "--", "sh", "-c", "exit 3")
	if r.code != 3 {
		t.Fatalf("exit %d, want the command's 3; stderr %q", r.code, r.stderr)
	}
	if p := magnet(t, "parse", out); p.code != 0 {
		t.Fatalf("parse: %s", p.stderr)
	}
}

// TestKilledRecorder: a recorder killed with SIGKILL leaves a trace that
// parses up to its last complete block, with a warning.
func TestKilledRecorder(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgkill"})
	dir := t.TempDir()
	out, ready := filepath.Join(dir, "killed.mgt"), filepath.Join(dir, "ready")
	port := 30000 + os.Getpid()%10000
	rec := startRecorder(t, os.Stderr, ready, "-q", "-o", out, "--port", fmt.Sprint(port))
	st := statusOf(t, rec.Process.Pid)
	if st == nil {
		t.Fatalf("magnet status does not show the running recorder")
	}

	addr := fmt.Sprintf("%s:%d", lab.Server.Addr, port)
	serveTCP(t, lab, addr)
	cli := lab.Command(lab.Client, bin, "workload", "send", "--proto", "tcp", "--to", addr, "--flood", "1s", "--size", "1024")
	if o, err := cli.CombinedOutput(); err != nil {
		t.Fatalf("client: %v %s", err, o)
	}
	// Blocks are written at least every 200 ms: wait until some are there.
	waitFor(t, func() bool { fi, err := os.Stat(out); return err == nil && fi.Size() > 256<<10 })
	rec.Process.Signal(syscall.SIGKILL)
	rec.Wait()

	r := magnet(t, "parse", out)
	if r.code != 0 {
		t.Fatalf("parse of killed trace failed: %s", r.stderr)
	}
	if !strings.Contains(r.stderr, "cut short") {
		t.Fatalf("no cut-short warning: %q", r.stderr)
	}
	if n := strings.Count(r.stdout, "\tsock_send\t"); n == 0 {
		t.Fatalf("no events parsed from the killed trace")
	}
}

func statusOf(t *testing.T, pid int) map[string]any {
	t.Helper()
	r := magnet(t, "status", "--json")
	if r.code != 0 {
		t.Fatalf("status: %s", r.stderr)
	}
	var rep struct {
		Hooks     []map[string]any `json:"hooks"`
		Recorders []map[string]any `json:"recorders"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("status --json: %v", err)
	}
	if len(rep.Hooks) == 0 {
		t.Fatalf("status lists no hooks")
	}
	for _, rec := range rep.Recorders {
		if int(rec["pid"].(float64)) == pid {
			return rec
		}
	}
	return nil
}

// startRecorder starts `magnet record args... --ready-file ready` with
// its stderr to stderr and returns once it records; it is killed at the
// end of the test unless the test waited for it.
func startRecorder(t *testing.T, stderr io.Writer, ready string, args ...string) *exec.Cmd {
	t.Helper()
	rec := exec.Command(bin, append(append([]string{"record"}, args...), "--ready-file", ready)...)
	rec.Stderr = stderr
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if rec.ProcessState == nil {
			rec.Process.Kill()
			rec.Wait()
		}
	})
	waitFor(t, func() bool { _, err := os.Stat(ready); return err == nil })
	return rec
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStatusWithoutRecorder(t *testing.T) {
	r := magnet(t, "status")
	if r.code != 0 {
		t.Fatalf("status: %s", r.stderr)
	}
	for _, want := range []string{"sock_send", "tp_btf/sock_send_length", "cgroup_skb/egress"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status output lacks %q:\n%s", want, r.stdout)
		}
	}
}

// TestSIGTERMClosesCleanly: SIGTERM drains and closes the trace; it parses
// with no cut-short warning.
func TestSIGTERMClosesCleanly(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	out, ready := filepath.Join(dir, "term.mgt"), filepath.Join(dir, "ready")
	rec := exec.Command(bin, "record", "-o", out, "--ready-file", ready)
	var e bytes.Buffer
	rec.Stderr = &e
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, err := os.Stat(ready); return err == nil })
	rec.Process.Signal(syscall.SIGTERM)
	if err := rec.Wait(); err != nil {
		t.Fatalf("record after SIGTERM: %v\n%s", err, e.String())
	}
	if !strings.Contains(e.String(), "lost:") || !strings.Contains(e.String(), "file:") {
		t.Errorf("no summary after SIGTERM:\n%s", e.String())
	}
	r := magnet(t, "parse", out)
	if r.code != 0 || strings.Contains(r.stderr, "cut short") {
		t.Fatalf("parse after SIGTERM: code %d, %s", r.code, r.stderr)
	}
}

// serveTCP starts the workload's TCP server in the lab's server namespace
// and returns once it listens; the test's cleanup ends it.
func serveTCP(t *testing.T, lab *netlab.Lab, addr string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	return serveWorkload(t, lab, "--proto", "tcp", "--listen", addr)
}

// serveWorkload starts `magnet workload serve` with args in the lab's
// server namespace and returns once it listens, with a scanner on the rest
// of its output (the "received" line); the test's cleanup ends it.
func serveWorkload(t *testing.T, lab *netlab.Lab, args ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	srv := lab.Command(lab.Server, bin, append([]string{"workload", "serve"}, args...)...)
	so, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	sc := bufio.NewScanner(so)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "listening") {
		t.Fatalf("server %v did not start: %q", args, sc.Text())
	}
	return srv, sc
}
