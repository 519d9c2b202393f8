// SPDX-License-Identifier: Apache-2.0

package benchreport

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type fakeReport struct{ err error }

func (r fakeReport) WriteJSON(w io.Writer) error     { io.WriteString(w, "{}\n"); return r.err }
func (r fakeReport) WriteMarkdown(w io.Writer) error { io.WriteString(w, "# r\n"); return r.err }

func TestWrite(t *testing.T) {
	var stdout bytes.Buffer
	if err := Write(&stdout, "", false, fakeReport{}); err != nil || stdout.String() != "# r\n" {
		t.Fatalf("markdown to stdout: %q, %v", stdout.String(), err)
	}
	path := filepath.Join(t.TempDir(), "r.json")
	if err := Write(&stdout, path, true, fakeReport{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "{}\n" {
		t.Errorf("file holds %q", b)
	}
	// A report that fails to render leaves no file behind.
	bad := filepath.Join(t.TempDir(), "bad.md")
	if err := Write(&stdout, bad, false, fakeReport{err: errors.New("boom")}); err == nil {
		t.Error("rendering error not returned")
	}
	if _, err := os.Stat(bad); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("half report written: %v", err)
	}
}

func TestCheckOutput(t *testing.T) {
	dir := t.TempDir()
	if err := CheckOutput(filepath.Join(dir, "r.md")); err != nil {
		t.Errorf("writable directory refused: %v", err)
	}
	if err := CheckOutput(filepath.Join(dir, "missing", "r.md")); err == nil {
		t.Error("missing directory accepted")
	}
	file := filepath.Join(dir, "f")
	os.WriteFile(file, nil, 0o644)
	if err := CheckOutput(filepath.Join(file, "r.md")); err == nil {
		t.Error("a file as directory accepted")
	}
}

// Run as root, the report does not follow a symbolic link another user
// planted in a sticky world-writable directory.
func TestWritePlantedSymlink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: plants a link owned by another user")
	}
	shared := filepath.Join(t.TempDir(), "tmp")
	if err := os.Mkdir(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(target, []byte("keep\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(shared, "report.md")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	err := Write(io.Discard, link, false, fakeReport{})
	if err == nil || !strings.Contains(err.Error(), "is a symbolic link in "+shared) {
		t.Errorf("report through a planted link: %v", err)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep\n" {
		t.Errorf("the link's target was written: %q", b)
	}
}
