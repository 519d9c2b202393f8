// SPDX-License-Identifier: Apache-2.0

package tracerproc

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A tool that prints its ready mark, then on SIGINT its closing words.
const tool = `trap 'echo "3 packets captured" >&2; exit 0' INT
echo "listening on veth0" >&2
while :; do sleep 0.01; done`

func TestStartMarkEnd(t *testing.T) {
	p, err := Start("tool", exec.Command("sh", "-c", tool), "", "listening on", "", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if p.Pid() <= 0 {
		t.Errorf("pid %d", p.Pid())
	}
	if err := p.End(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n := FirstNumber(regexp.MustCompile(`(\d+) packets? captured`), p.Stderr()); n != 3 {
		t.Errorf("closing words %q: %d packets, want 3", p.Stderr(), n)
	}
}

func TestStartReadyFile(t *testing.T) {
	ready := filepath.Join(t.TempDir(), "ready")
	out := filepath.Join(t.TempDir(), "out")
	script := "echo abc > " + out + "; touch " + ready + "; trap 'exit 0' INT; while :; do sleep 0.01; done"
	p, err := Start("tool", exec.Command("sh", "-c", script), out, "", ready, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ready); !os.IsNotExist(err) {
		t.Errorf("the ready file is still there: %v", err)
	}
	if err := p.End(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if p.Size() != 4 {
		t.Errorf("output size %d, want 4", p.Size())
	}
}

func TestStartExitsEarly(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	script := "echo partial > " + out + "; echo 'no such interface' >&2; exit 1"
	_, err := Start("tool", exec.Command("sh", "-c", script), out, "listening on", "", 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready: no such interface") {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a tool that never got ready left its output: %v", err)
	}
}

func TestEndFailure(t *testing.T) {
	p, err := Start("tool", exec.Command("sh", "-c", "trap 'echo broken >&2; exit 3' INT; echo up >&2; while :; do sleep 0.01; done"), "", "up", "", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.End(10 * time.Second); err == nil || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("exit 3 after SIGINT: err = %v, want the tool's words", err)
	}
}

func TestBpftraceCount(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bt")
	body := "Attaching 3 probes...\n1 0 5 sock_send 10\n2 1 5 dev_xmit 66 1\nLost 7 events\n3 0 5 drop 2\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	ev, lost, err := BpftraceCount(path, "Lost 2 events\n")
	if err != nil || ev != 3 || lost != 9 {
		t.Fatalf("events %d lost %d err %v, want 3, 9, nil", ev, lost, err)
	}
	if _, _, err := BpftraceCount(filepath.Join(t.TempDir(), "none"), ""); err == nil {
		t.Error("a missing output file is not an error")
	}
}

func TestOneLine(t *testing.T) {
	if got := OneLine("a\n  b\tc\n"); got != "a b c" {
		t.Errorf("%q", got)
	}
	if got := OneLine(strings.Repeat("x", 400)); len([]rune(got)) != 301 {
		t.Errorf("long message kept %d runes", len([]rune(got)))
	}
}
