// SPDX-License-Identifier: Apache-2.0

package live

import "github.com/magnet-tracer/magnet/pkg/magnetclient"

// RateSample is one tcp_rate event: the kernel's delivery-rate sample
// after an ACK that delivered data.
type RateSample struct {
	TimeNs, AckNs             uint64
	Delivered, Lost, MSS      uint32
	RateDelivered, IntervalUs uint32
	AppLimited                bool
	// Repeat: the kernel kept its previous sample (the new one was invalid,
	// or app-limited and slower); it is not counted again.
	Repeat bool
}

// bps is the sample's rate as tcpi_delivery_rate computes it.
func (s RateSample) bps() float64 { return DeliveryRate(s.RateDelivered, s.MSS, s.IntervalUs) }

// rateBucket sums the samples of one interval of the time window.
type rateBucket struct {
	idx        int64
	bits       float64 // Σ rate_delivered × mss × 8 of the samples not app-limited
	us         uint64  // Σ their intervals
	max        float64 // the fastest of them, bit/s
	n, limited int64   // samples not app-limited; app-limited ones
}

// deliveryWindow keeps a connection's delivery-rate samples in buckets of
// the table's resolution, over its history, so that a window costs the same
// at a million ACKs per second as at ten.
type deliveryWindow struct {
	res     uint64
	history int64
	b       []rateBucket
	start   int
	samples uint64
	last    RateSample
}

func (w *deliveryWindow) add(s RateSample) {
	w.samples++
	if s.AckNs >= w.last.AckNs {
		w.last = s
	}
	if s.Repeat || s.IntervalUs == 0 {
		return
	}
	idx := int64(s.TimeNs / w.res)
	live := w.b[w.start:]
	var b *rateBucket
	if len(live) == 0 || live[len(live)-1].idx < idx {
		w.b = append(w.b, rateBucket{idx: idx})
		b = &w.b[len(w.b)-1]
	} else {
		// Late (drain order): into its bucket, or the closest older one.
		i := len(live) - 1
		for i > 0 && live[i].idx > idx {
			i--
		}
		b = &live[i]
	}
	if s.AppLimited {
		b.limited++
	} else {
		bps := s.bps()
		b.n++
		b.bits += float64(s.RateDelivered) * float64(s.MSS) * 8
		b.us += uint64(s.IntervalUs)
		b.max = max(b.max, bps)
	}
	for w.start < len(w.b) && w.b[w.start].idx <= idx-w.history {
		w.start++
	}
	if w.start > 64 && w.start > len(w.b)/2 {
		n := copy(w.b, w.b[w.start:])
		w.b = w.b[:n]
		w.start = 0
	}
}

// over sums the buckets of the last span ns before now (exact to one
// bucket), as timeWindow.sum does.
func (w *deliveryWindow) over(now, span uint64) magnetclient.DeliveryWindow {
	out := magnetclient.DeliveryWindow{Ns: int64(span)}
	nowIdx := int64(now / w.res)
	k := int64((span + w.res - 1) / w.res)
	var bits float64
	var us uint64
	live := w.b[w.start:]
	for i := len(live) - 1; i >= 0; i-- {
		b := live[i]
		if b.idx > nowIdx {
			continue
		}
		if b.idx <= nowIdx-k {
			break
		}
		out.Samples += b.n
		out.AppLimited += b.limited
		bits += b.bits
		us += b.us
		out.MaxBPS = max(out.MaxBPS, b.max)
	}
	if us > 0 {
		out.MeanBPS = bits / (float64(us) / 1e6)
	}
	return out
}

// Sampled takes a tcp_rate event.
func (c *Conn) Sampled(s RateSample) {
	if c.delivery == nil {
		c.delivery = &deliveryWindow{res: uint64(c.cfg.Bucket), history: int64(c.cfg.History / c.cfg.Bucket)}
	}
	c.delivery.add(s)
}

// Delivery returns the connection's delivery-rate figures over the span
// before now; nil when no tcp_rate event came.
func (c *Conn) Delivery(span uint64, now uint64) *magnetclient.Delivery {
	w := c.delivery
	if w == nil {
		return nil
	}
	l := w.last
	return &magnetclient.Delivery{
		Samples: w.samples,
		Last: magnetclient.DeliverySample{
			AckNs: l.AckNs, BPS: l.bps(), Delivered: l.Delivered, Lost: l.Lost,
			RateDelivered: l.RateDelivered, IntervalUs: l.IntervalUs, MSS: l.MSS,
			AppLimited: l.AppLimited, Repeat: l.Repeat,
		},
		Window: w.over(max(now, l.TimeNs), span),
	}
}
