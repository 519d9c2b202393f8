// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"slices"
	"testing"

	"github.com/magnet-tracer/magnet/internal/netlab"
)

func TestOnCPU(t *testing.T) {
	lab := &netlab.Lab{Client: netlab.Host{NS: "c"}, Server: netlab.Host{NS: "s"}}
	b := &bencher{}
	if name, args := b.onCPU(lab, lab.Client, "magnet", "workload", "send"); name != "magnet" || !slices.Equal(args, []string{"workload", "send"}) {
		t.Errorf("unpinned: %s %v", name, args)
	}
	b.pin = &pinning{sender: 2, receiver: 5}
	for _, c := range []struct {
		h   netlab.Host
		cpu string
	}{{lab.Client, "2"}, {lab.Server, "5"}} {
		name, args := b.onCPU(lab, c.h, "magnet", "workload")
		if name != "taskset" || !slices.Equal(args, []string{"-c", c.cpu, "magnet", "workload"}) {
			t.Errorf("%s: %s %v, want taskset -c %s magnet workload", c.h.NS, name, args, c.cpu)
		}
	}
}
