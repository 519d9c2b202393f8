// SPDX-License-Identifier: Apache-2.0

// Package primitives measures what the kernel's own primitives cost per call
// on this machine: the clocks, a helper call, per-CPU and hash map
// accesses, a record written into the BPF ring buffer or into an array ring
// (MAGNeT's design). Each is a small XDP program built with
// cilium/ebpf/asm and run with BPF_PROG_TEST_RUN, which times the loop in
// the kernel. From the figures follows the floor: the share of a CPU that
// a tracer stamping and recording every event takes at least, at a given
// event rate (`magnet-lab primitives`, lab/results/PRIMITIVES.md).
package primitives

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/machine"
)

// ErrNotRoot is returned when the run lacks the privileges to load BPF.
var ErrNotRoot = errors.New("need root (CAP_BPF, CAP_PERFMON: BPF programs and maps)")

// Limits of the options. A batch of MaxRuns ring buffer records must fit
// the ring, whose size follows Runs (64 MiB at the most).
const (
	MaxRuns = 1_000_000
	MaxReps = 10_000
)

// The full bench run of 2026-11-23 (lab/results/RESULTS.md as committed that day,
// pinned, unlimited veth): magnet record on the sender's side wrote 2,449,782 events per 5-second
// transfer, the sender's side pinned to one CPU.
const (
	DefaultEventsPerS = 490_000
	DefaultEventsFrom = "the full bench run of 2026-11-23 (lab/results/RESULTS.md of that day): record-sender wrote 2,449,782 events per 5 s transfer on the unlimited veth, the sender pinned to one CPU: 490 k events/s"
)

// Options says what to run.
type Options struct {
	Reps int // repetitions: every program once per repetition, interleaved
	Runs int // program runs per repetition (BPF_PROG_TEST_RUN's repeat)
	// EventsPerS is the event rate on the bottleneck CPU that the floor
	// is taken at, and EventsFrom where that number comes from.
	EventsPerS float64
	EventsFrom string
	Command    string // the command line, for the report
	Note       string // for the report's header (what else ran, ...)

	// ringBytes overrides the ring buffer's size (tests: a ring too small
	// must make the run fail); 0 sizes it for a batch of Runs records.
	ringBytes int
}

// Check reports the first option out of range, named by its flag.
func (o Options) Check() error {
	switch {
	case o.Reps < 1 || o.Reps > MaxReps:
		return fmt.Errorf("--reps %d: want 1 to %d", o.Reps, MaxReps)
	case o.Runs < 1 || o.Runs > MaxRuns:
		return fmt.Errorf("--runs %d: want 1 to %d", o.Runs, MaxRuns)
	case !(o.EventsPerS > 0 && o.EventsPerS < 1e12):
		return fmt.Errorf("--events-per-s %v: want a positive rate below 10^12", o.EventsPerS)
	}
	return nil
}

// Report is a run's result.
type Report struct {
	Command string    `json:"command"`
	Date    time.Time `json:"date"`
	Machine Machine   `json:"machine"`
	Reps    int       `json:"reps"`
	Runs    int       `json:"runs"`
	Note    string    `json:"note,omitempty"`
	// Dropped counts repetitions measured again because bpf_stats was on
	// during them (a program's run count moved); WithStats, those kept with
	// it on all the same once the attempts ran out.
	Dropped   int      `json:"dropped"`
	WithStats int      `json:"with_stats"`
	Results   []Result `json:"results"`
	Floor     Floor    `json:"floor"`
}

// Machine describes where the run took place.
type Machine struct {
	CPU         string     `json:"cpu"`
	Cores       int        `json:"cores"`
	MHz         float64    `json:"mhz"` // "cpu MHz" of /proc/cpuinfo, for ns → cycles
	Kernel      string     `json:"kernel"`
	Clocksource string     `json:"clocksource"` // what bpf_ktime_get_ns reads
	JIT         string     `json:"jit"`         // net.core.bpf_jit_enable
	LoadStart   [3]float64 `json:"load_start"`  // load averages (1, 5, 15 min)
	LoadEnd     [3]float64 `json:"load_end"`
}

// Result is one program's figures.
type Result struct {
	Name string `json:"name"`
	Does string `json:"does"`
	// NsPerRun is the kernel's figure for each repetition: the loop's
	// time over its runs, in whole nanoseconds (the kernel truncates).
	NsPerRun []float64 `json:"ns_per_run"`
	Gross    Spread    `json:"gross"`
	// Net is over the repetitions of NsPerRun less the empty program's
	// figure of the same repetition.
	Net Spread `json:"net"`
	// Cycles is Net's median at the CPU's MHz.
	Cycles float64 `json:"cycles"`
	// Failures counts runs whose reservation, output or lookup failed;
	// a run with failures is an error.
	Failures uint64 `json:"failures"`
}

// Spread is the median and spread of a figure over the repetitions.
type Spread struct {
	Median float64 `json:"median"`
	P25    float64 `json:"p25"`
	P75    float64 `json:"p75"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// Run loads every program, runs each o.Runs times per repetition, o.Reps
// repetitions interleaved (the order rotated each time), and returns the
// figures and the floor. It fails when any program cannot load or run, or
// when any run failed to reserve, output or look up (the figures would
// then be of a different path).
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	rep := &Report{Command: o.Command, Date: time.Now().UTC(), Machine: readMachine(), Reps: o.Reps, Runs: o.Runs, Note: o.Note}

	ringBytes := o.ringBytes
	if ringBytes == 0 {
		ringBytes = ringSize(o.Runs)
	}
	m, err := newMaps(ringBytes, arraySlots(o.Runs))
	if err != nil {
		return nil, err
	}
	defer m.close()
	resetRing, closeRing, err := ringResetter(m.ring)
	if err != nil {
		return nil, err
	}
	defer closeRing()

	progs := make([]*ebpf.Program, len(programs))
	defer func() {
		for _, p := range progs {
			if p != nil {
				p.Close()
			}
		}
	}()
	for i, p := range programs {
		progs[i], err = ebpf.NewProgram(&ebpf.ProgramSpec{
			Name:         "magnet_prim",
			Type:         ebpf.XDP,
			License:      "Dual BSD/GPL",
			Instructions: p.instructions(i, m),
		})
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", p.Name, err)
		}
	}

	// XDP wants at least an Ethernet header; the programs never read it.
	in := make([]byte, 64)
	gross := make([][]float64, len(programs))
	figures := make([]float64, len(programs))
	runCounts := make([]uint64, len(programs))
	for attempt := 1; rep.Reps > len(gross[0]); attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// bpf_stats (another tool's, e.g. magnet-lab bench --cost) adds two
		// clock reads to every run; a repetition it touched (a program's
		// run count moved: the kernel counts runs only then) is measured
		// again, within a bound.
		stats := false
		for k := range programs {
			i := (k + len(gross[0])) % len(programs)
			var reset func()
			if programs[i].usesRing {
				reset = resetRing
				reset()
			}
			_, d, err := progs[i].Benchmark(in, o.Runs, reset)
			if err != nil {
				return nil, fmt.Errorf("run %s: %w", programs[i].Name, err)
			}
			figures[i] = float64(d.Nanoseconds())
			st, err := progs[i].Stats()
			if err != nil {
				return nil, fmt.Errorf("read %s's run count: %w", programs[i].Name, err)
			}
			if st.RunCount != runCounts[i] {
				stats, runCounts[i] = true, st.RunCount
			}
		}
		if stats && attempt < maxAttempts(o.Reps) {
			rep.Dropped++
			if err := pause(ctx, statsPause); err != nil {
				return nil, err
			}
			continue
		}
		if stats {
			rep.WithStats++
		}
		for i, x := range figures {
			gross[i] = append(gross[i], x)
		}
	}
	rep.Machine.LoadEnd = machine.LoadAvg()

	var failed []string
	for i, p := range programs {
		n, err := m.failed(i)
		if err != nil {
			return nil, err
		}
		if n > 0 {
			failed = append(failed, fmt.Sprintf("%s %d", p.Name, n))
		}
		net := make([]float64, o.Reps)
		for r := range net {
			net[r] = gross[i][r] - gross[0][r]
		}
		res := Result{Name: p.Name, Does: p.Does, NsPerRun: gross[i], Gross: spread(gross[i]), Net: spread(net), Failures: n}
		res.Cycles = res.Net.Median * rep.Machine.MHz / 1000
		rep.Results = append(rep.Results, res)
	}
	if failed != nil {
		return rep, fmt.Errorf("runs failed (a reservation refused or a lookup missed), so their figures are of another path: %s", strings.Join(failed, ", "))
	}
	rep.Floor = floorOf(rep.Results, o.EventsPerS, o.EventsFrom)
	return rep, nil
}

// While bpf_stats is on, a repetition is tried again after statsPause, up
// to maxAttempts in all.
const statsPause = 100 * time.Millisecond

func maxAttempts(reps int) int { return 10 * reps }

func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ringSize is the ring buffer that holds a batch of runs records with room
// to spare: a power of two, whole pages.
func ringSize(runs int) int {
	need := uint((runs + 1) * (recordBytes + ringbufHdr))
	return max(os.Getpagesize(), 1<<bits.Len(need))
}

// arraySlots is the array ring's records per CPU for batches of runs.
func arraySlots(runs int) int {
	return min(max(1<<bits.Len(uint(runs-1)), minArraySlots), maxArraySlots)
}

func newMaps(ringBytes, slots int) (*maps, error) {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("possible CPUs: %w", err)
	}
	m := &maps{slots: slots}
	specs := []struct {
		dst  **ebpf.Map
		spec *ebpf.MapSpec
	}{
		{&m.failures, &ebpf.MapSpec{Name: "prim_failures", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: uint32(len(programs))}},
		{&m.counter, &ebpf.MapSpec{Name: "prim_counter", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 1}},
		{&m.tuples, &ebpf.MapSpec{Name: "prim_tuples", Type: ebpf.Hash, KeySize: tupleKeySize, ValueSize: 8, MaxEntries: 1024}},
		{&m.ring, &ebpf.MapSpec{Name: "prim_ring", Type: ebpf.RingBuf, MaxEntries: uint32(ringBytes)}},
		{&m.array, &ebpf.MapSpec{Name: "prim_array", Type: ebpf.Array, KeySize: 4, ValueSize: uint32(arrayHeadBytes + slots*slotBytes),
			MaxEntries: uint32(cpus), Flags: unix.BPF_F_MMAPABLE}},
	}
	for _, s := range specs {
		if *s.dst, err = ebpf.NewMap(s.spec); err != nil {
			m.close()
			return nil, fmt.Errorf("create map %s: %w", s.spec.Name, err)
		}
	}
	if err := m.tuples.Put(tupleKey(), uint64(1)); err != nil {
		m.close()
		return nil, fmt.Errorf("fill map prim_tuples: %w", err)
	}
	return m, nil
}

func (m *maps) close() {
	for _, x := range []*ebpf.Map{m.failures, m.counter, m.tuples, m.ring, m.array} {
		if x != nil {
			x.Close()
		}
	}
}

// failed is program i's failure count summed over the CPUs.
func (m *maps) failed(i int) (uint64, error) {
	var per []uint64
	if err := m.failures.Lookup(uint32(i), &per); err != nil {
		return 0, fmt.Errorf("read failure counts: %w", err)
	}
	var n uint64
	for _, x := range per {
		n += x
	}
	return n, nil
}

// ringResetter maps the ring buffer's consumer page (writable) and
// producer page (read-only) and returns a function that consumes
// everything written so far, so that the next batch's reservations never
// find the ring full: nothing reads the records.
func ringResetter(ring *ebpf.Map) (reset func(), closeFn func(), err error) {
	page := os.Getpagesize()
	cons, err := unix.Mmap(ring.FD(), 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("map the ring's consumer page: %w", err)
	}
	prod, err := unix.Mmap(ring.FD(), int64(page), page, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		unix.Munmap(cons)
		return nil, nil, fmt.Errorf("map the ring's producer page: %w", err)
	}
	consPos := (*atomic.Uint64)(unsafe.Pointer(&cons[0]))
	prodPos := (*atomic.Uint64)(unsafe.Pointer(&prod[0]))
	reset = func() { consPos.Store(prodPos.Load()) }
	closeFn = func() {
		unix.Munmap(cons)
		unix.Munmap(prod)
	}
	return reset, closeFn, nil
}

// spread summarizes xs: median, quartiles (linear interpolation between
// the closest ranks), least and greatest.
func spread(xs []float64) Spread {
	if len(xs) == 0 {
		return Spread{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return Spread{Median: quantile(s, 0.5), P25: quantile(s, 0.25), P75: quantile(s, 0.75), Min: s[0], Max: s[len(s)-1]}
}

// quantile of sorted s, interpolating linearly between ranks.
func quantile(s []float64, q float64) float64 {
	pos := q * float64(len(s)-1)
	lo := int(pos)
	if lo+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[lo] + (pos-float64(lo))*(s[lo+1]-s[lo])
}

func readMachine() Machine {
	i := machine.Read()
	return Machine{
		CPU: i.CPU, Cores: i.Cores, MHz: i.MHz, Kernel: i.Kernel,
		Clocksource: readTrimmed("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
		JIT:         readTrimmed("/proc/sys/net/core/bpf_jit_enable"),
		LoadStart:   machine.LoadAvg(),
	}
}

func readTrimmed(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
