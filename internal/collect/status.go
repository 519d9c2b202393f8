// SPDX-License-Identifier: Apache-2.0

package collect

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// statusName is the shipper's status file in the spool, rewritten every
// publishEvery: what `magnet status` shows.
const statusName = ".ship-status.json"

// Status is the shipper's state: the spool and each target.
type Status struct {
	Host    string    `json:"host"`
	Spool   string    `json:"spool"`
	PID     int       `json:"pid"`
	Updated time.Time `json:"updated"`
	// Files finished and not yet shipped everywhere, and their bytes.
	Waiting      int   `json:"waiting"`
	WaitingBytes int64 `json:"waiting_bytes"`
	// The spool's use: its trace files (the one being written too) and
	// the staged compressed copies, against the disk budget (0: none).
	SpoolBytes   int64 `json:"spool_bytes"`
	StagingBytes int64 `json:"staging_bytes"`
	Budget       int64 `json:"budget_bytes"`
	// Files dropped by the budget since the spool was made.
	Dropped      int   `json:"dropped"`
	DroppedBytes int64 `json:"dropped_bytes"`
	// Files every target confirmed and removed locally.
	Shipped      uint64         `json:"shipped"`
	ShippedBytes uint64         `json:"shipped_bytes"`
	Targets      []TargetStatus `json:"targets"`
}

// TargetStatus is one target's state.
type TargetStatus struct {
	Name string `json:"name"`
	Type string `json:"type"`
	// Files (and their spool bytes) this target does not have yet.
	Backlog      int   `json:"backlog"`
	BacklogBytes int64 `json:"backlog_bytes"`
	// Totals, kept across restarts in the journal.
	Shipped      uint64    `json:"shipped"`
	ShippedBytes uint64    `json:"shipped_bytes"`
	Failures     uint64    `json:"failures"`
	LastSuccess  time.Time `json:"last_success,omitzero"`
	LastFailure  time.Time `json:"last_failure,omitzero"`
	LastError    string    `json:"last_error,omitempty"`
	// Failures in a row, and when the next attempt may start.
	ConsecutiveFailures int       `json:"consecutive_failures"`
	NextRetry           time.Time `json:"next_retry,omitzero"`
	// The shipment in flight: its file, for how long, and whether it has
	// been running longer than ship.stall.
	InFlight        string  `json:"in_flight,omitempty"`
	InFlightSeconds float64 `json:"in_flight_seconds"`
	Stalled         bool    `json:"stalled"`
}

// watch logs, once per shipment, a shipment that has run longer than
// ship.stall: a store that accepts connections and never answers holds it
// until the target's timeout, and nothing else would say so.
func (s *Shipper) watch() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for _, t := range s.targets {
		if t.current == "" || t.stallLogged || now.Sub(t.since) < s.cfg.Ship.Stall {
			continue
		}
		t.stallLogged = true
		s.Log("ship %s to %s: stalled, no answer for %s (timeout in %s); the other targets go on",
			t.current, t.a.Name(), now.Sub(t.since).Round(time.Second), (t.timeout - now.Sub(t.since)).Round(time.Second))
	}
}

// Status returns the shipper's state now.
func (s *Shipper) Status() Status {
	files, _ := s.list()
	stagingBytes := dirBytes(filepath.Join(s.cfg.Spool, stagingDir))
	dropped, droppedBytes := Dropped(s.cfg.Spool)
	var spoolBytes int64
	if ents, err := os.ReadDir(s.cfg.Spool); err == nil {
		for _, e := range ents {
			if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() && s.pattern.Matches(e.Name()) {
				spoolBytes += fi.Size()
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	st := Status{Host: s.cfg.Host, Spool: s.cfg.Spool, PID: os.Getpid(), Updated: now.UTC(),
		SpoolBytes: spoolBytes, StagingBytes: stagingBytes, Budget: s.cfg.budget,
		Dropped: dropped, DroppedBytes: droppedBytes, Shipped: s.j.Shipped, ShippedBytes: s.j.ShippedBytes}
	for _, f := range files {
		st.Waiting++
		st.WaitingBytes += f.Size
	}
	for _, t := range s.targets {
		ts := t.st
		tot := s.j.target(t.a.Name())
		ts.Shipped, ts.ShippedBytes, ts.Failures = tot.Shipped, tot.ShippedBytes, tot.Failures
		ts.LastSuccess, ts.LastFailure, ts.LastError = tot.LastSuccess, tot.LastFailure, tot.LastError
		ts.ConsecutiveFailures = t.b.fails
		if t.b.fails > 0 {
			ts.NextRetry = t.b.until.UTC()
		}
		if t.current != "" {
			ts.InFlight = t.current
			ts.InFlightSeconds = now.Sub(t.since).Seconds()
			ts.Stalled = now.Sub(t.since) >= s.cfg.Ship.Stall
		}
		for _, f := range files {
			if fs := s.j.Files[filepath.Base(f.Path)]; fs == nil || !fs.Done[t.a.Name()] {
				ts.Backlog++
				ts.BacklogBytes += f.Size
			}
		}
		st.Targets = append(st.Targets, ts)
	}
	return st
}

// publish writes the status file and, if configured, the metrics file for
// node_exporter's textfile collector.
func (s *Shipper) publish() {
	st := s.Status()
	data, err := json.MarshalIndent(st, "", "  ")
	if err == nil {
		err = writeFileAtomic(filepath.Join(s.cfg.Spool, statusName), append(data, '\n'))
	}
	if err != nil {
		s.Log("write status: %v", err)
	}
	if s.cfg.Metrics.Textfile != "" {
		var b strings.Builder
		WriteMetrics(&b, st)
		if err := writeFileAtomic(s.cfg.Metrics.Textfile, []byte(b.String())); err != nil {
			s.Log("write metrics: %v", err)
		}
	}
}

// writeFileAtomic replaces path with data through a renamed temporary,
// without fsync: for files rewritten every few seconds that a crash may lose.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".part"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// ReadStatus reads the status a spool's shipper published.
func ReadStatus(spool string) (Status, error) {
	var st Status
	data, err := os.ReadFile(filepath.Join(spool, statusName))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return st, fmt.Errorf("no shipper status in %s (is magnet collect running with targets?)", spool)
		}
		return st, err
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("shipper status %s: %w", filepath.Join(spool, statusName), err)
	}
	return st, nil
}

// WriteMetrics writes st in Prometheus's text exposition format: the
// figures an administrator of many nodes alerts on (a target's backlog
// growing, its last success getting old, failures, stalls, drops, the
// spool near its budget).
func WriteMetrics(w io.Writer, st Status) {
	bw := bufio.NewWriter(w)
	defer bw.Flush()
	host := fmt.Sprintf("host=%q", st.Host)
	gauge := func(name, help, typ string, v float64) {
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s %s\n%s{%s} %s\n", name, help, name, typ, name, host, num(v))
	}
	gauge("magnet_collect_status_timestamp_seconds", "When the shipper last wrote this status (stale: the shipper is not running).", "gauge", unixSeconds(st.Updated))
	gauge("magnet_collect_waiting_files", "Finished files in the spool not yet shipped to every target.", "gauge", float64(st.Waiting))
	gauge("magnet_collect_waiting_bytes", "Bytes of those files.", "gauge", float64(st.WaitingBytes))
	gauge("magnet_collect_spool_bytes", "Bytes of trace files in the spool, the one being written included.", "gauge", float64(st.SpoolBytes))
	gauge("magnet_collect_staging_bytes", "Bytes of compressed copies staged for shipping.", "gauge", float64(st.StagingBytes))
	gauge("magnet_collect_spool_budget_bytes", "The spool's disk budget (0: none).", "gauge", float64(st.Budget))
	gauge("magnet_collect_dropped_files_total", "Finished files dropped unshipped by the disk budget.", "counter", float64(st.Dropped))
	gauge("magnet_collect_dropped_bytes_total", "Bytes of those files.", "counter", float64(st.DroppedBytes))
	gauge("magnet_collect_shipped_files_total", "Files every target confirmed (then removed locally).", "counter", float64(st.Shipped))
	per := func(name, help, typ string, v func(t TargetStatus) float64) {
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
		for _, t := range st.Targets {
			fmt.Fprintf(bw, "%s{%s,target=%q,type=%q} %s\n", name, host, t.Name, t.Type, num(v(t)))
		}
	}
	per("magnet_collect_target_backlog_files", "Files this target does not have yet.", "gauge", func(t TargetStatus) float64 { return float64(t.Backlog) })
	per("magnet_collect_target_backlog_bytes", "Spool bytes of those files.", "gauge", func(t TargetStatus) float64 { return float64(t.BacklogBytes) })
	per("magnet_collect_target_shipped_files_total", "Files shipped to this target.", "counter", func(t TargetStatus) float64 { return float64(t.Shipped) })
	per("magnet_collect_target_shipped_bytes_total", "Bytes shipped to this target.", "counter", func(t TargetStatus) float64 { return float64(t.ShippedBytes) })
	per("magnet_collect_target_failures_total", "Failed shipments to this target (timeouts included).", "counter", func(t TargetStatus) float64 { return float64(t.Failures) })
	per("magnet_collect_target_consecutive_failures", "Failures in a row; 0 after a success.", "gauge", func(t TargetStatus) float64 { return float64(t.ConsecutiveFailures) })
	per("magnet_collect_target_last_success_timestamp_seconds", "When a file last reached this target (0: never).", "gauge", func(t TargetStatus) float64 { return unixSeconds(t.LastSuccess) })
	per("magnet_collect_target_inflight_seconds", "How long the shipment in flight has run (0: none).", "gauge", func(t TargetStatus) float64 { return t.InFlightSeconds })
	per("magnet_collect_target_stalled", "1 while a shipment has run longer than ship.stall.", "gauge", func(t TargetStatus) float64 {
		if t.Stalled {
			return 1
		}
		return 0
	})
}

func unixSeconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// MetricsHandler serves the shipper's metrics.
func (s *Shipper) MetricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		WriteMetrics(w, s.Status())
	})
}
