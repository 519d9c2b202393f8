// SPDX-License-Identifier: Apache-2.0

// Package devskip counts the frames an interface handled for which the
// kernel ran no device program. The kernel sometimes runs no program at
// net_dev_start_xmit, netif_receive_skb or net_dev_queue for a frame the
// interface sends or receives, and counts that nowhere (recursion_misses
// stays 0; bpftrace misses the same frames). The device programs count
// their runs by interface before anything else (bpf/lib/devruns.h); this
// package compares those counts, over the recording, with the interface's
// own packet counters (rtnetlink IFLA_STATS64), where the two count the
// same skbs: on veth, whose tx_packets and tx_dropped count each skb given
// to it (a GSO packet once, as the tracepoints see it) and whose
// rx_packets count each skb its peer passed to the receive backlog, which
// netif_receive_skb then sees once.
package devskip

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/magnet-tracer/magnet/internal/probe"
)

// Key names an interface: its network namespace's inode and its ifindex.
type Key struct{ NetNS, Ifindex uint32 }

// KeyOf splits the BPF map's key, netns << 32 | ifindex.
func KeyOf(k uint64) Key { return Key{NetNS: uint32(k >> 32), Ifindex: uint32(k)} }

// Source is what the device programs say: their runs by interface, and
// which of them are attached.
type Source interface {
	DevRunsByInterface() (map[uint64]probe.DevRuns, error)
	DevAttached() (queue, xmit, recv bool, attaches uint64)
}

// Dir compares one device program's runs on an interface with the frames
// the interface counted, over the recording.
type Dir struct {
	// Handled counts the frames the interface counted: sent (tx_packets +
	// tx_dropped), or received (rx_packets).
	Handled uint64 `json:"handled"`
	Runs    uint64 `json:"runs"` // the program's runs on the interface
	// Skipped is Handled - Runs: frames the kernel ran the program for
	// not. Below zero only when a boundary below was crossed.
	Skipped int64 `json:"skipped"`
	// Uncertain bounds the error of Skipped where a snapshot could not
	// read the runs and the counters at one instant (the program ran while
	// the counters were read, at every try): Skipped is within
	// ±Uncertain of the truth.
	Uncertain uint64 `json:"uncertain,omitempty"`
	// NotChecked says why the runs were not compared; then the figures
	// above are zero.
	NotChecked string `json:"not_checked,omitempty"`
}

// Iface is the comparison on one interface.
type Iface struct {
	NetNS   uint32 `json:"netns"`
	Ifindex uint32 `json:"ifindex"`
	Name    string `json:"name"`
	Kind    string `json:"kind,omitempty"`
	// NotChecked says why no direction was compared.
	NotChecked string `json:"not_checked,omitempty"`
	Xmit       Dir    `json:"dev_xmit"`  // net_dev_start_xmit against frames sent
	Recv       Dir    `json:"dev_recv"`  // netif_receive_skb against frames received
	Queue      Dir    `json:"dev_queue"` // net_dev_queue against frames sent, without a qdisc that holds packets
}

// Report is the comparison on every interface of the recorded namespaces.
type Report struct {
	// Skipped sums the positive Skipped of every direction compared:
	// program runs the kernel did not make for a frame an interface handled.
	Skipped uint64 `json:"skipped"`
	// Uncertain sums the Uncertain of the same directions.
	Uncertain uint64  `json:"uncertain,omitempty"`
	Ifaces    []Iface `json:"interfaces"`
	// NotRead names the namespaces whose interfaces could not be read at
	// the start (netns inode → why): none of their interfaces is checked.
	NotRead map[uint32]string `json:"namespaces_not_read,omitempty"`
}

// Checked counts the directions compared.
func (r Report) Checked() int {
	n := 0
	for _, i := range r.Ifaces {
		for _, d := range []Dir{i.Xmit, i.Recv, i.Queue} {
			if d.NotChecked == "" {
				n++
			}
		}
	}
	return n
}

// point is one interface at a snapshot: the runs and the counters read at
// one instant, or as near as unc says.
type point struct {
	runs probe.DevRuns
	link Link
	// unc: how much each run count moved while the counters were read,
	// at the last try (zero once settled).
	unc probe.DevRuns
}

type snapshot struct {
	at       map[Key]point
	unread   map[uint32]string // netns → why its interfaces were not read
	attached [3]bool           // queue, xmit, recv
	attaches uint64
	// readAt: when each namespace's counters were read (a namespace
	// taken over from an earlier snapshot keeps its time).
	readAt map[uint32]time.Time
}

// Tries bounds the reads of a snapshot: each reads every interface's
// counters between two reads of the runs, until the runs did not move in
// between.
const Tries = 8

// take reads a snapshot of the namespaces nss (inode → path).
//
// The counters of a namespace are read between two reads of the runs. An
// interface whose runs are the same at both reads had them unchanged all
// through the counters' read, so the pair is of one instant: it is kept.
// Those whose runs moved are read again, up to Tries times; the last try
// is kept with the runs' movement as its uncertainty. A namespace is
// entered once for all its tries, and each try reads the runs right
// before asking for its counters and right after the kernel gave them.
//
// With prev (a background check), a namespace quiet since prev's read of
// it (quietSince) is taken over from prev rather than read.
func take(src Source, nss map[uint32]string, in linksIn, prev *snapshot, now time.Time) (*snapshot, error) {
	s := &snapshot{at: map[Key]point{}, unread: map[uint32]string{}, readAt: map[uint32]time.Time{}}
	q, x, r, n := src.DevAttached()
	s.attached, s.attaches = [3]bool{q, x, r}, n
	before, err := runsByKey(src)
	if err != nil {
		return nil, err
	}
	var prevByNS map[uint32][]Key
	if prev != nil && prev.attaches == s.attaches {
		prevByNS = map[uint32][]Key{}
		for k := range prev.at {
			prevByNS[k.NetNS] = append(prevByNS[k.NetNS], k)
		}
	}
	for _, ns := range slices.Sorted(maps.Keys(nss)) {
		if prevByNS != nil && quietSince(prev, prevByNS[ns], ns, before, now) {
			for _, k := range prevByNS[ns] {
				s.at[k] = prev.at[k]
			}
			s.readAt[ns] = prev.readAt[ns]
			continue
		}
		s.readAt[ns] = now
		var runsErr error
		err := in(nss[ns], func(read linkRead) error {
			for range Tries {
				var after map[Key]probe.DevRuns
				runs := func(into *map[Key]probe.DevRuns) func() error {
					return func() error {
						var err error
						if *into, err = runsByKey(src); err != nil {
							runsErr = err
						}
						return err
					}
				}
				links, err := read(runs(&before), runs(&after))
				if err != nil {
					return err
				}
				settled := true
				for ifindex, l := range links {
					k := Key{NetNS: ns, Ifindex: ifindex}
					if p, ok := s.at[k]; ok && p.unc == (probe.DevRuns{}) {
						continue
					}
					p := point{runs: after[k], link: l, unc: moved(before[k], after[k])}
					s.at[k] = p
					if p.unc != (probe.DevRuns{}) {
						settled = false
					}
				}
				before = after // the freshest runs, for the next namespace's quietSince
				if settled {
					return nil
				}
			}
			return nil
		})
		if runsErr != nil {
			return nil, runsErr
		}
		if err != nil {
			s.unread[ns] = err.Error()
		}
	}
	return s, nil
}

// quietSince says whether namespace ns's interfaces (keys, in prev) can
// be taken over from prev: read less than QuietFor before now, every veth
// settled with the runs the same in runs as at that read (see QuietFor),
// and no runs on an interface prev did not have. Other interfaces are not
// compared (NotVeth), whatever their runs; one replaced by a veth under
// the same ifindex is seen within QuietFor, and by the final Check.
func quietSince(prev *snapshot, keys []Key, ns uint32, runs map[Key]probe.DevRuns, now time.Time) bool {
	at, ok := prev.readAt[ns]
	if !ok || now.Sub(at) >= QuietFor || len(keys) == 0 {
		return false
	}
	for _, k := range keys {
		p := prev.at[k]
		if p.link.Kind != "veth" {
			// Not compared whatever its figures (NotVeth): a busy
			// loopback does not make its namespace read again.
			continue
		}
		if p.unc != (probe.DevRuns{}) || p.runs != runs[k] {
			return false
		}
	}
	for k := range runs {
		if _, ok := prev.at[k]; k.NetNS == ns && !ok {
			return false // runs on an interface prev did not have
		}
	}
	return true
}

func runsByKey(src Source) (map[Key]probe.DevRuns, error) {
	m, err := src.DevRunsByInterface()
	if err != nil {
		return nil, err
	}
	out := make(map[Key]probe.DevRuns, len(m))
	for k, r := range m {
		out[KeyOf(k)] = r
	}
	return out, nil
}

func moved(a, b probe.DevRuns) probe.DevRuns {
	d := func(x, y uint64) uint64 {
		if y > x {
			return y - x
		}
		return x - y
	}
	return probe.DevRuns{Queue: d(a.Queue, b.Queue), QueueDirect: d(a.QueueDirect, b.QueueDirect), Xmit: d(a.Xmit, b.Xmit), Recv: d(a.Recv, b.Recv)}
}

// Reasons a direction or an interface is not compared.
const (
	NotAttached  = "its program was not attached all through"
	NoStart      = "not there when recording started"
	Gone         = "gone before the end"
	Replaced     = "its ifindex names another interface at the end"
	NotVeth      = "only veth is compared: other drivers count frames otherwise (NICs count wire frames after TSO and before GRO)"
	WithXDP      = "an XDP program on the veth counts frames in its own path"
	WithGRO      = "GRO on the veth: it counts frames before merging them"
	QdiscHeld    = "a qdisc held packets: its queue and drops are not the interface's counters"
	WentBackward = "its counters went backwards"
)

// Compare compares one interface's snapshots at start and end; attached
// says which programs were attached all through (queue, xmit, recv).
func Compare(start, end point, attached [3]bool) Iface {
	in := Iface{Name: end.link.Name, Kind: end.link.Kind}
	switch {
	case start.link.Name != end.link.Name || start.link.Kind != end.link.Kind:
		in.NotChecked = Replaced
	case end.link.Kind != "veth":
		in.NotChecked = NotVeth
	case start.link.XDP || end.link.XDP:
		in.NotChecked = WithXDP
	}
	if in.NotChecked != "" {
		in.Xmit.NotChecked, in.Recv.NotChecked, in.Queue.NotChecked = in.NotChecked, in.NotChecked, in.NotChecked
		return in
	}
	sent0 := start.link.TxPackets + start.link.TxDropped
	sent1 := end.link.TxPackets + end.link.TxDropped
	in.Xmit = compareDir(sent0, sent1, start.runs.Xmit, end.runs.Xmit, start.unc.Xmit+end.unc.Xmit, attached[1])
	in.Recv = compareDir(start.link.RxPackets, end.link.RxPackets, start.runs.Recv, end.runs.Recv, start.unc.Recv+end.unc.Recv, attached[2])
	if start.link.GRO || end.link.GRO {
		in.Recv = Dir{NotChecked: WithGRO}
	}
	in.Queue = compareDir(sent0, sent1, start.runs.Queue, end.runs.Queue, start.unc.Queue+end.unc.Queue, attached[0])
	if in.Queue.NotChecked == "" && end.runs.Queue-start.runs.Queue != end.runs.QueueDirect-start.runs.QueueDirect {
		in.Queue = Dir{NotChecked: QdiscHeld}
	}
	return in
}

func compareDir(handled0, handled1, runs0, runs1, unc uint64, attached bool) Dir {
	if !attached {
		return Dir{NotChecked: NotAttached}
	}
	if handled1 < handled0 || runs1 < runs0 {
		return Dir{NotChecked: WentBackward}
	}
	d := Dir{Handled: handled1 - handled0, Runs: runs1 - runs0, Uncertain: unc}
	d.Skipped = int64(d.Handled) - int64(d.Runs)
	return d
}

// compareAll compares every interface of the start snapshot.
func compareAll(start, end *snapshot) Report {
	var attached [3]bool
	for i := range attached {
		attached[i] = start.attached[i] && end.attached[i] && start.attaches == end.attaches
	}
	var rep Report
	if len(start.unread) > 0 {
		rep.NotRead = maps.Clone(start.unread)
	}
	keys := slices.SortedFunc(maps.Keys(start.at), func(a, b Key) int {
		if a.NetNS != b.NetNS {
			return int(int64(a.NetNS) - int64(b.NetNS))
		}
		return int(int64(a.Ifindex) - int64(b.Ifindex))
	})
	for _, k := range keys {
		s := start.at[k]
		e, ok := end.at[k]
		var in Iface
		if !ok {
			in = Iface{Name: s.link.Name, Kind: s.link.Kind, NotChecked: Gone}
			if why, unread := end.unread[k.NetNS]; unread {
				in.NotChecked = Gone + ": " + why
			}
			in.Xmit.NotChecked, in.Recv.NotChecked, in.Queue.NotChecked = in.NotChecked, in.NotChecked, in.NotChecked
		} else {
			in = Compare(s, e, attached)
		}
		in.NetNS, in.Ifindex = k.NetNS, k.Ifindex
		for _, d := range []Dir{in.Xmit, in.Recv, in.Queue} {
			if d.NotChecked == "" {
				rep.Skipped += uint64(max(d.Skipped, 0))
				rep.Uncertain += d.Uncertain
			}
		}
		rep.Ifaces = append(rep.Ifaces, in)
	}
	// Interfaces that appeared after the start: no counters to begin from.
	for _, k := range slices.SortedFunc(maps.Keys(end.at), func(a, b Key) int {
		if a.NetNS != b.NetNS {
			return int(int64(a.NetNS) - int64(b.NetNS))
		}
		return int(int64(a.Ifindex) - int64(b.Ifindex))
	}) {
		if _, ok := start.at[k]; ok {
			continue
		}
		e := end.at[k]
		in := Iface{NetNS: k.NetNS, Ifindex: k.Ifindex, Name: e.link.Name, Kind: e.link.Kind, NotChecked: NoStart}
		in.Xmit.NotChecked, in.Recv.NotChecked, in.Queue.NotChecked = NoStart, NoStart, NoStart
		rep.Ifaces = append(rep.Ifaces, in)
	}
	return rep
}

// Checker compares the device programs' runs with the interfaces' counters
// from its start: Start once the programs are attached, then Check as
// often as wanted (each reads every interface of the namespaces).
type Checker struct {
	src     Source
	nss     map[uint32]string
	linksIn linksIn

	mu    sync.Mutex
	start *snapshot
	// last: the last snapshot taken, whose quiet namespaces the next
	// background check takes over.
	last     *snapshot
	high     map[dirKey]uint64
	latest   *Report
	checking bool
	// quiet: the runs and attaches read before latest's check, and when;
	// CheckLater makes no new check while they stay the same (QuietFor).
	quiet quietMark
	now   func() time.Time
	// checked, if not nil, is sent to after each background check (tests).
	checked chan struct{}
	// carried: what was compared before the last change of the programs
	// attached, added to what is compared since.
	carried Report
}

type dirKey struct {
	Key
	dir string
}

// NewChecker compares on the interfaces of the network namespaces nss
// (inode → a path that opens it).
func NewChecker(src Source, nss map[uint32]string) *Checker {
	return &Checker{src: src, nss: nss, linksIn: linksInNetNS, high: map[dirKey]uint64{}, now: time.Now}
}

// Start reads the snapshot the comparison starts from. Call it after the
// programs attached: a frame before that is counted by the interface
// before the start, and a run is counted only once attached.
func (c *Checker) Start() error {
	s, err := take(c.src, c.nss, c.linksIn, nil, c.now())
	if err != nil {
		return fmt.Errorf("device runs at start: %w", err)
	}
	c.mu.Lock()
	c.start, c.last = s, s
	c.mu.Unlock()
	return nil
}

// Check compares from the start to now. Call it before the programs
// detach: a frame after is counted by the interface and by no program.
func (c *Checker) Check() (Report, error) { return c.check(false) }

// check is Check; with reuse, a namespace whose runs did not move since
// the last snapshot is taken over from it rather than read (QuietFor).
func (c *Checker) check(reuse bool) (Report, error) {
	c.mu.Lock()
	start := c.start
	var prev *snapshot
	if reuse {
		prev = c.last
	}
	c.mu.Unlock()
	if start == nil {
		return Report{}, fmt.Errorf("device runs: not started")
	}
	end, err := take(c.src, c.nss, c.linksIn, prev, c.now())
	if err != nil {
		return Report{}, fmt.Errorf("device runs: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last = end
	if c.start != start {
		// Another Check rebased meanwhile: this one's start is gone.
		return Report{}, fmt.Errorf("device runs: compared from a start since replaced")
	}
	if end.attaches == start.attaches {
		return merge(c.carried, compareAll(start, end)), nil
	}
	// A program attached or detached since the start (the daemon turns
	// groups on and off): from then on its runs and the counters do not
	// cover the same frames. Keep what the last comparison found and
	// compare from now; what happened between the two is not compared.
	if c.latest != nil {
		c.carried = *c.latest
	}
	c.start = end
	return merge(c.carried, compareAll(end, end)), nil
}

// merge adds the comparisons of b to those of a, interface by interface;
// a direction compared in either is compared.
func merge(a, b Report) Report {
	if len(a.Ifaces) == 0 {
		return b
	}
	out := Report{NotRead: b.NotRead}
	byKey := map[Key]int{}
	for _, in := range a.Ifaces {
		byKey[Key{in.NetNS, in.Ifindex}] = len(out.Ifaces)
		out.Ifaces = append(out.Ifaces, in)
	}
	for _, in := range b.Ifaces {
		i, ok := byKey[Key{in.NetNS, in.Ifindex}]
		if !ok {
			out.Ifaces = append(out.Ifaces, in)
			continue
		}
		o := &out.Ifaces[i]
		if o.NotChecked != "" || o.Name != in.Name {
			*o = in
			continue
		}
		for _, d := range []struct{ to, from *Dir }{{&o.Xmit, &in.Xmit}, {&o.Recv, &in.Recv}, {&o.Queue, &in.Queue}} {
			switch {
			case d.from.NotChecked != "":
			case d.to.NotChecked != "":
				*d.to = *d.from
			default:
				d.to.Handled += d.from.Handled
				d.to.Runs += d.from.Runs
				d.to.Skipped += d.from.Skipped
				d.to.Uncertain += d.from.Uncertain
			}
		}
	}
	for _, in := range out.Ifaces {
		for _, d := range []Dir{in.Xmit, in.Recv, in.Queue} {
			if d.NotChecked == "" {
				out.Skipped += uint64(max(d.Skipped, 0))
				out.Uncertain += d.Uncertain
			}
		}
	}
	return out
}

// Counter is one interface and direction's skipped runs as a counter that
// never goes down (the Prometheus export).
type Counter struct {
	Key
	Name  string
	Dir   string // dev_xmit, dev_recv, dev_queue
	Total uint64
}

// Counters returns rep's skipped runs as counters: each the largest value
// seen so far, since a snapshot in the middle of traffic may see one lower
// than an earlier one (within its Uncertain).
func (c *Checker) Counters(rep Report) []Counter {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Counter
	for _, in := range rep.Ifaces {
		for _, d := range []struct {
			name string
			d    Dir
		}{{"dev_xmit", in.Xmit}, {"dev_recv", in.Recv}, {"dev_queue", in.Queue}} {
			if d.d.NotChecked != "" {
				continue
			}
			k := dirKey{Key{in.NetNS, in.Ifindex}, d.name}
			c.high[k] = max(c.high[k], uint64(max(d.d.Skipped, 0)))
			out = append(out, Counter{Key: k.Key, Name: in.Name, Dir: d.name, Total: c.high[k]})
		}
	}
	return out
}

// QuietFor bounds how long CheckLater leaves the last report as it is
// while the device programs' runs do not move.
//
// Reading every namespace's interface counters takes a recorder ~0.1 ms
// per namespace; most of an idle recorder's CPU time when done each
// second. The runs are one system call. A frame on a recorded veth runs
// the device programs at both ends, so runs that did not move mean no
// frame crossed, unless the kernel skipped the programs at both ends of
// every frame since: only that is reported up to QuietFor late (and
// exactly by the Check at the end).
const QuietFor = 10 * time.Second

type quietMark struct {
	runs     map[Key]probe.DevRuns
	attaches uint64
	at       time.Time
}

// CheckLater starts a Check in the background, unless one is under way
// or the runs did not move since the last one (QuietFor): reading every
// namespace's interfaces takes milliseconds, which a caller that must not
// wait (the recorder's loop) leaves to Latest.
func (c *Checker) CheckLater() {
	c.mu.Lock()
	if c.checking || c.start == nil {
		c.mu.Unlock()
		return
	}
	c.checking = true
	last := c.quiet
	haveLatest := c.latest != nil
	c.mu.Unlock()
	q, x, r, attaches := c.src.DevAttached()
	now := c.now()
	var runs map[Key]probe.DevRuns
	var err error
	if !q && !x && !r && attaches == last.attaches && last.runs != nil {
		// No device program attached since the last check: no run
		// can have moved, and none was compared.
		runs = last.runs
	} else {
		runs, err = runsByKey(c.src)
	}
	if err == nil && haveLatest && last.runs != nil && attaches == last.attaches &&
		now.Sub(last.at) < QuietFor && maps.Equal(runs, last.runs) {
		c.mu.Lock()
		c.checking = false
		c.mu.Unlock()
		return
	}
	go func() {
		rep, err := c.check(true)
		c.mu.Lock()
		c.checking = false
		if err == nil {
			c.latest = &rep
			// The runs read before the check: any run during it
			// makes the next CheckLater check again.
			c.quiet = quietMark{runs: runs, attaches: attaches, at: now}
		}
		c.mu.Unlock()
		if c.checked != nil {
			c.checked <- struct{}{}
		}
	}()
}

// Latest returns the last report CheckLater made, if any.
func (c *Checker) Latest() (Report, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.latest == nil {
		return Report{}, false
	}
	return *c.latest, true
}
