// SPDX-License-Identifier: Apache-2.0

package probe

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/ring"
)

// TestWakeOncePerCrossing: a CPU's events ring wakes its reader when it
// passes the wake-up threshold (an eighth of the ring), once, and not again
// at every event while it stays past (each wake-up is an interrupt on the
// producing CPU); once the reader has emptied it, the next crossing wakes
// it again. The events are synth_event's, put in the ring of the CPU the
// test runs on.
func TestWakeOncePerCrossing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loading BPF needs root")
	}
	// Only the control hooks besides the synthetic programs: nothing else
	// writes to the events rings.
	p, err := Load(Options{Groups: event.GroupConn, BufferBytes: 4 << 20, ControlBytes: 64 << 10, Synthetic: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Synthetic == nil {
		t.Fatal("synth_event not loaded")
	}

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Fatal(err)
	}
	possible := len(p.Events)
	online := OnlineCPUs(possible)
	if len(online) != len(p.Events) {
		t.Skipf("%d CPUs online, %d rings: CPUs changed since load", len(online), len(p.Events))
	}
	cpu := online[len(online)-1]
	var one unix.CPUSet
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	defer unix.SchedSetaffinity(0, &old)
	m := p.Events[len(online)-1]
	rd, err := ring.NewReader(m)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()

	// The ring's wake-ups, edge-triggered as the recorder watches them.
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(epfd)
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(m.FD())}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, m.FD(), &ev); err != nil {
		t.Fatal(err)
	}
	woken := func(wait time.Duration) bool {
		t.Helper()
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

	threshold := rd.Size() / 8
	const recBytes = 48 // a dev_xmit event (40 bytes) and the ring's header
	pkt := make([]byte, 64)
	produce := func(bytes int) {
		t.Helper()
		if _, _, err := p.Synthetic.Benchmark(pkt, bytes/recBytes, nil); err != nil {
			t.Fatal(err)
		}
	}
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

	// Empty it, as the reader does, and cross again.
	n := 0
	for {
		_, st, err := rd.Peek()
		if err != nil {
			t.Fatal(err)
		}
		if st != ring.Record {
			break
		}
		rd.Advance()
		n++
	}
	rd.Commit()
	if n == 0 {
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
