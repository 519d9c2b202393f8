// SPDX-License-Identifier: Apache-2.0

package export_test

import (
	"encoding/binary"
	"path/filepath"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/rotate"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// rotatedWithConn writes a recording of two one-minute files: a
// conn_open of connection 7 at the start, then a sock_send of it every
// second.
func rotatedWithConn(t *testing.T, dir string) []string {
	t.Helper()
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	const offset = int64(1_000_000_000_000_000_000)
	h := &trace.Header{Host: "h", StartWallNs: start.UnixNano(), Types: types, Clock: trace.Clock{WallOffsetNs: offset}}
	p, err := rotate.ParsePattern(filepath.Join(dir, "%h-%n.mgt"), "h")
	if err != nil {
		t.Fatal(err)
	}
	now := start
	s, err := rotate.New(h, rotate.Options{Pattern: p, Interval: time.Minute, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	paths := []string{s.Path()}
	open := h.TypeByName("conn_open")
	rec := make([]byte, open.Size)
	rec[30] = open.ID
	binary.NativeEndian.PutUint64(rec, uint64(now.UnixNano()-offset))
	binary.NativeEndian.PutUint64(rec[8:], 7)
	if err := s.Write(rec); err != nil {
		t.Fatal(err)
	}
	send := h.TypeByName("sock_send")
	rec = make([]byte, send.Size)
	rec[30] = send.ID
	binary.NativeEndian.PutUint64(rec[8:], 7)
	binary.NativeEndian.PutUint32(rec[20:], 100)
	for i := 0; i < 120; i++ {
		binary.NativeEndian.PutUint64(rec, uint64(now.UnixNano()-offset))
		if err := s.Write(rec); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Second)
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
		if s.Path() != paths[len(paths)-1] {
			paths = append(paths, s.Path())
		}
	}
	if err := s.Close(nil); err != nil {
		t.Fatal(err)
	}
	return paths
}
