// SPDX-License-Identifier: Apache-2.0

// Package web is the daemon's oscilloscope page (MAGNET 2.0's GScope and
// MUSE, today): one self-contained HTML page, embedded in the binary, whose
// script polls the daemon's /v1/connections and draws the chosen
// connections' bandwidth (application and wire, and the kernel's
// delivery-rate estimate), congestion window and smoothed RTT on canvases.
// It loads nothing from anywhere else, so it works offline; its
// Content-Security-Policy allows only its own script and requests to the
// daemon that served it.
package web

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"net/http"
	"strconv"
)

//go:embed index.html
var page []byte

// csp allows the page's one inline script (by hash), its inline styles,
// and requests to its own origin; nothing else.
var csp = func() string {
	start := bytes.Index(page, []byte("<script>"))
	end := bytes.Index(page, []byte("</script>"))
	if start < 0 || end < start {
		panic("web: index.html has no <script>") // caught by the tests
	}
	sum := sha256.Sum256(page[start+len("<script>") : end])
	return "default-src 'none'; script-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'; " +
		"style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; " +
		"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}()

// Page returns the page's HTML.
func Page() []byte { return bytes.Clone(page) }

// Handler serves the page, for GET and HEAD. Mount it at "GET /{$}" so
// that other paths stay unknown.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "use GET", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		h.Set("Content-Length", strconv.Itoa(len(page)))
		if r.Method == http.MethodHead {
			return
		}
		w.Write(page)
	})
}
