// SPDX-License-Identifier: Apache-2.0

// Package live computes figures per connection as events arrive, for the
// daemon: MAGNET 2.0's sliding-window bandwidth over the last N events, a
// bandwidth over the last T seconds, at the application (sock_send,
// sock_recv), TCP (tcp_xmit, tcp_rcv) and device (dev_xmit, dev_recv)
// layers; the last TCP state with the kernel's delivery-rate sample;
// retransmission and drop rates; the send-buffer occupancy.
//
// It is pure logic: the caller decodes events and feeds them in, and says
// what time it is. A Table is not safe for concurrent use. Memory is
// bounded: closed connections go after a grace period, the table holds at
// most Config.MaxConns, and each stream keeps at most WindowEvents samples
// and History/Bucket time buckets.
package live

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/magnet-tracer/magnet/internal/sendbuf"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// Config bounds a Table and sets its default windows.
type Config struct {
	MaxConns     int           // connections tracked at most
	Grace        time.Duration // how long a closed connection stays
	WindowEvents int           // the default and largest event window
	Window       time.Duration // the default time window
	Bucket       time.Duration // the time windows' resolution
	History      time.Duration // the largest time window
}

// DefaultConfig is what the daemon uses unless configured otherwise.
var DefaultConfig = Config{
	MaxConns:     16384,
	Grace:        30 * time.Second,
	WindowEvents: 1000,
	Window:       time.Second,
	Bucket:       10 * time.Millisecond,
	History:      10 * time.Second,
}

// Check says what is wrong with c, if anything.
func (c Config) Check() error {
	switch {
	case c.MaxConns < 1:
		return fmt.Errorf("connections.max %d: want at least 1", c.MaxConns)
	case c.Grace < 0:
		return fmt.Errorf("connections.grace %v: want 0 or more", c.Grace)
	case c.WindowEvents < 2 || c.WindowEvents > 1<<20:
		return fmt.Errorf("connections.window_events %d: want 2 to %d", c.WindowEvents, 1<<20)
	case c.Bucket < time.Millisecond:
		return fmt.Errorf("connections.bucket %v: want at least 1ms", c.Bucket)
	case c.History < c.Bucket || c.History/c.Bucket > 100000:
		return fmt.Errorf("connections.history %v: want between one bucket and 100000 buckets (%v)", c.History, c.Bucket*100000)
	case c.Window < c.Bucket || c.Window > c.History:
		return fmt.Errorf("connections.window %v: want between connections.bucket (%v) and connections.history (%v)", c.Window, c.Bucket, c.History)
	}
	return nil
}

// Layer is where in the stack bytes are counted.
type Layer int

// The layers.
const (
	App  Layer = iota // sock_send, sock_recv
	TCP               // tcp_xmit, tcp_rcv payload
	Wire              // dev_xmit, dev_recv
	numLayers
)

// LayerNames are the layers as the API names them.
var LayerNames = [numLayers]string{"app", "tcp", "wire"}

// Dir is a direction of traffic.
type Dir int

// The directions.
const (
	Send Dir = iota
	Recv
)

// Info identifies a connection, from its conn_open event.
type Info struct {
	Proto  uint8 // IPPROTO_TCP, IPPROTO_UDP
	Local  netip.AddrPort
	Remote netip.AddrPort
	NetNS  uint32
	// Accepted: a TCP connection first seen as its handshake completed
	// (conn_open in state SYN_RECV), see sendbuf.Tracker.Accepted.
	Accepted bool
}

// ProtoName names a protocol number as the API does.
func ProtoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 0:
		return ""
	}
	return fmt.Sprint(p)
}

// Owner is the process that owns a connection.
type Owner struct {
	PID  uint32
	Comm string
	UID  int64 // real uid, -1 when unknown
}

// TCPSample is one tcp_state snapshot.
type TCPSample struct {
	TimeNs                                 uint64
	State, CAState                         string
	Cwnd, Ssthresh, SrttUs, MSS            uint32
	SndWnd, RcvWnd, PacketsOut, RetransOut uint32
	TotalRetrans, Delivered, Lost          uint32
	RateDelivered, RateIntervalUs          uint32
	AppLimited                             bool
}

// stream is one direction at one layer.
type stream struct {
	bytes       int64
	events      uint64
	first, last uint64
	ev          eventWindow
	tw          timeWindow
}

// Conn is one connection's state.
type Conn struct {
	ID      uint64
	Info    Info
	Opened  bool // conn_open seen: Info is set
	Owner   *Owner
	OpenNs  uint64
	CloseNs uint64
	LastNs  uint64
	Events  uint64

	streams  [numLayers][2]*stream
	state    *TCPSample
	retrans  counter
	drops    counter
	byReason map[string]uint64
	sbuf     sendbuf.Tracker
	sbufMax  int64
	delivery *deliveryWindow
	cfg      *Config
}

// counter counts events (and bytes) with a time window for their rate.
type counter struct {
	n     uint64
	bytes int64
	tw    *timeWindow
}

func (c *counter) add(cfg *Config, t uint64, bytes int64) {
	c.addN(cfg, t, 1, bytes)
}

// addN counts n events of bytes in all at t.
func (c *counter) addN(cfg *Config, t uint64, n uint64, bytes int64) {
	c.n += n
	c.bytes += bytes
	if c.tw == nil {
		c.tw = newTimeWindow(cfg)
	}
	c.tw.add(t, bytes)
}

func newTimeWindow(cfg *Config) *timeWindow {
	return &timeWindow{res: uint64(cfg.Bucket), history: int64(cfg.History / cfg.Bucket)}
}

// Traffic counts bytes moved at a layer in a direction at time t. Sizes of
// zero or less (empty reads, errors, pure ACKs) are not traffic.
func (c *Conn) Traffic(l Layer, d Dir, t uint64, bytes int64) {
	c.traffic(l, d, t, bytes, 1)
}

// Summary is what a summary interval (a conn_summary record) tells of a
// connection: per layer and direction the bytes and the events that moved
// them, and the retransmissions and drops.
type Summary struct {
	Bytes        [numLayers][2]int64
	Events       [numLayers][2]uint64
	RetransSegs  uint64
	RetransBytes int64
	Drops        uint64
}

// Summarized adds a summary interval ending at t as its events would
// have been added, all at t: totals are exact, the rates see the interval
// as one burst.
func (c *Conn) Summarized(t uint64, s Summary) {
	for l := range numLayers {
		for d := range 2 {
			// A summary read from the socket has bytes and no
			// count of calls or packets (the kernel keeps none).
			if s.Events[l][d] > 0 || s.Bytes[l][d] > 0 {
				c.traffic(Layer(l), Dir(d), t, s.Bytes[l][d], s.Events[l][d])
			}
		}
	}
	if s.RetransSegs > 0 {
		c.retrans.addN(c.cfg, t, s.RetransSegs, max(s.RetransBytes, 0))
	}
	if s.Drops > 0 {
		c.drops.addN(c.cfg, t, s.Drops, 0)
	}
}

func (c *Conn) traffic(l Layer, d Dir, t uint64, bytes int64, events uint64) {
	if bytes <= 0 || l < 0 || l >= numLayers {
		return
	}
	s := c.streams[l][d]
	if s == nil {
		s = &stream{first: t, ev: eventWindow{max: c.cfg.WindowEvents}, tw: *newTimeWindow(c.cfg)}
		c.streams[l][d] = s
	}
	s.bytes += bytes
	s.events += events
	s.last = max(s.last, t)
	s.ev.add(t, bytes)
	s.tw.add(t, bytes)
	if l == App && d == Send {
		c.sampleSendBuffer(c.sbuf.AppWrote(bytes))
	}
}

// Segment takes a segment TCP sent (tcp_xmit), for the send buffer.
func (c *Conn) Segment(seq uint32, size int64, syn bool) {
	c.sampleSendBuffer(c.sbuf.Sent(seq, size, syn))
}

// Ack takes the acknowledgment number of a segment from the peer
// (tcp_rcv with the ACK flag), for the send buffer.
func (c *Conn) Ack(ack uint32) {
	c.sbuf.Acked(ack)
}

func (c *Conn) sampleSendBuffer(grew bool) {
	if grew && c.sbuf.Known() {
		c.sbufMax = max(c.sbufMax, c.sbuf.Occupancy())
	}
}

// State takes a tcp_state snapshot.
func (c *Conn) State(s TCPSample) {
	if c.state == nil || s.TimeNs >= c.state.TimeNs {
		c.state = &s
	}
}

// Retransmit counts a tcp_retrans of bytes payload at t.
func (c *Conn) Retransmit(t uint64, bytes int64) {
	c.retrans.add(c.cfg, t, max(bytes, 0))
}

// Drop counts a drop event at t, by the kernel's reason.
func (c *Conn) Drop(t uint64, reason string) {
	c.drops.add(c.cfg, t, 0)
	if c.byReason == nil {
		c.byReason = map[string]uint64{}
	}
	if len(c.byReason) < 64 || c.byReason[reason] > 0 {
		c.byReason[reason]++
	}
}

// MainDir is the direction at layer l that has moved more bytes.
func (c *Conn) MainDir(l Layer) Dir {
	s, r := c.streams[l][Send], c.streams[l][Recv]
	if r != nil && (s == nil || r.bytes >= s.bytes) {
		return Recv
	}
	return Send
}

// Rate is the rate of layer l, direction d, over the k newest events (k >
// 0) or over the span ns before now.
func (c *Conn) Rate(l Layer, d Dir, k int, span time.Duration, now uint64) magnetclient.Rate {
	s := c.streams[l][d]
	if s == nil {
		return magnetclient.Rate{}
	}
	if k > 0 {
		return eventRate(s, k)
	}
	return timeRate(&s.tw, span, max(now, s.last))
}

// LastNs is the time of the newest event of layer l, direction d.
func (c *Conn) StreamLastNs(l Layer, d Dir) uint64 {
	if s := c.streams[l][d]; s != nil {
		return s.last
	}
	return 0
}

func eventRate(s *stream, k int) magnetclient.Rate {
	bytes, n, span := s.ev.rate(k)
	r := magnetclient.Rate{Bytes: bytes, Events: n, SpanNs: int64(span)}
	if span > 0 {
		r.BPS = float64(bytes) * 8 / (float64(span) / 1e9)
	}
	return r
}

func timeRate(w *timeWindow, span time.Duration, now uint64) magnetclient.Rate {
	bytes, n := w.sum(now, uint64(span))
	r := magnetclient.Rate{Bytes: bytes, Events: int(n), SpanNs: int64(span)}
	if span > 0 {
		r.BPS = float64(bytes) * 8 / span.Seconds()
	}
	return r
}

// Window says which windows a snapshot's rates use; zero fields take the
// table's defaults.
type Window struct {
	Events int
	Span   time.Duration
}

// Snapshot returns the connection's figures at now.
func (c *Conn) Snapshot(w Window, now uint64) magnetclient.Connection {
	out := magnetclient.Connection{
		ID:      c.ID,
		Proto:   ProtoName(c.Info.Proto),
		NetNS:   c.Info.NetNS,
		OpenNs:  c.OpenNs,
		CloseNs: c.CloseNs,
		LastNs:  c.LastNs,
		Events:  c.Events,
		Window:  magnetclient.Window{Events: w.Events, Ns: int64(w.Span), NowNs: now},
	}
	if c.Opened {
		out.Local, out.Remote = c.Info.Local.String(), c.Info.Remote.String()
	}
	if c.Owner != nil {
		out.Owner = &magnetclient.Owner{PID: c.Owner.PID, Comm: c.Owner.Comm, UID: c.Owner.UID}
	}
	layers := [numLayers]*magnetclient.Layer{&out.App, &out.TCP, &out.Wire}
	for l := range numLayers {
		for d, dst := range []*magnetclient.Direction{&layers[l].Send, &layers[l].Recv} {
			s := c.streams[l][d]
			if s == nil {
				continue
			}
			*dst = magnetclient.Direction{
				Bytes: s.bytes, Events: s.events, FirstNs: s.first, LastNs: s.last,
				ByEvents: eventRate(s, w.Events),
				ByTime:   timeRate(&s.tw, w.Span, max(now, s.last)),
			}
			if s.last > s.first {
				dst.AverageBPS = float64(s.bytes) * 8 / (float64(s.last-s.first) / 1e9)
			}
		}
	}
	if st := c.state; st != nil {
		ts := &magnetclient.TCPState{
			TimeNs: st.TimeNs, State: st.State, CAState: st.CAState,
			Cwnd: st.Cwnd, Ssthresh: st.Ssthresh, SrttUs: st.SrttUs, MSS: st.MSS,
			SndWnd: st.SndWnd, RcvWnd: st.RcvWnd, PacketsOut: st.PacketsOut, RetransOut: st.RetransOut,
			TotalRetrans: st.TotalRetrans, Delivered: st.Delivered, Lost: st.Lost, DeliveryAppLimited: st.AppLimited,
		}
		ts.DeliveryRateBPS = DeliveryRate(st.RateDelivered, st.MSS, st.RateIntervalUs)
		out.State = ts
	}
	out.Retransmits = magnetclient.Retransmits{Count: c.retrans.n, Bytes: c.retrans.bytes}
	if c.retrans.tw != nil {
		_, n := c.retrans.tw.sum(now, uint64(w.Span))
		out.Retransmits.PerSecond = float64(n) / w.Span.Seconds()
	}
	out.Drops = magnetclient.Drops{Count: c.drops.n, ByReason: maps.Clone(c.byReason)}
	if out.Drops.ByReason == nil {
		out.Drops.ByReason = map[string]uint64{}
	}
	if c.drops.tw != nil {
		_, n := c.drops.tw.sum(now, uint64(w.Span))
		out.Drops.PerSecond = float64(n) / w.Span.Seconds()
	}
	if c.sbuf.Known() {
		out.SendBuffer = &magnetclient.SendBuffer{Bytes: c.sbuf.Occupancy(), MaxBytes: c.sbufMax}
	}
	out.Delivery = c.Delivery(uint64(w.Span), now)
	return out
}

// DeliveryRate is the kernel's delivery-rate estimate in bits per second,
// as tcp_get_info computes tcpi_delivery_rate: segments delivered in the
// sample times the MSS over the sample's interval.
func DeliveryRate(segs, mss, intervalUs uint32) float64 {
	if intervalUs == 0 {
		return 0
	}
	return float64(segs) * float64(mss) * 8 / (float64(intervalUs) / 1e6)
}

// Table tracks connections.
type Table struct {
	cfg     Config
	conns   map[uint64]*Conn
	evicted uint64
	open    int
}

// NewTable returns an empty table; cfg must pass Check.
func NewTable(cfg Config) *Table {
	return &Table{cfg: cfg, conns: map[uint64]*Conn{}}
}

// Config returns the table's configuration.
func (t *Table) Config() Config { return t.cfg }

// SetLimits changes what a reload may change: the cap, the grace period and
// the default windows (the buckets stay as they are).
func (t *Table) SetLimits(maxConns int, grace time.Duration, windowEvents int, window time.Duration) {
	t.cfg.MaxConns, t.cfg.Grace, t.cfg.Window = maxConns, grace, window
	t.cfg.WindowEvents = windowEvents
}

// Get returns the connection id, or nil.
func (t *Table) Get(id uint64) *Conn { return t.conns[id] }

// Track returns the connection id, tracked from now (time ns) if it was
// not: events can come before their conn_open was seen (the daemon started
// while the connection was open), or after the connection was evicted.
func (t *Table) Track(id, ns uint64) *Conn {
	c := t.conns[id]
	if c == nil {
		c = &Conn{ID: id, OpenNs: ns, cfg: &t.cfg}
		t.conns[id] = c
		t.open++
	}
	if ns > c.LastNs {
		c.LastNs = ns
	}
	return c
}

// Open records a conn_open. An announcement of a connection already
// tracked (a kernel map eviction announces it again) keeps the first one.
func (t *Table) Open(id, ns uint64, info Info) *Conn {
	c := t.Track(id, ns)
	if !c.Opened {
		c.Info, c.Opened = info, true
		if info.Accepted {
			c.sbuf.Accepted()
		}
		if c.Events == 0 {
			c.OpenNs = ns
		}
	}
	return c
}

// Close records a conn_close.
func (t *Table) Close(id, ns uint64) {
	c := t.Track(id, ns)
	if c.CloseNs == 0 {
		c.CloseNs = ns
		t.open--
	}
}

// Len returns how many connections are tracked, and how many are open.
func (t *Table) Len() (tracked, open int) { return len(t.conns), t.open }

// Evicted counts the connections forgotten before their grace period ended
// because the table was full.
func (t *Table) Evicted() uint64 { return t.evicted }

// Each calls fn for every connection, in id order.
func (t *Table) Each(fn func(*Conn)) {
	ids := slices.Sorted(maps.Keys(t.conns))
	for _, id := range ids {
		fn(t.conns[id])
	}
}

// Expire forgets the connections closed more than the grace period before
// now, then, while the table holds more than MaxConns, the closed ones
// first and the least recently active after them.
func (t *Table) Expire(now uint64) {
	grace := uint64(t.cfg.Grace)
	for id, c := range t.conns {
		if c.CloseNs != 0 && now > c.CloseNs && now-c.CloseNs > grace {
			delete(t.conns, id)
		}
	}
	if len(t.conns) <= t.cfg.MaxConns {
		return
	}
	all := slices.Collect(maps.Values(t.conns))
	slices.SortFunc(all, func(a, b *Conn) int {
		ac, bc := a.CloseNs != 0, b.CloseNs != 0
		switch {
		case ac && !bc:
			return -1
		case !ac && bc:
			return 1
		case a.LastNs < b.LastNs:
			return -1
		case a.LastNs > b.LastNs:
			return 1
		}
		return 0
	})
	// Down to 90 %, so that a full table does not sort at every call.
	for _, c := range all[:len(all)-t.cfg.MaxConns*9/10] {
		if c.CloseNs == 0 {
			t.open--
		}
		delete(t.conns, c.ID)
		t.evicted++
	}
}

// Resolve fills w's zero fields with the table's defaults and checks the
// rest against its bounds.
func (t *Table) Resolve(w Window) (Window, error) {
	if w.Events == 0 {
		w.Events = t.cfg.WindowEvents
	}
	if w.Span == 0 {
		w.Span = t.cfg.Window
	}
	if w.Events < 2 || w.Events > t.cfg.WindowEvents {
		return w, fmt.Errorf("window_events %d: want 2 to %d", w.Events, t.cfg.WindowEvents)
	}
	if w.Span < t.cfg.Bucket || w.Span > t.cfg.History {
		return w, fmt.Errorf("window %v: want %v to %v", w.Span, t.cfg.Bucket, t.cfg.History)
	}
	return w, nil
}
