// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

func conn(id uint64, comm string, appBPS float64, bytes int64) magnetclient.Connection {
	c := magnetclient.Connection{ID: id, Proto: "tcp", Local: "10.200.0.1:40000", Remote: "10.200.0.2:5201",
		Owner:       &magnetclient.Owner{PID: 9, Comm: comm},
		State:       &magnetclient.TCPState{Cwnd: 42, SrttUs: 1500, Lost: 6, DeliveryRateBPS: 9e8, DeliveryAppLimited: true},
		Delivery:    &magnetclient.Delivery{Samples: 12, Window: magnetclient.DeliveryWindow{Samples: 10, AppLimited: 2, MeanBPS: 8e8, MaxBPS: 3e9}},
		Retransmits: magnetclient.Retransmits{Count: 2},
		Drops:       magnetclient.Drops{Count: 1},
		SendBuffer:  &magnetclient.SendBuffer{Bytes: 4096},
	}
	c.App.Send.ByTime.BPS = appBPS
	c.App.Send.ByEvents.BPS = appBPS * 1.01
	c.App.Send.Bytes = bytes
	c.Wire.Send.Bytes = bytes + bytes/20
	c.Wire.Recv.Bytes = bytes / 50
	return c
}

func snapshot(conns ...magnetclient.Connection) Snapshot {
	return Snapshot{
		MaxConnections: -1,
		Status: magnetclient.Status{
			StartedWallNs: 1750000000500000000,
			Recording:     true,
			Groups:        magnetclient.GroupStatus{Enabled: []string{"sock", "tcp"}, Available: []string{"sock", "tcp", "sched"}},
			Recorder: magnetclient.RecorderStatus{
				Events: 30, EventsByType: map[string]uint64{"sock_send": 10, "tcp_xmit": 20},
				Lost: 5, LostByType: map[string]uint64{"tcp_xmit": 5}, BufferBytes: 1 << 23,
				KernelSkippedByInterface: []magnetclient.KernelSkipCount{{NetNS: 4026531840, Ifindex: 2, Interface: "veth0", Program: "dev_xmit", Skipped: 12}},
			},
			Connections: magnetclient.TableStatus{Tracked: len(conns), Open: len(conns), Max: 16384},
			Subscribers: 2,
			Subscriptions: []magnetclient.SubscriptionStatus{
				{ID: 9, Kind: "figures", UID: 0, Queue: 64, Delivered: 3},
				{ID: 7, Kind: "events", UID: 1000, Queue: 4096, Queued: 1, Delivered: 100, Dropped: 17},
			},
		},
		Connections: conns,
	}
}

// parse checks every line of an exposition, with Prometheus' own parser
// and with a strict pattern per line, and returns its families.
func parse(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	line := regexp.MustCompile(`^(# HELP [a-zA-Z_:][a-zA-Z0-9_:]* .*|# TYPE [a-zA-Z_:][a-zA-Z0-9_:]* (counter|gauge)|` +
		`[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*"(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*")*\})? ` +
		`(-?[0-9.]+(e[+-]?[0-9]+)?|NaN|[+-]Inf))$`)
	if !strings.HasSuffix(text, "\n") {
		t.Fatal("exposition does not end with a newline")
	}
	for i, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if !line.MatchString(l) {
			t.Fatalf("line %d is not valid exposition: %q", i+1, l)
		}
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("Prometheus parser: %v\n%s", err, text)
	}
	return fams
}

// value returns the sample of family name with the given labels (a subset).
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no family %s", name)
	}
	var found []float64
	for _, m := range f.Metric {
		lv := map[string]string{}
		for _, l := range m.Label {
			lv[l.GetName()] = l.GetValue()
		}
		match := true
		for i := 0; i+1 < len(want); i += 2 {
			if lv[want[i]] != want[i+1] {
				match = false
			}
		}
		if match {
			switch {
			case m.Counter != nil:
				found = append(found, m.Counter.GetValue())
			case m.Gauge != nil:
				found = append(found, m.Gauge.GetValue())
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s%v: %d samples, want 1", name, want, len(found))
	}
	return found[0]
}

func write(t *testing.T, col *Collector, s Snapshot) map[string]*dto.MetricFamily {
	t.Helper()
	var b bytes.Buffer
	if err := col.Write(&b, s); err != nil {
		t.Fatal(err)
	}
	return parse(t, b.String())
}

func TestExposition(t *testing.T) {
	col := &Collector{}
	fams := write(t, col, snapshot(conn(1, `we"ird\name`+"\n", 5e8, 1000), conn(2, "curl", 1e6, 500)))

	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"magnet_daemon_start_time_seconds", nil, 1750000000.5},
		{"magnet_recording", nil, 1},
		{"magnet_recorder_events_total", []string{"type", "tcp_xmit"}, 20},
		{"magnet_recorder_lost_events_total", []string{"type", "tcp_xmit"}, 5},
		{"magnet_recorder_lost_events_total", []string{"type", "sock_send"}, 0},
		{"magnet_recorder_kernel_skipped_runs_total", []string{"netns", "4026531840", "interface", "veth0", "program", "dev_xmit"}, 12},
		{"magnet_event_group_enabled", []string{"group", "tcp"}, 1},
		{"magnet_event_group_enabled", []string{"group", "sched"}, 0},
		{"magnet_connections_tracked", nil, 2},
		{"magnet_subscribers", nil, 2},
		{"magnet_subscriber_dropped_total", []string{"id", "7", "kind", "events", "uid", "1000"}, 17},
		{"magnet_subscriber_dropped_total", []string{"id", "9"}, 0},
		{"magnet_subscriber_delivered_total", []string{"id", "7"}, 100},
		{"magnet_subscriber_queued", []string{"id", "7"}, 1},
		{"magnet_host_bytes_total", []string{"layer", "app", "dir", "send"}, 1500},
		{"magnet_host_bytes_total", []string{"layer", "wire", "dir", "recv"}, 20 + 10},
		{"magnet_host_bandwidth_bits_per_second", []string{"layer", "app", "dir", "send"}, 5e8 + 1e6},
		{"magnet_connections_omitted", nil, 0},
		{"magnet_connection_bytes_total", []string{"conn", "1", "layer", "app", "dir", "send", "comm", "we\"ird\\name\n"}, 1000},
		{"magnet_connection_bandwidth_bits_per_second", []string{"conn", "2", "layer", "app", "dir", "send"}, 1e6},
		{"magnet_connection_window_bandwidth_bits_per_second", []string{"conn", "2", "layer", "app", "dir", "send"}, 1.01e6},
		{"magnet_connection_delivery_rate_bits_per_second", []string{"conn", "1"}, 9e8},
		{"magnet_connection_delivery_app_limited", []string{"conn", "1"}, 1},
		{"magnet_connection_cwnd_segments", []string{"conn", "2"}, 42},
		{"magnet_connection_lost_segments_total", []string{"conn", "2"}, 6},
		{"magnet_connection_delivery_window_mean_bits_per_second", []string{"conn", "1"}, 8e8},
		{"magnet_connection_delivery_window_max_bits_per_second", []string{"conn", "2"}, 3e9},
		{"magnet_connection_delivery_window_app_limited_samples", []string{"conn", "2"}, 2},
		{"magnet_connection_srtt_seconds", []string{"conn", "2"}, 0.0015},
		{"magnet_connection_retransmits_total", []string{"conn", "2", "remote", "10.200.0.2:5201", "proto", "tcp"}, 2},
		{"magnet_connection_drops_total", []string{"conn", "2"}, 1},
		{"magnet_connection_send_buffer_bytes", []string{"conn", "1"}, 4096},
	}
	for _, c := range checks {
		if got := value(t, fams, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %g, want %g", c.name, c.labels, got, c.want)
		}
	}
	if fams["magnet_host_bytes_total"].GetType() != dto.MetricType_COUNTER ||
		fams["magnet_connection_cwnd_segments"].GetType() != dto.MetricType_GAUGE {
		t.Fatal("wrong metric types")
	}
}

func TestCardinalityLimit(t *testing.T) {
	s := snapshot(conn(1, "a", 10, 1), conn(2, "b", 300, 1), conn(3, "c", 20, 1), conn(4, "d", 300, 1), conn(5, "e", 0, 1))
	s.MaxConnections = 2
	fams := write(t, &Collector{}, s)
	if got := value(t, fams, "magnet_connections_omitted"); got != 3 {
		t.Fatalf("omitted %g, want 3", got)
	}
	// The busiest two (300 each: ids 2 and 4) have series, the others none;
	// the host figures still count everyone.
	var ids []string
	for _, m := range fams["magnet_connection_retransmits_total"].Metric {
		for _, l := range m.Label {
			if l.GetName() == "conn" {
				ids = append(ids, l.GetValue())
			}
		}
	}
	if strings.Join(ids, ",") != "2,4" {
		t.Fatalf("connections with series: %v, want 2,4", ids)
	}
	if got := value(t, fams, "magnet_host_bandwidth_bits_per_second", "layer", "app", "dir", "send"); got != 630 {
		t.Fatalf("host app rate %g, want 630", got)
	}
	if _, ok := fams["magnet_connection_cwnd_segments"]; !ok {
		t.Fatal("a family with samples is missing")
	}

	s = snapshot(conn(1, "a", 10, 1))
	s.MaxConnections = 0
	none := write(t, &Collector{}, s)
	if len(none["magnet_connection_bytes_total"].GetMetric()) != 0 || value(t, none, "magnet_connections_omitted") != 1 {
		t.Fatal("limit 0 still exports a connection")
	}
}

// TestHostTotals checks that host byte totals only grow, whatever the
// daemon forgets between scrapes.
func TestHostTotals(t *testing.T) {
	col := &Collector{}
	appSend := func(s Snapshot) float64 {
		return value(t, write(t, col, s), "magnet_host_bytes_total", "layer", "app", "dir", "send")
	}
	steps := []struct {
		conns []magnetclient.Connection
		want  float64
	}{
		{[]magnetclient.Connection{conn(1, "a", 0, 100), conn(2, "b", 0, 50)}, 150},
		{[]magnetclient.Connection{conn(1, "a", 0, 300), conn(2, "b", 0, 50)}, 350},
		{[]magnetclient.Connection{conn(1, "a", 0, 300)}, 350},                    // 2 forgotten
		{[]magnetclient.Connection{conn(1, "a", 0, 20), conn(3, "c", 0, 5)}, 375}, // 1 evicted and tracked afresh
		{[]magnetclient.Connection{conn(1, "a", 0, 20), conn(3, "c", 0, 5)}, 375}, // nothing moved
		{[]magnetclient.Connection{conn(2, "b", 0, 10), conn(3, "c", 0, 5)}, 385}, // id 2 again: new
		{nil, 385},
	}
	for i, s := range steps {
		if got := appSend(snapshot(s.conns...)); got != s.want {
			t.Fatalf("scrape %d: host app send bytes %g, want %g", i+1, got, s.want)
		}
	}
}

func TestHandler(t *testing.T) {
	col := &Collector{}
	fail := false
	h := col.Handler(func(ctx context.Context) (Snapshot, error) {
		if fail {
			return Snapshot{}, errors.New("daemon is shutting down")
		}
		return snapshot(conn(1, "a", 1, 1)), nil
	})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != 200 || rec.Header().Get("Content-Type") != ContentType {
		t.Fatalf("GET: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	parse(t, rec.Body.String())

	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/metrics", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d", rec.Code)
	}
	fail = true
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "shutting down") {
		t.Fatalf("failing snapshot: %d %q", rec.Code, rec.Body.String())
	}
}
