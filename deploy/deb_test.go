// SPDX-License-Identifier: Apache-2.0

package deploy_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// `make deb` builds a package holding the static binary, a man page per
// command, the completions, the units (naming /usr/bin/magnet) and the two
// configuration files as conffiles, with the maintainer scripts.
func TestDeb(t *testing.T) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb not installed (package dpkg): the .deb cannot be read back")
	}
	runMake(t, "deb")
	debs, _ := filepath.Glob(filepath.Join(buildDir, "*.deb"))
	want := filepath.Join(buildDir, "magnet_"+version+"_"+runtime.GOARCH+".deb")
	if len(debs) != 1 || debs[0] != want {
		t.Fatalf("make deb made %v, want %s", debs, want)
	}

	info := dpkgDeb(t, "-f", want)
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok && !strings.HasPrefix(line, " ") {
			fields[k] = v
		}
	}
	for k, v := range map[string]string{"Package": "magnet", "Version": version, "Architecture": runtime.GOARCH, "Section": "net"} {
		if fields[k] != v {
			t.Errorf("control field %s: %q, want %q", k, fields[k], v)
		}
	}
	if _, ok := fields["Depends"]; ok {
		t.Errorf("Depends: %s; a static binary needs none", fields["Depends"])
	}
	// bash reads the packaged completion only through bash-completion;
	// only the ssh client is used of what a site may lack.
	if fields["Recommends"] != "bash-completion" || fields["Suggests"] != "openssh-client" {
		t.Errorf("Recommends: %q, Suggests: %q; want bash-completion and openssh-client", fields["Recommends"], fields["Suggests"])
	}

	// -I lists the control archive: conffiles and the maintainer scripts.
	control := dpkgDeb(t, "-I", want)
	for _, s := range []string{"conffiles", "md5sums", "postinst", "prerm", "postrm"} {
		if !strings.Contains(control, " "+s) {
			t.Errorf("control archive lacks %s:\n%s", s, control)
		}
	}
	ctrlDir := t.TempDir()
	dpkgDeb(t, "-e", want, ctrlDir)
	conffiles := strings.Fields(string(read(t, filepath.Join(ctrlDir, "conffiles"))))
	slices.Sort(conffiles)
	if !slices.Equal(conffiles, []string{"/etc/magnet/collect.yaml", "/etc/magnet/magnetd.yaml"}) {
		t.Errorf("conffiles %v, want the two configuration files", conffiles)
	}

	// -c lists the data archive: every file, its mode, nothing else.
	got := map[string]fs.FileMode{}
	for _, line := range strings.Split(strings.TrimSpace(dpkgDeb(t, "-c", want)), "\n") {
		f := strings.Fields(line) // -rwxr-xr-x root/root 16646306 2026-11-22 16:02 ./usr/bin/magnet
		if len(f) < 6 || f[0][0] != '-' {
			continue // directories
		}
		if f[1] != "root/root" {
			t.Errorf("%s owned by %s", f[5], f[1])
		}
		got[strings.TrimPrefix(f[5], ".")] = parseMode(t, f[0])
	}
	sameFiles(t, "the .deb", got, layout("/usr", "/usr/lib/systemd/system", "/usr/share/zsh/vendor-completions"))

	root := t.TempDir()
	dpkgDeb(t, "-x", want, root)
	checkStatic(t, filepath.Join(root, "usr/bin/magnet"))
	checkUnits(t, filepath.Join(root, "usr/lib/systemd/system"), "/usr/bin")
	for _, c := range []string{"collect.yaml", "magnetd.yaml"} {
		if !bytes.Equal(read(t, filepath.Join(root, "etc/magnet", c)), read(t, filepath.Join(repo, "deploy/config", c))) {
			t.Errorf("packaged %s differs from deploy/config/%s", c, c)
		}
	}
}

func dpkgDeb(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("dpkg-deb", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg-deb %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// parseMode reads ls's -rwxr-xr-x as a permission mode.
func parseMode(t *testing.T, s string) fs.FileMode {
	t.Helper()
	var bits strings.Builder
	for i := 1; i < 10; i++ {
		if s[i] == "rwxrwxrwx"[i-1] {
			bits.WriteByte('1')
		} else {
			bits.WriteByte('0')
		}
	}
	m, err := strconv.ParseUint(bits.String(), 2, 32)
	if err != nil {
		t.Fatalf("mode %q: %v", s, err)
	}
	return fs.FileMode(m)
}

// The maintainer scripts are valid sh, executable, and never fail the
// package operation (each ends in exit 0).
func TestMaintainerScripts(t *testing.T) {
	for _, name := range []string{"postinst", "prerm", "postrm"} {
		path := filepath.Join(repo, "deploy/deb", name)
		info, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode()&0o111 == 0 {
			t.Errorf("%s is not executable", name)
		}
		if out, err := exec.Command("sh", "-n", path).CombinedOutput(); err != nil {
			t.Errorf("sh -n %s: %v\n%s", name, err, out)
		}
		s := strings.TrimSpace(string(read(t, path)))
		if !strings.HasPrefix(s, "#!/bin/sh") || !strings.HasSuffix(s, "exit 0") {
			t.Errorf("%s: want #!/bin/sh ... exit 0", name)
		}
	}
}
