// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/record"
)

// progMisses reads, through procfs rather than the bpf(2) call the
// recorder uses, the recursion misses of every BPF program this process
// holds open: all of them are the recorder's.
func progMisses(t *testing.T) (progs int, misses uint64) {
	t.Helper()
	paths, err := filepath.Glob("/proc/self/fdinfo/*")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue // an fd closed since the glob
		}
		isProg, n := false, uint64(0)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			switch k {
			case "prog_type":
				isProg = true
			case "recursion_misses":
				n, _ = strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			}
		}
		f.Close()
		if isProg {
			progs++
			misses += n
		}
	}
	return progs, misses
}

// TestRecursionMissesReported: the kernel skips a tracepoint program that
// is already running on the CPU (an interrupt over it, or the softirqs run
// as the interrupt ends, reaching its tracepoint again: tcp_probe runs in
// process context for the socket backlog, and the softirq that interrupts
// it receives segments of other connections). Those events were never
// made, so "lost 0" does not cover them: the recording must say how many
// runs were skipped. Many parallel flows with every group on provoke it;
// the count is checked against the programs' fdinfo.
func TestRecursionMissesReported(t *testing.T) {
	needRoot(t)
	needTools(t, "iperf3")
	lab := netlab.ForTest(t, netlab.Options{Name: "mgmiss"})
	groups := event.DefaultGroups | event.GroupHeaders | event.GroupTCPSend | event.GroupSched | event.GroupRate
	statusDir := t.TempDir()
	var res *record.Result
	var inProc uint64
	// Each attempt records a few seconds of 16 flows; misses are a matter
	// of an interrupt landing inside a program, so a run may see none.
	for attempt := 1; attempt <= 4; attempt++ {
		port := uniquePort()
		rec := startRecording(t, record.Config{Groups: groups, StatusDir: statusDir})
		srv := iperf3Server(t, lab, lab.Server, port)
		iperf3Client(t, lab, lab.Client, lab.Server.Addr, port, "-P", "16", "-t", "3")
		srv.Wait()
		var progs int
		progs, inProc = progMisses(t)
		sts, err := record.ReadStatuses(statusDir)
		if err != nil || len(sts) != 1 {
			t.Fatalf("status: %v %v", sts, err)
		}
		res = rec.stop(t)
		_, _, sum := readTrace(t, rec.path)
		var byProg uint64
		for _, n := range res.MissedBy {
			byProg += n
		}
		t.Logf("attempt %d: %d programs, fdinfo misses %d; recorder: missed %d %v, status %d", attempt, progs, inProc, res.Missed, res.MissedBy, sts[0].Missed)
		if progs == 0 {
			t.Fatal("no BPF program found in /proc/self/fdinfo")
		}
		if sum.Missed == nil || *sum.Missed != res.Missed {
			t.Fatalf("trace summary missed %v, the recorder's %d", sum.Missed, res.Missed)
		}
		if byProg != res.Missed {
			t.Fatalf("missed by program %v sum to %d, total %d", res.MissedBy, byProg, res.Missed)
		}
		// The programs keep running (on other tests' traffic too) between
		// the fdinfo read and the stop: the recorder's count, taken last,
		// may only be larger.
		if res.Missed < inProc || sts[0].Missed > res.Missed {
			t.Fatalf("recorder says %d missed, fdinfo %d before it, the status %d", res.Missed, inProc, sts[0].Missed)
		}
		if res.Missed > 0 {
			break
		}
	}
	if res.Missed == 0 {
		t.Errorf("no recursion miss in 4 runs of 16 flows: none provoked, or not counted (fdinfo: %d)", inProc)
	}
}

// TestNoMissesWhenQuiet: a recording of a small transfer says, in the
// result and in the trace, what the kernel says: 0 unless another test's
// traffic made one of the programs miss a run meanwhile.
func TestNoMissesWhenQuiet(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgquiet"})
	port := uniquePort()
	rec := startRecording(t, record.Config{Filters: record.Filters{Port: port}, Groups: event.DefaultGroups})
	addr := fmt.Sprintf("%s:%d", lab.Server.Addr, port)
	srv, _ := serve(t, lab, lab.Server, "--proto", "tcp", "--listen", addr)
	run(t, lab.Command(lab.Client, magnetBin, "workload", "send", "--proto", "tcp", "--to", addr, "--count", "10", "--size", "1000"))
	srv.Wait()
	_, inProc := progMisses(t)
	res := rec.stop(t)
	_, _, sum := readTrace(t, rec.path)
	if sum.Missed == nil {
		t.Fatal("trace summary has no missed count")
	}
	t.Logf("missed: recorder %d, fdinfo %d", res.Missed, inProc)
	if res.Missed < inProc || *sum.Missed != res.Missed {
		t.Errorf("missed: recorder %d, trace %d, fdinfo %d", res.Missed, *sum.Missed, inProc)
	}
}
