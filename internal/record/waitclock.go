// SPDX-License-Identifier: Apache-2.0

package record

import "time"

// waitClock says until when the drain loop may wait for a ring's wake-up:
// until the next flush is due (a caller that flushes more often than the
// poll wants its records that soon), the next poll (the rings are read at
// least every poll interval, woken or not) or the end of the recording's
// duration, which the loop sees only between waits, whichever comes first.
//
// The polls are a fixed grid, every poll interval from the last flush: a
// drain in between, woken by a ring, does not move the next deadline. A
// deadline pushed back at each wait, as the loop once did, still woke Go's
// sysmon and the thread waiting in the network poller at the old time:
// they sleep until the earliest timer as it was when they went to sleep.
// That was one futile wake-up of each per poll interval, also while the
// rings woke the recorder far more often (see pollEvery).
type waitClock struct {
	pollEvery, flushEvery time.Duration
	lastFlush, nextPoll   time.Time
	stop                  time.Time // zero: no end
}

func newWaitClock(now time.Time, pollEvery, flushEvery time.Duration, stop time.Time) *waitClock {
	return &waitClock{pollEvery: pollEvery, flushEvery: flushEvery, lastFlush: now, nextPoll: now.Add(pollEvery), stop: stop}
}

// flushDue says whether the sink is to be flushed after a drain at now.
func (c *waitClock) flushDue(now time.Time) bool {
	return now.Sub(c.lastFlush) >= c.flushEvery
}

// flushed records a flush at now; the grid of polls starts again from it.
func (c *waitClock) flushed(now time.Time) {
	c.lastFlush, c.nextPoll = now, now.Add(c.pollEvery)
}

// read records a drain at now: a poll reached moves to the next point of
// the grid (or a full interval from now, if the loop came back later than
// that).
func (c *waitClock) read(now time.Time) {
	if now.Before(c.nextPoll) {
		return
	}
	c.nextPoll = c.nextPoll.Add(c.pollEvery)
	if !now.Before(c.nextPoll) {
		c.nextPoll = now.Add(c.pollEvery)
	}
}

// until is when the wait after the last drain must end.
func (c *waitClock) until() time.Time {
	end := c.lastFlush.Add(c.flushEvery)
	if c.nextPoll.Before(end) {
		end = c.nextPoll
	}
	if !c.stop.IsZero() && c.stop.Before(end) {
		end = c.stop
	}
	return end
}
