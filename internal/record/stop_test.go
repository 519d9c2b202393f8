// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// TestRecordingEndsAtOnce: the recorder waits for its rings up to a flush
// interval at a time, here an hour; the end of the recorded command, and
// an interruption (Ctrl-C, the context), must end that wait rather than be
// noticed when it runs out. Either way the trace is complete: summary
// written, and the command's exit code known.
func TestRecordingEndsAtOnce(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name      string
		command   []string
		interrupt bool
		exitCode  int
	}{
		{name: "command exits", command: []string{"sh", "-c", "exit 3"}, exitCode: 3},
		// sleep ends with the SIGTERM the recorder sends it: 128 + 15.
		{name: "interrupted", command: []string{"sleep", "3600"}, interrupt: true, exitCode: 143},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := startRecording(t, record.Config{Command: tc.command, FlushEvery: time.Hour})
			if tc.interrupt {
				rec.cancel()
			}
			select {
			case <-rec.done:
			case <-time.After(30 * time.Second):
				t.Fatal("record.Run still running 30 s on: it waits out its hour-long flush interval")
			}
			if rec.err != nil {
				t.Fatal(rec.err)
			}
			if rec.res.ExitCode != tc.exitCode {
				t.Errorf("exit code %d, want %d", rec.res.ExitCode, tc.exitCode)
			}
			if eachRecord(t, rec.path, func(trace.Record) {}) == nil {
				t.Error("trace has no summary")
			}
		})
	}
}
