// SPDX-License-Identifier: Apache-2.0

// Package metrics exposes the daemon's figures to Prometheus, in the text
// exposition format (version 0.0.4): the recorder's events and losses by
// type, the event groups enabled, the connection table, the subscriptions
// and what each one dropped, host totals, and per-connection figures for at
// most a configured number of connections (the busiest), the others counted.
//
// It reads the daemon's state only through the API's types (a Status and a
// connection list, as a see-all client gets them), so it depends on nothing
// inside the daemon.
package metrics

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// ContentType is the exposition format's media type.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// DefaultMaxConnections is how many connections get their own series
// unless configured otherwise.
const DefaultMaxConnections = 100

// Snapshot is the daemon's state at one moment, as a see-all client of the
// API sees it.
type Snapshot struct {
	Status      magnetclient.Status
	Connections []magnetclient.Connection
	// MaxConnections is how many connections get their own series: the
	// busiest by application rate (then by id). 0 means none, negative
	// DefaultMaxConnections.
	MaxConnections int
}

// Collector turns snapshots into expositions. It keeps the host's byte
// totals across scrapes: a connection's bytes are added once, even after
// the daemon has forgotten it. The zero Collector is ready; it is safe for
// concurrent use.
type Collector struct {
	mu     sync.Mutex
	seen   map[uint64][numTotals]int64 // bytes per connection at the last scrape
	totals [numTotals]int64            // host bytes, by layer and direction
}

// The layers and directions of host totals, in exposition order.
var totalKeys = [...]struct{ layer, dir string }{
	{"app", "recv"}, {"app", "send"}, {"tcp", "recv"}, {"tcp", "send"}, {"wire", "recv"}, {"wire", "send"},
}

const numTotals = len(totalKeys)

func directions(c *magnetclient.Connection) [numTotals]*magnetclient.Direction {
	return [numTotals]*magnetclient.Direction{
		&c.App.Recv, &c.App.Send, &c.TCP.Recv, &c.TCP.Send, &c.Wire.Recv, &c.Wire.Send,
	}
}

// Handler serves the exposition of the snapshot snap returns at each
// request.
func (col *Collector) Handler(snap func(ctx context.Context) (Snapshot, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "metrics: use GET", http.StatusMethodNotAllowed)
			return
		}
		s, err := snap(r.Context())
		if err != nil {
			http.Error(w, "metrics: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", ContentType)
		col.Write(w, s)
	})
}

// Write writes the exposition of s to w.
func (col *Collector) Write(w io.Writer, s Snapshot) error {
	bw := bufio.NewWriter(w)
	e := &expo{w: bw}
	col.write(e, s)
	if e.err != nil {
		return e.err
	}
	return bw.Flush()
}

func (col *Collector) write(e *expo, s Snapshot) {
	st := s.Status
	e.family("magnet_daemon_start_time_seconds", "gauge", "When the daemon started, in seconds since the epoch.")
	e.sample(nil, float64(st.StartedWallNs)/1e9)
	e.family("magnet_recording", "gauge", "1 while the recorder runs.")
	e.sample(nil, boolValue(st.Recording))

	e.family("magnet_recorder_events_total", "counter", "Events the recorder delivered, by type.")
	for _, t := range sortedKeys(st.Recorder.EventsByType) {
		e.sample(labels{"type", t}, float64(st.Recorder.EventsByType[t]))
	}
	e.family("magnet_recorder_lost_events_total", "counter", "Events lost in the kernel because a ring buffer was full, by type.")
	// Every type recorded or lost, zero included, so that rate() has a
	// series from the start.
	for _, t := range sortedUnique(append(sortedKeys(st.Recorder.EventsByType), sortedKeys(st.Recorder.LostByType)...)) {
		e.sample(labels{"type", t}, float64(st.Recorder.LostByType[t]))
	}
	e.family("magnet_recorder_missed_runs_total", "counter", "Runs of the recorder's BPF programs the kernel skipped (recursion protection), by program: their events were never made, and are not among the lost.")
	for _, p := range sortedKeys(st.Recorder.MissedByProgram) {
		e.sample(labels{"program", p}, float64(st.Recorder.MissedByProgram[p]))
	}
	e.family("magnet_recorder_kernel_skipped_runs_total", "counter", "Device program runs the kernel did not make for frames an interface counted (its own packet counters), by network namespace, interface and program: their events are missing, and are neither lost nor missed.")
	for _, k := range st.Recorder.KernelSkippedByInterface {
		e.sample(labels{"netns", strconv.FormatUint(uint64(k.NetNS), 10), "interface", k.Interface, "program", k.Program}, float64(k.Skipped))
	}
	e.family("magnet_recorder_buffer_bytes", "gauge", "Size of the kernel ring buffer.")
	e.sample(nil, float64(st.Recorder.BufferBytes))

	e.family("magnet_event_group_enabled", "gauge", "1 for each event group enabled now, 0 for those loaded but off.")
	enabled := map[string]bool{}
	for _, g := range st.Groups.Enabled {
		enabled[g] = true
	}
	for _, g := range sortedUnique(append(slices.Clone(st.Groups.Available), st.Groups.Enabled...)) {
		e.sample(labels{"group", g}, boolValue(enabled[g]))
	}

	e.family("magnet_connections_tracked", "gauge", "Connections in the daemon's table.")
	e.sample(nil, float64(st.Connections.Tracked))
	e.family("magnet_connections_open", "gauge", "Connections in the table not yet closed.")
	e.sample(nil, float64(st.Connections.Open))
	e.family("magnet_connections_evicted_total", "counter", "Connections forgotten because the table was full.")
	e.sample(nil, float64(st.Connections.Evicted))
	e.family("magnet_connections_max", "gauge", "The connection table's limit.")
	e.sample(nil, float64(st.Connections.Max))

	e.family("magnet_subscribers", "gauge", "Subscriptions open now (event and figure streams).")
	e.sample(nil, float64(st.Subscribers))
	subs := slices.Clone(st.Subscriptions)
	slices.SortFunc(subs, func(a, b magnetclient.SubscriptionStatus) int { return cmp.Compare(a.ID, b.ID) })
	subLabels := func(s magnetclient.SubscriptionStatus) labels {
		return labels{"id", strconv.FormatUint(s.ID, 10), "kind", s.Kind, "uid", strconv.FormatUint(uint64(s.UID), 10)}
	}
	e.family("magnet_subscriber_delivered_total", "counter", "Messages delivered to each subscription.")
	for _, s := range subs {
		e.sample(subLabels(s), float64(s.Delivered))
	}
	e.family("magnet_subscriber_dropped_total", "counter", "Events dropped for each subscription because its queue was full.")
	for _, s := range subs {
		e.sample(subLabels(s), float64(s.Dropped))
	}
	e.family("magnet_subscriber_queued", "gauge", "Events waiting in each subscription's queue.")
	for _, s := range subs {
		e.sample(subLabels(s), float64(s.Queued))
	}
	e.family("magnet_subscriber_queue_length", "gauge", "Each subscription's queue capacity.")
	for _, s := range subs {
		e.sample(subLabels(s), float64(s.Queue))
	}

	conns := s.Connections
	totals := col.addTotals(conns)
	e.family("magnet_host_bytes_total", "counter", "Bytes of every connection the daemon tracked, by layer and direction.")
	for i, k := range totalKeys {
		e.sample(labels{"layer", k.layer, "dir", k.dir}, float64(totals[i]))
	}
	e.family("magnet_host_bandwidth_bits_per_second", "gauge", "Sum over tracked connections of the rate over the daemon's time window, by layer and direction.")
	var rates [numTotals]float64
	for i := range conns {
		for j, d := range directions(&conns[i]) {
			rates[j] += d.ByTime.BPS
		}
	}
	for i, k := range totalKeys {
		e.sample(labels{"layer", k.layer, "dir", k.dir}, rates[i])
	}

	// Per-connection series: the busiest connections, the rest counted.
	limit := s.MaxConnections
	if limit < 0 {
		limit = DefaultMaxConnections
	}
	busy := slices.Clone(conns)
	slices.SortFunc(busy, func(a, b magnetclient.Connection) int {
		if c := cmp.Compare(appRate(b), appRate(a)); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	omitted := max(len(busy)-limit, 0)
	busy = busy[:len(busy)-omitted]
	slices.SortFunc(busy, func(a, b magnetclient.Connection) int { return cmp.Compare(a.ID, b.ID) })

	e.family("magnet_connection_series_limit", "gauge", "How many connections get their own series.")
	e.sample(nil, float64(limit))
	e.family("magnet_connections_omitted", "gauge", "Tracked connections left out of the per-connection series by the limit (the least busy).")
	e.sample(nil, float64(omitted))

	connLabels := func(c *magnetclient.Connection, extra ...string) labels {
		comm := ""
		if c.Owner != nil {
			comm = c.Owner.Comm
		}
		return append(labels{"conn", strconv.FormatUint(c.ID, 10), "proto", c.Proto,
			"local", c.Local, "remote", c.Remote, "comm", comm}, extra...)
	}
	e.family("magnet_connection_bytes_total", "counter", "A connection's bytes, by layer and direction.")
	for i := range busy {
		for j, d := range directions(&busy[i]) {
			e.sample(connLabels(&busy[i], "layer", totalKeys[j].layer, "dir", totalKeys[j].dir), float64(d.Bytes))
		}
	}
	e.family("magnet_connection_bandwidth_bits_per_second", "gauge", "A connection's rate over the daemon's time window, by layer and direction.")
	for i := range busy {
		for j, d := range directions(&busy[i]) {
			e.sample(connLabels(&busy[i], "layer", totalKeys[j].layer, "dir", totalKeys[j].dir), d.ByTime.BPS)
		}
	}
	e.family("magnet_connection_window_bandwidth_bits_per_second", "gauge", "A connection's rate over its last window of events (MAGNET 2.0's figure), by layer and direction.")
	for i := range busy {
		for j, d := range directions(&busy[i]) {
			e.sample(connLabels(&busy[i], "layer", totalKeys[j].layer, "dir", totalKeys[j].dir), d.ByEvents.BPS)
		}
	}
	tcpGauge := func(name, help string, v func(*magnetclient.TCPState) float64) {
		e.family(name, "gauge", help)
		for i := range busy {
			if s := busy[i].State; s != nil {
				e.sample(connLabels(&busy[i]), v(s))
			}
		}
	}
	tcpGauge("magnet_connection_delivery_rate_bits_per_second", "The kernel's last delivery-rate sample for a TCP connection.",
		func(s *magnetclient.TCPState) float64 { return s.DeliveryRateBPS })
	tcpGauge("magnet_connection_delivery_app_limited", "1 when that sample was taken while the application limited sending.",
		func(s *magnetclient.TCPState) float64 { return boolValue(s.DeliveryAppLimited) })
	e.family("magnet_connection_lost_segments_total", "counter", "Segments of a TCP connection the kernel counted lost (tcp_state.lost, its estimate).")
	for i := range busy {
		if s := busy[i].State; s != nil {
			e.sample(connLabels(&busy[i]), float64(s.Lost))
		}
	}
	deliveryGauge := func(name, help string, v func(*magnetclient.DeliveryWindow) float64) {
		e.family(name, "gauge", help)
		for i := range busy {
			if d := busy[i].Delivery; d != nil {
				e.sample(connLabels(&busy[i]), v(&d.Window))
			}
		}
	}
	deliveryGauge("magnet_connection_delivery_window_mean_bits_per_second", "The mean of a TCP connection's per-ACK delivery-rate samples not app-limited over the time window, each weighted by its interval (rate group).",
		func(w *magnetclient.DeliveryWindow) float64 { return w.MeanBPS })
	deliveryGauge("magnet_connection_delivery_window_max_bits_per_second", "The fastest of those samples.",
		func(w *magnetclient.DeliveryWindow) float64 { return w.MaxBPS })
	deliveryGauge("magnet_connection_delivery_window_app_limited_samples", "Per-ACK delivery-rate samples over the time window that the application limited.",
		func(w *magnetclient.DeliveryWindow) float64 { return float64(w.AppLimited) })
	tcpGauge("magnet_connection_cwnd_segments", "A TCP connection's congestion window.",
		func(s *magnetclient.TCPState) float64 { return float64(s.Cwnd) })
	tcpGauge("magnet_connection_srtt_seconds", "A TCP connection's smoothed round-trip time.",
		func(s *magnetclient.TCPState) float64 { return float64(s.SrttUs) / 1e6 })
	e.family("magnet_connection_retransmits_total", "counter", "A connection's retransmitted segments.")
	for i := range busy {
		e.sample(connLabels(&busy[i]), float64(busy[i].Retransmits.Count))
	}
	e.family("magnet_connection_drops_total", "counter", "Packets of a connection the kernel dropped.")
	for i := range busy {
		e.sample(connLabels(&busy[i]), float64(busy[i].Drops.Count))
	}
	e.family("magnet_connection_send_buffer_bytes", "gauge", "Bytes a connection's application wrote that are not acknowledged yet.")
	for i := range busy {
		if sb := busy[i].SendBuffer; sb != nil {
			e.sample(connLabels(&busy[i]), float64(sb.Bytes))
		}
	}
}

// addTotals adds to the host totals what each connection moved since the
// last scrape, and returns them. A connection seen with fewer bytes than
// before was forgotten and tracked afresh: all its bytes are new.
func (col *Collector) addTotals(conns []magnetclient.Connection) [numTotals]int64 {
	col.mu.Lock()
	defer col.mu.Unlock()
	next := make(map[uint64][numTotals]int64, len(conns))
	for i := range conns {
		c := &conns[i]
		prev := col.seen[c.ID]
		var now [numTotals]int64
		for j, d := range directions(c) {
			now[j] = d.Bytes
			delta := d.Bytes - prev[j]
			if delta < 0 {
				delta = d.Bytes
			}
			col.totals[j] += delta
		}
		next[c.ID] = now
	}
	col.seen = next
	return col.totals
}

func appRate(c magnetclient.Connection) float64 {
	return c.App.Send.ByTime.BPS + c.App.Recv.ByTime.BPS
}

// expo writes the exposition format, remembering the first write error.
type expo struct {
	w    *bufio.Writer
	name string
	err  error
}

// labels are name, value pairs.
type labels []string

func (e *expo) family(name, typ, help string) {
	e.name = name
	e.printf("# HELP %s %s\n# TYPE %s %s\n", name, escapeHelp(help), name, typ)
}

func (e *expo) sample(l labels, v float64) {
	var b strings.Builder
	b.WriteString(e.name)
	if len(l) > 0 {
		b.WriteByte('{')
		for i := 0; i+1 < len(l); i += 2 {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(l[i])
			b.WriteString(`="`)
			b.WriteString(escapeLabel(l[i+1]))
			b.WriteByte('"')
		}
		b.WriteByte('}')
	}
	b.WriteByte(' ')
	b.WriteString(formatValue(v))
	b.WriteByte('\n')
	e.printf("%s", b.String())
}

func (e *expo) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}

var (
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
)

// escapeLabel escapes a label value; the format wants UTF-8, and a
// command name is whatever bytes a process chose.
func escapeLabel(s string) string { return labelEscaper.Replace(strings.ToValidUTF8(s, "\uFFFD")) }
func escapeHelp(s string) string  { return helpEscaper.Replace(s) }

func formatValue(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func sortedUnique(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}
