// SPDX-License-Identifier: Apache-2.0

package live

import (
	"testing"
	"time"
)

// TestDelivery: the delivery-rate window counts samples not app-limited
// (max, interval-weighted mean) and app-limited ones apart, skips repeats,
// keeps the newest sample by ACK time, and forgets what is older than the
// window.
func TestDelivery(t *testing.T) {
	_, c := newConn(t)
	if c.Delivery(uint64(time.Second), 0) != nil {
		t.Fatal("delivery figures before any tcp_rate")
	}
	start := 100_000 * ms
	// 10 samples of 100 segments of 1000 bytes over 1 ms (800 Mbit/s),
	// one of 10 over 10 µs (8 Gbit/s) and its repeat, two app-limited.
	for i := range 10 {
		at := start + uint64(i)*ms
		c.Sampled(RateSample{TimeNs: at, AckNs: at, RateDelivered: 100, IntervalUs: 1000, MSS: 1000})
	}
	at := start + 20*ms
	c.Sampled(RateSample{TimeNs: at, AckNs: at, RateDelivered: 10, IntervalUs: 10, MSS: 1000})
	c.Sampled(RateSample{TimeNs: at + ms, AckNs: at + ms, RateDelivered: 10, IntervalUs: 10, MSS: 1000, Repeat: true})
	c.Sampled(RateSample{TimeNs: at + 3*ms, AckNs: at + 3*ms, RateDelivered: 1, IntervalUs: 1000, MSS: 1000, AppLimited: true})
	// Drained late: older by ACK time, so not the last sample.
	c.Sampled(RateSample{TimeNs: at + 4*ms, AckNs: at + 2*ms, RateDelivered: 2, IntervalUs: 1000, MSS: 1000, AppLimited: true})
	d := c.Delivery(uint64(time.Second), at+5*ms)
	if d.Samples != 14 || d.Window.Samples != 11 || d.Window.AppLimited != 2 || d.Window.Ns != int64(time.Second) {
		t.Errorf("delivery %+v", d)
	}
	near(t, "max", d.Window.MaxBPS, 8e9, 1e-9)
	near(t, "mean", d.Window.MeanBPS, (10*100*1000*8+10*1000*8)/(10010/1e6), 1e-9)
	if d.Last.AckNs != at+3*ms || d.Last.RateDelivered != 1 || !d.Last.AppLimited {
		t.Errorf("last %+v, want the newest by ACK time", d.Last)
	}
	near(t, "last bps", d.Last.BPS, 8e6, 1e-9)
	// 15 ms window: only the buckets from 10 ms on.
	if w := c.Delivery(uint64(15*time.Millisecond), at+5*ms).Window; w.Samples != 1 || w.AppLimited != 2 {
		t.Errorf("15 ms window %+v, want the burst and the two app-limited", w)
	}
	// A second later, the window is empty; the last sample stays.
	d = c.Delivery(uint64(time.Second), at+2000*ms)
	if d.Window.Samples != 0 || d.Window.MaxBPS != 0 || d.Window.MeanBPS != 0 || d.Last.AckNs != at+3*ms {
		t.Errorf("after a quiet second %+v", d)
	}
	// A snapshot carries it over the connection's time window.
	if s := c.Snapshot(Window{Events: 10, Span: time.Second}, at+5*ms); s.Delivery == nil || s.Delivery.Window.Samples != 11 {
		t.Errorf("snapshot delivery %+v", s.Delivery)
	}
}
