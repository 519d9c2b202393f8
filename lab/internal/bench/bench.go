// SPDX-License-Identifier: Apache-2.0

// Package bench measures what tracing costs: a saturating transfer between
// two network namespaces, run with nothing loaded, with magnet's probes
// loaded but not drained, with `magnet record` on either side, with tcpdump
// on either veth and with bpftrace, interleaved so that drift hits every
// configuration alike. It also measures the kernel and user-side cost per
// event and sweeps the ring-buffer size against losses.
//
// Everything here needs root, iproute2 and a built magnet binary (the
// workloads run as `magnet workload` inside the namespaces).
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/record"
)

// Configuration names, in the order the issue lists them.
const (
	Baseline = "baseline"
	Loaded   = "loaded"
	// Hooks holds magnet's programs attached on every hook loaded attaches,
	// with no event group enabled: each run returns at its first check.
	// What is left is the hooks' own cost (the kernel's dispatch, and,
	// where sockops serves tcp_xmit, the per-segment callbacks TCP makes
	// once a socket asks for them), the floor of any tracer that watches
	// the same hooks.
	Hooks          = "hooks"
	RecordSender   = "record-sender"
	RecordReceiver = "record-receiver"
	// RecordSenderSock records only the socket layer (and connections) on
	// the sender's side: what the application asks of the network, the
	// papers' first question, at the least a recording can cost.
	RecordSenderSock = "record-sender-sock"
	TcpdumpSender    = "tcpdump-sender"
	TcpdumpReceiver  = "tcpdump-receiver"
	Bpftrace         = "bpftrace"
	// RecordOtherPort is `magnet record --port OtherPort`, the recorder on
	// the sender's side (its CPU, when pinned): a port no run uses, so
	// every connection of both namespaces is looked at and turned down.
	// It is what every other connection on a host pays while magnet
	// records one service. Made for the churn measurement, where each
	// connection's first sight (the filters' verdict, kept in the
	// programs' maps) is much of the cost; on a bulk link it runs when
	// asked (--configs) and then says what another service's long flow
	// pays per packet, but the full run's link tables leave it out
	// (AllConfigs): no goal judges it there.
	RecordOtherPort = "record-other-port"
	// RecordOtherExpr is record-other-port with a pcap-filter expression
	// (OtherExpr) instead of --port: what the expression's interpreter
	// adds to each socket's first sight, for traffic it excludes. On a
	// link or the churn, when --configs names it.
	RecordOtherExpr = "record-other-expr"
)

// AllConfigs lists every configuration.
var AllConfigs = []string{Baseline, Hooks, Loaded, RecordSender, RecordReceiver, RecordSenderSock, TcpdumpSender, TcpdumpReceiver, Bpftrace}

// AllLinks are the link rates of the full run in Mbit/s; 0 is unlimited.
var AllLinks = []int{0, 1000, 100}

// SweepBuffers are the ring sizes of the loss sweep: powers of 4 from 64 KiB
// to 64 MiB, plus the default 8 MiB.
var SweepBuffers = []int{64 << 10, 256 << 10, 1 << 20, 4 << 20, record.DefaultBufferBytes, 16 << 20, 64 << 20}

// BulkSize is the message size of the saturating transfer.
const BulkSize = 65536

// SmallSize is the message size of the small-message sweep workloads.
const SmallSize = 64

// Options configure Run.
type Options struct {
	Magnet string // the magnet binary that runs the workloads
	Reps   int    // repetitions of each configuration
	// Pin runs each host's processes (workload, and its side's tracer) on a
	// CPU of its own, as on two machines.
	Pin bool
	// UnlimitedReps, if set, replaces Reps on the unlimited link, whose
	// throughput losses the goals judge: more rounds narrow their
	// intervals where the verdicts are decided.
	UnlimitedReps int
	Duration      time.Duration // each transfer
	Links         []int         // Mbit/s, 0 = unlimited
	Configs       []string
	Sweep         bool // the loss sweep and the maximum zero-loss event rate
	Cost          bool // per-event kernel (bpf_stats) and user-side cost
	// Synth is the recording path with synthetic events: alone
	// (SynthResult) and, when the unlimited link is in Links, while the
	// bulk transfer runs on it (SynthLoadResult).
	Synth bool
	// SynthRates replaces the synthetic measurements' paced rates
	// (SynthRates, SynthLoadRates; the transfer alone still runs first
	// beside the transfer), events/s: short runs.
	SynthRates []float64
	// SynthProducers is how many threads make the synthetic events, each
	// at an equal share of the rate (0 or 1: one).
	SynthProducers int
	// Churn is the connection churn measurement (ChurnResult): short
	// connections one after another, under ChurnConfigs (the package's
	// ChurnConfigs if nil), interleaved, Reps times of Duration.
	Churn        bool
	ChurnConfigs []string
	// SweepDuration is each sweep transfer; Duration if 0.
	SweepDuration time.Duration
	// TcpdumpSnaplen is passed as -s when positive; tcpdump's default
	// (whole packets) otherwise.
	TcpdumpSnaplen int
	Command        string  // the command line, for the report
	Note           string  // put in the report's header (e.g. reduced settings)
	Label          string  // what was measured (e.g. a commit), for before/after comparisons
	Before         *Before // an earlier report's per-event cost, shown next to this one's
	// CompareWith is another magnet binary whose recorder records the same
	// transfers as this one's, at the same time (PairedResult).
	CompareWith  string
	CompareLabel string
	Log          io.Writer // progress, one line per run; nil = quiet
}

// Report is everything one bench run measured.
type Report struct {
	Command  string       `json:"command"`
	Note     string       `json:"note,omitempty"`
	Label    string       `json:"label,omitempty"`
	Date     time.Time    `json:"date"`
	Machine  Machine      `json:"machine"`
	Settings Settings     `json:"settings"`
	Links    []LinkResult `json:"links"`
	Churn    *ChurnResult `json:"churn,omitempty"`
	Cost     *CostResult  `json:"cost,omitempty"`
	Sweep    *SweepResult `json:"sweep,omitempty"`
	Synth    *SynthResult `json:"synth,omitempty"`
	// SynthLoad is synthetic events while the bulk transfer runs.
	SynthLoad *SynthLoadResult `json:"synth_load,omitempty"`
	Goals     []Goal           `json:"goals"`
	Before    *Before          `json:"before,omitempty"`
	Paired    *PairedResult    `json:"paired,omitempty"`
}

// Before is the per-event cost of an earlier report (of an earlier build,
// say), to set beside this one's.
type Before struct {
	Label     string      `json:"label"`
	Command   string      `json:"command"`
	Date      time.Time   `json:"date"`
	Note      string      `json:"note,omitempty"`
	DurationS float64     `json:"duration_s"`
	Cost      *CostResult `json:"cost"`
}

// ReadBefore reads the per-event cost of the JSON report at path (written
// by magnet-lab bench --json with --cost or --sweep).
func ReadBefore(path string) (*Before, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: not a magnet-lab bench JSON report: %w", path, err)
	}
	if r.Cost == nil || len(r.Cost.Runs) == 0 {
		return nil, fmt.Errorf("%s: the report has no per-event cost (run it with --cost)", path)
	}
	return &Before{Label: labelOr(r.Label, "an earlier report"), Command: r.Command, Date: r.Date, Note: r.Note, DurationS: r.Settings.DurationS, Cost: r.Cost}, nil
}

// Settings echo the options that shaped the numbers.
type Settings struct {
	Reps           int      `json:"reps"`
	UnlimitedReps  int      `json:"unlimited_reps,omitempty"`
	Pinned         string   `json:"pinned,omitempty"`
	DurationS      float64  `json:"duration_s"`
	Links          []int    `json:"links_mbit"`
	Configs        []string `json:"configs"`
	Workload       string   `json:"workload"`
	CPUSource      string   `json:"cpu_source"`
	TcpdumpSnaplen int      `json:"tcpdump_snaplen,omitempty"`
	// ProcBuilds names the builds of record-sender-proc and -other.
	ProcBuilds string `json:"proc_builds,omitempty"`
}

// LinkResult holds every configuration's figures on one link.
type LinkResult struct {
	RateMbit int            `json:"rate_mbit"` // 0 = unlimited
	Configs  []ConfigResult `json:"configs"`
}

// ConfigResult summarizes the repetitions of one configuration on one link.
type ConfigResult struct {
	Name           string  `json:"name"`
	Skipped        string  `json:"skipped,omitempty"` // why it did not run
	Runs           []Trial `json:"runs,omitempty"`
	ThroughputMbit Stat    `json:"throughput_mbit"`
	ReductionPct   Stat    `json:"reduction_pct"` // vs the baseline of the same repetition
	SenderCPUPct   Stat    `json:"sender_cpu_pct"`
	ReceiverCPUPct Stat    `json:"receiver_cpu_pct"`
	TracerCPUPct   Stat    `json:"tracer_cpu_pct"`
	Events         Stat    `json:"events"`
	Lost           Stat    `json:"lost"`
	BytesPerPacket Stat    `json:"bytes_per_packet"`
	// What the whole machine's CPUs spent (machine.CPUTimes: tracers,
	// softirq and kernel threads included) per GB received, and how much
	// more than the baseline of the same repetition: what recording costs
	// whether or not the CPU bounds the link. A transfer the CPU bounds
	// turns that cost into throughput lost; one with CPU to spare (a
	// rate-limited link, or a sender that waits) does not, and its
	// throughput can even rise with work added (see docs/BENCH.md at d71bc17).
	CPUPerGB   Stat `json:"cpu_s_per_gb"`
	CPUCostPct Stat `json:"cpu_cost_pct"`
	// How busy each host's CPU was over the transfer, when pinned: a
	// baseline whose sender CPU is not near 100 % is not bound by it.
	SenderVCPUPct   Stat `json:"sender_vcpu_busy_pct"`
	ReceiverVCPUPct Stat `json:"receiver_vcpu_busy_pct"`
	// How often each host's CPU went to sleep per GB received: a sender
	// that waits sleeps, and on a VM each sleep is a halt and a wake-up.
	SenderSleepsPerGB   Stat `json:"sender_vcpu_sleeps_per_gb"`
	ReceiverSleepsPerGB Stat `json:"receiver_vcpu_sleeps_per_gb"`
}

// Trial is one transfer under one configuration.
type Trial struct {
	Rep            int     `json:"rep"`
	Transfer       Xfer    `json:"transfer"`
	ThroughputMbit float64 `json:"throughput_mbit"`
	Tracer         Traced  `json:"tracer"`
}

// Xfer is what the workload processes did.
type Xfer struct {
	Proto         string  `json:"proto"`
	Size          int     `json:"size"`
	SentBytes     int64   `json:"sent_bytes"`
	Messages      int64   `json:"messages"`
	RecvBytes     int64   `json:"recv_bytes"`
	Reads         int64   `json:"reads"` // the receiver's read calls that returned data
	WallS         float64 `json:"wall_s"`
	SenderCPUS    float64 `json:"sender_cpu_s"`
	ReceiverCPUS  float64 `json:"receiver_cpu_s"`
	LinkPackets   uint64  `json:"link_packets"` // both directions, from the veth counters
	SenderTxPkts  uint64  `json:"sender_tx_packets"`
	ReceiverTxPkt uint64  `json:"receiver_tx_packets"`
	// The machine's CPUs over the transfer (/proc/stat, machine.CPUTimes):
	// everything that ran on them, softirq and tracers included, over
	// CPUWindowS (the receiver's start to its exit). The pinned hosts'
	// CPUs apart when pinned, else 0.
	CPUWindowS        float64 `json:"cpu_window_s,omitempty"`
	CPUBusyS          float64 `json:"cpu_busy_s,omitempty"`
	SenderVCPUBusyS   float64 `json:"sender_vcpu_busy_s,omitempty"`
	ReceiverVCPUBusyS float64 `json:"receiver_vcpu_busy_s,omitempty"`
	// Entries into an idle state other than polling of each host's CPU
	// (machine.CPUTimes.Sleeps), when pinned and the kernel has cpuidle.
	SenderVCPUSleeps   *uint64 `json:"sender_vcpu_sleeps,omitempty"`
	ReceiverVCPUSleeps *uint64 `json:"receiver_vcpu_sleeps,omitempty"`
	// Churning: the connections the sender completed (one request each,
	// so Messages too) and those the receiver served; Unclosed, the
	// sender's connections that had not closed when the tracer stopped
	// (LAST_ACK: see waitClosed).
	Connections int64 `json:"connections,omitempty"`
	Accepted    int64 `json:"accepted,omitempty"`
	Unclosed    int64 `json:"unclosed,omitempty"`
}

// Traced is what the tracer of a run did.
type Traced struct {
	Events   uint64  `json:"events"`             // recorded (written) events
	Produced uint64  `json:"produced,omitempty"` // magnet: events the BPF side produced
	Lost     uint64  `json:"lost"`               // magnet: ring full; bpftrace: "Lost N events"
	Drops    uint64  `json:"drops,omitempty"`    // tcpdump: dropped by kernel
	Bytes    int64   `json:"bytes"`              // trace file size
	CPUS     float64 `json:"cpu_s"`              // the tracer's user-side CPU time
	SysS     float64 `json:"sys_s,omitempty"`    // magnet: the part of CPUS spent in the kernel (writes, waits)
	// RecordCPUS is magnet's own account of its CPU time from the probes
	// attached to the last event drained (record.CPU), RecordSysS its
	// system part: what the drain costs, without the fixed cost of
	// stopping. 0 for a build that does not say it.
	RecordCPUS float64 `json:"record_cpu_s,omitempty"`
	RecordSysS float64 `json:"record_sys_s,omitempty"`
	// ConnOpens and ConnCloses are magnet's conn_open and conn_close
	// records written: a pair per connection the filters select
	// (docs/EVENTS.md; ChurnConfigResult.ConnsExact checks them).
	ConnOpens  uint64 `json:"conn_opens,omitempty"`
	ConnCloses uint64 `json:"conn_closes,omitempty"`
}

// ErrNotRoot is returned when the bench cannot build its namespaces or load
// BPF.
var ErrNotRoot = errors.New("need root (network namespaces and BPF)")

// Run runs the bench. Progress goes to opts.Log.
func Run(ctx context.Context, opts Options) (*Report, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	if err := netlab.Available(); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "magnet-bench-")
	if err != nil {
		return nil, fmt.Errorf("make work dir: %w", err)
	}
	defer os.RemoveAll(work)

	b := &bencher{opts: opts, work: work, port: 20000}
	if opts.Pin {
		if b.pin, err = newPinning(); err != nil {
			return nil, err
		}
	}
	rep := &Report{
		Command: opts.Command,
		Note:    opts.Note,
		Label:   opts.Label,
		Before:  opts.Before,
		Date:    time.Now().UTC(),
		Machine: readMachine(),
		Settings: Settings{
			Reps: opts.Reps, UnlimitedReps: opts.UnlimitedReps, DurationS: opts.Duration.Seconds(), Links: opts.Links, Configs: opts.Configs,
			Workload:       fmt.Sprintf("magnet workload send --flood %v --size %d (TCP), against magnet workload serve", opts.Duration, BulkSize),
			CPUSource:      "rusage (utime+stime) of each workload process from wait4, i.e. /proc/<pid>/stat utime+stime at exit; in-process recorder: getrusage(RUSAGE_SELF) from probes attached to recording closed",
			TcpdumpSnaplen: opts.TcpdumpSnaplen,
		},
	}
	if b.pin != nil {
		rep.Settings.Pinned = fmt.Sprintf("sender's workload process and tracer on CPU %d, receiver's on CPU %d (taskset; the in-process recorder: every thread of the bench process)", b.pin.sender, b.pin.receiver)
	}
	if slices.Contains(opts.Configs, RecordSenderProc) || slices.Contains(opts.Configs, RecordSenderOther) {
		rep.Settings.ProcBuilds = fmt.Sprintf("record-sender-proc: %s; record-sender-other: %s", labelOr(opts.Label, "this build"), labelOr(opts.CompareLabel, opts.CompareWith))
	}
	for _, rate := range opts.Links {
		lr, err := b.link(ctx, rate)
		if err != nil {
			return nil, err
		}
		rep.Links = append(rep.Links, *lr)
	}
	if opts.Churn {
		b.logf("churn: short connections, one %d-byte request each, unlimited link", ChurnSize)
		if rep.Churn, err = b.churn(ctx); err != nil {
			return nil, fmt.Errorf("churn: %w", err)
		}
	}
	if opts.Synth {
		b.logf("synth: synthetic events at paced rates, recorded")
		s, err := b.synth(ctx)
		switch {
		case errors.Is(err, errNoSynth):
			b.logf("synth: not available: %v", err)
		case err != nil:
			return nil, fmt.Errorf("synth: %w", err)
		default:
			rep.Synth = s
		}
	}
	synthLoad := opts.Synth && rep.Synth != nil && slices.Contains(opts.Links, 0)
	if opts.Synth && rep.Synth != nil && !synthLoad {
		b.logf("synth: no unlimited link in --links, so no synthetic events beside the transfer (the idle ceiling only)")
	}
	if opts.Cost || opts.Sweep || opts.CompareWith != "" || synthLoad {
		lab, err := netlab.New(netlab.Options{Name: "magnet-bench", RateMbit: 0})
		if err != nil {
			return nil, err
		}
		defer lab.Close()
		if synthLoad {
			b.logf("synth: synthetic events at paced rates while the %d-byte transfer runs (unlimited link), recorded", BulkSize)
			if rep.SynthLoad, err = b.synthLoad(ctx, lab); err != nil {
				return nil, fmt.Errorf("synth while the transfer runs: %w", err)
			}
		}
		if opts.Cost {
			b.logf("cost: per-event kernel and user-side cost (bpf_stats)")
			if rep.Cost, err = b.cost(ctx, lab, rep.Machine.MHz); err != nil {
				return nil, fmt.Errorf("cost: %w", err)
			}
		}
		if opts.CompareWith != "" {
			b.logf("paired: this build and %s recording the same transfers", opts.CompareWith)
			if rep.Paired, err = b.paired(ctx, lab); err != nil {
				return nil, fmt.Errorf("paired: %w", err)
			}
		}
		if opts.Sweep {
			if rep.Sweep, err = b.sweep(ctx, lab); err != nil {
				return nil, fmt.Errorf("sweep: %w", err)
			}
			if rep.Sweep.Policy, err = b.policySweep(ctx, lab); err != nil {
				return nil, fmt.Errorf("policy sweep: %w", err)
			}
		}
		if err := lab.Close(); err != nil {
			return nil, err
		}
	}
	rep.Goals = evaluate(rep)
	return rep, nil
}

func (o *Options) check() error {
	if os.Geteuid() != 0 {
		return ErrNotRoot
	}
	if o.Magnet == "" {
		return errors.New("no magnet binary to run the workloads")
	}
	if o.Reps <= 0 {
		return fmt.Errorf("reps %d: want at least 1", o.Reps)
	}
	if o.Duration < 100*time.Millisecond {
		return fmt.Errorf("duration %v: want at least 100ms", o.Duration)
	}
	if o.SweepDuration == 0 {
		o.SweepDuration = o.Duration
	}
	for _, r := range o.Links {
		if r < 0 {
			return fmt.Errorf("link rate %d: want 0 (unlimited) or a positive Mbit/s", r)
		}
	}
	for _, c := range slices.Concat(o.Configs, o.ChurnConfigs) {
		if !slices.Contains(KnownConfigs, c) {
			return fmt.Errorf("unknown configuration %q (want %s)", c, strings.Join(KnownConfigs, ","))
		}
		if c == RecordSenderOther && o.CompareWith == "" {
			return fmt.Errorf("configuration %s records with the --compare-with build: give one", c)
		}
	}
	return nil
}

type bencher struct {
	opts Options
	pin  *pinning // nil unless Options.Pin
	work string
	port int
	seq  int
}

func (b *bencher) logf(format string, args ...any) {
	if b.opts.Log != nil {
		fmt.Fprintf(b.opts.Log, format+"\n", args...)
	}
}

// nextPort gives every transfer a port of its own, so that no run waits for
// a previous one's TIME_WAIT or sees its stragglers.
func (b *bencher) nextPort() int {
	b.port++
	if b.port > 60000 {
		b.port = 20001
	}
	return b.port
}

// link runs every configuration opts.Reps times on one lab at rate, in
// rounds: A B C ... A B C ...
func (b *bencher) link(ctx context.Context, rate int) (*LinkResult, error) {
	lab, err := netlab.New(netlab.Options{Name: "magnet-bench", RateMbit: rate})
	if err != nil {
		return nil, err
	}
	defer lab.Close()

	lr := &LinkResult{RateMbit: rate}
	reps := b.opts.Reps
	if rate == 0 && b.opts.UnlimitedReps > 0 {
		reps = b.opts.UnlimitedReps
	}
	runs, skipped, err := b.rounds(ctx, lab, linkName(rate), flood("tcp", BulkSize), b.opts.Configs, reps, func(r *Trial) string {
		return fmt.Sprintf("%9.1f Mbit/s  events %d lost %d", r.ThroughputMbit, r.Tracer.Events, r.Tracer.Lost)
	})
	if err != nil {
		return nil, err
	}
	base := baselines(runs)
	for _, c := range b.opts.Configs {
		cr := ConfigResult{Name: c, Skipped: skipped[c], Runs: runs[c]}
		if cr.Skipped == "" {
			cr.summarize(base)
		}
		lr.Configs = append(lr.Configs, cr)
	}
	if err := lab.Close(); err != nil {
		return nil, err
	}
	return lr, nil
}

// rounds runs workload f under each of configs reps times on lab, in rounds
// (A B C ... A B C ...) so that drift hits every configuration alike, and
// returns each configuration's trials and why any did not run. what names
// the measurement in the log and in errors; figures says a trial's in the
// log line.
func (b *bencher) rounds(ctx context.Context, lab *netlab.Lab, what string, f flow, configs []string, reps int, figures func(*Trial) string) (map[string][]Trial, map[string]string, error) {
	skipped := map[string]string{}
	for _, c := range configs {
		if why := unavailable(c); why != "" {
			skipped[c] = why
		}
		if unlimitedOnly[c] && lab.RateMbit != 0 {
			skipped[c] = "run on the unlimited link only"
		}
	}
	runs := map[string][]Trial{}
	for rep := 1; rep <= reps; rep++ {
		for _, c := range configs {
			if skipped[c] != "" {
				continue
			}
			if err := ctx.Err(); err != nil {
				return nil, nil, err
			}
			r, err := b.run(ctx, lab, c, f, b.opts.Duration, record.DefaultBufferBytes)
			if err != nil {
				// A tracer that cannot run here is reported, not fatal.
				if c == Bpftrace || c == TcpdumpSender || c == TcpdumpReceiver {
					skipped[c] = "not available: " + err.Error()
					delete(runs, c)
					continue
				}
				return nil, nil, fmt.Errorf("%s, %s: %w", what, c, err)
			}
			r.Rep = rep
			runs[c] = append(runs[c], *r)
			b.logf("%s rep %d %-16s %s", what, rep, c, figures(r))
		}
	}
	return runs, skipped, nil
}

// baselines are the baseline's trials by round, for the figures taken
// against the baseline of the same round.
func baselines(runs map[string][]Trial) map[int]Trial {
	base := map[int]Trial{}
	for _, r := range runs[Baseline] {
		base[r.Rep] = r
	}
	return base
}

func (cr *ConfigResult) summarize(base map[int]Trial) {
	var thr, red, scpu, rcpu, tcpu, ev, lost, bpp, perGB, cost, svcpu, rvcpu, ssleep, rsleep []float64
	for _, r := range cr.Runs {
		x := r.Transfer
		thr = append(thr, r.ThroughputMbit)
		b, hasBase := base[r.Rep]
		if hasBase && b.ThroughputMbit > 0 {
			red = append(red, 100*(1-r.ThroughputMbit/b.ThroughputMbit))
		}
		if x.WallS > 0 {
			scpu = append(scpu, 100*x.SenderCPUS/x.WallS)
			rcpu = append(rcpu, 100*x.ReceiverCPUS/x.WallS)
			tcpu = append(tcpu, 100*r.Tracer.CPUS/x.WallS)
		}
		if g := x.cpuPerGB(); g > 0 {
			perGB = append(perGB, g)
			if bg := b.Transfer.cpuPerGB(); hasBase && bg > 0 {
				cost = append(cost, 100*(g/bg-1))
			}
		}
		if x.CPUWindowS > 0 && (x.SenderVCPUBusyS > 0 || x.ReceiverVCPUBusyS > 0) {
			svcpu = append(svcpu, 100*x.SenderVCPUBusyS/x.CPUWindowS)
			rvcpu = append(rvcpu, 100*x.ReceiverVCPUBusyS/x.CPUWindowS)
		}
		if x.SenderVCPUSleeps != nil && x.ReceiverVCPUSleeps != nil && x.RecvBytes > 0 {
			gb := float64(x.RecvBytes) / 1e9
			ssleep = append(ssleep, float64(*x.SenderVCPUSleeps)/gb)
			rsleep = append(rsleep, float64(*x.ReceiverVCPUSleeps)/gb)
		}
		ev = append(ev, float64(r.Tracer.Events))
		lost = append(lost, float64(r.Tracer.Lost+r.Tracer.Drops))
		if x.LinkPackets > 0 {
			bpp = append(bpp, float64(r.Tracer.Bytes)/float64(x.LinkPackets))
		}
	}
	cr.ThroughputMbit = Summarize(thr)
	cr.ReductionPct = Summarize(red)
	cr.SenderCPUPct = Summarize(scpu)
	cr.ReceiverCPUPct = Summarize(rcpu)
	cr.TracerCPUPct = Summarize(tcpu)
	cr.CPUPerGB = Summarize(perGB)
	cr.CPUCostPct = Summarize(cost)
	cr.SenderVCPUPct = Summarize(svcpu)
	cr.ReceiverVCPUPct = Summarize(rvcpu)
	cr.SenderSleepsPerGB = Summarize(ssleep)
	cr.ReceiverSleepsPerGB = Summarize(rsleep)
	cr.Events = Summarize(ev)
	cr.Lost = Summarize(lost)
	cr.BytesPerPacket = Summarize(bpp)
}

// cpuPerGB is the CPU time of the whole machine over the transfer per
// gigabyte (10⁹ bytes) received; 0 if either was not measured.
func (x Xfer) cpuPerGB() float64 {
	if x.CPUBusyS <= 0 || x.RecvBytes <= 0 {
		return 0
	}
	return x.CPUBusyS / (float64(x.RecvBytes) / 1e9)
}

func linkName(rate int) string {
	if rate == 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%d Mbit/s", rate)
}

// run starts the configuration's tracer, runs workload f for d on a port of
// its own and stops the tracer.
func (b *bencher) run(ctx context.Context, lab *netlab.Lab, config string, f flow, d time.Duration, buffer int) (*Trial, error) {
	b.seq++
	port := b.nextPort()
	t, err := b.start(ctx, lab, config, port, buffer)
	if err != nil {
		return nil, err
	}
	x, err := b.transferWith(ctx, lab, f, d, port, nil)
	if err == nil && f.churn {
		x.Unclosed, err = b.waitClosed(ctx, lab)
	}
	tr, serr := t.stop()
	if err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, serr
	}
	r := &Trial{Transfer: *x, Tracer: tr}
	if x.WallS > 0 {
		r.ThroughputMbit = float64(x.RecvBytes) * 8 / x.WallS / 1e6
	}
	return r, nil
}
