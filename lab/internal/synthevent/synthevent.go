// SPDX-License-Identifier: Apache-2.0

// Package synthevent loads the synthetic events (bpf/synthevent.bpf.c)
// beside a recording's programs: tc programs that are never attached and,
// run with BPF_PROG_TEST_RUN, put dev_xmit events (conn 0, ifindex 0) in
// that recording's rings through the path every hook takes. magnet-lab
// bench uses them to measure the recording path alone, at a rate it
// chooses, with no network stack around it. The product never loads them:
// they are in an object of their own, loaded on the probe's maps and
// settings (probe.Probe.LoadSharing).
package synthevent

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"

	"github.com/magnet-tracer/magnet/internal/probe"
)

//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel synthevent ../../../bpf/synthevent.bpf.c -- -I../../../bpf -I../../../bpf/include

// BurstEvents is how many events one run of Programs.Burst makes
// (SYNTH_BURST in bpf/synthevent.bpf.c).
const BurstEvents = 16

// Programs are the synthetic events' programs, loaded beside a probe.
// Close unloads them; the caller must call it.
type Programs struct {
	// Event puts one event in the events area of the CPU it runs on at
	// each test run; Empty does nothing (the test run's own cost).
	Event, Empty *ebpf.Program
	// Burst puts BurstEvents events per test run (bpf_loop; nil where the
	// kernel lacks it): the run's own cost is then shared by many events.
	Burst *ebpf.Program
	// Nested makes, in one run, an event, a second one while the first is
	// held (the nested area's) and a third while both are (lost): what
	// interrupts do.
	Nested *ebpf.Program
	coll   *ebpf.Collection
}

// Load loads the programs so that their events go into p's rings and
// counters with p's settings.
func Load(p *probe.Probe) (*Programs, error) {
	spec, err := loadSynthevent()
	if err != nil {
		return nil, fmt.Errorf("parse synthetic events object: %w", err)
	}
	if features.HaveProgramHelper(ebpf.SchedCLS, asm.FnLoop) != nil {
		delete(spec.Programs, "synth_burst")
	}
	coll, err := p.LoadSharing(spec)
	if err != nil {
		return nil, fmt.Errorf("synthetic events: %w", err)
	}
	return &Programs{
		Event:  coll.Programs["synth_event"],
		Empty:  coll.Programs["synth_empty"],
		Burst:  coll.Programs["synth_burst"],
		Nested: coll.Programs["synth_nested"],
		coll:   coll,
	}, nil
}

// Close unloads the programs.
func (s *Programs) Close() { s.coll.Close() }
