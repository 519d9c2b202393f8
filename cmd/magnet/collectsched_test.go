// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/archivetest"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/probe"
)

// TestCollectExcludesShipper runs `magnet collect` with the sched events on
// while traffic flows between two namespaces and files ship over ssh: no
// event of any type in the archive names a thread of the shipper or of its
// ssh children (found by watching the shipper's cgroup, and through the
// fork events of the trace), while the traffic and the other tasks' sched
// events are there.
func TestCollectExcludesShipper(t *testing.T) {
	needRoot(t)
	cgRoot, err := probe.Cgroup2Root()
	if err != nil {
		t.Skipf("no cgroup2: %v", err)
	}
	srv := archivetest.StartSSHD(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgcxs"})
	dir := t.TempDir()
	spool, root := filepath.Join(dir, "spool"), filepath.Join(dir, "archive")
	port := 30000 + (os.Getpid()+11)%10000
	cfgPath := filepath.Join(dir, "collect.yaml")
	cfg := fmt.Sprintf(`host: xshost
spool: %s
pattern: "%%h-%%n.mgt"
rotate: {interval: 1s}
events: default,sched
filters: {port: %d}
ship: {interval: 200ms, retry_initial: 100ms, retry_max: 1s}
`, spool, port) + srv.TargetYAML(root)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(dir, "ready")
	var logs bytes.Buffer
	svc := runCollect(t, &logs, cfgPath, ready)

	// Every thread seen in the shipper's cgroup while the service runs.
	shipper := map[uint64]bool{}
	var mu sync.Mutex
	stop := make(chan struct{})
	watched := make(chan struct{})
	threads := filepath.Join(cgRoot, fmt.Sprintf("magnet-collect-%d", svc.Process.Pid), "cgroup.threads")
	go func() {
		defer close(watched)
		for {
			if data, err := os.ReadFile(threads); err == nil {
				mu.Lock()
				for _, f := range strings.Fields(string(data)) {
					if n, err := strconv.ParseUint(f, 10, 32); err == nil {
						shipper[n] = true
					}
				}
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	waitFor(t, func() bool { _, err := os.Stat(ready); return err == nil })

	addr := fmt.Sprintf("%s:%d", lab.Server.Addr, port)
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
	// Traffic until files have shipped while it flowed.
	sent := 0
	for manifests() < 3 {
		_, srvOut := serveTCP(t, lab, addr) // one connection each
		cli := lab.Command(lab.Client, bin, "workload", "send", "--proto", "tcp", "--to", addr, "--count", "100", "--size", "10240", "--interval", "5ms")
		if o, err := cli.CombinedOutput(); err != nil {
			t.Fatalf("client: %v %s", err, o)
		}
		if !srvOut.Scan() || !strings.HasPrefix(srvOut.Text(), "received 1024000 bytes") {
			t.Fatalf("server: %q", srvOut.Text())
		}
		if sent++; sent > 40 {
			t.Fatalf("no 3 files shipped after %d transfers\n%s", sent, logs.String())
		}
	}
	svc.Process.Signal(syscall.SIGTERM)
	if err := svc.Wait(); err != nil {
		t.Fatalf("collect after SIGTERM: %v\n%s", err, logs.String())
	}
	close(stop)
	<-watched
	if len(shipper) == 0 {
		t.Fatal("no thread seen in the shipper's cgroup")
	}

	evPath := filepath.Join(dir, "ev.jsonl")
	if r := magnet(t, "export", root, "--host", "xshost", "-f", "jsonl", "-o", evPath); r.code != 0 {
		t.Fatalf("export from the archive: %s", r.stderr)
	}
	f, err := os.Open(evPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Fields that name a thread or a process.
	names := []string{"pid", "tid", "next_tid", "next_pid", "target_tid", "child_tid", "child_pid"}
	counts := map[string]int{}
	var bad []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("export line %q: %v", sc.Text(), err)
		}
		name, _ := ev["event"].(string)
		counts[name]++
		// A thread the shipper forks is the shipper's too.
		if name == "sched_fork" && shipper[uint64(num(ev["tid"]))] {
			shipper[uint64(num(ev["child_tid"]))] = true
		}
		for _, k := range names {
			if v, ok := ev[k]; ok && v != nil && shipper[uint64(num(v))] {
				if len(bad) < 10 {
					bad = append(bad, sc.Text())
				}
				counts["bad"]++
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if counts["bad"] > 0 {
		t.Fatalf("%d events name a thread of the shipper (threads %v), e.g.\n%s", counts["bad"], keys(shipper), strings.Join(bad, "\n"))
	}
	if counts["sock_send"] < 100*sent || counts["sched_switch"] == 0 || counts["sched_wakeup"] == 0 {
		t.Fatalf("the traces miss the traffic or the sched events: %v (%d transfers)", counts, sent)
	}
	t.Logf("%d transfers, %d shipper threads watched; events %v: none of the shipper's", sent, len(shipper), counts)
}

func num(v any) float64 {
	f, _ := v.(float64)
	return f
}

func keys(m map[uint64]bool) []uint64 {
	var out []uint64
	for k := range m {
		out = append(out, k)
	}
	return out
}
