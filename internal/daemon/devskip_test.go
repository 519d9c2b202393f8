// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// TestStatusKernelSkipped: the daemon's /v1/status and /metrics carry the
// comparison of the device programs' runs with the recorded interfaces'
// counters, per interface and program, for the veth of the namespace it
// records (and only that namespace's).
func TestStatusKernelSkipped(t *testing.T) {
	lab := needKernel(t)
	cg := newTestCgroup(t)
	td := startReal(t, func(c *Config) {
		c.Events.Baseline = "default"
		c.Filter.NetNS = lab.Client.NS
		seeAll(t, c)
	})
	c := td.client(t)
	port := testPorts(13)[12]
	serve(t, cg, lab, lab.Server, port)
	if err := send(cg, lab, lab.Server, port, 50, 20000, 0); err != nil {
		t.Fatal(err)
	}
	var st *magnetclient.Status
	want := map[string]bool{}
	for deadline := time.Now().Add(10 * time.Second); ; {
		st = must[*magnetclient.Status](t)(c.Status(context.Background()))
		clear(want)
		for _, k := range st.Recorder.KernelSkippedByInterface {
			if k.NetNS != lab.Client.NetNSInode {
				t.Fatalf("an interface of a namespace not recorded: %+v", k)
			}
			if int(k.Ifindex) == lab.Client.IfIndex {
				want[k.Program] = true
			}
		}
		if st.Recorder.KernelSkipped != nil && want["dev_xmit"] && want["dev_recv"] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no comparison of the client's veth in the status: %+v", st.Recorder)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var sum uint64
	for _, k := range st.Recorder.KernelSkippedByInterface {
		sum += k.Skipped
	}
	t.Logf("kernel_skipped %d: %+v", *st.Recorder.KernelSkipped, st.Recorder.KernelSkippedByInterface)
	// The counters never go down, the total is the last comparison's:
	// the total is at most their sum.
	if *st.Recorder.KernelSkipped > sum {
		t.Errorf("kernel_skipped %d over counters summing to %d", *st.Recorder.KernelSkipped, sum)
	}
	_, expo := raw(t, td.sock, "GET", "/metrics", "")
	series := fmt.Sprintf(`magnet_recorder_kernel_skipped_runs_total{netns="%d",interface="%s",program="dev_xmit"}`, lab.Client.NetNSInode, lab.Client.Iface)
	if !strings.Contains(expo, series) {
		t.Errorf("no %s in\n%s", series, expo)
	}
}
