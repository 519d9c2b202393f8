// SPDX-License-Identifier: Apache-2.0

package hostcheckcmd

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/hostcheck"
)

func ptr[T any](v T) *T { return &v }

// sampleReport is a made-up host: a fine clock, a slow send, and an eth0
// that coalesces interrupts for 50 µs.
func sampleReport() *hostcheck.Report {
	return &hostcheck.Report{
		Clock: hostcheck.Clock{
			Source: "tsc", Available: []string{"tsc", "hpet"}, ConstantTSC: true, NonstopTSC: true,
			ClaimedResolutionNs: 1, ObservedStepNs: 20, ReadCostNs: 21,
		},
		Syscalls: hostcheck.Syscalls{MinimalNs: 100, UDPSendNs: 10000, UDPSendBytes: 1472},
		Memory:   hostcheck.Memory{CopyGBps: 20, CopyMinGBps: 8, CopyMaxGBps: 24, Copies: 10, BufferBytes: 64 << 20, LargestCacheBytes: 32 << 20},
		Interfaces: []hostcheck.Interface{
			{Name: "lo", Up: true, Loopback: true, MTU: 65536, SpeedError: "unsupported by driver",
				Offloads: &hostcheck.Offloads{GRO: true, GSO: true, TSO: true}, CoalesceError: "unsupported by driver"},
			{Name: "eth0", Up: true, MTU: 1500, SpeedMbps: 10000,
				Offloads: &hostcheck.Offloads{GSO: true, TSO: true},
				Coalesce: &hostcheck.Coalesce{RxUsecs: ptr[uint32](50), RxFrames: ptr[uint32](0), AdaptiveRx: ptr(false)}},
		},
		CPU: hostcheck.CPU{
			ScalingDriver: "intel_pstate", Governor: "powersave", PstateStatus: "intel_pstate active",
			CurKHz: 1200000, MinKHz: 800000, MaxKHz: 4500000,
			IdleStates: []hostcheck.IdleState{{Name: "POLL"}, {Name: "C6", LatencyUs: 133}},
		},
	}
}

func TestWrite(t *testing.T) {
	rep := sampleReport()
	vs, err := rep.Verdicts("")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Write(&out, rep, vs); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	t.Log("\n" + text)

	// Sections in order.
	last := -1
	for _, s := range []string{"Clock\n", "System calls\n", "Memory\n", "Interfaces\n", "CPU\n", "Verdict (", "Why not\n"} {
		i := strings.Index(text, s)
		if i < 0 || i < last {
			t.Fatalf("section %q missing or out of order", s)
		}
		last = i
	}
	for _, want := range []string{
		"  observed step: 20 ns — the smallest time difference",
		"  UDP send of 1472 bytes: 10 µs — one send through the whole IP stack",
		"  highest paced rate: 100 k packets/s, 1.2 Gb/s — ",
		"  smallest inter-packet gap: 10 µs — ",
		"  copy bandwidth: 20 GB/s — median of 10 copies, from 8 to 24 GB/s; one thread copying a 64 MiB buffer, larger than the caches\n",
		"  highest receive-and-record rate: 78.9 Gb/s — ",
		"  lo coalescing: unsupported by driver — ",
		"  eth0 link: up, MTU 1500, speed 10 Gb/s — ",
		"  eth0 offloads: GRO off, hardware GRO off, LRO off, GSO on, TSO on — received packets are timestamped one by one",
		"  eth0 coalescing: rx-usecs 50, rx-frames 0, adaptive-rx off — packets arriving within 50 µs share one interrupt and so one timestamp",
		"  governor: powersave (intel_pstate), intel_pstate active — ",
		"  timing disturbance: idle state C6 enabled with 133 µs exit latency — a packet arriving at an idle CPU waits up to 133 µs",
		"  pairs at 100 Mb/s: interrupt coalescing — eth0 holds packets up to 50 µs for one interrupt > 12 µs, a tenth of the gap\n",
		"  pairs, trains, saturate at 100 Gb/s: memory copy — memory copies 20 GB/s (median; 8 to 24), enough to receive and record 78.9 Gb/s < 100 Gb/s\n",
		"  saturate at 10 Gb/s: send cost — one thread sends a 1500-byte packet every 10 µs: 1.2 Gb/s < 10 Gb/s\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// The table row at 10 Gb/s, with its columns squeezed to one space.
	row := ""
	for line := range strings.Lines(text) {
		if strings.HasPrefix(line, "  10 Gb/s ") {
			row = strings.Join(strings.Fields(line), " ")
		}
	}
	if want := "10 Gb/s 1.2 µs no: send cost, interrupt coalescing no: interrupt coalescing no: send cost"; row != want {
		t.Errorf("10 Gb/s row = %q, want %q", row, want)
	}
}

func TestCommandJSON(t *testing.T) {
	cmd := New()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--quick", "--json"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	var got struct {
		hostcheck.Report
		Limits   hostcheck.Limits    `json:"limits"`
		Verdicts []hostcheck.Verdict `json:"verdicts"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out.String())
	}
	if !got.Quick || got.Clock.ReadCostNs <= 0 || got.Limits.MemcpyGBps <= 0 {
		t.Errorf("report = quick %v, read cost %v, limits %+v", got.Quick, got.Clock.ReadCostNs, got.Limits)
	}
	if len(got.Verdicts) != len(hostcheck.LinkRates) {
		t.Errorf("%d verdicts, want %d", len(got.Verdicts), len(hostcheck.LinkRates))
	}
	found := false
	for _, ifc := range got.Interfaces {
		found = found || ifc.Name == "lo"
	}
	if !found {
		t.Error("no lo in interfaces")
	}
}

func TestCommandText(t *testing.T) {
	cmd := New()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--quick", "--interface", "lo"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Clock\n", "  lo link: up", "Verdict (1500-byte packets; trains of 100 packets)\n", "  100 Gb/s "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestCommandErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--quick", "--interface", "nope0"}, `hostcheck: no interface "nope0"`},
		{[]string{"extra"}, `unknown command "extra"`},
	} {
		cmd := New()
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs(tc.args)
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error spans lines: %q", tc.args, err)
		}
	}
}
