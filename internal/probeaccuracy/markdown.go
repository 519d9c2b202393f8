// SPDX-License-Identifier: Apache-2.0

package probeaccuracy

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/magnet-tracer/magnet/internal/availbw"
	"github.com/magnet-tracer/magnet/internal/machine"
)

// Machine describes where the bench ran.
type Machine struct {
	CPU    string `json:"cpu"`
	Cores  int    `json:"cores"`
	Kernel string `json:"kernel"`
	// Load is the load average when the run started and ended.
	LoadStart [3]float64 `json:"load_start"`
	LoadEnd   [3]float64 `json:"load_end"`
}

func readMachine() Machine {
	i := machine.Read()
	return Machine{CPU: i.CPU, Cores: i.Cores, Kernel: i.Kernel, LoadStart: machine.LoadAvg()}
}

// Cell summarizes the trials of one grid cell or of a group of cells.
type Cell struct {
	CapacityMbit int     `json:"capacity_mbit"`
	Cross        string  `json:"cross"`           // "" for every kind
	Share        float64 `json:"share,omitempty"` // 0 for every share
	// Undisturbed: only trials whose bottleneck delivered its rate.
	Undisturbed bool `json:"undisturbed,omitempty"`
	Runs        int  `json:"runs"`
	Failed      int  `json:"failed"`
	Disturbed   int  `json:"disturbed"`
	// Over the estimates: the median error (signed), median and 90th
	// percentile of |e|, median and largest time and probe bytes.
	MedianErr    float64 `json:"median_err"`
	MedianAbsErr float64 `json:"median_abs_err"`
	P90AbsErr    float64 `json:"p90_abs_err"`
	MedianS      float64 `json:"median_s"`
	MaxS         float64 `json:"max_s"`
	MedianBytes  float64 `json:"median_bytes"`
	MaxBytes     float64 `json:"max_bytes"`
	// HostLimited counts the estimates that were only a lower bound
	// (host-limited, rate-limited or coalesced); they are left out of
	// the error figures, and BoundHeld counts those whose lower bound
	// was no more than 5 % above the true A.
	HostLimited int `json:"host_limited"`
	BoundHeld   int `json:"bound_held"`
	// The passive measurement: median and 90th percentile of |e|, its
	// median signed error, time and bytes.
	Passive        int     `json:"passive_runs"`
	PassiveMedErr  float64 `json:"passive_median_err"`
	PassiveMedAbs  float64 `json:"passive_median_abs_err"`
	PassiveP90Abs  float64 `json:"passive_p90_abs_err"`
	PassiveMedS    float64 `json:"passive_median_s"`
	PassiveMedByte float64 `json:"passive_median_bytes"`
}

// Goal is one target of the issue and whether it was met.
type Goal struct {
	What     string `json:"what"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
}

func summarizeTrials(ts []Trial, capMbit int, cross string, share float64, undisturbed bool) Cell {
	c := Cell{CapacityMbit: capMbit, Cross: cross, Share: share, Undisturbed: undisturbed}
	var errs, abs, secs, bytes, perr, pabs, psecs, pbytes []float64
	for _, t := range ts {
		if t.CapacityMbit != capMbit || (cross != "" && t.Cross != cross) || (share != 0 && t.Share != share) {
			continue
		}
		if undisturbed && t.Disturbed {
			continue
		}
		if t.Disturbed {
			c.Disturbed++
		}
		c.Runs++
		switch res := t.Result; {
		case t.Failed != "" || res == nil:
			c.Failed++
		case res.HostLimited || res.RateLimited || res.Coalesced:
			c.HostLimited++
			if res.Low <= 1.05*t.TrueBps {
				c.BoundHeld++
			}
		default:
			errs = append(errs, t.Err)
			abs = append(abs, math.Abs(t.Err))
			secs = append(secs, float64(res.TookNs)/1e9)
			bytes = append(bytes, float64(res.Bytes))
		}
		if p := t.Passive; p != nil && p.Failed == "" {
			c.Passive++
			perr = append(perr, p.Err)
			pabs = append(pabs, math.Abs(p.Err))
			psecs = append(psecs, p.TookS)
			pbytes = append(pbytes, float64(p.Bytes))
		}
	}
	c.MedianErr, c.MedianAbsErr, c.P90AbsErr = quantile(errs, 0.5), quantile(abs, 0.5), quantile(abs, 0.9)
	c.MedianS, c.MaxS = quantile(secs, 0.5), quantile(secs, 1)
	c.MedianBytes, c.MaxBytes = quantile(bytes, 0.5), quantile(bytes, 1)
	c.PassiveMedErr, c.PassiveMedAbs, c.PassiveP90Abs = quantile(perr, 0.5), quantile(pabs, 0.5), quantile(pabs, 0.9)
	c.PassiveMedS, c.PassiveMedByte = quantile(psecs, 0.5), quantile(pbytes, 0.5)
	return c
}

// summarize fills Cells (every cell, then each capacity × cross kind, then
// each capacity) and Goals.
func (r *Report) summarize() {
	s := r.Settings
	r.Machine.LoadEnd = machine.LoadAvg()
	for _, c := range s.Capacities {
		for _, k := range s.Cross {
			for _, sh := range s.Shares {
				r.Cells = append(r.Cells, summarizeTrials(r.Trials, c, k, sh, false))
			}
		}
	}
	for _, c := range s.Capacities {
		for _, k := range s.Cross {
			r.Cells = append(r.Cells, summarizeTrials(r.Trials, c, k, 0, false))
		}
		r.Cells = append(r.Cells, summarizeTrials(r.Trials, c, "", 0, false))
		r.Cells = append(r.Cells, summarizeTrials(r.Trials, c, "", 0, true))
	}
	for _, c := range r.Cells {
		if c.CapacityMbit != 100 || c.Cross != "" || c.Share != 0 || c.Runs == 0 || c.Undisturbed {
			continue
		}
		r.Goals = append(r.Goals,
			Goal{"median |e| ≤ 5 % over the 100 Mbit/s grid", pctOf(c.MedianAbsErr), c.ok() && c.MedianAbsErr <= 0.05},
			Goal{"90th percentile |e| ≤ 10 % over the 100 Mbit/s grid", pctOf(c.P90AbsErr), c.ok() && c.P90AbsErr <= 0.10},
			Goal{"≤ 5 s per estimate at 100 Mbit/s", fmt.Sprintf("median %.2f s, largest %.2f s", c.MedianS, c.MaxS), c.ok() && c.MaxS <= 5},
			Goal{"≤ 2 MB of probe traffic per estimate at 100 Mbit/s", fmt.Sprintf("median %.2f MB, largest %.2f MB", c.MedianBytes/1e6, c.MaxBytes/1e6), c.ok() && c.MaxBytes <= 2e6},
			Goal{"every estimate succeeds, none host-limited", fmt.Sprintf("%d of %d failed, %d host-limited", c.Failed, c.Runs, c.HostLimited), c.Failed == 0 && c.HostLimited == 0},
		)
	}
	if n := len(r.Unlimit); n > 0 {
		var hl int
		for _, t := range r.Unlimit {
			if t.Result != nil && t.Result.HostLimited {
				hl++
			}
		}
		r.Goals = append(r.Goals, Goal{"unlimited veth: host-limited flag every time", fmt.Sprintf("%d of %d", hl, n), hl == n})
	}
}

func pctOf(f float64) string { return fmt.Sprintf("%.1f %%", f*100) }

func signedPct(f float64) string { return fmt.Sprintf("%+.1f %%", f*100) }

// ok reports whether a cell has estimates to show.
func (c Cell) ok() bool { return c.Runs > c.Failed+c.HostLimited }

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteMarkdown writes the report as bench/PROBE.md.
func (r *Report) WriteMarkdown(w io.Writer) error {
	b := &strings.Builder{}
	p := func(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }
	m := r.Machine
	p("# magnet probe: accuracy and cost")
	p("")
	p("Generated by `magnet bench probe`; do not edit by hand, run the command again.")
	p("")
	p("- **Command:** `%s`", r.Command)
	p("- **Date:** %s, %.0f s", r.Date.Format("2006-01-02 15:04 UTC"), r.TookS)
	p("- **Machine:** %s, %d cores, %s; load average %.2f %.2f %.2f at the start, %.2f %.2f %.2f at the end",
		m.CPU, m.Cores, m.Kernel, m.LoadStart[0], m.LoadStart[1], m.LoadStart[2], m.LoadEnd[0], m.LoadEnd[1], m.LoadEnd[2])
	if r.Note != "" {
		p("- **Note:** %s", r.Note)
	}
	p("- **Path:** namespaces sender → router → receiver; tc tbf on the router's egress toward the receiver (bucket %v bytes for %v Mbit/s: two frames, or 30 µs of the rate if more; queue 50 ms, at least 256 KiB); cross traffic from a fourth namespace joined to the router, to a socket on the receiver that never reads", r.Settings.BurstBytes, r.Settings.Capacities)
	p("- **Cross traffic:** %s: `magnet workload send --proto udp --flood` paced by a tbf on the cross host's egress; %s: bursts of back-to-back 1500-byte datagrams every ≈%v (`magnet workload send --burst N --interval`), same mean rate, through a tbf whose bucket holds one burst (a late burst leaves at once, catch-up bursts are paced); both generators at normal priority, as the probe server; the true cross rate is measured, not assumed", CBR, Bursty, BurstPeriod)
	p("- **Disturbed:** a trial whose back-to-back trains saw the bottleneck more than %.0f %% below its nominal rate: the tbf under-delivered (its dequeue runs in a softirq that an overloaded host defers), so the true A was lower than the formula says; such trials count in every figure and goal, and are also left out in the rows marked \"bottleneck at its rate\"", (1-DisturbedShare)*100)
	p("- **Host-limited:** an estimate flagged host-limited (the sender cannot pace the rates needed, the trains found no narrow link clearly slower than the host sends, the narrow point counts packets rather than bytes, or the receiving socket dropped packets: docs/PROBE.md), rate-limited or coalesced is a lower bound or may be the host's own limit; it is left out of the error figures, counted in the runs column, and checked: \"low ≤ A\" counts those whose lower end is no more than 5 %% above the true A")
	p("- **Truth:** A = capacity − cross traffic measured on the cross host's link during the estimate (tbf and the counter both count the 14-byte Ethernet header), expressed as the probe expresses rates: IP bits of its %s-byte packets, A × size/(size+14). e = (Â − A)/A with Â the client's point estimate", probeSize(r))
	p("- **Probe:** `magnet probe client --json` in the receiver's namespace against `magnet probe server` in the sender's, each its own process; %d repetitions per cell, interleaved (every cell once, then again)", r.Settings.Reps)
	if r.Settings.IPv6 {
		p("- **IPv6:** probe and passive transfer over the path's IPv6 unique local addresses (cross traffic IPv4); probe sizes are IP sizes, the TCP payload share 1428/1514")
	}
	if r.Settings.Passive {
		p("- **Passive:** a %.0f s TCP transfer (`magnet workload send --flood`) from sender to receiver on the same path with the same cross traffic, recorded by the `magnet record --netns <receiver> --port` binary, stopped by SIGINT; delivery rate = bytes the receiving application read, first to last read, from the trace (`analyze.Modulation`); truth as TCP payload, (capacity − cross) × 1448/1514", r.Settings.PassiveDuration)
	}
	p("")
	if len(r.Goals) > 0 {
		p("## Goals")
		p("")
		p("| goal | measured | verdict |")
		p("|---|---|---|")
		for _, g := range r.Goals {
			v := "met"
			if !g.Met {
				v = "**missed**"
			}
			p("| %s | %s | %s |", cell(g.What), cell(g.Measured), v)
		}
		p("")
	}
	p("## Summary")
	p("")
	p("| capacity | cross | runs | median e | median \\|e\\| | p90 \\|e\\| | time median / max | probe bytes median / max | passive median e | passive median \\|e\\| | passive p90 \\|e\\| | passive time, bytes |")
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, c := range r.Cells {
		if c.Share != 0 {
			continue
		}
		cross := c.Cross
		if cross == "" {
			cross = "**all**"
		}
		if c.Undisturbed {
			cross = "all, bottleneck at its rate"
		}
		probe := "– | – | – | – | –"
		if c.ok() {
			probe = fmt.Sprintf("%s | %s | %s | %.2f / %.2f s | %.2f / %.2f MB", signedPct(c.MedianErr), pctOf(c.MedianAbsErr),
				pctOf(c.P90AbsErr), c.MedianS, c.MaxS, c.MedianBytes/1e6, c.MaxBytes/1e6)
		}
		passive := "– | – | – | –"
		if c.Passive > 0 {
			passive = fmt.Sprintf("%s | %s | %s | %.1f s, %.1f MB", signedPct(c.PassiveMedErr), pctOf(c.PassiveMedAbs),
				pctOf(c.PassiveP90Abs), c.PassiveMedS, c.PassiveMedByte/1e6)
		}
		p("| %d Mbit/s | %s | %d%s | %s | %s |", c.CapacityMbit, cross, c.Runs, failedNote(c), probe, passive)
	}
	p("")
	p("## Every cell")
	p("")
	p("| capacity | cross | A/C | runs | median e | median \\|e\\| | p90 \\|e\\| | time median | bytes median | passive median e |")
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, c := range r.Cells {
		if c.Share == 0 {
			continue
		}
		probe := "– | – | – | – | –"
		if c.ok() {
			probe = fmt.Sprintf("%s | %s | %s | %.2f s | %.2f MB", signedPct(c.MedianErr), pctOf(c.MedianAbsErr),
				pctOf(c.P90AbsErr), c.MedianS, c.MedianBytes/1e6)
		}
		passive := "–"
		if c.Passive > 0 {
			passive = signedPct(c.PassiveMedErr)
		}
		p("| %d Mbit/s | %s | %.0f %% | %d%s | %s | %s |", c.CapacityMbit, c.Cross, c.Share*100, c.Runs, failedNote(c), probe, passive)
	}
	p("")
	if len(r.Unlimit) > 0 {
		p("## Unlimited veth (no bottleneck)")
		p("")
		p("| run | estimate | probe limit | trains sent at | host-limited | flags | time | bytes |")
		p("|---:|---|---:|---:|---|---|---:|---:|")
		for i, t := range r.Unlimit {
			if t.Result == nil {
				p("| %d | failed: %s | | | | | | |", i+1, t.Failed)
				continue
			}
			res := t.Result
			p("| %d | ≥ %s | %s | %s | %v | %s | %.2f s | %.2f MB |", i+1, availbw.FormatRate(res.Low), availbw.FormatRate(res.ProbeLimit),
				availbw.FormatRate(res.TrainSendRate), res.HostLimited, strings.Join(res.Flags, "; "), float64(res.TookNs)/1e9, float64(res.Bytes)/1e6)
		}
		p("")
	}
	p("## Every estimate")
	p("")
	p("| capacity | cross | A/C | true A | estimate [range] | grey | e | trains saw | fleets | streams (rejected) | time | bytes | CPU client + server | load | passive |")
	p("|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, t := range r.Trials {
		if t.Result == nil {
			p("| %d Mbit/s | %s | %.0f %% | | failed: %s | | | | | | | | | %.2f | |", t.CapacityMbit, t.Cross, t.Share*100, oneLine(t.Failed), t.Load[0])
			continue
		}
		res := t.Result
		grey := "–"
		if res.GreyHigh > 0 {
			grey = fmt.Sprintf("%s – %s", availbw.FormatRate(res.GreyLow), availbw.FormatRate(res.GreyHigh))
		}
		passive := "–"
		if pm := t.Passive; pm != nil {
			if pm.Failed != "" {
				passive = "failed: " + oneLine(pm.Failed)
			} else {
				passive = fmt.Sprintf("%s (%+.1f %%)", availbw.FormatRate(pm.GoodputBps), pm.Err*100)
			}
		}
		saw := availbw.FormatRate(res.Capacity)
		if t.Disturbed {
			saw += " (disturbed)"
		}
		p("| %d Mbit/s | %s | %.0f %% | %s | %s [%s, %s] | %s | %+.1f %% | %s | %d | %d (%d) | %.2f s | %.2f MB | %.2f + %s s | %.2f | %s |",
			t.CapacityMbit, t.Cross, t.Share*100, availbw.FormatRate(t.TrueBps), availbw.FormatRate(res.Point),
			availbw.FormatRate(res.Low), availbw.FormatRate(float64(res.High)), grey, t.Err*100, saw, len(res.Fleets), res.Streams, res.Rejected,
			float64(res.TookNs)/1e9, float64(res.Bytes)/1e6, res.ClientCPUSeconds, serverCPU(res), t.Load[0], passive)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// cell escapes the pipes of a markdown table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

func failedNote(c Cell) string {
	var notes []string
	if c.Failed > 0 {
		notes = append(notes, fmt.Sprintf("%d failed", c.Failed))
	}
	if c.Disturbed > 0 {
		notes = append(notes, fmt.Sprintf("%d disturbed", c.Disturbed))
	}
	if c.HostLimited > 0 {
		notes = append(notes, fmt.Sprintf("%d host-limited, %d of them with low ≤ A", c.HostLimited, c.BoundHeld))
	}
	if len(notes) == 0 {
		return ""
	}
	return " (" + strings.Join(notes, ", ") + ")"
}

func probeSize(r *Report) string {
	for _, t := range r.Trials {
		if t.Result != nil {
			return fmt.Sprint(t.Result.Params.PacketSize)
		}
	}
	return "?"
}

// serverCPU is the server's CPU seconds, or "?" when it reported none
// (its time limit ended the session).
func serverCPU(r *availbw.Result) string {
	if r.ServerCPUSeconds == nil {
		return "?"
	}
	return fmt.Sprintf("%.2f", *r.ServerCPUSeconds)
}
