// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// PairedResult is the per-event cost of two magnet builds recording the
// same transfers at the same time: on a machine shared with other work,
// what one build costs against another is then measured under the same
// load, which separate runs minutes apart are not. The program attached
// second to a hook finds the caches warmed by the first, so every pair runs
// in both orders.
type PairedResult struct {
	This  string      `json:"this"`  // label of this build
	Other string      `json:"other"` // label of the other build
	Note  string      `json:"note"`
	Runs  []PairedRun `json:"runs"`
}

// PairedRun is one transfer recorded by both builds.
type PairedRun struct {
	Workload  string `json:"workload"`
	Rep       int    `json:"rep"`
	ThisFirst bool   `json:"this_first"` // this build's recorder was started (and attached) first
	// CPUFrom says where both sides' CPUNs come from: "summary" (each
	// recorder's own account in its trace less its CPU time before the
	// transfer: the transfer's start to its last event drained) or
	// "transfer" (measured from outside over the transfer, which leaves out
	// the events drained after it: builds that leave more in their rings
	// look cheaper).
	CPUFrom string   `json:"cpu_from"`
	This    PairSide `json:"this"`
	Other   PairSide `json:"other"`
	// FloorNsPerRun is an empty program's bpf_stats figure on net_dev_queue
	// in the same run (see CostRun).
	FloorNsPerRun float64 `json:"floor_ns_per_run,omitempty"`
}

// PairSide is what one build's recorder cost in a paired run.
type PairSide struct {
	Runs       uint64  `json:"runs"`       // program runs (bpf_stats)
	RuntimeNs  uint64  `json:"runtime_ns"` // their run time
	NsPerRun   float64 `json:"ns_per_run"`
	Produced   uint64  `json:"produced"` // events BPF produced (trace summary)
	Drained    uint64  `json:"drained"`  // events written
	NsPerEvent float64 `json:"ns_per_event"`
	// CPUNs is the recorder process's CPU time from the transfer's start
	// to its last event drained, from its own account, when both builds
	// give one; else measured over the transfer (PairedRun.CPUFrom).
	CPUNs           uint64  `json:"cpu_ns"`
	DrainNsPerEvent float64 `json:"drain_ns_per_event"`
	windowNs        uint64  // CPU time over the transfer
	ownNs           uint64  // its own account (record.CPU.Record), 0 if it gives none
}

// paired records each workload with this build and opts.CompareWith at the
// same time, --reps times in each order.
func (b *bencher) paired(ctx context.Context, lab *netlab.Lab) (*PairedResult, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the magnet binary: %w", err)
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enable bpf_stats: %w", err)
	}
	defer stats.Close()
	pr := &PairedResult{
		This: labelOr(b.opts.Label, "this build"), Other: labelOr(b.opts.CompareLabel, b.opts.CompareWith),
		Note: "both builds' `magnet record --netns <sender's namespace>` run at once, default buffer, bpf_stats enabled for these runs only",
	}
	for rep := 1; rep <= b.opts.Reps; rep++ {
		for _, w := range []struct {
			proto string
			size  int
		}{{"tcp", BulkSize}, {"tcp", SmallSize}} {
			for _, thisFirst := range []bool{true, false} {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				run, err := b.pairedRun(ctx, lab, self, w.proto, w.size, thisFirst)
				if err != nil {
					return nil, err
				}
				run.Rep = rep
				b.logf("paired rep %d %s (%s first): this %.1f ns/run, drain %.1f ns/event; other %.1f ns/run, drain %.1f ns/event",
					rep, run.Workload, map[bool]string{true: "this", false: "other"}[thisFirst],
					run.This.NsPerRun, run.This.DrainNsPerEvent, run.Other.NsPerRun, run.Other.DrainNsPerEvent)
				pr.Runs = append(pr.Runs, *run)
			}
		}
	}
	return pr, nil
}

// recorderProc is a `magnet record` process of one build, with its BPF
// programs held open for their run-time statistics.
type recorderProc struct {
	*recordProc
	progs []*ebpf.Program
}

func (b *bencher) startRecorderProc(ctx context.Context, lab *netlab.Lab, bin string) (*recorderProc, error) {
	before, err := lastProgramID()
	if err != nil {
		return nil, err
	}
	rp, err := b.startRecordProc(ctx, lab, bin)
	if err != nil {
		return nil, err
	}
	p := &recorderProc{recordProc: rp}
	if p.progs, err = magnetPrograms(before, p.cmd.Process.Pid); err != nil {
		p.kill()
		return nil, err
	}
	return p, nil
}

func (p *recorderProc) kill() {
	p.recordProc.kill()
	p.closeProgs()
}

func (p *recorderProc) closeProgs() {
	for _, pg := range p.progs {
		pg.Close()
	}
	p.progs = nil
}

// cpuNs is the process's CPU time so far, all threads, in nanoseconds.
func (p *recorderProc) cpuNs() uint64 {
	return processCPUNs(p.cmd.Process.Pid)
}

// processCPUNs is a process's CPU time so far, its threads alive now, in
// nanoseconds (schedstat: finer than the clock ticks of /proc/PID/stat).
func processCPUNs(pid int) uint64 {
	paths, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum uint64
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		f := strings.Fields(string(data))
		if len(f) > 0 {
			n, _ := strconv.ParseUint(f[0], 10, 64)
			sum += n
		}
	}
	return sum
}

// stop ends the recorder (SIGINT: it drains and closes its trace) and
// returns what it cost over the transfer.
func (p *recorderProc) stop(cpu1 uint64) (PairSide, error) {
	var s PairSide
	s.windowNs = cpu1 - p.cpu0
	for _, pg := range p.progs {
		st, err := pg.Stats()
		if err != nil {
			p.kill()
			return s, fmt.Errorf("program stats: %w", err)
		}
		s.Runs += st.RunCount
		s.RuntimeNs += uint64(st.Runtime.Nanoseconds())
	}
	p.closeProgs()
	tr, err := p.end()
	if err != nil {
		return s, err
	}
	s.Drained, s.Produced = tr.Events, tr.Produced
	s.ownNs = p.drainNs(tr)
	if s.Runs > 0 {
		s.NsPerRun = float64(s.RuntimeNs) / float64(s.Runs)
	}
	if s.Produced > 0 {
		s.NsPerEvent = float64(s.RuntimeNs) / float64(s.Produced)
	}
	return s, nil
}

// useCPUs sets both sides' CPU time the same way: from their own
// accounts if both give one, else from the transfer's window. It returns
// which (PairedRun.CPUFrom).
func useCPUs(a, b *PairSide) string {
	own := a.ownNs > 0 && b.ownNs > 0
	a.useCPU(own)
	b.useCPU(own)
	if own {
		return "summary"
	}
	return "transfer"
}

// useCPU sets the side's CPU time from its own account or the window.
func (s *PairSide) useCPU(own bool) {
	s.CPUNs = s.windowNs
	if own {
		s.CPUNs = s.ownNs
	}
	if s.Drained > 0 {
		s.DrainNsPerEvent = float64(s.CPUNs) / float64(s.Drained)
	}
}

func (b *bencher) pairedRun(ctx context.Context, lab *netlab.Lab, self, proto string, size int, thisFirst bool) (*PairedRun, error) {
	bins := []string{self, b.opts.CompareWith}
	if !thisFirst {
		bins[0], bins[1] = bins[1], bins[0]
	}
	var procs []*recorderProc
	stopped := 0
	defer func() {
		for _, p := range procs[stopped:] {
			p.kill()
		}
	}()
	for _, bin := range bins {
		p, err := b.startRecorderProc(ctx, lab, bin)
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
	}
	floor, ferr := attachEmpty("net_dev_queue")
	if ferr == nil {
		defer floor.close()
	}
	for _, p := range procs {
		p.cpu0 = p.cpuNs()
	}
	if _, err := b.transfer(ctx, lab, proto, size, b.opts.Duration, b.nextPort()); err != nil {
		return nil, err
	}
	cpu := []uint64{procs[0].cpuNs(), procs[1].cpuNs()}
	var sides [2]PairSide
	for i, p := range procs {
		s, err := p.stop(cpu[i])
		stopped++
		if err != nil {
			return nil, err
		}
		sides[i] = s
	}
	from := useCPUs(&sides[0], &sides[1])
	run := &PairedRun{Workload: fmt.Sprintf("%s flood, %d-byte messages", proto, size), ThisFirst: thisFirst, This: sides[0], Other: sides[1], CPUFrom: from}
	if !thisFirst {
		run.This, run.Other = sides[1], sides[0]
	}
	if ferr == nil {
		if st, err := floor.prog.Stats(); err == nil && st.RunCount > 0 {
			run.FloorNsPerRun = float64(st.Runtime.Nanoseconds()) / float64(st.RunCount)
		}
	}
	return run, nil
}

// cpuFrom says in words where the runs' CPU times come from.
func (p *PairedResult) cpuFrom() string {
	own, window := 0, 0
	for _, r := range p.Runs {
		if r.CPUFrom == "summary" {
			own++
		} else {
			window++
		}
	}
	const (
		ownText    = "each recorder's CPU time from the transfer's start to its last event drained: its own account in its trace summary (`recorder_cpu_ns`, probes attached to last event drained, detaching left out) less what it spent before the transfer"
		windowText = "measured over the transfer, since a build does not give its own account (this leaves out the events drained after the transfer, which a build that leaves more in its rings makes look cheaper)"
	)
	switch {
	case window == 0:
		return ownText
	case own == 0:
		return windowText
	default:
		return fmt.Sprintf("%d runs %s, %d %s", own, ownText, window, windowText)
	}
}

// PairedSummary is a workload's paired figures over repetitions and both
// orders: mean ± 95 % CI of each build's.
type PairedSummary struct {
	Workload             string `json:"workload"`
	ThisNsPerRun         Stat   `json:"this_ns_per_run"`
	OtherNsPerRun        Stat   `json:"other_ns_per_run"`
	Floor                Stat   `json:"floor_ns_per_run"`
	ThisNsPerEvent       Stat   `json:"this_ns_per_event"`
	OtherNsPerEvent      Stat   `json:"other_ns_per_event"`
	ThisDrainNsPerEvent  Stat   `json:"this_drain_ns_per_event"`
	OtherDrainNsPerEvent Stat   `json:"other_drain_ns_per_event"`
	// RunRatio is this build's ns/run over the other's, paired run by run.
	RunRatio Stat `json:"run_ratio"`
	// DrainRatio is the same for the drain.
	DrainRatio Stat `json:"drain_ratio"`
	// KernelRatio and CPURatio compare the totals over the same transfers:
	// all programs' run time, the recorder's CPU time. Builds that make
	// different events per packet compare by these, not per event.
	KernelRatio   Stat `json:"kernel_ratio"`
	CPURatio      Stat `json:"cpu_ratio"`
	Produced      Stat `json:"produced"`
	OtherProduced Stat `json:"other_produced"`
}

// Summaries groups the paired runs by workload, in the order they ran.
func (p *PairedResult) Summaries() []PairedSummary {
	var order []string
	by := map[string][]PairedRun{}
	for _, r := range p.Runs {
		if _, ok := by[r.Workload]; !ok {
			order = append(order, r.Workload)
		}
		by[r.Workload] = append(by[r.Workload], r)
	}
	var out []PairedSummary
	for _, name := range order {
		var tr, or, fl, te, oe, td, od, rr, dr, kr, cr, pr, op []float64
		for _, r := range by[name] {
			tr, or = append(tr, r.This.NsPerRun), append(or, r.Other.NsPerRun)
			if r.FloorNsPerRun > 0 {
				fl = append(fl, r.FloorNsPerRun)
			}
			te, oe = append(te, r.This.NsPerEvent), append(oe, r.Other.NsPerEvent)
			td, od = append(td, r.This.DrainNsPerEvent), append(od, r.Other.DrainNsPerEvent)
			if r.Other.NsPerRun > 0 {
				rr = append(rr, r.This.NsPerRun/r.Other.NsPerRun)
			}
			if r.Other.DrainNsPerEvent > 0 {
				dr = append(dr, r.This.DrainNsPerEvent/r.Other.DrainNsPerEvent)
			}
			if r.Other.RuntimeNs > 0 {
				kr = append(kr, float64(r.This.RuntimeNs)/float64(r.Other.RuntimeNs))
			}
			if r.Other.CPUNs > 0 {
				cr = append(cr, float64(r.This.CPUNs)/float64(r.Other.CPUNs))
			}
			pr, op = append(pr, float64(r.This.Produced)), append(op, float64(r.Other.Produced))
		}
		out = append(out, PairedSummary{
			Workload: name, ThisNsPerRun: Summarize(tr), OtherNsPerRun: Summarize(or), Floor: Summarize(fl),
			ThisNsPerEvent: Summarize(te), OtherNsPerEvent: Summarize(oe),
			ThisDrainNsPerEvent: Summarize(td), OtherDrainNsPerEvent: Summarize(od),
			RunRatio: Summarize(rr), DrainRatio: Summarize(dr), KernelRatio: Summarize(kr), CPURatio: Summarize(cr),
			Produced: Summarize(pr), OtherProduced: Summarize(op),
		})
	}
	return out
}
