// SPDX-License-Identifier: Apache-2.0

package collect

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/archive"
	"github.com/magnet-tracer/magnet/internal/archivetest"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/flight"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/rotate"
	"github.com/magnet-tracer/magnet/internal/trace"
)

func TestConfig(t *testing.T) {
	c, err := Parse([]byte(`
host: web1
spool: /tmp/spool
rotate: {interval: 10m, size: 100MiB}
events: default,-dev
filters: {port: 443, pcap: "tcp and net 10.1.0.0/16"}
disk_budget: 2GiB
targets:
  - {type: dir, path: /mnt/archive}
  - {type: ssh, name: backup, host: archive.example.org, user: magnet, path: /srv/archive, port: 2222}
  - {type: s3, endpoint: https://s3.example.org, bucket: traces, prefix: site-a}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.budget != 2<<30 || c.rotateMax != 100<<20 || c.Rotate.Interval != 10*time.Minute || c.Targets[0].Name != "dir-0" || c.Targets[1].Name != "backup" || !*c.Compress {
		t.Fatalf("parsed %+v", c)
	}
	if c.groups&event.GroupDev != 0 || c.Filters.Port != 443 || c.Filters.Pcap != "tcp and net 10.1.0.0/16" {
		t.Fatalf("events/filters: %v %+v", c.groups, c.Filters)
	}
	sum, err := Parse([]byte("summary: 10s\n"))
	if err != nil || sum.Summary != 10*time.Second || sum.groups != 0 {
		t.Fatalf("summary: %+v %v; want 10s and the groups left to summary mode", sum, err)
	}
	fl, err := Parse([]byte("flight: {window: 30s, triggers: 'retrans,rtt>50ms', memory: 64MiB}\n"))
	if err != nil || fl.flight == nil || fl.flight.Window != 30*time.Second || fl.flight.After != 2*time.Second || fl.flight.Memory != 64<<20 ||
		!fl.flight.Triggers.Retrans || fl.flight.Triggers.RTT != 50*time.Millisecond || fl.groups != event.DefaultGroups {
		t.Fatalf("flight: %+v %v", fl.flight, err)
	}
	if fl, err := Parse([]byte("flight: {window: 5s, after: 0s}\n")); err != nil || fl.flight.After != 0 || fl.flight.Memory != flight.DefaultMemory {
		t.Fatalf("flight after 0s: %+v %v", fl.flight, err)
	}
	if fl, err := Parse(nil); err != nil || fl.flight != nil {
		t.Fatalf("no flight recorder by default: %+v %v", fl.flight, err)
	}
	def, err := Parse(nil)
	if err != nil || def.Spool != DefaultSpool || def.Rotate.Interval != time.Hour || def.Ship.Interval != 10*time.Second {
		t.Fatalf("defaults: %+v %v", def, err)
	}
	for bad, want := range map[string]string{
		"spol: /x":                                                 "field spol not found",
		"rotate: {interval: 10ms}":                                 "at least 1s",
		"rotate: {size: lots}":                                     "bad size",
		"disk_budget: -1":                                          "bad size",
		"events: bogus":                                            "unknown event group",
		"summary: 10ms":                                            "at least 100ms",
		"flight: {window: 500ms}":                                  "flight.window 500ms: want at least 1s",
		"flight: {triggers: retrans}":                              "need flight.window",
		"flight: {window: 5s, after: -1s}":                         "flight.after -1s: want 0 or more",
		"flight: {window: 5s, memory: 1MiB}":                       "flight.memory \"1MiB\": want a size of at least",
		"flight: {window: 5s, triggers: loss}":                     `flight.triggers: unknown trigger "loss"`,
		"{flight: {window: 5s}, summary: 1s}":                      "use one",
		"{flight: {window: 5s, triggers: drop}, events: tcp}":      "needs the drop events: add them to events",
		"filters: {pcap: 'tcp port'}":                              "filters.pcap: pcap filter: column 9 (end): port needs a value",
		"pattern: a/%n.mgt":                                        "without directory",
		"pattern: '%q.mgt'":                                        "unknown verb",
		"targets: [{type: ftp}]":                                   "unknown type",
		"targets: [{type: ssh, path: /x}]":                         "needs host",
		"targets: [{type: s3, bucket: b}]":                         "needs endpoint",
		"targets: [{type: dir}]":                                   "needs path",
		"targets: [{type: ssh, host: -oProxyCommand=x, path: /x}]": "may not start",
	} {
		if _, err := Parse([]byte(bad)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", bad, err, want)
		}
	}
}

// spool writes n finished files of one recording into the config's spool,
// plus one still being written (locked) when open is set, and returns the
// sink (to close later) and the records written.
func spool(t *testing.T, cfg *Config, n int, open bool) (*rotate.Sink, int) {
	t.Helper()
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		t.Fatal(err)
	}
	h := &trace.Header{Host: cfg.Host, StartWallNs: time.Now().UnixNano(), Types: types}
	pat, err := rotate.ParsePattern(filepath.Join(cfg.Spool, cfg.Pattern), cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	s, err := rotate.New(h, rotate.Options{Pattern: pat, MaxBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	send := h.TypeByName("sock_send")
	rec := make([]byte, send.Size)
	rec[30] = send.ID
	written := 0
	for s.Stats().Files < int64(n+1) {
		binary.NativeEndian.PutUint64(rec, uint64(1e9+written))
		if err := s.Write(rec); err != nil {
			t.Fatal(err)
		}
		written++
	}
	if !open {
		if err := s.Close(nil); err != nil {
			t.Fatal(err)
		}
	}
	return s, written
}

func testConfig(t *testing.T, targets ...Target) *Config {
	t.Helper()
	c, err := Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Host = "web1"
	c.Spool = t.TempDir()
	c.Pattern = "%h-%n.mgt"
	c.Ship.RetryInitial, c.Ship.RetryMax, c.Ship.Timeout = 10*time.Millisecond, 20*time.Millisecond, 5*time.Second
	for i := range targets {
		if targets[i].Name == "" {
			targets[i].Name = targets[i].Type
		}
	}
	c.Targets = targets
	return c
}

// counting counts the traces an archive is given (manifests are rewritten
// after a crash: same bytes, and they commit the trace).
type counting struct {
	Archive
	puts atomic.Int32
}

func (c *counting) Put(ctx context.Context, key string, b Blob) error {
	if !strings.HasSuffix(key, archive.ManifestSuffix) {
		c.puts.Add(1)
	}
	return c.Archive.Put(ctx, key, b)
}

func newShipper(t *testing.T, cfg *Config) (*Shipper, *[]string) {
	t.Helper()
	s, err := NewShipper(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	var logs []string
	s.Log = func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }
	return s, &logs
}

func archived(t *testing.T, root string) []archive.Entry {
	t.Helper()
	es, err := archive.Scan(root)
	if err != nil {
		t.Fatal(err)
	}
	return es
}

// readChain reads the archived files as one timeline and counts records.
func readChain(t *testing.T, es []archive.Entry) (int, []string) {
	t.Helper()
	chains := archive.Select(es, archive.Selection{})
	if len(chains) != 1 {
		t.Fatalf("%d chains in the archive, want 1", len(chains))
	}
	r, err := chains[0].Source(archive.Selection{}).Open()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	n := 0
	for {
		_, err := r.Next()
		if errors.Is(err, io.EOF) {
			return n, r.Warnings()
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
}

// TestShipDir: finished files go, compressed and with manifests, to
// HOST/DATE/; the file being written stays; local copies go only once
// shipped; the archive reads back as one timeline.
func TestShipDir(t *testing.T) {
	root := t.TempDir()
	cfg := testConfig(t, Target{Type: "dir", Path: root})
	sink, written := spool(t, cfg, 3, true)
	// A recorder killed in the middle of a rotation leaves the next file
	// under its temporary name; a young one may be a file being started.
	stale, young := filepath.Join(cfg.Spool, ".web1-0042.mgt.new"), filepath.Join(cfg.Spool, ".web1-0043.mgt.new")
	os.WriteFile(stale, []byte("MGTRACE"), 0o644)
	os.WriteFile(young, []byte("MGTRACE"), 0o644)
	old := time.Now().Add(-time.Hour)
	os.Chtimes(stale, old, old)
	s, _ := newShipper(t, cfg)
	s.Pass(context.Background())
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Error("the stale temporary of a killed rotation is still there")
	}
	if _, err := os.Stat(young); err != nil {
		t.Error("a young temporary was removed")
	}
	es := archived(t, root)
	if len(es) != 3 {
		t.Fatalf("%d files archived, want 3 (the open one stays)", len(es))
	}
	for _, e := range es {
		if !e.Compressed || e.SHA256 == "" || e.Host != "web1" || !strings.HasPrefix(e.Path, filepath.Join(root, "web1", time.Now().UTC().Format("2006-01-02"))) {
			t.Fatalf("entry %+v", e)
		}
		sum, n, _ := fileSHA256(e.Path)
		if sum != e.SHA256 || n != e.Bytes {
			t.Fatalf("%s: manifest says %d/%s, file is %d/%s", e.Path, e.Bytes, e.SHA256, n, sum)
		}
	}
	left, _ := rotate.Finished(s.pattern, "")
	if len(left) != 0 {
		t.Fatalf("%d finished files left in the spool", len(left))
	}
	if err := sink.Close(nil); err != nil {
		t.Fatal(err)
	}
	s.Pass(context.Background())
	es = archived(t, root)
	n, warns := readChain(t, es)
	if len(es) != 4 || n != written || len(warns) != 0 {
		t.Fatalf("archive: %d files, %d of %d records, warnings %v", len(es), n, written, warns)
	}
	if waiting, shipped := s.Queue(); waiting != 0 || shipped != 4 {
		t.Fatalf("queue %d, shipped %d", waiting, shipped)
	}
}

// TestShipOutageAndResume: an unreachable archive keeps files queued, with
// backoff, and they ship when it returns; a shipper restarted after a crash
// that came between upload and journal does not upload again.
func TestShipOutageAndResume(t *testing.T) {
	root := filepath.Join(t.TempDir(), "archive")
	if err := os.WriteFile(root, nil, 0o644); err != nil { // a file where the directory should be
		t.Fatal(err)
	}
	cfg := testConfig(t, Target{Type: "dir", Path: root})
	_, written := spool(t, cfg, 2, false)
	s, logs := newShipper(t, cfg)
	s.Pass(context.Background())
	s.Pass(context.Background())
	if waiting, _ := s.Queue(); waiting != 3 || !strings.Contains(strings.Join(*logs, "\n"), "failed") {
		t.Fatalf("outage: %d waiting, logs %v", waiting, *logs)
	}
	if s.targets[0].b.fails == 0 {
		t.Fatal("no backoff after failures")
	}
	os.Remove(root) // the archive returns
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.Pass(context.Background())
		if waiting, _ := s.Queue(); waiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("files did not ship after the archive returned")
		}
		time.Sleep(s.cfg.Ship.RetryMax)
	}
	if n, _ := readChain(t, archived(t, root)); n != written {
		t.Fatalf("archive holds %d records, %d written", n, written)
	}

	// A crash after the upload, before the journal said so: the restarted
	// shipper finds the file in the archive and does not put it again.
	cfg2 := testConfig(t, Target{Type: "dir", Path: t.TempDir()})
	spool(t, cfg2, 0, false)
	s1, _ := newShipper(t, cfg2)
	files, _ := rotate.Finished(s1.pattern, "")
	st, err := s1.stage(files[0].Path)
	if err != nil {
		t.Fatal(err)
	}
	s1.j.Files[filepath.Base(files[0].Path)] = st
	s1.j.save()
	if _, err := s1.shipTo(context.Background(), s1.targets[0], archiveKey(st.Meta), st); err != nil {
		t.Fatal(err)
	}
	// ... killed here. Restart:
	s2, _ := newShipper(t, cfg2)
	c := &counting{Archive: s2.targets[0].a}
	s2.targets[0].a = c
	s2.Pass(context.Background())
	if c.puts.Load() != 0 {
		t.Fatalf("%d puts after restart: shipped twice", c.puts.Load())
	}
	if waiting, shipped := s2.Queue(); waiting != 0 || shipped != 1 {
		t.Fatalf("after restart: %d waiting, %d shipped", waiting, shipped)
	}

	// A crash after the journal said every archive has it, before the
	// local copy went (or before the log line got out): the restarted
	// shipper removes it without a put, and says so.
	cfg3 := testConfig(t, Target{Type: "dir", Path: t.TempDir()})
	spool(t, cfg3, 0, false)
	s3, _ := newShipper(t, cfg3)
	files, _ = rotate.Finished(s3.pattern, "")
	name := filepath.Base(files[0].Path)
	if st, err = s3.stage(files[0].Path); err != nil {
		t.Fatal(err)
	}
	if _, err := s3.shipTo(context.Background(), s3.targets[0], archiveKey(st.Meta), st); err != nil {
		t.Fatal(err)
	}
	st.Done[s3.targets[0].a.Name()] = true
	s3.j.Files[name] = st
	s3.j.save()
	// ... killed here. Restart:
	s4, logs4 := newShipper(t, cfg3)
	c = &counting{Archive: s4.targets[0].a}
	s4.targets[0].a = c
	s4.Pass(context.Background())
	if c.puts.Load() != 0 {
		t.Fatalf("%d puts after a restart with the journal done: shipped twice", c.puts.Load())
	}
	if waiting, _ := s4.Queue(); waiting != 0 {
		t.Fatalf("after restart with the journal done: %d waiting", waiting)
	}
	want := name + " already in every archive as "
	if log := strings.Join(*logs4, "\n"); !strings.Contains(log, want) {
		t.Fatalf("the restarted shipper did not say it found %s shipped: %s", name, log)
	}
}

// shipThroughOutage ships 2 files, takes the archive away, ships 2 more
// (they queue), brings it back and checks that all 4 arrive.
func shipThroughOutage(t *testing.T, cfg *Config, down, up func(), list func() []archive.Entry) {
	t.Helper()
	first, _ := spool(t, cfg, 2, true)
	s, logs := newShipper(t, cfg)
	// A loaded machine can make a store miss the first pass's timeout: the
	// files must ship in some pass, not necessarily the first.
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.Pass(context.Background())
		if waiting, _ := s.Queue(); waiting == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(cfg.Ship.RetryMax)
	}
	if n := len(list()); n != 2 {
		t.Fatalf("%d files in the archive, want 2; log %v", n, *logs)
	}
	down()
	first.Close(nil) // the third file finishes while the archive is away
	s.Pass(context.Background())
	if waiting, _ := s.Queue(); waiting != 1 {
		t.Fatalf("%d files queued during the outage, want 1; log %v", waiting, *logs)
	}
	up()
	deadline = time.Now().Add(20 * time.Second)
	for {
		s.Pass(context.Background())
		if waiting, _ := s.Queue(); waiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("files did not ship after the archive returned; log %v", *logs)
		}
		time.Sleep(cfg.Ship.RetryMax)
	}
	es := list()
	if len(es) != 3 {
		t.Fatalf("%d files in the archive, want 3", len(es))
	}
	t.Logf("log: %s", strings.Join(*logs, " | "))
}

// TestShipSSH ships to a real sshd on loopback, through an outage (the
// server stopped, then started again).
func TestShipSSH(t *testing.T) {
	srv := archivetest.StartSSHD(t)
	root := t.TempDir()
	cfg := testConfig(t, Target{Type: "ssh", SSHHost: "127.0.0.1", Port: srv.Port, User: srv.User, Path: root,
		IdentityFile: srv.Identity, KnownHosts: srv.KnownHosts})
	shipThroughOutage(t, cfg, srv.Stop, srv.Start, func() []archive.Entry { return archived(t, root) })
	n, warns := readChain(t, archived(t, root))
	if n == 0 || len(warns) != 0 {
		t.Fatalf("ssh archive: %d records, warnings %v", n, warns)
	}

	// Read back over ssh, as archive ls and the analysis commands do.
	u := fmt.Sprintf("ssh://%s@127.0.0.1:%d%s", srv.User, srv.Port, root)
	opts := []string{"IdentityFile=" + srv.Identity, "UserKnownHostsFile=" + srv.KnownHosts, "StrictHostKeyChecking=yes"}
	listed, err := archive.List(u, opts)
	if err != nil {
		t.Fatal(err)
	}
	local := archived(t, root)
	if len(listed) != len(local) {
		t.Fatalf("over ssh: %d traces listed, %d in the directory", len(listed), len(local))
	}
	for _, e := range listed {
		if !strings.HasPrefix(e.Path, u+"/web1/") || e.SHA256 == "" {
			t.Fatalf("listed over ssh: %+v", e)
		}
	}
	srcs, cleanup, err := archive.Resolve([]string{u}, archive.Selection{Hosts: []string{"web1"}, SSHOptions: opts})
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	if len(srcs) != 1 || len(srcs[0].Paths) != len(local) {
		t.Fatalf("resolved over ssh: %+v", srcs)
	}
	r, err := srcs[0].Open()
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for ; ; got++ {
		if _, err := r.Next(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
	}
	r.Close()
	if got != n || len(r.Warnings()) != 0 {
		t.Fatalf("chain fetched over ssh: %d records (the archive's directory: %d), warnings %v", got, n, r.Warnings())
	}
	// Unreachable, or not an archive: one clear error each.
	if _, err := archive.List(fmt.Sprintf("ssh://%s@127.0.0.1:%d/nonexistent", srv.User, srv.Port), opts); err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("listing a missing directory: %v", err)
	}
	if _, err := archive.List(fmt.Sprintf("ssh://127.0.0.1:%d%s", archivetest.FreePort(t), root), opts); err == nil || !strings.Contains(err.Error(), "ssh 127.0.0.1") {
		t.Fatalf("listing a closed port: %v", err)
	}
}

// TestShipS3 ships to a real S3-compatible store (moto_server), through an
// outage (the store frozen, then thawed), then reads the archive back from
// s3:// as the analysis commands do.
func TestShipS3(t *testing.T) {
	m := archivetest.StartMoto(t)
	cfg := testConfig(t, Target{Type: "s3", Endpoint: m.Endpoint, Bucket: "traces", Prefix: "site-a", Region: "us-east-1",
		AccessKey: archivetest.AccessKey, SecretKey: archivetest.SecretKey})
	cfg.Ship.Timeout = 4 * time.Second
	t.Setenv("AWS_ENDPOINT_URL", m.Endpoint)
	t.Setenv("AWS_ACCESS_KEY_ID", archivetest.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", archivetest.SecretKey)
	t.Setenv("AWS_REGION", "us-east-1")
	list := func() []archive.Entry {
		es, err := archive.List("s3://traces/site-a", nil)
		if err != nil {
			t.Fatal(err)
		}
		return es
	}
	shipThroughOutage(t, cfg, m.Pause, m.Resume, list)
	srcs, cleanup, err := archive.Resolve([]string{"s3://traces/site-a"}, archive.Selection{Hosts: []string{"web1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	if len(srcs) != 1 || len(srcs[0].Paths) != 3 {
		t.Fatalf("sources from s3: %+v", srcs)
	}
	r, err := srcs[0].Open()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for {
		if _, err := r.Next(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
	}
	if len(r.Warnings()) != 0 {
		t.Fatalf("chain from s3: %v", r.Warnings())
	}
}

// TestBudgetWhileArchiveDown: with the archive away, files queue in the
// spool up to the disk budget; beyond it the oldest finished files are
// dropped, logged and counted; when the archive returns the rest ship.
// Every file is either shipped or counted as dropped.
func TestBudgetWhileArchiveDown(t *testing.T) {
	root := filepath.Join(t.TempDir(), "archive")
	os.WriteFile(root, nil, 0o644) // unreachable: a file where the directory should be
	cfg := testConfig(t, Target{Type: "dir", Path: root})
	cfg.budget = 200 << 10
	cfg.rotateMax = 32 << 10
	cfg.Rotate.Interval = 0
	s, logs := newShipper(t, cfg)
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		t.Fatal(err)
	}
	h := &trace.Header{Host: cfg.Host, StartWallNs: time.Now().UnixNano(), Types: types}
	sink, err := rotate.New(h, cfg.sinkOptions(s.pattern, func() { s.Pass(context.Background()) }, func(string, ...any) {}))
	if err != nil {
		t.Fatal(err)
	}
	send := h.TypeByName("sock_send")
	rec := make([]byte, send.Size)
	rec[30] = send.ID
	for i := 0; sink.Stats().Files < 20; i++ {
		binary.NativeEndian.PutUint64(rec, uint64(1e9+i))
		// Sizes that do not repeat: staging copies that do not shrink to
		// nothing, so that counting them makes a difference.
		binary.NativeEndian.PutUint32(rec[20:], uint32(i*2654435761))
		if err := sink.Write(rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := sink.Close(nil); err != nil {
		t.Fatal(err)
	}
	files, dropped := 0, 0
	var size int64
	fs, _ := rotate.Finished(s.pattern, "")
	for _, f := range fs {
		size += f.Size
		files++
	}
	dropped, droppedBytes := Dropped(cfg.Spool)
	// The staging copies count, and a dropped file's went with it.
	staged := dirBytes(filepath.Join(cfg.Spool, stagingDir))
	ents, _ := os.ReadDir(filepath.Join(cfg.Spool, stagingDir))
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(cfg.Spool, stagedBase(e.Name()))); err != nil {
			t.Errorf("staging copy %s of a file no longer in the spool", e.Name())
		}
	}
	t.Logf("spool: %d bytes in %d files + %d bytes staged (budget %d)", size, files, staged, cfg.budget)
	size += staged
	if size > cfg.budget || dropped == 0 || int64(dropped) != sink.Stats().Dropped || droppedBytes != sink.Stats().DroppedBytes {
		t.Fatalf("spool %d bytes in %d files (budget %d), %d dropped (%d bytes), sink %+v", size, files, cfg.budget, dropped, droppedBytes, sink.Stats())
	}
	os.Remove(root)
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.Pass(context.Background())
		if waiting, _ := s.Queue(); waiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue did not drain; log %v", *logs)
		}
		time.Sleep(cfg.Ship.RetryMax)
	}
	_, shipped := s.Queue()
	if int64(shipped)+int64(dropped) != sink.Stats().Files {
		t.Fatalf("%d shipped + %d dropped != %d files", shipped, dropped, sink.Stats().Files)
	}
	// The oldest went first: the archive's chain starts where the drops
	// ended, and has no hole.
	c := archive.Select(archived(t, root), archive.Selection{})[0]
	if c.Entries[0].Seq != dropped {
		t.Fatalf("archive starts at file %d, %d were dropped", c.Entries[0].Seq, dropped)
	}
	// The files dropped before shipping are said missing, once.
	n, warns := readChain(t, c.Entries)
	if n == 0 || len(warns) != 1 || !strings.Contains(warns[0], fmt.Sprintf("files 0 to %d of recording ", dropped-1)) {
		t.Fatalf("archived chain: %d records, warnings %v", n, warns)
	}
	t.Logf("%d files: %d dropped while the archive was away, %d shipped", sink.Stats().Files, dropped, shipped)
}

// TestNamesNotReused: a recording restarted within the same second as the
// last file of the one before (already shipped and deleted from the spool)
// does not give its first file that name: it would replace the other in
// the archive.
func TestNamesNotReused(t *testing.T) {
	cfg := testConfig(t)
	cfg.Pattern = "%h-%Y%m%dT%H%M%S.mgt"
	pat, err := rotate.ParsePattern(filepath.Join(cfg.Spool, cfg.Pattern), cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	record := func() string {
		h := &trace.Header{Host: cfg.Host, StartWallNs: clock.UnixNano(), Types: types}
		opts := cfg.sinkOptions(pat, func() {}, func(string, ...any) {})
		opts.Now = func() time.Time { return clock }
		s, err := rotate.New(h, opts)
		if err != nil {
			t.Fatal(err)
		}
		path := s.Path()
		if err := s.Close(nil); err != nil {
			t.Fatal(err)
		}
		os.Remove(path) // shipped
		return filepath.Base(path)
	}
	first, second := record(), record()
	if first == second || second != "web1-20250301T100000-1.mgt" {
		t.Fatalf("two recordings in the same second: %s then %s", first, second)
	}
}

// TestKeepBudget: after a flight file finishes, the oldest finished files
// go while the spool is over disk_budget, each logged in .dropped.log as
// the rotating sink's drops are, and the newest that fit stay.
func TestKeepBudget(t *testing.T) {
	cfg := testConfig(t)
	_, _ = spool(t, cfg, 4, false)
	pat, err := rotate.ParsePattern(filepath.Join(cfg.Spool, cfg.Pattern), cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	before, err := rotate.Finished(pat, "")
	if err != nil || len(before) < 4 {
		t.Fatalf("%d finished files, %v", len(before), err)
	}
	var total int64
	for _, f := range before {
		total += f.Size
	}
	last2 := before[len(before)-1].Size + before[len(before)-2].Size
	cfg.budget = last2
	cfg.keepBudget(pat, t.Logf)
	after, _ := rotate.Finished(pat, "")
	if len(after) != 2 || after[0].Path != before[len(before)-2].Path || after[1].Path != before[len(before)-1].Path {
		t.Fatalf("left %v of %v under a budget of the newest two", after, before)
	}
	if n, b := Dropped(cfg.Spool); n != len(before)-2 || b != total-last2 {
		t.Errorf(".dropped.log: %d files, %d bytes; dropped %d files, %d bytes", n, b, len(before)-2, total-last2)
	}
	cfg.keepBudget(pat, t.Logf)
	if again, _ := rotate.Finished(pat, ""); len(again) != 2 {
		t.Errorf("within the budget, %d of 2 files left", len(again))
	}
}
