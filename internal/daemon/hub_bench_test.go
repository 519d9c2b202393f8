// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bufio"
	"context"
	"encoding/binary"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/filter"
	"github.com/magnet-tracer/magnet/internal/live"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// discardResponse is an http.ResponseWriter that counts and drops what a
// stream writes, and can be flushed.
type discardResponse struct {
	h     http.Header
	bytes int64
}

func (d *discardResponse) Header() http.Header { return d.h }
func (d *discardResponse) WriteHeader(int)     {}
func (d *discardResponse) Flush()              {}
func (d *discardResponse) Write(p []byte) (int, error) {
	d.bytes += int64(len(p))
	return len(p), nil
}

// flowRecords is one round of a bulk TCP transfer as the recorder sees it
// on a veth pair (client conn 1 → server conn 2 on port): a 64 KiB send at
// the socket, TCP and the device, its receipt, the ACKs, and now and then
// a tcp_state. Times are set by the caller.
func flowRecords(b *testing.B, f *fakeRecorder, port int) (open [][]byte, round [][]byte) {
	open = append(f.connOpen(b, 1, 100, 100, 0, "sender", "10.0.0.1:40000", "10.0.0.2:"+strconv.Itoa(port), 1),
		f.connOpen(b, 2, 200, 200, 0, "receiver", "10.0.0.2:"+strconv.Itoa(port), "10.0.0.1:40000", 1)...)
	rec := func(name string, conn uint64, tid uint32, size int32, fields map[string]any) []byte {
		return f.rec(b, name, 0, conn, tid, size, fields)
	}
	for i := 0; i < 2; i++ {
		round = append(round,
			rec("sock_send", 1, 100, 65536, nil),
			rec("tcp_send", 1, 100, 65536, nil),
			rec("tcp_xmit", 1, 100, 32768, map[string]any{"seq": 1000 + i*32768}),
			rec("dev_xmit", 1, 100, 32834, nil),
			rec("dev_recv", 2, 0, 32834, nil),
			rec("tcp_rcv", 2, 0, 32768, map[string]any{"seq": 1000 + i*32768}),
			rec("tcp_xmit", 2, 0, 0, map[string]any{"seq": 1}),
			rec("dev_xmit", 2, 0, 66, nil),
			rec("dev_recv", 1, 0, 66, nil),
			rec("tcp_rcv", 1, 0, 0, map[string]any{"ack": 1000 + (i+1)*32768}),
			rec("sock_recv", 2, 200, 32768, nil),
		)
	}
	round = append(round, rec("tcp_state", 1, 0, 0, map[string]any{"cwnd": 10, "srtt_us": 50, "state": 1}))
	return open, round
}

// benchHub feeds the hub a bulk transfer's records through the recorder's
// sink, with event subscriptions of the given filters (every one writing to
// a discarded stream), and reports events/s through the hub.
func benchHub(b *testing.B, filters []magnetclient.Filter) {
	hdr := testHeader(b)
	f := &fakeRecorder{hdr: hdr}
	h := newHub(live.NewTable(live.DefaultConfig))
	h.enabled.Store(uint32(event.DefaultGroups))
	stop := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var subs []*sub
	var wg sync.WaitGroup
	for _, spec := range filters {
		flt, err := filter.Parse(spec, filter.Options{})
		if err != nil {
			b.Fatal(err)
		}
		s := &sub{kind: kindEvents, who: identity{seesAll: true}, f: flt, q: make(chan item, 1<<16), stop: stop}
		rw := &discardResponse{h: http.Header{}}
		s.out = &streamWriter{w: rw, bw: bufio.NewWriterSize(rw, 32<<10), rc: http.NewResponseController(rw)}
		subs = append(subs, s)
		wg.Add(1)
		go func() { defer wg.Done(); s.serveEvents(ctx, s.out) }()
	}
	set := map[uint64]*sub{}
	for i, s := range subs {
		set[uint64(i+1)] = s
	}
	h.subs.Store(newSubSet(set))
	snk, err := h.newSink(hdr)
	if err != nil {
		b.Fatal(err)
	}
	go h.run()

	const port = 5201
	open, round := flowRecords(b, f, port)
	for _, r := range open {
		snk.Write(r)
	}
	ts := uint64(2)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for n := 0; n < b.N; {
		for _, r := range round {
			ts += 1000
			binary.NativeEndian.PutUint64(r, ts)
			snk.Write(r)
			n++
			// The recorder hands over ~200 events at a time at 200k
			// events/s (one drain round per millisecond).
			if n%200 == 0 {
				snk.(record.DrainedSink).Drained(ts)
				snk.Flush()
			}
		}
	}
	snk.Close(nil)
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	var dropped, delivered uint64
	for _, s := range subs {
		dropped += s.dropped.Load()
		delivered += s.delivered.Load()
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(delivered)/float64(b.N), "delivered/event")
	if dropped > 0 {
		b.ReportMetric(float64(dropped)/float64(b.N), "dropped/event")
	}
}

// The subscriptions of bench/daemon.sh: 3 of the flow's tcp_state, 3 of
// the sock, tcp and dev groups of a port nobody uses.
func benchMix() []magnetclient.Filter {
	var fs []magnetclient.Filter
	for i := 0; i < 3; i++ {
		fs = append(fs, magnetclient.Filter{Types: []string{"tcp_state"}, Ports: []uint16{5201}},
			magnetclient.Filter{Groups: []string{"sock", "tcp", "dev"}, Ports: []uint16{9}})
	}
	return fs
}

func BenchmarkHubNoSubscribers(b *testing.B) { benchHub(b, nil) }

func BenchmarkHubBenchMix(b *testing.B) { benchHub(b, benchMix()) }

// Ten streams of every event of the flow: encoding dominates.
func BenchmarkHubTenFullStreams(b *testing.B) {
	var fs []magnetclient.Filter
	for i := 0; i < 10; i++ {
		fs = append(fs, magnetclient.Filter{Ports: []uint16{5201}})
	}
	benchHub(b, fs)
}

// Ten streams with one CEL expression, matching the large segments.
func BenchmarkHubTenExprStreams(b *testing.B) {
	var fs []magnetclient.Filter
	for i := 0; i < 10; i++ {
		fs = append(fs, magnetclient.Filter{Ports: []uint16{5201}, Expr: "size > 30000"})
	}
	benchHub(b, fs)
}
