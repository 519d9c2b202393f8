// SPDX-License-Identifier: Apache-2.0

package hostcheck

import (
	"reflect"
	"strings"
	"testing"
)

// goodHost is a host that can do everything up to 10 Gb/s: a fine clock,
// a cheap send and ample memory bandwidth, receiving on an interface that
// neither merges packets nor coalesces interrupts.
func goodHost() *Report {
	return &Report{
		Clock:    Clock{ObservedStepNs: 20, ClaimedResolutionNs: 1},
		Syscalls: Syscalls{UDPSendNs: 250},
		Memory:   Memory{CopyGBps: 20},
		Interfaces: []Interface{
			{Name: "lo", Up: true, Loopback: true, Offloads: &Offloads{GRO: true}},
			{Name: "eth0", Up: true, Offloads: &Offloads{GSO: true, TSO: true},
				Coalesce: &Coalesce{RxUsecs: ptr[uint32](0), RxFrames: ptr[uint32](1), AdaptiveRx: ptr(false)}},
		},
	}
}

func ptr[T any](v T) *T { return &v }

// verdictAt returns the verdict of r at rateBps.
func verdictAt(t *testing.T, r *Report, rateBps float64) Verdict {
	t.Helper()
	vs, err := r.Verdicts("")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		if v.RateBps == rateBps {
			return v
		}
	}
	t.Fatalf("no verdict at %g bit/s", rateBps)
	return Verdict{}
}

func checkAnswer(t *testing.T, what string, got Answer, want ...Reason) {
	t.Helper()
	wantAns := Answer{OK: len(want) == 0}
	if len(want) > 0 {
		wantAns.LimitedBy = want
	}
	if !reflect.DeepEqual(got, wantAns) {
		t.Errorf("%s = %+v, want %+v", what, got, wantAns)
	}
}

func TestVerdictGoodHost(t *testing.T) {
	v := verdictAt(t, goodHost(), 10e9)
	if v.GapNs != 1200 {
		t.Errorf("gap at 10 Gb/s = %v ns, want 1200", v.GapNs)
	}
	checkAnswer(t, "pairs", v.Pairs)
	checkAnswer(t, "trains", v.Trains)
	checkAnswer(t, "saturate", v.Saturate)
}

func TestVerdictCoarseClock(t *testing.T) {
	r := goodHost()
	r.Clock.ObservedStepNs = 1000
	v := verdictAt(t, r, 10e9)
	checkAnswer(t, "pairs at 10 Gb/s", v.Pairs,
		Reason{FigureClockStep, "clock step 1 µs > 120 ns, a tenth of the 1.2 µs gap"})
	// A 100-packet train at 10 Gb/s lasts 120 µs, far more than 10 µs.
	checkAnswer(t, "trains at 10 Gb/s", v.Trains)
	checkAnswer(t, "saturate at 10 Gb/s", v.Saturate)

	// At 100 Mb/s the gap is 120 µs: a 1 µs step is fine.
	checkAnswer(t, "pairs at 100 Mb/s", verdictAt(t, r, 100e6).Pairs)
}

func TestVerdictClaimedResolutionCounts(t *testing.T) {
	r := goodHost()
	r.Clock.ObservedStepNs = 20
	r.Clock.ClaimedResolutionNs = 4000 // a jiffies-like clock
	if got := r.Limits().ClockStepNs; got != 4000 {
		t.Fatalf("clock step = %v, want the claimed 4000", got)
	}
	v := verdictAt(t, r, 100e9)
	checkAnswer(t, "trains at 100 Gb/s", v.Trains,
		Reason{FigureClockStep, "a 100-packet train lasts 12 µs < 10 clock steps of 4 µs"},
		Reason{FigureMemoryCopy, "memory copies 20 GB/s, enough to receive and record 78.9 Gb/s < 100 Gb/s"})
}

func TestVerdictCoalescing(t *testing.T) {
	r := goodHost()
	r.Interfaces[1].Coalesce.RxUsecs = ptr[uint32](50)
	v := verdictAt(t, r, 10e9)
	checkAnswer(t, "pairs at 10 Gb/s", v.Pairs,
		Reason{FigureCoalescing, "eth0 holds packets up to 50 µs for one interrupt > 120 ns, a tenth of the gap"})
	checkAnswer(t, "trains at 10 Gb/s", v.Trains,
		Reason{FigureCoalescing, "eth0 holds packets up to 50 µs for one interrupt > 12 µs, a tenth of a 100-packet train"})
	checkAnswer(t, "saturate at 10 Gb/s", v.Saturate)

	v = verdictAt(t, r, 100e6)
	checkAnswer(t, "pairs at 100 Mb/s", v.Pairs,
		Reason{FigureCoalescing, "eth0 holds packets up to 50 µs for one interrupt > 12 µs, a tenth of the gap"})
	// A train at 100 Mb/s lasts 12 ms: 50 µs of blur is under a tenth.
	checkAnswer(t, "trains at 100 Mb/s", v.Trains)
}

func TestVerdictCoalescingByFrames(t *testing.T) {
	r := goodHost()
	r.Interfaces[1].Coalesce.RxFrames = ptr[uint32](32)
	v := verdictAt(t, r, 10e9)
	// 32 frames: the first waits for 31 more, 31 × 1.2 µs = 37.2 µs.
	checkAnswer(t, "pairs", v.Pairs,
		Reason{FigureCoalescing, "eth0 holds packets up to 37.2 µs for one interrupt > 120 ns, a tenth of the gap"})
	checkAnswer(t, "trains", v.Trains,
		Reason{FigureCoalescing, "eth0 holds packets up to 37.2 µs for one interrupt > 12 µs, a tenth of a 100-packet train"})
}

func TestVerdictAdaptiveCoalescing(t *testing.T) {
	r := goodHost()
	r.Interfaces[1].Coalesce.AdaptiveRx = ptr(true)
	v := verdictAt(t, r, 1e9)
	checkAnswer(t, "pairs", v.Pairs,
		Reason{FigureCoalescing, "eth0 adapts interrupt coalescing to the load (adaptive-rx): packets close together may share a timestamp"})
	checkAnswer(t, "trains", v.Trains)
}

func TestVerdictGRO(t *testing.T) {
	r := goodHost()
	r.Interfaces[1].Offloads.GRO = true
	r.Interfaces[1].Offloads.LRO = true
	v := verdictAt(t, r, 1e9)
	checkAnswer(t, "pairs", v.Pairs,
		Reason{FigureOffload, "eth0 merges received packets (GRO, LRO): a merged packet has one timestamp"})
	checkAnswer(t, "trains", v.Trains)
	checkAnswer(t, "saturate", v.Saturate)
}

func TestVerdictSlowSend(t *testing.T) {
	r := goodHost()
	r.Syscalls.UDPSendNs = 10000
	v := verdictAt(t, r, 10e9)
	checkAnswer(t, "saturate at 10 Gb/s", v.Saturate,
		Reason{FigureSendCost, "one thread sends a 1500-byte packet every 10 µs: 1.2 Gb/s < 10 Gb/s"})
	checkAnswer(t, "pairs at 10 Gb/s", v.Pairs,
		Reason{FigureSendCost, "4 system calls of 10 µs (read and timestamp two packets) take 40 µs > the 1.2 µs gap"})
	checkAnswer(t, "trains at 10 Gb/s", v.Trains)
	// 1.2 Gb/s is enough for a 1 Gb/s link.
	checkAnswer(t, "saturate at 1 Gb/s", verdictAt(t, r, 1e9).Saturate)
}

func TestVerdictSlowMemory(t *testing.T) {
	r := goodHost()
	r.Memory.CopyGBps = 1
	// 1e9 B/s / (2 × 1500 + 40 B per packet) × 12000 bit = 3.95 Gb/s.
	want := Reason{FigureMemoryCopy, "memory copies 1 GB/s, enough to receive and record 3.95 Gb/s < 10 Gb/s"}
	v := verdictAt(t, r, 10e9)
	checkAnswer(t, "pairs", v.Pairs, want)
	checkAnswer(t, "trains", v.Trains, want)
	checkAnswer(t, "saturate", v.Saturate, want)
	checkAnswer(t, "saturate at 1 Gb/s", verdictAt(t, r, 1e9).Saturate)
}

// The paper's rule for pairs: four system calls (read and timestamp two
// packets) must fit in the gap. 330 ns calls do not fit in 10 Gb/s's
// 1.2 µs, and pairs were judged possible all the same.
func TestVerdictPairSyscalls(t *testing.T) {
	r := goodHost()
	r.Syscalls.UDPSendNs = 330
	checkAnswer(t, "pairs at 10 Gb/s", verdictAt(t, r, 10e9).Pairs,
		Reason{FigureSendCost, "4 system calls of 330 ns (read and timestamp two packets) take 1.32 µs > the 1.2 µs gap"})
	checkAnswer(t, "trains at 10 Gb/s", verdictAt(t, r, 10e9).Trains)
	checkAnswer(t, "pairs at 1 Gb/s", verdictAt(t, r, 1e9).Pairs)
}

// An idle CPU that takes 27 µs to wake stamps a pair's first packet up to
// that late: no pairs at 10 Gb/s, nor at 1 Gb/s (12 µs gap); trains of
// 100 packets last 120 µs at 10 Gb/s, and 27 µs is more than a tenth.
func TestVerdictWakeUp(t *testing.T) {
	r := goodHost()
	r.CPU.WakeUpNs = 27000
	v := verdictAt(t, r, 10e9)
	checkAnswer(t, "pairs at 10 Gb/s", v.Pairs,
		Reason{FigureWakeUp, "an idle CPU takes 27 µs to wake > 120 ns, a tenth of the gap: a pair's first packet may be stamped that late"})
	checkAnswer(t, "trains at 10 Gb/s", v.Trains,
		Reason{FigureWakeUp, "an idle CPU takes 27 µs to wake > 12 µs, a tenth of a 100-packet train"})
	checkAnswer(t, "saturate at 10 Gb/s", v.Saturate)
	v = verdictAt(t, r, 100e6)
	checkAnswer(t, "trains at 100 Mb/s", v.Trains)
	checkAnswer(t, "pairs at 100 Mb/s", v.Pairs,
		Reason{FigureWakeUp, "an idle CPU takes 27 µs to wake > 12 µs, a tenth of the gap: a pair's first packet may be stamped that late"})
}

// The verdict uses the median copy and says how far the copies ranged.
func TestVerdictMemorySpread(t *testing.T) {
	r := goodHost()
	r.Memory = Memory{CopyGBps: 3, CopyMinGBps: 1.5, CopyMaxGBps: 12}
	checkAnswer(t, "saturate at 40 Gb/s", verdictAt(t, r, 40e9).Saturate,
		Reason{FigureMemoryCopy, "memory copies 3 GB/s (median; 1.5 to 12), enough to receive and record 11.8 Gb/s < 40 Gb/s"})
	med, lo, hi := spread([]float64{12, 1.5, 3, 2.5, 4})
	if med != 3 || lo != 1.5 || hi != 12 {
		t.Errorf("spread = %v, %v, %v; want 3, 1.5, 12", med, lo, hi)
	}
	if med, _, _ := spread([]float64{2, 4}); med != 3 {
		t.Errorf("median of 2 and 4 = %v", med)
	}
}

func TestVerdictNothingMeasured(t *testing.T) {
	v := verdictAt(t, &Report{}, 1e9)
	checkAnswer(t, "pairs", v.Pairs,
		Reason{FigureClockStep, "clock step not measured"},
		Reason{FigureMemoryCopy, "memory copy bandwidth not measured"})
	checkAnswer(t, "saturate", v.Saturate,
		Reason{FigureSendCost, "send cost not measured"},
		Reason{FigureMemoryCopy, "memory copy bandwidth not measured"})
}

func TestVerdictsInterfaceChoice(t *testing.T) {
	r := goodHost()
	r.Interfaces = append(r.Interfaces,
		Interface{Name: "eth1", Up: false, Offloads: &Offloads{GRO: true}},
		Interface{Name: "eth2", Up: true, Offloads: &Offloads{LRO: true}})

	// By default: every interface that is up and not loopback, so eth2
	// decides; lo's GRO and the down eth1 do not count.
	checkAnswer(t, "pairs, all", verdictAt(t, r, 1e9).Pairs,
		Reason{FigureOffload, "eth2 merges received packets (LRO): a merged packet has one timestamp"})

	vs, err := r.Verdicts("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != len(LinkRates) {
		t.Fatalf("%d verdicts, want %d", len(vs), len(LinkRates))
	}
	checkAnswer(t, "pairs, eth0", vs[1].Pairs)

	// Named explicitly, even a down interface is judged.
	vs, err = r.Verdicts("eth1")
	if err != nil {
		t.Fatal(err)
	}
	checkAnswer(t, "pairs, eth1", vs[1].Pairs,
		Reason{FigureOffload, "eth1 merges received packets (GRO): a merged packet has one timestamp"})

	if _, err := r.Verdicts("nope0"); err == nil || !strings.Contains(err.Error(), `no interface "nope0"`) {
		t.Errorf("Verdicts(nope0) error = %v, want no interface", err)
	}
}

func TestLimitRates(t *testing.T) {
	l := Limits{ClockStepNs: 20, SendCostNs: 1000, MemcpyGBps: 3.04}
	if got := l.MaxPacedPacketRate(); got != 1e6 {
		t.Errorf("MaxPacedPacketRate = %v, want 1e6", got)
	}
	if got := l.MaxPacedBitRate(); got != 12e9 {
		t.Errorf("MaxPacedBitRate = %v, want 12e9", got)
	}
	// 3.04e9 B/s / 3040 B per packet = 1e6 packets/s of 12000 bits.
	if got := l.MaxReceiveBitRate(); got < 11.999e9 || got > 12.001e9 {
		t.Errorf("MaxReceiveBitRate = %v, want 12e9", got)
	}
	if got := (Limits{}).MaxPacedBitRate(); got != 0 {
		t.Errorf("MaxPacedBitRate without send cost = %v, want 0", got)
	}
}

func TestBlur(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    *Coalesce
		want float64
	}{
		{"nil", nil, 0},
		{"nothing reported", &Coalesce{}, 0},
		{"immediate", &Coalesce{RxUsecs: ptr[uint32](0), RxFrames: ptr[uint32](1)}, 0},
		{"usecs", &Coalesce{RxUsecs: ptr[uint32](8)}, 8000},
		{"frames", &Coalesce{RxFrames: ptr[uint32](5)}, 4 * 1200},
		{"usecs first", &Coalesce{RxUsecs: ptr[uint32](3), RxFrames: ptr[uint32](64)}, 3000},
		{"frames first", &Coalesce{RxUsecs: ptr[uint32](100), RxFrames: ptr[uint32](5)}, 4 * 1200},
	} {
		if got := tc.c.BlurNs(1200); got != tc.want {
			t.Errorf("%s: BlurNs = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestFormat(t *testing.T) {
	for ns, want := range map[float64]string{
		0: "0 ns", 21: "21 ns", 33.44: "33.4 ns", 120: "120 ns", 1200: "1.2 µs",
		50000: "50 µs", 12e6: "12 ms", 2.5e9: "2.5 s",
	} {
		if got := FormatNs(ns); got != want {
			t.Errorf("FormatNs(%v) = %q, want %q", ns, got, want)
		}
	}
	for bps, want := range map[float64]string{
		100e6: "100 Mb/s", 1e9: "1 Gb/s", 15.46e9: "15.5 Gb/s", 100e9: "100 Gb/s", 2e12: "2 Tb/s", 500: "500 b/s",
	} {
		if got := FormatBitRate(bps); got != want {
			t.Errorf("FormatBitRate(%v) = %q, want %q", bps, got, want)
		}
	}
}

func TestDisturbances(t *testing.T) {
	c := CPU{
		Governor:     "powersave",
		PstateStatus: "intel_pstate active",
		IdleStates: []IdleState{
			{Name: "POLL", LatencyUs: 0},
			{Name: "C1E", LatencyUs: 10},
			{Name: "C6", LatencyUs: 133},
			{Name: "C10", LatencyUs: 890, Disabled: true},
		},
	}
	want := []string{
		"governor powersave with intel_pstate active: the CPU picks its own frequency by load, so the first packets of a burst are handled more slowly",
		"idle state C6 enabled with 133 µs exit latency: a packet arriving at an idle CPU waits up to 133 µs before it is timestamped",
	}
	if got := c.Disturbances(); !reflect.DeepEqual(got, want) {
		t.Errorf("Disturbances =\n%q\nwant\n%q", got, want)
	}
	if got := (CPU{Governor: "performance"}).Disturbances(); got != nil {
		t.Errorf("performance governor: Disturbances = %q, want none", got)
	}
}

// A measured wake-up slower than DeepIdleLatencyUs is a disturbance whatever
// the idle states claim; on a guest that halts at once it says so.
func TestWakeUpDisturbance(t *testing.T) {
	guest := CPU{
		IdleDriver:      "haltpoll",
		IdleStates:      []IdleState{{Name: "POLL"}, {Name: "haltpoll idle", LatencyUs: 1}},
		GuestHaltPollNs: "0",
		WakeUpNs:        44800,
		WakeUpMaxNs:     169000,
		WakeUpSamples:   100,
	}
	want := []string{"idle CPU wake-up 45 µs: a thread woken on an idle CPU ran 45 µs later (median of 100, longest 169 µs), so a packet arriving at an idle CPU waits about that long before it is timestamped; this VM guest halts at once when idle (haltpoll guest_halt_poll_ns 0), and the hypervisor must run it again"}
	if got := guest.Disturbances(); !reflect.DeepEqual(got, want) {
		t.Errorf("guest halting at once: Disturbances =\n%q\nwant\n%q", got, want)
	}
	polling := guest
	polling.GuestHaltPollNs, polling.WakeUpNs, polling.WakeUpMaxNs = "200000", 6300, 18300
	if got := polling.Disturbances(); got != nil {
		t.Errorf("guest polling first, 6.3 µs wake-ups: Disturbances = %q, want none", got)
	}
	unmeasured := CPU{WakeUpError: "one CPU: no other CPU to wake"}
	if got := unmeasured.Disturbances(); got != nil {
		t.Errorf("wake-up not measured: Disturbances = %q, want none", got)
	}
}

// IdleSummary: bare metal, a guest that halts at once, one that polls
// first, and no cpuidle.
func TestIdleSummary(t *testing.T) {
	if got := (CPU{}).IdleSummary(); got != "" {
		t.Errorf("no cpuidle: %q, want none", got)
	}
	if got, want := (CPU{IdleDriver: "intel_idle", IdleGovernor: "menu"}).IdleSummary(), "cpuidle intel_idle, governor menu"; got != want {
		t.Errorf("bare metal: %q, want %q", got, want)
	}
	guest := CPU{IdleDriver: "haltpoll", IdleGovernor: "haltpoll", GuestHaltPollNs: "0"}
	if got, want := guest.IdleSummary(), "cpuidle haltpoll, governor haltpoll, guest_halt_poll_ns 0 (the guest halts at once when idle)"; got != want {
		t.Errorf("guest halting at once: %q, want %q", got, want)
	}
	guest.GuestHaltPollNs = "200000"
	if got, want := guest.IdleSummary(), "cpuidle haltpoll, governor haltpoll, guest_halt_poll_ns 200000"; got != want {
		t.Errorf("guest polling first: %q, want %q", got, want)
	}
}
