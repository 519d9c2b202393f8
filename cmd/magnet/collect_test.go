// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/archive"
	"github.com/magnet-tracer/magnet/internal/archivetest"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// TestCollectService runs `magnet collect` against a real sshd on loopback,
// recording only the traffic of the sshd's port: the shipper's own ssh
// sessions to that port must not be in the traces, the test's own must.
// The service is SIGKILLed while it rotates every two seconds and ships, then
// restarted and stopped with SIGTERM: nothing in the archive is half a file,
// nothing is shipped twice, the spool ends empty, and report/export/archive
// ls read the archive by host.
func TestCollectService(t *testing.T) {
	needRoot(t)
	srv := archivetest.StartSSHD(t)
	dir := t.TempDir()
	spool, root := filepath.Join(dir, "spool"), filepath.Join(dir, "archive")
	cfgPath := filepath.Join(dir, "collect.yaml")
	cfg := fmt.Sprintf(`host: e2ehost
spool: %s
pattern: "%%h-%%Y%%m%%dT%%H%%M%%S.mgt"
rotate: {interval: 2s}
filters: {port: %d}
ship: {interval: 200ms, retry_initial: 100ms, retry_max: 1s}
`, spool, srv.Port) + srv.TargetYAML(root)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	start := func() *exec.Cmd {
		ready := filepath.Join(dir, "ready")
		os.Remove(ready)
		cmd := runCollect(t, &logs, cfgPath, ready)
		waitFor(t, func() bool { _, err := os.Stat(ready); return err == nil })
		return cmd
	}
	control := func() {
		if out, err := srv.SSH("true").CombinedOutput(); err != nil {
			t.Fatalf("ssh to the test server: %v %s", err, out)
		}
	}
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

	t0 := time.Now()
	svc := start()
	t.Logf("%s: ready", time.Since(t0))
	control()
	control()
	waitFor(t, func() bool { return manifests() >= 3 })
	t.Logf("%s: 3 shipped", time.Since(t0))
	svc.Process.Signal(syscall.SIGKILL)
	svc.Wait()
	checkArchiveWhole(t, root)

	svc = start()
	t.Logf("%s: ready again", time.Since(t0))
	control()
	n := manifests()
	waitFor(t, func() bool { return manifests() >= n+2 })
	t.Logf("%s: 2 more shipped", time.Since(t0))
	svc.Process.Signal(syscall.SIGTERM)
	if err := svc.Wait(); err != nil {
		t.Fatalf("collect after SIGTERM: %v\n%s", err, logs.String())
	}
	t.Logf("%s: stopped", time.Since(t0))
	checkArchiveWhole(t, root)

	// Everything shipped, once.
	left, _ := filepath.Glob(filepath.Join(spool, "e2ehost-*.mgt"))
	if len(left) != 0 {
		t.Fatalf("files left in the spool after SIGTERM: %v\n%s", left, logs.String())
	}
	// A file uploaded just before the SIGKILL is found already archived
	// after the restart (and not sent again): it counts once too.
	shipped := map[string]int{}
	for _, m := range regexp.MustCompile(`shipped (\S+) to |(\S+) already in `).FindAllStringSubmatch(logs.String(), -1) {
		shipped[m[1]+m[2]]++
	}
	for name, c := range shipped {
		if c != 1 {
			t.Errorf("%s shipped %d times", name, c)
		}
	}
	es, err := archive.Scan(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != len(shipped) {
		t.Errorf("%d files in the archive, %d shipped", len(es), len(shipped))
	}

	// The archive by host: two recordings (one per run).
	r := magnet(t, "archive", "ls", root, "--host", "e2ehost", "--json")
	var chains []struct {
		Recording string          `json:"recording"`
		Files     []archive.Entry `json:"files"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &chains) != nil || len(chains) != 2 {
		t.Fatalf("archive ls: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := magnet(t, "report", root, "--host", "e2ehost"); r.code != 0 {
		t.Fatalf("report from the archive: %s", r.stderr)
	}

	// The same archive read over ssh: the same listing, the same report.
	sshURL := fmt.Sprintf("ssh://%s@127.0.0.1:%d%s", srv.User, srv.Port, root)
	sshOpts := []string{"--ssh-option", "IdentityFile=" + srv.Identity, "--ssh-option", "UserKnownHostsFile=" + srv.KnownHosts,
		"--ssh-option", "StrictHostKeyChecking=yes"}
	overSSH := magnet(t, append([]string{"archive", "ls", sshURL, "--host", "e2ehost", "--json"}, sshOpts...)...)
	var sshChains []struct {
		Recording string          `json:"recording"`
		Files     []archive.Entry `json:"files"`
	}
	if overSSH.code != 0 || json.Unmarshal([]byte(overSSH.stdout), &sshChains) != nil || len(sshChains) != len(chains) {
		t.Fatalf("archive ls over ssh: %d %s %s", overSSH.code, overSSH.stdout, overSSH.stderr)
	}
	files := map[string]int{}
	for _, c := range chains {
		files[c.Recording] = len(c.Files)
	}
	for _, c := range sshChains {
		if n, ok := files[c.Recording]; !ok || n != len(c.Files) {
			t.Fatalf("archive ls over ssh: recording %s has %d files, %d in the directory's listing", c.Recording, len(c.Files), n)
		}
	}
	repDir := magnet(t, "report", "--json", root, "--host", "e2ehost")
	repSSH := magnet(t, append([]string{"report", "--json", sshURL, "--host", "e2ehost"}, sshOpts...)...)
	if repSSH.code != 0 || repDir.code != 0 {
		t.Fatalf("report over ssh: %s", repSSH.stderr)
	}
	// The same report but for the trace names (a temporary directory).
	tempName := regexp.MustCompile(`"[^"]*magnet-ssh-archive-[^"]*"|"` + regexp.QuoteMeta(root) + `[^"]*"`)
	if a, b := tempName.ReplaceAllString(repDir.stdout, `""`), tempName.ReplaceAllString(repSSH.stdout, `""`); a != b {
		t.Fatalf("report over ssh differs from the report of the directory:\n%.2000s\n---\n%.2000s", a, b)
	}
	oneLineError(t, magnet(t, append([]string{"report", fmt.Sprintf("ssh://%s@127.0.0.1:%d/nonexistent", srv.User, srv.Port)}, sshOpts...)...), "list ssh://")
	oneLineError(t, magnet(t, "archive", "ls", "ssh://127.0.0.1"), "no path")

	// The shipper's ssh sessions are not in the traces; the test's three are.
	conns := filepath.Join(dir, "conns.jsonl")
	if r := magnet(t, "export", root, "--host", "e2ehost", "-f", "jsonl", "-o", filepath.Join(dir, "ev.jsonl"), "--conns-output", conns); r.code != 0 {
		t.Fatalf("export from the archive: %s", r.stderr)
	}
	data, err := os.ReadFile(conns)
	if err != nil {
		t.Fatal(err)
	}
	clients := strings.Count(string(data), fmt.Sprintf(`"remote":"127.0.0.1:%d"`, srv.Port))
	if clients != 3 {
		t.Fatalf("%d client connections to the archive's port in the traces, want the test's 3 (the shipper's excluded); %d files shipped\n%s", clients, len(shipped), data)
	}
	t.Logf("%d files shipped over ssh in two runs; the traces hold the test's 3 ssh connections and none of the shipper's", len(shipped))
}

// checkArchiveWhole: no half file under a final name: every archived trace
// decompresses and reads to its end, and matches its manifest when it has
// one (a trace renamed into place just before a SIGKILL gets its manifest
// on the next run).
func checkArchiveWhole(t *testing.T, root string) {
	t.Helper()
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), ".") || !strings.HasSuffix(p, ".mgt.zst") {
			return nil
		}
		r, err := trace.Open(p)
		if err != nil {
			t.Fatalf("archived %s: %v", p, err)
		}
		for {
			if _, err := r.Next(); err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatalf("archived %s: %v", p, err)
				}
				break
			}
		}
		r.Close()
		return nil
	})
}

// TestRotateCollectBadInput: the new flags and commands fail with one line.
func TestRotateCollectBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("spool: /tmp/x\ntargets: [{type: ftp}]\n"), 0o644)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--keep", "3"}, "--keep needs --rotate"},
		{[]string{"record", "-o", filepath.Join(dir, "%q.mgt"), "--rotate", "1h"}, "unknown verb %q"},
		{[]string{"record", "-o", filepath.Join(dir, "%Y", "x.mgt"), "--rotate", "1h"}, "file name only"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--rotate", "10ms"}, "at least 1s"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--rotate-size", "1K"}, "at least 1MiB"},
		{[]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--rotate", "1h", "--on-disk-full", "explode"}, "want stop or drop"},
		{[]string{"collect"}, "--config FILE"},
		{[]string{"collect", "--config", filepath.Join(dir, "none.yaml")}, "no such file"},
		{[]string{"collect", "--config", bad}, `unknown type "ftp"`},
		{[]string{"archive", "ls", filepath.Join(dir, "none")}, "no such file"},
		{[]string{"archive", "ls", bad}, "not a directory"},
		{[]string{"report", dir}, "holds no traces"},
		{[]string{"parse", "../../testdata/bigendian.mgt", "--since", "noon"}, "bad time"},
		{[]string{"report", "../../testdata/bigendian.mgt", "--host", "nohost"}, "no trace matches"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, "_"), func(t *testing.T) {
			oneLineError(t, magnet(t, c.args...), c.want)
		})
	}
}

// TestRecordRotate: magnet record --rotate writes a chain; parse reads the
// directory as one timeline, and report takes the files in any order.
func TestRecordRotate(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	r := magnet(t, "record", "-q", "--rotate", "1s", "--duration", "3500ms", "-o", filepath.Join(dir, "%h-%n.mgt"))
	if r.code != 0 {
		t.Fatalf("record --rotate: %s", r.stderr)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.mgt"))
	if len(files) < 3 {
		t.Fatalf("%d files after 3.5 s with --rotate 1s", len(files))
	}
	p := magnet(t, "parse", "--meta", dir)
	if p.code != 0 || strings.Contains(p.stderr, "warning") {
		t.Fatalf("parse of the chain: %d %s", p.code, p.stderr)
	}
	reversed := append([]string(nil), files...)
	for i, j := 0, len(reversed)-1; i < j; i, j = i+1, j-1 {
		reversed[i], reversed[j] = reversed[j], reversed[i]
	}
	if rep := magnet(t, append([]string{"report", "--json"}, reversed...)...); rep.code != 0 || strings.Count(rep.stdout, `"traces"`) != 1 {
		t.Fatalf("report of the files: %d %s", rep.code, rep.stderr)
	}
}
