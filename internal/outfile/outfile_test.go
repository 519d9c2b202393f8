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

// sharedDir makes a directory like /tmp: sticky and world-writable.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tmp")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if !Shared(dir) {
		t.Fatalf("%s is not shared after chmod 1777", dir)
	}
	return dir
}

func TestCreateSharedDir(t *testing.T) {
	dir := sharedDir(t)
	target := filepath.Join(t.TempDir(), "precious")
	writeOld(t, target)

	// A symbolic link is not followed, dangling or not.
	for _, name := range []string{"trace.mgt", "dangling.mgt"} {
		to := target
		if name == "dangling.mgt" {
			to = filepath.Join(filepath.Dir(target), "made-by-magnet")
		}
		link := filepath.Join(dir, name)
		if err := os.Symlink(to, link); err != nil {
			t.Fatal(err)
		}
		f, err := Create(link, Options{})
		if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "is a symbolic link") {
			if f != nil {
				f.Close()
			}
			t.Fatalf("Create(%s): err %v, want ErrUnsafe", link, err)
		}
		if err := WriteFile(link, []byte("ready\n")); !errors.Is(err, ErrUnsafe) {
			t.Fatalf("WriteFile(%s): err %v, want ErrUnsafe", link, err)
		}
	}
	unchanged(t, target)
	if _, err := os.Lstat(filepath.Join(filepath.Dir(target), "made-by-magnet")); err == nil {
		t.Fatalf("a dangling link's target was created")
	}

	// A hard link to another file is not replaced.
	hard := filepath.Join(dir, "hard.mgt")
	if err := os.Link(target, hard); err != nil {
		t.Fatal(err)
	}
	if f, err := Create(hard, Options{}); !errors.Is(err, ErrUnsafe) {
		if f != nil {
			f.Close()
		}
		t.Fatalf("Create(%s): err %v, want ErrUnsafe", hard, err)
	}
	unchanged(t, target)

	// The caller's own file is replaced; a new one is created.
	own := filepath.Join(dir, "own.mgt")
	writeOld(t, own)
	for _, p := range []string{own, filepath.Join(dir, "new.mgt")} {
		f, err := Create(p, Options{})
		if err != nil {
			t.Fatalf("Create(%s): %v", p, err)
		}
		f.Close()
		if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
			t.Fatalf("%s: %v, %v", p, fi, err)
		}
	}
}

// A file another user made in a shared directory is not replaced, as the
// kernel's fs.protected_regular would refuse.
func TestCreateSharedDirOthersFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a file owned by another user")
	}
	dir := sharedDir(t)
	p := filepath.Join(dir, "theirs.mgt")
	writeOld(t, p)
	if err := os.Chown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	f, err := Create(p, Options{})
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "belongs to uid 65534") {
		if f != nil {
			f.Close()
		}
		t.Fatalf("err %v, want ErrUnsafe naming uid 65534", err)
	}
	unchanged(t, p)
}

// Check refuses what Create refuses, and creates, empties and keeps
// locked nothing.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.mgt")
	writeOld(t, in)
	out := filepath.Join(dir, "out.csv")
	if err := Check(in, Options{Inputs: []string{in}}); !errors.Is(err, ErrIsInput) {
		t.Errorf("an input: %v, want ErrIsInput", err)
	}
	// A name the command is about to write, not there yet.
	if err := Check(out, Options{Inputs: []string{in, out}}); !errors.Is(err, ErrIsInput) || !strings.Contains(err.Error(), "is also the output") {
		t.Errorf("the other output: %v, want ErrIsInput", err)
	}
	if err := Check(filepath.Join(dir, "new.csv"), Options{Inputs: []string{in, out}}); err != nil {
		t.Errorf("a new name: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "new.csv")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Check created the file: %v", err)
	}
	writeOld(t, out)
	held, err := Create(in+".rec", Options{Lock: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(in+".rec", Options{}); !errors.Is(err, ErrLocked) {
		t.Errorf("a locked output: %v, want ErrLocked", err)
	}
	held.Close()
	if err := Check(out, Options{Inputs: []string{in}}); err != nil {
		t.Errorf("an existing other file: %v", err)
	}
	unchanged(t, out)
	// Check's own lock is gone: a writer may take it.
	f, err := Create(out, Options{Lock: true})
	if err != nil {
		t.Fatalf("after Check: %v", err)
	}
	f.Close()

	shared := sharedDir(t)
	target := filepath.Join(dir, "target")
	writeOld(t, target)
	link := filepath.Join(shared, "conns.csv")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := Check(link, Options{}); !errors.Is(err, ErrUnsafe) {
		t.Errorf("a link in a shared directory: %v, want ErrUnsafe", err)
	}
	unchanged(t, target)
}
