// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// tmux runs a tmux command on the test's own server (-L), so no user's
// sessions are seen or touched.
func tmux(t *testing.T, server string, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", server}, args...)...).CombinedOutput()
	return string(out), err
}

// TestTopInTmux runs magnet top in a real terminal (tmux) against a live
// daemon while a transfer runs, reads the screen, changes the sort column
// with a key and quits with q.
func TestTopInTmux(t *testing.T) {
	needRoot(t)
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux not installed (scripts/deps.sh installs it)")
	}
	d := startDaemon(t, false, "filter:\n  port: 15301\n")
	lab := netlab.ForTest(t, netlab.Options{Name: "topt", RateMbit: 200})
	f := startFlow(t, lab, 15301, 64<<10)
	findConn(t, d.Client(t), f)

	server := fmt.Sprintf("magnet-top-%d", os.Getpid())
	t.Cleanup(func() { tmux(t, server, "kill-server") })
	// A long interval: the test refreshes with the space key, and sees the
	// resize redrawn at once.
	topCmd := fmt.Sprintf("%s top --socket %s --interval 30s --port %d", bin, d.Socket, f.Remote.Port())
	if out, err := tmux(t, server, "new-session", "-d", "-s", "top", "-x", "200", "-y", "30", topCmd); err != nil {
		t.Fatalf("tmux new-session: %v: %s", err, out)
	}
	screen := func() string {
		out, _ := tmux(t, server, "capture-pane", "-p", "-t", "top")
		return out
	}
	// Wait until the screen holds the flow's row with its application rate
	// (both directions of the client end) between 100 and 250 Mbit/s on a
	// 200 Mbit/s link.
	appOf := func(row string) float64 {
		fields := strings.Fields(row)
		for i, fl := range fields {
			if fl == f.Remote.String() && i+1 < len(fields) && strings.HasSuffix(fields[i+1], "M") {
				v, _ := strconv.ParseFloat(strings.TrimSuffix(fields[i+1], "M"), 64)
				return v
			}
		}
		return 0
	}
	var row string
	deadline := time.Now().Add(20 * time.Second)
	for {
		row = ""
		for _, l := range strings.Split(screen(), "\n") {
			if strings.Contains(l, f.Local.String()+"  "+f.Remote.String()) && strings.Contains(l, "ESTABLISHED") {
				row = l
			}
		}
		if v := appOf(row); v >= 100 && v <= 250 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no row for %v -> %v at 100 to 250 Mbit/s on the screen:\n%s", f.Local, f.Remote, screen())
		}
		tmux(t, server, "send-keys", "-t", "top", "Space")
		time.Sleep(200 * time.Millisecond)
	}
	s := screen()
	if !strings.Contains(s, "sort APP desc") || !strings.Contains(s, "APPv") {
		t.Fatalf("not sorted by APP:\n%s", s)
	}

	tmux(t, server, "send-keys", "-t", "top", "Right")
	waitFor(t, func() bool {
		return strings.Contains(screen(), "sort WIRE desc") && strings.Contains(screen(), "WIREv")
	})
	tmux(t, server, "send-keys", "-t", "top", "r")
	waitFor(t, func() bool { return strings.Contains(screen(), "sort WIRE asc") && strings.Contains(screen(), "WIRE^") })

	// A narrower terminal: redrawn at once (SIGWINCH), every line cut to it.
	if out, err := tmux(t, server, "resize-window", "-t", "top", "-x", "70", "-y", "20"); err != nil {
		t.Fatalf("tmux resize-window: %v: %s", err, out)
	}
	narrow := func() bool {
		lines := strings.Split(strings.TrimRight(screen(), "\n"), "\n")
		for _, l := range lines {
			if len(strings.TrimRight(l, " ")) > 70 {
				return false
			}
		}
		return len(lines) >= 4 && strings.HasPrefix(strings.TrimSpace(lines[2]), "ID")
	}
	for deadline := time.Now().Add(5 * time.Second); !narrow(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not redrawn for 70 columns:\n%s", screen())
		}
	}

	tmux(t, server, "send-keys", "-t", "top", "q")
	waitFor(t, func() bool {
		_, err := tmux(t, server, "has-session", "-t", "top")
		return err != nil // top exited, and the session with it
	})

	// Not a terminal: one table.
	r := magnet(t, "top", "--socket", d.Socket, "--port", strconv.Itoa(int(f.Remote.Port())))
	if r.code != 0 || !strings.Contains(r.stdout, f.Local.String()) || !strings.HasPrefix(strings.TrimSpace(r.stdout), "ID") {
		t.Fatalf("top without a terminal: code %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
