// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"os"
	"os/exec"
	"testing"
)

func TestFdinfoProgID(t *testing.T) {
	prog := "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t1050\nprog_type:\t26\nprog_jited:\t1\nprog_tag:\t0123456789abcdef\nmemlock:\t4096\nprog_id:\t4242\nrun_time_ns:\t0\nrun_cnt:\t0\n"
	if id, ok := fdinfoProgID(prog); !ok || id != 4242 {
		t.Errorf("program fdinfo: %d %v, want 4242", id, ok)
	}
	for _, other := range []string{"pos:\t0\nflags:\t0100000\nmnt_id:\t24\nino:\t3\n", "map_type:\t27\nmap_id:\t7\n", "prog_id:\tx\n"} {
		if id, ok := fdinfoProgID(other); ok {
			t.Errorf("%q: prog_id %d, want none", other, id)
		}
	}
}

// TestHeldPrograms: the programs a process holds are its own, not those
// another process loaded meanwhile (a second recorder on a shared machine).
func TestHeldPrograms(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loading BPF needs root")
	}
	e, err := attachEmpty("net_dev_queue")
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	info, err := e.prog.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Skip("this kernel does not tell program ids")
	}
	held, err := heldPrograms(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !held[id] {
		t.Errorf("program %d not among this process's %v", id, held)
	}
	// A child holds none of them (BPF fds are close-on-exec).
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { child.Process.Kill(); child.Wait() }()
	other, err := heldPrograms(child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(other) != 0 {
		t.Errorf("a child holds programs %v, want none", other)
	}
}
