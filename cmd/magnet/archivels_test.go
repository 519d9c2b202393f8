// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/tracegen"
)

// rotatedRecording writes a recording of n one-minute files (a sock_send
// a second) under dir and returns them, oldest first.
func rotatedRecording(t *testing.T, dir string, n int) []string {
	t.Helper()
	r := tracegen.NewRotated(t, dir, "h", "%h-%n.mgt", time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC))
	r.EverySecond(r.Record("sock_send"), n*60)
	return r.Close()
}

// TestArchiveLsMissingFiles: `magnet archive ls` says which files of a
// recording are missing, before its first file there and between two of
// its files, in the table and in --json, as report says when it reads
// them; a window that asks nothing of the missing files says nothing.
func TestArchiveLsMissingFiles(t *testing.T) {
	dir := t.TempDir()
	paths := rotatedRecording(t, dir, 6)
	if len(paths) != 6 {
		t.Fatalf("%d files", len(paths))
	}
	for _, i := range []int{0, 1, 3} {
		os.Remove(paths[i])
	}
	r := magnet(t, "archive", "ls", dir)
	if r.code != 0 {
		t.Fatalf("archive ls: %s", r.stderr)
	}
	var notes []string
	rows := 0
	for _, l := range strings.Split(r.stdout, "\n") {
		if strings.HasPrefix(l, "missing: ") {
			notes = append(notes, l)
		}
		// host recording seq start(2) end events lost bytes file: with no
		// manifest, counts are unknown, not 0, and bytes are the file's.
		if f := strings.Fields(l); len(f) == 10 && strings.HasPrefix(filepath.Base(f[9]), "h-") {
			rows++
			fi, err := os.Stat(f[9])
			if err != nil || f[6] != "-" || f[7] != "-" || f[8] != fmt.Sprint(fi.Size()) {
				t.Errorf("row %q: want events and lost unknown (-) and bytes the file's size (%v)", l, err)
			}
		}
	}
	if rows != 3 {
		t.Errorf("%d rows, want 3:\n%s", rows, r.stdout)
	}
	if len(notes) != 2 || !strings.Contains(notes[0], "files 0 to 1 of recording ") || !strings.Contains(notes[0], " before h-0002.mgt") ||
		!strings.Contains(notes[1], "file 3 of recording ") || !strings.Contains(notes[1], " between h-0002.mgt and h-0004.mgt") {
		t.Fatalf("archive ls notes %q; output:\n%s", notes, r.stdout)
	}
	r = magnet(t, "archive", "ls", dir, "--json")
	var chains []struct {
		Missing []string `json:"missing"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &chains) != nil || len(chains) != 1 || len(chains[0].Missing) != 2 {
		t.Fatalf("archive ls --json: %d %s", r.code, r.stdout)
	}
	rep := magnet(t, "report", dir)
	if said := rep.stdout + rep.stderr; rep.code != 0 || !strings.Contains(said, "files 0 to 1 of recording ") || !strings.Contains(said, "missing between h-0002.mgt and h-0004.mgt") {
		t.Fatalf("report: %d %s", rep.code, said)
	}
	// From file 4 on: nothing missing in the window.
	r = magnet(t, "archive", "ls", dir, "--since", "2025-03-01T10:04:30Z")
	if r.code != 0 || strings.Contains(r.stdout, "missing: ") {
		t.Fatalf("archive ls --since after the gaps: %d %s", r.code, r.stdout)
	}
	t.Logf("archive ls:\n%s", strings.Join(notes, "\n"))
}
