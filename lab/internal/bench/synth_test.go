// SPDX-License-Identifier: Apache-2.0

//go:build !magnet_nosynth

package bench

import (
	"context"
	"os"
	"testing"
	"time"
)

// TestSynthExact runs the synthetic producer briefly under a recording, on
// one thread and on two, and checks the accounting is exact: every test run made one event (a run a
// signal interrupted is made again, and its events before the signal
// count), and every event was recorded or counted lost.
func TestSynthExact(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF)")
	}
	for _, producers := range []int{1, 2} {
		b := &bencher{opts: Options{SweepDuration: 300 * time.Millisecond, SynthProducers: producers}, work: t.TempDir(), port: 47000}
		st, _, err := b.synthStep(context.Background(), nil, 1e6, 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if st.Runs == 0 || st.Produced < st.Runs || st.Produced > st.Runs+st.Retried || st.Recorded+st.Lost != st.Produced || st.Unaccounted != 0 {
			t.Fatalf("%d producers: runs %d (+ at most %d interrupted), produced %d, recorded %d, lost %d, unaccounted %d", producers, st.Runs, st.Retried, st.Produced, st.Recorded, st.Lost, st.Unaccounted)
		}
		if st.NsPerEvent <= 0 || st.ProducerCPU <= 0 {
			t.Fatalf("%d producers: ns/event %v, producer CPU %v %%", producers, st.NsPerEvent, st.ProducerCPU)
		}
	}
}
