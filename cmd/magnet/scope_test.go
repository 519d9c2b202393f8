// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/web/webtest"
)

// TestScopeLive opens the daemon's oscilloscope page in headless Chromium
// while a transfer runs over a 200 Mbit/s link, and checks that the charts
// of that connection grow with live figures: its application rate near the
// link's, its cwnd and srtt. MAGNET_SCREENSHOT_DIR=DIR keeps a screenshot.
func TestScopeLive(t *testing.T) {
	if _, err := webtest.FindBrowser(); err != nil {
		t.Skip(err)
	}
	d := startDaemon(t, true, "filter:\n  port: 15303\n")
	lab := netlab.ForTest(t, netlab.Options{Name: "scopet", RateMbit: 200})
	f := startFlow(t, lab, 15303, 64<<10)
	id := findConn(t, d.Client(t), f)

	// The page needs no token; the API behind it does.
	if resp, err := http.Get("http://" + d.TCP + "/"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /: %v %v", err, resp)
	} else {
		resp.Body.Close()
	}

	// The host may have busier connections than ours (other tests): choose
	// ours in the address, as a user would by clicking it.
	p := webtest.Open(t, fmt.Sprintf("http://%s/#token=%s&conns=%d", d.TCP, d.Token, id), 1280, 860)
	first, err := p.WaitFor(30*time.Second, func(s webtest.State) bool { return s.Drawn["bw"] >= 6 && s.Drawn["cwnd"] >= 2 })
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Chosen) != 1 || first.Chosen[0] != fmt.Sprint(id) {
		t.Fatalf("charted %v, want connection %d", first.Chosen, id)
	}
	last, err := p.WaitFor(30*time.Second, func(s webtest.State) bool {
		return s.Polls >= first.Polls+8 && s.Drawn["bw"] > first.Drawn["bw"]+6 &&
			s.Drawn["cwnd"] > first.Drawn["cwnd"] && s.Drawn["srtt"] > first.Drawn["srtt"]
	})
	if err != nil {
		t.Fatalf("the charts stopped growing: %v", err)
	}
	pts, err := p.Series(id)
	if err != nil {
		t.Fatal(err)
	}
	if len(pts) < 10 {
		t.Fatalf("%d points for connection %d", len(pts), id)
	}
	// The newest points: the application rate of a 200 Mbit/s link, a
	// congestion window, a round-trip time.
	end := pts[len(pts)-1]
	app, _ := end["app"].(float64)
	cwnd, _ := end["cwnd"].(float64)
	srtt, _ := end["srtt"].(float64)
	if app < 100e6 || app > 250e6 || cwnd < 2 || srtt <= 0 {
		t.Fatalf("last point %v: want app 100 to 250 Mbit/s, cwnd and srtt", end)
	}
	if probs := p.Problems(); len(probs) > 0 {
		t.Fatalf("the page had problems: %v", probs)
	}
	t.Logf("page after %d polls: %+v", last.Polls, last)
	if dir := os.Getenv("MAGNET_SCREENSHOT_DIR"); dir != "" {
		if err := p.Screenshot(filepath.Join(dir, "scope-live.png")); err != nil {
			t.Fatal(err)
		}
	}
}
