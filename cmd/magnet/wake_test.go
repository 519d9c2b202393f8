// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// withIdleWakeUp copies the trace at src to dst, every record and the
// summary as they are, with the header's host_limits.idle_wakeup_ns set to
// ns: the recording as a host whose idle CPUs wake that slowly would have
// written it.
func withIdleWakeUp(t *testing.T, src, dst string, ns float64) {
	t.Helper()
	r, err := trace.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	h := *r.Header()
	h.Extra = map[string]any{}
	for k, v := range r.Header().Extra {
		h.Extra[k] = v
	}
	lim := map[string]any{}
	if old, ok := h.Extra["host_limits"].(map[string]any); ok {
		for k, v := range old {
			lim[k] = v
		}
	}
	lim["idle_wakeup_ns"] = ns
	h.Extra["host_limits"] = lim
	f, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := trace.NewWriter(f, &h, trace.WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Write(rec.Data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(r.Summary()); err != nil {
		t.Fatal(err)
	}
}

// A recorded trace carries the idle wake-up time the recorder measured of
// its host at start (hostcheck's figure, in host_limits), and magnet report
// warns about late receive timestamps exactly when that figure is over
// 10 µs: the demo's receiver idles 20 ms between messages, so its dev_recv
// events follow quiet periods. The figure is set in copies of the recorded
// trace, so that both sides of the threshold are tested on any host.
func TestReportSlowWakeWarning(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	rec := filepath.Join(dir, "demo.mgt")
	if d := magnet(t, "demo", "-o", rec); d.code != 0 {
		t.Fatalf("demo: %s", d.stderr)
	}
	r, err := trace.Open(rec)
	if err != nil {
		t.Fatal(err)
	}
	measured := r.Header().HostLimit("idle_wakeup_ns")
	r.Close()
	// hostcheck measures a wake-up from one CPU to another: with one CPU
	// there is no figure.
	if runtime.NumCPU() >= 2 && measured <= 0 {
		t.Fatalf("the recorded trace has no idle_wakeup_ns in host_limits (%d CPUs)", runtime.NumCPU())
	}
	t.Logf("recording host: idle wake-up %.0f ns", measured)

	for _, tc := range []struct {
		ns   float64
		warn bool
	}{{200e3, true}, {10e3, false}, {2e3, false}} {
		p := filepath.Join(dir, "wake.mgt")
		withIdleWakeUp(t, rec, p, tc.ns)
		res := magnet(t, "report", "--json", p)
		if res.code != 0 {
			t.Fatalf("report: %s", res.stderr)
		}
		var rep struct {
			Warnings []string `json:"warnings"`
		}
		if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
			t.Fatal(err)
		}
		var warning string
		for _, w := range rep.Warnings {
			if strings.Contains(w, "quiet periods") {
				warning = w
			}
		}
		if tc.warn {
			if !strings.Contains(warning, "dev_recv") || !strings.Contains(warning, "took 200 µs to wake") {
				t.Errorf("idle wake-up %.0f ns: warnings %q, want the slow-wake warning naming dev_recv and 200 µs", tc.ns, rep.Warnings)
			}
		} else if warning != "" {
			t.Errorf("idle wake-up %.0f ns (not over 10 µs): unexpected warning %q", tc.ns, warning)
		}
	}
}
