// SPDX-License-Identifier: Apache-2.0

package devskip

import (
	"errors"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/probe"
)

func veth(tx, txDrop, rx uint64) Link {
	return Link{Name: "va", Kind: "veth", TxPackets: tx, TxDropped: txDrop, RxPackets: rx}
}

var all = [3]bool{true, true, true}

func TestCompareExact(t *testing.T) {
	start := point{runs: probe.DevRuns{Queue: 10, QueueDirect: 10, Xmit: 10, Recv: 5}, link: veth(100, 1, 50)}
	// 1000 frames sent, 7 of them dropped by the veth (after
	// net_dev_start_xmit ran): the program ran for 993 of them; 400
	// received, the program ran for 398.
	end := point{runs: probe.DevRuns{Queue: 1003, QueueDirect: 1003, Xmit: 1003, Recv: 403}, link: veth(1093, 8, 450)}
	in := Compare(start, end, all)
	if in.NotChecked != "" {
		t.Fatalf("not checked: %s", in.NotChecked)
	}
	if want := (Dir{Handled: 1000, Runs: 993, Skipped: 7}); in.Xmit != want {
		t.Errorf("dev_xmit %+v, want %+v", in.Xmit, want)
	}
	if want := (Dir{Handled: 400, Runs: 398, Skipped: 2}); in.Recv != want {
		t.Errorf("dev_recv %+v, want %+v", in.Recv, want)
	}
	if want := (Dir{Handled: 1000, Runs: 993, Skipped: 7}); in.Queue != want {
		t.Errorf("dev_queue %+v, want %+v", in.Queue, want)
	}
}

func TestCompareNotChecked(t *testing.T) {
	base := point{link: veth(0, 0, 0)}
	for _, tc := range []struct {
		name       string
		start, end point
		attached   [3]bool
		xmit, recv string
		queue      string
	}{
		{"lo", point{link: Link{Name: "lo"}}, point{link: Link{Name: "lo", TxPackets: 5}}, all, NotVeth, NotVeth, NotVeth},
		{"xdp", base, point{link: Link{Name: "va", Kind: "veth", XDP: true}}, all, WithXDP, WithXDP, WithXDP},
		{"gro", base, point{link: Link{Name: "va", Kind: "veth", GRO: true}}, all, "", WithGRO, ""},
		{"replaced", base, point{link: Link{Name: "vb", Kind: "veth"}}, all, Replaced, Replaced, Replaced},
		{"detached", base, base, [3]bool{true, false, true}, NotAttached, "", ""},
		{"qdisc", base, point{runs: probe.DevRuns{Queue: 3, QueueDirect: 1, Xmit: 3}, link: veth(3, 0, 0)}, all, "", "", QdiscHeld},
		{"backwards", point{link: veth(9, 0, 9)}, point{link: veth(3, 0, 9)}, all, WentBackward, "", WentBackward},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := Compare(tc.start, tc.end, tc.attached)
			if in.Xmit.NotChecked != tc.xmit || in.Recv.NotChecked != tc.recv || in.Queue.NotChecked != tc.queue {
				t.Errorf("not checked: xmit %q recv %q queue %q; want %q %q %q", in.Xmit.NotChecked, in.Recv.NotChecked, in.Queue.NotChecked, tc.xmit, tc.recv, tc.queue)
			}
		})
	}
}

// fakeSource plays back run counts, one map per read.
type fakeSource struct {
	reads    []map[uint64]probe.DevRuns
	i        int
	attaches uint64
}

func (f *fakeSource) DevRunsByInterface() (map[uint64]probe.DevRuns, error) {
	if f.i >= len(f.reads) {
		return f.reads[len(f.reads)-1], nil
	}
	f.i++
	return f.reads[f.i-1], nil
}

func (f *fakeSource) DevAttached() (bool, bool, bool, uint64) { return true, true, true, f.attaches }

const ns = 4026531840

// plainLinks is a linksIn whose reads call read with the namespace's path.
func plainLinks(read func(string) (map[uint32]Link, error)) linksIn {
	return func(path string, fn func(linkRead) error) error {
		return fn(func(before, after func() error) (map[uint32]Link, error) {
			if before != nil {
				if err := before(); err != nil {
					return nil, err
				}
			}
			l, err := read(path)
			if err != nil {
				return nil, err
			}
			if after != nil {
				if err := after(); err != nil {
					return nil, err
				}
			}
			return l, nil
		})
	}
}

func key(ifindex uint32) uint64 { return uint64(ns)<<32 | uint64(ifindex) }

// TestTakeSettles: a pair of reads of the runs (right before and right
// after the counters') that moved is read again; the first pair that did
// not move is kept, with no uncertainty.
func TestTakeSettles(t *testing.T) {
	src := &fakeSource{reads: []map[uint64]probe.DevRuns{
		{key(2): {Xmit: 5}}, // at the snapshot's start
		{key(2): {Xmit: 5}}, // before the first read of the counters
		{key(2): {Xmit: 7}}, // moved during it
		{key(2): {Xmit: 7}}, // before the second
		{key(2): {Xmit: 7}}, // still after it
	}}
	links := []Link{veth(6, 0, 0), veth(7, 0, 0)}
	n := 0
	read := func(string) (map[uint32]Link, error) {
		l := links[min(n, len(links)-1)]
		n++
		return map[uint32]Link{2: l}, nil
	}
	s, err := take(src, map[uint32]string{ns: "/x"}, plainLinks(read), nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	p := s.at[Key{ns, 2}]
	if p.runs.Xmit != 7 || p.link.TxPackets != 7 || p.unc != (probe.DevRuns{}) {
		t.Errorf("kept %+v, want runs 7 with tx_packets 7, settled", p)
	}
	if n != 2 {
		t.Errorf("counters read %d times, want 2", n)
	}
}

// TestTakeUnsettled: runs that move at every try leave the last pair with
// the movement as its uncertainty, and Compare carries it.
func TestTakeUnsettled(t *testing.T) {
	// The start, then a pair around each try: 5 runs during each.
	var reads []map[uint64]probe.DevRuns
	for i := range 2*Tries + 1 {
		reads = append(reads, map[uint64]probe.DevRuns{key(2): {Xmit: uint64(5 * i)}})
	}
	src := &fakeSource{reads: reads}
	n := uint64(0)
	read := func(string) (map[uint32]Link, error) {
		n++
		return map[uint32]Link{2: veth(10*n-3, 0, 0)}, nil
	}
	s, err := take(src, map[uint32]string{ns: "/x"}, plainLinks(read), nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	p := s.at[Key{ns, 2}]
	if p.unc.Xmit != 5 || p.runs.Xmit != 10*Tries {
		t.Errorf("kept %+v, want runs %d with uncertainty 5", p, 10*Tries)
	}
	start := point{link: veth(0, 0, 0)}
	in := Compare(start, p, all)
	if in.Xmit.Uncertain != 5 || in.Xmit.Skipped != -3 {
		t.Errorf("dev_xmit %+v, want skipped -3 ± 5", in.Xmit)
	}
}

func TestCompareAll(t *testing.T) {
	start := &snapshot{at: map[Key]point{
		{ns, 1}: {link: Link{Name: "lo"}},
		{ns, 2}: {runs: probe.DevRuns{Xmit: 1, Recv: 1}, link: veth(1, 0, 1)},
		{ns, 3}: {link: veth(0, 0, 0)},
	}, unread: map[uint32]string{7: "gone"}, attached: all, attaches: 9}
	end := &snapshot{at: map[Key]point{
		{ns, 1}: {link: Link{Name: "lo"}},
		{ns, 2}: {runs: probe.DevRuns{Xmit: 11, Recv: 5}, link: veth(14, 0, 6)},
		{ns, 4}: {link: Link{Name: "vc", Kind: "veth"}},
	}, attached: all, attaches: 9}
	rep := compareAll(start, end)
	// Interface 2: 3 sends and 1 receive skipped; its queue runs (0) are
	// all direct, so 13 queue runs skipped too.
	if rep.Skipped != 3+1+13 {
		t.Errorf("skipped %d, want 17", rep.Skipped)
	}
	if len(rep.Ifaces) != 4 || rep.Ifaces[2].NotChecked != Gone || rep.Ifaces[3].NotChecked != NoStart {
		t.Errorf("interfaces %+v", rep.Ifaces)
	}
	if rep.NotRead[7] != "gone" {
		t.Errorf("namespaces not read %v", rep.NotRead)
	}
	lines := strings.Join(rep.Lines(), "\n")
	for _, want := range []string{"17 device program runs", "va (netns 4026531840, ifindex 2): dev_xmit 3 of 13, dev_recv 1 of 5", "not checked: lo", "not checked: netns 7"} {
		if !strings.Contains(lines, want) {
			t.Errorf("lines lack %q:\n%s", want, lines)
		}
	}
	// Attached again in between: nothing compared.
	end.attaches++
	if rep := compareAll(start, end); rep.Skipped != 0 || rep.Checked() != 0 {
		t.Errorf("after a re-attach: skipped %d over %d comparisons, want none", rep.Skipped, rep.Checked())
	}
}

func TestCountersNeverGoDown(t *testing.T) {
	c := NewChecker(&fakeSource{}, nil)
	rep := Report{Ifaces: []Iface{{NetNS: ns, Ifindex: 2, Name: "va", Xmit: Dir{Skipped: 5}, Recv: Dir{NotChecked: WithGRO}, Queue: Dir{Skipped: 1}}}}
	c.Counters(rep)
	rep.Ifaces[0].Xmit.Skipped = 4
	got := c.Counters(rep)
	if len(got) != 2 || got[0].Dir != "dev_xmit" || got[0].Total != 5 || got[1].Total != 1 {
		t.Errorf("counters %+v", got)
	}
}

func TestCheckBeforeStart(t *testing.T) {
	c := NewChecker(&fakeSource{}, nil)
	if _, err := c.Check(); err == nil {
		t.Error("Check before Start: no error")
	}
	c.linksIn = plainLinks(func(string) (map[uint32]Link, error) { return nil, errors.New("no such namespace") })
	c.nss = map[uint32]string{ns: "/nowhere"}
	c.src = &fakeSource{reads: []map[uint64]probe.DevRuns{{}}}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	rep, err := c.Check()
	if err != nil {
		t.Fatal(err)
	}
	if rep.NotRead[ns] != "no such namespace" || rep.Checked() != 0 {
		t.Errorf("report %+v", rep)
	}
	if l := rep.Lines()[0]; !strings.HasPrefix(l, "no interface compared") {
		t.Errorf("first line %q", l)
	}
}

// TestRebaseOnAttach: once a program attaches or detaches, what was
// compared before is kept and the comparison starts again from there.
func TestRebaseOnAttach(t *testing.T) {
	src := &fakeSource{reads: []map[uint64]probe.DevRuns{{key(2): {Xmit: 0}}}}
	tx := uint64(0)
	c := NewChecker(src, map[uint32]string{ns: "/x"})
	c.linksIn = plainLinks(func(string) (map[uint32]Link, error) { return map[uint32]Link{2: veth(tx, 0, 0)}, nil })
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	// 10 frames sent, 8 runs: 2 skipped.
	src.reads, src.i, tx = []map[uint64]probe.DevRuns{{key(2): {Xmit: 8, Queue: 8, QueueDirect: 8}}}, 0, 10
	rep, err := c.Check()
	if err != nil || rep.Ifaces[0].Xmit.Skipped != 2 {
		t.Fatalf("first check %+v %v", rep, err)
	}
	c.latest = &rep
	// The programs change; the frames in between are not compared.
	src.attaches++
	src.reads, src.i, tx = []map[uint64]probe.DevRuns{{key(2): {Xmit: 50, Queue: 50, QueueDirect: 50}}}, 0, 100
	if rep, err = c.Check(); err != nil || rep.Ifaces[0].Xmit.Skipped != 2 || rep.Ifaces[0].Xmit.Handled != 10 {
		t.Fatalf("at the change %+v %v", rep, err)
	}
	// After: 20 more frames, 19 runs.
	src.reads, src.i, tx = []map[uint64]probe.DevRuns{{key(2): {Xmit: 69, Queue: 69, QueueDirect: 69}}}, 0, 120
	rep, err = c.Check()
	if err != nil {
		t.Fatal(err)
	}
	if x := rep.Ifaces[0].Xmit; x.Skipped != 3 || x.Handled != 30 || rep.Skipped != 3+3 {
		t.Errorf("after the change: dev_xmit %+v, total %d; want 3 of 30 (and 3 at dev_queue)", x, rep.Skipped)
	}
}

// TestTakeEachNamespace: each namespace's tries read the runs right
// around its own counters, and a namespace that settled is not read again
// while another is.
func TestTakeEachNamespace(t *testing.T) {
	const ns2 = ns + 1
	k2 := uint64(ns2)<<32 | 3
	src := &fakeSource{reads: []map[uint64]probe.DevRuns{
		{key(2): {Xmit: 1}, k2: {Recv: 1}}, // at the start
		{key(2): {Xmit: 5}, k2: {Recv: 1}}, // before ns's read
		{key(2): {Xmit: 5}, k2: {Recv: 1}}, // after it: settled
		{key(2): {Xmit: 9}, k2: {Recv: 1}}, // before ns2's first read
		{key(2): {Xmit: 9}, k2: {Recv: 4}}, // after it: moved
		{key(2): {Xmit: 9}, k2: {Recv: 4}}, // before its second
		{key(2): {Xmit: 9}, k2: {Recv: 4}}, // after it: settled
	}}
	reads := map[string]int{}
	read := func(path string) (map[uint32]Link, error) {
		reads[path]++
		if path == "/a" {
			return map[uint32]Link{2: veth(5, 0, 0)}, nil
		}
		return map[uint32]Link{3: veth(0, 0, uint64(reads[path]))}, nil
	}
	s, err := take(src, map[uint32]string{ns: "/a", ns2: "/b"}, plainLinks(read), nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if reads["/a"] != 1 || reads["/b"] != 2 {
		t.Errorf("counters read %v, want /a once, /b twice", reads)
	}
	if p := s.at[Key{ns, 2}]; p.runs.Xmit != 5 || p.unc != (probe.DevRuns{}) {
		t.Errorf("ns: kept %+v, want runs 5 settled", p)
	}
	if p := s.at[Key{ns2, 3}]; p.runs.Recv != 4 || p.link.RxPackets != 2 || p.unc != (probe.DevRuns{}) {
		t.Errorf("ns2: kept %+v, want runs 4 with the second read, settled", p)
	}
}

// TestTakeRunsError: a failed read of the runs fails the snapshot, not
// only the namespace being read.
func TestTakeRunsError(t *testing.T) {
	src := &failingSource{ok: 1}
	_, err := take(src, map[uint32]string{ns: "/a"}, plainLinks(func(string) (map[uint32]Link, error) {
		return map[uint32]Link{2: veth(1, 0, 0)}, nil
	}), nil, time.Time{})
	if err == nil || !strings.Contains(err.Error(), "map gone") {
		t.Errorf("error %v, want the runs' read error", err)
	}
}

// failingSource reads the runs ok times, then fails.
type failingSource struct{ ok int }

func (f *failingSource) DevRunsByInterface() (map[uint64]probe.DevRuns, error) {
	if f.ok == 0 {
		return nil, errors.New("map gone")
	}
	f.ok--
	return map[uint64]probe.DevRuns{}, nil
}

func (f *failingSource) DevAttached() (bool, bool, bool, uint64) { return true, true, true, 0 }

// stillSource reports the same runs until told otherwise.
type stillSource struct {
	mu       sync.Mutex
	runs     map[uint64]probe.DevRuns
	attaches uint64
}

func (s *stillSource) DevRunsByInterface() (map[uint64]probe.DevRuns, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.runs), nil
}

func (s *stillSource) DevAttached() (bool, bool, bool, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return true, true, true, s.attaches
}

func (s *stillSource) set(r probe.DevRuns, attaches uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// No qdisc: net_dev_queue runs for each frame sent, as does xmit.
	r.Queue, r.QueueDirect = r.Xmit, r.Xmit
	s.runs, s.attaches = map[uint64]probe.DevRuns{key(2): r}, attaches
}

// TestCheckLaterQuiet: while the runs and the programs attached stay the
// same, CheckLater reads no interface counters and the last report stays,
// for up to QuietFor; runs that move, an attach, or QuietFor passed make
// it check again, and that check sees what changed.
func TestCheckLaterQuiet(t *testing.T) {
	src := &stillSource{}
	src.set(probe.DevRuns{Xmit: 4}, 0)
	tx := uint64(4)
	reads := 0
	c := NewChecker(src, map[uint32]string{ns: "/x"})
	c.linksIn = plainLinks(func(string) (map[uint32]Link, error) {
		reads++ // only the checks' goroutines read, one at a time
		return map[uint32]Link{2: veth(tx, 0, 0)}, nil
	})
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	c.checked = make(chan struct{}, 1)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	reads = 0
	checkLater := func() (checked bool) {
		c.CheckLater()
		select {
		case <-c.checked:
			return true
		default:
		}
		c.mu.Lock()
		busy := c.checking
		c.mu.Unlock()
		if busy {
			<-c.checked
			return true
		}
		return false
	}
	// The first makes a report; the namespace is the start's, unread.
	if !checkLater() {
		t.Fatal("first CheckLater made no check")
	}
	if n := reads; n != 0 {
		t.Fatalf("first check read the counters %d times, want none (runs as at the start)", n)
	}
	now = now.Add(QuietFor - time.Second)
	if checkLater() {
		t.Error("runs unchanged: checked again")
	}
	// Frames with runs: checked at once, and the report shows them.
	src.set(probe.DevRuns{Xmit: 10}, 0)
	tx = 11 // one frame the kernel ran no program for
	if !checkLater() {
		t.Fatal("runs moved: no check")
	}
	// 7 frames sent, 6 runs, at dev_xmit and at dev_queue.
	if reads != 1 {
		t.Errorf("counters read %d times, want once", reads)
	}
	if rep, _ := c.Latest(); rep.Skipped != 2 {
		t.Errorf("after the frames: skipped %d, want 1 at each of dev_xmit and dev_queue", rep.Skipped)
	}
	if checkLater() {
		t.Error("runs unchanged since the last check: checked again")
	}
	// Frames with no run at all: seen once QuietFor has passed.
	tx = 13
	now = now.Add(QuietFor)
	if !checkLater() {
		t.Fatal("QuietFor passed: no check")
	}
	if rep, _ := c.Latest(); rep.Skipped != 6 {
		t.Errorf("after QuietFor: skipped %d, want 3 at each of dev_xmit and dev_queue", rep.Skipped)
	}
	// A program attached or detached: checked.
	src.set(probe.DevRuns{Xmit: 10}, 1)
	if !checkLater() {
		t.Error("attaches changed: no check")
	}
}

// TestCheckLaterQuietNamespace: a background check reads only the
// namespaces whose runs moved; the others' interfaces are taken over
// from the last snapshot, and the report still covers them.
func TestCheckLaterQuietNamespace(t *testing.T) {
	const ns2 = ns + 1
	k2 := uint64(ns2)<<32 | 3
	src := &stillSource{}
	src.mu.Lock()
	src.runs = map[uint64]probe.DevRuns{key(2): {Recv: 4}, k2: {Recv: 7}}
	src.mu.Unlock()
	reads := map[string]int{}
	rx := map[string]uint64{"/a": 4, "/b": 7}
	c := NewChecker(src, map[uint32]string{ns: "/a", ns2: "/b"})
	c.linksIn = plainLinks(func(path string) (map[uint32]Link, error) {
		reads[path]++
		idx := map[string]uint32{"/a": 2, "/b": 3}[path]
		return map[uint32]Link{idx: veth(0, 0, rx[path])}, nil
	})
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	c.checked = make(chan struct{}, 1)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	clear(reads)
	// Frames into /b only, one of them with no run.
	src.mu.Lock()
	src.runs = map[uint64]probe.DevRuns{key(2): {Recv: 4}, k2: {Recv: 9}}
	src.mu.Unlock()
	rx["/b"] = 10
	c.CheckLater()
	<-c.checked
	if reads["/a"] != 0 || reads["/b"] != 1 {
		t.Errorf("counters read %v, want /b only", reads)
	}
	rep, _ := c.Latest()
	if rep.Skipped != 1 || rep.Checked() != 6 {
		t.Errorf("report: skipped %d over %d directions, want 1 over 6 (three of each veth)", rep.Skipped, rep.Checked())
	}
	// The final Check reads every namespace.
	clear(reads)
	if _, err := c.Check(); err != nil {
		t.Fatal(err)
	}
	if reads["/a"] != 1 || reads["/b"] != 1 {
		t.Errorf("Check read %v, want every namespace once", reads)
	}
}

// TestCheckLaterBusyLoopback: runs that move on an interface that is not
// compared (lo: NotVeth) do not make its namespace read again.
func TestCheckLaterBusyLoopback(t *testing.T) {
	src := &stillSource{}
	src.mu.Lock()
	src.runs = map[uint64]probe.DevRuns{key(1): {Xmit: 10, Recv: 10}, key(2): {Recv: 4}}
	src.mu.Unlock()
	reads := 0
	c := NewChecker(src, map[uint32]string{ns: "/a"})
	c.linksIn = plainLinks(func(string) (map[uint32]Link, error) {
		reads++
		return map[uint32]Link{1: {Name: "lo", TxPackets: 10, RxPackets: 10}, 2: veth(0, 0, 4)}, nil
	})
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	c.checked = make(chan struct{}, 1)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	reads = 0
	src.mu.Lock()
	src.runs = map[uint64]probe.DevRuns{key(1): {Xmit: 99, Recv: 99}, key(2): {Recv: 4}}
	src.mu.Unlock()
	c.CheckLater() // the runs moved (lo's): a check, which reads nothing
	<-c.checked
	if reads != 0 {
		t.Errorf("counters read %d times for lo's runs, want none", reads)
	}
	if rep, ok := c.Latest(); !ok || rep.Checked() != 3 {
		t.Errorf("report %+v, want the veth's three directions compared", rep)
	}
}
