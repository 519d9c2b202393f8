// SPDX-License-Identifier: Apache-2.0

package availbw

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// simPath is a single FIFO link of capacity bit/s shared with cross
// traffic, simulated packet by packet: a packet leaves when the link has
// sent everything queued before it. Receive times get timing noise.
type simPath struct {
	capacity  float64 // bit/s
	cross     float64 // mean cross-traffic rate, bit/s
	crossSize int     // bytes
	burst     int     // cross packets per burst (1: constant rate)
	noiseNs   float64 // standard deviation of timestamp noise
	pace      float64 // the sender cannot go faster than this, bit/s
	coalesce  int64   // receiver hands packets up in batches of this period (ns); 0: never
	// perPacketNs is a fixed cost per packet at the narrow point (a
	// host's forwarding step): every packet, probe or cross, takes at
	// least this long there, whatever its size.
	perPacketNs float64
	rng         *rand.Rand
	clock       time.Time
	bytes       int64
}

func (p *simPath) now() time.Time { return p.clock }

func (p *simPath) probe(_ context.Context, spec StreamSpec) (SendReport, []Sample, error) {
	gap := float64(spec.GapNs)
	if min := float64(spec.Size) * 8 * 1e9 / p.pace; gap < min {
		gap = min
	}
	// Cross traffic starts a while before the stream, at a random phase.
	const warm = 20e6 // ns
	dur := gap * float64(spec.Count)
	type pkt struct {
		t     float64
		size  int
		probe int // index, -1 for cross
	}
	var pkts []pkt
	if p.cross > 0 {
		period := float64(p.crossSize*8*p.burst) * 1e9 / p.cross
		for t := -warm + p.rng.Float64()*period; t < dur+warm; t += period {
			for range p.burst {
				pkts = append(pkts, pkt{t, p.crossSize, -1})
			}
		}
	}
	for i := range spec.Count {
		pkts = append(pkts, pkt{float64(i) * gap, spec.Size, i})
	}
	slices.SortStableFunc(pkts, func(a, b pkt) int {
		switch {
		case a.t < b.t:
			return -1
		case a.t > b.t:
			return 1
		}
		return 0
	})
	var free float64 = -warm
	samples := make([]Sample, 0, spec.Count)
	base := int64(1e12)
	for _, k := range pkts {
		start := math.Max(free, k.t)
		free = start + math.Max(float64(k.size)*8*1e9/p.capacity, p.perPacketNs)
		if k.probe >= 0 {
			recv := free + p.rng.NormFloat64()*p.noiseNs
			if p.coalesce > 0 {
				recv = math.Ceil(recv/float64(p.coalesce)) * float64(p.coalesce)
			}
			samples = append(samples, Sample{Seq: uint32(k.probe), Sent: base + int64(k.t), Recv: base + 5e6 + int64(recv)})
		}
	}
	rep := SendReport{ID: spec.ID, Sent: spec.Count, First: base, Last: base + int64(gap*float64(spec.Count-1))}
	p.clock = p.clock.Add(time.Duration(dur) + 3*time.Millisecond)
	p.bytes += spec.Bytes()
	return rep, samples, nil
}

func (p *simPath) available(size int) float64 { return p.capacity - p.cross }

func TestSearchSimulatedGrid(t *testing.T) {
	const capacity = 100e6
	var errs []float64
	for _, burst := range []int{1, 8} {
		for _, share := range []float64{0.1, 0.3, 0.6, 0.9} {
			for seed := range 3 {
				p := &simPath{capacity: capacity, cross: capacity * (1 - share), crossSize: 1000, burst: burst,
					noiseNs: 10e3, pace: 2e9, rng: rand.New(rand.NewPCG(uint64(seed), uint64(burst))), clock: time.Unix(0, 0)}
				est, err := searchPath(context.Background(), p, Params{}, Limits{Pace: 2e9}, p.now, nil)
				if err != nil {
					t.Fatal(err)
				}
				a := p.available(0)
				e := (est.Point - a) / a
				errs = append(errs, math.Abs(e))
				t.Logf("burst %d A %.0f%%: %s [%s, %s] grey [%s, %s] e=%+.3f fleets %d streams %d bytes %d took %v (%s)",
					burst, share*100, FormatRate(est.Point), FormatRate(est.Low), FormatRate(float64(est.High)),
					FormatRate(est.GreyLow), FormatRate(est.GreyHigh), e, len(est.Fleets), est.Streams, est.Bytes,
					p.clock.Sub(time.Unix(0, 0)), est.Stopped)
				if est.HostLimited || est.PacketRateBound {
					t.Errorf("burst %d A %.0f%%: host-limited (%v) on a 100 Mbit/s path", burst, share*100, est.HostLimits)
				}
				if r := est.HalfCapacity / est.Capacity; r < 0.9 {
					t.Errorf("burst %d A %.0f%%: half-size packets passed the link at %.2f of the full-size rate, want about 1", burst, share*100, r)
				}
			}
		}
	}
	slices.Sort(errs)
	med, p90 := errs[len(errs)/2], errs[len(errs)*9/10]
	t.Logf("median |e| %.3f, p90 %.3f", med, p90)
	if med > 0.05 || p90 > 0.10 {
		t.Errorf("median |e| %.3f (want ≤ 0.05), p90 %.3f (want ≤ 0.10)", med, p90)
	}
}

func TestSearchHostLimited(t *testing.T) {
	// A 10 Gb/s link with 40 % cross traffic, from a host that paces
	// 1 Gb/s at most: A = 6 Gb/s is beyond reach.
	p := &simPath{capacity: 10e9, cross: 4e9, crossSize: 1500, burst: 1, noiseNs: 500, pace: 1e9,
		rng: rand.New(rand.NewPCG(1, 2)), clock: time.Unix(0, 0)}
	est, err := searchPath(context.Background(), p, Params{}, Limits{Pace: 1e9}, p.now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !est.HostLimited || est.RateLimited || est.High != 0 {
		t.Fatalf("host-limited %v, rate-limited %v, high %v: want host-limited with no upper bound", est.HostLimited, est.RateLimited, est.High)
	}
	if want := PaceShare * 1e9; math.Abs(est.Low-want) > 0.01*want {
		t.Errorf("lower bound %s, want %s (%.0f %% of the pace)", FormatRate(est.Low), FormatRate(want), PaceShare*100)
	}
}

// TestSearchPacketRateBound: the narrow point is a forwarding host that
// takes 25 µs per packet behind a 1 Gb/s link (384 Mb/s of 1200-byte
// packets), with 100 Mb/s of cross traffic through it and a sender that
// paces 2 Gb/s: the trains find a narrow point far below what the host
// sends, which the send-rate rule does not flag, but half-size packets
// pass it at half the bit rate, so the estimate is host-limited.
func TestSearchPacketRateBound(t *testing.T) {
	p := &simPath{capacity: 1e9, perPacketNs: 25e3, cross: 100e6, crossSize: 1500, burst: 1, noiseNs: 1e3, pace: 2e9,
		rng: rand.New(rand.NewPCG(9, 10)), clock: time.Unix(0, 0)}
	est, err := searchPath(context.Background(), p, Params{}, Limits{Pace: 2e9}, p.now, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("capacity %s, half-size %s, sent at %s, limits %v", FormatRate(est.Capacity), FormatRate(est.HalfCapacity),
		FormatRate(est.TrainSendRate), est.HostLimits)
	if !est.PacketRateBound || !est.HostLimited || !slices.Contains(est.HostLimits, HostLimitPacketRate) {
		t.Fatalf("packet-rate bound %v, host-limited %v (%v): want host-limited by the packet rate", est.PacketRateBound, est.HostLimited, est.HostLimits)
	}
	if r := est.HalfCapacity / est.Capacity; r < 0.4 || r > 0.6 {
		t.Errorf("half-size packets passed at %.2f of the full-size rate, want about 0.5", r)
	}
	if slices.Contains(est.HostLimits, HostLimitSendRate) {
		t.Errorf("limits %v: the narrow point is far below the send rate", est.HostLimits)
	}
}

func TestSearchRateLimited(t *testing.T) {
	p := &simPath{capacity: 100e6, cross: 20e6, crossSize: 1000, burst: 1, noiseNs: 5e3, pace: 2e9,
		rng: rand.New(rand.NewPCG(3, 4)), clock: time.Unix(0, 0)}
	est, err := searchPath(context.Background(), p, Params{}, Limits{Pace: 2e9, MaxRate: 50e6}, p.now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !est.RateLimited || est.HostLimited || est.Low < 0.95*50e6 {
		t.Fatalf("rate-limited %v host-limited %v low %s: want rate-limited at 50 Mb/s", est.RateLimited, est.HostLimited, FormatRate(est.Low))
	}
}

func TestSearchCoalescedGivesLowerBound(t *testing.T) {
	// The receiver's timestamps come in 1 ms batches.
	p := &simPath{capacity: 100e6, cross: 50e6, crossSize: 1000, burst: 1, noiseNs: 1e3, pace: 2e9, coalesce: 1e6,
		rng: rand.New(rand.NewPCG(5, 6)), clock: time.Unix(0, 0)}
	est, err := searchPath(context.Background(), p, Params{}, Limits{Pace: 2e9}, p.now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !est.Coalesced || est.High != 0 || est.Point != est.Low {
		t.Fatalf("coalesced %v, high %v, point %v, low %v: want a lower bound only", est.Coalesced, est.High, est.Point, est.Low)
	}
	if est.Low > 1.05*p.available(0) {
		t.Errorf("lower bound %s above the true %s", FormatRate(est.Low), FormatRate(p.available(0)))
	}
}

func TestSearchNeedsALimit(t *testing.T) {
	p := &simPath{capacity: 100e6, pace: 1e9, rng: rand.New(rand.NewPCG(7, 8)), clock: time.Unix(0, 0)}
	if _, err := searchPath(context.Background(), p, Params{}, Limits{}, p.now, nil); !errors.Is(err, ErrNoLimit) {
		t.Fatalf("no limits: %v, want ErrNoLimit", err)
	}
	if _, err := searchPath(context.Background(), p, Params{PacketSize: 20}, Limits{Pace: 1e9}, p.now, nil); err == nil {
		t.Fatal("20-byte packets accepted")
	}
}

func TestBracketState(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		above, below, grey     []float64
		lo, hi, greyLo, greyHi float64
	}{
		{"plain", []float64{60, 55}, []float64{40, 48}, nil, 48, 55, 0, 0},
		{"grey inside", []float64{60}, []float64{40}, []float64{50, 45}, 40, 60, 45, 50},
		{"grey outside is dropped", []float64{60}, []float64{40}, []float64{30, 70}, 40, 60, 0, 0},
		// Above at 50 but below at 52: A moved between them; both grey.
		{"contradiction", []float64{50, 70}, []float64{40, 52}, nil, 40, 70, 50, 52},
		{"nothing above", nil, []float64{40, 80}, nil, 80, 0, 0, 0},
	} {
		var b bracket
		for _, r := range tc.above {
			b.add(r, Above)
		}
		for _, r := range tc.below {
			b.add(r, Below)
		}
		for _, r := range tc.grey {
			b.add(r, Grey)
		}
		lo, hi, gl, gh := b.state()
		if lo != tc.lo || hi != tc.hi || gl != tc.greyLo || gh != tc.greyHi {
			t.Errorf("%s: state %v %v grey %v %v; want %v %v grey %v %v", tc.name, lo, hi, gl, gh, tc.lo, tc.hi, tc.greyLo, tc.greyHi)
		}
	}
}

func TestStudentT(t *testing.T) {
	if got := studentT975(2); got != 4.303 {
		t.Errorf("t(2) = %v", got)
	}
	if got := studentT975(30); math.Abs(got-2.042) > 0.01 {
		t.Errorf("t(30) = %v, want about 2.042", got)
	}
}

func TestPacketsFor(t *testing.T) {
	p := DefaultParams.withDefaults()
	if got := p.packetsFor(10e6); got != p.StreamPackets {
		t.Errorf("at 10 Mb/s: %d packets, want the default %d", got, p.StreamPackets)
	}
	// 8 ms at 960 Mb/s of 1200-byte packets is 800 packets, capped.
	if got := p.packetsFor(960e6); got != maxAutoPackets {
		t.Errorf("at 960 Mb/s: %d packets, want %d", got, maxAutoPackets)
	}
	if got := p.packetsFor(240e6); got != 200 {
		t.Errorf("at 240 Mb/s: %d packets, want 200 (8 ms)", got)
	}
}
