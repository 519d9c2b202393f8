// SPDX-License-Identifier: Apache-2.0

// Package daemon is `magnet daemon`, MAGNET 2.0's magnetd: one recorder
// for the host (record.Run, with the daemon as its sink), a connection
// table with live figures (package live), and an HTTP/JSON API over a Unix
// socket (and, optionally, TCP with a token) to pull figures and subscribe
// to filtered event streams or pushed figures. docs/DAEMON.md is the API.
//
// Data flows recorder → hub (one goroutine: tables, figures, the cheap part
// of every filter) → one bounded queue per subscription → one writer per
// subscription (expression, JSON, the client). A full queue loses events
// for its subscription only, and says so in the stream; the hub never
// waits for a client.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/devskip"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/flight"
	"github.com/magnet-tracer/magnet/internal/live"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// figureGroups are what figure streams need enabled.
const figureGroups = event.GroupSock | event.GroupTCP | event.GroupTCPState | event.GroupDev | event.GroupDrop

// Options are the daemon's run-time hooks (the configuration is Config).
type Options struct {
	// Log receives one line per notable thing (start, reload, stop);
	// os.Stderr if nil.
	Log io.Writer
	// Ready, if set, is called once the probes are attached and the API
	// serves.
	Ready func()
	// StatusDir is where the recorder's status file goes (record.Config).
	StatusDir string
}

// Daemon is a running magnet daemon. Create it with New, run it with Run.
type Daemon struct {
	set atomic.Pointer[settings]
	// flight is the flight recorder, once the recording started with one
	// (flight.window).
	flight  atomic.Pointer[flight.Sink]
	opts    Options
	hub     *hub
	started time.Time

	probeMu sync.Mutex
	probe   *probe.Probe
	// devCheck compares the device programs' runs with the interfaces'
	// counters (record.Config.Checking); nil until the recorder starts it.
	devCheck *devskip.Checker
	applied  event.Group

	subsMu sync.Mutex
	subs   map[uint64]*sub
	nextID uint64
	// deliveryUntil: a pull request asked for delivery-rate figures; the
	// rate group stays enabled until then (unix ns), and deliveryTimer
	// switches it off. Both under subsMu.
	deliveryUntil time.Time
	deliveryTimer *time.Timer

	stopping atomic.Bool
	stop     chan struct{}

	unixLn, tcpLn net.Listener
	srv           *http.Server
	served        bool // the API was up (Run's goroutine only)

	// runRecorder is record.Run; tests put a recorder of their own here.
	runRecorder func(context.Context, record.Config) (*record.Result, error)
}

// New checks cfg and opens the daemon's sockets, so that a bad path or a
// busy port fails before anything is loaded.
func New(cfg Config, opts Options) (*Daemon, error) {
	s, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	if opts.Log == nil {
		opts.Log = os.Stderr
	}
	d := &Daemon{
		opts:        opts,
		hub:         newHub(live.NewTable(s.live)),
		subs:        map[uint64]*sub{},
		stop:        make(chan struct{}),
		runRecorder: record.Run,
	}
	d.set.Store(s)
	if d.unixLn, err = listenUnix(s.Socket, s.mode); err != nil {
		return nil, err
	}
	if s.listen != "" {
		if d.tcpLn, err = net.Listen("tcp", s.listen); err != nil {
			d.unixLn.Close()
			return nil, fmt.Errorf("listen %s: %w", s.listen, err)
		}
		if ap, err := netip.ParseAddrPort(d.tcpLn.Addr().String()); err == nil {
			d.hub.listen = ap
		}
	}
	return d, nil
}

// listenUnix opens the API socket: a stale socket file (no daemon behind
// it) is replaced, a live one is an error.
func listenUnix(path string, mode os.FileMode) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("socket %s: exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s: another magnet daemon is listening there", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("socket %s: remove the stale socket: %w", path, err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return ln, nil
}

// SocketPath is the Unix socket the daemon serves.
func (d *Daemon) SocketPath() string { return d.settings().Socket }

// TCPAddr is the TCP listener's address, "" without one.
func (d *Daemon) TCPAddr() string {
	if d.tcpLn == nil {
		return ""
	}
	return d.tcpLn.Addr().String()
}

func (d *Daemon) settings() *settings { return d.set.Load() }

func (d *Daemon) logf(format string, args ...any) {
	fmt.Fprintf(d.opts.Log, "magnet daemon: "+format+"\n", args...)
}

// Run records and serves until ctx ends, then drains: every event the
// kernel still holds goes to the subscriptions, every stream ends with an
// end message, and the socket is removed. It returns nil after a clean
// stop.
func (d *Daemon) Run(ctx context.Context) error {
	d.started = time.Now()
	s := d.settings()
	d.srv = &http.Server{
		Handler:           d.routes(),
		ConnContext:       peerCreds,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute, // streams are not idle: they write
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	serving := make(chan error, 2)
	var serveOnce sync.Once
	startServing := func() {
		serveOnce.Do(func() {
			d.served = true
			go func() { serving <- d.srv.Serve(d.unixLn) }()
			if d.tcpLn != nil {
				go func() { serving <- d.srv.Serve(d.tcpLn) }()
			}
		})
	}
	stopWatch := context.AfterFunc(ctx, func() { d.stopping.Store(true) })
	defer stopWatch()
	go d.hub.run()

	cfg := record.Config{
		Groups:       s.available,
		Summary:      s.Summary,
		KernelEvents: s.kernel,
		Filters:      record.Filters{Cgroup: s.Filter.Cgroup, NetNS: s.Filter.NetNS, Port: s.Filter.Port},
		BufferBytes:  s.bufBytes,
		FlushEvery:   handOverEvery,
		StatusDir:    d.opts.StatusDir,
		NewSink:      d.newSink,
		Loaded: func(p *probe.Probe) {
			d.probeMu.Lock()
			d.probe = p
			d.probeMu.Unlock()
			d.subsMu.Lock()
			d.applyGroups()
			d.subsMu.Unlock()
		},
		Checking: func(c *devskip.Checker) {
			d.probeMu.Lock()
			d.devCheck = c
			d.probeMu.Unlock()
		},
		Ready: func() {
			startServing()
			where := d.SocketPath()
			if d.tcpLn != nil {
				where += " and " + d.tcpLn.Addr().String()
			}
			d.logf("recording (%s enabled), serving on %s", event.Group(d.hub.enabled.Load()), where)
			if d.opts.Ready != nil {
				d.opts.Ready()
			}
		},
	}
	res, recErr := d.runRecorder(ctx, cfg)
	d.hub.finish()
	if res != nil && len(res.LostBy) > 0 {
		d.logf("the kernel side lost %d events while recording", res.Lost)
	}
	d.shutdown()
	if recErr != nil {
		return fmt.Errorf("daemon: %w", recErr)
	}
	return nil
}

// newSink is the recording's sink: the hub, and beside it the flight
// recorder if one is configured.
func (d *Daemon) newSink(hdr *trace.Header) (record.Sink, error) {
	hs, err := d.hub.newSink(hdr)
	if err != nil || d.settings().flight == nil {
		return hs, err
	}
	opts := *d.settings().flight
	opts.Log = d.logf
	fs, err := flight.New(hdr, opts)
	if err != nil {
		return nil, err
	}
	d.flight.Store(fs)
	return &teeSink{main: hs, side: fs, logf: d.logf}, nil
}

// ErrNoFlight: the daemon runs no flight recorder.
var ErrNoFlight = errors.New("no flight recorder: set flight.window in the configuration")

// TriggerFlight makes the flight recorder write a file with the window
// before now (reason says why, in the file's summary).
func (d *Daemon) TriggerFlight(reason string) error {
	fs := d.flight.Load()
	if fs == nil {
		return ErrNoFlight
	}
	fs.Trigger(reason)
	return nil
}

// teeSink hands every record to main and to side. A failure of side (the
// flight recorder's disk) is logged and ends side only: the streams go on.
type teeSink struct {
	main, side record.Sink
	logf       func(string, ...any)
}

func (t *teeSink) sideErr(err error) {
	if err != nil && t.side != nil {
		t.logf("flight recorder stopped: %v", err)
		t.side = nil
	}
}

func (t *teeSink) Write(rec []byte) error {
	if t.side != nil {
		t.sideErr(t.side.Write(rec))
	}
	return t.main.Write(rec)
}

func (t *teeSink) Flush() error {
	if t.side != nil {
		t.sideErr(t.side.Flush())
	}
	return t.main.Flush()
}

func (t *teeSink) Close(sum *trace.Summary) error {
	if t.side != nil {
		t.sideErr(t.side.Close(sum))
	}
	return t.main.Close(sum)
}

func (t *teeSink) Bytes() int64 { return t.main.Bytes() }

// Drained is record.DrainedSink, for main: the flight recorder writes a
// trace, whose readers put it in time order themselves.
func (t *teeSink) Drained(completeNs uint64) {
	if ds, ok := t.main.(record.DrainedSink); ok {
		ds.Drained(completeNs)
	}
}

// shutdown ends every stream (after what is queued), then the server.
func (d *Daemon) shutdown() {
	d.stopping.Store(true)
	d.subsMu.Lock()
	close(d.stop)
	if d.deliveryTimer != nil {
		d.deliveryTimer.Stop()
	}
	// A client that stopped reading must not hold the daemon up.
	for _, s := range d.subs {
		if s.out != nil {
			_ = s.out.rc.SetWriteDeadline(time.Now().Add(3 * time.Second))
		}
	}
	d.subsMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.srv.Shutdown(ctx); err != nil {
		d.srv.Close()
	}
	// Serve never ran when the recorder failed to start.
	d.unixLn.Close()
	if d.tcpLn != nil {
		d.tcpLn.Close()
	}
	if d.served {
		d.logf("stopped")
	}
}

// Reload applies a new configuration (SIGHUP). What needs a restart keeps
// its old value, and the daemon says which.
func (d *Daemon) Reload(cfg Config) error {
	s, err := cfg.resolve()
	if err != nil {
		return err
	}
	old := d.settings()
	if keep := restartOnly(old, s); len(keep) > 0 {
		d.logf("reload: %v changed and need a restart; they keep their old values", keep)
	}
	s.Socket, s.mode, s.listen, s.bufBytes, s.available = old.Socket, old.mode, old.listen, old.bufBytes, old.available
	s.kernel, s.kernelKey = old.kernel, old.kernelKey
	s.Filter = old.Filter
	s.live.Bucket, s.live.History = old.live.Bucket, old.live.History
	if s.baseline&^s.available != 0 {
		return fmt.Errorf("config: events.baseline has %s, which the running daemon did not load", s.baseline&^s.available)
	}
	if s.live.Window > s.live.History {
		return fmt.Errorf("config: connections.window %v is longer than the running daemon's history %v", s.live.Window, s.live.History)
	}
	d.set.Store(s)
	d.hub.mu.Lock()
	d.hub.table.SetLimits(s.live.MaxConns, s.live.Grace, s.live.WindowEvents, s.live.Window)
	d.hub.mu.Unlock()
	d.subsMu.Lock()
	d.applyGroups()
	d.subsMu.Unlock()
	d.logf("configuration reloaded (%s enabled)", event.Group(d.hub.enabled.Load()))
	return nil
}

// requested returns the groups the subscriptions ask for, and how many ask
// for each. d.subsMu must be held.
func (d *Daemon) requested() (event.Group, map[string]int) {
	var all event.Group
	count := map[string]int{}
	for _, s := range d.subs {
		g := figureGroups
		if s.kind == kindEvents {
			g = s.f.Groups()
		} else if s.fig.delivery {
			g |= event.GroupRate
		}
		all |= g
		for _, name := range (g &^ event.GroupConn).Names() {
			count[name]++
		}
	}
	if time.Now().Before(d.deliveryUntil) {
		all |= event.GroupRate
		count[event.GroupRate.String()]++
	}
	return all, count
}

// deliveryHold is how long a pull request for delivery-rate figures keeps
// the rate group enabled: a client polling more often keeps it on.
const deliveryHold = 30 * time.Second

// pullDelivery reads a pull request's delivery parameter; when true, the
// rate group is enabled (or kept) for deliveryHold. The first answer may
// lack the figures: tcp_rate events come from then on.
func (d *Daemon) pullDelivery(q url.Values, who *identity) error {
	on, err := boolParam(q, "delivery")
	if err != nil || !on {
		return err
	}
	if err := d.mayEnable(who, event.GroupRate); err != nil {
		return err
	}
	d.subsMu.Lock()
	defer d.subsMu.Unlock()
	if d.stopping.Load() {
		return nil
	}
	d.deliveryUntil = time.Now().Add(deliveryHold)
	if d.deliveryTimer == nil {
		d.deliveryTimer = time.AfterFunc(deliveryHold, d.releaseDelivery)
	} else {
		d.deliveryTimer.Reset(deliveryHold)
	}
	d.applyGroups()
	return nil
}

// errCostly is a client that does not see all asking for groups that cost
// every connection on the host.
type errCostly struct{ groups event.Group }

func (e errCostly) Error() string {
	return fmt.Sprintf("%s: enabling them costs every connection on the host; needs root, a member of access.see_all_groups, or the group in access.user_groups", e.groups)
}

// mayEnable says whether who may switch on the groups g: see-all clients
// any group, other users the baseline and access.user_groups.
func (d *Daemon) mayEnable(who *identity, g event.Group) error {
	if who.seesAll {
		return nil
	}
	if extra := g &^ d.settings().userGroups; extra != 0 {
		return errCostly{extra}
	}
	return nil
}

// releaseDelivery runs when the pull hold may have ended.
func (d *Daemon) releaseDelivery() {
	d.subsMu.Lock()
	defer d.subsMu.Unlock()
	if !d.stopping.Load() {
		d.applyGroups()
	}
}

// boolParam reads an optional boolean query parameter.
func boolParam(q url.Values, name string) (bool, error) {
	v := q.Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s %q: want true or false", name, v)
	}
	return b, nil
}

// handOverEvery is how often the recorder hands the hub what it drained
// when its rings do not wake it first: the staleness of pulled figures and
// of a stream's events (up to this plus flushGap). Every hand-over wakes the
// recorder, the hub and the subscribers that get events, and on a busy host
// each wake-up costs: at 5 ms the daemon cost about 200 ns more per event
// than at 25 ms in a 9 Gbit/s veth flood (bench/DAEMON.md), and even with
// no event at all it was charged ~3 % of a core.
const handOverEvery = 25 * time.Millisecond

// applyGroups enables the baseline and what the subscriptions ask for, in
// BPF if the probes are loaded. probe.SetGroups detaches the programs of
// groups nobody wants (they cost the traffic nothing then) and never
// touches those of groups that stay, so these lose nothing. d.subsMu must
// be held.
func (d *Daemon) applyGroups() {
	s := d.settings()
	req, _ := d.requested()
	want := (s.baseline | req | event.GroupConn) & s.available
	d.probeMu.Lock()
	defer d.probeMu.Unlock()
	// The hub ignores events of groups not enabled: it learns of a new
	// group before BPF produces it, and of a group switched off after.
	d.hub.enabled.Store(uint32(want | d.applied))
	if d.probe != nil && want != d.applied {
		if err := d.probe.SetGroups(want); err != nil {
			d.logf("enable %s: %v", want, err)
			d.hub.enabled.Store(uint32(d.applied))
			return
		}
	}
	d.applied = want
	d.hub.enabled.Store(uint32(want))
}

var errTooMany = errors.New("too many subscriptions")

// errUserLimit is a user at its own limit: one user must not take every
// subscription the daemon has.
type errUserLimit struct {
	uid uint32
	max int
}

func (e errUserLimit) Error() string {
	return fmt.Sprintf("uid %d already holds %d subscriptions (subscribers.per_user); end one first", e.uid, e.max)
}

// register adds a subscription and enables what it asks for; once it
// returns, the hub hands the subscription every matching event.
func (d *Daemon) register(s *sub) error {
	d.subsMu.Lock()
	defer d.subsMu.Unlock()
	if d.stopping.Load() {
		return errStopping
	}
	set := d.settings()
	if len(d.subs) >= set.Subscribers.Max {
		return errTooMany
	}
	if !s.who.seesAll {
		n := 0
		for _, o := range d.subs {
			if !o.who.seesAll && o.who.uid == s.who.uid {
				n++
			}
		}
		if n >= set.Subscribers.PerUser {
			return errUserLimit{uid: s.who.uid, max: set.Subscribers.PerUser}
		}
	}
	d.nextID++
	s.id = d.nextID
	d.subs[s.id] = s
	d.hub.subs.Store(newSubSet(d.subs))
	d.applyGroups()
	return nil
}

func (d *Daemon) unregister(s *sub) {
	d.subsMu.Lock()
	defer d.subsMu.Unlock()
	delete(d.subs, s.id)
	d.hub.subs.Store(newSubSet(d.subs))
	if !d.stopping.Load() {
		d.applyGroups()
	}
}

var errStopping = errors.New("the daemon is stopping")

// resolveNetNS turns a name under /run/netns into its inode number.
func resolveNetNS(name string) (uint32, error) {
	path := filepath.Join("/run/netns", name)
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return 0, fmt.Errorf("%s: no such network namespace", name)
	}
	if fs.Type != unix.NSFS_MAGIC && fs.Type != unix.PROC_SUPER_MAGIC {
		return 0, fmt.Errorf("%s: not a network namespace", name)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return uint32(st.Ino), nil
}
