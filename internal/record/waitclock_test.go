// SPDX-License-Identifier: Apache-2.0

package record

import (
	"testing"
	"time"
)

func TestWaitClock(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	check := func(c *waitClock, want time.Time, what string) {
		t.Helper()
		if got := c.until(); !got.Equal(want) {
			t.Errorf("%s: wait until +%v, want +%v", what, got.Sub(t0), want.Sub(t0))
		}
	}

	// Polls every 50 ms, flushes every second: drains woken by a ring in
	// between do not move the deadline; reaching it moves it one step.
	c := newWaitClock(t0, 50*time.Millisecond, time.Second, time.Time{})
	check(c, ms(50), "start")
	for _, at := range []int{3, 17, 49} {
		c.read(ms(at))
		check(c, ms(50), "drains before the poll")
	}
	c.read(ms(50))
	check(c, ms(100), "the poll reached")
	c.read(ms(101))
	check(c, ms(150), "the poll passed")
	// Back much later than a poll interval: a full interval from then.
	c.read(ms(420))
	check(c, ms(470), "late")
	if !c.flushDue(ms(1000)) || c.flushDue(ms(999)) {
		t.Error("flush due before 1 s, or not at 1 s")
	}
	// A flush starts the grid again from itself.
	c.flushed(ms(430))
	check(c, ms(480), "after a flush")

	// The default: polls as often as flushes, so one fixed deadline per
	// flush whatever the rings do.
	c = newWaitClock(t0, 200*time.Millisecond, 200*time.Millisecond, time.Time{})
	for _, at := range []int{10, 90, 199} {
		c.read(ms(at))
		check(c, ms(200), "default, drains in between")
	}
	if !c.flushDue(ms(200)) {
		t.Error("flush not due at the deadline")
	}
	c.flushed(ms(201))
	c.read(ms(201))
	check(c, ms(401), "default, after the flush")

	// A sink that flushes more often than the poll (the daemon's), and
	// the end of a recording's duration, come first.
	c = newWaitClock(t0, 200*time.Millisecond, 25*time.Millisecond, ms(1000))
	check(c, ms(25), "flush before the poll")
	c.flushed(ms(990))
	check(c, ms(1000), "the end before the flush")
}

// The rings are polled as often as the trace is flushed unless a poll
// interval is given: records read sooner would wait for the flush anyway.
func TestPollEvery(t *testing.T) {
	for _, c := range []struct{ poll, flush, want time.Duration }{
		{0, DefaultFlushEvery, DefaultFlushEvery},
		{0, time.Second, time.Second},
		{0, 25 * time.Millisecond, 25 * time.Millisecond},
		{10 * time.Millisecond, time.Second, 10 * time.Millisecond},
		{time.Second, 200 * time.Millisecond, time.Second},
	} {
		if got := pollEvery(c.poll, c.flush); got != c.want {
			t.Errorf("pollEvery(%v, %v) = %v, want %v", c.poll, c.flush, got, c.want)
		}
	}
}

// A time-rotated recording flushes often enough for its files to start
// nearly on time; others at the default.
func TestFlushEveryFor(t *testing.T) {
	for _, c := range []struct{ rotate, want time.Duration }{
		{0, DefaultFlushEvery},
		{time.Second, 200 * time.Millisecond},
		{3 * time.Second, 600 * time.Millisecond},
		{time.Minute, DefaultFlushEvery},
	} {
		if got := FlushEveryFor(c.rotate); got != c.want {
			t.Errorf("FlushEveryFor(%v) = %v, want %v", c.rotate, got, c.want)
		}
	}
}
