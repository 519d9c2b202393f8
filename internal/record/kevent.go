// SPDX-License-Identifier: Apache-2.0

package record

import (
	"fmt"
	"os"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/kevent"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/ring"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// kernelEvents is what a recording of kernel events chosen at run time
// (Config.KernelEvents: tracepoints, uprobes, the irq and napi groups)
// adds to it: their own ring, drained and merged by time with the events
// areas, and their own counters, added to the recording's.
type kernelEvents struct {
	events []*kevent.Event
	set    *kevent.Set
	ring   *ring.Reader
}

// planKernelEvents resolves the kernel events asked for, before anything
// is created, so that a bad one fails with one line and no file touched.
func planKernelEvents(specs []kevent.Spec) (*kernelEvents, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	evs, err := kevent.Plan(specs, func(name string) bool {
		_, ok := event.ByName(name)
		return ok
	})
	if err != nil {
		return nil, err
	}
	return &kernelEvents{events: evs}, nil
}

// kernelRingBytes sizes the kernel events' ring: a quarter of the events
// areas, at least 64 KiB.
func kernelRingBytes(buffer int) int {
	n := max(buffer/4, 64<<10)
	return n
}

// load attaches the kernel events with the recording's filters.
func (k *kernelEvents) load(cfg Config, kf probe.Filters) error {
	set, err := kevent.Load(k.events, kevent.Options{
		RingBytes:  kernelRingBytes(cfg.BufferBytes),
		TGID:       kf.TGID,
		CgroupID:   kf.CgroupID,
		NetNS:      kf.NetNS,
		SelfTGID:   uint32(os.Getpid()),
		WakeupFill: cfg.WakeupFill,
	})
	if err != nil {
		return err
	}
	k.set = set
	if k.ring, err = ring.NewReader(set.Ring); err != nil {
		set.Close()
		return fmt.Errorf("open kernel events ring: %w", err)
	}
	return nil
}

func (k *kernelEvents) close() {
	if k == nil {
		return
	}
	if k.ring != nil {
		k.ring.Close()
	}
	k.set.Close()
}

// header adds the kernel events to the trace's dictionary and says what
// was asked for, and what of it is not recorded, in the header's extra.
func (k *kernelEvents) header(h *trace.Header) {
	if k == nil {
		return
	}
	h.Types = append(h.Types, kevent.Dictionary(k.events)...)
	var asked []map[string]any
	for _, ev := range k.events {
		m := map[string]any{"event": ev.Type.Name, "source": ev.Spec.String()}
		if len(ev.Dropped) > 0 {
			m["not_recorded"] = ev.Dropped
		}
		if ev.Spec.SystemWide {
			m["system_wide"] = true
		}
		asked = append(asked, m)
	}
	h.Extra["kernel_events"] = asked
}

// finish writes the losses the kernel events still owe the stream and adds
// their counts to the result.
func (k *kernelEvents) finish(r *recorder, res *Result) error {
	if k == nil || k.set == nil {
		return nil
	}
	produced, lost, skipped, err := k.set.Counters()
	if err != nil {
		return err
	}
	if r.writeErr == nil {
		recs, err := k.set.PendingLosses(skipped, r.now())
		if err != nil {
			return err
		}
		for _, b := range recs {
			if err := r.w.Write(b); err != nil {
				return r.stopOnWrite(err)
			}
			r.counts[kevent.LostID]++
		}
	}
	if n := r.counts[kevent.LostID]; n > 0 {
		res.Events[kevent.LostName] = n
	}
	for i, ev := range k.events {
		if n := r.counts[ev.Type.ID]; n > 0 {
			res.Events[ev.Type.Name] = n
		}
		if produced[i] > 0 {
			res.Produced[ev.Type.Name] = produced[i]
		}
		if lost[i] > 0 {
			res.LostBy[ev.Type.Name] = lost[i]
			res.Lost += lost[i]
		}
	}
	return nil
}

// isLossRecord says whether records of type id count lost events (their
// total at offset 48), rather than being events themselves.
func isLossRecord(id uint8) bool {
	return id == uint8(event.Lost) || id == kevent.LostID
}
