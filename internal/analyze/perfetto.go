// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"time"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// WritePerfetto writes the traces as a Chrome/Perfetto JSON trace that
// ui.perfetto.dev opens: one process per trace (host), one track per layer
// of each TCP connection, a slice for the time each segment spent at each
// hop, flow arrows following each segment down the sender's stack, over the
// wire to the receiver (when both ends are in the traces) and up its stack,
// and the application's send and receive calls as instants (MAGNET 2.0's
// NLV picture). Each TCP connection end also has counters of its
// congestion window and smoothed RTT (from tcp_state) and of its send
// buffer's occupancy (written minus acknowledged, as the report counts
// it); a UDP socket has a track per layer with an instant per event; with
// sched events, each CPU of each trace has a track of slices, one per
// thread that ran on it between two context switches. Times are
// microseconds since the first event, on the common timeline of the
// traces. It returns the number of trace events.
func WritePerfetto(out io.Writer, paths []string) (int, error) {
	return WritePerfettoOf(out, trace.Sources(paths))
}

// WritePerfettoOf is WritePerfetto of sources: files or chains of rotated
// files.
func WritePerfettoOf(out io.Writer, ins []trace.Source) (int, error) {
	s, err := openStream(ins)
	if err != nil {
		return 0, err
	}
	defer s.close()
	w := bufio.NewWriterSize(out, 256<<10)
	p := &perfettoWriter{w: w, tracks: map[trackKey]int{}}
	wall := s.srcs[0].h.Clock.WallOffsetNs
	if _, err := w.WriteString(`{"displayTimeUnit":"ns","traceEvents":[` + "\n"); err != nil {
		return 0, err
	}
	for _, src := range s.srcs {
		p.meta(map[string]any{"ph": "M", "name": "process_name", "pid": src.index + 1,
			"args": map[string]any{"name": fmt.Sprintf("%s (%s)", src.h.Host, filepath.Base(src.path))}})
	}
	s.newConn = func(cs *connState) {
		cs.hops = newHopTracker(cs)
		cs.hops.onHop = p.hopSlice
		cs.pf = &perfettoConn{haveSndUna: cs.src.dec.d[kTCPState].size > 0}
	}
	var kev []kernelMark
	s.onOther = func(i int, _ uint64, rec trace.Record) {
		if m, ok := kernelMarkOf(s.srcs[i], rec); ok {
			kev = append(kev, m)
		}
	}
	s.onEvent = func(e *ev) {
		if !p.started {
			p.start, p.started, p.connEvents = e.t, true, true
		}
		if p.err != nil {
			return
		}
		if e.kind == kSchedSwitch || e.kind == kSchedLoss {
			p.cpuSlice(s.srcs[e.src], e)
			return
		}
		cs := e.cs
		if cs == nil {
			return
		}
		if cs.notTCP {
			p.udpMark(cs, e)
			return
		}
		p.counters(cs, e)
		if e.kind == kSockSend || e.kind == kSockRecv {
			tid := p.track(cs, e.kind)
			b := append(p.buf[:0], `{"ph":"i","s":"t","name":"`...)
			b = append(b, kindNames[e.kind]...)
			b = append(b, `","pid":`...)
			b = strconv.AppendInt(b, int64(cs.src.index+1), 10)
			b = append(b, `,"tid":`...)
			b = strconv.AppendInt(b, int64(tid), 10)
			b = append(b, `,"ts":`...)
			b = p.appendUs(b, e.t)
			b = append(b, `,"args":{"bytes":`...)
			b = strconv.AppendInt(b, int64(e.size), 10)
			b = append(b, "}}"...)
			p.emit(b)
		}
		cs.hops.step(e)
	}
	err = s.run()
	if err == nil {
		p.kernelMarks(kev)
		err = p.err
	}
	if err != nil {
		w.Flush()
		return p.n, err
	}
	var start string
	if p.started {
		start = time.Unix(0, int64(p.start)+wall).UTC().Format(time.RFC3339Nano)
	}
	var names []string
	for _, in := range ins {
		names = append(names, in.Name)
	}
	other, _ := json.Marshal(map[string]any{"magnet_traces": names, "time_zero_utc": start})
	if _, err := fmt.Fprintf(w, "\n],\"otherData\":%s}\n", other); err != nil {
		return p.n, err
	}
	return p.n, w.Flush()
}

type trackKey struct {
	cs    *connState
	layer kind
}

type perfettoWriter struct {
	w       *bufio.Writer
	n       int
	tracks  map[trackKey]int
	buf     []byte
	start   uint64
	started bool
	// connEvents: start is the first connection event's time (emitted
	// relative to it), not a kernel event's.
	connEvents bool
	err        error
	nums       map[*connState]uint64
	// cpus: per trace and CPU, the thread running since the last context
	// switch (sched_switch), whose slice the next switch ends
	cpus map[[2]int]cpuRun
}

func (p *perfettoWriter) emit(b []byte) {
	if p.err != nil {
		return
	}
	if p.n > 0 {
		p.w.WriteString(",\n")
	}
	p.n++
	p.buf = b
	_, p.err = p.w.Write(b)
}

func (p *perfettoWriter) meta(ev map[string]any) {
	b, err := json.Marshal(ev)
	if err != nil {
		p.err = err
		return
	}
	p.emit(b)
	p.buf = nil // b is not ours to reuse
}

// appendUs appends the time t as microseconds since the first event, to
// the nanosecond.
func (p *perfettoWriter) appendUs(b []byte, t uint64) []byte {
	d := int64(t) - int64(p.start)
	if d < 0 {
		b = append(b, '-')
		d = -d
	}
	b = strconv.AppendInt(b, d/1000, 10)
	b = append(b, '.')
	frac := d % 1000
	b = append(b, byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10))
	return b
}

// track returns the thread id of a connection end's layer, declaring it the
// first time: named after the connection and layer, sorted in the order
// data passes the layers.
func (p *perfettoWriter) track(cs *connState, layer kind) int {
	k := trackKey{cs, layer}
	if tid, ok := p.tracks[k]; ok {
		return tid
	}
	tid := len(p.tracks) + 1
	p.tracks[k] = tid
	pid := cs.src.index + 1
	p.meta(map[string]any{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
		"args": map[string]any{"name": fmt.Sprintf("conn %d %s", cs.id, kindNames[layer])}})
	li, _ := layer.layer()
	p.meta(map[string]any{"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
		"args": map[string]any{"sort_index": int(cs.id%100000)*100 + li}})
	return tid
}

// flowID names a segment's chain of slices: its first connection end and
// its number there.
func (p *perfettoWriter) flowID(ref segRef) uint64 {
	if p.nums == nil {
		p.nums = map[*connState]uint64{}
	}
	n, ok := p.nums[ref.cs]
	if !ok {
		n = uint64(len(p.nums) + 1)
		p.nums[ref.cs] = n
	}
	return n<<40 | ref.seg&(1<<40-1)
}

// hopFrom is the layer a hop leaves, whose track shows the time spent in it.
var hopFrom = [numHops]kind{kTCPXmit, kIPSend, kTCPXmit, kDevQueue, kIPSend, kTCPXmit, kDevXmit, kDevRecv, kIPRecv, kDevRecv, kTCPRcv}

// hopSlice draws the time a segment spent between two layers on the track
// of the layer it left, linked by a flow arrow to its previous hop: the
// first hop of a chain starts the arrow (tcp_xmit→ip_send, or without the
// IP layer tcp_xmit→dev_*, on the sender; dev_recv→ip_recv or dev_recv→tcp_rcv
// on a receiver whose sender is not in the traces).
func (p *perfettoWriter) hopSlice(at *connState, hop int, from, to uint64, ref segRef) {
	tid := p.track(at, hopFrom[hop])
	first := hop == hopXmitIP || hop == hopXmitQueue || hop == hopXmitDev ||
		(hop == hopRecvIP || hop == hopRecvTCP) && ref.cs == at
	b := append(p.buf[:0], `{"ph":"X","name":"`...)
	b = append(b, hopNames[hop]...)
	b = append(b, `","cat":"segment","pid":`...)
	b = strconv.AppendInt(b, int64(at.src.index+1), 10)
	b = append(b, `,"tid":`...)
	b = strconv.AppendInt(b, int64(tid), 10)
	b = append(b, `,"ts":`...)
	b = p.appendUs(b, from)
	b = append(b, `,"dur":`...)
	b = p.appendUs(b, p.start+(to-from))
	b = append(b, `,"bind_id":`...)
	b = strconv.AppendUint(b, p.flowID(ref), 10)
	b = append(b, `,"flow_out":true`...)
	if !first {
		b = append(b, `,"flow_in":true`...)
	}
	b = append(b, `,"args":{"segment":`...)
	b = strconv.AppendUint(b, ref.seg, 10)
	b = append(b, `,"conn":`...)
	b = strconv.AppendUint(b, ref.cs.id, 10)
	b = append(b, "}}"...)
	p.emit(b)
}
