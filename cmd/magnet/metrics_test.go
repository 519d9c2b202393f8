// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// scrape GETs url with the token (if any) and returns the status and body.
func scrape(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// parseExposition checks every line and returns the families, by
// Prometheus' own parser.
func parseExposition(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	sample := regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*"(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*")*\})? (-?[0-9.]+(e[+-]?[0-9]+)?|NaN|[+-]Inf)$`)
	for i, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if strings.HasPrefix(l, "# HELP ") || strings.HasPrefix(l, "# TYPE ") {
			continue
		}
		if !sample.MatchString(l) {
			t.Fatalf("line %d is not a valid sample: %q", i+1, l)
		}
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("Prometheus parser: %v", err)
	}
	return fams
}

// samples returns the values of family name whose labels include want.
func samples(fams map[string]*dto.MetricFamily, name string, want map[string]string) []float64 {
	var out []float64
	for _, m := range fams[name].GetMetric() {
		ok := true
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				found = found || l.GetName() == k && l.GetValue() == v
			}
			ok = ok && found
		}
		if ok {
			if m.Counter != nil {
				out = append(out, m.Counter.GetValue())
			} else {
				out = append(out, m.Gauge.GetValue())
			}
		}
	}
	return out
}

// TestMetricsScrape scrapes a live daemon's /metrics over TCP while a
// transfer runs and a subscriber lags: every line valid, the flow's series,
// the recorder's counts, the subscriber and its drops; no token, no
// metrics, until the configuration makes them public; the cardinality
// limit holds.
func TestMetricsScrape(t *testing.T) {
	cfg := "filter:\n  port: 15302\n"
	d := startDaemon(t, true, cfg)
	lab := netlab.ForTest(t, netlab.Options{Name: "metricst", RateMbit: 200})
	f := startFlow(t, lab, 15302, 64<<10)
	mc := d.Client(t)
	id := findConn(t, mc, f)

	// A subscriber that never reads: its queue fills and it loses events.
	sub, err := mc.Subscribe(context.Background(), magnetclient.Filter{Types: []string{"tcp_xmit"},
		Ports: []uint16{f.Remote.Port()}}, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	subID := strconv.FormatUint(sub.Subscribed().ID, 10)

	url := "http://" + d.TCP + "/metrics"
	if code, body := scrape(t, url, ""); code != http.StatusUnauthorized {
		t.Fatalf("without a token: %d %s", code, body)
	}
	if code, _ := scrape(t, url, "wrong-token-0123456789"); code != http.StatusUnauthorized {
		t.Fatalf("with a wrong token: %d", code)
	}

	var fams map[string]*dto.MetricFamily
	conn := map[string]string{"conn": strconv.FormatUint(id, 10), "layer": "app", "dir": "send"}
	waitFor(t, func() bool {
		code, body := scrape(t, url, d.Token)
		if code != http.StatusOK {
			t.Fatalf("scrape: %d %s", code, body)
		}
		fams = parseExposition(t, body)
		bw := samples(fams, "magnet_connection_bandwidth_bits_per_second", conn)
		drops := samples(fams, "magnet_subscriber_dropped_total", map[string]string{"id": subID})
		return len(bw) == 1 && bw[0] > 100e6 && len(drops) == 1 && drops[0] > 0
	})
	if bw := samples(fams, "magnet_connection_bandwidth_bits_per_second", conn)[0]; bw > 250e6 {
		t.Errorf("the flow's app send rate %s on a 200 Mbit/s link", mbit(bw))
	}
	bytes := samples(fams, "magnet_connection_bytes_total", conn)
	// The application counts a write once it returns; the daemon counts
	// each system call it took, so it may be one chunk ahead.
	if sent := f.Sent.Load(); len(bytes) != 1 || bytes[0] <= 0 || bytes[0] > float64(sent+64<<10) {
		t.Errorf("the flow's app send bytes %v, the application wrote %d so far", bytes, sent)
	}
	for _, name := range []string{"magnet_connection_cwnd_segments", "magnet_connection_srtt_seconds",
		"magnet_connection_delivery_rate_bits_per_second", "magnet_connection_retransmits_total"} {
		if len(samples(fams, name, map[string]string{"conn": conn["conn"]})) != 1 {
			t.Errorf("no %s for the flow", name)
		}
	}
	if v := samples(fams, "magnet_recorder_events_total", map[string]string{"type": "sock_send"}); len(v) != 1 || v[0] <= 0 {
		t.Errorf("sock_send events recorded: %v", v)
	}
	for _, name := range []string{"magnet_recorder_lost_events_total", "magnet_host_bytes_total",
		"magnet_host_bandwidth_bits_per_second", "magnet_connections_tracked", "magnet_event_group_enabled"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("no family %s", name)
		}
	}
	if v := samples(fams, "magnet_subscribers", nil); len(v) != 1 || v[0] < 1 {
		t.Errorf("subscribers %v", v)
	}
	if v := samples(fams, "magnet_host_bytes_total", map[string]string{"layer": "app", "dir": "send"}); len(v) != 1 || v[0] < bytes[0] {
		t.Errorf("host app send bytes %v below the flow's %v", v, bytes)
	}

	// The Unix socket: root sees the metrics too.
	uc := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", d.Socket)
	}}}
	resp, err := uc.Get("http://magnet/metrics")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("metrics over the Unix socket: %v %v", err, resp)
	}
	resp.Body.Close()

	// Public metrics and a limit of one connection, after a reload.
	d.Reload(t, cfg+"metrics:\n  public: true\n  max_connections: 1\n")
	code, body := scrape(t, url, "")
	if code != http.StatusOK {
		t.Fatalf("public metrics without a token: %d %s", code, body)
	}
	fams = parseExposition(t, body)
	ids := map[string]bool{}
	for _, m := range fams["magnet_connection_bytes_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "conn" {
				ids[l.GetValue()] = true
			}
		}
	}
	tracked := samples(fams, "magnet_connections_tracked", nil)[0]
	omitted := samples(fams, "magnet_connections_omitted", nil)[0]
	if len(ids) != 1 || omitted < 1 || omitted > tracked {
		t.Fatalf("limit 1: series for %d connections, %g omitted of %g tracked", len(ids), omitted, tracked)
	}
	// The API itself still wants the token.
	if code, _ := scrape(t, "http://"+d.TCP+"/v1/status", ""); code != http.StatusUnauthorized {
		t.Fatalf("/v1/status without a token: %d", code)
	}
}
