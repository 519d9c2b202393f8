// SPDX-License-Identifier: Apache-2.0

package analyze_test

import (
	"bufio"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/internal/tracegen"
)

// synthFiles writes a synthetic transfer into one trace, or into a
// sender's and a receiver's trace.
func synthFiles(t *testing.T, opts tracegen.Options, pair bool) []string {
	t.Helper()
	dir := t.TempDir()
	names := []string{"both.mgt"}
	if pair {
		names = []string{"sender.mgt", "receiver.mgt"}
	}
	var files []*os.File
	var ws []*bufio.Writer
	for _, n := range names {
		f, err := os.Create(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
		ws = append(ws, bufio.NewWriter(f))
	}
	var err error
	if pair {
		_, err = tracegen.WritePair(ws[0], ws[1], opts)
	} else {
		_, err = tracegen.Write(ws[0], opts)
	}
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for i, f := range files {
		if err := ws[i].Flush(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		paths = append(paths, f.Name())
	}
	return paths
}

// TestPathAcrossTraces follows every data segment of a synthetic transfer,
// whose every hop takes a known time, from the sender's TCP over the wire
// to the receiver's application: with both ends in one trace, in two traces
// of one machine, and in two traces of two machines whose clocks differ.
func TestPathAcrossTraces(t *testing.T) {
	opts := tracegen.Options{Events: 20000, Conns: 2, Hop: 3 * time.Microsecond, Wire: 25 * time.Microsecond}
	hop, wire := 3.0, 25.0
	// tcp_rcv→sock_recv is 3 hops in synth.
	names := []string{"tcp_xmit→ip_send", "ip_send→dev_queue", "dev_queue→dev_xmit", "dev_xmit→dev_recv", "dev_recv→ip_recv", "ip_recv→tcp_rcv", "tcp_rcv→sock_recv"}
	delays := []float64{hop, hop, hop, wire, hop, hop, 3 * hop}
	// Without a qdisc the segment goes from IP to the device's transmit.
	namesNoQueue := []string{"tcp_xmit→ip_send", "ip_send→dev_xmit", "dev_xmit→dev_recv", "dev_recv→ip_recv", "ip_recv→tcp_rcv", "tcp_rcv→sock_recv"}
	delaysNoQueue := []float64{hop, 2 * hop, wire, hop, hop, 3 * hop}
	cases := []struct {
		name      string
		pair      bool
		offset    time.Duration
		reverse   bool
		sameClock bool
		noQueue   bool
		oldDevice bool
	}{
		{"one trace", false, 0, false, true, false, false},
		{"two traces, one machine", true, 0, false, true, false, false},
		{"two traces, receiver first", true, 0, true, true, false, false},
		{"two machines", true, time.Hour + 123456789, false, false, false, false},
		{"no qdisc", true, 0, false, true, true, false},
		// Traces written before the device records carried the IP facts.
		{"old device records", true, 0, false, true, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := opts
			o.ReceiverClockOffset = c.offset
			o.NoQueue = c.noQueue
			o.OldDevice = c.oldDevice
			wantNames, want := names, delays
			if c.noQueue {
				wantNames, want = namesNoQueue, delaysNoQueue
			}
			paths := synthFiles(t, o, c.pair)
			if c.reverse {
				paths[0], paths[1] = paths[1], paths[0]
			}
			rep, err := analyze.Modulation(paths, 0)
			if err != nil {
				t.Fatal(err)
			}
			senders := 0
			for _, cr := range rep.Conns {
				p := cr.Path
				if cr.Conn.Local.Addr() != tracegen.SenderAddr {
					if p != nil {
						t.Errorf("receiving end %d has a path %+v: it sends pure ACKs only", cr.Conn.ID, p)
					}
					continue
				}
				senders++
				if p == nil {
					t.Fatalf("sending end %d: no path", cr.Conn.ID)
				}
				if p.Peer != cr.Conn.Peer || p.Peer != cr.Conn.ID+1 {
					t.Errorf("path to %d, connection's peer %d, want %d", p.Peer, cr.Conn.Peer, cr.Conn.ID+1)
				}
				if c.pair && p.PeerTrace != filepath.Base(paths[len(paths)-1-indexOf(paths, cr.Trace)]) {
					t.Errorf("peer trace %q", p.PeerTrace)
				}
				if p.SameClock != c.sameClock {
					t.Errorf("same clock %v, want %v", p.SameClock, c.sameClock)
				}
				if p.Segments == 0 || p.Segments != p.DataDeparted {
					t.Fatalf("%d of %d data packets followed end to end", p.Segments, p.DataDeparted)
				}
				if len(p.Hops) != len(want) {
					t.Fatalf("%d hops, want %d", len(p.Hops), len(want))
				}
				sum := 0.0
				for i, h := range p.Hops {
					if h.Hop != wantNames[i] || h.Count != p.Segments || math.Abs(h.Delay.Mean-want[i]) > 1e-9 || math.Abs(h.Delay.P99-want[i]) > want[i]*0.004 {
						t.Errorf("hop %s: %d segments, mean %v p99 %v µs, want %s %d %v", h.Hop, h.Count, h.Delay.Mean, h.Delay.P99, wantNames[i], p.Segments, want[i])
					}
					sum += h.Delay.Mean
				}
				if e := p.EndToEnd; e.Count != p.Segments || math.Abs(e.Delay.Mean-sum) > 1e-6 || math.Abs(sum-(5*hop+wire+3*hop)) > 1e-6 {
					t.Errorf("end to end: %d segments, mean %v µs; hops add up to %v", e.Count, e.Delay.Mean, sum)
				}
			}
			if senders != opts.Conns {
				t.Fatalf("%d sending ends reported, want %d", senders, opts.Conns)
			}
			hasWarning := false
			for _, w := range rep.Warnings {
				hasWarning = hasWarning || strings.Contains(w, "clock synchronisation")
			}
			if hasWarning == c.sameClock {
				t.Errorf("clock warning %v with same clock %v: %q", hasWarning, c.sameClock, rep.Warnings)
			}
		})
	}
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

// FuzzReportPair reports an arbitrary file together with a sender's trace
// (and exports both to Perfetto), so that pairing across traces and
// following segments over the wire meet whatever a file can say: they
// return a result or an error and never panic.
func FuzzReportPair(f *testing.F) {
	dir := f.TempDir()
	sender, receiver := filepath.Join(dir, "s.mgt"), filepath.Join(dir, "r.mgt")
	ws, err := os.Create(sender)
	if err != nil {
		f.Fatal(err)
	}
	wr, err := os.Create(receiver)
	if err != nil {
		f.Fatal(err)
	}
	if _, err := tracegen.WritePair(ws, wr, tracegen.Options{Events: 300, Conns: 1}); err != nil {
		f.Fatal(err)
	}
	ws.Close()
	wr.Close()
	seed, err := os.ReadFile(receiver)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)/2])
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "f.mgt")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		analyze.Modulation([]string{sender, path}, 0)
		for _, kind := range analyze.PairKinds {
			analyze.PlotPair(trace.Sources([]string{sender, path}), kind, analyze.PlotOptions{})
		}
		analyze.WritePerfetto(io.Discard, []string{path, sender})
	})
}
