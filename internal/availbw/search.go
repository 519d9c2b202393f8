// SPDX-License-Identifier: Apache-2.0

package availbw

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Params shape an estimate. The zero value of a field means its default
// (see DefaultParams).
type Params struct {
	// PacketSize is the IP size of every probe packet.
	PacketSize int `json:"packet_bytes"`
	// StreamPackets is the length of each periodic stream, unless that
	// would last less than MinStreamDuration: fast streams are longer, so
	// that the delay they build stands out of the timing noise.
	StreamPackets     int           `json:"stream_packets"`
	MinStreamDuration time.Duration `json:"min_stream_duration_ns"`
	// TrainPackets and Trains: the back-to-back trains sent first, whose
	// dispersion estimates the path's capacity.
	TrainPackets int `json:"train_packets"`
	Trains       int `json:"trains"`
	// FleetMin is how many streams must agree before a fleet decides;
	// FleetMax how many counted streams make it grey when they do not.
	FleetMin int `json:"fleet_min"`
	FleetMax int `json:"fleet_max"`
	// Agree is the share of a fleet's counted streams that must agree.
	Agree float64 `json:"agree"`
	// Resolution is the relative width of the range at which the search
	// stops.
	Resolution float64 `json:"resolution"`
	// MaxFleets, MaxBytes and MaxDuration bound one estimate. MaxBytes 0
	// means the larger of 2 MB and 20 streams at the path's capacity.
	MaxFleets   int           `json:"max_fleets"`
	MaxBytes    int64         `json:"max_bytes"`
	MaxDuration time.Duration `json:"max_duration_ns"`
}

// DefaultParams are the parameters used for every zero field.
var DefaultParams = Params{
	PacketSize:        1200,
	StreamPackets:     50,
	MinStreamDuration: 8 * time.Millisecond,
	TrainPackets:      50,
	Trains:            2,
	FleetMin:          3,
	FleetMax:          6,
	Agree:             0.7,
	Resolution:        0.04,
	MaxFleets:         12,
	MaxDuration:       5 * time.Second,
}

// withDefaults fills the zero fields of p from DefaultParams.
func (p Params) withDefaults() Params {
	d := DefaultParams
	set := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	set(&p.PacketSize, d.PacketSize)
	set(&p.StreamPackets, d.StreamPackets)
	set(&p.TrainPackets, d.TrainPackets)
	set(&p.Trains, d.Trains)
	set(&p.FleetMin, d.FleetMin)
	set(&p.FleetMax, d.FleetMax)
	set(&p.MaxFleets, d.MaxFleets)
	if p.Agree == 0 {
		p.Agree = d.Agree
	}
	if p.Resolution == 0 {
		p.Resolution = d.Resolution
	}
	if p.MaxDuration == 0 {
		p.MaxDuration = d.MaxDuration
	}
	if p.MinStreamDuration == 0 {
		p.MinStreamDuration = d.MinStreamDuration
	}
	return p
}

// packetsFor returns the length of a stream at rate.
func (p Params) packetsFor(rate float64) int {
	n := int(math.Ceil(p.MinStreamDuration.Seconds() * rate / (8 * float64(p.PacketSize))))
	return min(max(n, p.StreamPackets), maxAutoPackets)
}

// maxAutoPackets caps the length packetsFor gives fast streams, so that
// a stream at gigabits stays under a megabyte.
const maxAutoPackets = 500

// check reports parameters that cannot work.
func (p Params) check() error {
	switch {
	case p.PacketSize < MinPacketSize || p.PacketSize > MaxPacketSize:
		return fmt.Errorf("packet size %d outside %d..%d bytes", p.PacketSize, MinPacketSize, MaxPacketSize)
	case p.StreamPackets < 10 || p.StreamPackets > MaxStreamPackets:
		return fmt.Errorf("stream of %d packets outside 10..%d", p.StreamPackets, MaxStreamPackets)
	case p.TrainPackets < 10 || p.TrainPackets > MaxStreamPackets:
		return fmt.Errorf("train of %d packets outside 10..%d", p.TrainPackets, MaxStreamPackets)
	case p.FleetMin < 1 || p.FleetMax < p.FleetMin:
		return fmt.Errorf("fleet of %d to %d streams", p.FleetMin, p.FleetMax)
	case p.Agree <= 0.5 || p.Agree > 1:
		return fmt.Errorf("agreement %.2f outside (0.5, 1]", p.Agree)
	case p.Resolution <= 0 || p.Resolution >= 1:
		return fmt.Errorf("resolution %.3f outside (0, 1)", p.Resolution)
	}
	return nil
}

// Verdict is a fleet's decision.
type Verdict string

const (
	// Above: the fleet's rate exceeds the available bandwidth.
	Above Verdict = "above"
	// Below: the fleet's rate is within the available bandwidth.
	Below Verdict = "below"
	// Grey: the streams disagree; the rate is in the grey region, where
	// the available bandwidth varied while the fleet was sent.
	Grey Verdict = "grey"
	// Unusable: too many streams were rejected (the sender could not
	// pace them) to decide.
	Unusable Verdict = "unusable"
)

// Fleet is a group of streams at one rate and its vote.
type Fleet struct {
	Rate    float64  `json:"rate_bps"`
	Verdict Verdict  `json:"verdict"`
	Streams []Stream `json:"streams"`
	// Fluid is the available bandwidth the fluid model infers from the
	// fleet's increasing streams (0 when it has none): a stream sent at R
	// above A gains delay at (R-A)/C seconds per second.
	Fluid float64 `json:"fluid_bps,omitempty"`
}

// Estimate is the result of a search. Rates are IP bits per second.
type Estimate struct {
	// Low and High bound the available bandwidth: the highest rate a
	// fleet found below it and the lowest found above it. High is 0 when
	// no fleet was above (a lower bound only), null in JSON.
	Low  float64 `json:"low_bps"`
	High Bound   `json:"high_bps"`
	// Point is the single figure: the fluid model's estimate from streams
	// 5 to 60 % above A, kept within the range, else the middle of the
	// range, or Low when only a lower bound is known.
	Point float64 `json:"point_bps"`
	// GreyLow and GreyHigh span the rates whose fleets were grey; both 0
	// when none was.
	GreyLow  float64 `json:"grey_low_bps,omitempty"`
	GreyHigh float64 `json:"grey_high_bps,omitempty"`
	// Capacity is the packet size over the median arrival gap of the
	// back-to-back trains: the capacity of the path's narrow link.
	Capacity float64 `json:"capacity_bps"`
	// CapacityAtLeast: the trains arrived as fast as they were sent, so
	// the capacity is at least Capacity, not measured.
	CapacityAtLeast bool `json:"capacity_at_least"`
	// TrainSendRate is the rate the sender reached sending the trains as
	// fast as it could: what it can pace on this path.
	TrainSendRate float64 `json:"train_send_bps"`
	// ProbeLimit is the highest rate the search was allowed to probe.
	ProbeLimit float64 `json:"probe_limit_bps"`
	// HostLimited: the host, not the network, is the bottleneck of this
	// measurement. Either every fleet up to ProbeLimit, which is set by
	// what the sending host can pace, was below A (then High is 0 and
	// Low a lower bound), or the trains found no narrow link or one at
	// least PaceShare of what the host could send them at, so that what
	// the fleets found may be the hosts' own limits, or the narrow point
	// counts packets rather than bytes (PacketRateBound), or (set by the
	// client) this host's socket dropped probe packets.
	HostLimited bool `json:"host_limited"`
	// HostLimits say why HostLimited is set, one HostLimit* word each.
	HostLimits []string `json:"host_limits,omitempty"`
	// HalfTrains are back-to-back trains of half-size packets sent
	// between the capacity trains, and HalfCapacity the highest rate any
	// of them reached the receiver at through a narrow point (their
	// median arrival spacing; 0 when none queued anywhere). A link
	// serializes bytes, so it passes them at its capacity; a per-packet
	// cost (a host's forwarding or receiving) passes them at about half
	// of it. PacketRateBound says the latter (see packetRateBound).
	HalfTrains      []Stream `json:"half_trains,omitempty"`
	HalfCapacity    float64  `json:"half_capacity_bps,omitempty"`
	PacketRateBound bool     `json:"packet_rate_bound,omitempty"`
	// RateLimited: the available bandwidth is at least ProbeLimit, which
	// is set by --max-rate or the server's limit.
	RateLimited bool `json:"rate_limited"`
	// Coalesced: the receiver's timestamps were batched, so delays could
	// not be timed; Low is only a lower bound and High is 0.
	Coalesced bool `json:"coalesced"`
	// Fluid is the fluid model's estimate (see search.fluid); FluidSweet
	// says it comes from streams in the model's sweet spot, and then it
	// is the Point.
	Fluid      float64 `json:"fluid_bps"`
	FluidSweet bool    `json:"fluid_sweet"`
	// Converged: the range reached the resolution; false when a budget
	// ran out first.
	Converged bool `json:"converged"`
	// Stopped says why the search ended.
	Stopped string `json:"stopped"`
	// serverEnded: the server's session time limit ended the search (and
	// the session: the server answers no goodbye).
	serverEnded bool
	// Streams, Rejected and Bytes count the probe streams (trains
	// included), those rejected, and the IP bytes they put on the wire.
	Streams  int     `json:"streams"`
	Rejected int     `json:"rejected"`
	Bytes    int64   `json:"probe_bytes"`
	Fleets   []Fleet `json:"fleets"`
	// Trains are the capacity trains, as analysed.
	Trains []Stream `json:"trains"`
}

// prober sends one stream and reports what the sender did and what
// arrived.
type prober interface {
	probe(ctx context.Context, spec StreamSpec) (SendReport, []Sample, error)
}

// Limits are the rates a search must stay under, in IP bits per second;
// 0 means no limit of that kind.
type Limits struct {
	// Pace is the highest rate the sending host can pace (from its
	// measured send cost).
	Pace float64
	// MaxRate is the lowest of the client's and the server's --max-rate.
	MaxRate float64
}

// minByteBudget is the least default byte budget of an estimate.
const minByteBudget = 2e6

// PaceShare is the share of the sending host's pacing limit the search
// may probe at: above it, gaps come out of the sender's own queueing.
const PaceShare = 0.8

// ErrNoLimit is returned when neither a pacing limit nor a maximum rate is
// known: the search needs an upper bound.
var ErrNoLimit = errors.New("no upper bound on the probing rate (neither the sender's pacing limit nor a maximum rate is known)")

// search runs one estimate.
type search struct {
	p     Params
	pr    prober
	log   func(format string, args ...any) // nil: quiet
	now   func() time.Time
	start time.Time
	est   *Estimate
	next  uint32 // next stream id
}

// Search estimates the available bandwidth of the path pr probes.
func searchPath(ctx context.Context, pr prober, p Params, lim Limits, now func() time.Time, log func(string, ...any)) (*Estimate, error) {
	p = p.withDefaults()
	if err := p.check(); err != nil {
		return nil, err
	}
	s := &search{p: p, pr: pr, now: now, start: now(), est: &Estimate{}, log: log}
	if err := s.run(ctx, lim); err != nil {
		return s.est, err
	}
	return s.est, nil
}

func (s *search) run(ctx context.Context, lim Limits) error {
	e := s.est
	trainRate := math.Inf(1)
	if lim.Pace > 0 {
		trainRate = lim.Pace
	}
	if lim.MaxRate > 0 {
		trainRate = min(trainRate, lim.MaxRate)
	}
	if math.IsInf(trainRate, 1) {
		return ErrNoLimit
	}

	// Back-to-back trains: their dispersion bounds the capacity, and the
	// rate the sender reached is what it can pace on this path. Between
	// them go trains of half-size packets, which tell a link from a
	// per-packet cost (see packetRateBound).
	half := s.p.PacketSize / 2
	if half < MinPacketSize {
		half = 0
	}
	for range s.p.Trains {
		st, err := s.stream(ctx, trainRate, s.p.PacketSize, s.p.TrainPackets, true)
		if err != nil {
			return err
		}
		e.Trains = append(e.Trains, st)
		if half > 0 {
			hs, err := s.stream(ctx, trainRate, half, s.p.TrainPackets, true)
			if err != nil {
				return err
			}
			e.HalfTrains = append(e.HalfTrains, hs)
		}
	}
	var ok bool
	e.Capacity, e.TrainSendRate, e.CapacityAtLeast, ok = trainCapacity(e.Trains)
	if !ok {
		return errors.New("no back-to-back train arrived: is UDP from the server to this host blocked?")
	}
	if s.p.MaxBytes == 0 {
		perStream := int64(s.p.packetsFor(min(e.Capacity, trainRate))) * int64(s.p.PacketSize)
		s.p.MaxBytes = max(minByteBudget, 20*perStream)
	}
	if !e.CapacityAtLeast {
		e.HalfCapacity, e.PacketRateBound = packetRateBound(e.Trains, e.HalfTrains)
	}

	// The probing limit: a share of what the host can pace, and never
	// above a maximum rate. A train that fell short of its rate shows
	// what the host can really pace on this path; one that kept it only
	// that the host can pace that much.
	pace := lim.Pace
	if e.TrainSendRate < (1-MaxRateError)*trainRate && (pace == 0 || e.TrainSendRate < pace) {
		pace = e.TrainSendRate
	}
	limit := math.Inf(1)
	if pace > 0 {
		limit = PaceShare * pace
	}
	hostBound := true
	if lim.MaxRate > 0 && lim.MaxRate <= limit {
		limit, hostBound = lim.MaxRate, false
	}
	e.ProbeLimit = limit
	// The capacity bounds the search only when the trains measured it:
	// one known only to be at least the trains' rate bounds nothing
	// (trains asked for at a maximum rate arrive a hair below it).
	upper := limit
	if !e.CapacityAtLeast {
		upper = min(e.Capacity, limit)
	}

	var (
		b         bracket
		coalesced int
		unusable  bool // a fleet the sender could not pace
	)
	rate := upper
	if e.Capacity < limit {
		rate = 0.95 * e.Capacity // A ≤ C: start just below capacity
	}
	res := s.p.Resolution
	for {
		if why := s.exhausted(s.p.FleetMin, rate); why != "" {
			e.Stopped = why
			break
		}
		f, err := s.fleet(ctx, rate)
		if errors.Is(err, errSessionLimit) {
			e.Stopped, e.serverEnded = err.Error(), true
			break
		}
		if err != nil {
			return err
		}
		e.Fleets = append(e.Fleets, f)
		for _, st := range f.Streams {
			if st.Coalesced {
				coalesced++
			}
		}
		if f.Verdict == Unusable {
			// The sender cannot pace this rate: it is beyond the host.
			unusable = true
			limit = min(limit, 0.9*rate)
			upper = min(upper, limit)
			hostBound = true
			e.ProbeLimit = limit
		} else {
			b.add(rate, f.Verdict)
		}
		lo, hi, gLo, gHi := b.state()
		if hi == 0 && gHi == 0 {
			// Nothing above yet: climb toward the upper bound.
			if lo >= upper*(1-res) || upper <= lo {
				e.Converged = true
				e.Stopped = "no fleet was above the probing limit"
				break
			}
			rate = (lo + upper) / 2
			if lo == 0 {
				rate = upper / 2
			}
			continue
		}
		top := hi
		if top == 0 {
			top = upper
		}
		fl, sweet := s.fluid()
		if fl <= lo || fl >= top {
			fl, sweet = (lo+top)/2, false
			if lo == 0 {
				fl = top / 2
			}
		}
		if !sweet && top > fl*sweetHigh {
			// Jump to where the fluid model is most accurate: far
			// enough above A that the queue never empties during a
			// stream, near enough that an error in the capacity
			// matters little.
			rate = clampInside(fl*sweetProbe, lo, top)
			continue
		}
		if gHi > 0 {
			// A grey region: close in on it from both sides.
			lowGap, highGap := (gLo-lo)/gLo, (top-gHi)/gHi
			if lowGap <= res && highGap <= res {
				e.Converged = true
				e.Stopped = "grey region bounded on both sides"
				break
			}
			if lowGap >= highGap {
				rate = clampInside(gLo*(1-res), lo, gLo)
			} else {
				rate = clampInside(gHi*(1+res), gHi, top)
			}
			continue
		}
		if lo > 0 && (top-lo) <= res*(top+lo)/2*2.5 && lo >= fl*(1-2*res) && top <= fl*(1+2*res) {
			e.Converged = true
			e.Stopped = "range around the estimate within the resolution"
			break
		}
		// Aim just below the estimate for a lower bound first, then
		// just above it for an upper one.
		if lo < fl*(1-2*res) {
			rate = fl * (1 - res)
		} else {
			rate = fl * (1 + res)
		}
		rate = clampInside(rate, lo, top)
	}

	lo, hi, gLo, gHi := b.state()
	e.Low, e.High, e.GreyLow, e.GreyHigh = lo, Bound(hi), gLo, gHi
	fl, sweet := s.fluid()
	e.Fluid, e.FluidSweet = fl, sweet
	var probed float64 // the highest rate a fleet was sent at
	for _, f := range e.Fleets {
		probed = max(probed, f.Rate)
	}
	switch {
	case hi == 0 && (probed >= (1-res)*limit || unusable) && (upper >= limit || unusable):
		// Nothing was above A up to the probing limit (or up to where
		// the sender gave out): A is at least the highest rate below.
		e.HostLimited = hostBound
		e.RateLimited = !hostBound
		e.Point = lo
		e.High, e.GreyLow, e.GreyHigh = 0, 0, 0
	case hi == 0 && gHi == 0 && lo > 0:
		// Below every rate tried up to the capacity: A is about C.
		e.High = Bound(e.Capacity)
		e.Point = (lo + e.Capacity) / 2
	case sweet && hi > lo:
		// The fleets' votes bound the fluid model: where they
		// disagree, the votes of whole fleets win.
		e.Point = min(max(fl, lo), hi)
	case sweet:
		e.Point = fl
	case hi > 0:
		e.Point = (lo + hi) / 2
	case gHi > 0:
		e.Point = (gLo + gHi) / 2
	default:
		e.Point = lo
	}
	if e.HostLimited {
		e.HostLimits = append(e.HostLimits, HostLimitPace)
	}
	if hostBound && !e.HostLimited && e.Capacity >= PaceShare*e.TrainSendRate {
		// The narrow link is about as fast as this host can send: what
		// the fleets found may be the host's limits (its own forwarding,
		// its receiver), not the network's.
		e.HostLimited = true
		e.HostLimits = append(e.HostLimits, HostLimitSendRate)
	}
	if e.PacketRateBound {
		// The narrow point counts packets, not bytes: a host's
		// per-packet cost, whatever the sender could pace.
		e.HostLimited = true
		e.HostLimits = append(e.HostLimits, HostLimitPacketRate)
	}
	if coalesced*2 > e.Streams {
		e.Coalesced = true
		e.High, e.Point = 0, e.Low
	}
	return nil
}

// The fluid model's sweet spot: rates from sweetLow to sweetHigh times A,
// probed at sweetProbe times the current estimate.
const (
	sweetLow   = 1.05
	sweetHigh  = 1.6
	sweetProbe = 1.3
)

// fluid returns the fluid model's estimate of A from the streams of every
// fleet above A: each gives R − C·slope. It starts from the lowest such
// fleet and then takes the median over the streams whose rate lies in the
// sweet spot of the estimate, refining it a few times; sweet reports
// whether at least FleetMin streams did. Closer to A the queue a stream
// builds empties now and then, which hides part of the cross traffic;
// further away an error in the capacity weighs more.
func (s *search) fluid() (est float64, sweet bool) {
	lowest := math.Inf(1)
	for _, f := range s.est.Fleets {
		if f.Verdict == Above && f.Fluid > 0 && f.Rate < lowest {
			lowest, est = f.Rate, f.Fluid
		}
	}
	if est == 0 {
		return 0, false
	}
	for range 4 {
		var as []float64
		for _, f := range s.est.Fleets {
			if f.Verdict != Above {
				continue
			}
			for _, st := range f.Streams {
				if st.Trend == Rejected || st.SendRate < sweetLow*est || st.SendRate > sweetHigh*est {
					continue
				}
				as = append(as, st.SendRate-s.est.Capacity*st.Slope)
			}
		}
		if len(as) < s.p.FleetMin {
			return est, sweet
		}
		est, sweet = median(as), true
	}
	return est, sweet
}

// bracket keeps the rates of decided fleets and derives a consistent
// range from them.
type bracket struct {
	above, below, grey []float64
}

func (b *bracket) add(rate float64, v Verdict) {
	switch v {
	case Above:
		b.above = append(b.above, rate)
	case Below:
		b.below = append(b.below, rate)
	case Grey:
		b.grey = append(b.grey, rate)
	}
}

// state returns the highest rate below A (lo), the lowest above it (hi, 0
// if none) and the grey region inside (lo, hi) (0, 0 if none). A fleet
// above at a rate no higher than one below contradicts it: the
// available bandwidth moved between them, so both count as grey.
func (b *bracket) state() (lo, hi, gLo, gHi float64) {
	above := slices.Clone(b.above)
	below := slices.Clone(b.below)
	grey := slices.Clone(b.grey)
	for {
		lo, hi = 0, 0
		li, hi_ := -1, -1
		for i, r := range below {
			if r > lo {
				lo, li = r, i
			}
		}
		for i, r := range above {
			if hi == 0 || r < hi {
				hi, hi_ = r, i
			}
		}
		if hi == 0 || lo < hi {
			break
		}
		grey = append(grey, lo, hi)
		below = slices.Delete(below, li, li+1)
		above = slices.Delete(above, hi_, hi_+1)
	}
	for _, r := range grey {
		if r <= lo || (hi > 0 && r >= hi) {
			continue
		}
		if gLo == 0 || r < gLo {
			gLo = r
		}
		gHi = max(gHi, r)
	}
	return lo, hi, gLo, gHi
}

// clampInside keeps rate strictly inside (lo, hi), at least a tenth of the
// interval from either end, so that every fleet narrows the range.
func clampInside(rate, lo, hi float64) float64 {
	margin := (hi - lo) / 10
	return min(max(rate, lo+margin), hi-margin)
}

// exhausted returns why no further fleet may be sent, or "".
// exhausted returns why no further streams streams at rate may be sent,
// or "": they must fit the budgets of bytes and time.
func (s *search) exhausted(streams int, rate float64) string {
	e := s.est
	packets := s.p.packetsFor(rate)
	bytes := int64(streams) * int64(packets) * int64(s.p.PacketSize)
	dur := time.Duration(float64(streams) * float64(packets) * float64(gapFor(s.p.PacketSize, rate)) * (1 + idleShare))
	switch {
	case len(e.Fleets) >= s.p.MaxFleets:
		return fmt.Sprintf("fleet budget (%d) spent", s.p.MaxFleets)
	case e.Bytes+bytes > s.p.MaxBytes:
		return fmt.Sprintf("byte budget (%d) spent", s.p.MaxBytes)
	case s.now().Sub(s.start)+dur > s.p.MaxDuration:
		return fmt.Sprintf("time budget (%v) spent", s.p.MaxDuration)
	}
	return ""
}

// fleet sends streams at rate until they agree or FleetMax of them have
// counted without agreeing. Besides the vote of the streams' own tests, it
// pools their slopes: the streams of a fleet are independent samples, so
// their mean slope and its standard error say whether, across the fleet,
// the output rate fell below the input rate, even when bursty cross
// traffic puts a sawtooth on each stream's delays that hides the rise from
// the PDT.
func (s *search) fleet(ctx context.Context, rate float64) (Fleet, error) {
	f := Fleet{Rate: rate}
	var inc, flat, counted, rejected int
	var slopes, fluids []float64
	for {
		st, err := s.stream(ctx, rate, s.p.PacketSize, s.p.packetsFor(rate), false)
		if err != nil {
			return f, err
		}
		f.Streams = append(f.Streams, st)
		switch st.Trend {
		case Rejected:
			rejected++
		case Increasing:
			inc++
		case Flat:
			flat++
		}
		if st.Trend != Rejected {
			counted++
			slopes = append(slopes, st.Slope)
			if s.est.Capacity > 0 {
				fluids = append(fluids, st.SendRate-s.est.Capacity*st.Slope)
			}
		}
		rising, level := s.pooled(slopes, rate)
		agree := s.p.Agree * float64(counted)
		switch {
		case inc >= s.p.FleetMin && float64(inc) >= agree:
			f.Verdict = Above
		case counted >= s.p.FleetMin && rising:
			f.Verdict = Above
		case flat >= s.p.FleetMin && float64(flat) >= agree && level:
			f.Verdict = Below
		case counted >= s.p.FleetMax:
			f.Verdict = Grey
		case rejected >= s.p.FleetMax:
			f.Verdict = Unusable
		}
		if f.Verdict != "" {
			break
		}
		if s.exhausted(1, rate) != "" {
			f.Verdict = Grey
			break
		}
	}
	if f.Verdict == Above && len(fluids) > 0 {
		f.Fluid = median(fluids)
	}
	return f, nil
}

// pooled judges the slopes of a fleet's streams together. rising: they
// show that rate exceeds the available bandwidth, their mean being
// significantly above zero (one-sided Student t test at 97.5 %) and above
// the slope a rate Resolution/2 above A would give on a link of the
// capacity found. level: their mean is no more than the slope a rate
// Resolution above A would give, so that a fleet whose PDTs say flat but
// whose output rate fell short of its input rate is not called below.
func (s *search) pooled(slopes []float64, rate float64) (rising, level bool) {
	n := len(slopes)
	if n < 2 || s.est.Capacity <= 0 {
		return false, true
	}
	var mean float64
	for _, v := range slopes {
		mean += v
	}
	mean /= float64(n)
	var ss float64
	for _, v := range slopes {
		ss += (v - mean) * (v - mean)
	}
	se := math.Sqrt(ss/float64(n-1)) / math.Sqrt(float64(n))
	material := s.p.Resolution / 2 * rate / s.est.Capacity
	return mean-studentT975(n-1)*se > 0 && mean > material, mean <= 2*material
}

// studentT975 returns the 97.5th percentile of Student's t distribution
// with dof degrees of freedom.
func studentT975(dof int) float64 {
	table := []float64{0, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228}
	if dof < len(table) {
		return table[max(dof, 1)]
	}
	return 1.96 + 2.4/float64(dof)
}

// trainCapacity derives from the back-to-back trains the narrow link's
// capacity, the rate the sender reached (the median of the trains'), and
// whether the capacity is only known to be at least that much; ok is
// false when no train arrived.
func trainCapacity(trains []Stream) (capacity, sendRate float64, atLeast, ok bool) {
	var (
		sent    []float64 // rates the trains were sent at
		narrow  []float64 // median-gap rates of the trains that queued
		batched []float64 // whole-span rates of those whose arrivals were batched
		passed  []float64 // arrival rates of the trains that did not queue
	)
	for _, st := range trains {
		if st.Trend == Rejected || st.RecvRate == 0 {
			continue
		}
		sent = append(sent, st.SendRate)
		switch {
		case !queued(st):
			// It arrived as fast as it left: it met no link narrower
			// than its own rate, and the spacing of its arrivals is
			// the sender's, however irregular.
			passed = append(passed, st.RecvRate)
		case st.Coalesced || st.GapRate == 0:
			// The receiver batched the arrivals: only the train's
			// whole span is worth anything.
			batched = append(batched, st.RecvRate)
		default:
			// The median gap is the narrow link's own spacing.
			narrow = append(narrow, st.GapRate)
		}
	}
	if len(sent) == 0 {
		return 0, 0, false, false
	}
	sendRate = median(sent)
	// Cross traffic only widens gaps and batching only narrows them, so
	// the least rate of the trains is the safest. When no train queued,
	// the capacity is at least the fastest arrival, not measured.
	switch {
	case len(narrow) > 0:
		capacity = slices.Min(narrow)
	case len(batched) > 0:
		capacity = slices.Min(batched)
	default:
		capacity, atLeast = slices.Max(passed), true
	}
	// A narrow link found about as fast as the trains were sent is not
	// told apart from the sender's own rate either.
	return capacity, sendRate, atLeast || capacity >= 0.95*sendRate, true
}

// Why an estimate is host-limited (Estimate.HostLimits).
const (
	// HostLimitPace: every fleet up to the probing limit, a share of
	// what the sender can pace, was below A.
	HostLimitPace = "pace"
	// HostLimitSendRate: the trains found the narrow link at least
	// PaceShare of the rate the sender sent them at.
	HostLimitSendRate = "send-rate"
	// HostLimitPacketRate: the narrow point passed half-size packets at
	// about the same packet rate as full-size ones (packetRateBound).
	HostLimitPacketRate = "packet-rate"
	// HostLimitReceiverDrops: this host's probe socket dropped packets.
	HostLimitReceiverDrops = "receiver-drops"
)

// HalfRateShare is the threshold of packetRateBound: half-size packets
// that pass the narrow point below this share of the full-size capacity
// (in bits) met a per-packet cost, not a link. A link passes them at
// its capacity (share ≈ 1, a little less for the framing it counts); a
// fixed cost per packet passes them at half of it (share ≈ 0.5); the
// threshold lies halfway.
const HalfRateShare = 0.75

// queuedShare: a train that arrived at less than this share of the rate
// it was sent at (first to last packet) queued somewhere on the way: it
// met a narrow point, and its arrival spacing is that point's. One that
// arrived faster met none, whatever its median gap says: a sender that
// sends in clumps spaces a train unevenly by itself.
const queuedShare = 0.9

// queued tells whether a train queued on the way (see queuedShare).
func queued(st Stream) bool { return st.RecvRate > 0 && st.RecvRate < queuedShare*st.SendRate }

// packetRateBound tells whether the path's narrow point is a per-packet
// cost rather than a link: a link serializes bytes, so the half-size
// trains, sent as fast as the full-size ones, leave it at the same bit
// rate; a host that forwards or receives a fixed number of packets per
// second (the per-packet cost of a system call, a softirq, a forwarding
// step, dominates the copy of a kilobyte) passes them at half the bit
// rate. Only half-size trains that queued somewhere count (arrived
// slower than they were sent, their timestamps not batched): a train the
// sender could not send faster than the narrow point says nothing about
// it. Both sides take the fastest train, the one cross traffic disturbed
// least, so that cross traffic widening the gaps of one train does not
// raise the flag. It returns the half-size trains' capacity (0 when none
// counted) and the verdict.
func packetRateBound(full, half []Stream) (halfCap float64, bound bool) {
	var fullCap float64
	for _, st := range full {
		if st.Trend != Rejected && !st.Coalesced && queued(st) {
			fullCap = max(fullCap, st.GapRate)
		}
	}
	for _, st := range half {
		if st.Trend != Rejected && !st.Coalesced && queued(st) {
			halfCap = max(halfCap, st.GapRate)
		}
	}
	if fullCap == 0 || halfCap == 0 {
		return halfCap, false
	}
	return halfCap, halfCap < HalfRateShare*fullCap
}

// stream sends one stream (or a train) of packets of size bytes at rate
// and accounts for it.
func (s *search) stream(ctx context.Context, rate float64, size, packets int, train bool) (Stream, error) {
	spec := StreamSpec{ID: s.next, Count: packets, Size: size, GapNs: gapFor(size, rate)}
	s.next++
	rep, samples, err := s.pr.probe(ctx, spec)
	if err != nil {
		return Stream{}, err
	}
	st := analyze(spec, rep, samples, train)
	if lossy := st.Sent-st.Received > int(MaxLoss*float64(st.Sent)); !train && !lossy && st.Trend == Increasing &&
		s.est.Capacity > 0 && st.Slope*s.est.Capacity < s.p.Resolution/2*st.SendRate {
		// Delays rose steadily but too little to matter: the stream left
		// within Resolution/2 of its rate (a fixed phase against
		// constant-rate cross traffic drifts the delays by microseconds,
		// which the PDT, blind to magnitude, calls a rise).
		st.Trend = Flat
	}
	if s.log != nil {
		kind := "stream"
		if train {
			kind = "train"
		}
		s.log("%s %d at %s: sent %s, received %s (%d of %d), pdt %.2f, slope %.4f: %s %s", kind, spec.ID,
			FormatRate(spec.Rate()), FormatRate(st.SendRate), FormatRate(st.RecvRate), st.Received, st.Sent,
			st.PDT, st.Slope, st.Trend, st.Rejected)
	}
	s.est.Streams++
	s.est.Bytes += int64(st.Sent) * int64(spec.Size)
	if st.Trend == Rejected {
		s.est.Rejected++
	}
	return st, nil
}
