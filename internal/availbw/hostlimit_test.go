// SPDX-License-Identifier: Apache-2.0

package availbw

import (
	"math"
	"testing"
)

// Trains recorded by `magnet bench probe` on this project's 2-vCPU VM
// (figures of the stream analysis: send rate, arrival rate first to last,
// and the rate of the median arrival gap).

// tr builds a recorded train.
func tr(send, recv, gap float64) Stream {
	return Stream{SendRate: send, RecvRate: recv, GapRate: gap, Trend: Flat}
}

// TestTrainCapacityRecorded: on a 1 Gbit/s tbf that the host could not
// feed (the sender reached 0.35-0.9 Gb/s), the trains arrived as fast as
// they left, but one train's median gap, spread by the sender's own
// clumps, read as a narrow link at 0.35-0.43 Gb/s, below 0.8 of the send
// rate: five estimates were not flagged and were 30-45 % low. A train
// that did not queue measures no link: the capacity is only "at least",
// which makes the estimate host-limited.
func TestTrainCapacityRecorded(t *testing.T) {
	for _, tc := range []struct {
		name     string
		trains   []Stream
		capacity float64
		atLeast  bool
	}{
		{"1G cbr 60%", []Stream{tr(390.7e6, 448.2e6, 353.8e6), tr(509.2e6, 506.4e6, 1656e6)}, 506.4e6, true},
		{"1G bursty 30%", []Stream{tr(872.3e6, 855.4e6, 2203e6), tr(344.3e6, 342.8e6, 343.3e6)}, 855.4e6, true},
		{"1G cbr 60% again", []Stream{tr(551.1e6, 550.3e6, 1259e6), tr(574.1e6, 564.3e6, 428.3e6)}, 564.3e6, true},
		{"1G bursty 60%", []Stream{tr(368.8e6, 366.3e6, 366.5e6), tr(861.1e6, 870e6, 2468e6)}, 870e6, true},
		// 100 Mbit/s: the trains queue at the tbf, whose spacing the
		// median gap reads; cross traffic lowers one train's figure.
		{"100M cbr 10%", []Stream{tr(468.4e6, 89.54e6, 96.98e6), tr(966.2e6, 91.88e6, 97.59e6)}, 96.98e6, false},
		// A train the sender stalled on (sent at 30 Mb/s) did not queue
		// and says nothing; the other one measures the link.
		{"100M cbr 60%, a stalled train", []Stream{tr(30.09e6, 30.05e6, 98.66e6), tr(1028e6, 98.81e6, 99.4e6)}, 99.4e6, false},
	} {
		capacity, _, atLeast, ok := trainCapacity(tc.trains)
		if !ok || capacity != tc.capacity || atLeast != tc.atLeast {
			t.Errorf("%s: capacity %s at least %v (ok %v), want %s at least %v", tc.name,
				FormatRate(capacity), atLeast, ok, FormatRate(tc.capacity), tc.atLeast)
		}
	}
	if _, _, _, ok := trainCapacity([]Stream{{Trend: Rejected, SendRate: 1e9}}); ok {
		t.Error("capacity from a rejected train")
	}
}

// TestPacketRateBoundRecorded: half-size trains through the 100 Mbit/s
// tbf of the lab (recorded under load average 10-15) pass at the same bit
// rate as full-size ones; through a narrow point that counts packets they
// pass at half of it.
func TestPacketRateBoundRecorded(t *testing.T) {
	link := []struct {
		name       string
		full, half []Stream
	}{
		{"cbr 10%", []Stream{tr(468.4e6, 89.54e6, 96.98e6), tr(966.2e6, 91.88e6, 97.59e6)},
			[]Stream{tr(583.1e6, 85.99e6, 98.03e6), tr(486.9e6, 85.26e6, 96.98e6)}},
		{"bursty 30%", []Stream{tr(894.6e6, 91.82e6, 98.07e6), tr(1496e6, 93.97e6, 98.23e6)},
			[]Stream{tr(614.7e6, 75.34e6, 97.31e6), tr(656.9e6, 97.83e6, 95.94e6)}},
		{"bursty 90%", []Stream{tr(1926e6, 101.1e6, 98.36e6), tr(1351e6, 101.2e6, 99.69e6)},
			[]Stream{tr(685.7e6, 104.8e6, 97.39e6), tr(328.9e6, 100.4e6, 99.08e6)}},
	}
	for _, tc := range link {
		if half, bound := packetRateBound(tc.full, tc.half); bound || half < 0.9*tc.full[0].GapRate {
			t.Errorf("100 Mbit/s link, %s: half-size capacity %s, bound %v: want about the link's rate, not bound", tc.name, FormatRate(half), bound)
		}
	}
	// A tbf whose minimum packet unit is a full frame (TestPacketRate-
	// BottleneckIsHostLimited measured 98.8 Mb/s of full-size packets and
	// 49.7 of half-size ones; the other figures are typical of that run).
	full := []Stream{tr(1.83e9, 97e6, 98.8e6), tr(1.8e9, 96e6, 98.5e6)}
	half := []Stream{tr(1.2e9, 48e6, 49.7e6), tr(1.1e9, 47e6, 49.5e6)}
	if h, bound := packetRateBound(full, half); !bound || math.Abs(h-49.7e6) > 1 {
		t.Errorf("per-packet narrow point: half-size capacity %s, bound %v: want 49.7 Mb/s, bound", FormatRate(h), bound)
	}
	// Half-size trains the sender could not send faster than the narrow
	// point did not queue: they tell nothing, whatever their spacing.
	slow := []Stream{tr(45e6, 45e6, 40e6), tr(44e6, 44e6, 39e6)}
	if _, bound := packetRateBound(full, slow); bound {
		t.Error("bound from half-size trains that never queued")
	}
}
