// SPDX-License-Identifier: Apache-2.0

package probeaccuracy

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// crossGen is a running cross-traffic generator process.
type crossGen struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	errs strings.Builder
	done chan struct{}
}

// crossDuration bounds how long a generator runs; stop ends it sooner.
const crossDuration = 10 * time.Minute

// startCross starts cross traffic of kind at bps (frames counted as tbf
// counts them) from the cross host to the sink on the receiver, through
// the bottleneck. Constant-rate traffic is a UDP flood that a tbf on the
// cross host's egress paces; bursty traffic is bursts of back-to-back
// datagrams every BurstPeriod, unshaped.
func (l *lab) startCross(ctx context.Context, kind string, bps float64) (*crossGen, error) {
	g := &crossGen{done: make(chan struct{})}
	if bps < 1e3 {
		close(g.done)
		return g, nil // nothing to send
	}
	var args []string
	switch kind {
	case CBR:
		if err := l.path.ShapeCross(bps, 0); err != nil {
			return nil, err
		}
		args = []string{"--flood", crossDuration.String()}
	case Bursty:
		burst := max(1, int(math.Round(bps*BurstPeriod.Seconds()/frameBits)))
		// A tbf whose bucket holds one burst keeps the mean rate when the
		// generator is late: a late burst still leaves at once, but the
		// catch-up bursts after it are paced at the mean rate instead of
		// flooding the bottleneck.
		if err := l.path.ShapeCross(bps, burst*frameBits/8+frameBits/8); err != nil {
			return nil, err
		}
		// The period that gives exactly bps with a whole burst.
		period := time.Duration(float64(burst) * frameBits / bps * 1e9)
		count := int(crossDuration / period * time.Duration(burst))
		args = []string{"--count", strconv.Itoa(count), "--interval", period.String(), "--burst", strconv.Itoa(burst)}
	default:
		return nil, fmt.Errorf("unknown cross traffic %q", kind)
	}
	args = append([]string{"netns", "exec", l.path.Cross.NS, l.opts.Magnet, "workload", "send",
		"--proto", "udp", "--to", l.sinkAt, "--size", strconv.Itoa(crossPayload)}, args...)
	// At normal priority, as cross traffic is: a generator at real-time
	// priority would hide a probe that starves ordinary tasks.
	g.cmd = exec.CommandContext(ctx, "ip", args...)
	g.cmd.Stderr = &lockedWriter{mu: &g.mu, w: &g.errs}
	if err := g.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start cross traffic: %w", err)
	}
	go func() { _ = g.cmd.Wait(); close(g.done) }()
	return g, nil
}

// stop ends the generator and waits for it.
func (g *crossGen) stop() {
	if g.cmd == nil {
		return
	}
	select {
	case <-g.done:
		return
	default:
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(5 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.done
	}
}

// failed says why the generator ended early, or "".
func (g *crossGen) failed() string {
	if g.cmd == nil {
		return ""
	}
	select {
	case <-g.done:
	default:
		return "" // still running, as it should
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return "generator ended early: " + oneLine(g.errs.String())
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(b)
}

// openSink opens a UDP socket on the receiver that is never read, with a
// tiny buffer: cross traffic crosses the bottleneck and is then dropped by
// the kernel, at no cost to the receiver's CPU and without ICMP errors.
func (l *lab) openSink() error {
	var c *net.UDPConn
	err := l.path.Receiver.Do(func() error {
		var err error
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(l.path.Receiver.Addr, 0)))
		return err
	})
	if err != nil {
		return fmt.Errorf("open cross-traffic sink: %w", err)
	}
	_ = c.SetReadBuffer(4096)
	l.sink, l.sinkAt = c, c.LocalAddr().String()
	return nil
}

// crossCounter returns the bytes the cross host has sent on its link,
// Ethernet headers included: /proc/net/dev read from inside its namespace.
func (l *lab) crossCounter() (uint64, error) {
	return txBytes(l.path.Cross)
}

// txBytes reads a host's transmitted bytes on its interface.
func txBytes(h netlab.Host) (uint64, error) {
	var n uint64
	err := h.Do(func() error {
		f, err := os.Open("/proc/thread-self/net/dev")
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			name, rest, ok := strings.Cut(sc.Text(), ":")
			if !ok || strings.TrimSpace(name) != h.Iface {
				continue
			}
			// receive: bytes packets errs drop fifo frame compressed
			// multicast; then transmit: bytes ...
			f := strings.Fields(rest)
			if len(f) < 9 {
				return fmt.Errorf("short /proc/net/dev line for %s", h.Iface)
			}
			n, err = strconv.ParseUint(f[8], 10, 64)
			return err
		}
		return fmt.Errorf("%s not in /proc/net/dev", h.Iface)
	})
	if err != nil {
		return 0, fmt.Errorf("read %s counters in %s: %w", h.Iface, h.NS, err)
	}
	return n, nil
}
