// SPDX-License-Identifier: Apache-2.0

package hostcheck

import (
	"fmt"
	"strconv"
)

// The rules below judge a host from its figures, after Jin and Tierney
// (IMC 2003). docs/HOSTCHECK.md derives them.
const (
	// PacketBytes is the size of the packets the rules reason about: a
	// full 1500-byte Ethernet payload, the largest packet most paths carry
	// and so the widest gap a packet pair can have.
	PacketBytes = 1500

	// PairStepFraction says how fine the clock must be to time a packet
	// pair: the clock step may be at most this fraction of the
	// back-to-back gap, so that one step errs by at most 10% on the gap.
	PairStepFraction = 10

	// TrainPackets is the length of the packet trains judged. A train of
	// 100 full packets (150 kB) still fits in common socket buffers and
	// router queues, yet lasts 12 µs even at 100 Gb/s.
	TrainPackets = 100

	// TrainClockSteps is how many clock steps a train must last, so that
	// one step errs by at most 10% on its duration.
	TrainClockSteps = 10

	// TrainBlurFraction bounds interrupt coalescing for trains: packets
	// held back for one interrupt share a timestamp, which can shift the
	// first or last of a train, so the holding time may be at most this
	// fraction of the train's duration.
	TrainBlurFraction = 10

	// ReceiveCopies is how often a received byte crosses memory: the NIC
	// writes it by DMA, then the kernel copies it to the reader (the
	// paper's Figure 9). A host receives at most memcpy/ReceiveCopies.
	ReceiveCopies = 2

	// PairSyscalls is how many system calls must fit in a pair's gap (Jin
	// and Tierney, section 4.A): two to read the two packets and two to
	// timestamp them. The send cost stands for one: reading a packet
	// crosses the same stack.
	PairSyscalls = 4

	// RecordBytesPerPacket is what magnet writes about each packet it
	// records (one event), which adds to the memory traffic per packet.
	RecordBytesPerPacket = 40
)

// LinkRates are the link rates, in bit/s, that Verdicts judges: 100 Mb/s
// and 1, 10, 40 and 100 Gb/s.
var LinkRates = []float64{100e6, 1e9, 10e9, 40e9, 100e9}

// Figures named in a Reason.
const (
	FigureClockStep  = "clock step"
	FigureSendCost   = "send cost"
	FigureMemoryCopy = "memory copy"
	FigureCoalescing = "interrupt coalescing"
	FigureOffload    = "receive offload"
	FigureWakeUp     = "idle wake-up"
)

// Verdict says what a host can do at one link rate.
type Verdict struct {
	// RateBps is the link rate in bit/s.
	RateBps float64 `json:"rate_bps"`
	// GapNs is the time one PacketBytes packet takes on the link: the gap
	// between the starts of two back-to-back packets.
	GapNs float64 `json:"gap_ns"`
	// Pairs says whether the host can time the dispersion of a packet pair.
	Pairs Answer `json:"pairs"`
	// Trains says whether the host can time a train of TrainPackets.
	Trains Answer `json:"trains"`
	// Saturate says whether one thread can send at the link rate and the
	// host can receive and record at it.
	Saturate Answer `json:"saturate"`
}

// Answer is a yes or a no with the figures that make it a no.
type Answer struct {
	OK        bool     `json:"ok"`
	LimitedBy []Reason `json:"limited_by,omitempty"`
}

// Reason names a figure that limits the host and says by how much.
type Reason struct {
	// Figure is one of the Figure* constants.
	Figure string `json:"figure"`
	// Detail says in plain words what the figure is and what it needed to be.
	Detail string `json:"detail"`
}

// Verdicts judges the host at each of LinkRates. It considers the receive
// side of the interface named iface or, if iface is "", of every interface
// that is up and not a loopback, the worst of them deciding.
func (r *Report) Verdicts(iface string) ([]Verdict, error) {
	var rx []Interface
	for _, ifc := range r.Interfaces {
		if iface == "" && ifc.Up && !ifc.Loopback || ifc.Name == iface {
			rx = append(rx, ifc)
		}
	}
	if iface != "" && len(rx) == 0 {
		return nil, fmt.Errorf("no interface %q", iface)
	}
	l := r.Limits()
	out := make([]Verdict, len(LinkRates))
	for i, rate := range LinkRates {
		out[i] = Judge(rate, l, rx)
	}
	return out, nil
}

// Judge applies the rules at link rate rateBps to a host with limits l
// receiving on the interfaces rx.
func Judge(rateBps float64, l Limits, rx []Interface) Verdict {
	gap := PacketBytes * 8 * 1e9 / rateBps
	train := TrainPackets * gap
	v := Verdict{RateBps: rateBps, GapNs: gap}
	var pairs, trains, saturate []Reason

	// Timestamps: the clock must resolve a tenth of the pair's gap and ten
	// steps within a train.
	switch {
	case l.ClockStepNs <= 0:
		pairs = append(pairs, Reason{FigureClockStep, "clock step not measured"})
		trains = append(trains, Reason{FigureClockStep, "clock step not measured"})
	default:
		if l.ClockStepNs > gap/PairStepFraction {
			pairs = append(pairs, Reason{FigureClockStep, fmt.Sprintf(
				"clock step %s > %s, a tenth of the %s gap",
				FormatNs(l.ClockStepNs), FormatNs(gap/PairStepFraction), FormatNs(gap))})
		}
		if TrainClockSteps*l.ClockStepNs > train {
			trains = append(trains, Reason{FigureClockStep, fmt.Sprintf(
				"a %d-packet train lasts %s < %d clock steps of %s",
				TrainPackets, FormatNs(train), TrainClockSteps, FormatNs(l.ClockStepNs))})
		}
	}

	// The cost of the system calls around each packet of a pair.
	if l.SendCostNs > 0 && PairSyscalls*l.SendCostNs > gap {
		pairs = append(pairs, Reason{FigureSendCost, fmt.Sprintf(
			"%d system calls of %s (read and timestamp two packets) take %s > the %s gap",
			PairSyscalls, FormatNs(l.SendCostNs), FormatNs(PairSyscalls*l.SendCostNs), FormatNs(gap))})
	}

	// An idle CPU wakes late: the first packet to reach it is timestamped
	// up to that late, the next ones not.
	if w := l.IdleWakeUpNs; w > 0 {
		if w > gap/PairStepFraction {
			pairs = append(pairs, Reason{FigureWakeUp, fmt.Sprintf(
				"an idle CPU takes %s to wake > %s, a tenth of the gap: a pair's first packet may be stamped that late",
				FormatNs(w), FormatNs(gap/PairStepFraction))})
		}
		if w > train/TrainBlurFraction {
			trains = append(trains, Reason{FigureWakeUp, fmt.Sprintf(
				"an idle CPU takes %s to wake > %s, a tenth of a %d-packet train",
				FormatNs(w), FormatNs(train/TrainBlurFraction), TrainPackets)})
		}
	}

	// What the receiving interfaces do to timestamps.
	for _, ifc := range rx {
		if ifc.Offloads.Merges() {
			pairs = append(pairs, Reason{FigureOffload, fmt.Sprintf(
				"%s merges received packets (%s): a merged packet has one timestamp",
				ifc.Name, mergingOffloads(ifc.Offloads))})
		}
		if ifc.Coalesce.Adaptive() {
			pairs = append(pairs, Reason{FigureCoalescing, fmt.Sprintf(
				"%s adapts interrupt coalescing to the load (adaptive-rx): packets close together may share a timestamp",
				ifc.Name)})
		}
		blur := ifc.Coalesce.BlurNs(gap)
		if blur > gap/PairStepFraction {
			pairs = append(pairs, Reason{FigureCoalescing, fmt.Sprintf(
				"%s holds packets up to %s for one interrupt > %s, a tenth of the gap",
				ifc.Name, FormatNs(blur), FormatNs(gap/PairStepFraction))})
		}
		if blur > train/TrainBlurFraction {
			trains = append(trains, Reason{FigureCoalescing, fmt.Sprintf(
				"%s holds packets up to %s for one interrupt > %s, a tenth of a %d-packet train",
				ifc.Name, FormatNs(blur), FormatNs(train/TrainBlurFraction), TrainPackets)})
		}
	}

	// Sending: one thread must pace packets at least as fast as the link.
	switch paced := l.MaxPacedBitRate(); {
	case paced <= 0:
		saturate = append(saturate, Reason{FigureSendCost, "send cost not measured"})
	case paced < rateBps:
		saturate = append(saturate, Reason{FigureSendCost, fmt.Sprintf(
			"one thread sends a %d-byte packet every %s: %s < %s",
			PacketBytes, FormatNs(l.SendCostNs), FormatBitRate(paced), FormatBitRate(rateBps))})
	}

	// Receiving: every packet, pair and train must get through memory at
	// the link rate, or it waits in the ring and its timestamp shows the
	// host, not the network.
	switch recv := l.MaxReceiveBitRate(); {
	case recv <= 0:
		r := Reason{FigureMemoryCopy, "memory copy bandwidth not measured"}
		pairs, trains, saturate = append(pairs, r), append(trains, r), append(saturate, r)
	case recv < rateBps:
		r := Reason{FigureMemoryCopy, fmt.Sprintf(
			"memory copies %s GB/s%s, enough to receive and record %s < %s",
			strconv.FormatFloat(l.MemcpyGBps, 'g', 3, 64), l.memcpySpread(), FormatBitRate(recv), FormatBitRate(rateBps))}
		pairs, trains, saturate = append(pairs, r), append(trains, r), append(saturate, r)
	}

	v.Pairs = Answer{OK: len(pairs) == 0, LimitedBy: pairs}
	v.Trains = Answer{OK: len(trains) == 0, LimitedBy: trains}
	v.Saturate = Answer{OK: len(saturate) == 0, LimitedBy: saturate}
	return v
}

// mergingOffloads names the active offloads that merge packets.
func mergingOffloads(o *Offloads) string {
	var s string
	for _, f := range []struct {
		on   bool
		name string
	}{{o.GRO, "GRO"}, {o.GROHW, "hardware GRO"}, {o.LRO, "LRO"}} {
		if !f.on {
			continue
		}
		if s != "" {
			s += ", "
		}
		s += f.name
	}
	return s
}

// FormatNs formats a time in nanoseconds with three significant digits in
// the largest unit that keeps it at least 1: "33.4 ns", "1.2 µs", "12 ms".
func FormatNs(ns float64) string {
	units := []struct {
		scale float64
		name  string
	}{{1e9, "s"}, {1e6, "ms"}, {1e3, "µs"}}
	for _, u := range units {
		if ns >= u.scale {
			return strconv.FormatFloat(ns/u.scale, 'g', 3, 64) + " " + u.name
		}
	}
	return strconv.FormatFloat(ns, 'g', 3, 64) + " ns"
}

// FormatBitRate formats a rate in bit/s with three significant digits:
// "100 Mb/s", "4.8 Gb/s".
func FormatBitRate(bps float64) string {
	units := []struct {
		scale float64
		name  string
	}{{1e12, "Tb/s"}, {1e9, "Gb/s"}, {1e6, "Mb/s"}, {1e3, "kb/s"}}
	for _, u := range units {
		if bps >= u.scale {
			return strconv.FormatFloat(bps/u.scale, 'g', 3, 64) + " " + u.name
		}
	}
	return strconv.FormatFloat(bps, 'g', 3, 64) + " b/s"
}

// memcpySpread says how far the copies ranged, when they did.
func (l Limits) memcpySpread() string {
	if l.MemcpyMinGBps <= 0 || l.MemcpyMaxGBps <= l.MemcpyMinGBps {
		return ""
	}
	return fmt.Sprintf(" (median; %s to %s)", strconv.FormatFloat(l.MemcpyMinGBps, 'g', 3, 64), strconv.FormatFloat(l.MemcpyMaxGBps, 'g', 3, 64))
}
