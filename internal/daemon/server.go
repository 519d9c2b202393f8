// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/filter"
	"github.com/magnet-tracer/magnet/internal/live"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// maxBody bounds a request body.
const maxBody = 64 << 10

// routes is the API (docs/DAEMON.md#endpoints). Every answer, errors
// included, is JSON.
func (d *Daemon) routes() http.Handler {
	mux := http.NewServeMux()
	handle := func(pattern string, methods []string, h func(http.ResponseWriter, *http.Request, *identity)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			ok := false
			for _, m := range methods {
				ok = ok || r.Method == m
			}
			if !ok {
				w.Header().Set("Allow", strings.Join(methods, ", "))
				writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s %s: want %s", r.Method, r.URL.Path, strings.Join(methods, " or ")))
				return
			}
			who := d.who(w, r)
			if who == nil {
				return
			}
			h(w, r, who)
		})
	}
	get, getPost := []string{http.MethodGet}, []string{http.MethodGet, http.MethodPost}
	handle("/v1/status", get, d.handleStatus)
	handle("/v1/connections", get, d.handleConnections)
	handle("/v1/connections/{id}", get, d.handleConnection)
	handle("/v1/connections/{id}/bandwidth", get, d.handleBandwidth)
	handle("/v1/events", getPost, d.handleEvents)
	handle("/v1/figures", getPost, d.handleFigures)
	handle("/v1/flight/trigger", []string{http.MethodPost}, d.handleFlightTrigger)
	d.extraRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint %s (see docs/DAEMON.md)", r.URL.Path))
	})
	return mux
}

// handleFlightTrigger is POST /v1/flight/trigger: the flight recorder
// writes a file with the window before now. Its files hold every user's
// events, so only clients that see all may ask.
func (d *Daemon) handleFlightTrigger(w http.ResponseWriter, r *http.Request, who *identity) {
	if len(r.URL.Query()) > 0 {
		writeError(w, http.StatusBadRequest, "/v1/flight/trigger takes no parameters")
		return
	}
	if !who.seesAll {
		writeError(w, http.StatusForbidden, "only root and access.see_all_groups may trigger the flight recorder: its files hold every user's events")
		return
	}
	if err := d.TriggerFlight("api"); err != nil {
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	writeJSON(w, http.StatusAccepted, magnetclient.FlightTriggered{Triggered: true, Files: d.flight.Load().Files()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, magnetclient.ErrorBody{Error: msg})
}

// badRequest answers 400 with err's message, without the filter package's
// marker; 403 when the client asked for groups it may not enable.
func badRequest(w http.ResponseWriter, err error) {
	if errors.As(err, new(errCostly)) {
		writeError(w, http.StatusForbidden, err.Error())
		return
	}
	writeError(w, http.StatusBadRequest, strings.TrimPrefix(err.Error(), filter.ErrBad.Error()+": "))
}

func (d *Daemon) handleStatus(w http.ResponseWriter, r *http.Request, who *identity) {
	if len(r.URL.Query()) > 0 {
		badRequest(w, errors.New("status takes no parameters"))
		return
	}
	s := d.settings()
	st := magnetclient.Status{
		PID:           os.Getpid(),
		StartedWallNs: d.started.UnixNano(),
		Recording:     d.hub.recorded.Load() && !d.stopping.Load(),
		Recorder:      d.hub.status(),
		Client:        magnetclient.ClientInfo{UID: who.uid, SeesAll: who.seesAll, Via: who.via},
	}
	st.Recorder.BufferBytes = s.bufBytes
	d.probeMu.Lock()
	if d.probe != nil {
		if missed, total, err := d.probe.MissedRuns(); err == nil {
			st.Recorder.Missed = total
			st.Recorder.MissedByProgram = map[string]uint64{}
			for _, m := range missed {
				st.Recorder.MissedByProgram[m.Program] = m.RecursionMisses
			}
		}
	}
	check := d.devCheck
	d.probeMu.Unlock()
	if check != nil {
		check.CheckLater()
		if rep, ok := check.Latest(); ok {
			st.Recorder.KernelSkipped = &rep.Skipped
			for _, c := range check.Counters(rep) {
				st.Recorder.KernelSkippedByInterface = append(st.Recorder.KernelSkippedByInterface, magnetclient.KernelSkipCount{
					NetNS: c.NetNS, Ifindex: c.Ifindex, Interface: c.Name, Program: c.Dir, Skipped: c.Total,
				})
			}
		}
	}
	d.hub.mu.Lock()
	tracked, open := d.hub.table.Len()
	st.Connections = magnetclient.TableStatus{Tracked: tracked, Open: open, Evicted: d.hub.table.Evicted(), Max: d.hub.table.Config().MaxConns}
	d.hub.mu.Unlock()
	d.subsMu.Lock()
	_, requested := d.requested()
	st.Groups = magnetclient.GroupStatus{
		Enabled:   names(event.Group(d.hub.enabled.Load())),
		Baseline:  names(s.baseline | event.GroupConn),
		Available: names(s.available),
		Requested: requested,
	}
	st.Subscribers = len(d.subs)
	st.Subscriptions = []magnetclient.SubscriptionStatus{}
	for _, sb := range d.subs {
		if !who.seesAll && sb.who.uid != who.uid {
			continue
		}
		st.Subscriptions = append(st.Subscriptions, magnetclient.SubscriptionStatus{
			ID: sb.id, Kind: sb.kind, UID: sb.who.uid, PID: sb.who.pid, Filter: sb.f.Spec(),
			Queue: cap(sb.q), Queued: len(sb.q), Delivered: sb.delivered.Load(), Dropped: sb.dropped.Load(),
			StartedWallNs: sb.started.UnixNano(),
		})
	}
	d.subsMu.Unlock()
	sortSubs(st.Subscriptions)
	writeJSON(w, http.StatusOK, st)
}

func names(g event.Group) []string {
	n := g.Names()
	if n == nil {
		n = []string{}
	}
	return n
}

func sortSubs(s []magnetclient.SubscriptionStatus) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j].ID < s[j-1].ID; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// windowOf reads window_events and window from a query.
func windowOf(q url.Values) (live.Window, error) {
	var w live.Window
	if v := q.Get("window_events"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 {
			return w, fmt.Errorf("window_events %q: want a number of events, at least 2", v)
		}
		w.Events = n
	}
	if v := q.Get("window"); v != "" {
		span, err := time.ParseDuration(v)
		if err != nil || span <= 0 {
			return w, fmt.Errorf("window %q: want a duration such as 1s", v)
		}
		w.Span = span
	}
	return w, nil
}

// connections lists the connections who may see and f selects, with
// their figures now.
func (d *Daemon) connections(who *identity, f *filter.Filter, w live.Window, state string) magnetclient.ConnectionList {
	h := d.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	w, _ = h.table.Resolve(w) // checked by the caller
	out := magnetclient.ConnectionList{NowNs: h.nowNs, Connections: []magnetclient.Connection{}}
	h.table.Each(func(c *live.Conn) {
		if !who.owns(c) || state == "open" && c.CloseNs != 0 || state == "closed" && c.CloseNs == 0 {
			return
		}
		if f != nil && !f.MatchConn(connView(c)) {
			return
		}
		out.Connections = append(out.Connections, c.Snapshot(w, h.nowNs))
	})
	return out
}

func connView(c *live.Conn) filter.Conn {
	v := filter.Conn{ID: c.ID, NetNS: c.Info.NetNS, Opened: c.Opened, Proto: c.Info.Proto, Local: c.Info.Local, Remote: c.Info.Remote}
	if c.Owner != nil {
		v.HasOwner, v.OwnerPID, v.OwnerUID, v.OwnerComm = true, c.Owner.PID, c.Owner.UID, c.Owner.Comm
	}
	return v
}

// connFilter parses the connection-selecting part of a query.
func connFilter(q url.Values, extra ...string) (*filter.Filter, error) {
	spec, err := filter.FromQuery(q, extra...)
	if err != nil {
		return nil, err
	}
	f, err := filter.Parse(spec, filter.Options{NetNS: resolveNetNS, HasField: hasField})
	if err != nil {
		return nil, err
	}
	return f, f.OnlyConnKeys()
}

func (d *Daemon) checkWindow(w live.Window) error {
	d.hub.mu.Lock()
	defer d.hub.mu.Unlock()
	_, err := d.hub.table.Resolve(w)
	return err
}

func (d *Daemon) handleConnections(w http.ResponseWriter, r *http.Request, who *identity) {
	q := r.URL.Query()
	f, err := connFilter(q, "state", "window_events", "window", "delivery")
	if err == nil {
		err = d.pullDelivery(q, who)
	}
	if err != nil {
		badRequest(w, err)
		return
	}
	state := q.Get("state")
	switch state {
	case "", "all", "open", "closed":
	default:
		badRequest(w, fmt.Errorf("state %q: want open, closed or all", state))
		return
	}
	win, err := windowOf(q)
	if err == nil {
		err = d.checkWindow(win)
	}
	if err != nil {
		badRequest(w, err)
		return
	}
	writeJSON(w, http.StatusOK, d.connections(who, f, win, state))
}

// lookup finds the connection of the request's {id} that who may see, or
// answers the request (400, 403, 404) and returns nil. h.mu must be held.
func (d *Daemon) lookup(w http.ResponseWriter, r *http.Request, who *identity) *live.Conn {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	if err != nil {
		badRequest(w, fmt.Errorf("connection id %q: want a number", r.PathValue("id")))
		return nil
	}
	c := d.hub.table.Get(id)
	if c == nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("connection %d: not tracked (never seen, or forgotten after it closed)", id))
		return nil
	}
	if !who.owns(c) {
		writeError(w, http.StatusForbidden, fmt.Sprintf("connection %d: owned by another user", id))
		return nil
	}
	return c
}

func (d *Daemon) handleConnection(w http.ResponseWriter, r *http.Request, who *identity) {
	q := r.URL.Query()
	for k := range q {
		if k != "window_events" && k != "window" && k != "delivery" {
			badRequest(w, fmt.Errorf("unknown parameter %q", k))
			return
		}
	}
	win, err := windowOf(q)
	if err == nil {
		err = d.pullDelivery(q, who)
	}
	if err != nil {
		badRequest(w, err)
		return
	}
	h := d.hub
	h.mu.Lock()
	if win, err = h.table.Resolve(win); err != nil {
		h.mu.Unlock()
		badRequest(w, err)
		return
	}
	c := d.lookup(w, r, who)
	if c == nil {
		h.mu.Unlock()
		return
	}
	snap := c.Snapshot(win, h.nowNs)
	h.mu.Unlock()
	writeJSON(w, http.StatusOK, snap)
}

func (d *Daemon) handleBandwidth(w http.ResponseWriter, r *http.Request, who *identity) {
	q := r.URL.Query()
	for k := range q {
		switch k {
		case "layer", "dir", "window_events", "window", "delivery":
		default:
			badRequest(w, fmt.Errorf("unknown parameter %q", k))
			return
		}
	}
	layer := live.App
	switch q.Get("layer") {
	case "", "app":
	case "tcp":
		layer = live.TCP
	case "wire":
		layer = live.Wire
	default:
		badRequest(w, fmt.Errorf("layer %q: want app, tcp or wire", q.Get("layer")))
		return
	}
	dirName := q.Get("dir")
	switch dirName {
	case "", "auto", "recv", "send":
	default:
		badRequest(w, fmt.Errorf("dir %q: want recv, send or auto", dirName))
		return
	}
	win, err := windowOf(q)
	if err == nil && win.Events > 0 && win.Span > 0 {
		err = errors.New("give window_events or window, not both")
	}
	if err == nil {
		err = d.pullDelivery(q, who)
	}
	if err != nil {
		badRequest(w, err)
		return
	}
	h := d.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	byTime := win.Span > 0
	if _, err := h.table.Resolve(win); err != nil {
		badRequest(w, err)
		return
	}
	if !byTime && win.Events == 0 {
		win.Events = h.table.Config().WindowEvents
	}
	c := d.lookup(w, r, who)
	if c == nil {
		return
	}
	dir := live.Recv
	switch dirName {
	case "send":
		dir = live.Send
	case "", "auto":
		dir = c.MainDir(layer)
	}
	out := magnetclient.Bandwidth{Conn: c.ID, Layer: live.LayerNames[layer], Dir: map[live.Dir]string{live.Send: "send", live.Recv: "recv"}[dir], NowNs: h.nowNs, LastNs: c.StreamLastNs(layer, dir)}
	span := h.table.Config().Window
	if byTime {
		out.WindowNs = int64(win.Span)
		out.Rate = c.Rate(layer, dir, 0, win.Span, h.nowNs)
		span = win.Span
	} else {
		out.WindowEvents = win.Events
		out.Rate = c.Rate(layer, dir, win.Events, 0, h.nowNs)
	}
	out.Delivery = c.Delivery(uint64(span), h.nowNs)
	writeJSON(w, http.StatusOK, out)
}

// streamRequest reads a stream's filter and options: from the query (GET)
// or a JSON body (POST), and whether the client wants server-sent events.
func streamRequest(r *http.Request, kind string) (magnetclient.Request, bool, error) {
	q := r.URL.Query()
	format := q.Get("format")
	sse := format == "sse" || format == "" && strings.Contains(r.Header.Get("Accept"), "text/event-stream")
	if format != "" && format != "sse" && format != "ndjson" {
		return magnetclient.Request{}, false, fmt.Errorf("format %q: want ndjson or sse", format)
	}
	opts := []string{"format", "queue"}
	if kind == kindFigures {
		opts = []string{"format", "every", "change", "metric", "window_events", "window", "delivery"}
	}
	var req magnetclient.Request
	if r.Method == http.MethodPost {
		for k := range q {
			if k != "format" {
				return req, sse, fmt.Errorf("POST takes its filter and options in the body, not %q in the query", k)
			}
		}
		dec := json.NewDecoder(io.LimitReader(r.Body, maxBody+1))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			if errors.Is(err, io.EOF) {
				return req, sse, nil // an empty body: no filter
			}
			return req, sse, fmt.Errorf("body: %s", strings.TrimPrefix(err.Error(), "json: "))
		}
		if dec.More() {
			return req, sse, errors.New("body: one JSON object, please")
		}
		if kind == kindEvents && (req.Every != "" || req.Change != 0 || req.Metric != "" || req.WindowEvents != 0 || req.Window != "" || req.Delivery) {
			return req, sse, errors.New("every, change, metric, windows and delivery are for /v1/figures")
		}
		if kind == kindFigures && req.Queue != 0 {
			return req, sse, errors.New("queue is for /v1/events")
		}
		return req, sse, nil
	}
	spec, err := filter.FromQuery(q, opts...)
	if err != nil {
		return req, sse, err
	}
	req.Filter = spec
	if v := q.Get("queue"); v != "" {
		if req.Queue, err = strconv.Atoi(v); err != nil {
			return req, sse, fmt.Errorf("queue %q: want a number of events", v)
		}
	}
	req.Every, req.Metric, req.Window = q.Get("every"), q.Get("metric"), q.Get("window")
	if v := q.Get("change"); v != "" {
		if req.Change, err = strconv.ParseFloat(v, 64); err != nil {
			return req, sse, fmt.Errorf("change %q: want a percentage", v)
		}
	}
	if v := q.Get("window_events"); v != "" {
		if req.WindowEvents, err = strconv.Atoi(v); err != nil {
			return req, sse, fmt.Errorf("window_events %q: want a number of events", v)
		}
	}
	if req.Delivery, err = boolParam(q, "delivery"); err != nil {
		return req, sse, err
	}
	return req, sse, nil
}

// parseStream reads a stream request of the given kind and parses its
// filter; on failure it has answered (413 for a body over maxBody, else
// 400) and ok is false.
func parseStream(w http.ResponseWriter, r *http.Request, kind string) (req magnetclient.Request, sse bool, f *filter.Filter, ok bool) {
	if r.ContentLength > maxBody {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", maxBody))
		return req, sse, nil, false
	}
	req, sse, err := streamRequest(r, kind)
	if err == nil {
		f, err = filter.Parse(req.Filter, filter.Options{NetNS: resolveNetNS, Kernel: kernelType, HasField: hasField})
	}
	if err != nil {
		badRequest(w, err)
		return req, sse, nil, false
	}
	return req, sse, f, true
}

func (d *Daemon) handleEvents(w http.ResponseWriter, r *http.Request, who *identity) {
	req, sse, f, ok := parseStream(w, r, kindEvents)
	if !ok {
		return
	}
	s := d.settings()
	if extra := f.Groups() &^ s.available; extra != 0 {
		badRequest(w, fmt.Errorf("%s: not loaded by this daemon (events.available is %s)", extra, s.available))
		return
	}
	if err := d.mayEnable(who, f.Groups()); err != nil {
		writeError(w, http.StatusForbidden, err.Error())
		return
	}
	queue := req.Queue
	if queue == 0 {
		queue = s.Subscribers.Queue
	}
	if queue < 1 || queue > s.Subscribers.MaxQueue {
		badRequest(w, fmt.Errorf("queue %d: want 1 to %d", queue, s.Subscribers.MaxQueue))
		return
	}
	sb := &sub{kind: kindEvents, who: *who, f: f, q: make(chan item, queue), started: time.Now(), stop: d.stop}
	d.serveStream(w, r, sb, sse)
}

func (d *Daemon) handleFigures(w http.ResponseWriter, r *http.Request, who *identity) {
	req, sse, f, ok := parseStream(w, r, kindFigures)
	if !ok {
		return
	}
	if err := f.OnlyConnKeys(); err != nil {
		badRequest(w, err)
		return
	}
	var (
		fo  figureOpts
		err error
	)
	if req.Every != "" {
		if fo.every, err = time.ParseDuration(req.Every); err != nil || fo.every < 10*time.Millisecond {
			badRequest(w, fmt.Errorf("every %q: want a duration of at least 10ms", req.Every))
			return
		}
	}
	if req.Change < 0 || req.Change > 1e6 {
		badRequest(w, fmt.Errorf("change %g: want a percentage above 0", req.Change))
		return
	}
	fo.change = req.Change
	if fo.every == 0 && fo.change == 0 {
		fo.every = time.Second
	}
	metric := req.Metric
	if metric == "" {
		metric = "app.recv.by_events.bps"
	}
	if fo.metric, err = metricOf(metric); err != nil {
		badRequest(w, err)
		return
	}
	fo.window.Events = req.WindowEvents
	if req.Window != "" {
		if fo.window.Span, err = time.ParseDuration(req.Window); err != nil {
			badRequest(w, fmt.Errorf("window %q: want a duration such as 1s", req.Window))
			return
		}
	}
	if err := d.checkWindow(fo.window); err != nil {
		badRequest(w, err)
		return
	}
	fo.delivery = req.Delivery || strings.HasPrefix(metric, "delivery.")
	want := figureGroups
	if fo.delivery {
		want |= event.GroupRate
	}
	if err := d.mayEnable(who, want); err != nil {
		writeError(w, http.StatusForbidden, err.Error())
		return
	}
	if missing := want &^ d.settings().available; missing != 0 {
		d.logf("figure stream: %s not loaded; those figures stay at zero", missing)
	}
	sb := &sub{kind: kindFigures, who: *who, f: f, started: time.Now(), stop: d.stop, fig: fo}
	d.serveStream(w, r, sb, sse)
}

// serveStream registers a subscription, opens the stream with its
// subscribed line, and serves it until either side ends it.
func (d *Daemon) serveStream(w http.ResponseWriter, r *http.Request, sb *sub, sse bool) {
	// The writer exists before the subscription is registered, so that a
	// shutdown can set its deadline; the header goes out once registered.
	out := newStreamWriter(w, sse)
	sb.out = out
	if err := d.register(sb); err != nil {
		status := http.StatusServiceUnavailable
		if errors.As(err, new(errUserLimit)) {
			status = http.StatusTooManyRequests
		}
		writeError(w, status, err.Error())
		return
	}
	defer d.unregister(sb)
	out.start()
	err := out.msgJSON("subscribed", magnetclient.Subscribed{
		ID: sb.id, Kind: sb.kind, Groups: names(event.Group(d.hub.enabled.Load())), Filter: sb.f.Spec(), Queue: cap(sb.q),
	})
	if err == nil {
		err = out.flush()
	}
	if err != nil {
		return
	}
	if sb.kind == kindEvents {
		sb.serveEvents(r.Context(), out)
	} else {
		sb.serveFigures(r.Context(), out, d)
	}
}
