// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

func monoNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// TestFlightTrigger: with flight.window set, POST /v1/flight/trigger
// writes a file holding the events the daemon got before the call, while
// the streams go on; without it, the call is a 404.
func TestFlightTrigger(t *testing.T) {
	dir := t.TempDir()
	td := startFake(t, func(c *Config) {
		seeAll(t, c)
		c.Flight.Window = 5 * time.Second
		c.Flight.After = 0
		c.Flight.Output = filepath.Join(dir, "f.mgt")
	})
	now := monoNow()
	for i := 0; i < 10; i++ {
		td.fake.send(td.fake.rec(t, "sock_send", now-uint64(time.Second)+uint64(i), 7, 1, 100, nil))
	}
	ft, err := td.client(t).TriggerFlight(context.Background())
	if err != nil || !ft.Triggered {
		t.Fatalf("TriggerFlight: %+v, %v", ft, err)
	}
	// Stopping the daemon ends the file (and acts on a trigger not yet
	// acted on).
	td.stop(t)
	files, _ := filepath.Glob(filepath.Join(dir, "f-*.mgt"))
	if len(files) != 1 {
		t.Fatalf("flight files %v\n%s", files, td.log.String())
	}
	r, err := trace.Open(files[0])
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	n := 0
	for {
		rec, err := r.Next()
		if err != nil {
			break
		}
		if rec.Type.Name == "sock_send" {
			n++
		}
	}
	if n != 10 {
		t.Errorf("%d sock_send in %s, the daemon got 10 before the trigger", n, files[0])
	}
	if !strings.Contains(td.log.String(), "trigger api") {
		t.Errorf("the daemon did not log the trigger:\n%s", td.log.String())
	}

	// Allowed to trigger, as above, so that the answer is about the
	// missing flight recorder (404), not about the user (403).
	none := startFake(t, func(c *Config) { seeAll(t, c) })
	_, err = none.client(t).TriggerFlight(context.Background())
	var me *magnetclient.Error
	if !errors.As(err, &me) || me.Status != http.StatusNotFound || !strings.Contains(me.Message, "flight.window") {
		t.Errorf("without a flight recorder: %v, want a 404 naming flight.window", err)
	}
}

func TestFlightConfig(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		edit func(*FlightConfig)
		want string
	}{
		{func(f *FlightConfig) { f.Window = time.Millisecond }, "at least 1s"},
		{func(f *FlightConfig) { f.Triggers = "loss" }, `unknown trigger "loss"`},
		{func(f *FlightConfig) { f.Memory = "1KiB" }, "flight.memory"},
		{func(f *FlightConfig) { f.Output = filepath.Join(dir, "nodir", "f.mgt") }, "directory must exist"},
		{func(f *FlightConfig) { f.Output = filepath.Join(dir, "%Y.mgt") }, "want a file name"},
	} {
		c := DefaultConfig()
		c.Flight.Window, c.Flight.Output = time.Second, filepath.Join(dir, "f.mgt")
		tc.edit(&c.Flight)
		if err := c.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", c.Flight, err, tc.want)
		}
	}
	c := DefaultConfig()
	c.Flight.Window, c.Flight.Output, c.Flight.Triggers = time.Second, filepath.Join(dir, "f.mgt"), "retrans,rtt>50ms"
	s, err := c.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if s.flight == nil || s.baseline&s.flight.Triggers.Groups() != s.flight.Triggers.Groups() {
		t.Errorf("the triggers' groups are not in the baseline: %s", s.baseline)
	}
}
