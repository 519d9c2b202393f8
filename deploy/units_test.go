// SPDX-License-Identifier: Apache-2.0

package deploy_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// unit is a systemd unit file: section → key → values in order.
type unit map[string]map[string][]string

func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && line[len(line)-1] == ']':
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not a key=value in a section: %q", path, n, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

// get returns the values of key in section.
func (u unit) get(section, key string) []string { return u[section][key] }

// one returns the single value of key, failing if it is set not exactly once.
func (u unit) one(t *testing.T, section, key string) string {
	t.Helper()
	v := u.get(section, key)
	if len(v) != 1 {
		t.Fatalf("[%s] %s set %d times, want once: %q", section, key, len(v), v)
	}
	return v[0]
}

// renderUnits fills the units' placeholders as `make install` does.
func renderUnits(t *testing.T, binDir string) (dir string) {
	t.Helper()
	dir = t.TempDir()
	ins, err := filepath.Glob(filepath.Join(repo, "deploy/systemd/*.service.in"))
	if err != nil || len(ins) != 2 {
		t.Fatalf("units: %v %v, want magnet-collect and magnetd", ins, err)
	}
	for _, in := range ins {
		s := strings.NewReplacer("@BINDIR@", binDir, "@SYSCONFDIR@", "/etc").Replace(string(read(t, in)))
		if err := os.WriteFile(filepath.Join(dir, strings.TrimSuffix(filepath.Base(in), ".in")), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// The capabilities the services keep, and the ones the DaemonSet adds: the
// same set, measured to be enough on Linux 6.18 (see the unit files).
var wantCaps = []string{"CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON", "CAP_SYS_RESOURCE"}

// Both services run as root bounded to wantCaps, in a sandbox that keeps
// what BPF needs (the bpf and perf_event_open system calls, the host
// network) and closes the rest.
func TestUnitsHardened(t *testing.T) {
	dir := renderUnits(t, "/usr/bin")
	for _, name := range []string{"magnet-collect.service", "magnetd.service"} {
		t.Run(name, func(t *testing.T) {
			u := parseUnit(t, filepath.Join(dir, name))
			caps := strings.Fields(u.one(t, "Service", "CapabilityBoundingSet"))
			slices.Sort(caps)
			if !slices.Equal(caps, wantCaps) {
				t.Errorf("CapabilityBoundingSet %v, want %v", caps, wantCaps)
			}
			for key, want := range map[string]string{
				"NoNewPrivileges":          "yes",
				"ProtectSystem":            "strict",
				"ProtectKernelTunables":    "yes",
				"ProtectKernelModules":     "yes",
				"ProtectControlGroups":     "yes",
				"PrivateDevices":           "yes",
				"PrivateTmp":               "yes",
				"MemoryDenyWriteExecute":   "yes",
				"RestrictNamespaces":       "yes",
				"SystemCallArchitectures":  "native",
				"LimitMEMLOCK":             "infinity",
				"RuntimeDirectory":         "magnet",
				"RuntimeDirectoryPreserve": "yes",
				"Restart":                  "on-failure",
				"KillSignal":               "SIGTERM",
			} {
				if got := u.one(t, "Service", key); got != want {
					t.Errorf("%s=%s, want %s", key, got, want)
				}
			}
			filter := strings.Fields(u.one(t, "Service", "SystemCallFilter"))
			for _, sc := range []string{"@system-service", "bpf", "perf_event_open"} {
				if !slices.Contains(filter, sc) {
					t.Errorf("SystemCallFilter %v lacks %s", filter, sc)
				}
			}
			for _, key := range []string{"User", "DynamicUser", "PrivateNetwork", "PrivateUsers", "AmbientCapabilities"} {
				if v := u.get("Service", key); len(v) > 0 && v[0] != "" {
					t.Errorf("%s=%s: BPF needs root's capabilities in the host network namespace", key, v[0])
				}
			}
			if got := u.one(t, "Install", "WantedBy"); got != "multi-user.target" {
				t.Errorf("WantedBy=%s", got)
			}
		})
	}
	collect := parseUnit(t, filepath.Join(dir, "magnet-collect.service"))
	if got := collect.one(t, "Service", "StateDirectory"); got != "magnet" {
		t.Errorf("collector's StateDirectory=%s, want magnet (/var/lib/magnet)", got)
	}
	daemon := parseUnit(t, filepath.Join(dir, "magnetd.service"))
	if got := daemon.one(t, "Service", "ExecReload"); !strings.Contains(got, "-HUP $MAINPID") {
		t.Errorf("magnetd ExecReload=%s, want SIGHUP (reload configuration)", got)
	}
}

// systemd itself accepts both units without a single warning (an unknown
// or misspelt key is only a warning to systemd, so any output fails).
func TestUnitsVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze not installed (package systemd): units not verified by systemd")
	}
	// verify insists that ExecStart's program exists and is executable.
	binDir := t.TempDir()
	if err := os.Symlink("/bin/true", filepath.Join(binDir, "magnet")); err != nil {
		t.Fatal(err)
	}
	dir := renderUnits(t, binDir)
	for _, name := range []string{"magnet-collect.service", "magnetd.service"} {
		out, err := exec.Command("systemd-analyze", "verify", "--man=no", filepath.Join(dir, name)).CombinedOutput()
		if err != nil || len(out) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", name, err, out)
		}
	}
}
