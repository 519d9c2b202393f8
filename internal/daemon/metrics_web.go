// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/magnet-tracer/magnet/internal/live"
	"github.com/magnet-tracer/magnet/internal/metrics"
	"github.com/magnet-tracer/magnet/internal/web"
)

// MetricsConfig is the configuration of GET /metrics.
type MetricsConfig struct {
	// Public lets the TCP listener serve /metrics without the token, for
	// a Prometheus that has none. Per-connection series then show every
	// user's connections to whoever reaches the listener.
	Public bool `yaml:"public"`
	// MaxConnections is how many connections get series of their own
	// (the busiest); the others are counted in magnet_connections_omitted.
	MaxConnections int `yaml:"max_connections"`
}

// DefaultMetricsConfig is the metrics configuration without a file.
func DefaultMetricsConfig() MetricsConfig {
	return MetricsConfig{MaxConnections: metrics.DefaultMaxConnections}
}

func (m MetricsConfig) check() error {
	if m.MaxConnections < 0 || m.MaxConnections > 100000 {
		return fmt.Errorf("config: metrics.max_connections %d: want 0 to 100000", m.MaxConnections)
	}
	return nil
}

// extraRoutes adds what serves people and monitoring systems rather than
// programs of the API: the oscilloscope page at / (it holds no data, so it
// needs no token; its requests to the API carry one) and the Prometheus
// exposition at /metrics.
func (d *Daemon) extraRoutes(mux *http.ServeMux) {
	mux.Handle("GET /{$}", web.Handler())
	col := &metrics.Collector{}
	expo := col.Handler(d.metricsSnapshot)
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		base, _ := r.Context().Value(credKey{}).(*identity)
		if base == nil || base.via != "tcp" || !d.settings().Metrics.Public {
			who := d.who(w, r)
			if who == nil {
				return
			}
			if !who.seesAll {
				writeError(w, http.StatusForbidden, "metrics show every user's connections: root or a see-all group only")
				return
			}
		}
		expo.ServeHTTP(w, r)
	})
}

// metricsSnapshot is the state as a see-all client sees it. The status
// comes from the API's own handler, answered in memory, so that /metrics
// and /v1/status can never disagree.
func (d *Daemon) metricsSnapshot(ctx context.Context) (metrics.Snapshot, error) {
	if d.stopping.Load() {
		return metrics.Snapshot{}, errors.New("the daemon is shutting down")
	}
	all := &identity{seesAll: true, via: "metrics"}
	rec := httptest.NewRecorder()
	d.handleStatus(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/v1/status", nil), all)
	var s metrics.Snapshot
	if err := json.Unmarshal(rec.Body.Bytes(), &s.Status); err != nil {
		return s, fmt.Errorf("status: %w", err)
	}
	s.Connections = d.connections(all, nil, live.Window{}, "all").Connections
	s.MaxConnections = d.settings().Metrics.MaxConnections
	return s, nil
}
