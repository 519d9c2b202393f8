// SPDX-License-Identifier: Apache-2.0

package probe

import (
	"os"
	"slices"
	"testing"

	"github.com/magnet-tracer/magnet/internal/event"
)

// Every hook says what it gives, in `magnet status` too: a hook with no
// event of its own names what it times.
func TestEveryHookServesSomething(t *testing.T) {
	for _, h := range Hooks {
		if h.Serves() == "" {
			t.Errorf("hook %s (%s/%s) says it serves nothing", h.Program, h.Kind, h.Target)
		}
	}
}

// Every program an annotation of bpf/events.h names is a row of Hooks (a
// misspelt one would leave its events served by no hook), and every event a
// hook lists is in the catalogue.
func TestHookEventsNameHooks(t *testing.T) {
	for program, events := range hookEvents {
		if !slices.ContainsFunc(Hooks, func(h Hook) bool { return h.Program == program }) {
			t.Errorf("bpf/events.h names program %q (for %v), which is no row of Hooks", program, events)
		}
		for _, ev := range events {
			if _, ok := event.ByName(ev); !ok {
				t.Errorf("%s: event %q is not in the catalogue", program, ev)
			}
		}
	}
	if !slices.Contains(xmitEvents, "tcp_xmit") {
		t.Errorf("fentry's events %v lack tcp_xmit: Load could not move them between ip_egress, sockops and net_dev_queue", xmitEvents)
	}
	for _, ev := range xmitEvents {
		if !slices.Contains(hookEvents["ip_egress"], ev) || !slices.Contains(hookEvents["tcp_segments"], ev) {
			t.Errorf("%s: fentry writes it, but not both of its fallbacks (ip_egress, tcp_segments)", ev)
		}
	}
}

// On this kernel the verifier accepts every program whose hook exists
// (fentry aside, refused here before the verifier runs): status's
// "available" then means the program loads as recording loads it.
func TestVerifyHooks(t *testing.T) {
	if os.Geteuid() != 0 {
		if _, err := VerifyHooks(CheckHooks()); err == nil {
			t.Error("without root, VerifyHooks says nothing about not loading")
		}
		t.Skip("loading BPF needs root")
	}
	before := CheckHooks()
	after, err := VerifyHooks(before)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Fatalf("%d statuses, want %d", len(after), len(before))
	}
	for i, st := range after {
		if st.Available != before[i].Available {
			t.Errorf("%s: available %v after loading, %v before: %s", st.Program, st.Available, before[i].Available, st.Reason)
		}
	}
}
