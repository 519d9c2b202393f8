// SPDX-License-Identifier: Apache-2.0

package collect

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/magnet-tracer/magnet/internal/archive"
	"github.com/magnet-tracer/magnet/internal/archivetest"
)

// logTap collects a shipper's log lines and lets a test wait for one.
type logTap struct {
	mu    sync.Mutex
	lines []string
	more  chan struct{}
}

func newLogTap() *logTap { return &logTap{more: make(chan struct{}, 1)} }

func (l *logTap) log(f string, a ...any) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(f, a...))
	l.mu.Unlock()
	select {
	case l.more <- struct{}{}:
	default:
	}
}

// count is how many lines hold every one of subs.
func (l *logTap) count(subs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
next:
	for _, line := range l.lines {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		n++
	}
	return n
}

// wait waits until n lines hold subs, failing after d.
func (l *logTap) wait(t *testing.T, d time.Duration, n int, subs ...string) {
	t.Helper()
	deadline := time.After(d)
	for l.count(subs...) < n {
		select {
		case <-l.more:
		case <-deadline:
			l.mu.Lock()
			defer l.mu.Unlock()
			t.Fatalf("after %s, %d lines with %q, want %d; log:\n%s", d, l.count(subs...), subs, n, strings.Join(l.lines, "\n"))
		}
	}
}

// TestShipStalledTargetDelaysNoOther: an S3 store frozen by SIGSTOP (it
// accepts connections and never answers) holds its own shipments only: the
// directory target receives every file meanwhile, the stall is logged
// within ship.stall, and the status and metrics show the frozen target's
// backlog and stall. Thawed, it receives them all and the spool empties.
func TestShipStalledTargetDelaysNoOther(t *testing.T) {
	m := archivetest.StartMoto(t)
	root := t.TempDir()
	// The store first: a shipper that ships to targets in turn would wait
	// on it before it ever reached the directory.
	cfg := testConfig(t,
		Target{Type: "s3", Endpoint: m.Endpoint, Bucket: "traces", Region: "us-east-1", AccessKey: archivetest.AccessKey, SecretKey: archivetest.SecretKey},
		Target{Type: "dir", Path: root})
	cfg.Ship.Interval = 200 * time.Millisecond
	cfg.Ship.Stall = time.Second
	cfg.Ship.Timeout = time.Minute // longer than the test: only the stall may say something
	m.Pause()
	paused := true
	defer func() {
		if paused {
			m.Resume()
		}
	}()
	spool(t, cfg, 2, false) // 3 finished files
	s, tap, stop := runShipper(t, cfg)
	defer stop()

	start := time.Now()
	tap.wait(t, 20*time.Second, 3, "shipped ", " to dir ")
	t.Logf("3 files in the directory %s after start, the store frozen", time.Since(start).Round(time.Millisecond))
	tap.wait(t, 10*time.Second, 1, " to s3: stalled, no answer for ")
	if n := len(archived(t, root)); n != 3 {
		t.Fatalf("%d files in the directory archive, want 3", n)
	}

	st := s.Status()
	byName := map[string]TargetStatus{}
	for _, ts := range st.Targets {
		byName[ts.Name] = ts
	}
	if s3, dir := byName["s3"], byName["dir"]; s3.Backlog != 3 || !s3.Stalled || s3.Shipped != 0 || s3.InFlight == "" ||
		dir.Backlog != 0 || dir.Shipped != 3 || dir.LastSuccess.IsZero() || st.Waiting != 3 {
		t.Fatalf("status while the store is frozen: %+v", st)
	}
	// What `magnet status` reads: the file the running shipper rewrites
	// every few seconds.
	deadline := time.Now().Add(3 * publishEvery)
	for {
		pub, err := ReadStatus(cfg.Spool)
		if err == nil && len(pub.Targets) == 2 && pub.Targets[0].Stalled && pub.Targets[0].Backlog == 3 && pub.Targets[1].Shipped == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("published status: %+v %v", pub, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The metrics an alert reads, as Prometheus scrapes them.
	srv := httptest.NewServer(s.MetricsHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`magnet_collect_target_stalled{host="web1",target="s3",type="s3"} 1`,
		`magnet_collect_target_stalled{host="web1",target="dir",type="dir"} 0`,
		`magnet_collect_target_backlog_files{host="web1",target="s3",type="s3"} 3`,
		`magnet_collect_target_backlog_files{host="web1",target="dir",type="dir"} 0`,
		`magnet_collect_target_shipped_files_total{host="web1",target="dir",type="dir"} 3`,
		`magnet_collect_target_last_success_timestamp_seconds{host="web1",target="s3",type="s3"} 0`,
		`magnet_collect_waiting_files{host="web1"} 3`,
		`magnet_collect_dropped_files_total{host="web1"} 0`,
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}

	m.Resume()
	paused = false
	tap.wait(t, 30*time.Second, 3, "shipped ", " to s3 ")
	tap.wait(t, 10*time.Second, 1, " to s3: stall over after ")
	deadline = time.Now().Add(10 * time.Second)
	for {
		if waiting, shipped := s.Queue(); waiting == 0 && shipped == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("spool not emptied after the store thawed: %+v", s.Status())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := s.Status(); st.Targets[0].Stalled || st.Targets[0].Backlog != 0 || st.Targets[0].Shipped != 3 || st.Targets[0].LastSuccess.IsZero() {
		t.Fatalf("status after the thaw: %+v", st)
	}
}

// runShipper starts a shipper of cfg whose log goes to the returned tap.
// stop ends its run, then closes it.
func runShipper(t *testing.T, cfg *Config) (s *Shipper, tap *logTap, stop func()) {
	t.Helper()
	s, err := NewShipper(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tap = newLogTap()
	s.Log = tap.log
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error)
	go func() { ran <- s.Run(ctx, nil) }()
	return s, tap, func() { cancel(); <-ran; s.Close() }
}

// TestShipTargetTimeoutAndBackoff: a target's own timeout bounds each
// shipment to it (here far below ship.timeout), and its failures back off
// on their own, doubling from ship.retry_initial up to ship.retry_max,
// while the directory target ships everything at once.
func TestShipTargetTimeoutAndBackoff(t *testing.T) {
	m := archivetest.StartMoto(t)
	root := t.TempDir()
	cfg := testConfig(t,
		Target{Type: "s3", Endpoint: m.Endpoint, Bucket: "traces", Region: "us-east-1", AccessKey: archivetest.AccessKey, SecretKey: archivetest.SecretKey,
			Timeout: 300 * time.Millisecond},
		Target{Type: "dir", Path: root})
	cfg.Ship.Interval = 100 * time.Millisecond
	cfg.Ship.Timeout = 10 * time.Minute // the default shipment bound: never reached here
	cfg.Ship.RetryInitial, cfg.Ship.RetryMax = 200*time.Millisecond, 800*time.Millisecond
	m.Pause()
	defer m.Resume()
	spool(t, cfg, 2, false) // 3 finished files
	s, tap, stop := runShipper(t, cfg)
	defer stop()

	start := time.Now()
	tap.wait(t, 20*time.Second, 4, " to s3 failed (attempt ")
	took := time.Since(start)
	tap.wait(t, 10*time.Second, 3, "shipped ", " to dir ")
	// Each attempt ends at the target's timeout, then waits its backoff
	// (+ up to a fifth of jitter): 200, 400, 800, 800 ms.
	var delays []time.Duration
	for i := 1; i <= 4; i++ {
		tap.mu.Lock()
		for _, l := range tap.lines {
			pre := fmt.Sprintf(" to s3 failed (attempt %d, next in ", i)
			if _, rest, ok := strings.Cut(l, pre); ok {
				d, err := time.ParseDuration(rest[:strings.Index(rest, ")")])
				if err != nil {
					t.Fatalf("%q: %v", l, err)
				}
				if !strings.Contains(l, "deadline exceeded") {
					t.Errorf("attempt %d did not end at the target's timeout: %q", i, l)
				}
				delays = append(delays, d)
				break
			}
		}
		tap.mu.Unlock()
	}
	want := []time.Duration{200, 400, 800, 800}
	if len(delays) != 4 {
		t.Fatalf("delays %v", delays)
	}
	for i, d := range delays {
		if w := want[i] * time.Millisecond; d < w || d > w+w/5+time.Millisecond {
			t.Errorf("attempt %d: next in %s, want %s plus at most a fifth", i+1, d, w)
		}
	}
	// Four timeouts and the first three backoffs at least: 4 x 300 ms +
	// 1400 ms; with ship.timeout in force it would be minutes.
	if took < 2600*time.Millisecond || took > 15*time.Second {
		t.Errorf("4 failed attempts took %s, want 2.6 s (4 timeouts of 300 ms, 1.4 s of backoff) and a little", took)
	}
	st := s.Status()
	if st.Targets[0].Failures < 4 || st.Targets[0].ConsecutiveFailures < 4 || st.Targets[0].Shipped != 0 || st.Targets[1].Shipped != 3 || st.Targets[1].Failures != 0 {
		tap.mu.Lock()
		defer tap.mu.Unlock()
		t.Fatalf("status: %+v\nlog:\n%s", st, strings.Join(tap.lines, "\n"))
	}
	t.Logf("4 attempts to the frozen store in %s, backoffs %v; the directory has all 3 files", took.Round(time.Millisecond), delays)
}

// TestPrepareKeepsHeldFiles: a target's pass holds a spool file (its lock
// hides it from rotate.Finished) and releases it when the shipment fails,
// while another pass lists the spool. A file released between the two
// looks of the listing (the lock test, then the held files) was missing
// from both, so the listing forgot its journal entry and which targets
// had it: a directory target then "found it already there (shipped before
// a restart)" and counted it shipped twice. The listing must see every
// file, held or not, at every moment.
func TestPrepareKeepsHeldFiles(t *testing.T) {
	cfg := testConfig(t, Target{Type: "dir", Path: t.TempDir()})
	spool(t, cfg, 2, false)
	s, _ := newShipper(t, cfg)
	ctx := context.Background()
	names := s.prepare(ctx)
	if len(names) != 3 {
		t.Fatalf("%d files staged, want 3", len(names))
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, n := range names {
				s.mu.Lock()
				s.hold(n)
				s.mu.Unlock()
				s.mu.Lock()
				s.release(n)
				s.mu.Unlock()
			}
		}
	}()
	lost := 0
	for i := 0; i < 300; i++ {
		s.prepare(ctx)
		s.mu.Lock()
		for _, n := range names {
			if s.j.Files[n] == nil {
				lost++
			}
		}
		s.mu.Unlock()
	}
	close(stop)
	<-done
	if lost != 0 {
		t.Fatalf("the journal forgot a held file %d times in 300 listings", lost)
	}
}

// TestShipS3DayIndex: each manifest the shipper writes to S3 is also in
// its day's index (archive.DayIndexName), byte for byte the same
// manifest, so that listings read one object per host and day.
func TestShipS3DayIndex(t *testing.T) {
	m := archivetest.StartMoto(t)
	cfg := testConfig(t, Target{Type: "s3", Endpoint: m.Endpoint, Bucket: "traces", Prefix: "site-a", Region: "us-east-1",
		AccessKey: archivetest.AccessKey, SecretKey: archivetest.SecretKey})
	spool(t, cfg, 2, false) // 3 finished files
	s, _ := newShipper(t, cfg)
	s.Pass(context.Background())
	if waiting, shipped := s.Queue(); waiting != 0 || shipped != 3 {
		t.Fatalf("%d waiting, %d shipped; want 0 and 3", waiting, shipped)
	}
	st, err := archive.NewS3(m.Endpoint, "traces", "site-a", "us-east-1", archivetest.AccessKey, archivetest.SecretKey)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	day := "site-a/web1/" + time.Now().UTC().Format("2006-01-02") + "/"
	o, err := st.Client.GetObject(ctx, "traces", day+archive.DayIndexName, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(o)
	o.Close()
	if err != nil {
		t.Fatalf("the day's index: %v", err)
	}
	var ix archive.DayIndex
	if err := json.Unmarshal(data, &ix); err != nil || len(ix.Manifests) != 3 {
		t.Fatalf("the day's index holds %d manifests (%v), want 3:\n%s", len(ix.Manifests), err, data)
	}
	for name, im := range ix.Manifests {
		o, err := st.Client.GetObject(ctx, "traces", day+name, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(o)
		o.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var man archive.Manifest
		if err := json.Unmarshal(raw, &man); err != nil {
			t.Fatal(err)
		}
		if int64(len(raw)) != im.Size || !reflect.DeepEqual(man, im.Manifest) {
			t.Errorf("%s: the index holds %d bytes %+v, the manifest is %d bytes %+v", name, im.Size, im.Manifest, len(raw), man)
		}
	}
}
