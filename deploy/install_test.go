// SPDX-License-Identifier: Apache-2.0

// Tests of magnet's packaging, run from the repository as a user would:
// `make install` into a staging directory, `make uninstall`, `make deb`
// read back with dpkg-deb, and the Kubernetes manifest, systemd units and
// default configuration parsed and checked field by field.
package deploy_test

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/cli"
	"github.com/magnet-tracer/magnet/internal/clidocs"
)

// version is what the tests stamp into the build (a valid Debian version).
const version = "0.0.0~test1"

var (
	repo     string // the repository root
	buildDir string // shared by every make run, so the binary is linked once
)

func TestMain(m *testing.M) {
	code := func() int {
		var err error
		if repo, err = filepath.Abs(".."); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if buildDir, err = os.MkdirTemp("", "magnet-pkg-"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(buildDir)
		return m.Run()
	}()
	os.Exit(code)
}

// runMake runs make in the repository with the given variables, ignoring
// any the environment sets (so defaults are the Makefile's own).
func runMake(t *testing.T, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed (scripts/deps.sh installs it)")
	}
	cmd := exec.Command("make", append([]string{"-C", repo, "BUILDDIR=" + buildDir, "VERSION=" + version, "SOURCE_DATE_EPOCH=1795363200"}, args...)...)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "PREFIX", "DESTDIR", "BINDIR", "DATADIR", "MANDIR", "SYSCONFDIR", "UNITDIR", "BASHCOMPDIR", "ZSHCOMPDIR", "FISHCOMPDIR", "MAKEFLAGS", "MFLAGS":
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// manPages lists the man pages this build must have: one per visible
// command, whatever commands exist when the test runs.
func manPages(dir string) []string {
	var out []string
	for _, c := range clidocs.Documented(cli.NewRoot()) {
		out = append(out, filepath.Join(dir, clidocs.ManPageName(c)+".gz"))
	}
	return out
}

// layout is every file an installation holds, with its mode.
func layout(prefix, unitDir, zshDir string) map[string]fs.FileMode {
	files := map[string]fs.FileMode{
		prefix + "/bin/magnet":                                  0o755,
		prefix + "/share/bash-completion/completions/magnet":    0o644,
		zshDir + "/_magnet":                                     0o644,
		prefix + "/share/fish/vendor_completions.d/magnet.fish": 0o644,
		unitDir + "/magnet-collect.service":                     0o644,
		unitDir + "/magnetd.service":                            0o644,
		"/etc/magnet/collect.yaml":                              0o644,
		"/etc/magnet/magnetd.yaml":                              0o644,
	}
	for _, p := range manPages(prefix + "/share/man/man1") {
		files[p] = 0o644
	}
	return files
}

// filesUnder lists the regular files under root, as absolute paths inside it.
func filesUnder(t *testing.T, root string) map[string]fs.FileMode {
	t.Helper()
	got := map[string]fs.FileMode{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		got["/"+strings.TrimPrefix(path, root+"/")] = info.Mode()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func sameFiles(t *testing.T, what string, got, want map[string]fs.FileMode) {
	t.Helper()
	for p, mode := range want {
		g, ok := got[p]
		switch {
		case !ok:
			t.Errorf("%s: %s missing", what, p)
		case g != mode:
			t.Errorf("%s: %s has mode %v, want %v", what, p, g, mode)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: unexpected %s", what, p)
		}
	}
}

// `make install DESTDIR=…` lays out the binary, a man page per command,
// three completions, two units naming the installed binary and the
// configuration; a second install builds nothing and keeps an edited
// configuration; uninstall removes everything but that edited file.
func TestMakeInstall(t *testing.T) {
	dest := t.TempDir()
	runMake(t, "install", "DESTDIR="+dest)

	sameFiles(t, "make install", filesUnder(t, dest),
		layout("/usr/local", "/usr/local/lib/systemd/system", "/usr/local/share/zsh/site-functions"))
	bin := filepath.Join(dest, "usr/local/bin/magnet")
	checkStatic(t, bin)
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "magnet version "+version {
		t.Errorf("magnet --version: %q, %v; want %q", out, err, "magnet version "+version)
	}
	checkUnits(t, filepath.Join(dest, "usr/local/lib/systemd/system"), "/usr/local/bin")
	for _, c := range []string{"collect.yaml", "magnetd.yaml"} {
		if !bytes.Equal(read(t, filepath.Join(dest, "etc/magnet", c)), read(t, filepath.Join(repo, "deploy/config", c))) {
			t.Errorf("installed %s differs from deploy/config/%s", c, c)
		}
	}

	edited := filepath.Join(dest, "etc/magnet/collect.yaml")
	mine := append(read(t, edited), "keep: 12\n"...)
	if err := os.WriteFile(edited, mine, 0o644); err != nil {
		t.Fatal(err)
	}
	// `make && sudo make install`: root often has no Go; after a build,
	// install must only copy (GO=false fails any attempt to build).
	if out := runMake(t, "install", "DESTDIR="+dest, "GO=false"); !strings.Contains(out, "kept "+edited) {
		t.Errorf("second install does not say it kept %s:\n%s", edited, out)
	}
	if !bytes.Equal(read(t, edited), mine) {
		t.Error("a second install overwrote the edited configuration")
	}

	runMake(t, "uninstall", "DESTDIR="+dest)
	sameFiles(t, "after make uninstall", filesUnder(t, dest), map[string]fs.FileMode{"/etc/magnet/collect.yaml": 0o644})
}

// checkStatic fails unless path is an ELF executable with no interpreter and
// no shared libraries: it runs on any Linux of its architecture.
func checkStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("binary: %v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s is dynamically linked (has %v)", path, p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s needs shared libraries %v", path, libs)
	}
}

// checkUnits checks the installed units start the binary in binDir with the
// configuration in /etc/magnet.
func checkUnits(t *testing.T, unitDir, binDir string) {
	t.Helper()
	want := map[string]string{
		"magnet-collect.service": binDir + "/magnet collect --config /etc/magnet/collect.yaml",
		"magnetd.service":        binDir + "/magnet daemon --config /etc/magnet/magnetd.yaml",
	}
	for name, start := range want {
		u := parseUnit(t, filepath.Join(unitDir, name))
		if got := u.get("Service", "ExecStart"); len(got) != 1 || got[0] != start {
			t.Errorf("%s: ExecStart %q, want %q", name, got, start)
		}
		if s := string(read(t, filepath.Join(unitDir, name))); strings.Contains(s, "@BINDIR@") || strings.Contains(s, "@SYSCONFDIR@") {
			t.Errorf("%s: placeholders left unfilled", name)
		}
	}
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
