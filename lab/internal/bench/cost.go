// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/hostcheck"
	"github.com/magnet-tracer/magnet/internal/machine"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/probe"
)

// Machine describes where the bench ran.
type Machine struct {
	CPU    string  `json:"cpu"`
	Cores  int     `json:"cores"`
	Kernel string  `json:"kernel"`
	MHz    float64 `json:"mhz"` // "cpu MHz" of /proc/cpuinfo, for ns → cycles
	// Idle is how the CPUs idle (hostcheck.CPU.IdleSummary): on a VM guest
	// that halts at once, a transfer that waits pays a hypervisor wake-up
	// each time, which moves the baseline (docs/BENCH.md at d71bc17, "A machine whose
	// sender waits").
	Idle string `json:"idle,omitempty"`
	// WakeUpNs is how long an idle CPU took to run a thread woken from
	// another, median of 100 (hostcheck.MeasureWakeUp), 0 if not measured:
	// what each of a transfer's waits costs on top of the wait.
	WakeUpNs int64 `json:"wakeup_ns,omitempty"`
}

func readMachine() Machine {
	i := machine.Read()
	m := Machine{CPU: i.CPU, Cores: i.Cores, Kernel: i.Kernel, MHz: i.MHz, Idle: hostcheck.ReadCPU().IdleSummary()}
	if wake, _, err := hostcheck.MeasureWakeUp(100); err == nil {
		m.WakeUpNs = int64(wake)
	}
	return m
}

// CostResult is the per-event cost of recording, in the kernel (bpf_stats)
// and in the recorder (CPU time per event drained).
type CostResult struct {
	MHz  float64   `json:"mhz"`
	Runs []CostRun `json:"runs"`
	Note string    `json:"note"`
}

// CostRun is one transfer recorded with bpf_stats enabled.
type CostRun struct {
	Workload string     `json:"workload"`
	Rep      int        `json:"rep,omitempty"`
	Programs []ProgCost `json:"programs"`
	// KernelNsPerRun is all programs' run time over all their runs: the
	// average over every program invocation.
	KernelNsPerRun float64 `json:"kernel_ns_per_run"`
	// KernelNsPerEvent is all programs' run time over the events they
	// produced (a run that filters its event out costs too).
	KernelNsPerEvent float64 `json:"kernel_ns_per_event"`
	Produced         uint64  `json:"produced"`
	Drained          uint64  `json:"drained"`
	Lost             uint64  `json:"lost"`
	UserCPUS         float64 `json:"user_cpu_s"`
	// UserSysNsPerEvent is the part of UserNsPerEvent spent in the kernel
	// (system calls: writing the trace, waiting for the rings).
	UserSysNsPerEvent float64 `json:"user_sys_ns_per_event,omitempty"`
	UserNsPerEvent    float64 `json:"user_ns_per_event"`
	ThroughputMbit    float64 `json:"throughput_mbit"`
	// FloorNsPerRun is what bpf_stats reports for an empty program on
	// the net_dev_queue tracepoint during the same run: the cost of the
	// measurement itself (two sched_clock reads) and of calling a
	// program, which every figure above includes. 0 if not measured.
	FloorNsPerRun float64 `json:"floor_ns_per_run,omitempty"`
	FloorRuns     uint64  `json:"floor_runs,omitempty"`
}

// ProgCost is one program's bpf_stats.
type ProgCost struct {
	Name      string  `json:"name"`
	RunCount  uint64  `json:"run_count"`
	RuntimeNs uint64  `json:"runtime_ns"`
	NsPerRun  float64 `json:"ns_per_run"`
}

// cost records the sender's side of a transfer with the kernel's BPF run
// time statistics enabled; they add two clock reads per program run, which
// is why no throughput figure is taken with them on.
func (b *bencher) cost(ctx context.Context, lab *netlab.Lab, mhz float64) (*CostResult, error) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enable bpf_stats: %w", err)
	}
	defer stats.Close()
	cr := &CostResult{MHz: mhz, Note: "record on the sender's side (--netns client), default buffer, bpf_stats enabled for these runs only"}
	for rep := 1; rep <= b.opts.Reps; rep++ {
		for _, w := range []struct {
			proto string
			size  int
		}{{"tcp", BulkSize}, {"tcp", SmallSize}} {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			run, err := b.costRun(ctx, lab, w.proto, w.size)
			if err != nil {
				return nil, err
			}
			run.Rep = rep
			b.logf("cost rep %d %s: kernel %.1f ns/run, %.1f ns/event (empty program %.1f ns/run); drain %.1f ns/event (%.1f in system calls)", rep, run.Workload, run.KernelNsPerRun, run.KernelNsPerEvent, run.FloorNsPerRun, run.UserNsPerEvent, run.UserSysNsPerEvent)
			cr.Runs = append(cr.Runs, *run)
		}
	}
	return cr, nil
}

// CostSummary is a workload's per-event cost over the repetitions.
type CostSummary struct {
	Workload string `json:"workload"`
	// KernelNsPerRun is bpf_stats' figure: every program's run time over
	// its runs; KernelNetNsPerRun is the same less what the empty program
	// measured in the same run (the cost of measuring and of calling a
	// program).
	KernelNsPerRun    Stat       `json:"kernel_ns_per_run"`
	KernelNetNsPerRun Stat       `json:"kernel_net_ns_per_run"`
	FloorNsPerRun     Stat       `json:"floor_ns_per_run"`
	KernelNsPerEvent  Stat       `json:"kernel_ns_per_event"`
	UserNsPerEvent    Stat       `json:"user_ns_per_event"`
	UserSysNsPerEvent Stat       `json:"user_sys_ns_per_event"` // the system-call part
	Produced          Stat       `json:"produced"`
	Lost              uint64     `json:"lost"`
	Programs          []ProgCost `json:"programs"` // summed over the repetitions
}

// Summaries groups the runs by workload, in the order they first ran. Runs
// without a floor measurement have no net figure.
func (c *CostResult) Summaries() []CostSummary {
	var order []string
	byName := map[string][]CostRun{}
	for _, r := range c.Runs {
		if _, ok := byName[r.Workload]; !ok {
			order = append(order, r.Workload)
		}
		byName[r.Workload] = append(byName[r.Workload], r)
	}
	var out []CostSummary
	for _, name := range order {
		runs := byName[name]
		var perRun, net, floor, perEvent, user, sys, produced []float64
		progs := map[string]*ProgCost{}
		var progOrder []string
		s := CostSummary{Workload: name}
		for _, r := range runs {
			perRun = append(perRun, r.KernelNsPerRun)
			if r.FloorRuns > 0 {
				floor = append(floor, r.FloorNsPerRun)
				net = append(net, r.KernelNsPerRun-r.FloorNsPerRun)
			}
			perEvent = append(perEvent, r.KernelNsPerEvent)
			user = append(user, r.UserNsPerEvent)
			if r.UserSysNsPerEvent > 0 {
				sys = append(sys, r.UserSysNsPerEvent)
			}
			produced = append(produced, float64(r.Produced))
			s.Lost += r.Lost
			for _, p := range r.Programs {
				pc := progs[p.Name]
				if pc == nil {
					pc = &ProgCost{Name: p.Name}
					progs[p.Name] = pc
					progOrder = append(progOrder, p.Name)
				}
				pc.RunCount += p.RunCount
				pc.RuntimeNs += p.RuntimeNs
			}
		}
		s.KernelNsPerRun, s.KernelNetNsPerRun, s.FloorNsPerRun = Summarize(perRun), Summarize(net), Summarize(floor)
		s.KernelNsPerEvent, s.UserNsPerEvent, s.Produced = Summarize(perEvent), Summarize(user), Summarize(produced)
		s.UserSysNsPerEvent = Summarize(sys)
		for _, name := range progOrder {
			pc := progs[name]
			if pc.RunCount > 0 {
				pc.NsPerRun = float64(pc.RuntimeNs) / float64(pc.RunCount)
			}
			s.Programs = append(s.Programs, *pc)
		}
		sort.SliceStable(s.Programs, func(i, j int) bool { return s.Programs[i].RuntimeNs > s.Programs[j].RuntimeNs })
		out = append(out, s)
	}
	return out
}

func (b *bencher) costRun(ctx context.Context, lab *netlab.Lab, proto string, size int) (*CostRun, error) {
	floor, ferr := attachEmpty("net_dev_queue")
	if ferr != nil {
		b.logf("cost: no measurement floor: %v", ferr)
	} else {
		defer floor.close()
	}
	// `magnet record` as users run it, in a process of its own: its CPU
	// time is then the recorder's alone, not also the bench's (which
	// starts and waits for the workload: ~4 ms a transfer).
	p, err := b.startRecorderProc(ctx, lab, b.opts.Magnet)
	if err != nil {
		return nil, err
	}
	p.cpu0 = p.cpuNs()
	x, xerr := b.transfer(ctx, lab, proto, size, b.opts.Duration, b.nextPort())
	if xerr != nil {
		p.kill()
		return nil, xerr
	}
	progs, err := programCosts(p.progs)
	if err != nil {
		p.kill()
		return nil, err
	}
	if len(progs) == 0 {
		p.kill()
		return nil, errors.New("no magnet programs found to read bpf_stats from")
	}
	p.closeProgs()
	tr, err := p.end()
	if err != nil {
		return nil, err
	}
	drain := p.drainNs(tr)
	if drain == 0 {
		return nil, errors.New("the recorder's trace summary has no recorder_cpu_ns")
	}
	run := &CostRun{Workload: fmt.Sprintf("%s flood, %d-byte messages", proto, size), Produced: tr.Produced, Drained: tr.Events, Lost: tr.Lost, UserCPUS: float64(drain) / 1e9, Programs: progs}
	if x.WallS > 0 {
		run.ThroughputMbit = float64(x.RecvBytes) * 8 / x.WallS / 1e6
	}
	var runs, ns uint64
	for _, pc := range progs {
		runs += pc.RunCount
		ns += pc.RuntimeNs
	}
	if runs > 0 {
		run.KernelNsPerRun = float64(ns) / float64(runs)
	}
	if tr.Produced > 0 {
		run.KernelNsPerEvent = float64(ns) / float64(tr.Produced)
	}
	if tr.Events > 0 {
		run.UserNsPerEvent = float64(drain) / float64(tr.Events)
		// The system part is the account's, which also covers the idle
		// time before the transfer (mostly system time itself).
		run.UserSysNsPerEvent = min(tr.RecordSysS*1e9, float64(drain)) / float64(tr.Events)
	}
	if ferr == nil {
		st, err := floor.prog.Stats()
		if err != nil {
			return nil, fmt.Errorf("empty program stats: %w", err)
		}
		run.FloorRuns = st.RunCount
		if st.RunCount > 0 {
			run.FloorNsPerRun = float64(st.Runtime.Nanoseconds()) / float64(st.RunCount)
		}
	}
	return run, nil
}

// programCosts reads the bpf_stats of programs, dearest first.
func programCosts(progs []*ebpf.Program) ([]ProgCost, error) {
	var out []ProgCost
	for _, p := range progs {
		info, err := p.Info()
		if err != nil {
			return nil, fmt.Errorf("program info: %w", err)
		}
		st, err := p.Stats()
		if err != nil {
			return nil, fmt.Errorf("program stats: %w", err)
		}
		pc := ProgCost{Name: info.Name, RunCount: st.RunCount, RuntimeNs: uint64(st.Runtime.Nanoseconds())}
		if pc.RunCount > 0 {
			pc.NsPerRun = float64(pc.RuntimeNs) / float64(pc.RunCount)
		}
		out = append(out, pc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].RuntimeNs > out[j].RuntimeNs })
	return out, nil
}

// emptyProgram is a program that returns at once, attached to a
// tracepoint next to magnet's: what bpf_stats reports for it is the cost of
// measuring and calling a program, not of anything magnet does.
type emptyProgram struct {
	prog *ebpf.Program
	link link.Link
}

func attachEmpty(tracepoint string) (*emptyProgram, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "bench_empty",
		Type:         ebpf.Tracing,
		AttachType:   ebpf.AttachTraceRawTp,
		AttachTo:     tracepoint,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		return nil, fmt.Errorf("load empty program: %w", err)
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: prog, AttachType: ebpf.AttachTraceRawTp})
	if err != nil {
		prog.Close()
		return nil, fmt.Errorf("attach empty program: %w", err)
	}
	return &emptyProgram{prog: prog, link: l}, nil
}

func (e *emptyProgram) close() {
	e.link.Close()
	e.prog.Close()
}

// lastProgramID is the highest BPF program id now loaded; programs loaded
// later have higher ids.
func lastProgramID() (ebpf.ProgramID, error) {
	var last ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(last)
		if errors.Is(err, os.ErrNotExist) {
			return last, nil
		}
		if err != nil {
			return 0, fmt.Errorf("list bpf programs: %w", err)
		}
		last = next
	}
}

// magnetPrograms opens the programs loaded after id after whose names are
// magnet's (the kernel keeps 15 characters of a name) and that process pid
// holds: on a shared machine another recorder may load magnet's programs
// at the same time, and their runs are not this one's.
func magnetPrograms(after ebpf.ProgramID, pid int) ([]*ebpf.Program, error) {
	held, err := heldPrograms(pid)
	if err != nil {
		return nil, err
	}
	var out []*ebpf.Program
	id := after
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("list bpf programs: %w", err)
		}
		id = next
		if !held[id] {
			continue
		}
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded meanwhile
		}
		info, err := p.Info()
		if err != nil || !isMagnetProgram(info.Name) {
			p.Close()
			continue
		}
		out = append(out, p)
	}
}

// heldPrograms returns the ids of the BPF programs process pid has open,
// from /proc/PID/fdinfo: a program's file descriptor says its prog_id.
func heldPrograms(pid int) (map[ebpf.ProgramID]bool, error) {
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("programs of process %d: %w", pid, err)
	}
	out := map[ebpf.ProgramID]bool{}
	for _, e := range ents {
		data, err := os.ReadFile(dir + "/" + e.Name())
		if err != nil {
			continue // closed meanwhile
		}
		if id, ok := fdinfoProgID(string(data)); ok {
			out[id] = true
		}
	}
	return out, nil
}

// fdinfoProgID reads the prog_id line of a file descriptor's fdinfo, which
// only BPF program descriptors have.
func fdinfoProgID(fdinfo string) (ebpf.ProgramID, bool) {
	for _, line := range strings.Split(fdinfo, "\n") {
		v, ok := strings.CutPrefix(line, "prog_id:")
		if !ok {
			continue
		}
		id, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
		return ebpf.ProgramID(id), err == nil
	}
	return 0, false
}

func isMagnetProgram(name string) bool {
	if name == "" {
		return false
	}
	for _, h := range probe.Hooks {
		if strings.HasPrefix(h.Program, name) {
			return true
		}
	}
	return false
}
