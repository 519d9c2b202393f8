// SPDX-License-Identifier: Apache-2.0

package availbw

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// Result is one estimate with everything needed to judge it.
type Result struct {
	Server string `json:"server"`
	*Estimate
	Params Params `json:"params"`
	// Flags say, in words, what limits or qualifies the estimate.
	Flags []string `json:"flags,omitempty"`
	// The server's pacing ability and limits, from its challenge.
	ServerPace      float64 `json:"server_pace_bps"`
	ServerPaceError string  `json:"server_pace_error,omitempty"`
	ServerMaxRate   float64 `json:"server_max_rate_bps"`
	// ServerRealTime says the server sent at real-time priority, which
	// keeps its pacing on a busy host.
	ServerRealTime bool    `json:"server_realtime"`
	ClientMaxRate  float64 `json:"client_max_rate_bps,omitempty"`
	// KernelTimestamps is false when some packet arrived without a kernel
	// receive timestamp and the client's clock was read instead.
	KernelTimestamps bool `json:"kernel_timestamps"`
	// ReceiverDrops counts the packets this host's probe socket dropped
	// during the estimate (SO_MEMINFO: its receive buffer was full):
	// losses of the receiver, not of the path.
	ReceiverDrops uint32 `json:"receiver_drops"`
	// CPU time spent by the client and, as it reports, the server; nil
	// (null) when the server ended the session at its time limit and so
	// reported none.
	ClientCPUSeconds float64   `json:"client_cpu_s"`
	ServerCPUSeconds *float64  `json:"server_cpu_s"`
	ControlRTTNs     int64     `json:"control_rtt_ns"`
	Start            time.Time `json:"start"`
	TookNs           int64     `json:"took_ns"`
}

// Flag texts.
const (
	FlagHostLimited = "host-limited"
	FlagRateLimited = "rate-limited"
	FlagCoalesced   = "coalesced timestamps: lower bound only"
	FlagUserTime    = "no kernel receive timestamps: user-space times used"
	FlagUnconverged = "did not converge"
	FlagRejected    = "many streams rejected (sender could not keep the rate)"
	FlagRealTime    = "the server sent at real-time priority (--realtime): traffic from other processes on its host waited while it sent, so the path may have looked emptier than it is"
)

// Estimate runs the search against the server and returns its result.
// It ends the session with the server when done.
func (c *Client) Estimate(ctx context.Context) (*Result, error) {
	var ru0 unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	start := time.Now()
	lim := Limits{Pace: c.chal.Pace, MaxRate: c.chal.MaxRate}
	if c.cfg.MaxRate > 0 && (lim.MaxRate == 0 || c.cfg.MaxRate < lim.MaxRate) {
		lim.MaxRate = c.cfg.MaxRate
	}
	est, err := searchPath(ctx, c, c.cfg.Params, lim, time.Now, c.cfg.Log)
	if errors.Is(err, errSessionLimit) {
		est.Stopped, est.serverEnded, err = err.Error(), true, nil
	}
	ended := est != nil && est.serverEnded
	if ended && len(est.Fleets) == 0 {
		// Nothing was measured: a figure of 0 b/s would be a misreport.
		return nil, fmt.Errorf("probe server: %s before a fleet of streams was measured", est.Stopped)
	}
	if err != nil {
		return nil, err
	}
	r := &Result{
		Server:           c.cfg.Server,
		Estimate:         est,
		Params:           c.cfg.Params,
		ServerPace:       c.chal.Pace,
		ServerPaceError:  c.chal.PaceError,
		ServerMaxRate:    c.chal.MaxRate,
		ServerRealTime:   c.chal.RealTime,
		ClientMaxRate:    c.cfg.MaxRate,
		KernelTimestamps: c.kernelStamps && !c.userTime.Load(),
		ControlRTTNs:     int64(c.rtt),
		Start:            start.UTC(),
		TookNs:           int64(time.Since(start)),
	}
	// After refusing a stream past its time limit the server closes the
	// session: it answers no goodbye, and its CPU time is not known.
	if !ended {
		cpu, err := c.bye()
		if err != nil {
			return nil, err
		}
		r.ServerCPUSeconds = &cpu
	}
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	r.ClientCPUSeconds = cpuSeconds(ru) - cpuSeconds(ru0)
	if d, err := socketDrops(c.udp); err == nil && d > c.drops0 {
		r.ReceiverDrops = d - c.drops0
	}
	if r.ReceiverDrops > 0 {
		// Packets lost at this host's socket count as a queue overflow
		// on the path (MaxLoss): the receiver, not the network, limited
		// what the streams showed.
		r.HostLimited = true
		r.HostLimits = append(r.HostLimits, HostLimitReceiverDrops)
	}
	r.Flags = r.flags()
	return r, nil
}

// bye ends the session and returns the server's CPU time.
func (c *Client) bye() (float64, error) {
	if err := c.ctl.write(message{Type: msgBye}); err != nil {
		return 0, fmt.Errorf("probe server: %w", err)
	}
	t := time.NewTimer(handshakeTimeout)
	defer t.Stop()
	for {
		select {
		case r := <-c.ctrl:
			if r.err != nil {
				return 0, fmt.Errorf("probe server: %w", r.err)
			}
			switch r.m.Type {
			case msgBye:
				return r.m.CPUSeconds, nil
			case msgError:
				return 0, fmt.Errorf("probe server: %s", r.m.Error)
			}
		case <-t.C:
			return 0, errors.New("probe server did not answer bye")
		}
	}
}

func (r *Result) flags() []string {
	var f []string
	for _, why := range r.HostLimits {
		switch why {
		case HostLimitPace:
			f = append(f, fmt.Sprintf("%s: the available bandwidth is above %s, where probing stopped (%.0f%% of what the sender can pace); this host cannot measure it",
				FlagHostLimited, FormatRate(r.Low), PaceShare*100))
		case HostLimitSendRate:
			f = append(f, fmt.Sprintf("%s: the path's narrow link (%s) is as fast as this host can send (%s): the estimate may be the hosts' limit, not the network's",
				FlagHostLimited, FormatRate(r.Capacity), FormatRate(r.TrainSendRate)))
		case HostLimitPacketRate:
			f = append(f, fmt.Sprintf("%s: the path's narrow point passed half-size packets at %s against %s for full-size ones: it is limited in packets per second (a host's forwarding or receiving, here or on the way), not a link of that capacity",
				FlagHostLimited, FormatRate(r.HalfCapacity), FormatRate(r.Capacity)))
		case HostLimitReceiverDrops:
			f = append(f, fmt.Sprintf("%s: this host's probe socket dropped %d packets (receive buffer full): the receiver could not keep up",
				FlagHostLimited, r.ReceiverDrops))
		}
	}
	if r.RateLimited {
		f = append(f, fmt.Sprintf("%s: the available bandwidth is above the maximum rate %s", FlagRateLimited, FormatRate(r.ProbeLimit)))
	}
	if r.Coalesced {
		f = append(f, FlagCoalesced)
	}
	if !r.KernelTimestamps {
		f = append(f, FlagUserTime)
	}
	if !r.Converged && !r.HostLimited && !r.RateLimited {
		f = append(f, FlagUnconverged+": "+r.Stopped)
	}
	if r.Streams > 0 && r.Rejected*4 > r.Streams {
		f = append(f, fmt.Sprintf("%s: %d of %d", FlagRejected, r.Rejected, r.Streams))
	}
	if r.ServerRealTime {
		f = append(f, FlagRealTime)
	}
	return f
}
