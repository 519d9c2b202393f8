// SPDX-License-Identifier: Apache-2.0

package fault

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestUnarmed: in a normal run every point returns at once.
func TestUnarmed(t *testing.T) {
	if armed != "" {
		t.Skip("MAGNET_FAULT is set in this environment")
	}
	done := make(chan struct{})
	go func() {
		At("rotate:after-finish")
		At("ship:after-upload")
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("an unarmed fault point blocked")
	}
}

// TestArmed: a process armed for a point passes the other points, stops at
// its own, says so in the marker file with its pid, and stays there.
func TestArmed(t *testing.T) {
	if os.Getenv("FAULT_TEST_CHILD") == "1" {
		At("ship:after-stage")
		os.WriteFile(os.Getenv("MAGNET_FAULT_MARKER")+".passed", nil, 0o644)
		At("ship:after-upload")
		os.Exit(0) // not reached
	}
	marker := filepath.Join(t.TempDir(), "reached")
	cmd := exec.Command(os.Args[0], "-test.run=^TestArmed$")
	cmd.Env = append(os.Environ(), "FAULT_TEST_CHILD=1", "MAGNET_FAULT=ship:after-upload", "MAGNET_FAULT_MARKER="+marker)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if data, err := os.ReadFile(marker); err == nil {
			if pid, _ := strconv.Atoi(strings.TrimSpace(string(data))); pid != cmd.Process.Pid {
				t.Fatalf("marker says pid %q, the child is %d", data, cmd.Process.Pid)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the armed point was not reached")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Stat(marker + ".passed"); err != nil {
		t.Fatal("the child stopped at a point it was not armed for")
	}
	// Still there: it has not exited.
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		t.Fatalf("the child went on past its point: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	cmd.Process.Kill()
	<-exited
}
