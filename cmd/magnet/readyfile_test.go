// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The --ready-file of magnet daemon and magnet collect is written as every
// other output: a symbolic link planted in a sticky world-writable directory
// (as another user could in /tmp) is not followed, and the file it points
// at is left as it was. The command says so in one warning line and runs on.
func TestReadyFileSymlinkNotFollowed(t *testing.T) {
	needRoot(t)
	for _, name := range []string{"daemon", "collect"} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			shared := filepath.Join(dir, "shared")
			if err := os.Mkdir(shared, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(shared, os.ModeSticky|0o777); err != nil {
				t.Fatal(err)
			}
			precious := filepath.Join(dir, "precious")
			if err := os.WriteFile(precious, []byte("precious\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			ready := filepath.Join(shared, "ready")
			if err := os.Symlink(precious, ready); err != nil {
				t.Fatal(err)
			}
			var args []string
			switch name {
			case "daemon":
				conf := filepath.Join(dir, "magnetd.yaml")
				if err := os.WriteFile(conf, []byte("events:\n  baseline: sock\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				args = []string{"daemon", "--config", conf, "--socket", filepath.Join(dir, "d.sock")}
			case "collect":
				conf := filepath.Join(dir, "collect.yaml")
				cfg := fmt.Sprintf("host: readyhost\nspool: %s\nrotate: {interval: 1h}\nfilters: {port: 9}\ntargets:\n  - {type: dir, path: %s}\n",
					filepath.Join(dir, "spool"), filepath.Join(dir, "archive"))
				if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
					t.Fatal(err)
				}
				args = []string{"collect", "--config", conf}
			}
			cmd := exec.Command(bin, append(args, "--ready-file", ready)...)
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if cmd.ProcessState == nil {
					cmd.Process.Kill()
					cmd.Wait()
				}
			})
			// The warning comes when the ready file is due: once the probes
			// are attached.
			warned := make(chan string, 1)
			var log strings.Builder
			go func() {
				sc := bufio.NewScanner(stderr)
				for sc.Scan() {
					log.WriteString(sc.Text() + "\n")
					if strings.Contains(sc.Text(), "--ready-file") {
						warned <- sc.Text()
					}
				}
				close(warned)
			}()
			var line string
			select {
			case l, ok := <-warned:
				if !ok {
					t.Fatalf("%s exited without a --ready-file warning", name)
				}
				line = l
			case <-time.After(2 * time.Minute):
				t.Fatalf("no --ready-file warning in 2 minutes:\n%s", log.String())
			}
			if !strings.Contains(line, "warning") || !strings.Contains(line, "is a symbolic link") {
				t.Fatalf("warning %q does not say the ready file is a symbolic link", line)
			}
			if b, err := os.ReadFile(precious); err != nil || string(b) != "precious\n" {
				t.Fatalf("the link's target was written: %q, %v", b, err)
			}
			if fi, err := os.Lstat(ready); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Fatalf("the planted link was replaced: %v, %v", fi, err)
			}
			cmd.Process.Signal(syscall.SIGTERM)
			for range warned {
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("%s after SIGTERM: %v\n%s", name, err, log.String())
			}
		})
	}
}
