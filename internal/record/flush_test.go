// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// flushSink counts the recorder's flushes; records are dropped.
type flushSink struct{ flushes atomic.Int64 }

func (s *flushSink) Write(rec []byte) error         { return nil }
func (s *flushSink) Flush() error                   { s.flushes.Add(1); return nil }
func (s *flushSink) Close(sum *trace.Summary) error { return nil }
func (s *flushSink) Bytes() int64                   { return 0 }

// TestFlushEvery: the sink is flushed at Config.FlushEvery, also while no
// event comes, and not before it is due.
func TestFlushEvery(t *testing.T) {
	needRoot(t)
	often := &flushSink{}
	rec := startRecording(t, record.Config{
		FlushEvery: 20 * time.Millisecond,
		Filters:    record.Filters{Port: uniquePort()}, // nothing: an idle recording
		NewSink:    func(*trace.Header) (record.Sink, error) { return often, nil },
	})
	deadline := time.Now().Add(20 * time.Second)
	for often.flushes.Load() < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("%d flushes in 20 s at a 20 ms interval", often.flushes.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	rec.stop(t)

	// A minute between flushes, the rings read every 10 ms: the loop goes
	// round many times in the window below and must not flush once.
	rare := &flushSink{}
	rec = startRecording(t, record.Config{
		FlushEvery:   time.Minute,
		PollInterval: 10 * time.Millisecond,
		Filters:      record.Filters{Port: uniquePort()},
		NewSink:      func(*trace.Header) (record.Sink, error) { return rare, nil },
	})
	time.Sleep(300 * time.Millisecond) // an observation window, not a wait for an event
	if n := rare.flushes.Load(); n != 0 {
		t.Fatalf("%d flushes within 300 ms at a 1 min interval", n)
	}
	rec.stop(t)
}

// TestFlushEveryNegative: a negative interval is refused before anything
// loads (no root needed).
func TestFlushEveryNegative(t *testing.T) {
	_, err := record.Run(context.Background(), record.Config{Output: t.TempDir() + "/x.mgt", FlushEvery: -time.Second})
	if err == nil || !strings.Contains(err.Error(), "flush interval -1s: want a positive duration") {
		t.Fatalf("Run with a negative FlushEvery: %v", err)
	}
}
