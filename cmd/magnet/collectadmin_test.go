// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/archive"
	"github.com/magnet-tracer/magnet/internal/archivetest"
)

// TestCollectFrozenArchiveAsAdmin is what an administrator of many nodes
// sees when one archive hangs: `magnet collect` ships to a frozen S3 store
// (moto_server SIGSTOPped before the service starts) and to a directory.
// The directory receives files all along, the stall is logged, and the
// store's stall and backlog show in the Prometheus metrics (served on
// metrics.listen and written to metrics.textfile) and in `magnet status
// --spool`. Thawed, the store receives every file the directory has; the
// analysis commands then read it by host from s3://, and `magnet export
// s3://... --format parquet --dataset DIR --partition host,date` writes
// each file once, a second run none.
func TestCollectFrozenArchiveAsAdmin(t *testing.T) {
	needRoot(t)
	m := archivetest.StartMoto(t)
	dir := t.TempDir()
	spool, root := filepath.Join(dir, "spool"), filepath.Join(dir, "archive")
	textfile := filepath.Join(dir, "magnet.prom")
	cfgPath := filepath.Join(dir, "collect.yaml")
	const host = "admin-host"
	cfg := fmt.Sprintf(`host: %s
spool: %s
pattern: "%%h-%%n.mgt"
rotate: {interval: 1s}
filters: {port: %d}
ship: {interval: 200ms, retry_initial: 100ms, retry_max: 1s, stall: 2s, timeout: 10m}
metrics: {listen: "127.0.0.1:0", textfile: %s}
targets:
  - {type: s3, name: store, endpoint: %s, bucket: traces, prefix: site-a, region: us-east-1, access_key: %s, secret_key: %s}
  - {type: dir, name: local, path: %s}
`, host, spool, m.Port, textfile, m.Endpoint, archivetest.AccessKey, archivetest.SecretKey, root)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}

	m.Pause()
	frozen := true
	defer func() {
		if frozen {
			m.Resume()
		}
	}()
	ready := filepath.Join(dir, "ready")
	var logs lockedBuffer
	svc := runCollect(t, &logs, cfgPath, ready)
	waitLong := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("after %s: %s\n%s", d, what, logs.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitLong("collect not ready", 60*time.Second, func() bool { _, err := os.Stat(ready); return err == nil })
	t0 := time.Now()
	inDir := func() []string {
		es, err := archive.Scan(root)
		if err != nil {
			return nil
		}
		var names []string
		for _, e := range es {
			names = append(names, filepath.Base(e.Path))
		}
		return names
	}
	waitLong("3 files in the directory target while the store is frozen", 30*time.Second, func() bool { return len(inDir()) >= 3 })
	waitLong("the stall logged", 30*time.Second, func() bool {
		return regexp.MustCompile(`to store: stalled, no answer for `).MatchString(logs.String())
	})
	t.Logf("%s after ready: %d files in the directory, the store's stall logged", time.Since(t0).Round(time.Millisecond), len(inDir()))

	// The metrics an alert reads, from the endpoint the shipper serves.
	addr := regexp.MustCompile(`metrics on (http://\S+/metrics)`).FindStringSubmatch(logs.String())
	if addr == nil {
		t.Fatalf("no metrics address logged:\n%s", logs.String())
	}
	scrape := func() string {
		resp, err := http.Get(addr[1])
		if err != nil {
			t.Fatalf("scrape %s: %v", addr[1], err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	value := func(body, metric, target string) string {
		re := regexp.MustCompile(`(?m)^` + metric + `\{host="` + host + `",target="` + target + `",type="[a-z0-9]+"\} (\S+)$`)
		if v := re.FindStringSubmatch(body); v != nil {
			return v[1]
		}
		return ""
	}
	body := scrape()
	if value(body, "magnet_collect_target_stalled", "store") != "1" || value(body, "magnet_collect_target_stalled", "local") != "0" ||
		value(body, "magnet_collect_target_shipped_files_total", "store") != "0" || value(body, "magnet_collect_target_shipped_files_total", "local") == "0" ||
		value(body, "magnet_collect_target_backlog_files", "store") == "0" || value(body, "magnet_collect_target_last_success_timestamp_seconds", "store") != "0" {
		t.Fatalf("metrics while the store is frozen:\n%s", body)
	}
	// The textfile for node_exporter, and `magnet status`, rewritten every
	// few seconds.
	waitLong("the textfile shows the stall", 20*time.Second, func() bool {
		data, _ := os.ReadFile(textfile)
		return value(string(data), "magnet_collect_target_stalled", "store") == "1"
	})
	storeRow := regexp.MustCompile(`(?m)^\s+store\s+s3\s+([0-9]+) \([0-9]+ bytes\)\s+0\s+[0-9]+\s+never\s+stalled [0-9]+s on \S+$`)
	localRow := regexp.MustCompile(`(?m)^\s+local\s+dir\s+0 \(0 bytes\)\s+[1-9][0-9]*\s+0\s+[0-9-]+ [0-9:]+\s+ok$`)
	var status result
	waitLong("magnet status shows the stall", 20*time.Second, func() bool {
		status = magnet(t, "status", "--spool", spool)
		return status.code == 0 && storeRow.MatchString(status.stdout) && localRow.MatchString(status.stdout)
	})
	t.Logf("magnet status:\n%s", regexp.MustCompile(`(?s)collect shipper.*?\n\n`).FindString(status.stdout))

	// Thawed: the store gets every file, the stall ends.
	m.Resume()
	frozen = false
	waitLong("the stall over", 60*time.Second, func() bool { return strings.Contains(logs.String(), "to store: stall over after ") })
	svc.Process.Signal(syscall.SIGTERM)
	if err := svc.Wait(); err != nil {
		t.Fatalf("collect after SIGTERM: %v\n%s", err, logs.String())
	}
	want := inDir()

	t.Setenv("AWS_ENDPOINT_URL", m.Endpoint)
	t.Setenv("AWS_ACCESS_KEY_ID", archivetest.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", archivetest.SecretKey)
	t.Setenv("AWS_REGION", "us-east-1")
	const url = "s3://traces/site-a"
	r := magnet(t, "archive", "ls", url, "--host", host, "--json")
	var chains []struct {
		Files []archive.Entry `json:"files"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &chains) != nil {
		t.Fatalf("archive ls %s: %d %s %s", url, r.code, r.stdout, r.stderr)
	}
	n := 0
	for _, c := range chains {
		n += len(c.Files)
	}
	if n != len(want) {
		t.Fatalf("archive ls %s --host %s: %d files, the directory target %d", url, host, n, len(want))
	}
	if r := magnet(t, "report", url, "--host", host); r.code != 0 {
		t.Fatalf("report %s: %s", url, r.stderr)
	}
	ds := filepath.Join(dir, "dataset")
	export := func() result {
		return magnet(t, "export", url, "--format", "parquet", "--dataset", ds, "--partition", "host,date")
	}
	if r := export(); r.code != 0 || !strings.Contains(r.stderr, fmt.Sprintf("dataset %s: %d files written", ds, len(want))) {
		t.Fatalf("first export of %s (%d files): %d %s", url, len(want), r.code, r.stderr)
	}
	if r := export(); r.code != 0 || !strings.Contains(r.stderr, fmt.Sprintf("0 files written, %d already there", len(want))) {
		t.Fatalf("second export of %s: %d %s", url, r.code, r.stderr)
	}
	// docs/DEPLOY.md's cron line: the default partitions are the same, so
	// nothing is new.
	if r := magnet(t, "export", url, "--since", "-2h", "--format", "parquet", "--dataset", ds); r.code != 0 ||
		!strings.Contains(r.stderr, fmt.Sprintf("0 files written, %d already there", len(want))) {
		t.Fatalf("export %s --since -2h: %d %s", url, r.code, r.stderr)
	}
	parts, _ := filepath.Glob(filepath.Join(ds, "events", "host="+host, "date=*", "*.parquet"))
	conns, _ := filepath.Glob(filepath.Join(ds, "conns", "host="+host, "date=*", "*.parquet"))
	if len(parts) != len(want) || len(conns) != len(want) {
		t.Fatalf("dataset: %d events and %d conns files, want %d each", len(parts), len(conns), len(want))
	}
	t.Logf("%d files in both archives; archive ls, report and export --dataset read them from %s", len(want), url)
}
