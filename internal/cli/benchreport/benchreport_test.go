// SPDX-License-Identifier: Apache-2.0

package benchreport

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
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
