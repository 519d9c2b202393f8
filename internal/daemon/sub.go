// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/filter"
	"github.com/magnet-tracer/magnet/internal/kevent"
	"github.com/magnet-tracer/magnet/internal/live"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// subSet is the subscriptions the hub dispatches to, indexed by event
// type; it is replaced, never changed, when one starts or ends.
type subSet struct {
	all    []*sub
	byType [256][]*sub
	// users: some subscription of a client that does not see all wants
	// the type (the hub holds events back for those).
	users [256]bool
}

func newSubSet(subs map[uint64]*sub) *subSet {
	set := &subSet{}
	for _, s := range subs {
		if s.kind != kindEvents {
			continue
		}
		set.all = append(set.all, s)
		for _, in := range event.Catalogue {
			if in.Type != event.Lost && in.Type != event.Task && s.f.WantsType(in.Type) {
				set.byType[in.Type] = append(set.byType[in.Type], s)
			}
		}
		for t := event.Type(kevent.FirstID); t != 0; t++ { // up to 255
			if s.f.WantsType(t) {
				set.byType[t] = append(set.byType[t], s)
			}
		}
	}
	for t, list := range set.byType {
		for _, s := range list {
			set.users[t] = set.users[t] || !s.who.seesAll
		}
	}
	return set
}

const (
	kindEvents  = "events"
	kindFigures = "figures"
)

// item is what a subscription's queue holds: an event, or the number of
// events dropped just before the next one.
type item struct {
	ev   *liveEvent
	lost uint64
}

// sub is one subscription: a stream to one client.
type sub struct {
	id      uint64
	kind    string
	who     identity
	f       *filter.Filter
	q       chan item
	started time.Time
	stop    chan struct{} // closed when the daemon stops
	fig     figureOpts
	out     *streamWriter

	pending   atomic.Uint64 // dropped and not yet reported
	dropped   atomic.Uint64
	delivered atomic.Uint64
	reported  uint64 // the writer's: dropped and reported

	recMu   sync.Mutex
	recLost *magnetclient.Lost // the recorder's losses not yet reported
	recFlag atomic.Bool
}

// offer queues an event without ever blocking the hub: a full queue drops
// it and counts it. The next event that fits is preceded by the count, so
// the client sees the gap where it is. Only the hub sends on q.
func (s *sub) offer(ev *liveEvent) {
	if s.pending.Load() > 0 {
		if cap(s.q)-len(s.q) < 2 {
			s.pending.Add(1)
			s.dropped.Add(1)
			return
		}
		if n := s.pending.Swap(0); n > 0 {
			s.q <- item{lost: n}
		}
	}
	select {
	case s.q <- item{ev: ev}:
	default:
		s.pending.Add(1)
		s.dropped.Add(1)
	}
}

// recorderLost notes a loss of the recorder's, for the writer to report.
func (s *sub) recorderLost(l recorderLoss) {
	s.recMu.Lock()
	defer s.recMu.Unlock()
	if s.recLost == nil {
		cpu := l.cpu
		s.recLost = &magnetclient.Lost{Source: "recorder", ByType: map[string]uint64{}, CPU: &cpu, FirstNs: l.firstNs}
	} else if s.recLost.CPU != nil && *s.recLost.CPU != l.cpu {
		s.recLost.CPU = nil // several CPUs lost
	}
	s.recLost.Count += l.count
	for k, v := range l.byType {
		s.recLost.ByType[k] += v
	}
	s.recLost.FirstNs = min(s.recLost.FirstNs, l.firstNs)
	s.recLost.LastNs = max(s.recLost.LastNs, l.lastNs)
	s.recFlag.Store(true)
}

// notices writes the losses not yet reported: the recorder's, and, when
// the queue is empty (nothing to carry them), this subscription's.
func (s *sub) notices(out *streamWriter) error {
	if s.recFlag.Swap(false) {
		s.recMu.Lock()
		l := s.recLost
		s.recLost = nil
		s.recMu.Unlock()
		if l != nil {
			if err := out.msgJSON("lost", l); err != nil {
				return err
			}
		}
	}
	if len(s.q) == 0 {
		if n := s.pending.Swap(0); n > 0 {
			return s.writeLost(out, n)
		}
	}
	return nil
}

func (s *sub) writeLost(out *streamWriter, n uint64) error {
	s.reported += n
	return out.msgJSON("lost", magnetclient.Lost{Source: "subscriber", Count: n, Total: s.reported})
}

// handle writes one queued item.
func (s *sub) handle(out *streamWriter, it item) error {
	if it.lost > 0 {
		return s.writeLost(out, it.lost)
	}
	if it.ev == nil || !s.f.MatchExprMemo(&it.ev.fe, &it.ev.exprs) {
		return nil
	}
	s.delivered.Add(1)
	return out.msg("event", it.ev.json())
}

// flushGap is the least time between two writes of an event stream: a
// stream whose events come one at a time (a connection's tcp_state) then
// costs at most 1/flushGap wake-ups and writes a second rather than one per
// event, for at most flushGap of delay. The queue holds the events
// meanwhile (4096 by default: 800k events/s would fill it).
const flushGap = 5 * time.Millisecond

// serveEvents writes the stream until the client goes or the daemon
// stops; at a stop it first writes everything queued.
func (s *sub) serveEvents(ctx context.Context, out *streamWriter) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	pace := time.NewTimer(flushGap)
	defer pace.Stop()
	pacing := true // until the timer fires: no event is taken
	var err error
	for err == nil {
		q := s.q
		if pacing {
			q = nil
		}
		select {
		case <-pace.C:
			pacing = false
		case it := <-q:
			err = s.handle(out, it)
			// Take what else is queued before flushing, up to a point.
			for n := 0; err == nil && n < 1024; n++ {
				select {
				case it = <-s.q:
					err = s.handle(out, it)
					continue
				default:
				}
				break
			}
			if err == nil {
				err = s.notices(out)
			}
			if err == nil && len(s.q) == 0 {
				if err = out.flush(); err == nil {
					pace.Reset(flushGap)
					pacing = true
				}
			}
		case <-tick.C:
			if err = s.notices(out); err == nil {
				if err = out.flush(); err == nil {
					err = out.ping()
				}
			}
		case <-ctx.Done():
			return
		case <-s.stop:
			for err == nil && len(s.q) > 0 {
				err = s.handle(out, <-s.q)
			}
			if err == nil {
				err = s.notices(out)
			}
			if err == nil {
				s.end(out)
			}
			return
		}
	}
}

func (s *sub) end(out *streamWriter) {
	if out.msgJSON("end", magnetclient.End{Reason: "shutdown", Dropped: s.dropped.Load()}) == nil {
		_ = out.flush()
	}
}

// figureOpts say when a figure stream pushes.
type figureOpts struct {
	every  time.Duration
	change float64 // percent; 0 = off
	metric func(*magnetclient.Connection) float64
	window live.Window
	// delivery: the stream wants the kernel's delivery-rate figures, so
	// the rate group is enabled while it lasts.
	delivery bool
}

// serveFigures pushes the figures of the connections the filter selects.
func (s *sub) serveFigures(ctx context.Context, out *streamWriter, d *Daemon) {
	check := s.fig.every
	if s.fig.change > 0 {
		check = 10 * time.Millisecond
	}
	tick := time.NewTicker(check)
	defer tick.Stop()
	last := map[uint64]float64{}
	var lastAll time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.stop:
			s.end(out)
			return
		case now := <-tick.C:
			list := d.connections(&s.who, s.f, s.fig.window, "all")
			full := s.fig.every > 0 && now.Sub(lastAll) >= s.fig.every-check/2
			var push []magnetclient.Connection
			seen := map[uint64]bool{}
			for i := range list.Connections {
				c := &list.Connections[i]
				seen[c.ID] = true
				v := s.fig.metric(c)
				prev, ok := last[c.ID]
				changed := s.fig.change > 0 && (!ok || changedBy(prev, v, s.fig.change))
				if full || changed {
					push = append(push, *c)
					last[c.ID] = v
				}
			}
			for id := range last {
				if !seen[id] {
					delete(last, id)
				}
			}
			if full {
				lastAll = now
			}
			if !full && len(push) == 0 {
				if err := out.ping(); err != nil {
					return
				}
				continue
			}
			if push == nil {
				push = []magnetclient.Connection{}
			}
			if err := out.msgJSON("figures", magnetclient.Figures{NowNs: list.NowNs, Connections: push}); err != nil {
				return
			}
			if err := out.flush(); err != nil {
				return
			}
			s.delivered.Add(1)
		}
	}
}

func changedBy(prev, cur, pct float64) bool {
	if prev == 0 {
		return cur != 0
	}
	return math.Abs(cur-prev) >= math.Abs(prev)*pct/100
}

// metricOf resolves a metric path (docs/DAEMON.md, /v1/figures) to a
// function of a connection's figures.
func metricOf(path string) (func(*magnetclient.Connection) float64, error) {
	parts := strings.Split(path, ".")
	if len(parts) >= 3 && len(parts) <= 4 {
		var layer func(*magnetclient.Connection) *magnetclient.Layer
		switch parts[0] {
		case "app":
			layer = func(c *magnetclient.Connection) *magnetclient.Layer { return &c.App }
		case "tcp":
			layer = func(c *magnetclient.Connection) *magnetclient.Layer { return &c.TCP }
		case "wire":
			layer = func(c *magnetclient.Connection) *magnetclient.Layer { return &c.Wire }
		}
		var dir func(*magnetclient.Layer) *magnetclient.Direction
		switch parts[1] {
		case "send":
			dir = func(l *magnetclient.Layer) *magnetclient.Direction { return &l.Send }
		case "recv":
			dir = func(l *magnetclient.Layer) *magnetclient.Direction { return &l.Recv }
		}
		if layer != nil && dir != nil {
			d := func(c *magnetclient.Connection) *magnetclient.Direction { return dir(layer(c)) }
			if len(parts) == 3 {
				switch parts[2] {
				case "bytes":
					return func(c *magnetclient.Connection) float64 { return float64(d(c).Bytes) }, nil
				case "average_bps":
					return func(c *magnetclient.Connection) float64 { return d(c).AverageBPS }, nil
				}
			} else {
				var rate func(*magnetclient.Direction) *magnetclient.Rate
				switch parts[2] {
				case "by_events":
					rate = func(d *magnetclient.Direction) *magnetclient.Rate { return &d.ByEvents }
				case "by_time":
					rate = func(d *magnetclient.Direction) *magnetclient.Rate { return &d.ByTime }
				}
				if rate != nil {
					switch parts[3] {
					case "bps":
						return func(c *magnetclient.Connection) float64 { return rate(d(c)).BPS }, nil
					case "bytes":
						return func(c *magnetclient.Connection) float64 { return float64(rate(d(c)).Bytes) }, nil
					}
				}
			}
		}
	}
	st := func(f func(*magnetclient.TCPState) float64) func(*magnetclient.Connection) float64 {
		return func(c *magnetclient.Connection) float64 {
			if c.State == nil {
				return 0
			}
			return f(c.State)
		}
	}
	switch path {
	case "tcp_state.cwnd":
		return st(func(s *magnetclient.TCPState) float64 { return float64(s.Cwnd) }), nil
	case "tcp_state.srtt_us":
		return st(func(s *magnetclient.TCPState) float64 { return float64(s.SrttUs) }), nil
	case "tcp_state.delivery_rate_bps":
		return st(func(s *magnetclient.TCPState) float64 { return s.DeliveryRateBPS }), nil
	case "delivery.bps", "delivery.max_bps", "delivery.mean_bps":
		return func(c *magnetclient.Connection) float64 {
			d := c.Delivery
			switch {
			case d == nil:
				return 0
			case path == "delivery.bps":
				return d.Last.BPS
			case path == "delivery.max_bps":
				return d.Window.MaxBPS
			}
			return d.Window.MeanBPS
		}, nil
	case "retransmits.per_second":
		return func(c *magnetclient.Connection) float64 { return c.Retransmits.PerSecond }, nil
	case "drops.per_second":
		return func(c *magnetclient.Connection) float64 { return c.Drops.PerSecond }, nil
	case "send_buffer.bytes":
		return func(c *magnetclient.Connection) float64 {
			if c.SendBuffer == nil {
				return 0
			}
			return float64(c.SendBuffer.Bytes)
		}, nil
	}
	return nil, fmt.Errorf("metric %q: want LAYER.DIR.by_events|by_time.bps|bytes, LAYER.DIR.bytes|average_bps (LAYER app, tcp, wire; DIR send, recv), tcp_state.cwnd|srtt_us|delivery_rate_bps, delivery.bps|max_bps|mean_bps, retransmits.per_second, drops.per_second or send_buffer.bytes", path)
}
