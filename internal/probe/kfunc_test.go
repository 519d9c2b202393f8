// SPDX-License-Identifier: Apache-2.0

package probe

import (
	"bytes"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// A kernel older than a kernel function the programs call: every hook whose
// program calls it is reported with the release that has it, instead of the
// verifier's message.
func TestMissingKfunc(t *testing.T) {
	spec, err := loadMagnet()
	if err != nil {
		t.Fatal(err)
	}
	// A kernel's BTF with bpf_cast_to_kern_ctx but no bpf_rdonly_cast, as 6.1's.
	proto := &btf.FuncProto{Return: &btf.Void{}}
	b, err := btf.NewBuilder([]btf.Type{&btf.Func{Name: "bpf_cast_to_kern_ctx", Type: proto, Linkage: btf.GlobalFunc}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := b.Marshal(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	old, err := btf.LoadSpecFromReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range Hooks {
		if h.Program == "sched_entry_tp" || h.Program == "sched_exit_tp" {
			continue // they only keep a per-CPU time: no kfunc
		}
		got := missingKfunc(spec.Programs[h.Program], old)
		if !strings.Contains(got, "bpf_rdonly_cast (Linux 6.2+)") {
			t.Errorf("%s: reason %q, want bpf_rdonly_cast (Linux 6.2+)", h.Program, got)
		}
	}
	if got := missingKfunc(nil, old); got != "" {
		t.Errorf("no program: %q", got)
	}
	kernel, err := btf.LoadKernelSpec()
	if err != nil {
		t.Skipf("no kernel BTF here: %v", err)
	}
	for _, h := range Hooks {
		if got := missingKfunc(spec.Programs[h.Program], kernel); got != "" {
			t.Errorf("%s on this kernel: %q", h.Program, got)
		}
	}
}
