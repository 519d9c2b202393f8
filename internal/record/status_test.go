// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/rotate"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// TestStatusNamesCurrentFile: while a recording rotates, the status file
// names the file being written and the one finished before it, not the
// first file of the recording.
func TestStatusNamesCurrentFile(t *testing.T) {
	needRoot(t)
	dir, statusDir := t.TempDir(), t.TempDir()
	pat, err := rotate.ParsePattern(filepath.Join(dir, "%h-%n.mgt"), "statushost")
	if err != nil {
		t.Fatal(err)
	}
	// The sink's clock: moved an hour on to make it rotate.
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	var sink *rotate.Sink
	var sinkMu sync.Mutex
	rec := startRecording(t, record.Config{
		Output: pat.Expand(time.Now(), 0), StatusDir: statusDir, FlushEvery: 20 * time.Millisecond,
		NewSink: func(h *trace.Header) (record.Sink, error) {
			s, err := rotate.New(h, rotate.Options{Pattern: pat, Interval: time.Hour, Now: clock})
			sinkMu.Lock()
			sink = s
			sinkMu.Unlock()
			return s, err
		},
	})
	status := func() record.Status {
		t.Helper()
		sts, err := record.ReadStatuses(statusDir)
		if err != nil || len(sts) != 1 {
			t.Fatalf("statuses %+v: %v", sts, err)
		}
		return sts[0]
	}
	first := pat.Expand(time.Now(), 0)
	if st := status(); st.Output != first || st.Previous != "" {
		t.Fatalf("first file: status output %q previous %q, want %q and none", st.Output, st.Previous, first)
	}
	for i := 0; i < 2; i++ {
		mu.Lock()
		now = now.Add(time.Hour)
		mu.Unlock()
		want := pat.Expand(time.Now(), i+1)
		deadline := time.Now().Add(10 * time.Second)
		for {
			st := status()
			if st.Output == want {
				if prev := pat.Expand(time.Now(), i); st.Previous != prev {
					t.Fatalf("status previous %q, want %q", st.Previous, prev)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("status still names %q (previous %q), want %q", st.Output, st.Previous, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	rec.stop(t)
	sinkMu.Lock()
	defer sinkMu.Unlock()
	if sink.Stats().Files != 3 {
		t.Fatalf("%d files, want 3", sink.Stats().Files)
	}
}
