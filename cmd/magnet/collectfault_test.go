// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/archive"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// TestCollectFaults kills the collect service (SIGKILL of the service and
// of everything in its shipper's cgroup) at each dangerous step of the
// rotation handover and of a shipment, placed by a fault point
// (internal/fault), restarts it and stops it with SIGTERM. Each time: no
// half file and no stray upload in the archive, no file uploaded twice,
// everything shipped, and every recording's chain reads back with exact
// seams; the step the kill interrupted shows as what it is (a file named
// as next that never started, a file cut short, a trace found already
// archived after the restart).
func TestCollectFaults(t *testing.T) {
	needRoot(t)
	cgRoot, err := probe.Cgroup2Root()
	if err != nil {
		t.Skipf("no cgroup2: %v", err)
	}
	for _, point := range []string{
		"rotate:after-finish", "rotate:before-rename", "rotate:after-rename",
		"ship:after-stage", "ship:before-rename", "ship:after-upload", "ship:after-manifest", "ship:after-journal", "ship:after-delete",
	} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			faultCase(t, cgRoot, point)
		})
	}
}

func faultCase(t *testing.T, cgRoot, point string) {
	dir := t.TempDir()
	// Some traffic of the test's own, on the recorded port: a port the
	// kernel gives, so that parallel cases and other tests never clash.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	spool, root := filepath.Join(dir, "spool"), filepath.Join(dir, "archive")
	cfgPath, marker := filepath.Join(dir, "collect.yaml"), filepath.Join(dir, "fault-reached")
	cfg := fmt.Sprintf(`host: faulthost
spool: %s
rotate: {interval: 1s}
filters: {port: %d}
ship: {interval: 200ms, retry_initial: 100ms, retry_max: 1s}
targets:
  - {type: dir, path: %s}
`, spool, port, root)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go io.Copy(io.Discard, c)
		}
	}()
	stopTraffic := make(chan struct{})
	defer close(stopTraffic)
	go func() {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			return
		}
		defer c.Close()
		for {
			select {
			case <-stopTraffic:
				return
			case <-time.After(10 * time.Millisecond):
				c.Write(make([]byte, 100))
			}
		}
	}()

	var logs bytes.Buffer
	start := func(env ...string) *exec.Cmd {
		ready := filepath.Join(dir, "ready")
		os.Remove(ready)
		cmd := runCollect(t, &logs, cfgPath, ready, env...)
		waitFor(t, func() bool { _, err := os.Stat(ready); return err == nil })
		return cmd
	}
	manifests := func() int {
		es, _ := archive.Scan(root)
		return len(es)
	}

	svc := start("MAGNET_FAULT="+point, "MAGNET_FAULT_MARKER="+marker)
	waitFor(t, func() bool { _, err := os.Stat(marker); return err == nil })
	data, _ := os.ReadFile(marker)
	stopped, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	// Everything at once, as a power cut would: the shipper's cgroup, then
	// the service.
	if err := os.WriteFile(filepath.Join(cgRoot, fmt.Sprintf("magnet-collect-%d", svc.Process.Pid), "cgroup.kill"), []byte("1"), 0o644); err != nil {
		t.Fatalf("kill the shipper's cgroup: %v", err)
	}
	svc.Process.Signal(syscall.SIGKILL)
	svc.Wait()
	if strings.HasPrefix(point, "rotate:") != (stopped == svc.Process.Pid) {
		t.Fatalf("%s stopped pid %d; the service is %d", point, stopped, svc.Process.Pid)
	}
	checkArchiveWhole(t, root)
	// What the killed run archived: its shipper may have died, or the
	// service before relaying its log line, right after an upload.
	archivedByKilled := map[string]bool{}
	if es, err := archive.Scan(root); err == nil {
		for _, e := range es {
			archivedByKilled[e.Original] = true
		}
	}
	if point == "rotate:before-rename" {
		if left, _ := filepath.Glob(filepath.Join(spool, ".*.mgt.new")); len(left) != 1 {
			t.Fatalf("killed before the rename: %v in the spool, want one .NAME.new", left)
		}
	}
	killedAt := manifests()

	svc = start()
	waitFor(t, func() bool { return manifests() >= killedAt+2 })
	svc.Process.Signal(syscall.SIGTERM)
	if err := svc.Wait(); err != nil {
		t.Fatalf("collect after SIGTERM: %v\n%s", err, logs.String())
	}
	checkArchiveWhole(t, root)

	// Nothing half or stray in the archive, everything shipped.
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasPrefix(d.Name(), ".") {
			t.Errorf("stray file in the archive: %s", p)
		}
		return nil
	})
	if left, _ := filepath.Glob(filepath.Join(spool, "faulthost-*.mgt")); len(left) != 0 {
		t.Errorf("not shipped: %v\n%s", left, logs.String())
	}
	if left, _ := os.ReadDir(filepath.Join(spool, ".staging")); len(left) != 0 {
		t.Errorf("staging copies left: %v", left)
	}
	es, err := archive.Scan(root)
	if err != nil {
		t.Fatal(err)
	}
	// Uploaded once each: a trace found in the archive after the restart
	// is not sent again.
	uploads, already := map[string]int{}, map[string]int{}
	for _, m := range regexp.MustCompile(`shipped (\S+) to `).FindAllStringSubmatch(logs.String(), -1) {
		uploads[m[1]]++
	}
	// "NAME already in ARCHIVE as KEY": found in the archive on a try
	// after the restart. ("NAME already in every archive as KEY": found
	// done in the journal, with nothing tried: no upload either way.)
	for _, m := range regexp.MustCompile(`(\S+) already in \S+ as `).FindAllStringSubmatch(logs.String(), -1) {
		already[m[1]]++
	}
	// (A trace found already archived was uploaded by the killed run,
	// which died before it could say so. One the killed run archived may
	// also go unmentioned: killed after its upload and its journal, and
	// after the local copy went but before the service relayed the
	// shipper's line.)
	for _, e := range es {
		n := uploads[e.Original] + already[e.Original]
		if n > 1 || (n == 0 && !archivedByKilled[e.Original]) {
			t.Errorf("%s uploaded %d times after a shipment, found already archived %d times (archived by the killed run: %v)\n%s",
				e.Original, uploads[e.Original], already[e.Original], archivedByKilled[e.Original], logs.String())
		}
	}
	for name := range uploads {
		if !slices.ContainsFunc(es, func(e archive.Entry) bool { return e.Original == name }) {
			t.Errorf("%s said shipped, not in the archive", name)
		}
	}
	// Killed after the upload, the restart must find the trace archived.
	// (At another point a shipment running beside the kill may have got
	// that far too: the shipper works while the recorder rotates.)
	if (point == "ship:after-upload" || point == "ship:after-manifest") && len(already) != 1 {
		t.Errorf("after %s, found already archived: %v", point, already)
	}

	// Two recordings (one per run), each read with exact seams.
	chains := archive.Select(es, archive.Selection{})
	if len(chains) != 2 {
		t.Fatalf("%d recordings in the archive, want 2", len(chains))
	}
	events := 0
	for _, c := range chains {
		var paths []string
		for _, e := range c.Entries {
			paths = append(paths, e.Path)
		}
		r, err := trace.OpenChain(paths)
		if err != nil {
			t.Fatal(err)
		}
		for {
			rec, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if rec.Type.Name == "sock_send" {
				events++
			}
		}
		if w := r.Warnings(); len(w) != 0 {
			t.Errorf("recording %s: %v", c.Recording, w)
		}
		r.Close()
	}
	if events == 0 {
		t.Error("no sock_send of the test's traffic in the archive")
	}
	// The first recording ends where the kill stopped it.
	first := chains[0]
	if first.Entries[0].Start().After(chains[1].Entries[0].Start()) {
		first = chains[1]
	}
	last := first.Entries[len(first.Entries)-1]
	lr, err := trace.Open(last.Path)
	if err != nil {
		t.Fatal(err)
	}
	sent := uint64(0)
	for {
		rec, err := lr.Next()
		if err != nil {
			break
		}
		if rec.Type != nil && rec.Type.Name == "sock_send" {
			sent++
		}
	}
	end := lr.RotationEnd()
	// A file cut short by the kill has no end block to take counts from:
	// its manifest must carry the events read back from it.
	if last.CutShort && last.Events["sock_send"] != sent {
		t.Errorf("after %s: the cut-short file %s: manifest says %d sock_send, %d read", point, last.Original, last.Events["sock_send"], sent)
	}
	lr.Close()
	switch point {
	case "rotate:after-finish", "rotate:before-rename":
		// It names its successor, which never started (the next recording
		// may have used the name).
		var inChain []string
		for _, e := range first.Entries {
			inChain = append(inChain, e.Original)
		}
		if end == nil || end.Next == "" || slices.Contains(inChain, end.Next) {
			t.Errorf("after %s: the first recording's last file ends with %+v (its files: %v)", point, end, inChain)
		}
	case "rotate:after-rename":
		// Its successor started, with none of its own records: cut short.
		if !last.CutShort || end != nil {
			t.Errorf("after %s: the first recording's last file %s: cut short %v, end %+v", point, last.Original, last.CutShort, end)
		}
	}
	t.Logf("%s: %d files in the archive, %d sock_send; found already archived after the restart: %v", point, len(es), events, already)
}
