// SPDX-License-Identifier: Apache-2.0

package collect

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// limitFileSize makes writes to regular files past n bytes fail (EFBIG)
// until the test ends: a disk that fills while the journal is written,
// without root or a small file system. It is process-wide, so the test
// must not run in parallel with any other.
func limitFileSize(t *testing.T, n uint64) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: n, Max: old.Max}); err != nil {
		t.Skipf("cannot lower RLIMIT_FSIZE: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
			t.Errorf("restore RLIMIT_FSIZE: %v", err)
		}
	})
}

// A journal that cannot be written out in full must be reported, and the
// journal saved before must stay as it was: it is what says which traces
// every archive already holds.
func TestJournalSaveShortWriteKeepsOld(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.json")
	j, err := loadJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	j.Shipped = 1
	if err := j.save(); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	j.Files["host-20261128T010203.mgt"] = &fileState{Trace: Blob{Path: strings.Repeat("x", 4096)}}
	limitFileSize(t, uint64(len(before))+16)
	if err := j.save(); err == nil {
		t.Fatal("save: nil error, but the journal did not fit under the file size limit")
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(before) {
		t.Fatalf("journal changed by a failed save:\nbefore %q\nafter  %.200q", before, after)
	}
	if _, err := loadJournal(path); err != nil {
		t.Fatal(err)
	}
}

// writeFileSync is how a manifest is staged: a short write must fail it,
// not leave a truncated file under the final name.
func TestWriteFileSyncShortWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.json")
	limitFileSize(t, 100)
	if err := writeFileSync(path, make([]byte, 4096)); err == nil {
		t.Fatal("writeFileSync: nil error for a write past the file size limit")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("%s exists after a failed write (stat: %v)", path, err)
	}
}
