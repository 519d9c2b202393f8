// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/kevent"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// TestKernelEventsStream: a kernel event chosen at start (here napi_poll,
// as the recorder's dictionary describes it) streams with its fields
// decoded from the dictionary, by name or with no type filter; its losses
// (kevent_lost) come in band as the recorder's.
func TestKernelEventsStream(t *testing.T) {
	fakeHeader = func(h *trace.Header) {
		h.Types = append(h.Types,
			trace.EventType{ID: kevent.LostID, Name: kevent.LostName, Group: "kevent", Size: 312, Fields: []trace.Field{
				{Name: "first_ns", Offset: 32, Size: 8, Kind: "u"}, {Name: "last_ns", Offset: 40, Size: 8, Kind: "u"},
				{Name: "total", Offset: 48, Size: 4, Kind: "u"}, {Name: "n_napi_poll", Offset: 56, Size: 4, Kind: "u"}}},
			trace.EventType{ID: kevent.FirstID, Name: "napi_poll", Group: "napi", Size: 120, Fields: []trace.Field{
				{Name: "dev_name", Offset: 56, Size: 64, Kind: "str", CType: "__data_loc char[]"},
				{Name: "work", Offset: 44, Size: 4, Kind: "i", CType: "int"},
				{Name: "budget", Offset: 48, Size: 4, Kind: "i", CType: "int"}}})
	}
	defer func() { fakeHeader = nil }()
	// Kernel events carry no connection: only root and the see-all groups
	// see them; this test's user is made one.
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	g, err := user.LookupGroupId(u.Gid)
	if err != nil {
		t.Fatal(err)
	}
	td := startFake(t, func(c *Config) { c.Access.SeeAllGroups = []string{g.Name} })
	c := td.client(t)
	ctx := context.Background()
	byName := collect(must[*magnetclient.Stream](t)(c.Subscribe(ctx, magnetclient.Filter{Types: []string{"napi_poll"}}, 0)))
	all := collect(must[*magnetclient.Stream](t)(c.Subscribe(ctx, magnetclient.Filter{}, 0)))
	f := td.fake
	f.send(
		f.rec(t, "napi_poll", 1*ms, 0, 14, 0, map[string]any{"dev_name": "veth1", "work": 7, "budget": 64}),
		f.rec(t, kevent.LostName, 2*ms, 0, 0, 3, map[string]any{"total": 3, "n_napi_poll": 3, "first_ns": int(2 * ms), "last_ns": int(2 * ms)}),
	)
	for _, col := range []*collector{byName, all} {
		evs, _ := col.events(t, 1)
		e := evs[0]
		// Numbers as the client decodes them, whatever their Go type.
		if e.Type != "napi_poll" || e.Fields["dev_name"] != "veth1" || fmt.Sprint(e.Fields["work"]) != "7" || fmt.Sprint(e.Fields["budget"]) != "64" {
			t.Errorf("event %+v", e)
		}
		m := <-col.msgs
		if m.Lost == nil || m.Lost.Count != 3 || m.Lost.ByType["napi_poll"] != 3 {
			t.Errorf("after the event: %+v, want the kernel events' loss", m)
		}
	}
	if _, err := c.Subscribe(ctx, magnetclient.Filter{Types: []string{"napi_pol"}}, 0); err == nil {
		t.Error("subscription to an unknown kernel event accepted")
	}
}

// TestKernelEventsStreamReal: the real recorder, with kernel_events
// tracepoints: [task:task_rename] and the daemon's cgroup filter. A
// process started in the test's cgroup executes sh, which executes true:
// two renames (the test's name to sh, sh to true), their fields (char[16]
// arrays, a short, an int) decoded from the dictionary. The same command
// run outside the cgroup meanwhile brings nothing: the next events are
// the renames of a second command in the cgroup.
func TestKernelEventsStreamReal(t *testing.T) {
	needKernel(t)
	cg := newTestCgroup(t)
	td := startReal(t, func(c *Config) {
		c.Filter.Cgroup = cg.path
		c.KernelEvents.Tracepoints = []string{"task:task_rename"}
	})
	c := td.client(t)
	col := collect(must[*magnetclient.Stream](t)(c.Subscribe(context.Background(), magnetclient.Filter{Types: []string{"task_rename"}}, 0)))
	self := func() string {
		b, err := os.ReadFile("/proc/self/comm")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}()
	for round := 0; round < 2; round++ {
		if err := exec.Command("sh", "-c", "exec true").Run(); err != nil {
			t.Fatal(err)
		}
		cmd := cg.in(exec.Command("sh", "-c", "exec true"))
		if err := cmd.Run(); err != nil {
			t.Fatal(err)
		}
		pid := strconv.Itoa(cmd.Process.Pid)
		evs, _ := col.events(t, 2)
		want := []string{self + ">sh", "sh>true"}
		for i, e := range evs {
			if e.Type != "task_rename" || fmt.Sprint(e.Fields["pid"]) != pid || fmt.Sprint(e.Fields["oom_score_adj"]) != "0" ||
				fmt.Sprint(e.Fields["oldcomm"], ">", e.Fields["newcomm"]) != want[i] {
				t.Errorf("round %d, event %d: %+v, want task_rename %s of pid %s", round, i, e, want[i], pid)
			}
		}
	}
}
