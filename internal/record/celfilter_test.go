// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/evselect"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// celEvent is what the comparison looks at of an event: not its time,
// which each recorder's own program run takes.
type celEvent struct {
	name string
	conn uint64
	tid  uint32
	size int32
	cpu  uint16
}

// celEvents reads the events of path (control records aside) made up to
// cut, selected by expr as the readers select them ("" = all).
func celEvents(t *testing.T, path, expr string, cut uint64) []celEvent {
	t.Helper()
	in := []trace.Source{{Name: path, Paths: []string{path}}}
	if expr != "" {
		s, err := evselect.New(in, evselect.Options{Expr: expr})
		if err != nil {
			t.Fatal(err)
		}
		s.Apply(in)
	}
	r, err := in[0].Open()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var evs []celEvent
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Type.Name == "lost" {
			t.Fatalf("%s: events lost: equality needs every event", path)
		}
		if evselect.Control(rec.Type.Name) || rec.Time() > cut {
			continue
		}
		evs = append(evs, celEvent{rec.Type.Name, rec.Conn(), rec.TID(), rec.Size(), rec.CPU()})
	}
	return evs
}

// byCPU orders evs by CPU, keeping each CPU's own order.
func byCPU(evs []celEvent) {
	slices.SortStableFunc(evs, func(a, b celEvent) int { return int(a.cpu) - int(b.cpu) })
}

// TestCELFilterEqualsOffline records the same traffic with and without
// --filter, in the same run: the filtered trace holds exactly the events
// the readers' --filter selects from the unfiltered one, and every event
// produced is written, lost or counted as filtered.
func TestCELFilterEqualsOffline(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgcel", RateMbit: 200})
	exprs := []string{
		"size > 1000",
		`comm == "magnet" && size > 100`,
	}
	groups := event.DefaultGroups
	all := startRecording(t, record.Config{Groups: groups, Filters: record.Filters{NetNS: lab.Server.NS}})
	var recs []*recording
	for _, x := range exprs {
		recs = append(recs, startRecording(t, record.Config{Groups: groups, Filters: record.Filters{NetNS: lab.Server.NS, CEL: x}}))
	}
	addr := fmt.Sprintf("%s:%d", lab.Server.Addr, uniquePort())
	srv, srvOut := serve(t, lab, lab.Server, "--listen", addr, "--count", "50", "--size", "10000")
	// Sizes on both sides of the expressions' bounds.
	run(t, lab.Command(lab.Client, magnetBin, "workload", "send", "--to", addr, "--count", "50", "--size", "10000", "--interval", "1ms"))
	srvOut.Scan()
	srv.Wait()
	// The lab is quiet once its programs have exited: the events up to
	// now are in every trace.
	time.Sleep(200 * time.Millisecond)
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	cut := uint64(ts.Nano())
	allRes := all.stop(t)
	var res []*record.Result
	for _, r := range recs {
		res = append(res, r.stop(t))
	}
	checkAccounting(t, "unfiltered", allRes)
	if allRes.Filtered != 0 {
		t.Errorf("unfiltered: %d events counted as filtered", allRes.Filtered)
	}
	u := celEvents(t, all.path, "", cut)
	for i, x := range exprs {
		want := celEvents(t, all.path, x, cut)
		got := celEvents(t, recs[i].path, "", cut)
		if len(want) == 0 || len(want) == len(u) {
			t.Fatalf("%q selects %d of %d events: the test needs it to select some and leave some", x, len(want), len(u))
		}
		// Each recorder stamps its own program runs, so events of two CPUs
		// a few nanoseconds apart can merge in either order; on one CPU
		// the recorders' programs run back to back and the order is exact.
		byCPU(got)
		byCPU(want)
		if !slices.Equal(got, want) {
			t.Errorf("%q: the filtered trace has %d events, the readers select %d of the unfiltered trace's %d", x, len(got), len(want), len(u))
			for j := range min(len(got), len(want)) {
				if got[j] != want[j] {
					t.Errorf("first difference at %d: got %+v, want %+v", j, got[j], want[j])
					break
				}
			}
		}
		checkAccounting(t, x, res[i])
		t.Logf("%q: %d of %d events written; filtered %v", x, len(got), len(u), res[i].FilteredBy)
		if res[i].Filtered == 0 {
			t.Errorf("%q: no event counted as filtered", x)
		}
		r, err := trace.Open(recs[i].path)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Header().Settings.Filters["cel"]; got != x {
			t.Errorf("%q: the header's filters say cel %q", x, got)
		}
		for {
			if _, err := r.Next(); err != nil {
				break
			}
		}
		if r.Summary() == nil {
			t.Fatalf("%q: the trace has no summary", x)
		}
		fb, _ := r.Summary().Extra["filtered_by_type"].(map[string]any)
		for name, n := range res[i].FilteredBy {
			if v, _ := fb[name].(float64); uint64(v) != n {
				t.Errorf("%q: the trace's summary says %v %s events filtered, the recording %d", x, fb[name], name, n)
			}
		}
		r.Close()
	}
}

// checkAccounting asserts produced == written + lost + filtered for every
// event type the BPF side produced.
func checkAccounting(t *testing.T, what string, res *record.Result) {
	t.Helper()
	if len(res.Produced) == 0 {
		t.Fatalf("%s: nothing produced", what)
	}
	for name, p := range res.Produced {
		if w, l, f := res.Events[name], res.LostBy[name], res.FilteredBy[name]; p != w+l+f {
			t.Errorf("%s: %s: produced %d, written %d + lost %d + filtered %d", what, name, p, w, l, f)
		}
	}
}

// TestCELFilterBadFieldKeepsOutput: a --filter naming a field no event has
// is refused before the output is created, so the file already at -o (an
// earlier recording) is left as it was. Needs no privileges: the check
// comes first.
func TestCELFilterBadFieldKeepsOutput(t *testing.T) {
	out := filepath.Join(t.TempDir(), "earlier.mgt")
	want := []byte("an earlier recording\n")
	if err := os.WriteFile(out, want, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := record.Run(context.Background(), record.Config{
		Output: out, Groups: event.DefaultGroups, BufferBytes: 1 << 20,
		Filters: record.Filters{CEL: "size > 0 && fields.srtt > 1"},
	})
	if want := `--filter: column 20: no event in the traces has a field "srtt"`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("record --filter with fields.srtt: %v, want %q", err, want)
	}
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, want) {
		t.Errorf("the file at -o is now %q (%v), was %q", got, err, want)
	}
}
