// SPDX-License-Identifier: Apache-2.0

package probecmd

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/magnet-tracer/magnet/internal/availbw"
)

// run executes "magnet probe args..." in process.
func run(out io.Writer, args ...string) error {
	root := &cobra.Command{Use: "magnet", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(New())
	root.SetArgs(append([]string{"probe"}, args...))
	root.SetOut(out)
	root.SetErr(io.Discard)
	return root.Execute()
}

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"server", "--max-rate", "fast"}, `probe server: --max-rate: rate "fast": want a number of bit/s with an optional k, M, G or T (e.g. 100M)`},
		{[]string{"server", "--max-duration", "0s"}, "probe server: --max-duration 0s must be positive"},
		{[]string{"server", "--listen", "256.1.1.1:7207"}, "probe server: listen:"},
		{[]string{"client", "10.0.0.1", "--max-rate", "-5M"}, `probe client: --max-rate: rate "-5M": want a positive rate up to 1000 Tb/s`},
		{[]string{"client", "10.0.0.1", "--port", "0"}, "probe client: --port 0 outside 1..65535"},
		{[]string{"client", "10.0.0.1:80", "--port", "81"}, "probe client: 10.0.0.1:80 names port 80 but --port says 81"},
		{[]string{"client", "a b"}, `probe client: "a b" is not a host name or address`},
		{[]string{"client", "10.0.0.1", "--timeout", "-1s"}, "probe client: --timeout -1s must be positive"},
		{[]string{"client", "127.0.0.1", "--port", "1", "--packet-size", "20"}, "probe client: --packet-size 20 outside 100..1500 bytes"},
		{[]string{"client", "127.0.0.1", "--port", "1", "--packet-size", "0"}, "probe client: --packet-size 0 outside 100..1500 bytes"},
		{[]string{"client", "127.0.0.1", "--port", "1", "--stream-packets", "0"}, "probe client: --stream-packets 0 outside 10..1000"},
		{[]string{"client", "127.0.0.1", "--port", "1", "--stream-packets", "5000"}, "probe client: --stream-packets 5000 outside 10..1000"},
		{[]string{"client"}, "probe client: give the probe server's HOST"},
	} {
		err := run(io.Discard, tc.args...)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error %v, want one line starting %q", tc.args, err, tc.want)
		}
	}
}

func TestServerAddr(t *testing.T) {
	for _, tc := range []struct {
		host    string
		port    int
		portSet bool
		want    string
	}{
		{"10.0.0.1", 7207, false, "10.0.0.1:7207"},
		{"10.0.0.1:99", 7207, false, "10.0.0.1:99"},
		{"10.0.0.1:99", 99, true, "10.0.0.1:99"},
		{"fe80::1", 7207, false, "[fe80::1]:7207"},
		{"[fe80::1]:8", 7207, false, "[fe80::1]:8"},
		{"host.example", 1, true, "host.example:1"},
	} {
		got, err := serverAddr(tc.host, tc.port, tc.portSet)
		if err != nil || got != tc.want {
			t.Errorf("serverAddr(%q, %d) = %q, %v; want %q", tc.host, tc.port, got, err, tc.want)
		}
	}
}

func TestWrite(t *testing.T) {
	r := &availbw.Result{
		Server: "10.0.0.1:7207",
		Estimate: &availbw.Estimate{Low: 48e6, High: 52e6, Point: 50.1e6, GreyLow: 49e6, GreyHigh: 51e6, Capacity: 98.8e6,
			TrainSendRate: 2.1e9, ProbeLimit: 1.68e9, Streams: 14, Rejected: 1, Bytes: 940_000,
			Fleets: make([]availbw.Fleet, 4)},
		ServerPace: 14.8e9, ServerRealTime: true, KernelTimestamps: true, ClientCPUSeconds: 0.05, ServerCPUSeconds: ptr(0.2), TookNs: 380e6,
	}
	var b bytes.Buffer
	if err := Write(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"available bandwidth from 10.0.0.1:7207 to this host",
		"estimate:    50.1 Mb/s (range 48 Mb/s to 52 Mb/s)",
		"grey region: 49 Mb/s to 51 Mb/s",
		"capacity:    98.8 Mb/s",
		"sender reached 2.1 Gb/s back to back (its send cost allows 14.8 Gb/s), sending at real-time priority; probed up to 1.68 Gb/s; kernel receive timestamps",
		"flags:       none",
		"14 streams (1 rejected) in 4 fleets, 940.0 kB of probe traffic, 0.38 s, CPU 0.05 s here and 0.20 s on the server",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
	r.HostLimited, r.High, r.Low = true, 0, 1.68e9
	r.Flags = []string{"host-limited: ..."}
	b.Reset()
	if err := Write(&b, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "estimate:    at least 1.68 Gb/s (host-limited") || !strings.Contains(b.String(), "flag:        host-limited") {
		t.Errorf("host-limited output:\n%s", b.String())
	}
	// No upper bound is null in JSON, not 0 (a rate of nothing).
	js, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(js), `"high_bps":null`) {
		t.Errorf("no upper bound in JSON: %s", js)
	}
	var back availbw.Result
	if err := json.Unmarshal(js, &back); err != nil || back.High != 0 || back.Low != 1.68e9 {
		t.Errorf("JSON read back: %v, high %v low %v", err, back.High, back.Low)
	}
	r.High = 52e6
	if js, _ := json.Marshal(r); !strings.Contains(string(js), `"high_bps":52000000`) {
		t.Errorf("upper bound in JSON: %s", js)
	}
	// A server that ended the session at its time limit reported no CPU
	// time: the text says so and why the search stopped; JSON has null.
	r.ServerCPUSeconds, r.Stopped = nil, "the server's session time limit was reached (session time limit (2s) reached)"
	b.Reset()
	if err := Write(&b, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "stopped:     the server's session time limit was reached") || !strings.Contains(b.String(), "CPU 0.05 s here and not reported on the server") {
		t.Errorf("output of a session the server ended:\n%s", b.String())
	}
	if js, _ := json.Marshal(r); !strings.Contains(string(js), `"server_cpu_s":null`) {
		t.Errorf("server CPU not reported in JSON: %s", js)
	}
}

func ptr[T any](v T) *T { return &v }

func TestCommandLine(t *testing.T) {
	got := commandLine([]string{"bench", "probe", "--note", "load 10, it's busy", "-o", "x.md"})
	want := `magnet bench probe --note 'load 10, it'\''s busy' -o x.md`
	if got != want {
		t.Errorf("commandLine = %s, want %s", got, want)
	}
}
