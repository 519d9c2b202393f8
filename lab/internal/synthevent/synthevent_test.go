// SPDX-License-Identifier: Apache-2.0

package synthevent

import (
	"os"
	"testing"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/probe"
)

// TestEventsCountInTheProbe: the programs, loaded from their own object,
// write into the probe's rings and counters: every run of Event and each
// of Burst's BurstEvents is a dev_xmit the probe counts as produced, and
// none is lost in a ring that has room for them all.
func TestEventsCountInTheProbe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loading BPF needs root")
	}
	p, err := probe.Load(probe.Options{Groups: event.GroupConn, BufferBytes: 4 << 20, ControlBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Event == nil || s.Empty == nil || s.Nested == nil {
		t.Fatalf("programs missing: %+v", s)
	}
	pkt := make([]byte, 64)
	const runs = 100
	if _, _, err := s.Event.Benchmark(pkt, runs, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Empty.Benchmark(pkt, runs, nil); err != nil {
		t.Fatal(err)
	}
	want := uint64(runs)
	if s.Burst != nil {
		if _, _, err := s.Burst.Benchmark(pkt, 2, nil); err != nil {
			t.Fatal(err)
		}
		want += 2 * BurstEvents
	}
	produced, lost, err := p.CountersOf()
	if err != nil {
		t.Fatal(err)
	}
	if produced[event.DevXmit] != want || lost[event.DevXmit] != 0 {
		t.Fatalf("probe counts %d dev_xmit produced, %d lost; want %d, 0", produced[event.DevXmit], lost[event.DevXmit], want)
	}
}
