// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/kevent"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/internal/witness"
)

// kevTestC is a program whose kernel events are known in advance: it
// renames itself five times (task:task_rename), writes five buffers of
// known sizes to /dev/null (syscalls:sys_enter_write), calls mg_mark seven
// times with known arguments (a uprobe), then executes argv[1]
// (sched:sched_process_exec).
const kevTestC = `
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline)) long mg_mark(long a, long b)
{
	__asm__ volatile("" ::: "memory");
	return a + b;
}

int main(int argc, char **argv)
{
	char name[16];
	static char buf[400];
	int sizes[] = {50, 150, 300, 101, 100};
	long s = 0;
	if (argc > 2 && strcmp(argv[1], "getppid") == 0) {
		long n = atol(argv[2]);
		for (long i = 0; i < n; i++)
			s += getppid();
		return s == 0;
	}
	for (int i = 0; i < 5; i++) {
		snprintf(name, sizeof name, "mgname%d", i);
		prctl(PR_SET_NAME, name);
	}
	int fd = open("/dev/null", O_WRONLY);
	for (int i = 0; i < 5; i++)
		if (write(fd, buf, sizes[i]) != sizes[i])
			return 2;
	for (long i = 1; i <= 7; i++)
		s += mg_mark(i, i * i);
	if (argc > 1)
		execl(argv[1], argv[1], (char *)0);
	return s == 0;
}
`

// buildKevTest compiles kevTestC and returns the binary's path.
func buildKevTest(t *testing.T) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		if cc, err = exec.LookPath("clang"); err != nil {
			t.Skip("no C compiler to build the test program")
		}
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "kevtest.c")
	if err := os.WriteFile(src, []byte(kevTestC), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "kevtest")
	if out, err := exec.Command(cc, "-O1", "-g", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("build test program: %v\n%s", err, out)
	}
	return bin
}

func kernelSpecs(t *testing.T, tracepoints, uprobes []string) []kevent.Spec {
	t.Helper()
	var specs []kevent.Spec
	for _, v := range tracepoints {
		s, err := kevent.ParseTracepoint(v)
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, s)
	}
	for _, v := range uprobes {
		s, err := kevent.ParseUprobe(v)
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, s)
	}
	return specs
}

// TestKernelEventsDecoded records three tracepoints whose fields are of
// different types (a signed int, fixed char arrays and a short; a
// __data_loc string; 8-byte integers behind a kernel filter, beside a
// pointer that must not be recorded) and a uprobe, for a command whose
// every such event is known: the trace must hold exactly those, decoded
// exactly, and account for every event produced.
func TestKernelEventsDecoded(t *testing.T) {
	needRoot(t)
	bin := buildKevTest(t)
	rec := startRecording(t, record.Config{
		Groups:  event.GroupConn,
		Command: []string{bin, "/bin/true"},
		KernelEvents: kernelSpecs(t, []string{
			"task:task_rename",
			"sched:sched_process_exec",
			"syscalls:sys_enter_write if count > 100 && count < 400 || count == 50",
		}, []string{bin + ":mg_mark"}),
	})
	<-rec.done
	if rec.err != nil {
		t.Fatal(rec.err)
	}
	var renames, execs, writes []string
	var marks [][2]uint64
	var cmdPid uint32
	sum := eachRecord(t, rec.path, func(rc trace.Record) {
		switch rc.Type.Name {
		case "task_rename":
			pid, _ := rc.Int("pid")
			oldc, _ := rc.Str("oldcomm")
			newc, _ := rc.Str("newcomm")
			adj, ok := rc.Int("oom_score_adj")
			if !ok || int64(rc.TID()) != pid {
				t.Errorf("task_rename: pid %d, tid %d, oom_score_adj %v", pid, rc.TID(), ok)
			}
			cmdPid = uint32(pid)
			renames = append(renames, oldc+">"+newc+":"+itoa(adj))
		case "sched_process_exec":
			fn, _ := rc.Str("filename")
			pid, _ := rc.Int("pid")
			old, _ := rc.Int("old_pid")
			execs = append(execs, fn+":"+itoa(pid-old))
		case "sys_enter_write":
			n, _ := rc.Uint("count")
			if _, ok := rc.Uint("buf"); ok {
				t.Error("sys_enter_write: the buf pointer is in the dictionary")
			}
			nr, _ := rc.Int("__syscall_nr")
			writes = append(writes, itoa(int64(n))+"/"+itoa(nr))
		case "mg_mark":
			a, _ := rc.Uint("arg0")
			b, _ := rc.Uint("arg1")
			marks = append(marks, [2]uint64{a, b})
		}
	})
	// The recorder's child takes the command's name when it executes it,
	// and the command takes true's.
	if got, want := strings.Join(renames, " "), "kevtest>mgname0:0 mgname0>mgname1:0 mgname1>mgname2:0 mgname2>mgname3:0 mgname3>mgname4:0 mgname4>true:0"; len(renames) != 7 || !strings.HasSuffix(renames[0], ">kevtest:0") || strings.Join(renames[1:], " ") != want {
		t.Errorf("task_rename: %s, want RECORDER>kevtest:0 %s", got, want)
	}
	if got, want := strings.Join(execs, " "), bin+":0 /bin/true:0"; got != want {
		t.Errorf("sched_process_exec: %s, want %s (filename and pid - old_pid)", got, want)
	}
	if got, want := strings.Join(writes, " "), "50/1 150/1 300/1 101/1"; got != want {
		t.Errorf("sys_enter_write with the filter: %s, want %s (count/syscall number)", got, want)
	}
	if len(marks) != 7 {
		t.Fatalf("mg_mark: %d calls recorded, want 7", len(marks))
	}
	for i, m := range marks {
		if n := uint64(i + 1); m != [2]uint64{n, n * n} {
			t.Errorf("mg_mark call %d: args %v, want %d, %d", i+1, m, n, n*n)
		}
	}
	if cmdPid == 0 {
		t.Fatal("no task_rename")
	}
	// Every event produced is in the trace or counted lost.
	produced, _ := sum.Extra["produced"].(map[string]any)
	for _, name := range []string{"task_rename", "sched_process_exec", "sys_enter_write", "mg_mark"} {
		p, _ := produced[name].(float64)
		if uint64(p) != sum.Events[name] || rec.res.LostBy[name] != 0 {
			t.Errorf("%s: produced %v, recorded %d, lost %d", name, produced[name], sum.Events[name], rec.res.LostBy[name])
		}
	}
	noKernelAddresses(t, rec.path)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// setGRO turns GRO on for iface in h's namespace (ETHTOOL_SGRO): a veth
// then receives through NAPI.
func setGRO(t *testing.T, h netlab.Host) {
	t.Helper()
	err := h.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		val := [2]uint32{0x2c, 1} // ETHTOOL_SGRO, on
		var ifr [40]byte
		copy(ifr[:16], h.Iface)
		*(*uintptr)(unsafe.Pointer(&ifr[16])) = uintptr(unsafe.Pointer(&val))
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
			return e
		}
		return nil
	})
	if err != nil {
		t.Fatalf("turn GRO on: %v", err)
	}
}

func rxPackets(t *testing.T, h netlab.Host) uint64 {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", h.NS, "cat", "/sys/class/net/"+h.Iface+"/statistics/rx_packets").Output()
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestReceivePathGroups records --events default,irq,napi over a veth
// transfer whose receiver has GRO on (veth then receives through NAPI):
// the NAPI polls must account for at least every packet the receiving veth
// counted (other devices' polls add to them: this kernel names no device
// in napi_poll), every poll within its budget, and NET_RX softirqs around
// them. A veth has no interrupt line: hard interrupts are those of the
// host's own NICs, if any, each one recorded exactly when a bpftrace
// witness saw it.
func TestReceivePathGroups(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgnapi"})
	setGRO(t, lab.Server)
	_, specs, _, err := kevent.SplitGroups("default,irq,napi")
	if err != nil {
		t.Fatal(err)
	}
	irqs := kevent.NetIRQs()
	// bpftrace on the same tracepoint is the witness: its program runs in
	// the same call as magnet's, so a run the kernel skips (it does, on
	// this VM, with nothing counted: bpftrace alone saw 245 and 205 of
	// /proc/interrupts' 248 and 211 in 150 s) is skipped for both.
	var wit *irqWitness
	if len(irqs) > 0 {
		wit = startIRQWitness(t, irqs)
	}
	irqA := interrupts(t, irqs)
	before := rxPackets(t, lab.Server)
	rec := startRecording(t, record.Config{Groups: event.DefaultGroups, KernelEvents: specs})
	attached := monotonic(t)
	irqB := interrupts(t, irqs)
	ftp(t, lab, "tcp", uniquePort(), 200)
	// Name look-ups go out through the host's NIC (the resolver is on
	// its network; a registry's name, which the tests may look up
	// anyway): its interrupt lines then have work while recording.
	for i := 0; i < 3; i++ {
		_, _ = net.DefaultResolver.LookupHost(t.Context(), "proxy.golang.org")
	}
	after := rxPackets(t, lab.Server)
	irqC := interrupts(t, irqs)
	detach := monotonic(t)
	res := rec.stop(t)
	irqD := interrupts(t, irqs)
	if wit != nil {
		// magnet's interrupts are the witness's while magnet was attached:
		// every one of them is the witness's (it was attached longer),
		// and every one of the witness's between magnet's attach and
		// detach is magnet's. /proc/interrupts less the witness are the
		// runs the kernel skipped.
		seen := wit.stop(t)
		lines := map[int]bool{}
		for _, n := range irqs {
			lines[n] = true
		}
		var got []irqRun
		eachRecord(t, rec.path, func(rc trace.Record) {
			if n, _ := rc.Int("irq"); rc.Type.Name == "irq_handler_entry" && lines[int(n)] {
				got = append(got, irqRun{int(n), int(rc.CPU()), rc.Time()})
			}
		})
		onlyMagnet, onlyWitness, inWindow := matchIRQs(got, seen, attached, detach)
		for _, r := range onlyMagnet {
			t.Errorf("irq %d on CPU %d at %d: recorded, the witness has no such run", r.irq, r.cpu, r.t)
		}
		// A run lost by magnet alone (its ring full: counted) is the one
		// way to miss one the witness has; a run the kernel skipped
		// (bpf_prog_active: counted as lost too) is skipped for both.
		if lost := res.LostBy["irq_handler_entry"]; uint64(len(onlyWitness)) > lost {
			for _, r := range onlyWitness {
				t.Errorf("irq %d on CPU %d at %d: the witness's, while recording, not recorded (%d lost)", r.irq, r.cpu, r.t, lost)
			}
		}
		t.Logf("hard interrupts of lines %v: %d recorded; the witness %d of them while recording (%d in all); /proc/interrupts %d while recording, so the kernel skipped about %d",
			irqs, len(got), inWindow, len(seen), irqC-irqB, int64(irqC-irqB)-int64(inWindow))
	}
	if n := res.Events["irq_handler_entry"]; len(irqs) > 0 && n > irqD-irqA {
		t.Errorf("hard interrupts of lines %v: %d recorded, more than /proc/interrupts' %d around the recording", irqs, n, irqD-irqA)
	}
	var polls, work uint64
	softirq := map[string]uint64{}
	type softRun struct {
		t    uint64
		exit bool
	}
	netRx := map[uint16][]softRun{} // by CPU
	eachRecord(t, rec.path, func(rc trace.Record) {
		switch rc.Type.Name {
		case "napi_poll":
			w, _ := rc.Int("work")
			b, _ := rc.Int("budget")
			if w < 0 || w > b || b <= 0 {
				t.Errorf("napi_poll: work %d, budget %d", w, b)
			}
			polls++
			work += uint64(w)
		case "softirq_entry", "softirq_exit":
			v, _ := rc.Uint("vec")
			if v != 2 && v != 3 {
				t.Errorf("%s: vec %d, not NET_TX or NET_RX", rc.Type.Name, v)
			}
			softirq[rc.Type.Name+itoa(int64(v))]++
			if v == 3 {
				netRx[rc.CPU()] = append(netRx[rc.CPU()], softRun{rc.Time(), rc.Type.Name == "softirq_exit"})
			}
		}
	})
	// The NET_RX softirqs seen whole: on each CPU, an entry whose next
	// NET_RX event is its exit. The kernel skips runs of these
	// tracepoints, some counted (lost), some not (beside other recordings:
	// 23,588 entries against 28,401 exits, none lost), so the counts of
	// entries and exits do not tell how many pair; the trace does.
	var whole uint64
	for _, runs := range netRx {
		sort.SliceStable(runs, func(i, j int) bool { return runs[i].t < runs[j].t })
		for i := 1; i < len(runs); i++ {
			if runs[i].exit && !runs[i-1].exit {
				whole++
			}
		}
	}
	t.Logf("veth rx %d packets; %d NAPI polls took %d; softirqs %v; hard irqs %d/%d", after-before, polls, work, softirq, res.Events["irq_handler_entry"], res.Events["irq_handler_exit"])
	if after-before < 200 || work < after-before {
		t.Errorf("NAPI polls took %d packets, the receiving veth counted %d", work, after-before)
	}
	if softirq["softirq_entry3"] == 0 || softirq["softirq_exit3"] == 0 {
		t.Errorf("no NET_RX softirq: %v", softirq)
	}
	// The report's receive path: the same polls and packets, every NET_RX
	// softirq paired, and the connection's received packets (dev_recv on
	// the veth, inside NAPI polls) all placed in polls.
	rep, err := analyze.Modulation([]string{rec.path}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.ReceivePath) != 1 {
		t.Fatalf("report: %d receive paths", len(rep.ReceivePath))
	}
	rp := rep.ReceivePath[0]
	// A softirq pairs its entry and exit; one whose entry or exit the
	// kernel skipped, or that began before the recording, is not paired.
	if rp.All.Polls != polls || rp.All.Packets != work || rp.All.NetRx != whole || rp.All.NetRxShare <= 0 || rp.All.NapiNs > rp.All.NetRxNs {
		t.Errorf("receive path: %+v, want %d polls, %d packets, %d NET_RX softirqs (entries %d, exits %d, lost %d and %d), NAPI time within NET_RX time",
			rp.All, polls, work, whole, softirq["softirq_entry3"], softirq["softirq_exit3"], res.LostBy["softirq_entry"], res.LostBy["softirq_exit"])
	}
	// The Perfetto timeline: a slice per NET_RX softirq, an instant per
	// poll.
	var pf bytes.Buffer
	if _, err := analyze.WritePerfetto(&pf, []string{rec.path}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []struct {
			Ph, Name string
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(pf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	marks := map[string]uint64{}
	for _, e := range doc.TraceEvents {
		marks[e.Ph+" "+e.Name]++
	}
	if marks["B NET_RX"] != softirq["softirq_entry3"] || marks["E NET_RX"] != softirq["softirq_exit3"] || marks["i napi_poll"] != polls {
		t.Errorf("perfetto: %v, want %d NET_RX slices and %d polls", marks, softirq["softirq_entry3"], polls)
	}
	devRecv := map[uint64]uint64{}
	eachRecord(t, rec.path, func(rc trace.Record) {
		if rc.Type.Name == "dev_recv" && rc.Conn() != 0 && rc.NetNS() == lab.Server.NetNSInode {
			devRecv[rc.Conn()]++
		}
	})
	matched := 0
	for _, c := range rp.Conns {
		if n, ok := devRecv[c.Conn]; ok {
			matched++
			if c.Packets != n || c.Polls == 0 || c.Polls > c.Packets {
				t.Errorf("connection %d: %d packets in %d polls, dev_recv %d", c.Conn, c.Packets, c.Polls, n)
			}
		}
	}
	if matched == 0 {
		t.Errorf("no receiving connection in the receive path (%d connections, dev_recv %v)", len(rp.Conns), devRecv)
	}
	for _, name := range []string{"napi_poll", "softirq_entry", "softirq_exit", "irq_handler_entry", "irq_handler_exit"} {
		if res.Produced[name] != res.Events[name]+res.LostBy[name] {
			t.Errorf("%s: produced %d, recorded %d + lost %d", name, res.Produced[name], res.Events[name], res.LostBy[name])
		}
	}
}

// TestKernelEventErrors: an unknown tracepoint, a bad filter, a uprobe on
// a symbol the binary lacks and a kprobe on this kernel each fail the
// recording before anything is recorded, with one line.
func TestKernelEventErrors(t *testing.T) {
	needRoot(t)
	bin := buildKevTest(t)
	for _, tc := range []struct {
		spec []kevent.Spec
		want string
	}{
		{kernelSpecs(t, []string{"napi:no_such_poll"}, nil), "no such tracepoint"},
		{kernelSpecs(t, []string{"napi:napi_poll if wrk > 1"}, nil), `no field "wrk"`},
		{kernelSpecs(t, []string{"napi:napi_poll if dev_name == 1"}, nil), "cannot be tested"},
		{kernelSpecs(t, nil, []string{bin + ":no_such_function"}), "no_such_function"},
	} {
		out := filepath.Join(t.TempDir(), "x.mgt")
		_, err := record.Run(t.Context(), record.Config{Output: out, StatusDir: t.TempDir(), KernelEvents: tc.spec, Duration: 1})
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error %v, want one line with %q", tc.spec, err, tc.want)
		}
		if _, serr := os.Stat(out); !os.IsNotExist(serr) && !strings.Contains(tc.want, "no_such_function") {
			t.Errorf("%v: output created for a recording that could not start", tc.spec)
		}
	}
	k, err := kevent.ParseKprobe("tcp_sendmsg")
	if err != nil {
		t.Fatal(err)
	}
	_, err = record.Run(t.Context(), record.Config{Output: filepath.Join(t.TempDir(), "x.mgt"), StatusDir: t.TempDir(), KernelEvents: []kevent.Spec{k}})
	if err == nil || !strings.Contains(err.Error(), "kprobe tcp_sendmsg") {
		t.Errorf("kprobe: %v", err)
	}
}

// TestKernelEventsLoss floods a kernel event into a ring far too small for
// it: losses must be counted per event, marked in place by kevent_lost
// records whose counts add up to them, and recorded + lost == produced.
func TestKernelEventsLoss(t *testing.T) {
	needRoot(t)
	bin := buildKevTest(t)
	const calls = 300000
	rec := startRecording(t, record.Config{
		Groups:      event.GroupConn,
		BufferBytes: 64 << 10,
		// Never woken by BPF and polled once a second, the recorder
		// cannot keep up with the flood, however idle the host: losses
		// are certain rather than a matter of load.
		WakeupFill:   1,
		PollInterval: time.Second,
		Command:      []string{bin, "getppid", strconv.Itoa(calls)},
		KernelEvents: kernelSpecs(t, []string{"syscalls:sys_enter_getppid"}, nil),
	})
	<-rec.done
	if rec.err != nil {
		t.Fatal(rec.err)
	}
	res := rec.res
	var inStream uint64
	sum := eachRecord(t, rec.path, func(rc trace.Record) {
		if rc.Type.Name == kevent.LostName {
			n, _ := rc.Uint("n_sys_enter_getppid")
			total, _ := rc.Uint("total")
			if n != total {
				t.Errorf("kevent_lost: total %d, n_sys_enter_getppid %d", total, n)
			}
			inStream += n
		}
	})
	name := "sys_enter_getppid"
	t.Logf("%d calls: produced %d, recorded %d, lost %d (%d kevent_lost records)", calls, res.Produced[name], sum.Events[name], res.LostBy[name], sum.Events[kevent.LostName])
	if res.Produced[name] != calls {
		t.Errorf("produced %d, the program called getppid %d times", res.Produced[name], calls)
	}
	if res.LostBy[name] == 0 || sum.Events[name]+res.LostBy[name] != res.Produced[name] {
		t.Errorf("recorded %d + lost %d, produced %d (want losses, and the sum exact)", sum.Events[name], res.LostBy[name], res.Produced[name])
	}
	if inStream != res.LostBy[name] || sum.Lost != res.Lost {
		t.Errorf("kevent_lost records count %d, lost %d; summary lost %d, result %d", inStream, res.LostBy[name], sum.Lost, res.Lost)
	}
}

// TestUSDT records the Python interpreter's own gc__start probe (its
// argument, the generation, read from memory: -4@112(%rsp)) for a script
// that disables automatic collection and collects generation 1 five
// times: exactly five gc__start events with generation 1.
func TestUSDT(t *testing.T) {
	needRoot(t)
	py, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Skip("no /usr/bin/python3")
	}
	spec, err := kevent.ParseUSDT(py + ":python:gc__start")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kevent.Plan([]kevent.Spec{spec}, func(string) bool { return false }); err != nil {
		if strings.Contains(err.Error(), "no USDT probes") || strings.Contains(err.Error(), "no such probe") {
			t.Skipf("this Python has no gc__start probe: %v", err)
		}
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "gc.py")
	if err := os.WriteFile(script, []byte("import gc\ngc.disable()\nfor _ in range(5):\n    gc.collect(1)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rec := startRecording(t, record.Config{Groups: event.GroupConn, Command: []string{py, script}, KernelEvents: []kevent.Spec{spec}})
	<-rec.done
	if rec.err != nil {
		t.Fatal(rec.err)
	}
	gens := map[int64]int{}
	eachRecord(t, rec.path, func(rc trace.Record) {
		if rc.Type.Name == "gc__start" {
			g, _ := rc.Int("arg0")
			gens[g]++
		}
	})
	if gens[1] != 5 {
		t.Errorf("gc__start by generation: %v, want 5 of generation 1", gens)
	}
}

// TestTracepointAgainstBpftrace: three tracepoints whose fields are of
// different types, seen by bpftrace, an independent reader of the same
// tracepoints, and by a recording: task:task_rename (an int, char[16]
// arrays, a short), sched:sched_process_exec (a __data_loc string and
// ints) and syscalls:sys_enter_write (8-byte integers beside a pointer
// magnet does not record). Every such event of the test program (its two
// executions, six renames and five writes), field by field.
func TestTracepointAgainstBpftrace(t *testing.T) {
	needRoot(t)
	bt, err := exec.LookPath("bpftrace")
	if err != nil {
		t.Skip("no bpftrace")
	}
	bin := buildKevTest(t)
	rec := startRecording(t, record.Config{Groups: event.GroupConn, KernelEvents: kernelSpecs(t,
		[]string{"task:task_rename", "sched:sched_process_exec", "syscalls:sys_enter_write if count < 1000"}, nil)})
	// BEGIN runs once every probe is attached. The program's writes are
	// made under its last name, mgname4: bpftrace prints only those, so
	// that its own output makes no writes it would print.
	btCmd := exec.Command(bt, "-e", `BEGIN { printf("READY\n"); }
tracepoint:task:task_rename { printf("R %d %s %s %d\n", args->pid, args->oldcomm, args->newcomm, args->oom_score_adj); }
tracepoint:sched:sched_process_exec { printf("E %d %s %d\n", args->pid, str(args->filename), args->pid - args->old_pid); }
tracepoint:syscalls:sys_enter_write /comm == "mgname4"/ { printf("W %d %d %d %d\n", pid, args->__syscall_nr, args->fd, args->count); }`)
	out, err := btCmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := btCmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	defer func() {
		_ = btCmd.Process.Kill()
		_ = btCmd.Wait()
	}()
	next := func() (string, bool) {
		select {
		case l, ok := <-lines:
			return l, ok
		case <-time.After(30 * time.Second):
			t.Fatal("bpftrace said nothing for 30 s")
			return "", false
		}
	}
	for {
		l, ok := next()
		if !ok {
			t.Fatal("bpftrace ended before it was ready")
		}
		if l == "READY" {
			break
		}
	}
	cmd := exec.Command(bin, "/bin/true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	// By kind: the exec of the test program and of /bin/true; the rename
	// at the first exec (the test's name to kevtest), the program's five
	// and the one at the second exec; five writes.
	want := map[byte][]string{}
	for len(want['R']) < 7 || len(want['E']) < 2 || len(want['W']) < 5 {
		l, ok := next()
		if !ok {
			t.Fatalf("bpftrace ended with %v for pid %s", want, pid)
		}
		if f := strings.Fields(l); len(f) > 1 && f[1] == pid {
			want[l[0]] = append(want[l[0]], l[2:])
		}
	}
	rec.stop(t)
	got := map[byte][]string{}
	eachRecord(t, rec.path, func(rc trace.Record) {
		switch rc.Type.Name {
		case "task_rename":
			p, _ := rc.Int("pid")
			o, _ := rc.Str("oldcomm")
			n, _ := rc.Str("newcomm")
			adj, _ := rc.Int("oom_score_adj")
			got['R'] = append(got['R'], itoa(p)+" "+o+" "+n+" "+itoa(adj))
		case "sched_process_exec":
			p, _ := rc.Int("pid")
			fn, _ := rc.Str("filename")
			old, _ := rc.Int("old_pid")
			got['E'] = append(got['E'], itoa(p)+" "+fn+" "+itoa(p-old))
		case "sys_enter_write":
			nr, _ := rc.Int("__syscall_nr")
			fd, _ := rc.Uint("fd")
			n, _ := rc.Uint("count")
			got['W'] = append(got['W'], strconv.FormatUint(uint64(rc.TID()), 10)+" "+itoa(nr)+" "+strconv.FormatUint(fd, 10)+" "+strconv.FormatUint(n, 10))
		}
	})
	for _, k := range []byte{'R', 'E', 'W'} {
		var mine []string
		for _, g := range got[k] {
			if strings.HasPrefix(g, pid+" ") {
				mine = append(mine, g)
			}
		}
		if strings.Join(mine, "\n") != strings.Join(want[k], "\n") {
			t.Errorf("%c: recorded:\n%s\nbpftrace:\n%s", k, strings.Join(mine, "\n"), strings.Join(want[k], "\n"))
		}
	}
	t.Logf("pid %s: %v", pid, want)
}

// interrupts sums /proc/interrupts' counts of the lines irqs over CPUs.
func interrupts(t *testing.T, irqs []int) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/interrupts")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, n := range irqs {
		want[strconv.Itoa(n)+":"] = true
	}
	var total uint64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !want[f[0]] {
			continue
		}
		for _, c := range f[1:] {
			n, err := strconv.ParseUint(c, 10, 64)
			if err != nil {
				break // the CPUs' columns end where the chip's name begins
			}
			total += n
		}
	}
	return total
}

// monotonic reads CLOCK_MONOTONIC, the clock of the trace's times and of
// bpftrace's nsecs.
func monotonic(t *testing.T) uint64 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}

// irqRun is one run of irq:irq_handler_entry: the line, the CPU and when.
type irqRun struct {
	irq, cpu int
	t        uint64
}

// irqWitness is bpftrace printing every run of irq:irq_handler_entry for
// some interrupt lines.
type irqWitness struct {
	cmd *exec.Cmd
	out *bufio.Reader
}

// startIRQWitness starts bpftrace on the lines irqs and returns once its
// probe is attached (its first interval tick comes after every probe is).
func startIRQWitness(t *testing.T, irqs []int) *irqWitness {
	t.Helper()
	var cond []string
	for _, n := range irqs {
		cond = append(cond, "args->irq == "+strconv.Itoa(n))
	}
	script := "tracepoint:irq:irq_handler_entry /" + strings.Join(cond, " || ") + "/ { printf(\"irq %d %d %llu\\n\", args->irq, cpu, nsecs); }\n" +
		"interval:ms:20 /@ticked == 0/ { @ticked = 1; printf(\"tick\\n\"); }\n"
	w := &irqWitness{}
	w.cmd, w.out = witness.StartBpftrace(t, script)
	return w
}

// stop ends bpftrace and returns the runs it printed. An interrupt printed
// before the first tick came before the recording started: not needed.
func (w *irqWitness) stop(t *testing.T) []irqRun {
	t.Helper()
	w.cmd.Process.Signal(os.Interrupt)
	b, _ := io.ReadAll(w.out)
	if err := w.cmd.Wait(); err != nil {
		t.Fatalf("bpftrace: %v\n%s", err, b)
	}
	var runs []irqRun
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) != 4 || f[0] != "irq" {
			continue
		}
		irq, err1 := strconv.Atoi(f[1])
		cpu, err2 := strconv.Atoi(f[2])
		ns, err3 := strconv.ParseUint(f[3], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("bpftrace printed %q", l)
		}
		runs = append(runs, irqRun{irq, cpu, ns})
	}
	return runs
}

// sameRunNs bounds the time between two programs' runs in one call of a
// tracepoint: they run one after the other, with interrupts off (a hard
// interrupt's handler), each taking microseconds.
const sameRunNs = 200_000

// matchIRQs pairs each recorded run with the witness's run of the same
// line and CPU nearest in time, within sameRunNs; it returns the recorded
// runs with no witness, the witness's runs between from and to with no
// record, and how many of the witness's runs were between from and to.
func matchIRQs(got, seen []irqRun, from, to uint64) (onlyGot, onlySeen []irqRun, inWindow int) {
	used := make([]bool, len(seen))
	for _, g := range got {
		best := -1
		var bestD uint64
		for i, s := range seen {
			if used[i] || s.irq != g.irq || s.cpu != g.cpu {
				continue
			}
			d := max(s.t, g.t) - min(s.t, g.t)
			if d <= sameRunNs && (best < 0 || d < bestD) {
				best, bestD = i, d
			}
		}
		if best < 0 {
			onlyGot = append(onlyGot, g)
			continue
		}
		used[best] = true
	}
	for i, s := range seen {
		if s.t >= from && s.t <= to {
			inWindow++
			if !used[i] {
				onlySeen = append(onlySeen, s)
			}
		}
	}
	return onlyGot, onlySeen, inWindow
}

// TestMatchIRQs: a recorded run pairs with the witness's run of the same
// line and CPU nearest in time, once; the witness's runs outside the
// recording's window need no record.
func TestMatchIRQs(t *testing.T) {
	seen := []irqRun{{38, 1, 1_000}, {38, 1, 5_000_000}, {39, 0, 5_000_100}, {39, 0, 9_000_000}, {38, 1, 20_000_000}}
	got := []irqRun{{38, 1, 5_000_050}, {39, 0, 5_000_120}, {39, 1, 9_000_000}}
	onlyGot, onlySeen, in := matchIRQs(got, seen, 2_000, 10_000_000)
	if in != 3 {
		t.Errorf("%d of the witness's runs in the window, want 3", in)
	}
	// {39 1 9000000}: no run of line 39 on CPU 1; {39 0 9000000}: in the
	// window, not recorded. The runs at 1 µs and 20 ms are outside it.
	if len(onlyGot) != 1 || onlyGot[0] != (irqRun{39, 1, 9_000_000}) {
		t.Errorf("recorded only: %v", onlyGot)
	}
	if len(onlySeen) != 1 || onlySeen[0] != (irqRun{39, 0, 9_000_000}) {
		t.Errorf("witnessed only: %v", onlySeen)
	}
	// Farther than sameRunNs apart: not the same run.
	if g, s, _ := matchIRQs([]irqRun{{38, 1, 1_000}}, []irqRun{{38, 1, 1_000 + sameRunNs + 1}}, 0, 1<<62); len(g) != 1 || len(s) != 1 {
		t.Errorf("runs %d ns apart paired: %v %v", sameRunNs+1, g, s)
	}
}

// heldPrograms counts, by name, the BPF programs this process holds open
// (their ids from /proc/self/fdinfo): the recorder's, as it runs in the
// test's process, and no other test's.
func heldPrograms(t *testing.T) map[string]int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fdinfo")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	seen := map[uint64]bool{}
	for _, fd := range fds {
		b, err := os.ReadFile("/proc/self/fdinfo/" + fd.Name())
		if err != nil {
			continue // closed since the listing
		}
		for _, line := range strings.Split(string(b), "\n") {
			v, ok := strings.CutPrefix(line, "prog_id:")
			if !ok {
				continue
			}
			id, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			if err != nil || seen[id] {
				continue
			}
			seen[id] = true
			p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
			if err != nil {
				t.Fatalf("program %d: %v", id, err)
			}
			info, err := p.Info()
			p.Close()
			if err != nil {
				t.Fatalf("program %d: %v", id, err)
			}
			out[info.Name]++
		}
	}
	return out
}

// TestKernelEventsCostNothingUnasked: a recording that asks for no kernel
// event loads none of their programs (kevent_tp, kevent_uprobe), and its
// dictionary has no kernel event type; one that asks for two tracepoints
// and a uprobe holds exactly one program per event.
func TestKernelEventsCostNothingUnasked(t *testing.T) {
	needRoot(t)
	bin := buildKevTest(t)
	plain := startRecording(t, record.Config{Groups: event.DefaultGroups})
	progs := heldPrograms(t)
	plain.stop(t)
	if len(progs) == 0 {
		t.Fatal("no BPF program found held by the recorder: the count proves nothing")
	}
	if progs["kevent_tp"] != 0 || progs["kevent_uprobe"] != 0 {
		t.Errorf("no kernel event asked for, programs held: %v", progs)
	}
	r, err := trace.Open(plain.path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, ty := range r.Header().Types {
		if ty.ID >= kevent.LostID {
			t.Errorf("no kernel event asked for, the dictionary has %s (id %d)", ty.Name, ty.ID)
		}
	}
	asked := startRecording(t, record.Config{Groups: event.DefaultGroups, KernelEvents: kernelSpecs(t,
		[]string{"task:task_rename", "napi:napi_poll"}, []string{bin + ":mg_mark"})})
	progs = heldPrograms(t)
	asked.stop(t)
	t.Logf("with kernel events, programs held: %v", progs)
	if progs["kevent_tp"] != 2 || progs["kevent_uprobe"] != 1 {
		t.Errorf("two tracepoints and a uprobe asked for, programs held: %v", progs)
	}
}

// TestKernelEventsObeyFilters: --netns and --pid apply to a tracepoint of
// the current task as to the built-in events. The test program calls
// getppid a known number of times inside the filter and another number
// outside it, at the same time: the trace must hold exactly the calls
// inside, each of the selected namespace or process.
func TestKernelEventsObeyFilters(t *testing.T) {
	needRoot(t)
	bin := buildKevTest(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgkevflt"})
	const inside, outside = 300, 200
	count := func(path string) (n int, pids map[uint32]int, netns map[uint32]int) {
		pids, netns = map[uint32]int{}, map[uint32]int{}
		eachRecord(t, path, func(rc trace.Record) {
			if rc.Type.Name == "sys_enter_getppid" {
				n++
				pids[rc.TID()]++ // one thread: its tid is the pid
				netns[rc.NetNS()]++
			}
		})
		return n, pids, netns
	}
	t.Run("netns", func(t *testing.T) {
		rec := startRecording(t, record.Config{Groups: event.GroupConn, Filters: record.Filters{NetNS: lab.Server.NS},
			KernelEvents: kernelSpecs(t, []string{"syscalls:sys_enter_getppid"}, nil)})
		in := lab.Command(lab.Server, bin, "getppid", strconv.Itoa(inside))
		out := exec.Command(bin, "getppid", strconv.Itoa(outside))
		for _, c := range []*exec.Cmd{in, out} {
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range []*exec.Cmd{in, out} {
			if err := c.Wait(); err != nil {
				t.Fatal(err)
			}
		}
		rec.stop(t)
		n, _, netns := count(rec.path)
		if n != inside || netns[lab.Server.NetNSInode] != inside {
			t.Errorf("%d getppid calls recorded, by namespace %v; want %d, all of namespace %d", n, netns, inside, lab.Server.NetNSInode)
		}
	})
	t.Run("pid", func(t *testing.T) {
		// The selected process exists before recording starts and
		// executes the test program once recording runs (same pid).
		sel := exec.Command("sh", "-c", `read go; exec "$0" getppid "$1"`, bin, strconv.Itoa(inside))
		stdin, err := sel.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := sel.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if sel.ProcessState == nil {
				sel.Process.Kill()
				sel.Wait()
			}
		})
		rec := startRecording(t, record.Config{Groups: event.GroupConn, Filters: record.Filters{PID: sel.Process.Pid},
			KernelEvents: kernelSpecs(t, []string{"syscalls:sys_enter_getppid"}, nil)})
		other := exec.Command(bin, "getppid", strconv.Itoa(outside))
		if err := other.Start(); err != nil {
			stdin.Close()
			t.Fatal(err)
		}
		stdin.Write([]byte("go\n"))
		stdin.Close()
		for _, c := range []*exec.Cmd{sel, other} {
			if err := c.Wait(); err != nil {
				t.Fatal(err)
			}
		}
		rec.stop(t)
		n, pids, _ := count(rec.path)
		if n != inside || pids[uint32(sel.Process.Pid)] != inside {
			t.Errorf("%d getppid calls recorded, by pid %v; want %d, all of pid %d", n, pids, inside, sel.Process.Pid)
		}
	})
}
