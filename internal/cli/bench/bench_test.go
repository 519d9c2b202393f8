// SPDX-License-Identifier: Apache-2.0

package benchcmd

import (
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/overhead"
)

func TestCheckFlags(t *testing.T) {
	opts := overhead.Options{Reps: 5, Duration: 4 * time.Second, RateMbit: 4000, Workload: "iperf3", TcpdumpSnaplen: 96}
	if err := checkFlags(&opts, "record,tcpdump", "none"); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(overhead.Names(opts.Configs), ","); got != "baseline,record,tcpdump" || opts.Saturation != nil {
		t.Errorf("configs %s, saturation %v", got, opts.Saturation)
	}
	if err := checkFlags(&opts, "record", "record"); err != nil || len(opts.Saturation) != 2 {
		t.Errorf("saturation %v, %v", opts.Saturation, err)
	}
}

func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--reps", "0"},
		{"--rate", "0"},
		{"--configs", "nope"},
		{"--saturation-configs", "baseline,strace"},
		{"--duration", "10ms"},
		{"--duration", "1500ms"},
		{"--workload", "netperf"},
		{"--tcpdump-snaplen", "0"},
		{"extra"},
	} {
		cmd := New()
		cmd.SetArgs(args)
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		err := cmd.Execute()
		if err == nil {
			t.Errorf("%v: no error", args)
			continue
		}
		// One line a user can act on.
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %q spans lines", args, err)
		}
	}
}
