// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
// this kernel offers; here tracepoints and uprobes, and no kprobes.
func TestStatusKernelEvents(t *testing.T) {
	r := magnet(t, "status", "--status-dir", t.TempDir())
	if r.code != 0 {
		t.Fatalf("status: %s", r.stderr)
	}
	for _, want := range []string{"KERNEL EVENTS", "tracepoint", "uprobe", "usdt", "kprobe"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status does not list %q:\n%s", want, r.stdout)
		}
	}
	if _, err := os.Stat("/sys/bus/event_source/devices/kprobe"); err != nil && !strings.Contains(r.stdout, "no kprobes") {
		t.Errorf("this kernel has no kprobes and status does not say so:\n%s", r.stdout)
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
}
