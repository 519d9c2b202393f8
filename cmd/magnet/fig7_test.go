// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// fig7Rate is the link rate of the Fig. 7 replay in Mbit/s:
// MAGNET_FIG7_MBIT overrides it.
func fig7Rate(t *testing.T) int {
	if v := os.Getenv("MAGNET_FIG7_MBIT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 10 {
			t.Fatalf("MAGNET_FIG7_MBIT=%q: want a rate in Mbit/s, at least 10", v)
		}
		return n
	}
	return 1000
}

// connByEnds waits for the daemon to know the connection with these
// local and remote addresses and returns it.
func connByEnds(t *testing.T, c *magnetclient.Client, local, remote string) magnetclient.Connection {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		conns, err := c.Connections(context.Background(), magnetclient.Filter{Addrs: []string{strings.Split(local, ":")[0]}}, magnetclient.Window{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cn := range conns {
			if cn.Local == local && cn.Remote == remote {
				return cn
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon does not know %s -> %s", local, remote)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type bwSample struct {
	at       time.Duration // since the transfer began
	bps      float64       // the daemon's figure
	received int64         // bytes the application had read by then
}

// TestFig7Replay replays MAGNET 2.0's Fig. 7 ("bandwidth during
// congestion"): a bulk transfer over a rate-limited veth; a competing bulk
// transfer from 4 s to 7 s; a client that pulls the daemon's short-term
// bandwidth of the first transfer's receiving socket (the last 1000
// socket-receive events) every 100 ms. It sees the link's rate alone, a
// drop while the other runs, and the rate again within 1 s of the other
// stopping. At the end the daemon's whole-connection figures are compared
// with the bytes the application counted.
func TestFig7Replay(t *testing.T) {
	rate := fig7Rate(t)
	d := startDaemon(t, false, "filter:\n  port: 15305\n") // the competitor, 15306, is not traced
	mc := d.Client(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "fig7", RateMbit: rate})
	linkBPS := float64(rate) * 1e6

	a := startFlow(t, lab, 15305, 64<<10)
	recv := connByEnds(t, mc, a.Remote.String(), a.Local.String()) // the server's end
	q := magnetclient.BandwidthQuery{Layer: "app", Dir: "recv", Events: 1000}

	const (
		competeFrom = 4 * time.Second
		competeTo   = 7 * time.Second
		end         = 10 * time.Second
	)
	var samples []bwSample
	var compete *flow
	var competeStopped time.Duration
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		at := time.Since(a.start)
		if compete == nil && at >= competeFrom {
			compete = startFlow(t, lab, 15306, 64<<10)
		}
		if compete != nil && competeStopped == 0 && at >= competeTo {
			compete.Stop()
			competeStopped = time.Since(a.start)
		}
		if at >= end {
			break
		}
		bw, err := mc.Bandwidth(context.Background(), recv.ID, q)
		if err != nil {
			t.Fatalf("pull at %v: %v", at, err)
		}
		samples = append(samples, bwSample{at, bw.BPS, a.Received.Load()})
	}
	elapsed := a.Stop()
	var b strings.Builder
	for i, s := range samples {
		fmt.Fprintf(&b, "%5.1fs %6.1f", s.at.Seconds(), s.bps/1e6)
		if i%8 == 7 {
			b.WriteString("\n")
		} else {
			b.WriteString("  |")
		}
	}
	t.Logf("link %d Mbit/s; Mbit/s the daemon reported, every 100 ms (competitor %v to %v):\n%s", rate, competeFrom, competeStopped.Round(time.Millisecond), b.String())

	median := func(from, to time.Duration) float64 {
		var v []float64
		for _, s := range samples {
			if s.at >= from && s.at < to {
				v = append(v, s.bps)
			}
		}
		if len(v) == 0 {
			t.Fatalf("no samples between %v and %v", from, to)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	// Alone, once slow start is over: the link's rate, within 10 %. On a
	// machine too busy to fill the link the application's own count says
	// so; the daemon must then agree with it instead.
	alone := median(2*time.Second, competeFrom)
	appAlone := appRate(t, samples, 2*time.Second, competeFrom)
	want, what := linkBPS, fmt.Sprintf("the link's %d Mbit/s", rate)
	if appAlone < 0.9*linkBPS {
		t.Logf("this machine moved only %s alone (the application's count): comparing with that", mbit(appAlone))
		want, what = appAlone, "the application's "+mbit(appAlone)
	}
	if alone < 0.9*want || alone > 1.1*want {
		t.Errorf("alone: %s, want within 10%% of %s", mbit(alone), what)
	}
	// Sharing: a clear drop (a fair share is half).
	shared := median(competeFrom+time.Second, competeTo)
	if shared > 0.75*alone {
		t.Errorf("while the other transfer runs: %s, want a drop from %s", mbit(shared), mbit(alone))
	}
	// Back within 1 s of the other stopping: within 10 % of the rate alone.
	back := time.Duration(-1)
	for _, s := range samples {
		if s.at > competeStopped && s.bps >= 0.9*alone {
			back = s.at - competeStopped
			break
		}
	}
	if back < 0 || back > time.Second {
		t.Errorf("after the other stopped: back to 90%% of %s after %v, want within 1s", mbit(alone), back)
	}
	t.Logf("alone %s (application %s), shared %s, back after %v", mbit(alone), mbit(appAlone), mbit(shared), back)

	// The whole connection: the daemon's bytes are the application's, and
	// its average over the connection's life (open to close, as MAGNET
	// 2.0's magnetd) is the application's (first to last byte, as FTP).
	var final *magnetclient.Connection
	waitFor(t, func() bool {
		c, err := mc.Connection(context.Background(), recv.ID, magnetclient.Window{})
		if err != nil {
			t.Fatal(err)
		}
		final = c
		return c.CloseNs != 0 && c.App.Recv.Bytes == a.Received.Load()
	})
	st, err := mc.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n := st.Recorder.LostByType["sock_recv"]; n > 0 {
		t.Errorf("the recorder lost %d sock_recv events", n)
	}
	appAvg := float64(a.Received.Load()) * 8 / elapsed.Seconds()
	daemonAvg := float64(final.App.Recv.Bytes) * 8 / (float64(final.CloseNs-final.OpenNs) / 1e9)
	t.Logf("bytes: application %d, daemon %d; average: application %s, daemon %s (open to close), %s (first to last receive)",
		a.Received.Load(), final.App.Recv.Bytes, mbit(appAvg), mbit(daemonAvg), mbit(final.App.Recv.AverageBPS))
	if diff := (daemonAvg - appAvg) / appAvg; diff < -0.05 || diff > 0.05 {
		t.Errorf("the daemon's whole-connection average %s differs from the application's %s by %.1f%%", mbit(daemonAvg), mbit(appAvg), 100*diff)
	}
}

// appRate is the rate at which the application read between from and to,
// by its own count.
func appRate(t *testing.T, samples []bwSample, from, to time.Duration) float64 {
	t.Helper()
	var first, last *bwSample
	for i := range samples {
		if samples[i].at >= from && samples[i].at < to {
			if first == nil {
				first = &samples[i]
			}
			last = &samples[i]
		}
	}
	if first == nil || last == first {
		t.Fatalf("too few samples between %v and %v", from, to)
	}
	return float64(last.received-first.received) * 8 / (last.at - first.at).Seconds()
}
