// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// TestAdaptiveExample runs examples/adaptive as a user would, against a
// live daemon, and changes the link's rate under it: on 100 Mbit/s it
// sends half-resolution frames (full ones, 210 Mbit/s at 25 frames per
// second, do not fit), on 25 Mbit/s quarter-resolution ones, and back to
// half when the rate returns.
func TestAdaptiveExample(t *testing.T) {
	d := startDaemon(t, false, "filter:\n  port: 15304\n")
	lab := netlab.ForTest(t, netlab.Options{Name: "adaptt", RateMbit: 100})
	example := filepath.Join(t.TempDir(), "adaptive")
	if out, err := exec.Command("go", "build", "-o", example, "../../examples/adaptive").CombinedOutput(); err != nil {
		t.Fatalf("build the example: %v\n%s", err, out)
	}
	addr := fmt.Sprintf("%s:15304", lab.Server.Addr)
	srv := lab.Command(lab.Server, example, "serve", "--listen", addr)
	srvOut, _ := srv.StdoutPipe()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	if l, err := newLineReader(srvOut).next(10 * time.Second); err != nil || !strings.HasPrefix(l, "listening") {
		t.Fatalf("display did not start: %q %v", l, err)
	}

	snd := lab.Command(lab.Client, example, "send", "--to", addr, "--socket", d.Socket, "--fps", "25", "--frame", "1048576")
	sndOut, _ := snd.StdoutPipe()
	var sndErr lockedBuffer
	snd.Stderr = &sndErr
	if err := snd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- snd.Wait() }()
	t.Cleanup(func() {
		snd.Process.Kill()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	})
	lines := newLineReader(sndOut)
	var seen []string
	// await reads the sender's lines until it chooses level.
	await := func(level string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			l, err := lines.next(time.Until(deadline))
			if err != nil {
				t.Fatalf("no %q level (%v); the sender said:\n%s\n%s", level, err, strings.Join(seen, "\n"), sndErr.String())
			}
			seen = append(seen, l)
			if f := strings.Fields(l); len(f) >= 5 && f[3] == "->" && f[4] == level {
				return
			}
		}
	}
	await("half")
	if err := lab.SetRate(25); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	await("quarter")
	t.Logf("100 -> 25 Mbit/s: quarter after %v", time.Since(changed).Round(10*time.Millisecond))
	if err := lab.SetRate(100); err != nil {
		t.Fatal(err)
	}
	changed = time.Now()
	await("half")
	t.Logf("25 -> 100 Mbit/s: half after %v", time.Since(changed).Round(10*time.Millisecond))

	snd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("sender: %v\n%s", err, sndErr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the sender did not stop on SIGINT")
	}
	for {
		l, err := lines.next(5 * time.Second)
		if err != nil {
			break
		}
		seen = append(seen, l)
	}
	if last := seen[len(seen)-1]; !strings.HasPrefix(last, "sent ") {
		t.Fatalf("no summary; the sender said:\n%s", strings.Join(seen, "\n"))
	}
	t.Logf("the sender said:\n%s", strings.Join(seen, "\n"))
}
