// SPDX-License-Identifier: Apache-2.0

package overhead

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/magnet-tracer/magnet/internal/benchstat"
)

// Run is one transfer under one configuration.
type Run struct {
	Phase  string `json:"phase"`
	Rep    int    `json:"rep"`
	Config string `json:"config"`
	// Sent and Received are the workload's own counts (iperf3: its
	// sender's and its receiver's); Seconds is its time.
	Sent     uint64  `json:"sent_bytes"`
	Received uint64  `json:"received_bytes"`
	Seconds  float64 `json:"seconds"`
	// BusyS is the CPU time of all CPUs over the transfer: their elapsed
	// time less /proc/stat's idle, iowait and steal (busyBetween).
	BusyS float64 `json:"busy_cpu_s"`
	// BusyTickedS is the same from /proc/stat's busy columns (user, nice,
	// system, irq, softirq, less guest), which the kernel samples at each
	// tick: kept to compare, noisier.
	BusyTickedS float64 `json:"busy_cpu_ticked_s"`
	// TracerS is the tracer process's own CPU time over the same span.
	TracerS float64 `json:"tracer_cpu_s"`
	Events  uint64  `json:"events"`
	Lost    uint64  `json:"lost"` // tcpdump: dropped by kernel
	Written int64   `json:"written_bytes"`
	// TraceSent and TraceRecv: a magnet trace's application bytes on the
	// data connection (-1: no socket events, or not a magnet trace).
	TraceSent int64 `json:"trace_sent_bytes"`
	TraceRecv int64 `json:"trace_received_bytes"`
	// Unsettled: the machine was not quiet (settle) before the tracer
	// started or before the transfer began, within settleLimit.
	Unsettled bool   `json:"unsettled,omitempty"`
	Err       string `json:"error,omitempty"`
}

// GB is the data received, in 10^9 bytes.
func (r Run) GB() float64 { return float64(r.Received) / 1e9 }

// CPUPerGB is the machine's CPU seconds per GB received.
func (r Run) CPUPerGB() float64 { return r.BusyS / r.GB() }

// Gbps is the received throughput.
func (r Run) Gbps() float64 { return float64(r.Received) * 8 / r.Seconds / 1e9 }

// Row summarizes one configuration of a phase over its repetitions.
type Row struct {
	Config string `json:"config"`
	What   string `json:"what"`
	Runs   int    `json:"runs"` // measured; Failed more failed
	Failed int    `json:"failed,omitempty"`
	// Per repetition, mean and 95 % interval.
	Gbps     benchstat.Interval `json:"gbps"`
	CPUPerGB benchstat.Interval `json:"cpu_s_per_gb"`
	// MoreCPU: CPU per GB against the same repetition's baseline, %.
	MoreCPU benchstat.Interval `json:"more_cpu_per_gb_pct"`
	// Loss: throughput lost against the same repetition's baseline, %.
	Loss        benchstat.Interval `json:"throughput_loss_pct"`
	EventsPerGB benchstat.Interval `json:"events_per_gb"`
	// NsPerEvent: the CPU added per GB against the baseline, per event.
	NsPerEvent benchstat.Interval `json:"added_ns_per_event"`
	// TracerPerGB: the tracer process's own CPU seconds per GB.
	TracerPerGB benchstat.Interval `json:"tracer_cpu_s_per_gb"`
	Lost        uint64             `json:"lost"`
	// Accounting is set for magnet traces with socket events: how the
	// trace's bytes on the data connection compare with the workload's.
	Accounting string `json:"accounting,omitempty"`
}

// Goal is one of the users' figures against its goal.
type Goal struct {
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	Verdict  string `json:"verdict"` // met, not met, undecided, not measured
}

// Diagnostic is the per-program bpf_stats of one recorded transfer.
type Diagnostic struct {
	Run      Run        `json:"run"`
	Programs []ProgStat `json:"programs"`
}

// Report is a whole measurement.
type Report struct {
	Started  time.Time `json:"started"`
	Ended    time.Time `json:"ended"`
	Command  string    `json:"command"`
	Host     string    `json:"host"`
	Workload string    `json:"workload"`
	RateMbit int       `json:"rate_mbit"`
	Reps     int       `json:"reps"`
	// GoalReps: repetitions after Reps of the goals' configurations only.
	GoalReps int `json:"goal_reps,omitempty"`
	// Seed drew each repetition's order of the configurations.
	Seed     uint64  `json:"seed"`
	Duration float64 `json:"duration_s"`
	// WorkDir is where the tracers wrote their files.
	WorkDir string `json:"work_dir"`
	// BPFStatsOn: someone had bpf_stats on when the run began, which adds
	// two clock reads to every BPF program run, magnet's included.
	BPFStatsOn  bool              `json:"bpf_stats_on,omitempty"`
	Configs     []Config          `json:"configs"`
	SatConfigs  []Config          `json:"saturation_configs,omitempty"`
	Unavailable map[string]string `json:"unavailable,omitempty"`
	Runs        []Run             `json:"runs"`
	Fixed       []Row             `json:"fixed"`
	Saturation  []Row             `json:"saturation,omitempty"`
	Goals       []Goal            `json:"goals"`
	Diagnostic  *Diagnostic       `json:"diagnostic,omitempty"`
	// SummaryDiagnostic is the same for summary mode.
	SummaryDiagnostic *Diagnostic `json:"summary_diagnostic,omitempty"`
	Notes             []string    `json:"notes,omitempty"`
}

func newReport(opts Options) *Report {
	r := &Report{
		Started: time.Now().UTC(), Command: opts.Command, Host: hostLine(),
		Workload: opts.Workload, RateMbit: opts.RateMbit, Reps: opts.Reps, GoalReps: opts.GoalReps, Seed: opts.Seed,
		Duration: opts.Duration.Seconds(), Configs: opts.Configs, SatConfigs: opts.Saturation,
		Unavailable: map[string]string{},
	}
	if b, err := os.ReadFile("/proc/sys/kernel/bpf_stats_enabled"); err == nil && strings.TrimSpace(string(b)) != "0" {
		r.BPFStatsOn = true
	}
	return r
}

// hostLine says what the host is: kernel, CPUs, CPU model.
func hostLine() string {
	var parts []string
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		parts = append(parts, "Linux "+strings.TrimSpace(string(b)))
	}
	parts = append(parts, fmt.Sprintf("%d CPUs", runtime.NumCPU()))
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				parts = append(parts, strings.TrimSpace(v))
				break
			}
		}
	}
	return strings.Join(parts, ", ")
}

// summarize computes the rows and the goals from the runs.
func (r *Report) summarize() {
	r.Fixed = r.rows(PhaseFixed, r.Configs)
	r.Saturation = r.rows(PhaseSaturation, r.SatConfigs)
	r.Goals = r.goals()
}

// byRep returns the successful runs of config in phase by repetition.
func (r *Report) byRep(phase, config string) map[int]Run {
	out := map[int]Run{}
	for _, run := range r.Runs {
		if run.Phase == phase && run.Config == config && run.Err == "" && run.Received > 0 {
			out[run.Rep] = run
		}
	}
	return out
}

// perRep applies f to each repetition where both config and the baseline
// were measured; NaN where f cannot say.
func (r *Report) perRep(phase, config string, f func(run, base Run) float64) []float64 {
	runs, base := r.byRep(phase, config), r.byRep(phase, Baseline)
	var out []float64
	for rep := 1; rep <= r.Reps+r.GoalReps; rep++ {
		run, ok1 := runs[rep]
		b, ok2 := base[rep]
		if ok1 && ok2 {
			out = append(out, f(run, b))
		}
	}
	return out
}

func moreCPU(run, base Run) float64 { return (run.CPUPerGB()/base.CPUPerGB() - 1) * 100 }
func loss(run, base Run) float64    { return (1 - run.Gbps()/base.Gbps()) * 100 }

func (r *Report) rows(phase string, configs []Config) []Row {
	var rows []Row
	for _, c := range configs {
		if _, skip := r.Unavailable[c.Name]; skip {
			continue
		}
		row := Row{Config: c.Name, What: c.What}
		var gbps, cpu, evs, tracer []float64
		accounted, exact := 0, 0
		var worst string
		for _, run := range r.Runs {
			if run.Phase != phase || run.Config != c.Name {
				continue
			}
			if run.Err != "" || run.Received == 0 {
				row.Failed++
				continue
			}
			row.Runs++
			gbps = append(gbps, run.Gbps())
			cpu = append(cpu, run.CPUPerGB())
			if c.Kind != Nothing {
				evs = append(evs, float64(run.Events)/run.GB())
				tracer = append(tracer, run.TracerS/run.GB())
			}
			row.Lost += run.Lost
			if run.TraceRecv >= 0 {
				accounted++
				if d := r.accountingDiff(run); d == "" {
					exact++
				} else {
					worst = d
				}
			}
		}
		row.Gbps, row.CPUPerGB = benchstat.Summarize(gbps), benchstat.Summarize(cpu)
		if c.Name != Baseline {
			row.MoreCPU = benchstat.Summarize(r.perRep(phase, c.Name, moreCPU))
			row.Loss = benchstat.Summarize(r.perRep(phase, c.Name, loss))
		}
		if c.Kind != Nothing {
			row.EventsPerGB, row.TracerPerGB = benchstat.Summarize(evs), benchstat.Summarize(tracer)
			row.NsPerEvent = benchstat.Summarize(r.perRep(phase, c.Name, func(run, base Run) float64 {
				if run.Events == 0 {
					return math.NaN()
				}
				return (run.CPUPerGB() - base.CPUPerGB()) * 1e9 / (float64(run.Events) / run.GB())
			}))
		}
		if accounted > 0 {
			row.Accounting = fmt.Sprintf("%d of %d exact", exact, accounted)
			if worst != "" {
				row.Accounting += " (" + worst + ")"
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// iperf3Cookie is the 37-byte cookie iperf3 sends on each data connection
// before the test's data: the socket calls see it, iperf3's byte counts
// do not.
const iperf3Cookie = 37

// accountingDiff compares a magnet trace's bytes on the data connection
// with the workload's counts: "" when both are exact, else what differs.
func (r *Report) accountingDiff(run Run) string {
	var cookie int64
	if r.Workload == Iperf3 {
		cookie = iperf3Cookie
	}
	ds := run.TraceSent - int64(run.Sent) - cookie
	dr := run.TraceRecv - int64(run.Received) - cookie
	if ds == 0 && dr == 0 {
		return ""
	}
	return fmt.Sprintf("trace − workload's count − cookie: sent %+d, received %+d bytes", ds, dr)
}

func (r *Report) row(rows []Row, config string) *Row {
	for i := range rows {
		if rows[i].Config == config {
			return &rows[i]
		}
	}
	return nil
}

// pct formats an interval in per cent.
func pct(s benchstat.Interval) string {
	if s.N == 0 || math.IsNaN(s.Mean) {
		return "–"
	}
	if s.N < 2 {
		return fmt.Sprintf("%+.1f %%", s.Mean)
	}
	return fmt.Sprintf("%+.1f ± %.1f %%", s.Mean, s.Half)
}

// goals judges the goals on the 95 % intervals.
func (r *Report) goals() []Goal {
	var gs []Goal
	rate := fmt.Sprintf("%g Gbit/s", float64(r.RateMbit)/1000)
	notMeasured := func(goal, config string) Goal {
		return Goal{Goal: goal, Measured: "no " + config + " configuration in this run", Verdict: "not measured"}
	}
	paired := func(phase, a, b string, f func(run, base Run) float64, scale float64) benchstat.Interval {
		ra, rb, base := r.byRep(phase, a), r.byRep(phase, b), r.byRep(phase, Baseline)
		var xs []float64
		for rep := 1; rep <= r.Reps+r.GoalReps; rep++ {
			x, ok1 := ra[rep]
			y, ok2 := rb[rep]
			z, ok3 := base[rep]
			if ok1 && ok2 && ok3 {
				xs = append(xs, f(x, z)-scale*f(y, z))
			}
		}
		return benchstat.Summarize(xs)
	}

	g := "default groups at " + rate + ": ≤ 5 % more CPU per GB than the baseline"
	if rec := r.row(r.Fixed, Record); rec != nil {
		m := pct(rec.MoreCPU)
		// The hooks alone: what any design that keeps a program per
		// packet per layer pays before its bodies do anything.
		if fl := r.row(r.Fixed, RecordFloor); fl != nil {
			m += fmt.Sprintf("; the hooks alone (record-floor) %s", pct(fl.MoreCPU))
		}
		gs = append(gs, Goal{Goal: g, Measured: m, Verdict: string(rec.MoreCPU.AtMost(5))})
	} else {
		gs = append(gs, notMeasured(g, Record))
	}
	g = "default groups at " + rate + ": less than tcpdump -s 96's"
	if rec, td := r.row(r.Fixed, Record), r.row(r.Fixed, TcpdumpName); rec != nil && td != nil {
		d := paired(PhaseFixed, Record, TcpdumpName, moreCPU, 1)
		gs = append(gs, Goal{Goal: g, Measured: fmt.Sprintf("%s against %s; difference %s", pct(rec.MoreCPU), pct(td.MoreCPU), pct(d)), Verdict: string(strictlyBelow(d))})
	} else {
		gs = append(gs, notMeasured(g, "record or tcpdump"))
	}
	g = "summary mode: ≤ 1 % more CPU per GB"
	if s := r.row(r.Fixed, RecordSummary); s != nil {
		gs = append(gs, Goal{Goal: g, Measured: pct(s.MoreCPU), Verdict: string(s.MoreCPU.AtMost(1))})
	} else {
		gs = append(gs, notMeasured(g, RecordSummary))
	}
	if s := r.summaryByParts(); s != nil {
		gs = append(gs, *s)
	}
	g = "flight recorder between triggers: ≤ the default groups' cost"
	if f, rec := r.row(r.Fixed, RecordFlight), r.row(r.Fixed, Record); f != nil && rec != nil {
		d := paired(PhaseFixed, RecordFlight, Record, moreCPU, 1)
		gs = append(gs, Goal{Goal: g, Measured: fmt.Sprintf("%s against %s; difference %s", pct(f.MoreCPU), pct(rec.MoreCPU), pct(d)), Verdict: string(d.AtMost(0))})
	} else {
		gs = append(gs, notMeasured(g, RecordFlight))
	}
	if f := r.flightByParts(paired); f != nil {
		gs = append(gs, *f)
	}
	g = "saturation: throughput loss at most half of tcpdump -s 96's, same run"
	if rec, td := r.row(r.Saturation, Record), r.row(r.Saturation, TcpdumpName); rec != nil && td != nil {
		d := paired(PhaseSaturation, Record, TcpdumpName, loss, 0.5)
		m := fmt.Sprintf("%s against %s; loss − half of tcpdump's %s", pct(rec.Loss), pct(td.Loss), pct(d))
		if fl := r.row(r.Saturation, RecordFloor); fl != nil {
			df := paired(PhaseSaturation, RecordFloor, TcpdumpName, loss, 0.5)
			m += fmt.Sprintf("; the hooks alone (record-floor) lose %s, − half of tcpdump's %s", pct(fl.Loss), pct(df))
		}
		gs = append(gs, Goal{Goal: g, Measured: m, Verdict: string(d.AtMost(0))})
	} else {
		gs = append(gs, notMeasured(g, "saturation record or tcpdump"))
	}

	var lost uint64
	recorded, accounted, exact := 0, 0, 0
	for _, run := range r.Runs {
		if run.Err != "" || !r.isMagnet(run.Config) {
			continue
		}
		recorded++
		lost += run.Lost
		if run.TraceRecv >= 0 {
			accounted++
			if r.accountingDiff(run) == "" {
				exact++
			}
		}
	}
	g = "nothing lost"
	switch {
	case recorded == 0:
		gs = append(gs, notMeasured(g, "magnet"))
	case lost == 0:
		gs = append(gs, Goal{Goal: g, Measured: fmt.Sprintf("0 events lost in %d recorded transfers", recorded), Verdict: string(benchstat.Met)})
	default:
		gs = append(gs, Goal{Goal: g, Measured: fmt.Sprintf("%d events lost in %d recorded transfers", lost, recorded), Verdict: string(benchstat.NotMet)})
	}
	g = "byte accounting unchanged (the trace's socket bytes on the data connection = the workload's own counts)"
	switch {
	case accounted == 0:
		gs = append(gs, Goal{Goal: g, Measured: "no transfer recorded with socket events", Verdict: "not measured"})
	case exact == accounted:
		gs = append(gs, Goal{Goal: g, Measured: fmt.Sprintf("exact in %d of %d transfers", exact, accounted), Verdict: string(benchstat.Met)})
	default:
		gs = append(gs, Goal{Goal: g, Measured: fmt.Sprintf("exact in %d of %d transfers", exact, accounted), Verdict: string(benchstat.NotMet)})
	}
	// The A/A comparison: what this run's noise alone makes of the
	// figures above. No goal; each verdict is only as sharp as this.
	if a := r.row(r.Fixed, BaselineAgain); a != nil {
		m := pct(a.MoreCPU)
		if s := r.row(r.Saturation, BaselineAgain); s != nil {
			m += fmt.Sprintf("; at saturation, throughput loss %s", pct(s.Loss))
		}
		gs = append(gs, Goal{Goal: "the run's own noise: the baseline again in each repetition, against the baseline (no goal: 0 is the truth)", Measured: m, Verdict: "reference"})
	}
	return gs
}

// dispatchBoundNs is what summaryByParts counts for each run of a program
// beyond its body (the hook's entry and what it turns on): ten times what
// a run of the default groups costs the whole machine all in (~90 ns: the
// record row's added CPU over its program runs).
const dispatchBoundNs = 1000

// summaryByParts judges summary mode's goal by what it adds, each part
// measured directly: its recorder process (schedstat, every run), its BPF
// programs' run time (bpf_stats, SummaryDiagnostic) and each run's hook
// entry, bounded by dispatchBoundNs. Its whole-machine figure is the sum of
// these and of what they cause elsewhere (cache, wake-ups), which for a
// recorder that wakes about once per interval and programs that run a few
// hundred times per GB is far below what this run's noise resolves: the
// whole-machine verdict stays the first; this one says what the parts
// allow. nil when the run has no summary row or diagnostic.
func (r *Report) summaryByParts() *Goal {
	s, base, d := r.row(r.Fixed, RecordSummary), r.row(r.Fixed, Baseline), r.SummaryDiagnostic
	if s == nil || base == nil || d == nil || s.TracerPerGB.N < 2 || base.CPUPerGB.N == 0 || d.Run.Received == 0 {
		return nil
	}
	var bodyNs, runs float64
	for _, pr := range d.Programs {
		bodyNs += pr.NsPerGB
		runs += float64(pr.Runs)
	}
	runsPerGB := runs / d.Run.GB()
	fixed := bodyNs/1e9 + runsPerGB*dispatchBoundNs/1e9 // s per GB
	b := base.CPUPerGB.Mean
	parts := benchstat.Interval{Mean: (s.TracerPerGB.Mean + fixed) / b * 100, Half: s.TracerPerGB.Half / b * 100, N: s.TracerPerGB.N}
	return &Goal{
		Goal: "summary mode: ≤ 1 % more CPU per GB, by its parts (what the whole-machine interval above cannot resolve)",
		Measured: fmt.Sprintf("%s: its recorder process %.2f ± %.2f ms per GB (schedstat, every run), its programs' bodies %.3f ms per GB and %.0f runs per GB counted at %d ns each (bpf_stats, one transfer), over the baseline's %.3f CPU s per GB",
			pct(parts), s.TracerPerGB.Mean*1e3, s.TracerPerGB.Half*1e3, bodyNs/1e6, runsPerGB, dispatchBoundNs, b),
		Verdict: string(parts.AtMost(1)),
	}
}

// flightByParts judges the flight recorder's goal by what differs from the
// default groups: the same programs write the same events, and the
// recorder processes differ, one copying records
// into memory, the other writing them to a file (whose page cache
// writeback, done by kernel threads, only adds to the default's). The
// paired difference of the recorder processes' CPU per GB (schedstat) has
// none of the transfers' own noise. nil without both rows.
func (r *Report) flightByParts(paired func(phase, a, b string, f func(run, base Run) float64, scale float64) benchstat.Interval) *Goal {
	f, rec := r.row(r.Fixed, RecordFlight), r.row(r.Fixed, Record)
	if f == nil || rec == nil || f.TracerPerGB.N < 2 || rec.TracerPerGB.N < 2 {
		return nil
	}
	tracer := func(run, _ Run) float64 { return run.TracerS / run.GB() * 1e3 }
	d := paired(PhaseFixed, RecordFlight, Record, tracer, 1)
	return &Goal{
		Goal: "flight recorder between triggers: ≤ the default groups' cost, by its parts (the same programs; the recorder processes differ)",
		Measured: fmt.Sprintf("recorder process %.2f ± %.2f against %.2f ± %.2f ms per GB; paired difference %+.2f ± %.2f ms per GB; the kernel side is the default groups' own programs, whose records go to memory instead of a file",
			f.TracerPerGB.Mean*1e3, f.TracerPerGB.Half*1e3, rec.TracerPerGB.Mean*1e3, rec.TracerPerGB.Half*1e3, d.Mean, d.Half),
		Verdict: string(d.AtMost(0)),
	}
}

// strictlyBelow judges "the true difference is below 0".
func strictlyBelow(d benchstat.Interval) benchstat.Verdict {
	switch {
	case d.N < 2 || math.IsNaN(d.Mean):
		return benchstat.Undecided
	case d.Hi() < 0:
		return benchstat.Met
	case d.Lo() >= 0:
		return benchstat.NotMet
	}
	return benchstat.Undecided
}

func (r *Report) isMagnet(config string) bool {
	for _, cs := range [][]Config{r.Configs, r.SatConfigs} {
		for _, c := range cs {
			if c.Name == config {
				return c.Kind == Magnet
			}
		}
	}
	return false
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
