// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/filter"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

const ms = uint64(time.Millisecond)

// collector reads a stream in the background.
type collector struct {
	msgs chan magnetclient.Message
	errc chan error
}

func collect(s *magnetclient.Stream) *collector {
	c := &collector{msgs: make(chan magnetclient.Message, 1<<16), errc: make(chan error, 1)}
	go func() {
		for {
			m, err := s.Next()
			if err != nil {
				c.errc <- err
				close(c.msgs)
				return
			}
			c.msgs <- m
		}
	}()
	return c
}

// events waits for n events (and gathers lost notices on the way).
func (c *collector) events(t *testing.T, n int) (evs []*magnetclient.Event, lost []*magnetclient.Lost) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for len(evs) < n {
		select {
		case m, ok := <-c.msgs:
			if !ok {
				t.Fatalf("stream ended after %d of %d events: %v", len(evs), n, <-c.errc)
			}
			if m.Event != nil {
				evs = append(evs, m.Event)
			}
			if m.Lost != nil {
				lost = append(lost, m.Lost)
			}
		case <-timeout:
			t.Fatalf("%d of %d events after 20 s", len(evs), n)
		}
	}
	return evs, lost
}

// quiet checks that nothing more comes for a while.
func (c *collector) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case m := <-c.msgs:
		t.Fatalf("unexpected message %+v", m)
	case <-time.After(d):
	}
}

func TestStreamsAndFigures(t *testing.T) {
	td := startFake(t, nil)
	c := td.client(t)
	ctx := context.Background()
	uid := uint32(os.Geteuid())

	byPort := collect(must[*magnetclient.Stream](t)(c.Subscribe(ctx, magnetclient.Filter{Types: []string{"sock_recv"}, Ports: []uint16{5201}}, 0)))
	big := collect(must[*magnetclient.Stream](t)(c.Subscribe(ctx, magnetclient.Filter{Expr: "size > 1000 && owner.comm == 'recv2'"}, 0)))

	f := td.fake
	t0 := monotonicNs() - uint64(2*time.Second) // time windows end now
	f.send(f.connOpen(t, 42, 100, 100, uid, "recv", "10.0.0.2:5201", "10.0.0.1:40000", t0)...)
	f.send(f.connOpen(t, 43, 101, 101, uid, "recv2", "10.0.0.2:6000", "10.0.0.1:40001", t0)...)
	for i := range 1500 {
		f.send(f.rec(t, "sock_recv", t0+uint64(i+1)*ms, 42, 100, 1000, nil))
	}
	for i := range 3 {
		f.send(f.rec(t, "sock_recv", t0+uint64(i+1)*ms, 43, 101, 2000, nil))
	}
	f.send(f.rec(t, "tcp_state", t0+1600*ms, 42, 0, 0, map[string]any{
		"cwnd": 10, "srtt_us": 250, "mss": 1448, "state": 1, "rate_delivered": 100, "rate_interval_us": 2000, "rate_app_limited": 1, "delivered": 5000, "lost": 7,
	}))

	evs, lost := byPort.events(t, 1500)
	if len(lost) > 0 {
		t.Errorf("lost %+v", lost)
	}
	for _, e := range evs {
		if e.Type != "sock_recv" || e.Conn != 42 || e.Size != 1000 || e.Local != "10.0.0.2:5201" || e.Owner == nil || e.Owner.Comm != "recv" || e.PID != 100 {
			t.Fatalf("event %+v", e)
		}
	}
	bigEvs, _ := big.events(t, 3)
	for _, e := range bigEvs {
		if e.Conn != 43 || e.Size != 2000 {
			t.Fatalf("expression matched %+v", e)
		}
	}
	byPort.quiet(t, 100*time.Millisecond)
	big.quiet(t, 50*time.Millisecond)

	// Pull: MAGNET 2.0's figure over the last 1000 receive events.
	conn := must[*magnetclient.Connection](t)(c.Connection(ctx, 42, magnetclient.Window{}))
	r := conn.App.Recv.ByEvents
	if r.Events != 1000 || r.Bytes != 999*1000 || r.SpanNs != int64(999*ms) || math.Abs(r.BPS-8e6) > 1 {
		t.Errorf("by_events %+v, want 8 Mbit/s over 1000 events", r)
	}
	if conn.Owner == nil || conn.Owner.UID != int64(uid) || conn.Owner.PID != 100 || conn.App.Recv.Bytes != 1_500_000 {
		t.Errorf("connection %+v", conn)
	}
	st := conn.State
	if st == nil || st.Cwnd != 10 || st.Lost != 7 || st.State != "ESTABLISHED" || !st.DeliveryAppLimited || math.Abs(st.DeliveryRateBPS-100*1448*8/0.002) > 1 {
		t.Errorf("tcp_state %+v", st)
	}
	bw := must[*magnetclient.Bandwidth](t)(c.Bandwidth(ctx, 42, magnetclient.BandwidthQuery{Events: 10}))
	if bw.Dir != "recv" || bw.Layer != "app" || bw.Events != 10 || bw.Bytes != 9000 || bw.WindowEvents != 10 {
		t.Errorf("bandwidth %+v", bw)
	}
	bw = must[*magnetclient.Bandwidth](t)(c.Bandwidth(ctx, 42, magnetclient.BandwidthQuery{Window: 10 * time.Second}))
	if bw.WindowNs != int64(10*time.Second) || bw.Bytes != 1_500_000 {
		t.Errorf("bandwidth over 10 s %+v", bw)
	}
	list := must[[]magnetclient.Connection](t)(c.Connections(ctx, magnetclient.Filter{Ports: []uint16{5201}}, magnetclient.Window{Events: 100}))
	if len(list) != 1 || list[0].ID != 42 || list[0].Window.Events != 100 || list[0].App.Recv.ByEvents.Events != 100 {
		t.Errorf("connections on 5201: %+v", list)
	}
	if _, err := c.Connection(ctx, 99, magnetclient.Window{}); !errors.Is(err, magnetclient.ErrNotFound) {
		t.Errorf("unknown connection: %v", err)
	}

	// Push: every 20 ms.
	p := collect(must[*magnetclient.Stream](t)(c.Push(ctx, magnetclient.Filter{Conns: []uint64{42}}, magnetclient.PushOptions{Every: 20 * time.Millisecond})))
	for range 3 {
		m := <-p.msgs
		if m.Figures == nil || len(m.Figures.Connections) != 1 || m.Figures.Connections[0].ID != 42 {
			t.Fatalf("push %+v", m)
		}
	}
	status := must[*magnetclient.Status](t)(c.Status(ctx))
	if status.Subscribers != 3 || status.Recorder.Events != 1500+3+1+2 || !status.Recording {
		t.Errorf("status %+v", status)
	}
	for _, s := range status.Subscriptions {
		if s.Kind == "events" && s.Filter.Expr == "" && (s.Delivered != 1500 || s.Dropped != 0) {
			t.Errorf("subscription %+v", s)
		}
	}
}

// TestSlowSubscriber stalls one subscriber: it loses events, is told how
// many, in the stream; the other loses none.
func TestSlowSubscriber(t *testing.T) {
	td := startFake(t, nil)
	c := td.client(t)
	ctx := context.Background()
	uid := uint32(os.Geteuid())
	flt := magnetclient.Filter{Types: []string{"sock_send"}}
	slow := must[*magnetclient.Stream](t)(c.Subscribe(ctx, flt, 8))
	fast := collect(must[*magnetclient.Stream](t)(c.Subscribe(ctx, flt, 0)))
	f := td.fake
	f.send(f.connOpen(t, 7, 100, 100, uid, "send", "10.0.0.1:1000", "10.0.0.2:2000", ms)...)
	const rounds, per = 40, 500
	for r := range rounds {
		for i := range per {
			f.send(f.rec(t, "sock_send", uint64(r*per+i+2)*ms, 7, 100, int32(r*per+i+1), nil))
		}
		// Paced by the fast reader, which must lose nothing.
		evs, lost := fast.events(t, per)
		if len(lost) > 0 {
			t.Fatalf("the fast subscriber lost %+v", lost)
		}
		if evs[per-1].Size != int32((r+1)*per) {
			t.Fatalf("round %d ends with %d", r, evs[per-1].Size)
		}
	}
	// The stalled one resumes: what it got plus what it was told it lost
	// is everything, and each notice comes where the gap is.
	got, lostTotal, next := 0, uint64(0), int32(1)
	var lostBefore int32
	sc := collect(slow)
	for got+int(lostTotal) < rounds*per {
		select {
		case m := <-sc.msgs:
			switch {
			case m.Event != nil:
				if m.Event.Size < next {
					t.Fatalf("event %d after %d", m.Event.Size, next)
				}
				if m.Event.Size > next && lostBefore == 0 {
					t.Fatalf("gap before %d not announced", m.Event.Size)
				}
				next, lostBefore = m.Event.Size+1, 0
				got++
			case m.Lost != nil:
				if m.Lost.Source != "subscriber" || m.Lost.Count == 0 {
					t.Fatalf("lost %+v", m.Lost)
				}
				lostTotal += m.Lost.Count
				if m.Lost.Total != lostTotal {
					t.Fatalf("lost total %d, counted %d", m.Lost.Total, lostTotal)
				}
				lostBefore = int32(m.Lost.Count)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("stalled subscriber: %d events and %d lost of %d", got, lostTotal, rounds*per)
		}
	}
	if lostTotal == 0 {
		t.Fatal("the stalled subscriber lost nothing: the test did not stall it")
	}
	t.Logf("stalled subscriber: %d delivered, %d lost", got, lostTotal)
	status := must[*magnetclient.Status](t)(c.Status(ctx))
	for _, s := range status.Subscriptions {
		if s.Queue == 8 && s.Dropped != lostTotal {
			t.Errorf("status says %d dropped, the stream %d", s.Dropped, lostTotal)
		}
	}
}

func TestRecorderLossInBand(t *testing.T) {
	// sched_switch events belong to no connection: a user sees them only
	// when allowed to see everyone's (root, or access.see_all_groups).
	td := startFake(t, func(c *Config) { seeAll(t, c) })
	c := td.client(t)
	s := collect(must[*magnetclient.Stream](t)(c.Subscribe(context.Background(), magnetclient.Filter{Types: []string{"sched_switch"}}, 0)))
	f := td.fake
	f.send(f.rec(t, "lost", 5*ms, 0, 0, 5, map[string]any{"total": 5, "n_dev_recv": 3, "n_sock_send": 2, "first_ns": int(4 * ms), "last_ns": int(5 * ms)}))
	m := <-s.msgs
	if m.Lost == nil || m.Lost.Source != "recorder" || m.Lost.Count != 5 || m.Lost.ByType["dev_recv"] != 3 || m.Lost.ByType["sock_send"] != 2 || m.Lost.LastNs != 5*ms {
		t.Fatalf("message %+v", m)
	}
	st := must[*magnetclient.Status](t)(c.Status(context.Background()))
	if st.Recorder.Lost != 5 || st.Recorder.LostByType["dev_recv"] != 3 {
		t.Errorf("status %+v", st.Recorder)
	}
}

func TestGroupsFollowSubscriptions(t *testing.T) {
	td := startFake(t, func(c *Config) { c.Events.Baseline = "sock"; seeAll(t, c) })
	c := td.client(t)
	ctx := context.Background()
	enabled := func() []string { return must[*magnetclient.Status](t)(c.Status(ctx)).Groups.Enabled }
	if got := strings.Join(enabled(), ","); got != "sock,conn" {
		t.Fatalf("baseline: %s", got)
	}
	s := must[*magnetclient.Stream](t)(c.Subscribe(ctx, magnetclient.Filter{Groups: []string{"sched"}, Types: []string{"dev_xmit"}}, 0))
	if got := strings.Join(s.Subscribed().Groups, ","); got != "sock,dev,conn,sched" {
		t.Fatalf("subscribed with %s", got)
	}
	st := must[*magnetclient.Status](t)(c.Status(ctx))
	if st.Groups.Requested["sched"] != 1 || st.Groups.Requested["dev"] != 1 {
		t.Errorf("requested %v", st.Groups.Requested)
	}
	// Events of a group not enabled are not shown: headers is off.
	allStream := must[*magnetclient.Stream](t)(c.Subscribe(ctx, magnetclient.Filter{}, 0))
	all := collect(allStream)
	f := td.fake
	f.send(f.rec(t, "headers", ms, 0, 0, 60, nil), f.rec(t, "sched_exit", 2*ms, 0, 0, 0, nil))
	evs, _ := all.events(t, 1)
	if evs[0].Type != "sched_exit" {
		t.Errorf("got %s, want sched_exit (headers is off)", evs[0].Type)
	}
	s.Close()
	deadline := time.Now().Add(10 * time.Second)
	for strings.Join(enabled(), ",") != "sock,conn" {
		if time.Now().After(deadline) {
			t.Fatalf("after the subscription ended: %v", enabled())
		}
		time.Sleep(10 * time.Millisecond)
	}
	again, err := c.Subscribe(ctx, magnetclient.Filter{Groups: []string{"sched"}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	again.Close()
	allStream.Close()
}

func TestShutdownEndsStreams(t *testing.T) {
	td := startFake(t, nil)
	c := td.client(t)
	s := collect(must[*magnetclient.Stream](t)(c.Subscribe(context.Background(), magnetclient.Filter{}, 0)))
	p := collect(must[*magnetclient.Stream](t)(c.Push(context.Background(), magnetclient.Filter{}, magnetclient.PushOptions{Every: time.Second})))
	td.stop(t)
	for _, col := range []*collector{s, p} {
		var end *magnetclient.End
		for m := range col.msgs {
			if m.End != nil {
				end = m.End
			}
		}
		if end == nil || end.Reason != "shutdown" {
			t.Errorf("stream closed without an end message")
		}
		if err := <-col.errc; !errors.Is(err, io.EOF) {
			t.Errorf("stream ended with %v", err)
		}
	}
	if _, err := os.Stat(td.sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
	if !strings.Contains(td.log.String(), "stopped") {
		t.Errorf("log: %s", td.log)
	}
}

func TestErrors(t *testing.T) {
	td := startFake(t, func(c *Config) { c.Subscribers.Max = 2 })
	for _, tc := range []struct {
		method, path, body string
		status             int
		want               string
	}{
		{"GET", "/v1/nosuch", "", 404, "no such endpoint"},
		{"POST", "/v1/status", "", 405, "want GET"},
		{"GET", "/v1/status?x=1", "", 400, "no parameters"},
		{"GET", "/v1/connections/abc", "", 400, "want a number"},
		{"GET", "/v1/connections/12345", "", 404, "not tracked"},
		{"GET", "/v1/connections/1/bandwidth?layer=ip", "", 400, "want app, tcp or wire"},
		{"GET", "/v1/connections/1/bandwidth?window_events=5&window=1s", "", 400, "not both"},
		{"GET", "/v1/connections?window_events=1", "", 400, "at least 2"},
		{"GET", "/v1/connections?window_events=5000", "", 400, "want 2 to 1000"},
		{"GET", "/v1/connections?window=1h", "", 400, "window 1h0m0s"},
		{"GET", "/v1/connections?types=sock_send", "", 400, "select events, not connections"},
		{"GET", "/v1/connections?state=maybe", "", 400, "want open, closed or all"},
		{"GET", "/v1/events?types=nosuch", "", 400, `unknown event type "nosuch"`},
		{"GET", "/v1/events?ports=99999", "", 400, "not a number"},
		{"GET", "/v1/events?expr=size%20%3E", "", 400, "expr:"},
		{"GET", "/v1/events?expr=size", "", 400, "must be true or false"},
		{"GET", "/v1/events?queue=0x10", "", 400, "queue"},
		{"GET", "/v1/events?queue=100000000", "", 400, "want 1 to 65536"},
		{"GET", "/v1/events?format=xml", "", 400, "want ndjson or sse"},
		{"GET", "/v1/events?every=1s", "", 400, "unknown parameter"},
		{"POST", "/v1/events", "{", 400, "body:"},
		{"POST", "/v1/events", `{"types":["sock_send"],"colour":1}`, 400, "unknown field"},
		{"POST", "/v1/events", `{"types":"sock_send"}`, 400, "body:"},
		{"POST", "/v1/events", `{} {}`, 400, "one JSON object"},
		{"POST", "/v1/events", `{"every":"1s"}`, 400, "for /v1/figures"},
		{"POST", "/v1/events?types=x", `{}`, 400, "in the body"},
		{"POST", "/v1/events", `{"types":["x"]}` + strings.Repeat(" ", 70000), 413, "body over"},
		{"GET", "/v1/figures?types=sock_send", "", 400, "select events"},
		{"GET", "/v1/figures?every=1ms", "", 400, "at least 10ms"},
		{"GET", "/v1/figures?metric=cpu.load", "", 400, "metric \"cpu.load\""},
		{"GET", "/v1/figures?change=-5", "", 400, "percentage"},
	} {
		status, body := raw(t, td.sock, tc.method, tc.path, tc.body)
		var eb magnetclient.ErrorBody
		if status != tc.status || json.Unmarshal([]byte(body), &eb) != nil || !strings.Contains(eb.Error, tc.want) || strings.Count(body, "\n") != 1 {
			t.Errorf("%s %s: %d %q, want %d and an error with %q", tc.method, tc.path, status, body, tc.status, tc.want)
		}
	}
	// Subscribers over the limit: 503.
	c := td.client(t)
	for range 2 {
		s := must[*magnetclient.Stream](t)(c.Subscribe(context.Background(), magnetclient.Filter{}, 0))
		defer s.Close()
	}
	if _, err := c.Subscribe(context.Background(), magnetclient.Filter{}, 0); !errors.Is(err, magnetclient.ErrUnavailable) {
		t.Errorf("third subscription: %v", err)
	}
}

// TestSSE reads a stream as a browser's EventSource would.
func TestSSE(t *testing.T) {
	td := startFake(t, func(c *Config) { seeAll(t, c) })
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", td.sock)
	}}}
	req, _ := http.NewRequest("GET", "http://magnet/v1/events?types=sock_send", nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	rd := bufio.NewReader(resp.Body)
	line := func() string {
		s, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSuffix(s, "\n")
	}
	if l := line(); l != "event: subscribed" {
		t.Fatalf("first line %q", l)
	}
	if l := line(); !strings.HasPrefix(l, `data: {"id":`) {
		t.Fatalf("data line %q", l)
	}
	line()
	f := td.fake
	f.send(f.rec(t, "task", ms, 0, 5, 0, map[string]any{"pid": 5, "uid": os.Geteuid(), "comm": "a\x01b\xff"}))
	f.send(f.rec(t, "sock_send", ms, 0, 5, 10, nil))
	if l := line(); l != "event: event" {
		t.Fatalf("event line %q", l)
	}
	var ev magnetclient.Event
	data := strings.TrimPrefix(line(), "data: ")
	if err := json.Unmarshal([]byte(data), &ev); err != nil || ev.Comm != "a\x01b\uFFFD" || ev.Size != 10 {
		t.Fatalf("data %q: %v %+v", data, err, ev)
	}
}

func TestTCPListenerToken(t *testing.T) {
	dir := socketDir(t)
	tokFile := filepath.Join(dir, "token")
	token := "s3cret-token-0123456789"
	if err := os.WriteFile(tokFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	td := startFake(t, func(c *Config) { c.Listen = "127.0.0.1:0"; c.TokenFile = tokFile })
	addr := "tcp://" + td.d.TCPAddr()
	ctx := context.Background()
	anon := must[*magnetclient.Client](t)(magnetclient.Dial(addr))
	defer anon.Close()
	if _, err := anon.Status(ctx); !errors.Is(err, magnetclient.ErrUnauthorized) {
		t.Fatalf("without a token: %v", err)
	}
	wrong := must[*magnetclient.Client](t)(magnetclient.Dial(addr, magnetclient.WithToken("not-the-token-at-all")))
	defer wrong.Close()
	if _, err := wrong.Subscribe(ctx, magnetclient.Filter{}, 0); !errors.Is(err, magnetclient.ErrUnauthorized) {
		t.Fatalf("with a wrong token: %v", err)
	}
	ok := must[*magnetclient.Client](t)(magnetclient.Dial(addr, magnetclient.WithToken(token)))
	defer ok.Close()
	st, err := ok.Status(ctx)
	if err != nil || st.Client.Via != "tcp" || !st.Client.SeesAll {
		t.Fatalf("with the token: %+v %v", st, err)
	}
	// The listener's own connections are never shown.
	ap := netip.MustParseAddrPort(td.d.TCPAddr())
	f := td.fake
	td.d.hub.mu.Lock()
	ns := td.d.hub.selfNS
	td.d.hub.mu.Unlock()
	open := f.rec(t, "conn_open", ms, 77, 9, 0, map[string]any{"proto": 6, "family": 4, "lport": int(ap.Port()), "rport": 50000, "laddr": ap.Addr(), "raddr": ap.Addr()})
	binaryPutNetNS(open, ns)
	f.send(open, f.rec(t, "sock_send", 2*ms, 77, 9, 100, nil))
	other := f.rec(t, "conn_open", 3*ms, 78, 9, 0, map[string]any{"proto": 6, "family": 4, "lport": 1, "rport": 2, "laddr": ap.Addr(), "raddr": ap.Addr()})
	f.send(other)
	deadline := time.Now().Add(5 * time.Second)
	for {
		list := must[[]magnetclient.Connection](t)(ok.Connections(ctx, magnetclient.Filter{}, magnetclient.Window{}))
		if len(list) == 1 {
			if list[0].ID != 78 {
				t.Fatalf("connections %+v", list)
			}
			break
		}
		if len(list) > 1 || time.Now().After(deadline) {
			t.Fatalf("connections %+v", list)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func binaryPutNetNS(rec []byte, ns uint32) {
	rec[24], rec[25], rec[26], rec[27] = byte(ns), byte(ns>>8), byte(ns>>16), byte(ns>>24)
}

func TestAccessRules(t *testing.T) {
	user := identity{uid: 1000}
	root := identity{uid: 0, seesAll: true}
	own := &filter.Event{Type: event.SockSend, Conn: 1, HasOwner: true, OwnerUID: 1000, UID: 0}
	other := &filter.Event{Type: event.SockSend, Conn: 2, HasOwner: true, OwnerUID: 1001, UID: 1000}
	unowned := &filter.Event{Type: event.TCPRcv, Conn: 3, UID: 1000}
	dev := &filter.Event{Type: event.DevRecv, UID: 1000}
	sched := &filter.Event{Type: event.SchedSwitch, UID: 1000}
	schedOther := &filter.Event{Type: event.SchedSwitch, UID: 0}
	for _, tc := range []struct {
		e          *filter.Event
		user, root bool
	}{
		{own, true, true},      // its connection, even when softirq ran as root
		{other, false, true},   // another's connection, even if the user's task ran it
		{unowned, false, true}, // no owner yet
		{dev, false, true},     // no connection: device events are not the user's
		{sched, true, true},    // its own task
		{schedOther, false, true},
	} {
		if got := user.canSee(tc.e); got != tc.user {
			t.Errorf("user sees %+v: %v", tc.e, got)
		}
		if got := root.canSee(tc.e); got != tc.root {
			t.Errorf("root sees %+v: %v", tc.e, got)
		}
	}
}

func TestConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "c.yaml")
		os.WriteFile(p, []byte(s), 0o644)
		return p
	}
	c, err := LoadConfig(write("socket: /tmp/x.sock\nconnections:\n  grace: 5s\n  window_events: 500\nevents:\n  baseline: sock,tcp\n"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if s.Socket != "/tmp/x.sock" || s.live.Grace != 5*time.Second || s.live.WindowEvents != 500 || s.baseline != event.GroupSock|event.GroupTCP|event.GroupConn || s.Subscribers.Queue != 4096 {
		t.Errorf("settings %+v", s)
	}
	for text, want := range map[string]string{
		"sockett: x\n":                                 "field sockett not found",
		"listen: ':9437'\n":                            "needs a bearer token",
		"buffer: 3MiB\n":                               "power of two",
		"events:\n  baseline: nosuch\n":                "unknown event group",
		"events:\n  available: sock\n":                 "which events.available does not load",
		"events:\n  baseline: ''\n":                    "events.baseline is empty",
		"events:\n  available: ' '\n":                  "events.available is empty",
		"socket_mode: 999\n":                           "octal mode",
		"subscribers:\n  queue: 0\n":                   "subscribers",
		"connections:\n  window: 1h\n":                 "connections.window",
		"access:\n  see_all_groups: [nosuchgroup-x]\n": "see_all_groups",
	} {
		c, err := LoadConfig(write(text))
		if err == nil {
			_, err = c.resolve()
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", text, err, want)
		}
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("a missing file must fail")
	}
}

func TestReload(t *testing.T) {
	td := startFake(t, nil)
	cfg := DefaultConfig()
	cfg.Socket = td.sock
	cfg.Events.Baseline = "sock,sched"
	cfg.Buffer = "16MiB" // needs a restart: kept
	cfg.Connections.Grace = 2 * time.Second
	if err := td.d.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	st := must[*magnetclient.Status](t)(td.client(t).Status(context.Background()))
	if strings.Join(st.Groups.Enabled, ",") != "sock,conn,sched" || st.Recorder.BufferBytes != 8<<20 {
		t.Errorf("after reload: %v, buffer %d", st.Groups.Enabled, st.Recorder.BufferBytes)
	}
	if !strings.Contains(td.log.String(), "[buffer]") {
		t.Errorf("log does not say the buffer needs a restart: %s", td.log)
	}
	cfg.Events.Baseline = "nosuch"
	if err := td.d.Reload(cfg); err == nil {
		t.Error("a bad configuration must be refused")
	}
}

func TestStaleSocket(t *testing.T) {
	td := startFake(t, nil)
	cfg := DefaultConfig()
	cfg.Socket = td.sock
	if _, err := New(cfg, Options{}); err == nil || !strings.Contains(err.Error(), "another magnet daemon") {
		t.Errorf("second daemon on a live socket: %v", err)
	}
	td.stop(t)
	// A socket file nobody listens on is replaced.
	ln, err := net.Listen("unix", td.sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	d, err := New(cfg, Options{})
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	d.unixLn.Close()
}

// TestPushOnChange pushes a connection when its metric moves by the
// percentage asked, and not otherwise.
func TestPushOnChange(t *testing.T) {
	td := startFake(t, nil)
	c := td.client(t)
	f := td.fake
	t0 := monotonicNs() - uint64(time.Second)
	f.send(f.connOpen(t, 42, 100, 100, uint32(os.Geteuid()), "recv", "10.0.0.2:5201", "10.0.0.1:40000", t0)...)
	f.send(f.rec(t, "sock_recv", t0+ms, 42, 100, 1000, nil))
	s := must[*magnetclient.Stream](t)(c.Push(context.Background(), magnetclient.Filter{Conns: []uint64{42}}, magnetclient.PushOptions{Change: 50, Metric: "app.recv.bytes"}))
	defer s.Close()
	p := collect(s)
	next := func() magnetclient.Connection {
		t.Helper()
		select {
		case m := <-p.msgs:
			if m.Figures == nil || len(m.Figures.Connections) != 1 {
				t.Fatalf("push %+v", m)
			}
			return m.Figures.Connections[0]
		case <-time.After(5 * time.Second):
			t.Fatal("no push")
		}
		return magnetclient.Connection{}
	}
	if got := next().App.Recv.Bytes; got != 1000 {
		t.Fatalf("first push: %d bytes", got)
	}
	f.send(f.rec(t, "sock_recv", t0+2*ms, 42, 100, 400, nil)) // +40 %: not enough
	p.quiet(t, 200*time.Millisecond)
	f.send(f.rec(t, "sock_recv", t0+3*ms, 42, 100, 200, nil)) // +60 % since the last push
	if got := next().App.Recv.Bytes; got != 1600 {
		t.Fatalf("second push: %d bytes", got)
	}
	p.quiet(t, 200*time.Millisecond)
}
