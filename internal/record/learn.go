// SPDX-License-Identifier: Apache-2.0

package record

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/sockowner"
)

// A socket that existed before the probes attached is met by no hook until
// it does something, and some never do anything a hook with its socket
// sees: a listener receives SYNs only at the device, found by address in
// the tuples map, which has it only once some hook met it. So the recorder
// learns every TCP and UDP socket at start, once the hooks are attached
// (a socket they meet first is theirs; none is missed in between), with the
// iterators of bpf/layer/learn.c in every network namespace, which judge it
// by the filters as a live socket and announce it in its owner's name.

// Learned says what learning the existing sockets did (Result.Learned).
type Learned struct {
	// Err says why the sockets were not learned; empty when they were.
	Err string
	// Sockets counts the TCP and UDP sockets the iterators visited,
	// Announced those announced with a conn_open (flag MG_CONN_LEARNED),
	// Known those the hooks had met already, Owned those whose owner the
	// walk of /proc found.
	Sockets, Announced, Known, Owned int
	NetNS                            int           // network namespaces iterated
	Took                             time.Duration // learning, once the probes were loaded (any wait for the walk included)
	WalkTook                         time.Duration // the walk of /proc, while the probes loaded
}

// walked is the outcome of the walk of /proc started before the probes
// load: it takes milliseconds, which loading covers.
type walked struct {
	t    *sockowner.Table
	err  error
	took time.Duration
}

func startWalk(proc string) <-chan walked {
	c := make(chan walked, 1)
	go func() {
		start := time.Now()
		t, err := sockowner.Walk(proc)
		c <- walked{t: t, err: err, took: time.Since(start)}
	}()
	return c
}

// learnSockets learns the existing sockets of every network namespace the
// walk found (only filterNetNS's, if set). It drains the rings after each
// batch the iterators give, so that the control ring, which takes the
// conn_open records, does not fill with many sockets.
func (r *recorder) learnSockets(walk <-chan walked, filterNetNS uint32) Learned {
	start := time.Now()
	var res Learned
	w := <-walk
	res.WalkTook = w.took
	if w.err != nil {
		res.Err = w.err.Error()
		return res
	}
	r.netns = map[uint32]string{}
	for ns, path := range w.t.NetNS {
		if filterNetNS == 0 || ns == filterNetNS {
			r.netns[ns] = path
		}
	}
	owners := make(map[uint64]probe.SocketOwner, len(w.t.Owners))
	for ino, o := range w.t.Owners {
		owners[ino] = probe.SocketOwner{PID: o.PID, UID: o.UID, Comm: o.Comm}
	}
	if err := r.probe.SetSocketOwners(owners); err != nil {
		res.Err = err.Error()
		return res
	}
	l, err := r.probe.SocketLearner()
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer l.Close()
	nss := make([]uint32, 0, len(w.t.NetNS))
	for ns := range w.t.NetNS {
		if filterNetNS == 0 || ns == filterNetNS {
			nss = append(nss, ns)
		}
	}
	slices.Sort(nss)
	var errs []error
	for _, ns := range nss {
		if err := r.learnNetNS(l, w.t.NetNS[ns], &res); err != nil {
			// A namespace whose last process exited meanwhile has no
			// socket left to learn.
			errs = append(errs, fmt.Errorf("netns %d: %w", ns, err))
			continue
		}
		res.NetNS++
	}
	if len(errs) > 0 && res.NetNS == 0 {
		res.Err = errors.Join(errs...).Error()
	}
	res.Took = time.Since(start)
	return res
}

func (r *recorder) learnNetNS(l *probe.SocketLearner, path string, res *Learned) error {
	var iters []interface {
		Read([]byte) (int, error)
		Close() error
	}
	err := sockowner.InNetNS(path, func() error {
		rcs, err := l.Open()
		for _, rc := range rcs {
			iters = append(iters, rc)
		}
		return err
	})
	if err != nil {
		return err
	}
	defer func() {
		for _, it := range iters {
			it.Close()
		}
	}()
	for _, it := range iters {
		err := probe.ReadLearned(it, func(ls []probe.Learned) error {
			for _, s := range ls {
				if s.Verdict == probe.LearnNotConn {
					continue
				}
				res.Sockets++
				switch s.Verdict {
				case probe.LearnSelected:
					res.Announced++
				case probe.LearnKnown:
					res.Known++
				}
				if s.Owned {
					res.Owned++
				}
			}
			// Their conn_open records wait in the control ring.
			_, _, err := r.drain()
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// summary is Learned as the trace's summary holds it (extra.learned_at_start).
func (l Learned) summary() map[string]any {
	m := map[string]any{
		"sockets": l.Sockets, "announced": l.Announced, "known": l.Known, "owned": l.Owned,
		"netns": l.NetNS, "ns": l.Took.Nanoseconds(),
	}
	if l.Err != "" {
		m["error"] = l.Err
	}
	return m
}
