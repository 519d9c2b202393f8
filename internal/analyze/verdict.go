// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"fmt"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// Verdict answers "why did this transfer not go faster" for the end of a
// connection that sent data: the share of the transfer's time each limit
// held, from the sender's own events, with the figures behind each share.
//
// The transfer's time runs from the application's first write to the
// moment the last byte it wrote was acknowledged; idle time after that (the
// connection open, nothing written) is not the transfer's. At every moment
// of it the sender is in one state, decided from what was written
// (sock_send), sent (tcp_xmit), acknowledged (tcp_rcv, tcp_state) and the
// windows of the latest tcp_state snapshot:
//
//   - app_limited: nothing unacknowledged; or nothing left unsent, no
//     write call under way, and everything acknowledged before the next
//     call sent anything: the application had nothing for TCP to send;
//   - sndbuf_limited: nothing left unsent while a write call is under way
//     (TCP sent bytes no returned call accounts for), or between calls
//     when the last call failed for want of space (EAGAIN: a non-blocking
//     writer waits for the socket to turn writable) or the next call sent
//     before everything was acknowledged: the application's write waited
//     for buffer space freed by ACKs;
//   - rwnd_limited: data waiting, and the next segment would pass the
//     peer's advertised window (snd_una + snd_wnd);
//   - cwnd_limited: data waiting, the peer's window open: the congestion
//     window and the path decide (the kernel's "busy"). CwndFullShare says
//     how much of it the bytes in flight filled cwnd; the rest TCP held
//     back on its own (TSO deferral, pacing, data written an instant ago).
//
// The kernel keeps a coarser version of the same ledger per socket
// (tcpi_busy_time, tcpi_rwnd_limited, tcpi_sndbuf_limited; `ss -ti`); the
// tests compare the two.
type Verdict struct {
	// Limit is the state that held the largest share of the time.
	Limit string `json:"limit"`
	// Why is one sentence saying it, with the figure that backs it.
	Why string `json:"why"`
	// TransferS is the transfer's time, seconds; Shares split it.
	TransferS float64            `json:"transfer_s"`
	Shares    map[string]float64 `json:"shares"`
	// Evidence: one line per figure behind a share.
	Evidence []string `json:"evidence,omitempty"`
	// RecoveryShare is the share of the transfer in loss recovery (ca_state
	// Recovery or Loss), RetransSegs the segments retransmitted.
	RecoveryShare float64 `json:"recovery_share"`
	// CwndFullShare: the share of the transfer the bytes in flight filled
	// the congestion window.
	CwndFullShare float64 `json:"cwnd_full_share"`
	RetransSegs   uint64  `json:"retransmitted_segments"`
	// Receiver, when the peer's end is in the traces: where the data's time
	// at the receiver went.
	Receiver *TimeShare `json:"receiver,omitempty"`
	// Missing names the event groups whose absence kept a verdict, or part
	// of one, from being made.
	Missing []string `json:"missing,omitempty"`
}

// The states of the sender, in the order the report lists them.
const (
	vUnknown = iota // before the first snapshot: windows not known
	vApp
	vSndbuf
	vRwnd
	vCwnd
	vStates
	// vBetween: nothing unsent, something unacknowledged, no write call
	// under way that sent anything. sock_send fires when a call returns,
	// so a writer whose next call blocked at once on a full buffer looks
	// the same as one that paused. The time is held until it is known:
	// the application's if everything is acknowledged before more is
	// sent, the send buffer's if the next call sends first.
	vBetween = vStates
)

var verdictNames = [vStates]string{"unknown", "app_limited", "sndbuf_limited", "rwnd_limited", "cwnd_limited"}

// tcpSnap is the part of a tcp_state record the verdict needs.
type tcpSnap struct {
	cwnd, sndWnd, sndUna, sndNxt, packetsOut, mss uint32
	caState                                       uint8
}

// snapFields places tcpSnap's fields in a trace's tcp_state records.
type snapFields struct {
	ok                                                  bool
	cwnd, sndWnd, sndUna, sndNxt, packetsOut, mss, caSt fld
}

// newSnapFields finds tcp_state's fields in a trace's dictionary; ok is
// false when the trace lacks the event or the windows.
func newSnapFields(h *trace.Header) snapFields {
	var s snapFields
	t := h.TypeByName("tcp_state")
	if t == nil {
		return s
	}
	get := func(name string) fld {
		if f, ok := t.Field(name); ok && f.Size <= 8 {
			return fld{f.Offset, f.Size}
		}
		return fld{}
	}
	s.cwnd, s.sndWnd, s.sndUna, s.sndNxt = get("cwnd"), get("snd_wnd"), get("snd_una"), get("snd_nxt")
	s.packetsOut, s.mss, s.caSt = get("packets_out"), get("mss"), get("ca_state")
	s.ok = s.cwnd.size > 0 && s.sndWnd.size > 0 && s.sndUna.size > 0 && s.sndNxt.size > 0 && s.mss.size > 0
	return s
}

func (s *snapFields) read(b []byte) *tcpSnap {
	if !s.ok {
		return nil
	}
	return &tcpSnap{cwnd: uint32(s.cwnd.get(b)), sndWnd: uint32(s.sndWnd.get(b)), sndUna: uint32(s.sndUna.get(b)),
		sndNxt: uint32(s.sndNxt.get(b)), packetsOut: uint32(s.packetsOut.get(b)), mss: uint32(s.mss.get(b)), caState: uint8(s.caSt.get(b))}
}

// eagain is Linux's EAGAIN (EWOULDBLOCK): a non-blocking call that would
// have had to wait.
const eagain = 11

// caRecovery and caLoss are the kernel's TCP_CA_Recovery and TCP_CA_Loss.
const (
	caRecovery = 3
	caLoss     = 4
)

// verdictTracker follows one connection end's sender state in time order.
type verdictTracker struct {
	// written: bytes the application wrote. sock_send fires when the call
	// returns, after the segments a synchronous send caused, so it is
	// also raised to what TCP sent; calls is the sum of the calls.
	written, calls int64
	sent, acked    int64 // relative to base
	base           uint32
	haveBase       bool
	snap           tcpSnap
	haveSnap       bool
	// edge: the peer's window's right edge (relative to base), the
	// furthest any ACK or snapshot showed. Linux never moves it back (it
	// does not shrink windows), so the furthest is the current one.
	// edgeStale: the sender was seen sending past it, which TCP never
	// does, so ACKs moved it unseen (after close(), in FIN_WAIT1, or in
	// CLOSE_WAIT, tcp_probe does not fire; sockops writes their tcp_rcv,
	// but not for a connection established before recording started).
	edge      int64
	haveEdge  bool
	edgeStale bool
	maxOcc    int64
	maxFlight int64
	cwndFull  uint64
	between   uint64 // vBetween time not yet given to a state
	// wantSpace: the last write call failed with EAGAIN, the buffer full.
	// A non-blocking writer (Go's, any event loop's) then waits for the
	// socket to turn writable; the kernel says so only once a share of
	// the buffer is free, and when ACKs come in a burst (a loaded host
	// processes them late, together) that is once all is acknowledged.
	wantSpace        bool
	started          bool
	last             uint64
	spent            [vStates]uint64
	idle             uint64 // nothing unacknowledged since idleFrom: app-limited if more is written
	recovery         uint64
	idleGaps         uint64
	longestIdle      uint64
	curIdle          uint64
	rwndAt, inflight Dist // during rwnd-limited time: snd_wnd, and bytes in flight, at each event
	cwndAt           Dist // during cwnd-limited time: cwnd, segments
	sawSend, sawXmit bool
}

func (v *verdictTracker) rel(seq uint32) int64 { return int64(seq - v.base) }

// class is the sender's state now.
func (v *verdictTracker) class() int {
	occ := v.written - v.acked
	if v.haveBase && occ <= 0 {
		return vApp
	}
	if !v.haveBase {
		return vUnknown
	}
	mss := int64(v.snap.mss)
	if mss <= 0 {
		mss = 1448 // before the first snapshot: Ethernet's
	}
	if v.written-v.sent >= mss {
		if !v.haveSnap {
			return vUnknown
		}
		// The right edge comes from each ACK's window (tcp_rcv's wnd);
		// in traces without it, from snapshots alone, which are taken
		// before their ACK is processed and at most every 4 ms, so the
		// edge lags and a little cwnd-bound time counts here.
		if v.edgeStale {
			return vUnknown
		}
		if v.haveEdge && v.sent+mss > v.edge {
			return vRwnd
		}
		return vCwnd
	}
	// Nothing unsent. A write call is under way when TCP sent bytes no
	// returned call accounts for: it waits for buffer space. Between calls
	// it is not known yet: see vBetween.
	if v.sent > v.calls || v.wantSpace {
		return vSndbuf
	}
	return vBetween
}

// observe takes one event of the connection end, in time order.
func (v *verdictTracker) observe(e *ev) {
	if v.started && e.t > v.last {
		dt := e.t - v.last
		c := v.class()
		if c == vBetween {
			v.between += dt
		} else if c == vApp && v.written-v.acked <= 0 {
			// Nothing unacknowledged: the application's if it writes again,
			// the connection's tail if it never does.
			v.idle += dt
			v.curIdle += dt
		} else {
			v.spent[c] += dt
		}
		if v.haveSnap && (v.snap.caState == caRecovery || v.snap.caState == caLoss) {
			v.recovery += dt
		}
		switch c {
		case vRwnd:
			v.rwndAt.Add(float64(v.edge - v.acked))
			v.inflight.Add(float64(v.sent - v.acked))
		case vCwnd:
			v.cwndAt.Add(float64(v.snap.cwnd))
			if mss := int64(max(v.snap.mss, 1)); v.sent-v.acked+mss > int64(v.snap.cwnd)*mss {
				v.cwndFull += dt
			}
		}
	}
	if e.t > v.last {
		v.last = e.t
	}
	switch e.kind {
	case kSockSend:
		if e.size == -eagain {
			v.wantSpace = true
		}
		if e.size <= 0 {
			break
		}
		v.wantSpace = false
		v.sawSend = true
		v.takeIdle()
		v.calls += int64(e.size)
		v.written = max(v.written, v.calls)
		v.started = true
	case kTCPXmit:
		if e.size <= 0 || e.flags&0x02 != 0 {
			return
		}
		v.sawXmit = true
		if !v.haveBase {
			// The first payload sent starts at the first byte written.
			v.base, v.haveBase = e.a, true
			if v.haveSnap {
				v.moveEdge(v.snap.sndUna, v.snap.sndWnd)
			}
		}
		v.sent = max(v.sent, v.rel(e.a)+int64(e.size))
		if v.haveEdge && v.sent > v.edge {
			v.edgeStale = true
		}
		if v.sent > v.written {
			v.written = v.sent
			v.takeIdle()
			v.started = true
		}
	case kTCPRcv:
		if e.flags&0x10 != 0 && v.haveBase {
			v.ack(e.b)
			if e.d != 0 { // the trace has the ACK's window: e.c
				v.moveEdge(e.b, e.c)
			}
		}
	case kTCPState:
		if e.snap == nil {
			return
		}
		v.snap, v.haveSnap = *e.snap, true
		if v.haveBase {
			v.ack(e.snap.sndUna)
			v.moveEdge(e.snap.sndUna, e.snap.sndWnd)
			v.sent = max(v.sent, min(v.rel(e.snap.sndNxt), v.written))
		}
	}
	if v.between > 0 {
		switch {
		case v.written-v.acked <= 0:
			v.spent[vApp] += v.between
			v.between = 0
		case v.sent > v.calls || v.wantSpace:
			v.spent[vSndbuf] += v.between
			v.between = 0
		}
	}
	v.maxOcc = max(v.maxOcc, v.written-v.acked)
	v.maxFlight = max(v.maxFlight, v.sent-v.acked)
}

// takeIdle counts the pause before new data as the application's.
func (v *verdictTracker) takeIdle() {
	if v.idle > 0 {
		v.spent[vApp] += v.idle
		v.idleGaps++
		v.longestIdle = max(v.longestIdle, v.curIdle)
		v.idle, v.curIdle = 0, 0
	}
}

// moveEdge takes the right edge an ACK or snapshot showed: una + wnd. One
// acknowledging less than the first byte sent (the handshake) says
// nothing yet.
func (v *verdictTracker) moveEdge(una, wnd uint32) {
	if int32(una-v.base) < 0 {
		return
	}
	if edge := v.rel(una) + int64(wnd); !v.haveEdge || edge > v.edge {
		v.edge, v.haveEdge = edge, true
	}
	if v.edge >= v.sent {
		v.edgeStale = false
	}
}

// ack moves the acknowledged edge forward, never past what was sent (a
// SYN's or FIN's sequence number is not data).
func (v *verdictTracker) ack(seq uint32) {
	r := v.rel(seq)
	if r > v.acked && r <= v.sent+1 && int32(seq-v.base) >= 0 {
		v.acked = min(r, v.sent)
	}
}

// finish makes the verdict; nil for an end that wrote nothing. haveSnaps
// says whether the trace had tcp_state records with the windows.
func (v *verdictTracker) finish(haveSnaps bool, retrans uint64) *Verdict {
	if !v.started {
		return nil
	}
	vd := &Verdict{Shares: map[string]float64{}, RetransSegs: retrans}
	// Nothing was written after it: the application's.
	v.spent[vApp] += v.between
	v.between = 0
	var total uint64
	for _, d := range v.spent {
		total += d
	}
	if !v.sawXmit {
		vd.Missing = append(vd.Missing, "tcp (tcp_xmit, tcp_rcv: what was sent and acknowledged)")
	}
	if !v.sawSend {
		vd.Missing = append(vd.Missing, "sock (sock_send: what the application wrote, to tell app- and buffer-limited from window-limited)")
	}
	if !haveSnaps {
		vd.Missing = append(vd.Missing, "tcpstate (tcp_state: the congestion and receive windows)")
	}
	vd.TransferS = float64(total) / 1e9
	if total == 0 {
		vd.Limit, vd.Why = "unknown", "no transfer time was followed"
		if len(vd.Missing) > 0 {
			vd.Why += "; record the missing event groups to decide"
		}
		return vd
	}
	best, bestShare := vUnknown, -1.0
	for c := range vStates {
		share := float64(v.spent[c]) / float64(total)
		if v.spent[c] > 0 || c != vUnknown {
			vd.Shares[verdictNames[c]] = share
		}
		if c != vUnknown && share > bestShare {
			best, bestShare = c, share
		}
	}
	vd.RecoveryShare = float64(v.recovery) / float64(total)
	vd.CwndFullShare = float64(v.cwndFull) / float64(total)
	if v.spent[vUnknown] > total/2 {
		best = vUnknown
	}
	vd.Limit = verdictNames[best]
	pc := func(c int) float64 { return 100 * vd.Shares[verdictNames[c]] }
	switch best {
	case vApp:
		vd.Why = fmt.Sprintf("application-limited: for %.0f%% of the transfer the sender had nothing for TCP to send", pc(vApp))
	case vSndbuf:
		vd.Why = fmt.Sprintf("send-buffer-limited: for %.0f%% of the transfer all written data was in flight and the writer waited for buffer space (at most %d B in flight)", pc(vSndbuf), v.maxFlight)
	case vRwnd:
		vd.Why = fmt.Sprintf("receive-window-limited: for %.0f%% of the transfer the peer's advertised window (median %.0f B) was full", pc(vRwnd), v.rwndAt.Quantile(0.5))
	case vCwnd:
		vd.Why = fmt.Sprintf("congestion-window-limited: for %.0f%% of the transfer data waited with the peer's window open (cwnd median %.0f segments, full %.0f%% of the time)", pc(vCwnd), v.cwndAt.Quantile(0.5), 100*vd.CwndFullShare)
		if retrans > 0 {
			vd.Why += fmt.Sprintf("; %d segments retransmitted, %.0f%% of the time in loss recovery", retrans, 100*vd.RecoveryShare)
		}
	default:
		vd.Why = "undecided: the windows were unknown for most of the transfer"
	}
	if v.idleGaps > 0 {
		vd.Evidence = append(vd.Evidence, fmt.Sprintf("app_limited: %d pauses with nothing unacknowledged before the application wrote again, the longest %.3f ms", v.idleGaps, float64(v.longestIdle)/1e6))
	}
	if v.spent[vSndbuf] > 0 {
		vd.Evidence = append(vd.Evidence, fmt.Sprintf("sndbuf_limited: nothing unsent while a write call waited; at most %d B in flight, %d B in the send buffer", v.maxFlight, v.maxOcc))
	}
	if v.rwndAt.N > 0 {
		vd.Evidence = append(vd.Evidence, fmt.Sprintf("rwnd_limited: peer's window median %.0f B, min %.0f B; in flight median %.0f B", v.rwndAt.Quantile(0.5), v.rwndAt.Min, v.inflight.Quantile(0.5)))
	}
	if v.cwndAt.N > 0 {
		vd.Evidence = append(vd.Evidence, fmt.Sprintf("cwnd_limited: cwnd median %.0f, max %.0f segments, full %.1f%% of the transfer; %d segments retransmitted; %.1f%% of the time in loss recovery", v.cwndAt.Quantile(0.5), v.cwndAt.Max, 100*vd.CwndFullShare, retrans, 100*vd.RecoveryShare))
	}
	return vd
}

// ShareNames lists a verdict's shares in the report's order.
func (vd *Verdict) ShareNames() []string {
	var out []string
	for _, n := range verdictNames {
		if _, ok := vd.Shares[n]; ok {
			out = append(out, n)
		}
	}
	return out
}

// attachReceivers gives each sender's verdict what its peer's end says of
// the receiver's time, when both ends are in the report.
func attachReceivers(conns []*ConnReport) {
	byID := map[uint64]*ConnReport{}
	for _, c := range conns {
		byID[c.Conn.ID] = c
	}
	for _, c := range conns {
		if c.Verdict == nil || c.Conn.Peer == 0 {
			continue
		}
		p := byID[c.Conn.Peer]
		if p == nil || p.Receive == nil {
			continue
		}
		c.Verdict.Receiver = p.Receive
		if p.Receive.Reader == nil {
			c.Verdict.Missing = append(c.Verdict.Missing, "sched at the receiver (record with --groups default,sched to see where the receiver's delay went)")
		}
	}
}
