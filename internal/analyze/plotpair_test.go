// SPDX-License-Identifier: Apache-2.0

package analyze_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/internal/tracegen"
)

// A generated sender's and receiver's trace: e2e pairs the ends, both
// curves rise to the bytes their end's socket layer moved, and e2e-delay has one point
// per segment the report follows end to end, the receiver's delay never
// above the whole.
func TestPlotPair(t *testing.T) {
	dir := t.TempDir()
	sender, receiver := filepath.Join(dir, "s.mgt"), filepath.Join(dir, "r.mgt")
	ws, err := os.Create(sender)
	if err != nil {
		t.Fatal(err)
	}
	wr, err := os.Create(receiver)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tracegen.WritePair(ws, wr, tracegen.Options{Events: 2000, Conns: 1}); err != nil {
		t.Fatal(err)
	}
	ws.Close()
	wr.Close()
	srcs := trace.Sources([]string{sender, receiver})

	fig, err := analyze.PlotPair(srcs, "e2e", analyze.PlotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(fig.Series) != 2 || len(fig.Series[0].Y) == 0 || len(fig.Series[1].Y) == 0 {
		t.Fatalf("e2e series %+v", fig.Series)
	}
	rep, err := analyze.Modulation([]string{sender, receiver}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var segments uint64
	for _, c := range rep.Conns {
		if c.Path != nil {
			segments += c.Path.Segments
		}
	}
	// Each curve ends at its end's sock_send or sock_recv bytes, as the
	// report's layer table counts them.
	layerBytes := map[string]int64{}
	for _, c := range rep.Conns {
		for _, l := range c.Layers {
			if l.Layer == "sock_send" || l.Layer == "sock_recv" {
				layerBytes[l.Layer] += l.Bytes
			}
		}
	}
	wrote, read := fig.Series[0].Y[len(fig.Series[0].Y)-1], fig.Series[1].Y[len(fig.Series[1].Y)-1]
	if wrote != float64(layerBytes["sock_send"])/1e6 || read != float64(layerBytes["sock_recv"])/1e6 || wrote <= 0 || read <= 0 {
		t.Errorf("e2e curves end at %v and %v MB; the report's sock_send and sock_recv layers %v", wrote, read, layerBytes)
	}

	fig, err = analyze.PlotPair(srcs, "e2e-delay", analyze.PlotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	total, recv := fig.Series[0], fig.Series[1]
	if segments == 0 || uint64(len(total.Y)) != segments || len(recv.Y) != len(total.Y) {
		t.Fatalf("%d and %d points, the report followed %d segments", len(total.Y), len(recv.Y), segments)
	}
	for i := range total.Y {
		if recv.Y[i] < 0 || recv.Y[i] > total.Y[i] {
			t.Fatalf("segment %d: receiver's delay %v ms of %v ms", i, recv.Y[i], total.Y[i])
		}
	}
}

// Traces with no connection in common, or one trace without both ends, or
// napi asked of a trace without it: an error saying so.
func TestPlotPairErrors(t *testing.T) {
	const be = "../../testdata/bigendian.mgt"
	for _, c := range []struct {
		err  func() error
		want string
	}{
		{func() error {
			_, err := analyze.PlotPair(trace.Sources([]string{be}), "e2e", analyze.PlotOptions{})
			return err
		}, "no connection has both its ends in"},
		{func() error {
			_, err := analyze.PlotPair(trace.Sources([]string{be}), "srtt", analyze.PlotOptions{})
			return err
		}, "unknown two-end plot kind"},
		{func() error { _, err := analyze.PlotNapi(trace.Sources([]string{be})[0]); return err }, "record with --groups default,napi"},
	} {
		if err := c.err(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want %q", err, c.want)
		}
	}
}
