// SPDX-License-Identifier: Apache-2.0

package probe

import (
	"os"
	"testing"

	"github.com/magnet-tracer/magnet/internal/event"
)

// TestLoadAll loads every program on this kernel. On a kernel that has the
// hooks (6.8+, as on CI) every one must load and attach: a skip must never
// hide a verifier regression.
func TestLoadAll(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loading BPF needs root")
	}
	p, err := Load(Options{Groups: event.AllGroups(), BufferBytes: 1 << 20, ControlBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, st := range p.Status {
		if st.Available && !st.Attached {
			t.Errorf("%s (%s %s): available but not attached: %s", st.Program, st.Kind, st.Target, st.Reason)
		}
		if !st.Available {
			t.Errorf("%s: unavailable on this kernel: %s", st.Program, st.Reason)
		}
	}
}
