// SPDX-License-Identifier: Apache-2.0

// Package magnetclient is the Go client of magnet's daemon (`magnet
// daemon`, docs/DAEMON.md): the connections it tracks and their figures
// (bandwidth over a sliding window, TCP state, the kernel's delivery rate),
// pulled on demand or pushed periodically, and filtered event streams.
//
// A Client is safe for concurrent use. Streams (Subscribe, Push) hold one
// connection each until closed.
package magnetclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// DefaultSocket is where the daemon listens unless told otherwise.
const DefaultSocket = "/run/magnet.sock"

// Errors an *Error matches with errors.Is, by HTTP status.
var (
	ErrBadRequest   = errors.New("bad request")
	ErrUnauthorized = errors.New("unauthorized")
	ErrForbidden    = errors.New("forbidden")
	ErrNotFound     = errors.New("not found")
	ErrUnavailable  = errors.New("unavailable")
	ErrUserLimit    = errors.New("too many requests") // the user holds subscribers.per_user streams
)

// Error is an error answer of the daemon.
type Error struct {
	Status  int    // HTTP status
	Message string // the daemon's one-line explanation
}

func (e *Error) Error() string {
	return fmt.Sprintf("magnet daemon: %s (%d)", e.Message, e.Status)
}

// Is matches the Err* values by status.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrBadRequest:
		return e.Status == http.StatusBadRequest
	case ErrUnauthorized:
		return e.Status == http.StatusUnauthorized
	case ErrForbidden:
		return e.Status == http.StatusForbidden
	case ErrNotFound:
		return e.Status == http.StatusNotFound
	case ErrUnavailable:
		return e.Status == http.StatusServiceUnavailable
	case ErrUserLimit:
		return e.Status == http.StatusTooManyRequests
	}
	return false
}

// Client talks to one daemon.
type Client struct {
	hc    *http.Client
	base  string
	token string
	tr    *http.Transport
}

// Option configures Dial.
type Option func(*Client)

// WithToken sends the bearer token the daemon's TCP listener requires.
func WithToken(token string) Option {
	return func(c *Client) { c.token = strings.TrimSpace(token) }
}

// Dial prepares a client of the daemon at addr and checks that something
// listens there. addr is a Unix socket path ("/run/magnet.sock",
// "unix:/run/magnet.sock"), or "tcp://HOST:PORT" for the daemon's TCP
// listener (which needs WithToken); "" means DefaultSocket.
func Dial(addr string, opts ...Option) (*Client, error) {
	network, address := "unix", addr
	switch {
	case addr == "":
		address = DefaultSocket
	case strings.HasPrefix(addr, "unix:"):
		address = strings.TrimPrefix(strings.TrimPrefix(addr, "unix:"), "//")
	case strings.HasPrefix(addr, "tcp://"):
		network, address = "tcp", strings.TrimPrefix(addr, "tcp://")
	}
	c := &Client{base: "http://magnet"}
	for _, o := range opts {
		o(c)
	}
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}
	conn, err := dial(context.Background(), "", "")
	if err != nil {
		return nil, fmt.Errorf("connect to magnet daemon at %s: %w", address, err)
	}
	conn.Close()
	c.tr = &http.Transport{DialContext: dial, MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second}
	c.hc = &http.Client{Transport: c.tr}
	return c, nil
}

// Close releases idle connections. Open streams stay open until closed.
func (c *Client) Close() error {
	c.tr.CloseIdleConnections()
	return nil
}

// Status returns the daemon's status.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var s Status
	return &s, c.getJSON(ctx, "/v1/status", nil, &s)
}

// TriggerFlight asks the daemon's flight recorder for a file with the
// window before now (root and see-all clients only; an *Error with
// Status 404 when the daemon runs none).
func (c *Client) TriggerFlight(ctx context.Context) (*FlightTriggered, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/flight/trigger", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var ft FlightTriggered
	if err := json.NewDecoder(resp.Body).Decode(&ft); err != nil {
		return nil, fmt.Errorf("magnet daemon: decode /v1/flight/trigger: %w", err)
	}
	return &ft, nil
}

// PullOption changes a pull request (Connections, Connection).
type PullOption func(url.Values)

// WithDelivery asks for the kernel's delivery-rate figures too
// (Connection.Delivery): the daemon enables the rate group for 30 s from
// each such request, so the first answer may lack them.
func WithDelivery() PullOption {
	return func(q url.Values) { q.Set("delivery", "true") }
}

// Connections returns the connections the filter selects (its Types,
// Groups and Expr are not allowed here), with their figures now.
func (c *Client) Connections(ctx context.Context, f Filter, w Window, opts ...PullOption) ([]Connection, error) {
	q := f.Values()
	w.addTo(q)
	for _, o := range opts {
		o(q)
	}
	var l ConnectionList
	if err := c.getJSON(ctx, "/v1/connections", q, &l); err != nil {
		return nil, err
	}
	return l.Connections, nil
}

// Connection returns one connection with its figures now. Another user's
// connection is ErrForbidden, an unknown one ErrNotFound.
func (c *Client) Connection(ctx context.Context, id uint64, w Window, opts ...PullOption) (*Connection, error) {
	q := url.Values{}
	w.addTo(q)
	for _, o := range opts {
		o(q)
	}
	var conn Connection
	return &conn, c.getJSON(ctx, "/v1/connections/"+strconv.FormatUint(id, 10), q, &conn)
}

// BandwidthQuery chooses the figure Bandwidth returns.
type BandwidthQuery struct {
	Layer  string        // "app" (default), "tcp", "wire"
	Dir    string        // "recv", "send", "auto" (default)
	Events int           // window of this many events (default: the daemon's, 1000)
	Window time.Duration // or a time window
	// Delivery asks for the kernel's delivery-rate figures too: the daemon
	// enables the rate group for 30 s from each such request, so the first
	// answer may lack them.
	Delivery bool
}

// Bandwidth returns one connection's bandwidth now (pull).
func (c *Client) Bandwidth(ctx context.Context, id uint64, bq BandwidthQuery) (*Bandwidth, error) {
	q := url.Values{}
	if bq.Layer != "" {
		q.Set("layer", bq.Layer)
	}
	if bq.Dir != "" {
		q.Set("dir", bq.Dir)
	}
	Window{Events: bq.Events, Ns: int64(bq.Window)}.addTo(q)
	if bq.Delivery {
		q.Set("delivery", "true")
	}
	var b Bandwidth
	return &b, c.getJSON(ctx, "/v1/connections/"+strconv.FormatUint(id, 10)+"/bandwidth", q, &b)
}

// Subscribe opens a stream of the events f selects. It returns once the
// subscription is registered: events from then on are delivered. queue is
// the subscription's queue length (0: the daemon's default).
func (c *Client) Subscribe(ctx context.Context, f Filter, queue int) (*Stream, error) {
	return c.stream(ctx, "/v1/events", Request{Filter: f, Queue: queue})
}

// PushOptions say when a figure stream pushes.
type PushOptions struct {
	Every        time.Duration // push every P
	Change       float64       // or when Metric changed by this many percent
	Metric       string        // default "app.recv.by_events.bps"
	WindowEvents int
	Window       time.Duration
	Delivery     bool // the kernel's delivery-rate figures too (enables the rate group while the stream lasts)
}

// Push opens a stream of the figures of the connections f selects.
func (c *Client) Push(ctx context.Context, f Filter, o PushOptions) (*Stream, error) {
	r := Request{Filter: f, Change: o.Change, Metric: o.Metric, WindowEvents: o.WindowEvents, Delivery: o.Delivery}
	if o.Every > 0 {
		r.Every = o.Every.String()
	}
	if o.Window > 0 {
		r.Window = o.Window.String()
	}
	return c.stream(ctx, "/v1/figures", r)
}

// Stream is an open subscription.
type Stream struct {
	body       io.ReadCloser
	dec        *json.Decoder
	subscribed Subscribed
}

// Subscribed is the stream's first line: its id, and the groups enabled.
func (s *Stream) Subscribed() Subscribed { return s.subscribed }

// Next returns the next message. It returns io.EOF once the daemon ended
// the stream (after an End message, or when it went away).
func (s *Stream) Next() (Message, error) {
	var m Message
	if err := s.dec.Decode(&m); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = io.EOF
		}
		return m, err
	}
	return m, nil
}

// Close ends the subscription.
func (s *Stream) Close() error { return s.body.Close() }

func (c *Client) stream(ctx context.Context, path string, r Request) (*Stream, error) {
	body, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	s := &Stream{body: resp.Body, dec: json.NewDecoder(resp.Body)}
	// Event fields are u64 and u32 counters, sequence numbers, times: as
	// float64 they would print as 1.866730584e+09 and lose digits past 2^53.
	s.dec.UseNumber()
	m, err := s.Next()
	if err != nil {
		resp.Body.Close()
		return nil, fmt.Errorf("magnet daemon: read stream start: %w", err)
	}
	if m.Subscribed == nil {
		resp.Body.Close()
		return nil, errors.New("magnet daemon: stream did not start with a subscribed line")
	}
	s.subscribed = *m.Subscribed
	return s, nil
}

func (c *Client) getJSON(ctx context.Context, path string, q url.Values, out any) error {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("magnet daemon: decode %s: %w", path, err)
	}
	return nil
}

// do sends req and turns an error answer into an *Error.
func (c *Client) do(req *http.Request) (*http.Response, error) {
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("magnet daemon: %w", err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	var eb ErrorBody
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(data, &eb) != nil || eb.Error == "" {
		eb.Error = strings.TrimSpace(string(data))
		if eb.Error == "" {
			eb.Error = http.StatusText(resp.StatusCode)
		}
	}
	return nil, &Error{Status: resp.StatusCode, Message: eb.Error}
}

// Values encodes the filter as query parameters (docs/DAEMON.md#filters).
func (f Filter) Values() url.Values {
	q := url.Values{}
	add := func(key string, vals []string) {
		if len(vals) > 0 {
			q.Set(key, strings.Join(vals, ","))
		}
	}
	add("types", f.Types)
	add("groups", f.Groups)
	add("conns", fmtUints(f.Conns))
	add("pids", fmtUints(f.PIDs))
	add("uids", fmtUints(f.UIDs))
	add("comms", f.Comms)
	add("ports", fmtUints(f.Ports))
	add("lports", fmtUints(f.LocalPorts))
	add("rports", fmtUints(f.RemotePorts))
	add("addrs", f.Addrs)
	add("netns", f.NetNS)
	add("protos", f.Protos)
	if f.Expr != "" {
		q.Set("expr", f.Expr)
	}
	if f.Pcap != "" {
		q.Set("pcap", f.Pcap)
	}
	return q
}

func (w Window) addTo(q url.Values) {
	if w.Events > 0 {
		q.Set("window_events", strconv.Itoa(w.Events))
	}
	if w.Ns > 0 {
		q.Set("window", time.Duration(w.Ns).String())
	}
}

func fmtUints[T uint16 | uint32 | uint64](vs []T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = strconv.FormatUint(uint64(v), 10)
	}
	return out
}
