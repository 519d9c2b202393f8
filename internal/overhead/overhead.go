// SPDX-License-Identifier: Apache-2.0

// Package overhead measures what recording costs on this host, the way
// users measure it: a real workload (iperf3) between two network
// namespaces over a veth pair, at a fixed rate below saturation and at
// saturation, with nothing, with magnet record in each of its
// configurations and with other tools (tcpdump, perf, bpftrace), the
// configurations interleaved and unpinned; CPU time over all CPUs from
// /proc/stat per GB received, and throughput. What a program body costs
// (bpf_stats) is measured apart, as a diagnostic: it is not what the system
// pays for a hook (entry, trampolines, the kernel paths it turns on, cache
// and wake-ups).
//
// Everything here needs root, iproute2 and iperf3.
package overhead

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// ErrNotRoot is returned by Measure when not run as root.
var ErrNotRoot = errors.New("need root: network namespaces, BPF and the tracers (run with sudo)")

// Options configures Run.
type Options struct {
	// Magnet is the magnet binary whose record is measured (and whose
	// workload runs with Workload MagnetFlood).
	Magnet string
	// Workload is Iperf3 or MagnetFlood.
	Workload string
	// RateMbit is the fixed rate below saturation (tc tbf on the veth).
	RateMbit int
	// Reps is the number of repetitions; each runs every configuration
	// once, in an order of its own (repOrders).
	Reps int
	// GoalReps is the number of repetitions after those that run only
	// the configurations the goals compare (GoalConfigs), so that the
	// goals' intervals narrow without every configuration paying for it.
	// Fixed before the run starts: stopping once a verdict looks decided
	// would bias it.
	GoalReps int
	// Duration of each transfer (whole seconds: iperf3 -t).
	Duration time.Duration
	// Configs run at the fixed rate; Saturation on the unlimited veth
	// (none: no saturation phase). The baseline must come first in both.
	Configs, Saturation []Config
	// Diagnostic adds one run of magnet record's default groups at the
	// fixed rate with bpf_stats on, for the per-program table.
	Diagnostic bool
	// TcpdumpSnaplen is tcpdump's -s.
	TcpdumpSnaplen int
	// WorkDir holds the tracers' output files while they run (the
	// system's temporary directory if empty).
	WorkDir string
	// Seed draws each repetition's order of the configurations; 0 draws
	// the seed itself (the report keeps it, so a run can be repeated in
	// the same orders).
	Seed uint64
	// Log gets a line per run; nil for none.
	Log io.Writer
	// Command is what was typed, for the report.
	Command string
}

// Measure measures. It fails only if the measurement cannot be made at all (no
// lab, no workload); a configuration that fails in a repetition is
// reported with its error and left out of the figures.
func Measure(ctx context.Context, opts Options) (*Report, error) {
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	if err := netlab.Available(); err != nil {
		return nil, err
	}
	if opts.Workload == Iperf3 {
		if _, err := exec.LookPath("iperf3"); err != nil {
			return nil, errors.New("iperf3 not installed (bench/cost.sh installs it; or --workload magnet)")
		}
	}
	if opts.GoalReps < 0 {
		return nil, fmt.Errorf("want no negative number of goal repetitions, got %d", opts.GoalReps)
	}
	if opts.Reps < 1 || opts.Duration < time.Second || opts.RateMbit < 1 {
		return nil, fmt.Errorf("want at least 1 repetition of 1s at 1 Mbit/s, got %d of %v at %d", opts.Reps, opts.Duration, opts.RateMbit)
	}
	if len(opts.Configs) == 0 || opts.Configs[0].Name != Baseline || len(opts.Saturation) > 0 && opts.Saturation[0].Name != Baseline {
		return nil, errors.New("the baseline must be the first configuration")
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	work, err := os.MkdirTemp(opts.WorkDir, "magnet-bench-")
	if err != nil {
		return nil, fmt.Errorf("work directory: %w", err)
	}
	defer os.RemoveAll(work)

	if opts.Seed == 0 {
		opts.Seed = rand.Uint64() | 1
	}
	rep := newReport(opts)
	rep.WorkDir = filepath.Dir(work)
	m := &measurer{opts: opts, work: work, rep: rep}
	if err := m.phase(ctx, PhaseFixed, opts.RateMbit, opts.Configs); err != nil {
		return nil, err
	}
	if len(opts.Saturation) > 0 {
		if err := m.phase(ctx, PhaseSaturation, 0, opts.Saturation); err != nil {
			return nil, err
		}
	}
	if opts.Diagnostic {
		if rep.Diagnostic, err = m.diagnostic(ctx, recordModes[0]); err != nil {
			rep.Notes = append(rep.Notes, "diagnostic not run: "+err.Error())
		}
		// Summary mode's programs, for its cost by parts (goals): its
		// whole-machine figure is below what the run's noise resolves.
		if s := configNamed(opts.Configs, RecordSummary); s != nil {
			if rep.SummaryDiagnostic, err = m.diagnostic(ctx, *s); err != nil {
				rep.Notes = append(rep.Notes, "summary mode's diagnostic not run: "+err.Error())
			}
		}
	}
	rep.Ended = time.Now().UTC()
	rep.summarize()
	return rep, nil
}

// Phases of a measurement.
const (
	PhaseFixed      = "fixed"
	PhaseSaturation = "saturation"
	PhaseDiagnostic = "diagnostic"
)

type measurer struct {
	opts Options
	work string
	rep  *Report
	seq  int
}

// phase builds a lab at rateMbit (0: unlimited) and runs configs, opts.Reps
// times, interleaved, then those of them the goals compare opts.GoalReps
// times more.
func (m *measurer) phase(ctx context.Context, phase string, rateMbit int, configs []Config) error {
	lab, err := netlab.New(netlab.Options{Name: "mgbench", RateMbit: rateMbit})
	if err != nil {
		return err
	}
	defer lab.Close()
	wl, err := m.workload(lab)
	if err != nil {
		return err
	}
	defer wl.close()
	for i, cs := range repOrders(configs, m.opts.Reps, m.opts.GoalReps, m.opts.Seed, phase) {
		r := i + 1
		for _, c := range cs {
			if why := c.unavailable(); why != "" {
				m.rep.Unavailable[c.Name] = why
				continue
			}
			run := m.runOne(ctx, lab, wl, c, hooks{})
			run.Phase, run.Rep = phase, r
			m.rep.Runs = append(m.rep.Runs, run)
			m.log(run)
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	return nil
}

// repOrders is the configurations each repetition of phase runs, in its
// order: every configuration in the first reps, those the goals compare
// in the goalReps after. Each repetition has an order of its own: in a
// fixed order, whatever drifts within a repetition (what the
// configurations before leave behind, the host's own periodic work) lands
// on the same configurations every time; the A/A pair measured a 2 % bias
// between the first slot and the seventh (+2.1 ± 1.7 % over 28
// repetitions). Shuffled, it is noise the intervals count.
func repOrders(configs []Config, reps, goalReps int, seed uint64, phase string) [][]Config {
	order := rand.New(rand.NewPCG(seed, seedStream(phase)))
	goalOnly := goalConfigs(configs)
	var out [][]Config
	for r := 1; r <= reps+goalReps; r++ {
		cs := configs
		if r > reps {
			cs = goalOnly
		}
		cs = slices.Clone(cs)
		order.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
		out = append(out, cs)
	}
	return out
}

// seedStream tells the phases' orders apart under one seed.
func seedStream(phase string) uint64 {
	if phase == PhaseSaturation {
		return 2
	}
	return 1
}

func (m *measurer) workload(lab *netlab.Lab) (workload, error) {
	if m.opts.Workload == MagnetFlood {
		return &magnetFlood{lab: lab, bin: m.opts.Magnet}, nil
	}
	return startIperf3(lab)
}

func (m *measurer) log(r Run) {
	reps := m.opts.Reps + m.opts.GoalReps
	if r.Phase == PhaseDiagnostic {
		reps = 1
	}
	if r.Err != "" {
		fmt.Fprintf(m.opts.Log, "%s %d/%d %-16s failed: %s\n", r.Phase, r.Rep, reps, r.Config, r.Err)
		return
	}
	fmt.Fprintf(m.opts.Log, "%s %d/%d %-16s %6.2f Gbit/s  %6.3f CPU s/GB (tracer %.3f)  %9d events  %d lost\n",
		r.Phase, r.Rep, reps, r.Config, r.Gbps(), r.CPUPerGB(), r.TracerS/r.GB(), r.Events, r.Lost)
}

// hooks run beside a transfer with the tracer's process id: start just
// after the CPU is first read, end just after the transfer, before the
// tracer stops.
type hooks struct{ start, end func(pid int) }

// settleLimit bounds each wait for a quiet machine (settle); a run that
// starts without one is marked Unsettled and counted in the report.
const settleLimit = 5 * time.Second

// runOne runs the workload once under c. CPU is read from /proc/stat just
// before the sender starts and just after the transfer ends: the tracer's
// start and its end (loading programs, writing out what it holds) are not
// what recording costs while the workload runs.
func (m *measurer) runOne(ctx context.Context, lab *netlab.Lab, wl workload, c Config, h hooks) Run {
	run := Run{Config: c.Name, TraceSent: -1, TraceRecv: -1}
	m.seq++
	quiet := settle(settleLimit)
	var (
		t   tracer
		err error
	)
	switch c.Kind {
	case Nothing:
		t = nothing{}
	case Magnet:
		t, err = startMagnet(ctx, m.opts.Magnet, m.work, m.seq, c, netip.AddrPortFrom(lab.Server.Addr, dataPort), lab.Client.Addr)
	case Tcpdump:
		t, err = startTcpdump(lab, m.work, m.seq, m.opts.TcpdumpSnaplen)
	case Perf:
		t, err = startPerf(ctx, m.work, m.seq)
	case Bpftrace:
		t, err = startBpftrace(ctx, m.work, m.seq)
	default:
		err = fmt.Errorf("unknown kind %d", c.Kind)
	}
	if err != nil {
		run.Err = err.Error()
		return run
	}
	// Settled again once the tracer runs: its start-up is not recording.
	run.Unsettled = !(settle(settleLimit) && quiet)
	var busy0 cpuSample
	var proc0 uint64
	var berr error
	x, werr := wl.run(ctx, m.opts.Duration, func() {
		busy0, berr = sampleCPU()
		proc0 = procCPU(t.pid())
		if h.start != nil {
			h.start(t.pid())
		}
	})
	busy1, berr1 := sampleCPU()
	proc1 := procCPU(t.pid())
	if h.end != nil && werr == nil {
		h.end(t.pid())
	}
	tr, serr := t.stop()
	switch {
	case werr != nil:
		run.Err = werr.Error()
		return run
	case berr != nil || berr1 != nil:
		run.Err = errors.Join(berr, berr1).Error()
		return run
	case serr != nil:
		run.Err = serr.Error()
		return run
	}
	run.Sent, run.Received, run.Seconds = x.Sent, x.Received, x.Seconds
	run.BusyS, run.BusyTickedS = busyBetween(busy0, busy1)
	if proc1 >= proc0 {
		run.TracerS = float64(proc1-proc0) / 1e9
	}
	run.Events, run.Lost, run.Written = tr.Events, tr.Lost, tr.Written
	run.TraceSent, run.TraceRecv = tr.TraceSent, tr.TraceRecv
	return run
}

// diagnostic runs rec (one of magnet record's modes) once at the fixed
// rate with bpf_stats on, and reads each program's runs and run time over
// the transfer. Kept apart from the figures: bpf_stats itself adds two
// clock reads to every program run.
func (m *measurer) diagnostic(ctx context.Context, rec Config) (*Diagnostic, error) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enable bpf_stats: %w", err)
	}
	defer stats.Close()
	lab, err := netlab.New(netlab.Options{Name: "mgbench", RateMbit: m.opts.RateMbit})
	if err != nil {
		return nil, err
	}
	defer lab.Close()
	wl, err := m.workload(lab)
	if err != nil {
		return nil, err
	}
	defer wl.close()
	var before, after map[uint32]progCounts
	var perr, perr1 error
	run := m.runOne(ctx, lab, wl, rec, hooks{
		start: func(pid int) { before, perr = processProgs(pid) },
		end:   func(pid int) { after, perr1 = processProgs(pid) },
	})
	run.Phase, run.Rep = PhaseDiagnostic, 1
	m.log(run)
	if run.Err != "" {
		return nil, errors.New(run.Err)
	}
	if err := errors.Join(perr, perr1); err != nil {
		return nil, err
	}
	return &Diagnostic{Run: run, Programs: progDiff(before, after, float64(run.Received)/1e9)}, nil
}
