// SPDX-License-Identifier: Apache-2.0

package probe

import (
	"bytes"
	"encoding/binary"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/ring"
)

// TestWakeOncePerCrossing: a CPU's events ring wakes its reader when it
// passes the wake-up threshold (here an eighth of the ring), once, and not again
// at every event while it stays past (each wake-up is an interrupt on the
// producing CPU), until it is half full; once the reader has emptied it,
// the next crossing wakes it again. The events are synth_event's, put in
// the ring of the CPU the test runs on.
func TestWakeOncePerCrossing(t *testing.T) {
	p := loadSynth(t, 4<<20, 1.0/8)
	cpu, m, rd := pinToRing(t, p)
	woken := wakeups(t, m)

	threshold := rd.Size() / 8
	const recBytes = 48 // a dev_xmit event (40 bytes) and the ring's header
	produce := func(bytes int) { synthRuns(t, p, bytes/recBytes) }
	iwi := func() (uint64, bool) { return irqWorkInterrupts(cpu) }

	produce(threshold / 4)
	if woken(10 * time.Millisecond) {
		t.Fatal("woken below the threshold")
	}
	before, haveIWI := iwi()
	produce(2 * threshold)
	after, _ := iwi()
	if !woken(time.Second) {
		t.Fatal("not woken past the threshold")
	}
	// About 1.5 threshold's worth of events past it: a wake-up each would
	// be thousands of interrupts.
	if past := uint64(threshold * 3 / 2 / recBytes); haveIWI && after-before > past/4 {
		t.Errorf("%d irq_work interrupts on CPU %d for %d events past the threshold", after-before, cpu, past)
	}
	produce(threshold)
	if woken(10 * time.Millisecond) {
		t.Fatal("woken again while the ring stayed past the threshold")
	}
	// Past half full the reader is late: every event wakes it again.
	produce(threshold)
	if !woken(time.Second) {
		t.Fatal("not woken again past half full")
	}

	// Empty it, as the reader does, and cross again.
	if len(takeRecords(t, rd, -1)) == 0 {
		t.Fatal("no records in the ring")
	}
	produce(threshold / 4)
	if woken(10 * time.Millisecond) {
		t.Fatal("woken below the threshold after the ring was emptied")
	}
	produce(2 * threshold)
	if !woken(time.Second) {
		t.Fatal("not woken at the second crossing")
	}
	if _, lost, err := p.CountersOf(); err != nil {
		t.Fatal(err)
	} else if lost[event.DevXmit] != 0 {
		t.Fatalf("%d events lost: the test must not fill the ring", lost[event.DevXmit])
	}
}

// synthProbe is a probe with the synthetic events' programs
// (bpf/synthevent.bpf.c, a test-only object) loaded beside it.
type synthProbe struct {
	*Probe
	// event puts one dev_xmit event in this CPU's area per test run;
	// burst synthBurstEvents (nil where the kernel lacks bpf_loop); nested
	// an event, a second one while the first is held (the nested area's)
	// and a third while both are (lost): what interrupts do.
	event, burst, nested *ebpf.Program
}

// synthBurstEvents is SYNTH_BURST in bpf/synthevent.bpf.c.
const synthBurstEvents = 16

// loadSynth loads the synthetic programs beside the control hooks only, so
// that nothing but them writes to the events rings; ringBytes is the
// events rings' total.
func loadSynth(t *testing.T, ringBytes int, wakeupFill float64) *synthProbe {
	t.Helper()
	return loadSynthWith(t, Options{Groups: event.GroupConn, BufferBytes: ringBytes, ControlBytes: 64 << 10, WakeupFill: wakeupFill})
}

func loadSynthWith(t *testing.T, opts Options) *synthProbe {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loading BPF needs root")
	}
	p, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	spec, err := loadSynthevent()
	if err != nil {
		t.Fatal(err)
	}
	if !haveBPFLoop() {
		delete(spec.Programs, "synth_burst")
	}
	coll, err := p.LoadSharing(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coll.Close)
	return &synthProbe{p, coll.Programs["synth_event"], coll.Programs["synth_burst"], coll.Programs["synth_nested"]}
}

// haveBPFLoop says whether this kernel has bpf_loop (5.17).
func haveBPFLoop() bool {
	return features.HaveProgramHelper(ebpf.SchedCLS, asm.FnLoop) == nil
}

// wakeups watches m's wake-ups, edge-triggered as the recorder does: the
// function returns whether the ring was woken since it was last called,
// waiting up to wait for it.
func wakeups(t *testing.T, m *ebpf.Map) func(wait time.Duration) bool {
	t.Helper()
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(epfd) })
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(m.FD())}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, m.FD(), &ev); err != nil {
		t.Fatal(err)
	}
	// The doorbell's records are taken at each look, as the recorder
	// does, so that it never fills up.
	bell, err := ring.NewReader(m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bell.Close() })
	return func(wait time.Duration) bool {
		t.Helper()
		defer takeRecords(t, bell, -1)
		evs := make([]unix.EpollEvent, 1)
		for {
			n, err := unix.EpollWait(epfd, evs, int(wait.Milliseconds()))
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			return n > 0
		}
	}
}

// pinToRing pins the test's thread to the last online CPU until the test
// ends, and returns that CPU, the ring that wakes the reader (the doorbell)
// and a reader of the CPU's events area.
func pinToRing(t *testing.T, p *synthProbe) (int, *ebpf.Map, *ring.Reader) {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Fatal(err)
	}
	online := OnlineCPUs(len(p.AreaCPUs))
	if len(online) != len(p.AreaCPUs) {
		t.Skipf("%d CPUs online, %d areas: CPUs changed since load", len(online), len(p.AreaCPUs))
	}
	slot := len(p.AreaCPUs) - 1
	cpu := p.AreaCPUs[slot]
	var one unix.CPUSet
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.SchedSetaffinity(0, &old) })
	rd, err := ring.NewAreaReader(p.Areas, slot, p.AreaPos, 2*slot)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close() })
	return cpu, p.Doorbell, rd
}

// synthRuns runs synth_event n times on this CPU: n dev_xmit events.
func synthRuns(t *testing.T, p *synthProbe, n int) {
	t.Helper()
	if _, _, err := p.event.Benchmark(make([]byte, 64), n, nil); err != nil {
		t.Fatal(err)
	}
}

// takeRecords takes up to n records (all if n < 0) from rd, copied, and
// gives their space back to the kernel.
func takeRecords(t *testing.T, rd *ring.Reader, n int) [][]byte {
	t.Helper()
	var recs [][]byte
	for n < 0 || len(recs) < n {
		rec, st, err := rd.Peek()
		if err != nil {
			t.Fatal(err)
		}
		if st != ring.Record {
			break
		}
		recs = append(recs, bytes.Clone(rec))
		rd.Advance()
	}
	rd.Commit()
	return recs
}

// TestWakeAtAnyFill: with the threshold below one record (--wakeup-fill
// 0: wake the reader as soon as the ring holds anything), the first record
// into an empty ring wakes the reader, every time the reader has emptied
// it, and the records after it do not.
func TestWakeAtAnyFill(t *testing.T) {
	p := loadSynth(t, 4<<20, 1e-9)
	_, m, rd := pinToRing(t, p)
	woken := wakeups(t, m)
	for i := range 3 {
		synthRuns(t, p, 1)
		if !woken(time.Second) {
			t.Fatalf("round %d: not woken by a record into an empty ring", i)
		}
		synthRuns(t, p, 100)
		if woken(10 * time.Millisecond) {
			t.Fatalf("round %d: woken again while the ring held records", i)
		}
		if n := len(takeRecords(t, rd, -1)); n != 101 {
			t.Fatalf("round %d: %d records, want 101", i, n)
		}
	}
}

// TestLostRecordFirst: once a CPU's events ring was full, no event of that
// CPU goes in before the `lost` record that counts the gap, even one that
// would fit where the `lost` record does not: it is counted lost too. And
// every event stays accounted for: recorded + lost = produced.
func TestLostRecordFirst(t *testing.T) {
	p := loadSynth(t, 64<<10, 0)
	_, _, rd := pinToRing(t, p)
	const recBytes = 48 // a dev_xmit event (40 bytes) and the ring's header
	lostNow := func() uint64 {
		t.Helper()
		_, lost, err := p.CountersOf()
		if err != nil {
			t.Fatal(err)
		}
		return lost[event.DevXmit]
	}
	synthRuns(t, p, 2*rd.Size()/recBytes)
	lost := lostNow()
	if lost == 0 {
		t.Fatal("the ring never filled")
	}
	// Room for two events, not for a lost record (192 bytes with its
	// header): the next event is lost as well.
	recorded := len(takeRecords(t, rd, 2))
	synthRuns(t, p, 1)
	if got := lostNow(); got != lost+1 {
		t.Fatalf("an event went in before the lost record: %d lost, want %d", got, lost+1)
	}
	lost++
	// Room for everything now.
	recorded += len(takeRecords(t, rd, 3))
	synthRuns(t, p, 1)
	recs := takeRecords(t, rd, -1)
	n := len(recs)
	if n < 2 || recs[n-2][30] != uint8(event.Lost) || recs[n-1][30] != uint8(event.DevXmit) {
		t.Fatalf("the ring does not end with the lost record, then the event")
	}
	// struct mg_lost: the header, first_ns, last_ns, then total.
	if total := binary.LittleEndian.Uint32(recs[n-2][48:]); uint64(total) != lost {
		t.Errorf("lost record counts %d, want %d", total, lost)
	}
	recorded += n - 1
	produced, _, err := p.CountersOf()
	if err != nil {
		t.Fatal(err)
	}
	if uint64(recorded)+lost != produced[event.DevXmit] {
		t.Errorf("recorded %d + lost %d != produced %d", recorded, lost, produced[event.DevXmit])
	}
}

// irqWorkInterrupts reads the IRQ work interrupts (IWI) of cpu from
// /proc/interrupts; false if this kernel does not list them.
func irqWorkInterrupts(cpu int) (uint64, bool) {
	data, err := os.ReadFile("/proc/interrupts")
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) > cpu+1 && f[0] == "IWI:" {
			n, err := strconv.ParseUint(f[cpu+1], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// TestSyntheticBurst: one run of synth_burst puts synthBurstEvents
// dev_xmit events in this CPU's ring, in time order, and counts them as
// produced: the lab's producer multiplies its runs by that constant, which
// must match SYNTH_BURST in bpf/synthevent.bpf.c.
func TestSyntheticBurst(t *testing.T) {
	p := loadSynth(t, 1<<20, 0)
	if p.burst == nil {
		t.Skip("synth_burst did not load (bpf_loop needs Linux 5.17)")
	}
	_, _, rd := pinToRing(t, p)
	const runs = 3
	if _, _, err := p.burst.Benchmark(make([]byte, 64), runs, nil); err != nil {
		t.Fatal(err)
	}
	recs := takeRecords(t, rd, -1)
	if len(recs) != runs*synthBurstEvents {
		t.Fatalf("%d records from %d runs, want %d each", len(recs), runs, synthBurstEvents)
	}
	var last uint64
	for i, r := range recs {
		if typ := r[30]; typ != uint8(event.DevXmit) {
			t.Fatalf("record %d has type %d, want dev_xmit", i, typ)
		}
		if ts := binary.NativeEndian.Uint64(r); ts < last {
			t.Fatalf("record %d at %d ns, before its predecessor's %d", i, ts, last)
		} else {
			last = ts
		}
	}
	produced, lost, err := p.CountersOf()
	if err != nil {
		t.Fatal(err)
	}
	if produced[event.DevXmit] != runs*synthBurstEvents || lost[event.DevXmit] != 0 {
		t.Fatalf("counters: %d produced, %d lost; want %d, 0", produced[event.DevXmit], lost[event.DevXmit], runs*synthBurstEvents)
	}
}

// TestNestedArea: a program that runs while another of its CPU holds a
// reservation (an interrupt between the two's reserve and publish) writes
// to the CPU's nested area, and the interrupted one finds its own area as
// it left it; a third level is lost and accounted for. synth_nested does
// the three in one run, with sizes 1, 2 and 3.
func TestNestedArea(t *testing.T) {
	p := loadSynth(t, 1<<20, 0)
	_, _, rd := pinToRing(t, p)
	slot := len(p.AreaCPUs) - 1
	nested, err := ring.NewAreaReader(p.Nested, slot, p.AreaPos, 2*slot+1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nested.Close() })
	const runs = 3
	if _, _, err := p.nested.Benchmark(make([]byte, 64), runs, nil); err != nil {
		t.Fatal(err)
	}
	sizes := func(recs [][]byte) []uint32 {
		var out []uint32
		for _, r := range recs {
			if r[30] == uint8(event.DevXmit) {
				out = append(out, binary.NativeEndian.Uint32(r[20:])) // mg_hdr.size
			}
		}
		return out
	}
	outer, inner := takeRecords(t, rd, -1), takeRecords(t, nested, -1)
	if got := sizes(outer); len(got) != runs || got[0] != 1 || got[runs-1] != 1 {
		t.Fatalf("area: dev_xmit sizes %v, want %d × 1", got, runs)
	}
	if got := sizes(inner); len(got) != runs || got[0] != 2 || got[runs-1] != 2 {
		t.Fatalf("nested area: dev_xmit sizes %v, want %d × 2", got, runs)
	}
	produced, lost, err := p.CountersOf()
	if err != nil {
		t.Fatal(err)
	}
	if produced[event.DevXmit] != 3*runs || lost[event.DevXmit] != runs {
		t.Fatalf("counters: %d produced, %d lost; want %d, %d", produced[event.DevXmit], lost[event.DevXmit], 3*runs, runs)
	}
	// The third level's losses are reported in the stream: a lost record
	// went in ahead of a later run's first event, in the area it took.
	var reported uint32
	for _, r := range append(outer, inner...) {
		if r[30] == uint8(event.Lost) {
			reported += binary.LittleEndian.Uint32(r[48:])
		}
	}
	if reported != runs-1 {
		t.Errorf("lost records count %d, want %d (the last run's loss is still pending)", reported, runs-1)
	}
}

// TestOrderedPublish: where the CPU may reorder stores (not x86), events
// are published with an exchange; that path, forced here, loads and gives
// every event, in order.
func TestOrderedPublish(t *testing.T) {
	p := loadSynthWith(t, Options{Groups: event.GroupConn, BufferBytes: 1 << 20, ControlBytes: 64 << 10, orderedPublish: true})
	_, _, rd := pinToRing(t, p)
	const runs = 1000
	synthRuns(t, p, runs)
	recs := takeRecords(t, rd, -1)
	if len(recs) != runs {
		t.Fatalf("%d records from %d runs", len(recs), runs)
	}
	var last uint64
	for i, r := range recs {
		if ts := binary.NativeEndian.Uint64(r); r[30] != uint8(event.DevXmit) || ts < last {
			t.Fatalf("record %d: type %d at %d ns after %d", i, r[30], ts, last)
		} else {
			last = ts
		}
	}
}
