// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/magnet-tracer/magnet/internal/sendbuf"
)

// perfettoConn is what the Perfetto export follows of a TCP connection
// end for its counters.
type perfettoConn struct {
	sbuf       sendbuf.Tracker
	haveSndUna bool // tcp_state carries snd_una
}

// cpuRun is the thread a CPU runs since its last context switch.
type cpuRun struct {
	since uint64
	tid   uint32
}

// cpuTrack is the first thread id of the CPU tracks: apart from the
// connections' tracks (numbered from 1) and the kernel events' (1<<20).
const cpuTrack = 1 << 21

// counters updates a TCP connection end's counters with the event e:
// cwnd and srtt at each tcp_state, the send buffer whenever it changes,
// as the report's connDetail follows it.
func (p *perfettoWriter) counters(cs *connState, e *ev) {
	pc := cs.pf
	if pc == nil {
		return
	}
	changed := false
	switch e.kind {
	case kSockSend:
		changed = e.size > 0 && pc.sbuf.AppWrote(int64(e.size))
	case kTCPXmit:
		changed = pc.sbuf.Sent(e.a, int64(e.size), e.flags&0x02 != 0)
	case kTCPRcv:
		changed = e.flags&0x10 != 0 && pc.sbuf.Acked(e.b)
	case kConnClose:
		changed = pc.sbuf.AckedBytes(int64(e.b)<<32 | int64(e.c))
	case kTCPState:
		changed = pc.haveSndUna && pc.sbuf.Acked(e.d)
		p.counter(cs, "cwnd", e.t, "segments", int64(e.a))
		p.counter(cs, "srtt", e.t, "us", int64(e.b))
	}
	if changed {
		p.counter(cs, "send buffer", e.t, "bytes", pc.sbuf.Occupancy())
	}
}

// counter writes one value of a connection end's counter track name.
func (p *perfettoWriter) counter(cs *connState, name string, t uint64, unit string, v int64) {
	b := append(p.buf[:0], `{"ph":"C","name":"conn `...)
	b = strconv.AppendUint(b, cs.id, 10)
	b = append(b, ' ')
	b = append(b, name...)
	b = append(b, `","pid":`...)
	b = strconv.AppendInt(b, int64(cs.src.index+1), 10)
	b = append(b, `,"ts":`...)
	b = p.appendUs(b, t)
	b = append(b, `,"args":{"`...)
	b = append(b, unit...)
	b = append(b, `":`...)
	b = strconv.AppendInt(b, v, 10)
	b = append(b, "}}"...)
	p.emit(b)
}

// udpMark draws an event of a UDP socket as an instant on the socket's
// track of that layer, with its size.
func (p *perfettoWriter) udpMark(cs *connState, e *ev) {
	if _, ok := e.kind.layer(); !ok {
		return
	}
	tid := p.track(cs, e.kind)
	b := append(p.buf[:0], `{"ph":"i","s":"t","name":"`...)
	b = append(b, kindNames[e.kind]...)
	b = append(b, `","cat":"udp","pid":`...)
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

// cpuSlice follows a CPU through a context switch: the thread that ran
// on it since the previous switch gets a slice up to now, named for its
// task. A loss of sched events forgets what every CPU of the trace runs:
// the next switch starts afresh.
func (p *perfettoWriter) cpuSlice(src *source, e *ev) {
	if p.cpus == nil {
		p.cpus = map[[2]int]cpuRun{}
	}
	if e.kind == kSchedLoss {
		for k := range p.cpus {
			if k[0] == src.index {
				delete(p.cpus, k)
			}
		}
		return
	}
	k := [2]int{src.index, int(e.cpu)}
	run, ok := p.cpus[k]
	p.cpus[k] = cpuRun{since: e.t, tid: e.a}
	if !ok {
		p.meta(map[string]any{"ph": "M", "name": "thread_name", "pid": src.index + 1, "tid": cpuTrack + int(e.cpu),
			"args": map[string]any{"name": fmt.Sprintf("CPU %d", e.cpu)}})
		p.meta(map[string]any{"ph": "M", "name": "thread_sort_index", "pid": src.index + 1, "tid": cpuTrack + int(e.cpu),
			"args": map[string]any{"sort_index": -1000 + int(e.cpu)}})
		return // what ran before the first switch seen is not known
	}
	// The switch names the thread it takes off the CPU: its own tid.
	tid := e.tid
	name := "idle"
	pid, comm, known := src.rs.Task(tid)
	if tid != 0 {
		name = fmt.Sprintf("tid %d", tid)
		if known {
			name = fmt.Sprintf("%s %d", comm, tid)
		}
	}
	qn, _ := json.Marshal(name)
	b := append(p.buf[:0], `{"ph":"X","name":`...)
	b = append(b, qn...)
	b = append(b, `,"cat":"sched","pid":`...)
	b = strconv.AppendInt(b, int64(src.index+1), 10)
	b = append(b, `,"tid":`...)
	b = strconv.AppendInt(b, int64(cpuTrack+int(e.cpu)), 10)
	b = append(b, `,"ts":`...)
	b = p.appendUs(b, run.since)
	b = append(b, `,"dur":`...)
	b = p.appendUs(b, p.start+(max(e.t, run.since)-run.since))
	b = append(b, `,"args":{"tid":`...)
	b = strconv.AppendUint(b, uint64(tid), 10)
	b = append(b, `,"pid":`...)
	b = strconv.AppendUint(b, uint64(pid), 10)
	b = append(b, `,"expected_tid":`...)
	b = strconv.AppendUint(b, uint64(run.tid), 10)
	b = append(b, "}}"...)
	p.emit(b)
}
