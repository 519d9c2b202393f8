// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/record"
)

// Machine describes where the bench ran.
type Machine struct {
	CPU    string  `json:"cpu"`
	Cores  int     `json:"cores"`
	Kernel string  `json:"kernel"`
	MHz    float64 `json:"mhz"` // "cpu MHz" of /proc/cpuinfo, for ns → cycles
}

func readMachine() Machine {
	m := Machine{Cores: runtime.NumCPU()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Sysname[:]) + " " + unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Machine[:])
	}
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case k == "model name" && m.CPU == "":
			m.CPU = v
		case k == "cpu MHz" && m.MHz == 0:
			m.MHz, _ = strconv.ParseFloat(v, 64)
		}
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
	UserNsPerEvent   float64 `json:"user_ns_per_event"`
	ThroughputMbit   float64 `json:"throughput_mbit"`
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
	for _, w := range []struct {
		proto string
		size  int
	}{{"tcp", BulkSize}, {"tcp", SmallSize}} {
		run, err := b.costRun(ctx, lab, w.proto, w.size)
		if err != nil {
			return nil, err
		}
		b.logf("cost %s: kernel %.1f ns/run, %.1f ns/event; user %.1f ns/event", run.Workload, run.KernelNsPerRun, run.KernelNsPerEvent, run.UserNsPerEvent)
		cr.Runs = append(cr.Runs, *run)
	}
	return cr, nil
}

func (b *bencher) costRun(ctx context.Context, lab *netlab.Lab, proto string, size int) (*CostRun, error) {
	before, err := lastProgramID()
	if err != nil {
		return nil, err
	}
	var progs []*ebpf.Program
	var openErr error
	defer func() {
		for _, p := range progs {
			p.Close()
		}
	}()
	port := b.nextPort()
	t, err := b.startRecord(ctx, record.Filters{NetNS: lab.Client.NS}, record.DefaultBufferBytes, func() {
		progs, openErr = magnetPrograms(before)
	})
	if err != nil {
		return nil, err
	}
	x, xerr := b.transfer(ctx, lab, proto, size, b.opts.Duration, port)
	tr, err := t.stop()
	if xerr != nil {
		return nil, xerr
	}
	if err != nil {
		return nil, err
	}
	if openErr != nil {
		return nil, openErr
	}
	if len(progs) == 0 {
		return nil, errors.New("no magnet programs found to read bpf_stats from")
	}
	run := &CostRun{Workload: fmt.Sprintf("%s flood, %d-byte messages", proto, size), Produced: tr.Produced, Drained: tr.Events, Lost: tr.Lost, UserCPUS: tr.CPUS}
	if x.WallS > 0 {
		run.ThroughputMbit = float64(x.RecvBytes) * 8 / x.WallS / 1e6
	}
	var runs, ns uint64
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
		runs += pc.RunCount
		ns += pc.RuntimeNs
		run.Programs = append(run.Programs, pc)
	}
	sort.Slice(run.Programs, func(i, j int) bool { return run.Programs[i].RuntimeNs > run.Programs[j].RuntimeNs })
	if runs > 0 {
		run.KernelNsPerRun = float64(ns) / float64(runs)
	}
	if tr.Produced > 0 {
		run.KernelNsPerEvent = float64(ns) / float64(tr.Produced)
	}
	if tr.Events > 0 {
		run.UserNsPerEvent = tr.CPUS * 1e9 / float64(tr.Events)
	}
	return run, nil
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
// magnet's (the kernel keeps 15 characters of a name).
func magnetPrograms(after ebpf.ProgramID) ([]*ebpf.Program, error) {
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
