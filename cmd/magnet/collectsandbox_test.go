// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/archivetest"
	"github.com/magnet-tracer/magnet/internal/probe"
)

// sandboxScript reproduces, in a private mount namespace, the file system
// a deployed collector sees, then starts it with the deployment's
// capabilities:
//
//	unit: magnet-collect.service: ProtectSystem=strict (every mount
//	      read-only but the StateDirectory and RuntimeDirectory),
//	      ProtectKernelTunables= (/sys read-only), ProtectControlGroups=
//	      (the cgroup2 mount read-only), CapabilityBoundingSet= and
//	      NoNewPrivileges=; the test starts it in a cgroup of its own, as
//	      systemd starts a service;
//	pod:  the DaemonSet's container: in a cgroup namespace rooted at the
//	      pod's cgroup, the runtime's cgroup2 mount with the node's
//	      hierarchy mounted over it read-only (the hostPath volume),
//	      readOnlyRootFilesystem, /sys read-only, the traces and /run/magnet
//	      volumes writable, capabilities dropped to the four added, and
//	      allowPrivilegeEscalation: false (no_new_privs). hostPID and
//	      hostNetwork: no other namespace.
//
// Not reproduced: the unit's seccomp and address-family filters and the
// runtime's seccomp profile (they decide bpf(2) and perf_event_open(2),
// which recording already needs, not the cgroup).
const sandboxScript = `set -e
mount --make-rprivate /
mkdir -p /run/magnet
if [ "$MODE" = pod ]; then
	mkdir -p "$WORK/hostcg"
	mount --bind "$CGMP" "$WORK/hostcg"
	# The runtime's cgroup2 mount, on the container's own /sys (the kernel
	# refuses a file system mounted straight over itself).
	mount -t tmpfs container-sys "$CGMP"
	mount -t cgroup2 cgroup2 "$CGMP"
	mount --bind "$WORK/hostcg" "$CGMP"
	umount "$WORK/hostcg"
fi
mount --bind "$STATE" "$STATE"
mount --bind "$RUNDIR" /run/magnet
awk '{print $5}' /proc/self/mountinfo | sort -u | while read -r mp; do
	case "$mp" in
	"$STATE"|/run/magnet|/proc|/proc/*|/dev|/dev/*|/sys/fs/bpf) continue ;;
	esac
	mount -o remount,bind,ro "$mp" 2>/dev/null || true
done
if mkdir "$CGMP/magnet-sandbox-probe" 2>/dev/null; then
	rmdir "$CGMP/magnet-sandbox-probe"
	echo "sandbox: the cgroup2 mount is writable" >&2
	exit 97
fi
if touch /etc/magnet-sandbox-probe 2>/dev/null; then
	echo "sandbox: / is writable" >&2
	exit 97
fi
exec setpriv --bounding-set -all,+bpf,+perfmon,+net_admin,+sys_resource --inh-caps -all --no-new-privs -- \
	"$BIN" collect --config "$CFG" --ready-file "$STATE/ready"
`

// TestCollectAsDeployed runs `magnet collect` as the systemd unit and as
// the DaemonSet run it, with their sandboxes reproduced, recording the port
// of an S3 store it ships to: it starts (the read-only cgroup2 mount once
// stopped it: "create shipper cgroup: read-only file system"), ships, and
// no event of its shipping reaches the traces, while a connection the
// test makes to the same store is there.
func TestCollectAsDeployed(t *testing.T) {
	needRoot(t)
	for _, tool := range []string{"unshare", "setpriv", "awk"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	cgRoot, err := probe.Cgroup2Root()
	if err != nil {
		t.Skipf("no cgroup2: %v", err)
	}
	for _, mode := range []string{"unit", "pod"} {
		t.Run(mode, func(t *testing.T) { deployedCase(t, cgRoot, mode) })
	}
}

// sandboxCgroup makes a cgroup of this test process under root, named for
// what, the cgroup systemd or a pod runtime makes for the service, and
// opens it for UseCgroupFD. Both go at the end of the test, after the
// test's own deferred kills have emptied the cgroup.
func sandboxCgroup(t *testing.T, root, what string) (string, *os.File) {
	t.Helper()
	cg := filepath.Join(root, fmt.Sprintf("magnet-%s-test-%d", what, os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(cg) })
	cgfd, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cgfd.Close() })
	return cg, cgfd
}

func deployedCase(t *testing.T, cgRoot, mode string) {
	m := archivetest.StartMoto(t)
	work := t.TempDir()
	state, rundir := filepath.Join(work, "state"), filepath.Join(work, "run")
	root := filepath.Join(state, "archive") // a dir target beside the store, read back below
	for _, d := range []string{state, rundir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	host := "sandbox-" + mode
	cfg := fmt.Sprintf(`host: %s
spool: %s
pattern: "%%h-%%n.mgt"
rotate: {interval: 1s}
filters: {port: %d}
ship: {interval: 200ms, retry_initial: 100ms, retry_max: 1s}
targets:
  - {type: s3, name: store, endpoint: %s, bucket: traces, region: us-east-1, access_key: %s, secret_key: %s}
  - {type: dir, name: local, path: %s}
`, host, filepath.Join(state, "spool"), m.Port, m.Endpoint, archivetest.AccessKey, archivetest.SecretKey, root)
	cfgPath := filepath.Join(work, "collect.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}

	// The cgroup systemd makes for the service, or the pod's.
	cg, cgfd := sandboxCgroup(t, cgRoot, mode)
	args := []string{"--mount"}
	if mode == "pod" {
		args = append(args, "--cgroup")
	}
	svc := exec.Command("unshare", append(args, "--", "sh", "-c", sandboxScript)...)
	svc.Env = append(os.Environ(), "MODE="+mode, "WORK="+work, "CGMP="+cgRoot, "STATE="+state, "RUNDIR="+rundir, "BIN="+bin, "CFG="+cfgPath)
	var logs bytes.Buffer
	svc.Stderr = &logs
	svc.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cgfd.Fd())}
	if err := svc.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- svc.Wait() }()
	defer func() {
		if svc.ProcessState == nil {
			syscall.Kill(svc.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	}()

	// Every thread seen in the service's cgroup (and below) while it runs.
	inService := map[uint64]bool{}
	var mu sync.Mutex
	stop, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		for {
			filepath.WalkDir(cg, func(p string, d os.DirEntry, err error) error {
				if err != nil || !d.IsDir() {
					return nil
				}
				data, _ := os.ReadFile(filepath.Join(p, "cgroup.threads"))
				mu.Lock()
				for _, f := range strings.Fields(string(data)) {
					if n, err := strconv.ParseUint(f, 10, 32); err == nil {
						inService[n] = true
					}
				}
				mu.Unlock()
				return nil
			})
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	ready := filepath.Join(state, "ready")
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		select {
		case err := <-exited:
			svc.ProcessState = &os.ProcessState{}
			t.Fatalf("collect in the %s sandbox exited before it was ready: %v\n%s", mode, err, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("collect in the %s sandbox not ready after 60 s\n%s", mode, logs.String())
		}
	}

	// The test's own requests to the store (outside the service): traced.
	manifests := func() int {
		n := 0
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && strings.HasSuffix(p, ".mgt.zst.json") && !strings.HasPrefix(d.Name(), ".") {
				n++
			}
			return nil
		})
		return n
	}
	requests := 0
	for manifests() < 3 {
		resp, err := http.Get(m.Endpoint + "/traces")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		http.DefaultClient.CloseIdleConnections()
		if requests++; requests > 400 {
			t.Fatalf("no 3 files shipped after %d requests\n%s", requests, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	syscall.Kill(svc.Process.Pid, syscall.SIGTERM)
	if err := <-exited; err != nil {
		t.Fatalf("collect after SIGTERM: %v\n%s", err, logs.String())
	}
	close(stop)
	<-watched
	if !strings.Contains(logs.String(), "the service's own cgroup") {
		t.Fatalf("the shipper did not run in the service's own cgroup:\n%s", logs.String())
	}
	if len(inService) < 2 {
		t.Fatalf("%d threads seen in the service's cgroup", len(inService))
	}

	evPath := filepath.Join(work, "ev.jsonl")
	if r := magnet(t, "export", root, "--host", host, "-f", "jsonl", "-o", evPath); r.code != 0 {
		t.Fatalf("export from the archive: %s", r.stderr)
	}
	f, err := os.Open(evPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ours, service, total := 0, 0, 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("export line %q: %v", sc.Text(), err)
		}
		total++
		for _, k := range []string{"pid", "tid"} {
			if v, ok := ev[k].(float64); ok {
				if inService[uint64(v)] {
					service++
				}
				if int(v) == os.Getpid() && k == "pid" {
					ours++
				}
			}
		}
	}
	if service != 0 || ours == 0 {
		t.Fatalf("%d events of %d name a thread of the service (shipping to the recorded port), %d the test's own requests (%d made); want 0 and some\n%s",
			service, total, ours, requests, logs.String())
	}
	t.Logf("%s: %d requests of the test, %d events of them; %d service threads watched, none in %d events; %d files shipped", mode, requests, ours, len(inService), total, manifests())
}

// TestCollectSharedCgroupReadOnly: in the unit's sandbox, but in a cgroup
// that also holds another process (a service started by hand from a shell
// whose cgroup2 mount is read-only), no cgroup can be made for the
// shipper and the service's own would hide the other process: with
// targets, collect refuses to start in one line that says why and what to
// do, before it records anything; without targets there is no shipper to
// leave out, and it records.
func TestCollectSharedCgroupReadOnly(t *testing.T) {
	needRoot(t)
	for _, tool := range []string{"unshare", "setpriv", "awk", "sleep"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	cgRoot, err := probe.Cgroup2Root()
	if err != nil {
		t.Skipf("no cgroup2: %v", err)
	}
	work := t.TempDir()
	state, rundir := filepath.Join(work, "state"), filepath.Join(work, "run")
	for _, d := range []string{state, rundir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_, cgfd := sandboxCgroup(t, cgRoot, "shared")
	// The other process of the cgroup: the shell's.
	other := exec.Command("sleep", "600")
	other.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cgfd.Fd())}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()

	run := func(cfg string) (string, error) {
		cfgPath := filepath.Join(work, "collect.yaml")
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(state, "ready"))
		svc := exec.Command("unshare", "--mount", "--", "sh", "-c", sandboxScript)
		svc.Env = append(os.Environ(), "MODE=unit", "WORK="+work, "CGMP="+cgRoot, "STATE="+state, "RUNDIR="+rundir, "BIN="+bin, "CFG="+cfgPath)
		var logs lockedBuffer
		svc.Stderr = &logs
		svc.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cgfd.Fd())}
		if err := svc.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- svc.Wait() }()
		// Ready, or exited: whichever comes first.
		deadline := time.After(60 * time.Second)
		for {
			select {
			case err := <-exited:
				return logs.String(), err
			case <-deadline:
				syscall.Kill(svc.Process.Pid, syscall.SIGKILL)
				<-exited
				t.Fatalf("collect neither ready nor ended after 60 s\n%s", logs.String())
			case <-time.After(20 * time.Millisecond):
			}
			if _, err := os.Stat(filepath.Join(state, "ready")); err == nil {
				syscall.Kill(svc.Process.Pid, syscall.SIGTERM)
				return logs.String(), <-exited
			}
		}
	}
	base := fmt.Sprintf("host: shared\nspool: %s\npattern: \"%%h-%%n.mgt\"\nrotate: {interval: 1s}\n", filepath.Join(state, "spool"))
	logs, err := run(base + fmt.Sprintf("targets:\n  - {type: dir, path: %s}\n", filepath.Join(state, "archive")))
	msg := strings.TrimRight(logs, "\n")
	if err == nil || strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "magnet: collect: no cgroup to keep the shipper's traffic out of the trace: ") ||
		!strings.Contains(msg, "read-only file system") || !strings.Contains(msg, "run it as a systemd service") {
		t.Fatalf("with a target: exit %v, stderr %q; want one line saying no cgroup can be made, why, and what to do", err, logs)
	}
	if files, _ := filepath.Glob(filepath.Join(state, "spool", "*.mgt")); len(files) != 0 {
		t.Fatalf("a refused start left %v", files)
	}
	logs, err = run(base)
	if err != nil {
		t.Fatalf("without targets: %v\n%s", err, logs)
	}
	if files, _ := filepath.Glob(filepath.Join(state, "spool", "shared-*.mgt")); len(files) == 0 {
		t.Fatalf("without targets: no trace in the spool\n%s", logs)
	}
	t.Logf("with a target: %s", msg)
}
