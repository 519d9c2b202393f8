// SPDX-License-Identifier: Apache-2.0

// Package webtest drives the daemon's oscilloscope page in a headless
// Chromium over the DevTools protocol, for tests: open the page, read what
// it has drawn, take a screenshot. Only tests import it, so the browser
// protocol stays out of the magnet binary.
package webtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// Browsers are the names Chromium goes by, in the order they are looked for.
var Browsers = []string{"chromium", "chromium-browser", "google-chrome", "headless_shell"}

// FindBrowser returns the path of a Chromium, or an error saying none was
// found (scripts/deps.sh installs Debian's chromium).
func FindBrowser() (string, error) {
	for _, b := range Browsers {
		if p, err := exec.LookPath(b); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no chromium in PATH (scripts/deps.sh installs it)")
}

// Page is the scope page open in a headless browser.
type Page struct {
	Ctx context.Context // the browser tab; chromedp actions run on it

	mu     sync.Mutex
	errors []string // exceptions thrown by the page, CSP violations
}

// Open starts a headless Chromium of w x h pixels, opens url in it and
// returns the page. The browser ends with the test. It skips the test when
// no Chromium is installed.
func Open(tb testing.TB, url string, w, h int) *Page {
	tb.Helper()
	browser, err := FindBrowser()
	if err != nil {
		tb.Skip(err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser),
		chromedp.NoSandbox, // root in CI; the page is our own
		chromedp.DisableGPU,
		chromedp.WindowSize(w, h),
		chromedp.Flag("hide-scrollbars", true),
		// Tests talk to loopback only: no name lookups, no proxy, no
		// updates or reports to anywhere else.
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1"),
		chromedp.Flag("no-proxy-server", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-domain-reliability", true),
		chromedp.Flag("no-pings", true),
	)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	tb.Cleanup(func() {
		cancel()
		acancel()
	})
	p := &Page{Ctx: ctx}
	// The first call starts the browser, with a context without timeout:
	// the browser lives as long as that context.
	err = chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*runtime.EventExceptionThrown); ok && e.ExceptionDetails != nil {
			msg := e.ExceptionDetails.Text
			if ex := e.ExceptionDetails.Exception; ex != nil {
				msg += " " + ex.Description
			}
			p.mu.Lock()
			p.errors = append(p.errors, msg)
			p.mu.Unlock()
		}
	})
	if err != nil {
		tb.Fatalf("start %s: %v", browser, err)
	}
	start, scancel := context.WithTimeout(ctx, 60*time.Second)
	defer scancel()
	if err := chromedp.Do(start,
		chromedp.Navigate(url),
		// Collect Content-Security-Policy violations: a blocked asset.
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			_, err := chromedp.Evaluate[bool](`window.__violations = [];
				document.addEventListener("securitypolicyviolation",
					(e) => window.__violations.push(e.violatedDirective + " " + e.blockedURI)); true`)(ctx, t)
			return err
		}),
	); err != nil {
		tb.Fatalf("open %s in %s: %v", url, browser, err)
	}
	return p
}

// State is what the page has done so far.
type State struct {
	Polls   int            `json:"polls"`   // answers from the daemon
	Samples int            `json:"samples"` // points recorded, all connections
	Chosen  []string       `json:"chosen"`  // connections charted
	Drawn   map[string]int `json:"drawn"`   // points drawn per chart: bw, cwnd, srtt
	Status  string         `json:"status"`  // the status line
}

// State reads the page's state.
func (p *Page) State() (State, error) {
	ctx, cancel := context.WithTimeout(p.Ctx, 10*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[State](`({
		polls: magnetScope.polls(), samples: magnetScope.samples(), chosen: magnetScope.chosen(),
		drawn: magnetScope.drawn(), status: document.getElementById("status").textContent})`))
}

// Series returns the points the page holds for connection id.
func (p *Page) Series(id uint64) ([]map[string]any, error) {
	ctx, cancel := context.WithTimeout(p.Ctx, 10*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[[]map[string]any](fmt.Sprintf(`magnetScope.series(%d)`, id)))
}

// WaitFor polls the page's state until cond holds or timeout passes, and
// returns the last state.
func (p *Page) WaitFor(timeout time.Duration, cond func(State) bool) (State, error) {
	deadline := time.Now().Add(timeout)
	for {
		s, err := p.State()
		if err == nil && cond(s) {
			return s, nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("timed out after %v; last state %+v", timeout, s)
			}
			return s, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Problems returns the exceptions the page threw and the assets its
// Content-Security-Policy blocked.
func (p *Page) Problems() []string {
	ctx, cancel := context.WithTimeout(p.Ctx, 10*time.Second)
	defer cancel()
	v, _ := chromedp.Run(ctx, chromedp.Evaluate[[]string](`window.__violations || []`))
	p.mu.Lock()
	defer p.mu.Unlock()
	return append(append([]string(nil), p.errors...), v...)
}

// Screenshot writes a PNG of the whole window to path.
func (p *Page) Screenshot(path string) error {
	ctx, cancel := context.WithTimeout(p.Ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		return fmt.Errorf("screenshot: %w", err)
	}
	return os.WriteFile(path, png, 0o644)
}

// Eval evaluates a JavaScript expression in the page and returns its
// value as T (decoded from JSON).
func Eval[T any](p *Page, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(p.Ctx, 10*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expr))
}
