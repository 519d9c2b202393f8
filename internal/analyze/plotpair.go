// SPDX-License-Identifier: Apache-2.0

package analyze

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// PairKinds are the figures of a connection's two ends: drawn from two
// traces (the sender's and the receiver's, recorded apart) or from one that
// holds both ends.
var PairKinds = []string{"e2e", "e2e-delay"}

// pathPoint is one segment followed from the sender's tcp_xmit to the
// receiver's sock_recv (times on the figure's timeline, ns).
type pathPoint struct {
	read     uint64 // sock_recv
	total    uint64 // tcp_xmit → sock_recv
	receiver uint64 // dev_recv → sock_recv
}

// PlotPair builds a figure of kind (one of PairKinds) for the connection
// whose two ends are in ins: the end that sent the most application bytes
// and whose peer is found (by the connection's tuple), or the connection
// opts.Conn names (either end's id).
func PlotPair(ins []trace.Source, kind string, opts PlotOptions) (fig *Figure, err error) {
	if !contains(PairKinds, kind) {
		return nil, fmt.Errorf("unknown two-end plot kind %q (want %v)", kind, PairKinds)
	}
	st, err := openStream(ins)
	if err != nil {
		return nil, err
	}
	defer st.close()
	defer func() {
		if fig != nil {
			fig.Warnings = st.warnings()
		}
	}()
	var start uint64
	started := false
	var ends []*connState
	st.newConn = func(cs *connState) {
		cs.plot = &connSeries{hops: newHopTracker(cs)}
		ends = append(ends, cs)
	}
	st.onEvent = func(e *ev) {
		if !started {
			start, started = e.t, true
		}
		cs := e.cs
		if cs == nil || cs.notTCP {
			return
		}
		p := cs.plot
		p.hops.step(e)
		if (e.kind == kSockSend || e.kind == kSockRecv) && e.size > 0 {
			recv := e.kind == kSockRecv
			if !p.haveApp {
				p.appIsRecv, p.haveApp = recv, true
			}
			if recv == p.appIsRecv {
				p.appT, p.appB = append(p.appT, e.t), append(p.appB, int64(e.size))
				p.appBytes += int64(e.size)
			}
		}
	}
	if err := st.run(); err != nil {
		return nil, err
	}
	// The sending end: the busiest writer with a peer, or the end (or the
	// peer of the end) opts.Conn names.
	var snd *connState
	for _, cs := range ends {
		p := cs.plot
		if cs.peer == nil || !p.haveApp || p.appIsRecv {
			continue
		}
		if opts.Conn != 0 {
			if cs.id == opts.Conn || cs.peer.id == opts.Conn {
				snd = cs
				break
			}
			continue
		}
		if snd == nil || p.appBytes > snd.plot.appBytes {
			snd = cs
		}
	}
	if snd == nil {
		return nil, noPair(ins, opts.Conn)
	}
	rcv := snd.peer
	fig = &Figure{Conn: snd.id, XLabel: "time since the first trace began (s)"}
	sec := func(t uint64) float64 { return float64(int64(t)-int64(start)) / 1e9 }
	where := func(cs *connState) string {
		if len(ins) == 1 {
			return fmt.Sprintf("%d", cs.id)
		}
		return fmt.Sprintf("%d in %s", cs.id, filepath.Base(cs.src.path))
	}
	label := fmt.Sprintf("connection %s → %s", where(snd), where(rcv))
	switch kind {
	case "e2e":
		fig.Title = label + ": bytes at the sender's and the receiver's socket"
		fig.YLabel = "bytes so far (MB)"
		fig.Series = []Named{cumulative("written by the sender (sock_send)", snd.plot, sec),
			cumulative("read by the receiver (sock_recv)", rcv.plot, sec)}
	case "e2e-delay":
		fig.Title = label + ": delay of each data segment, by the time it was read"
		fig.YLabel = "delay (ms)"
		fig.NoData = "no segment was followed from the sender's tcp_xmit to the receiver's sock_recv (both ends need the tcp, ip, dev and sock groups)"
		total := Named{Name: "end to end (tcp_xmit → sock_recv)", Scatter: true}
		recv := Named{Name: "at the receiver (dev_recv → sock_recv)", Scatter: true}
		for _, pt := range snd.plot.path {
			x := sec(pt.read)
			total.X, total.Y = append(total.X, x), append(total.Y, float64(pt.total)/1e6)
			recv.X, recv.Y = append(recv.X, x), append(recv.Y, float64(pt.receiver)/1e6)
		}
		fig.Series = []Named{total, recv}
	}
	return fig, nil
}

// cumulative is an end's application bytes added up over time, in MB.
func cumulative(name string, p *connSeries, sec func(uint64) float64) Named {
	n := Named{Name: name, Steps: true}
	var sum int64
	for i, t := range p.appT {
		sum += p.appB[i]
		n.X, n.Y = append(n.X, sec(t)), append(n.Y, float64(sum)/1e6)
	}
	return n
}

// noPair says why no connection could be drawn end to end.
func noPair(ins []trace.Source, conn uint64) error {
	var names []string
	for _, in := range ins {
		names = append(names, in.Name)
	}
	if conn != 0 {
		return fmt.Errorf("connection %d has no sending end paired with its peer in %s", conn, strings.Join(names, " and "))
	}
	if len(ins) == 1 {
		return fmt.Errorf("no connection has both its ends in %s: give the sender's and the receiver's traces", names[0])
	}
	return fmt.Errorf("no connection of %s has its other end in %s: the traces share no connection's addresses and ports", names[0], strings.Join(names[1:], " and "))
}
