// SPDX-License-Identifier: Apache-2.0

package collect

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// fullDisk mounts a small tmpfs for the test and fills it, leaving room for
// little more than a block.
func fullDisk(t *testing.T) (dir string, fill func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir = t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=256k"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	fill = func() {
		f, err := os.Create(filepath.Join(dir, "filler"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		buf := make([]byte, 4096)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				return
			}
		}
	}
	return dir, fill
}

// TestJournalWriteFailureKeepsOld: a journal save that fails to write (a
// full disk) returns the error and leaves the journal on disk as it was,
// never a truncated one renamed over it.
func TestJournalWriteFailureKeepsOld(t *testing.T) {
	dir, fill := fullDisk(t)
	j := &journal{path: filepath.Join(dir, journalName), Files: map[string]*fileState{}}
	j.Shipped = 7
	if err := j.save(); err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(j.path)
	fill()
	// Large enough not to fit in what is left of a block.
	j.Files[strings.Repeat("x", 64<<10)] = &fileState{Done: map[string]bool{}}
	if err := j.save(); err == nil {
		t.Fatal("save on a full disk returned no error")
	}
	now, _ := os.ReadFile(j.path)
	if string(now) != string(good) {
		t.Fatalf("journal replaced by a failed write: %d bytes, was %d", len(now), len(good))
	}
	if back, err := loadJournal(j.path); err != nil || back.Shipped != 7 {
		t.Fatalf("journal after the failed save: %+v %v", back, err)
	}
	if _, err := os.Stat(j.path + ".part"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the failed write's .part is left behind: %v", err)
	}
	// The staged manifest goes through the same path.
	os.Remove(filepath.Join(dir, "filler"))
	m := filepath.Join(dir, "m.json")
	if err := writeFileSync(m, []byte("{}\n")); err != nil {
		t.Fatal(err)
	}
	fill()
	if err := writeFileSync(m, make([]byte, 64<<10)); err == nil {
		t.Fatal("writeFileSync on a full disk returned no error")
	}
	if data, _ := os.ReadFile(m); string(data) != "{}\n" {
		t.Fatalf("manifest replaced by a failed write: %q", data[:min(len(data), 16)])
	}
}
