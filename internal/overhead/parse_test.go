// SPDX-License-Identifier: Apache-2.0

package overhead

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseStat(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice:
	// busy = 100+2+30+4+5 - (7+1); not busy = idle + iowait + steal.
	stat := "cpu  100 2 30 5000 60 4 5 99 7 1\ncpu0 50 1 15 2500 30 2 2 50 3 0\ncpu1 50 1 15 2500 30 2 3 49 4 1\nintr 1 2 3\n"
	st, err := parseStat(strings.NewReader(stat))
	if err != nil || st != (cpuStat{busy: 133, notBusy: 5159, cpus: 2}) {
		t.Fatalf("parseStat = %+v, %v; want busy 133, not busy 5159, 2 CPUs", st, err)
	}
	// An older kernel without the guest columns.
	st, err = parseStat(strings.NewReader("cpu 10 0 5 100 0 1 1 0\n"))
	if err != nil || st.busy != 17 || st.notBusy != 100 {
		t.Fatalf("parseStat(8 columns) = %+v, %v; want busy 17, not busy 100", st, err)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8\n", "cpu 1 2 3\n", "cpu 1 x 3 4 5 6 7 8\n"} {
		if _, err := parseStat(strings.NewReader(bad)); err == nil {
			t.Errorf("parseStat(%q) accepted", bad)
		}
	}
	if ticksSeconds(250) != 2.5 {
		t.Error("ticksSeconds(250) != 2.5")
	}
}

// TestBusyBetween: over 2 s of 2 CPUs (4 CPU-seconds), 3.2 s idle, 0.1
// iowait and 0.1 steal leave 0.6 s busy, whatever the busy columns
// sampled (here 0.5 s).
func TestBusyBetween(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := cpuSample{at: t0, stat: cpuStat{busy: 1000, notBusy: 5000, cpus: 2}}
	b := cpuSample{at: t0.Add(2 * time.Second), stat: cpuStat{busy: 1050, notBusy: 5340, cpus: 2}}
	precise, ticked := busyBetween(a, b)
	if math.Abs(precise-0.6) > 1e-9 || math.Abs(ticked-0.5) > 1e-9 {
		t.Errorf("busyBetween = %v, %v; want 0.6, 0.5", precise, ticked)
	}
	// Idle read past the wall clock (the reads' 10 ms units): never below 0.
	b.stat.notBusy = 5500
	if p, _ := busyBetween(a, b); p != 0 {
		t.Errorf("busyBetween with more idle than time = %v, want 0", p)
	}
}

// TestBusyPrecise: on this host, the precise busy time of a busy loop on
// one thread is its run time, give or take the 10 ms units of /proc/stat
// and whatever else ran.
func TestBusyPrecise(t *testing.T) {
	a, err := sampleCPU()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
	}
	b, err := sampleCPU()
	if err != nil {
		t.Fatal(err)
	}
	precise, ticked := busyBetween(a, b)
	t.Logf("a 300 ms busy loop: precise %.3f s, ticked %.3f s", precise, ticked)
	if precise < 0.28 {
		t.Errorf("precise busy %.3f s over a 300 ms busy loop", precise)
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add("cpu  100 2 30 5000 60 4 5 99 7 1\ncpu0 1 2 3 4 5 6 7 8\n")
	f.Add("cpu 1 2\n")
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = parseStat(strings.NewReader(s))
	})
}

// procCPU sums the threads' run time in nanoseconds: a busy loop of a few
// milliseconds shows, where /proc/PID/stat's 10 ms ticks may not.
func TestProcCPU(t *testing.T) {
	// Busy until the process has run 5 ms by getrusage, not by the wall
	// clock: a loaded machine may leave the loop off-CPU for most of it.
	cpu := func() time.Duration {
		var ru unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before, ru0 := procCPU(os.Getpid()), cpu()
	for cpu()-ru0 < 5*time.Millisecond {
	}
	after := procCPU(os.Getpid())
	if after < before+4_000_000 {
		t.Errorf("procCPU went from %d to %d ns over a busy loop of 5 ms of CPU", before, after)
	}
	if procCPU(0) != 0 {
		t.Error("procCPU(0) != 0")
	}
}

func TestParseProgFdinfo(t *testing.T) {
	prog := "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t1057\nprog_type:\t26\nprog_jited:\t1\nprog_tag:\t0123456789abcdef\nmemlock:\t4096\nprog_id:\t889\nrun_time_ns:\t1730659\nrun_cnt:\t13088\nrecursion_misses:\t0\nverified_insns:\t420\n"
	id, c, ok := parseProgFdinfo(strings.NewReader(prog))
	if !ok || id != 889 || c.RunNs != 1730659 || c.Runs != 13088 || c.Type != "Tracing" {
		t.Fatalf("program: %d %+v %v", id, c, ok)
	}
	// A link names its program but is not one.
	link := "pos:\t0\nlink_type:\ttracing\nlink_id:\t12\nprog_tag:\t0123456789abcdef\nprog_id:\t889\n"
	if _, _, ok := parseProgFdinfo(strings.NewReader(link)); ok {
		t.Error("a link's fdinfo read as a program's")
	}
	if _, _, ok := parseProgFdinfo(strings.NewReader("pos:\t0\nflags:\t0\n")); ok {
		t.Error("a file's fdinfo read as a program's")
	}
}

func TestProgDiff(t *testing.T) {
	before := map[uint32]progCounts{1: {Type: "tracing", RunNs: 1000, Runs: 10}, 2: {RunNs: 50, Runs: 1}}
	after := map[uint32]progCounts{1: {Type: "tracing", RunNs: 5000, Runs: 60}, 2: {RunNs: 50, Runs: 1}, 3: {RunNs: 900, Runs: 3}}
	got := progDiff(before, after, 2)
	// Program 2 did not run; 1 ran 50 times for 4000 ns, 3 (new) 3 for 900.
	if len(got) != 2 {
		t.Fatalf("progDiff = %+v", got)
	}
	if got[0].Runs != 50 || got[0].NsPerRun != 80 || got[0].NsPerGB != 2000 || got[1].Runs != 3 || got[1].NsPerGB != 450 {
		t.Errorf("progDiff = %+v", got)
	}
}

func TestParseIperf3(t *testing.T) {
	js := `{"start":{},"end":{"sum_sent":{"bytes":500000000,"seconds":1.0},"sum_received":{"bytes":499000000,"seconds":1.002}}}`
	x, err := parseIperf3([]byte(js))
	if err != nil || x.Sent != 500000000 || x.Received != 499000000 || x.Seconds != 1.002 {
		t.Fatalf("parseIperf3 = %+v, %v", x, err)
	}
	for _, bad := range []string{`{"error":"unable to connect to server: Connection refused"}`, `{"end":{}}`, `not json`} {
		if _, err := parseIperf3([]byte(bad)); err == nil {
			t.Errorf("parseIperf3(%s) accepted", bad)
		}
	}
}

func TestSelect(t *testing.T) {
	cs, err := Select("tcpdump,record-sock,record")
	if err != nil {
		t.Fatal(err)
	}
	// The baseline first, then in Configs' order.
	if got := strings.Join(Names(cs), ","); got != "baseline,record-sock,record,tcpdump" {
		t.Errorf("Select = %s", got)
	}
	if _, err := Select("record,strace"); err == nil {
		t.Error("unknown configuration accepted")
	}
	all := Names(Configs())
	for _, want := range []string{"baseline", "record-conn", "record-sock", "record-tcp", "record-tcpstate", "record-ip", "record-dev", "record-drop", "record", "tcpdump", "perf", "bpftrace"} {
		found := false
		for _, n := range all {
			found = found || n == want
		}
		if !found {
			t.Errorf("Configs lacks %s: %v", want, all)
		}
	}
}
