// SPDX-License-Identifier: Apache-2.0

package availbw

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

// pinProcess puts every thread of this process on one CPU (threads made
// later inherit it from the thread that makes them) until the test ends:
// the probe's sender and the cross traffic then compete for that CPU as
// they do on a busy sender with one core to spare.
func pinProcess(t *testing.T, cpu int) {
	t.Helper()
	var was unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		t.Fatal(err)
	}
	set := func(s *unix.CPUSet) {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range tasks {
			tid, _ := strconv.Atoi(e.Name())
			_ = unix.SchedSetaffinity(tid, s) // a thread may have exited meanwhile
		}
	}
	var one unix.CPUSet
	one.Set(cpu)
	set(&one)
	t.Cleanup(func() { set(&was) })
}

// crossEnv makes this test binary a cross-traffic generator: "ADDR:PORT BURST".
const crossEnv = "BWPROBE_TEST_CROSS"

func TestMain(m *testing.M) {
	if v := os.Getenv(crossEnv); v != "" {
		os.Exit(crossGenerator(v))
	}
	os.Exit(m.Run())
}

// crossGenerator sends bursts of datagrams every crossPeriod until killed:
// cross traffic from a process of ordinary priority that sleeps between
// bursts, as most senders do. A burst that is late is not made up for, as
// a timer-driven sender's would not be (time.Ticker drops missed ticks).
func crossGenerator(spec string) int {
	addr, n, _ := strings.Cut(spec, " ")
	burst, _ := strconv.Atoi(n)
	c, err := net.Dial("udp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cross generator:", err)
		return 1
	}
	buf := make([]byte, crossPayload)
	for range time.Tick(crossPeriod) {
		for range burst {
			c.Write(buf)
		}
	}
	return 0
}

// crossBursts runs crossGenerator in h's namespace until the test ends.
func crossBursts(t *testing.T, p *netlab.Path, h netlab.Host, dst netip.AddrPort, burst int) {
	t.Helper()
	cmd := p.Command(h, os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d", crossEnv, dst, burst))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
}

const (
	crossPayload = 1472 // a 1500-byte IP packet, a 1514-byte frame
	crossPeriod  = 2 * time.Millisecond
)

// devTxBytes reads what h sent on its interface (frames, as tbf counts).
func devTxBytes(t *testing.T, h netlab.Host) uint64 {
	t.Helper()
	var n uint64
	err := h.Do(func() error {
		data, err := os.ReadFile("/proc/thread-self/net/dev")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(data), "\n") {
			name, rest, ok := strings.Cut(line, ":")
			if !ok || strings.TrimSpace(name) != h.Iface {
				continue
			}
			f := strings.Fields(rest) // receive: 8 columns, then transmit bytes
			if len(f) < 9 {
				return fmt.Errorf("short line %q", line)
			}
			n, err = strconv.ParseUint(f[8], 10, 64)
			return err
		}
		return fmt.Errorf("%s not in /proc/net/dev", h.Iface)
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCrossTrafficAtNormalPriority probes a 50 Mbit/s path that cross
// traffic from a task of ordinary priority on the same CPU loads by half.
// A sender that starved that task while it sent its streams found the
// path nearly empty (17 of 20 estimates +26 % to +178 %, no flag); the
// probe must measure the path as it is, or say the host limited it.
func TestCrossTrafficAtNormalPriority(t *testing.T) {
	if testing.Short() {
		t.Skip("probes a namespace path")
	}
	p := netlab.PathForTest(t, netlab.PathOptions{Name: "bwprobecrs", BottleneckMbit: 50, Cross: true})
	const burst = 4                                                            // datagrams every crossPeriod
	crossBits := float64(burst*(crossPayload+28+14)*8) / crossPeriod.Seconds() // 24.2 Mbit/s of frames
	sink := listenUDPIn(t, p.Receiver)
	sink.SetReadBuffer(4096)
	pinProcess(t, 0)
	srv := startServer(t, p.Sender, ServerConfig{MaxRate: 100e9})
	crossBursts(t, p, p.Cross, sink.LocalAddr().(*net.UDPAddr).AddrPort(), burst)
	crossBytes := func() uint64 { return devTxBytes(t, p.Cross) }
	for b := crossBytes(); crossBytes() < b+10*crossPayload; {
		time.Sleep(crossPeriod) // until the generator sends
	}
	// The cross traffic's own rate, without the probe: the generator on a
	// busy host may not keep its nominal rate by itself.
	q0, qt := crossBytes(), time.Now()
	time.Sleep(500 * time.Millisecond) // a span to measure a rate over, not a wait for an event
	quiet := float64(crossBytes()-q0) * 8 / time.Since(qt).Seconds()
	c, err := dialIn(t, p.Receiver, ClientConfig{Server: srv.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b0, t0 := crossBytes(), time.Now()
	r, err := c.Estimate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// What the probe measures is the path as it is without the probe: the
	// capacity less the cross traffic the generator sends by itself (in
	// frames, as tbf counts them), in the probe's terms (IP bits of its
	// packets). A sender that starves the generator empties the path it
	// measures: the cross traffic during the estimate shows by how much.
	cross := float64(crossBytes()-b0) * 8 / time.Since(t0).Seconds()
	share := netlab.FrameShare(r.Params.PacketSize)
	want := (50e6 - quiet) * share
	t.Logf("estimate %s [%s, %s], true %s (cross %s without the probe, %s while it ran), realtime %v, flags %v",
		FormatRate(r.Point), FormatRate(r.Low), FormatRate(float64(r.High)), FormatRate(want), FormatRate(quiet), FormatRate(cross), r.ServerRealTime, r.Flags)
	if quiet < 0.3*crossBits {
		t.Fatalf("the cross traffic ran at %s of its %s: the test did not load the path", FormatRate(quiet), FormatRate(crossBits))
	}
	if len(r.Flags) > 0 {
		return // the probe said its answer is not to be trusted
	}
	// 25 %: the generator's own rate varies on a busy host by about this
	// much between the quiet span and the estimate.
	if e := (r.Point - want) / want; e > 0.25 || e < -0.25 {
		t.Errorf("estimate %s, true %s (%+.0f %%) and no flag", FormatRate(r.Point), FormatRate(want), 100*e)
	}
}
