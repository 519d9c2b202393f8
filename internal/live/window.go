// SPDX-License-Identifier: Apache-2.0

package live

// sample is one event of a stream: when, and how many bytes.
type sample struct {
	t uint64
	n int64
}

// eventWindow keeps the last max samples of a stream, for MAGNET 2.0's
// sliding window of N events. It grows as samples come, so a connection
// that moves little costs little.
type eventWindow struct {
	ring []sample
	next int // where the next sample goes once the ring is full
	max  int
}

func (w *eventWindow) add(t uint64, n int64) {
	if len(w.ring) < w.max {
		w.ring = append(w.ring, sample{t, n})
		return
	}
	if w.max == 0 {
		return
	}
	w.ring[w.next] = sample{t, n}
	w.next = (w.next + 1) % w.max
}

// rate returns the rate over the k newest samples (all there are when
// fewer): the bytes of all but the oldest over the time from the oldest to
// the newest, since the oldest event opens the window and its bytes arrived
// before it. Samples come in drain order, which is only roughly time order
// across CPUs, so the oldest and newest are found by time.
func (w *eventWindow) rate(k int) (bytes int64, events int, span uint64) {
	n := len(w.ring)
	if k <= 0 || k > n {
		k = n
	}
	if k < 2 {
		return 0, k, 0
	}
	var sum int64
	lo, hi := ^uint64(0), uint64(0)
	var loBytes int64
	// The k newest: the k slots before next, going backwards.
	for i := 0; i < k; i++ {
		idx := (w.next - 1 - i + 2*n) % n
		if len(w.ring) < w.max {
			idx = n - 1 - i // not yet wrapped: newest at the end
		}
		s := w.ring[idx]
		sum += s.n
		if s.t < lo {
			lo, loBytes = s.t, s.n
		}
		if s.t > hi {
			hi = s.t
		}
	}
	return sum - loBytes, k, hi - lo
}

// bucket counts what happened in one interval of the time windows.
type bucket struct {
	idx    int64 // time / resolution
	bytes  int64
	events int64
}

// timeWindow counts a stream in buckets of res ns, keeping those of the
// last history buckets that saw something.
type timeWindow struct {
	res     uint64
	history int64
	b       []bucket // increasing idx, from start on
	start   int
}

func (w *timeWindow) add(t uint64, n int64) {
	idx := int64(t / w.res)
	live := w.b[w.start:]
	switch {
	case len(live) == 0 || live[len(live)-1].idx < idx:
		w.b = append(w.b, bucket{idx: idx, bytes: n, events: 1})
	default:
		// Late (drain order): into its bucket, or the closest older one.
		i := len(live) - 1
		for i > 0 && live[i].idx > idx {
			i--
		}
		live[i].bytes += n
		live[i].events++
	}
	w.trim(idx)
}

// trim forgets buckets older than the history before newest.
func (w *timeWindow) trim(newest int64) {
	for w.start < len(w.b) && w.b[w.start].idx <= newest-w.history {
		w.start++
	}
	if w.start > 64 && w.start > len(w.b)/2 {
		n := copy(w.b, w.b[w.start:])
		w.b = w.b[:n]
		w.start = 0
	}
}

// sum returns what the last span ns before now saw: the buckets whose
// interval ends after now-span (exact to one bucket).
func (w *timeWindow) sum(now, span uint64) (bytes, events int64) {
	if w == nil || w.res == 0 {
		return 0, 0
	}
	nowIdx := int64(now / w.res)
	k := int64((span + w.res - 1) / w.res)
	live := w.b[w.start:]
	for i := len(live) - 1; i >= 0; i-- {
		b := live[i]
		if b.idx > nowIdx {
			continue
		}
		if b.idx <= nowIdx-k {
			break
		}
		bytes += b.bytes
		events += b.events
	}
	return bytes, events
}
