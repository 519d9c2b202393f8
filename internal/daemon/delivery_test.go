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

	"github.com/magnet-tracer/magnet/internal/netlab"
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

// TestDeliveryKernel: a bulk transfer over a 200 Mbit/s tbf link, with a
// figure stream asking for delivery-rate figures: the bandwidth endpoint
// gives, beside the app and wire rates, the kernel's per-ACK samples, their
// window mean near the link rate.
func TestDeliveryKernel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF and builds network namespaces")
	}
	if err := netlab.Available(); err != nil {
		t.Skip(err)
	}
	lab, err := netlab.New(netlab.Options{Name: "mgdrate", RateMbit: 200})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	cg := newTestCgroup(t)
	td := startReal(t, func(c *Config) { c.Filter.Cgroup = cg.path })
	c := td.client(t)
	ctx := context.Background()
	port := testPorts(14)[13]
	f := magnetclient.Filter{RemotePorts: []uint16{port}}
	s := must[*magnetclient.Stream](t)(c.Push(ctx, f, magnetclient.PushOptions{Every: time.Second, Delivery: true}))
	defer s.Close()
	if !slices.Contains(s.Subscribed().Groups, "rate") {
		t.Fatalf("a figure stream asking for delivery figures: groups %v", s.Subscribed().Groups)
	}
	go func() { // the stream must be read, or it backs up
		for {
			if _, err := s.Next(); err != nil {
				return
			}
		}
	}()
	serve(t, cg, lab, lab.Server, port)
	done := make(chan error, 1)
	// 32 MiB: over a second at the link rate.
	go func() { done <- send(cg, lab, lab.Server, port, 512, 65536, 0) }()

	var mid *magnetclient.Bandwidth
	var id uint64
	for running := true; running; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			running = false
		case <-time.After(100 * time.Millisecond):
		}
		if id == 0 {
			if cs := must[[]magnetclient.Connection](t)(c.Connections(ctx, f, magnetclient.Window{})); len(cs) == 1 {
				id = cs[0].ID
			}
			continue
		}
		bw := must[*magnetclient.Bandwidth](t)(c.Bandwidth(ctx, id, magnetclient.BandwidthQuery{Window: 500 * time.Millisecond}))
		if running && bw.Rate.BPS > 0 && bw.Delivery != nil && bw.Delivery.Window.Samples >= 20 {
			mid = bw
		}
	}
	if mid == nil {
		t.Fatal("no bandwidth answer with delivery figures during the transfer")
	}
	d := mid.Delivery
	t.Logf("app %s %.1f Mbit/s; delivery over %v: mean %.1f Mbit/s, max %.1f, %d samples (%d app-limited); last %+v",
		mid.Dir, mid.Rate.BPS/1e6, time.Duration(d.Window.Ns), d.Window.MeanBPS/1e6, d.Window.MaxBPS/1e6, d.Window.Samples, d.Window.AppLimited, d.Last)
	if mid.Layer != "app" || mid.Dir != "send" {
		t.Errorf("bandwidth of %s %s, want app send", mid.Layer, mid.Dir)
	}
	if d.Window.Ns != int64(500*time.Millisecond) {
		t.Errorf("delivery window %d ns, want the bandwidth's 500 ms", d.Window.Ns)
	}
	if d.Window.MeanBPS < 0.6*200e6 || d.Window.MeanBPS > 1.1*200e6 {
		t.Errorf("delivery mean %.1f Mbit/s, want near the 200 Mbit/s link", d.Window.MeanBPS/1e6)
	}
	if d.Window.MaxBPS < d.Window.MeanBPS || d.Last.MSS == 0 || d.Last.Delivered == 0 {
		t.Errorf("delivery %+v", d)
	}
	wire := must[*magnetclient.Bandwidth](t)(c.Bandwidth(ctx, id, magnetclient.BandwidthQuery{Layer: "wire", Dir: "send"}))
	if wire.Bytes <= 0 || wire.Delivery == nil || wire.Delivery.Samples < d.Samples {
		t.Errorf("wire bandwidth %+v", wire)
	}
}
