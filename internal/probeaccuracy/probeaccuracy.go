// SPDX-License-Identifier: Apache-2.0

// Package probeaccuracy measures how accurate and how cheap `magnet probe` is
// on a path whose available bandwidth is known: namespaces sender → router
// → receiver, a tc tbf bottleneck on the router's egress toward the
// receiver, and constant-rate or bursty UDP cross traffic injected at the
// router from a fourth namespace. Each trial runs the probe client as a
// user would (`magnet probe client --json` inside the receiver's namespace,
// against `magnet probe server` in the sender's) and compares its estimate
// with the true available bandwidth A = capacity − measured cross traffic.
// Optionally the same path is also measured passively: a TCP transfer
// recorded by magnet, its delivery rate read from the trace.
//
// Everything here needs root, iproute2 and a built magnet binary.
package probeaccuracy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/magnet-tracer/magnet/internal/availbw"
	"github.com/magnet-tracer/magnet/internal/machine"
	"github.com/magnet-tracer/magnet/internal/netlab"
)

// Cross-traffic kinds.
const (
	// CBR is constant-rate cross traffic: a UDP flood paced by a tbf on
	// the cross host's egress.
	CBR = "cbr"
	// Bursty is on-off cross traffic of the same mean rate: bursts of
	// back-to-back datagrams every BurstPeriod, from user space.
	Bursty = "bursty"
)

// BurstPeriod is the time between the bursts of bursty cross traffic.
const BurstPeriod = 2 * time.Millisecond

// crossPayload is the UDP payload of cross traffic: full 1500-byte IP
// packets, 1514-byte frames.
const crossPayload = 1472

// frameBits is the size of one cross-traffic frame as tbf counts it.
const frameBits = (crossPayload + 28 + 14) * 8

// DisturbedShare: a trial is disturbed when the probe's trains see less
// than this share of the bottleneck's nominal rate.
const DisturbedShare = 0.95

// probePort is the control port of the probe server in the lab.
const probePort = 7207

// Options configure Run.
type Options struct {
	// Magnet is the magnet binary run in the namespaces.
	Magnet string
	// Capacities are the bottleneck rates in Mbit/s.
	Capacities []int
	// Shares are the available shares of the capacity, A/C, each in (0, 1].
	Shares []float64
	// Cross are the cross-traffic kinds (CBR, Bursty).
	Cross []string
	// Reps is the number of estimates per grid cell.
	Reps int
	// Unlimited is the number of estimates on the path without a
	// bottleneck, each of which must be host-limited.
	Unlimited int
	// Passive adds, per grid cell, a TCP transfer of PassiveDuration
	// recorded by magnet, whose delivery rate is compared with A.
	Passive         bool
	PassiveDuration time.Duration
	// IPv6 runs the probe and the passive transfer over IPv6 (the path's
	// unique local addresses); cross traffic stays IPv4.
	IPv6 bool
	// ClientArgs are extra arguments for `magnet probe client`.
	ClientArgs []string
	Command    string    // the command line, for the report
	Note       string    // put in the report's header
	Log        io.Writer // progress, one line per trial; nil = quiet
}

func (o *Options) check() error {
	if o.Magnet == "" {
		return errors.New("no magnet binary")
	}
	if o.Reps < 1 && o.Unlimited < 1 {
		return errors.New("nothing to run: no repetitions and no unlimited runs")
	}
	for _, c := range o.Capacities {
		if c <= 0 {
			return fmt.Errorf("capacity %d Mbit/s not positive", c)
		}
	}
	for _, s := range o.Shares {
		if s <= 0 || s > 1 {
			return fmt.Errorf("available share %v outside (0, 1]", s)
		}
	}
	for _, k := range o.Cross {
		if k != CBR && k != Bursty {
			return fmt.Errorf("unknown cross traffic %q (want %s or %s)", k, CBR, Bursty)
		}
	}
	if o.Passive && o.PassiveDuration <= 0 {
		o.PassiveDuration = 2 * time.Second
	}
	return nil
}

// Report is everything one run measured.
type Report struct {
	Command  string    `json:"command"`
	Note     string    `json:"note,omitempty"`
	Date     time.Time `json:"date"`
	Machine  Machine   `json:"machine"`
	TookS    float64   `json:"took_s"`
	Trials   []Trial   `json:"trials"`
	Unlimit  []Trial   `json:"unlimited"`
	Cells    []Cell    `json:"cells"`
	Goals    []Goal    `json:"goals"`
	Settings Settings  `json:"settings"`
}

// Settings echo what shaped the numbers.
type Settings struct {
	Capacities      []int     `json:"capacities_mbit"`
	Shares          []float64 `json:"shares"`
	Cross           []string  `json:"cross"`
	Reps            int       `json:"reps"`
	Unlimited       int       `json:"unlimited"`
	IPv6            bool      `json:"ipv6,omitempty"`
	Passive         bool      `json:"passive"`
	PassiveDuration float64   `json:"passive_duration_s,omitempty"`
	// BurstBytes is the bottleneck's tbf bucket at each capacity.
	BurstBytes []int    `json:"bottleneck_burst_bytes"`
	ClientArgs []string `json:"client_args,omitempty"`
}

// Trial is one estimate on one configuration of the path.
type Trial struct {
	CapacityMbit int     `json:"capacity_mbit"` // 0: unlimited
	Cross        string  `json:"cross,omitempty"`
	Share        float64 `json:"share,omitempty"`
	// CrossBps is the cross traffic measured on the cross host's link
	// while the probe ran, Ethernet headers counted as tbf counts them.
	CrossBps float64 `json:"cross_bps"`
	// TrueBps is the available bandwidth in the probe's terms: IP bits of
	// its packets, (capacity − cross) × size/(size+14).
	TrueBps float64 `json:"true_bps"`
	// Err is (estimate − true)/true.
	Err float64 `json:"err"`
	// Disturbed marks a trial whose back-to-back trains found the
	// bottleneck more than 5 % below its nominal rate: the tbf under
	// delivered (its timer is served late when the host is overloaded),
	// so the true A was lower than capacity − cross traffic.
	Disturbed bool             `json:"disturbed,omitempty"`
	Result    *availbw.Result  `json:"result"`
	Load      [3]float64       `json:"load_before"`
	Passive   *PassiveMeasured `json:"passive,omitempty"`
	Failed    string           `json:"failed,omitempty"`
}

// Run builds the lab and runs every trial.
func Run(ctx context.Context, opts Options) (*Report, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	if err := netlab.Available(); err != nil {
		return nil, err
	}
	start := time.Now()
	rep := &Report{
		Command: opts.Command, Note: opts.Note, Date: start.UTC(), Machine: readMachine(),
		Settings: Settings{Capacities: opts.Capacities, Shares: opts.Shares, Cross: opts.Cross, Reps: opts.Reps,
			Unlimited: opts.Unlimited, IPv6: opts.IPv6, Passive: opts.Passive, PassiveDuration: opts.PassiveDuration.Seconds(),
			ClientArgs: opts.ClientArgs},
	}
	p, err := netlab.NewPath(netlab.PathOptions{Name: "magnet-probeaccuracy", Cross: true, IPv6: opts.IPv6})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	l := &lab{opts: opts, path: p}
	if err := l.startServer(ctx); err != nil {
		return nil, err
	}
	defer l.stopServer()
	if err := l.openSink(); err != nil {
		return nil, err
	}
	defer l.sink.Close()

	for _, c := range opts.Capacities {
		if err := p.SetBottleneck(c, 0, 0); err != nil {
			return nil, err
		}
		rep.Settings.BurstBytes = append(rep.Settings.BurstBytes, p.BurstBytes)
		// Repetitions outermost, so that drift in the machine's load hits
		// every cell alike.
		for rep_ := range opts.Reps {
			for _, kind := range opts.Cross {
				for _, share := range opts.Shares {
					tr, err := l.trial(ctx, c, kind, share)
					if err != nil {
						return nil, err
					}
					l.logf("%d Mbit/s %s A=%.0f%% rep %d: %s", c, kind, share*100, rep_+1, tr.summary())
					rep.Trials = append(rep.Trials, *tr)
				}
			}
		}
	}
	if opts.Unlimited > 0 {
		if err := p.RemoveBottleneck(); err != nil {
			return nil, err
		}
		for i := range opts.Unlimited {
			tr := &Trial{Load: machine.LoadAvg()}
			if tr.Result, err = l.probe(ctx); err != nil {
				tr.Failed = err.Error()
			}
			l.logf("unlimited run %d: %s", i+1, tr.summary())
			rep.Unlimit = append(rep.Unlimit, *tr)
		}
	}
	rep.TookS = time.Since(start).Seconds()
	rep.summarize()
	return rep, nil
}

// lab is the running path with its server and sink.
type lab struct {
	opts   Options
	path   *netlab.Path
	server *exec.Cmd
	sink   interface{ Close() error }
	sinkAt string
	srvErr strings.Builder
}

// addr returns h's address in the family the probe runs over.
func (l *lab) addr(h netlab.Host) netip.Addr {
	if l.opts.IPv6 {
		return h.Addr6
	}
	return h.Addr
}

func (l *lab) logf(format string, args ...any) {
	if l.opts.Log != nil {
		fmt.Fprintf(l.opts.Log, format+"\n", args...)
	}
}

// startServer runs `magnet probe server` in the sender's namespace and
// waits for its "listening" line.
func (l *lab) startServer(ctx context.Context) error {
	addr := netip.AddrPortFrom(l.addr(l.path.Sender), probePort).String()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", l.path.Sender.NS, l.opts.Magnet, "probe", "server",
		"--listen", addr, "--max-rate", "100G", "--max-duration", "60s")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = &l.srvErr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start probe server: %w", err)
	}
	l.server = cmd
	lines := bufio.NewScanner(out)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "listening") {
		l.stopServer()
		return fmt.Errorf("probe server did not start: %s", oneLine(l.srvErr.String()))
	}
	l.logf("probe server: %s", lines.Text())
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return nil
}

func (l *lab) stopServer() {
	if l.server == nil || l.server.Process == nil {
		return
	}
	_ = l.server.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = l.server.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = l.server.Process.Kill()
		<-done
	}
	l.server = nil
}

// probe runs one `magnet probe client --json` in the receiver's namespace.
func (l *lab) probe(ctx context.Context) (*availbw.Result, error) {
	args := []string{"netns", "exec", l.path.Receiver.NS, l.opts.Magnet, "probe", "client",
		l.addr(l.path.Sender).String(), "--port", strconv.Itoa(probePort), "--json", "--timeout", "60s"}
	args = append(args, l.opts.ClientArgs...)
	cmd := exec.CommandContext(ctx, "ip", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("probe client: %v: %s", err, oneLine(stderr.String()))
	}
	var r availbw.Result
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("probe client output: %w", err)
	}
	return &r, nil
}

// trial runs one estimate with cross traffic of the given kind leaving
// share of the capacity available.
func (l *lab) trial(ctx context.Context, capMbit int, kind string, share float64) (*Trial, error) {
	tr := &Trial{CapacityMbit: capMbit, Cross: kind, Share: share}
	capBits := float64(capMbit) * 1e6
	cross := capBits * (1 - share)
	gen, err := l.startCross(ctx, kind, cross)
	if err != nil {
		return nil, err
	}
	defer gen.stop()
	// Let the cross traffic settle (and a tbf queue fill) first.
	if err := sleep(ctx, 300*time.Millisecond); err != nil {
		return nil, err
	}
	tr.Load = machine.LoadAvg()
	before, err := l.crossCounter()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	res, perr := l.probe(ctx)
	after, err := l.crossCounter()
	if err != nil {
		return nil, err
	}
	tr.CrossBps = float64(after-before) * 8 / time.Since(t0).Seconds()
	if perr != nil {
		tr.Failed = perr.Error()
	} else {
		tr.Result = res
		size := res.Params.PacketSize
		tr.TrueBps = (capBits - tr.CrossBps) * netlab.FrameShare(size)
		tr.Err = (res.Point - tr.TrueBps) / tr.TrueBps
		tr.Disturbed = res.Capacity < DisturbedShare*capBits*netlab.FrameShare(size)
	}
	if l.opts.Passive {
		pm, err := l.passive(ctx, capBits)
		if err != nil {
			pm = &PassiveMeasured{Failed: err.Error()}
		}
		tr.Passive = pm
	}
	if msg := gen.failed(); msg != "" {
		return nil, fmt.Errorf("cross traffic: %s", msg)
	}
	return tr, nil
}

func (t *Trial) summary() string {
	if t.Failed != "" {
		return "failed: " + t.Failed
	}
	r := t.Result
	s := fmt.Sprintf("estimate %s [%s, %s]", availbw.FormatRate(r.Point), availbw.FormatRate(r.Low), availbw.FormatRate(float64(r.High)))
	if t.TrueBps > 0 {
		s += fmt.Sprintf(" true %s e=%+.3f", availbw.FormatRate(t.TrueBps), t.Err)
	}
	s += fmt.Sprintf(" %d fleets %d streams (%d rejected) %.2f MB %.2f s", len(r.Fleets), r.Streams, r.Rejected,
		float64(r.Bytes)/1e6, float64(r.TookNs)/1e9)
	if len(r.Flags) > 0 {
		s += " flags: " + strings.Join(r.Flags, "; ")
	}
	if t.Disturbed {
		s += fmt.Sprintf(" (disturbed: trains saw %s)", availbw.FormatRate(r.Capacity))
	}
	if p := t.Passive; p != nil {
		if p.Failed != "" {
			s += " passive failed: " + p.Failed
		} else {
			s += fmt.Sprintf(" passive %s e=%+.3f", availbw.FormatRate(p.GoodputBps), p.Err)
		}
	}
	return s
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func oneLine(s string) string {
	s = strings.TrimSpace(s)
	s = strings.ReplaceAll(s, "\n", "; ")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// quantile returns the q-quantile of v, interpolating between the two
// nearest ranks (so the median of an even count is the mean of the middle
// two), 0 if empty.
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	pos := q * float64(len(s)-1)
	i := int(math.Floor(pos))
	if i+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[i] + (pos-float64(i))*(s[i+1]-s[i])
}
