// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"

	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// WritePerfetto writes the traces as a Chrome/Perfetto JSON trace that
// ui.perfetto.dev opens: one process per trace (host), one track per layer
// of each TCP connection, a slice for the time each segment spent at each
// hop, flow arrows following each segment down the sender's stack and up
// the receiver's, and the application's send and receive calls as instants
// (MAGNET 2.0's NLV picture). It returns the number of trace events.
func WritePerfetto(out io.Writer, paths []string) (int, error) {
	return WritePerfettoOf(out, trace.Sources(paths))
}

// WritePerfettoOf is WritePerfetto of sources: files or chains of rotated
// files.
func WritePerfettoOf(out io.Writer, srcs []trace.Source) (int, error) {
	w := bufio.NewWriterSize(out, 256<<10)
	enc := &perfettoWriter{w: w, tracks: map[trackKey]int{}}
	if _, err := w.WriteString(`{"displayTimeUnit":"ns","traceEvents":[` + "\n"); err != nil {
		return 0, err
	}
	for si, src := range srcs {
		if err := enc.trace(si, src); err != nil {
			w.Flush()
			return enc.n, err
		}
	}
	if _, err := w.WriteString("\n]}\n"); err != nil {
		return enc.n, err
	}
	return enc.n, w.Flush()
}

type trackKey struct {
	pid   int
	conn  uint64
	layer string
}

type perfettoWriter struct {
	w      *bufio.Writer
	n      int
	tracks map[trackKey]int
	// flowsOut: segments whose previous slice already sent an arrow.
	flowsOut map[uint64]bool
}

func (p *perfettoWriter) emit(ev map[string]any) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if p.n > 0 {
		p.w.WriteString(",\n")
	}
	p.n++
	_, err = p.w.Write(b)
	return err
}

// layerOrder sorts a connection's tracks in the order data passes them.
var layerOrder = map[string]int{}

func init() {
	for i, l := range Layers {
		layerOrder[l] = i
	}
}

func (p *perfettoWriter) track(pid int, conn uint64, layer string) (int, error) {
	k := trackKey{pid, conn, layer}
	if tid, ok := p.tracks[k]; ok {
		return tid, nil
	}
	tid := len(p.tracks) + 1
	p.tracks[k] = tid
	if err := p.emit(map[string]any{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
		"args": map[string]any{"name": fmt.Sprintf("conn %d %s", conn, layer)}}); err != nil {
		return 0, err
	}
	return tid, p.emit(map[string]any{"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
		"args": map[string]any{"sort_index": int(conn%100000)*100 + layerOrder[layer]}})
}

func (p *perfettoWriter) trace(si int, src trace.Source) error {
	path := src.Name
	cs, err := connTable(src)
	if err != nil {
		return err
	}
	tcp := map[uint64]bool{}
	for _, c := range cs {
		tcp[c.ID] = c.Proto == "tcp"
	}
	r, err := src.Open()
	if err != nil {
		return err
	}
	defer r.Close()
	h := r.Header()
	pid := si + 1
	if err := p.emit(map[string]any{"ph": "M", "name": "process_name", "pid": pid,
		"args": map[string]any{"name": fmt.Sprintf("%s (%s)", h.Host, filepath.Base(path))}}); err != nil {
		return err
	}
	us := func(t uint64) float64 { return float64(int64(t)+h.Clock.WallOffsetNs) / 1e3 }
	trackers := map[uint64]*hopTracker{}
	p.flowsOut = map[uint64]bool{}
	var emitErr error
	err = export.Walk(path, r, func(_ *export.Resolver, rec trace.Record) error {
		c, name := rec.Conn(), rec.Type.Name
		if c == 0 || !tcp[c] {
			return nil
		}
		if name == "sock_send" || name == "sock_recv" {
			tid, err := p.track(pid, c, name)
			if err != nil {
				return err
			}
			if err := p.emit(map[string]any{"ph": "i", "s": "t", "name": name, "pid": pid, "tid": tid,
				"ts": us(rec.Time()), "args": map[string]any{"bytes": rec.Size()}}); err != nil {
				return err
			}
		}
		if !hopTypes[name] {
			return nil
		}
		ht := trackers[c]
		if ht == nil {
			ht = newHopTracker()
			conn := c
			ht.OnHop = func(hop string, from, to, seg uint64) {
				if emitErr == nil {
					emitErr = p.hopSlice(pid, conn, hop, us(from), us(to), seg)
				}
			}
			trackers[c] = ht
		}
		seq, _ := rec.Uint("seq")
		ht.add(hopEvent{t: rec.Time(), typ: name, size: rec.Size(), seq: uint32(seq), flags: rec.Flags()})
		return emitErr
	})
	if err != nil {
		return err
	}
	for _, ht := range trackers {
		ht.finish(false)
	}
	return emitErr
}

// hopSlice draws the time a segment spent between two layers on the track
// of the layer it left, linked by a flow arrow to its previous hop.
func (p *perfettoWriter) hopSlice(pid int, conn uint64, hop string, from, to float64, seg uint64) error {
	layer := hopFrom[hop]
	tid, err := p.track(pid, conn, layer)
	if err != nil {
		return err
	}
	id := uint64(pid)<<48 | conn<<20 | seg
	ev := map[string]any{"ph": "X", "name": hop, "cat": "segment", "pid": pid, "tid": tid,
		"ts": from, "dur": to - from, "bind_id": id, "flow_out": true, "args": map[string]any{"segment": seg}}
	if p.flowsOut[id] {
		ev["flow_in"] = true
	}
	p.flowsOut[id] = true
	return p.emit(ev)
}

var hopFrom = map[string]string{
	"tcp_xmit→ip_send": "tcp_xmit", "ip_send→dev_queue": "ip_send", "dev_queue→dev_xmit": "dev_queue",
	"dev_recv→ip_recv": "dev_recv", "ip_recv→tcp_rcv": "ip_recv", "tcp_rcv→sock_recv": "tcp_rcv",
}
