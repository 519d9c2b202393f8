// SPDX-License-Identifier: Apache-2.0

package web_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/web"
	"github.com/magnet-tracer/magnet/internal/web/webtest"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// TestSelfContained checks that the page names no other origin and that
// its policy allows exactly its own script.
func TestSelfContained(t *testing.T) {
	page := string(web.Page())
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//`),
		regexp.MustCompile(`(?i)<link\b`), regexp.MustCompile(`(?i)@import`), regexp.MustCompile(`(?i)url\(`),
		regexp.MustCompile(`(?i)<script\s+src`),
	} {
		if m := bad.FindString(page); m != "" {
			t.Errorf("the page loads something from elsewhere: %q", m)
		}
	}
	rec := httptest.NewRecorder()
	web.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "text/html; charset=utf-8" || rec.Body.String() != page {
		t.Fatalf("GET /: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	script := page[strings.Index(page, "<script>")+len("<script>") : strings.Index(page, "</script>")]
	sum := sha256.Sum256([]byte(script))
	csp := rec.Header().Get("Content-Security-Policy")
	if !strings.Contains(csp, "script-src 'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'") ||
		!strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Fatalf("policy %q does not pin the script", csp)
	}
	rec = httptest.NewRecorder()
	web.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("POST /: %d", rec.Code)
	}
}

// fakeAPI is a daemon's /v1/connections whose figures move with time.
type fakeAPI struct {
	token string
	start time.Time
	mu    sync.Mutex
	asked int
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+f.token {
		w.WriteHeader(http.StatusUnauthorized)
		json.NewEncoder(w).Encode(magnetclient.ErrorBody{Error: "missing or wrong bearer token"})
		return
	}
	f.mu.Lock()
	f.asked++
	f.mu.Unlock()
	el := time.Since(f.start)
	now := uint64(1e12) + uint64(el)
	sec := el.Seconds()
	mk := func(id uint64, comm string, bps float64, cwnd uint32, srtt uint32) magnetclient.Connection {
		c := magnetclient.Connection{ID: id, Proto: "tcp", Local: "10.200.0.1:40000", Remote: "10.200.0.2:5201",
			Owner:  &magnetclient.Owner{PID: 40 + uint32(id), Comm: comm},
			Window: magnetclient.Window{NowNs: now},
			State:  &magnetclient.TCPState{Cwnd: cwnd, SrttUs: srtt, DeliveryRateBPS: bps * 1.02}}
		c.App.Send.ByTime.BPS = bps
		c.Wire.Send.ByTime.BPS = bps * 1.05
		c.Wire.Recv.ByTime.BPS = bps * 0.02
		return c
	}
	list := magnetclient.ConnectionList{NowNs: now, Connections: []magnetclient.Connection{
		mk(1, "bulk", 6e8+3e8*math.Sin(sec*2), uint32(200+50*math.Sin(sec)), uint32(2000+800*math.Cos(sec*3))),
		mk(2, "other", 2e8, 80, 900),
		mk(3, "idle", 0, 10, 100),
	}}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(list)
}

// TestScopeInChromium opens the page in headless Chromium against a fake
// daemon and checks that it authenticates with the token of its URL,
// charts the busy connections (not the idle one), and that the charts
// keep growing.
func TestScopeInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	api := &fakeAPI{token: "0123456789abcdef-token", start: time.Now()}
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", web.Handler())
	mux.Handle("GET /v1/connections", api)
	srv := httptest.NewServer(mux) // 127.0.0.1
	t.Cleanup(srv.Close)

	p := webtest.Open(t, srv.URL+"/#token="+api.token, 1280, 860)
	first, err := p.WaitFor(30*time.Second, func(s webtest.State) bool { return s.Polls >= 4 && s.Drawn["bw"] > 0 })
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(first.Chosen, ",") != "1,2" {
		t.Fatalf("charted %v, want the two busy connections 1,2", first.Chosen)
	}
	last, err := p.WaitFor(30*time.Second, func(s webtest.State) bool {
		return s.Polls >= first.Polls+8 &&
			s.Drawn["bw"] > first.Drawn["bw"] && s.Drawn["cwnd"] > first.Drawn["cwnd"] && s.Drawn["srtt"] > first.Drawn["srtt"]
	})
	if err != nil {
		t.Fatalf("the charts stopped growing: %v", err)
	}
	if !strings.Contains(last.Status, "3 connections (3 open), 2 shown") {
		t.Fatalf("status line %q", last.Status)
	}
	pts, err := p.Series(1)
	if err != nil || len(pts) < 10 {
		t.Fatalf("series of connection 1: %d points, %v", len(pts), err)
	}
	// The token left the address bar; the page's requests carried it.
	if loc, err := webtest.Eval[string](p, `location.href`); err != nil || strings.Contains(loc, "token") {
		t.Fatalf("address still shows the token: %q %v", loc, err)
	}
	if probs := p.Problems(); len(probs) > 0 {
		t.Fatalf("the page had problems: %v", probs)
	}
	if dir := os.Getenv("MAGNET_SCREENSHOT_DIR"); dir != "" {
		if err := p.Screenshot(filepath.Join(dir, "scope-fake.png")); err != nil {
			t.Fatal(err)
		}
	}
}

// busyAPI is a busy host: 40 connections whose rates grow with their ids
// backwards (the busiest have the smallest ids but one), one of which
// had a single 10 Gbit/s sample, as the first poll of a new connection can.
type busyAPI struct {
	mu    sync.Mutex
	polls int
}

func (f *busyAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.polls++
	n := f.polls
	f.mu.Unlock()
	now := uint64(1e12) + uint64(n)*uint64(100*time.Millisecond)
	list := magnetclient.ConnectionList{NowNs: now}
	for id := uint64(1); id <= 40; id++ {
		bps := float64(id) * 1e6 // 1 to 40 Mbit/s: the busiest is 40
		if id == 7 && n == 3 {
			bps = 10e9 // one outlier sample
		}
		c := magnetclient.Connection{ID: id, Proto: "tcp", Local: "10.200.0.1:40000", Remote: "10.200.0.2:5201",
			Owner:  &magnetclient.Owner{PID: 100 + uint32(id), Comm: "app" + strconv.Itoa(int(id))},
			Window: magnetclient.Window{NowNs: now}}
		c.App.Send.ByTime.BPS = bps
		list.Connections = append(list.Connections, c)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(list)
}

// TestScopeBusyHost: the list is sorted by rate, the bandwidth axis is not
// set by one outlier sample, and a legend names the charted connections.
func TestScopeBusyHost(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	api := &busyAPI{}
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", web.Handler())
	mux.Handle("GET /v1/connections", api)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	p := webtest.Open(t, srv.URL+"/", 1280, 860)
	if _, err := p.WaitFor(30*time.Second, func(s webtest.State) bool { return s.Polls >= 8 && s.Drawn["bw"] > 0 }); err != nil {
		t.Fatal(err)
	}
	order, err := webtest.Eval[[]string](p, `magnetScope.order()`)
	if err != nil {
		t.Fatal(err)
	}
	if len(order) != 40 || strings.Join(order[:4], ",") != "40,39,38,37" || order[39] != "1" {
		t.Errorf("list order %v, want the busiest first: 40,39,38,37 … 1", order)
	}
	// The chart shows the four busiest (37-40 Mbit/s): the axis tops out
	// near them, not at connection 7's 10 Gbit/s sample.
	axes, err := webtest.Eval[map[string]map[string]float64](p, `magnetScope.axes()`)
	if err != nil {
		t.Fatal(err)
	}
	if top := axes["bw"]["top"]; top < 40e6 || top > 100e6 {
		t.Errorf("bandwidth axis tops at %g, want 40-100 Mbit/s", top)
	}
	if _, err := webtest.Eval[bool](p, `(document.querySelector('#conns [data-id="7"] input').click(), true)`); err != nil {
		t.Fatal(err)
	}
	if _, err := p.WaitFor(10*time.Second, func(s webtest.State) bool { return len(s.Chosen) == 5 }); err != nil {
		t.Fatal(err)
	}
	axes, _ = webtest.Eval[map[string]map[string]float64](p, `(magnetScope.redraw && magnetScope.redraw(), magnetScope.axes())`)
	if top := axes["bw"]["top"]; top > 100e6 || axes["bw"]["clipped"] < 1 {
		t.Errorf("with connection 7 charted the axis tops at %g (%g clipped), want its outlier clipped", top, axes["bw"]["clipped"])
	}
	legend, err := webtest.Eval[[]string](p, `magnetScope.legend()`)
	if err != nil {
		t.Fatal(err)
	}
	if len(legend) != 5 || !strings.HasPrefix(legend[0], "#7 app7") || !strings.HasPrefix(legend[4], "#40 app40 → 10.200.0.2:5201") {
		t.Errorf("legend %q, want the five charted connections by id", legend)
	}
	if probs := p.Problems(); len(probs) > 0 {
		t.Fatalf("the page had problems: %v", probs)
	}
}
