// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"errors"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// TestDeliveryFigures: a pull request for delivery-rate figures enables the
// rate group; tcp_rate events then give, beside the app rate, the last
// sample and, over the window, the max and interval-weighted mean of the
// samples not app-limited and the count of app-limited ones (repeats of a
// kept sample not counted again). A figure stream asking for them enables
// the group too.
func TestDeliveryFigures(t *testing.T) {
	td := startFake(t, nil)
	c := td.client(t)
	ctx := context.Background()
	f := td.fake
	uid := uint32(os.Geteuid())
	t0 := monotonicNs() - uint64(2*time.Second)
	f.send(f.connOpen(t, 42, 100, 100, uid, "send", "10.0.0.1:40000", "10.0.0.2:5201", t0)...)
	f.send(f.rec(t, "sock_send", t0+ms, 42, 100, 1000, nil))

	q := magnetclient.BandwidthQuery{Window: 10 * time.Second, Delivery: true}
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err := c.Bandwidth(ctx, 42, q)
		if err == nil {
			break
		}
		if !errors.Is(err, magnetclient.ErrNotFound) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	st := must[*magnetclient.Status](t)(c.Status(ctx))
	if !slices.Contains(st.Groups.Enabled, "rate") || st.Groups.Requested["rate"] != 1 {
		t.Fatalf("after a pull asking for delivery figures: groups %+v", st.Groups)
	}

	rate := func(at uint64, segs, us uint32, appLimited, repeat bool) []byte {
		r := f.rec(t, "tcp_rate", at, 42, 100, 0, map[string]any{
			"ack_ns": int(at - 1000), "delivered": int(at/ms) & 0xffffffff, "lost": 3, "rate_delivered": int(segs), "rate_interval_us": int(us),
			"mss": 1000, "app_limited": map[bool]int{true: 1}[appLimited],
		})
		if repeat {
			r[31] = 1 // MG_RATE_SAME
		}
		return r
	}
	at := t0 + 1000*ms
	for i := range 10 { // 100 segments of 1000 bytes per ms: 800 Mbit/s
		f.send(rate(at+uint64(i)*ms, 100, 1000, false, false))
	}
	f.send(rate(at+20*ms, 10, 10, false, false)) // a 10 µs burst: 8 Gbit/s
	f.send(rate(at+21*ms, 10, 10, false, true))  // the kernel kept it
	for i := range 3 {
		f.send(rate(at+uint64(30+i)*ms, 1, 1000, true, false))
	}
	var bw *magnetclient.Bandwidth
	for deadline := time.Now().Add(10 * time.Second); ; {
		bw = must[*magnetclient.Bandwidth](t)(c.Bandwidth(ctx, 42, q))
		if bw.Delivery != nil && bw.Delivery.Samples == 15 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("delivery figures after 10 s: %+v", bw.Delivery)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if bw.Layer != "app" || bw.Dir != "send" || bw.Bytes != 1000 {
		t.Errorf("app figures %+v", bw)
	}
	d := bw.Delivery
	wantMean := (10*100*1000*8 + 10*1000*8) / ((10*1000 + 10) / 1e6)
	w := d.Window
	if w.Samples != 11 || w.AppLimited != 3 || w.Ns != int64(10*time.Second) || math.Abs(w.MaxBPS-8e9) > 1 || math.Abs(w.MeanBPS-wantMean) > 1 {
		t.Errorf("window %+v, want 11 samples, 3 app-limited, max 8e9, mean %.0f", w, wantMean)
	}
	if l := d.Last; l.AckNs != at+32*ms-1000 || !l.AppLimited || l.Lost != 3 || l.RateDelivered != 1 || math.Abs(l.BPS-8e6) > 1 {
		t.Errorf("last sample %+v", l)
	}
	conn := must[*magnetclient.Connection](t)(c.Connection(ctx, 42, magnetclient.Window{Ns: int64(10 * time.Second)}))
	if conn.Delivery == nil || conn.Delivery.Window != w {
		t.Errorf("connection's delivery %+v, want the bandwidth's %+v", conn.Delivery, w)
	}

	// A figure stream on a delivery metric asks for the group itself.
	s := must[*magnetclient.Stream](t)(c.Push(ctx, magnetclient.Filter{Conns: []uint64{42}}, magnetclient.PushOptions{Every: 50 * time.Millisecond, Metric: "delivery.max_bps", Window: 10 * time.Second}))
	defer s.Close()
	if !slices.Contains(s.Subscribed().Groups, "rate") {
		t.Errorf("figure stream on delivery.max_bps: groups %v", s.Subscribed().Groups)
	}
	for {
		m, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		if m.Figures == nil {
			continue
		}
		if len(m.Figures.Connections) != 1 || m.Figures.Connections[0].Delivery == nil || m.Figures.Connections[0].Delivery.Window.MaxBPS != w.MaxBPS {
			t.Fatalf("pushed %+v", m.Figures)
		}
		break
	}
	st = must[*magnetclient.Status](t)(c.Status(ctx))
	if st.Groups.Requested["rate"] != 2 {
		t.Errorf("rate requested by %d, want the pull hold and the stream", st.Groups.Requested["rate"])
	}
}
