// SPDX-License-Identifier: Apache-2.0

package probe

import (
	"os"
	"testing"
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
