// SPDX-License-Identifier: Apache-2.0

package outfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeOld(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("recorded data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func unchanged(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "recorded data\n" {
		t.Fatalf("%s was changed: %q", path, b)
	}
}

func TestCreateRefusesInput(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.mgt")
	writeOld(t, in)
	link := filepath.Join(dir, "link.svg")
	if err := os.Symlink("in.mgt", link); err != nil {
		t.Fatal(err)
	}
	hard := filepath.Join(dir, "hard.mgt")
	if err := os.Link(in, hard); err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{in, link, hard, filepath.Join(dir, ".", "in.mgt")} {
		f, err := Create(out, Options{Inputs: []string{in}})
		if !errors.Is(err, ErrIsInput) {
			if f != nil {
				f.Close()
			}
			t.Fatalf("Create(%s): err %v, want ErrIsInput", out, err)
		}
		unchanged(t, in)
	}
	// Another file is replaced.
	other := filepath.Join(dir, "out.csv")
	writeOld(t, other)
	f, err := Create(other, Options{Inputs: []string{in, filepath.Join(dir, "missing")}})
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if fi, _ := os.Stat(other); fi.Size() != 0 {
		t.Fatalf("%s not emptied: %d bytes", other, fi.Size())
	}
}

func TestCreateLocked(t *testing.T) {
	p := filepath.Join(t.TempDir(), "same.mgt")
	first, err := Create(p, Options{Lock: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.WriteString("recorded data\n"); err != nil {
		t.Fatal(err)
	}
	second, err := Create(p, Options{Lock: true})
	if !errors.Is(err, ErrLocked) {
		if second != nil {
			second.Close()
		}
		t.Fatalf("second writer: err %v, want ErrLocked", err)
	}
	// The holder is named: this very process, through another open file.
	if want := fmt.Sprintf("(pid %d, ", os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name the holder %q", err, want)
	}
	unchanged(t, p)
	first.Close()
	second, err = Create(p, Options{Lock: true})
	if err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
	second.Close()
}
