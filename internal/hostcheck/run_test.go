// SPDX-License-Identifier: Apache-2.0

package hostcheck_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/hostcheck"
	"github.com/magnet-tracer/magnet/internal/netlab"
)

// quickLimit is the time a quick run may take in this test: the target is
// half a second, and a loaded test machine gets some slack on top.
const quickLimit = 2 * time.Second

func TestRunQuick(t *testing.T) {
	fdsBefore := openFDs(t)
	r, err := hostcheck.Run(context.Background(), hostcheck.Options{Quick: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := openFDs(t); n > fdsBefore {
		t.Errorf("Run left %d file descriptors open", n-fdsBefore)
	}
	took := time.Duration(r.TookNs)
	t.Logf("quick run took %v: clock %s step %.0f ns, read %.1f ns; getppid %.0f ns; UDP send %.0f ns; memcpy %.2f GB/s",
		took, r.Clock.Source, r.Clock.ObservedStepNs, r.Clock.ReadCostNs,
		r.Syscalls.MinimalNs, r.Syscalls.UDPSendNs, r.Memory.CopyGBps)
	if !r.Quick || r.Version != hostcheck.ReportVersion || took <= 0 || took > quickLimit {
		t.Errorf("quick = %v, version = %d, took %v (limit %v)", r.Quick, r.Version, took, quickLimit)
	}

	inRange := func(name string, v, lo, hi float64) {
		t.Helper()
		if !(v >= lo && v <= hi) {
			t.Errorf("%s = %v, want between %v and %v", name, v, lo, hi)
		}
	}
	inRange("clock read cost ns", r.Clock.ReadCostNs, 5, 5000)
	inRange("observed clock step ns", r.Clock.ObservedStepNs, 1, 1e6)
	inRange("claimed resolution ns", float64(r.Clock.ClaimedResolutionNs), 1, 1e7)
	inRange("getppid ns", r.Syscalls.MinimalNs, 20, 100000)
	inRange("UDP send ns", r.Syscalls.UDPSendNs, 20, 1e6)
	inRange("memcpy GB/s", r.Memory.CopyGBps, 0.1, 500)
	if r.Syscalls.UDPSendError != "" {
		t.Errorf("UDP send error: %s", r.Syscalls.UDPSendError)
	}
	if r.Syscalls.UDPSendNs < r.Syscalls.MinimalNs {
		t.Errorf("a UDP send (%v ns) cost less than getppid (%v ns)", r.Syscalls.UDPSendNs, r.Syscalls.MinimalNs)
	}
	if r.Clock.Source == "" {
		t.Error("no clock source")
	}

	// The wake-up of an idle CPU: measured wherever there are two CPUs.
	switch c := r.CPU; {
	case runtime.NumCPU() < 2:
		if c.WakeUpError == "" {
			t.Errorf("one CPU, yet no wake-up error: %+v", c)
		}
	case c.WakeUpError != "":
		t.Errorf("wake-up not measured: %s", c.WakeUpError)
	default:
		t.Logf("idle wake-up %.1f µs median, %.1f µs longest, %d samples", c.WakeUpNs/1e3, c.WakeUpMaxNs/1e3, c.WakeUpSamples)
		if c.WakeUpSamples != 30 || c.WakeUpNs <= 0 || c.WakeUpMaxNs < c.WakeUpNs || c.WakeUpNs > 1e8 {
			t.Errorf("wake-up %+v, want 30 samples, 0 < median ≤ longest, median under 100 ms", c)
		}
	}

	l := r.Limits()
	if l.ClockStepNs <= 0 || l.SendCostNs <= 0 || l.MemcpyGBps <= 0 {
		t.Errorf("Limits = %+v, want all positive", l)
	}

	lo := findInterface(r, "lo")
	if lo == nil {
		t.Fatalf("no lo among %v (%s)", interfaceNames(r), r.InterfacesError)
	}
	if !lo.Loopback || lo.MTU <= 0 {
		t.Errorf("lo = %+v, want a loopback with an MTU", lo)
	}
	if lo.OffloadsError == "" && lo.Offloads == nil {
		t.Error("lo: neither offloads nor an error")
	}

	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back hostcheck.Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, r) {
		t.Errorf("JSON round trip changed the report:\n got %+v\nwant %+v", back, *r)
	}

	vs, err := r.Verdicts("")
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != len(hostcheck.LinkRates) {
		t.Errorf("%d verdicts, want %d", len(vs), len(hostcheck.LinkRates))
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := hostcheck.Run(ctx, hostcheck.Options{Quick: true}); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a cancelled context: %v, want context.Canceled", err)
	}
}

// TestRunInNamespace runs the check inside a network namespace holding a
// veth pair end, where it must see that namespace's interfaces, not the
// host's, and read veth0's features through ethtool netlink.
func TestRunInNamespace(t *testing.T) {
	lab := netlab.ForTest(t, netlab.Options{Name: "mghc"})
	var r *hostcheck.Report
	err := lab.Client.Do(func() error {
		var err error
		r, err = hostcheck.Run(context.Background(), hostcheck.Options{Quick: true})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	names := interfaceNames(r)
	if want := []string{"lo", lab.Client.Iface}; !reflect.DeepEqual(names, want) {
		t.Fatalf("interfaces in %s = %v, want %v", lab.Client.NS, names, want)
	}
	veth := findInterface(r, lab.Client.Iface)
	t.Logf("%s: speed %d Mb/s (%s), offloads %+v (%s), coalesce %+v (%s)", veth.Name,
		veth.SpeedMbps, veth.SpeedError, veth.Offloads, veth.OffloadsError, veth.Coalesce, veth.CoalesceError)
	if veth.Index != lab.Client.IfIndex || !veth.Up || veth.Loopback {
		t.Errorf("%s = %+v, want index %d, up, not loopback", veth.Name, veth, lab.Client.IfIndex)
	}

	// Features are kept by the core for every device, so they are never
	// "unsupported": either ethtool netlink answers, or its absence is
	// reported on every interface without failing the run.
	if strings.HasPrefix(veth.OffloadsError, "ethtool netlink unavailable") {
		for _, ifc := range r.Interfaces {
			if ifc.OffloadsError != veth.OffloadsError {
				t.Errorf("%s: offloads error %q, want %q like %s", ifc.Name, ifc.OffloadsError, veth.OffloadsError, veth.Name)
			}
		}
		t.Skipf("kernel without ethtool netlink: %s", veth.OffloadsError)
	}
	if veth.OffloadsError != "" || veth.Offloads == nil {
		t.Fatalf("%s offloads: %+v, error %q", veth.Name, veth.Offloads, veth.OffloadsError)
	}
	// veth segments in software and never merges in hardware.
	if !veth.Offloads.GSO || veth.Offloads.LRO || veth.Offloads.GROHW {
		t.Errorf("%s offloads = %+v, want GSO on, LRO and hardware GRO off", veth.Name, *veth.Offloads)
	}
	// veth reports a fixed 10 Gb/s link.
	if veth.SpeedError != "" || veth.SpeedMbps != 10000 {
		t.Errorf("%s speed = %d Mb/s, error %q, want 10000", veth.Name, veth.SpeedMbps, veth.SpeedError)
	}
	if veth.CoalesceError != "" && veth.CoalesceError != "unsupported by driver" {
		t.Errorf("%s coalescing error %q, want none or unsupported by driver", veth.Name, veth.CoalesceError)
	}
	if lo := findInterface(r, "lo"); lo.SpeedError != "unsupported by driver" {
		t.Errorf("lo speed error = %q, want unsupported by driver", lo.SpeedError)
	}
	if r.Syscalls.UDPSendError != "" {
		t.Errorf("UDP send inside the namespace: %s", r.Syscalls.UDPSendError)
	}
}

func findInterface(r *hostcheck.Report, name string) *hostcheck.Interface {
	for i := range r.Interfaces {
		if r.Interfaces[i].Name == name {
			return &r.Interfaces[i]
		}
	}
	return nil
}

func interfaceNames(r *hostcheck.Report) []string {
	var names []string
	for _, ifc := range r.Interfaces {
		names = append(names, ifc.Name)
	}
	return names
}

// openFDs counts the file descriptors this process has open, except the
// runtime's own (its network poller's epoll and event descriptors appear on
// first use of a file and stay).
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count file descriptors: %v", err)
	}
	n := 0
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err == nil && !strings.HasPrefix(target, "anon_inode:") {
			n++
		}
	}
	return n
}
