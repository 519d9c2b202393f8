// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/filter"
	"github.com/magnet-tracer/magnet/internal/live"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// hubRig drives a hub without its goroutine: each feed is one hand-over
// of the recorder (records in drain order, and the time up to which it
// wrote every record), and root and user (uid 1000) are two
// subscriptions to every event whose queues the test reads.
type hubRig struct {
	t          *testing.T
	h          *hub
	f          *fakeRecorder
	root, user *sub
}

const rigUID = 1000

func newHubRig(t *testing.T) *hubRig {
	hdr := testHeader(t)
	r := &hubRig{t: t, f: &fakeRecorder{hdr: hdr}, h: newHub(live.NewTable(live.DefaultConfig))}
	r.h.enabled.Store(uint32(event.DefaultGroups | event.GroupSched))
	if _, err := r.h.newSink(hdr); err != nil {
		t.Fatal(err)
	}
	newSub := func(who identity) *sub {
		flt, err := filter.Parse(magnetclient.Filter{}, filter.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return &sub{kind: kindEvents, who: who, f: flt, q: make(chan item, 1<<12)}
	}
	r.root, r.user = newSub(identity{seesAll: true}), newSub(identity{uid: rigUID})
	r.h.subs.Store(newSubSet(map[uint64]*sub{1: r.root, 2: r.user}))
	return r
}

// feed hands the hub one batch, complete up to completeNs.
func (r *hubRig) feed(completeNs uint64, recs ...[]byte) {
	b := &batch{completeNs: completeNs, handed: true}
	for _, rec := range recs {
		b.buf = append(b.buf, rec...)
	}
	r.h.add(b)
	r.h.release(completeNs - reorderSlack)
}

// rec makes one event record at ms milliseconds.
func (r *hubRig) rec(name string, ms float64, conn uint64, tid uint32) []byte {
	return r.f.rec(r.t, name, uint64(ms*float64(time.Millisecond)), conn, tid, 100, nil)
}

func (r *hubRig) task(tid, pid, uid uint32, comm string, ms float64) []byte {
	return r.f.rec(r.t, "task", uint64(ms*float64(time.Millisecond)), 0, tid, 0, map[string]any{"pid": int(pid), "uid": int(uid), "comm": comm})
}

// open is a TCP connection's conn_open at ms; tid 0 for one first seen in
// softirq (an accepted connection), whose owner is not known yet.
func (r *hubRig) open(conn uint64, tid uint32, ms float64) []byte {
	return r.f.rec(r.t, "conn_open", uint64(ms*float64(time.Millisecond)), conn, tid, 0, map[string]any{
		"proto": 6, "family": 4, "state": 1, "lport": 5000 + int(conn), "rport": 40000, "laddr": netip.MustParseAddr("10.0.0.2"), "raddr": netip.MustParseAddr("10.0.0.1"),
	})
}

// got empties a subscription's queue: "type@ms/conn" for each event,
// "+pid" when its task is shown, "~uid" for its connection's owner.
func got(s *sub) []string {
	var out []string
	for {
		select {
		case it := <-s.q:
			if it.ev == nil {
				continue
			}
			fe := it.ev.fe
			e := fmt.Sprintf("%s@%g/%d", fe.Name, float64(fe.TimeNs)/float64(time.Millisecond), fe.Conn)
			if fe.HasOwner {
				e += fmt.Sprintf("~%d", fe.OwnerUID)
			}
			out = append(out, e)
		default:
			return out
		}
	}
}

func (r *hubRig) want(who string, s *sub, want ...string) {
	r.t.Helper()
	if g := got(s); !slices.Equal(g, want) {
		r.t.Errorf("%s got\n  %s\nwant\n  %s", who, strings.Join(g, " "), strings.Join(want, " "))
	}
}

// TestHubTimeOrder: the recorder's drain order (control ring first) is
// put in time order, and records wait until the recorder wrote every
// older one.
func TestHubTimeOrder(t *testing.T) {
	r := newHubRig(t)
	ms := uint64(time.Millisecond)
	// The drain order of TestUnprivilegedUser's defect: conn_open and
	// conn_close from the control ring, then the sends from an events
	// ring; the pass wrote everything up to 30 ms, the close came later.
	r.feed(30*ms+reorderSlack,
		r.task(7, 7, rigUID, "client", 1), r.open(1, 7, 1), r.rec("conn_close", 35, 1, 0),
		r.rec("sock_send", 10, 1, 7), r.rec("sock_send", 20, 1, 7))
	r.want("root", r.root, "conn_open@1/1~1000", "sock_send@10/1~1000", "sock_send@20/1~1000")
	r.want("the user", r.user, "conn_open@1/1~1000", "sock_send@10/1~1000", "sock_send@20/1~1000")
	// The next pass brings a send older than the close.
	r.feed(100*ms+reorderSlack, r.rec("sock_send", 32, 1, 7))
	r.want("root", r.root, "sock_send@32/1~1000", "conn_close@35/1~1000")
	r.want("the user", r.user, "sock_send@32/1~1000", "conn_close@35/1~1000")
	if r.h.order.late != 0 || r.h.order.len() != 0 || len(r.h.held) != 0 {
		t.Errorf("late %d, kept back %d, held %d", r.h.order.late, r.h.order.len(), len(r.h.held))
	}
}

// TestHubLateRecord: a record older than what went out already (its
// program was preempted between reserving and committing it) is not lost:
// it goes out at once, counted late.
func TestHubLateRecord(t *testing.T) {
	r := newHubRig(t)
	ms := uint64(time.Millisecond)
	r.feed(50*ms+reorderSlack, r.task(7, 7, rigUID, "client", 1), r.open(1, 7, 1), r.rec("sock_send", 40, 1, 7))
	r.feed(60*ms+reorderSlack, r.rec("sock_send", 30, 1, 7))
	r.want("root", r.root, "conn_open@1/1~1000", "sock_send@40/1~1000", "sock_send@30/1~1000")
	if r.h.order.late != 1 {
		t.Errorf("late %d, want 1", r.h.order.late)
	}
}

// TestHubEventBeforeOpen: an event of a connection timed before its
// conn_open (tcp_xmit timed by TCP's clock at the device) waits for the
// conn_open, which the hub needs first.
func TestHubEventBeforeOpen(t *testing.T) {
	r := newHubRig(t)
	ms := uint64(time.Millisecond)
	r.feed(50*ms+reorderSlack, r.task(7, 7, rigUID, "client", 2), r.open(1, 7, 2), r.rec("tcp_xmit", 1.5, 1, 7), r.rec("sock_send", 3, 1, 7))
	r.want("root", r.root, "conn_open@2/1~1000", "tcp_xmit@1.5/1~1000", "sock_send@3/1~1000")
	if c := r.h.table.Get(1); c == nil || !c.Opened {
		t.Errorf("connection 1 not opened: %+v", c)
	}
}

// TestHubNewThreadNamed: the recorder names a thread before the first of
// its events it writes, which may be younger than others of the thread
// still in their ring: those are named too.
func TestHubNewThreadNamed(t *testing.T) {
	r := newHubRig(t)
	ms := uint64(time.Millisecond)
	r.feed(50*ms+reorderSlack,
		r.task(7, 7, rigUID, "client", 1), r.open(1, 7, 1),
		// The control ring's conn_close named thread 8 (new) at 30 ms ...
		r.task(8, 7, rigUID, "worker", 30), r.rec("conn_close", 30, 1, 8),
		// ... whose send of 20 ms was in an events ring.
		r.rec("sock_send", 20, 1, 8))
	var pids []uint32
	for _, it := range drainQueue(r.root) {
		pids = append(pids, it.fe.PID)
	}
	if !slices.Equal(pids, []uint32{7, 7, 7}) {
		t.Errorf("pids %v, want the thread's process 7 on each event", pids)
	}
}

func drainQueue(s *sub) []*liveEvent {
	var out []*liveEvent
	for {
		select {
		case it := <-s.q:
			if it.ev != nil {
				out = append(out, it.ev)
			}
		default:
			return out
		}
	}
}

// TestHubHoldsUntilOwner: an accepted connection has no owner until the
// server's first socket call; the user gets its first events once it is
// known, with the events of its other connections in time order, and
// root gets everything at once.
func TestHubHoldsUntilOwner(t *testing.T) {
	r := newHubRig(t)
	ms := uint64(time.Millisecond)
	r.feed(100*ms+reorderSlack,
		r.task(7, 7, rigUID, "client", 1), r.open(1, 7, 1), // the user's client: owner from conn_open
		r.open(2, 0, 2), r.rec("tcp_rcv", 3, 2, 0), // the user's server's end, in softirq
		r.rec("sock_send", 4, 1, 7),
	)
	r.want("root", r.root, "conn_open@1/1~1000", "conn_open@2/2", "tcp_rcv@3/2", "sock_send@4/1~1000")
	// Held: connection 2's owner is not known, and sock_send@4 is younger.
	r.want("the user", r.user, "conn_open@1/1~1000")
	r.feed(200*ms+reorderSlack, r.task(9, 9, rigUID, "server", 150), r.rec("sock_recv", 150, 2, 9), r.rec("sock_send", 160, 1, 7))
	r.want("root", r.root, "sock_recv@150/2~1000", "sock_send@160/1~1000")
	r.want("the user", r.user, "conn_open@2/2~1000", "tcp_rcv@3/2~1000", "sock_send@4/1~1000", "sock_recv@150/2~1000", "sock_send@160/1~1000")
	if len(r.h.held) != 0 {
		t.Errorf("%d events still held", len(r.h.held))
	}
}

// TestHubHoldExpires: a connection whose owner is not known holdFor after
// its conn_open is nobody's for clients that do not see all: its events
// held so far go to no one (another user's server reading late gets them
// neither), and the user's own events were held at most that long.
func TestHubHoldExpires(t *testing.T) {
	r := newHubRig(t)
	ms := uint64(time.Millisecond)
	hold := float64(holdFor / ms)
	r.feed(10*ms+reorderSlack, r.task(7, 7, rigUID, "client", 1), r.open(1, 7, 1), r.open(2, 0, 2), r.rec("tcp_rcv", 3, 2, 0), r.rec("sock_send", 4, 1, 7))
	r.want("the user", r.user, "conn_open@1/1~1000")
	// Nothing for a while but the recorder's passes.
	r.feed(uint64(hold)*ms + reorderSlack)
	r.want("the user", r.user)
	r.feed(uint64(hold+2)*ms + reorderSlack)
	r.want("the user", r.user, "sock_send@4/1~1000")
	// Root's server reads, late: connection 2 is root's.
	r.feed(uint64(hold+100)*ms+reorderSlack, r.task(9, 9, 0, "rootd", hold+50), r.rec("sock_recv", hold+50, 2, 9), r.rec("sock_send", hold+60, 1, 7))
	r.want("the user", r.user, fmt.Sprintf("sock_send@%g/1~1000", hold+60))
	r.want("root", r.root, "conn_open@1/1~1000", "conn_open@2/2", "tcp_rcv@3/2", "sock_send@4/1~1000",
		fmt.Sprintf("sock_recv@%g/2~0", hold+50), fmt.Sprintf("sock_send@%g/1~1000", hold+60))
}

// TestHubHoldNeverLeaks: while events are held, another user's are never
// offered to the user, whatever their order.
func TestHubHoldNeverLeaks(t *testing.T) {
	r := newHubRig(t)
	ms := uint64(time.Millisecond)
	r.feed(50*ms+reorderSlack,
		r.task(7, 7, rigUID, "client", 1), r.task(8, 8, 0, "rootc", 1),
		r.open(1, 0, 1), r.open(2, 8, 2), // the user's accepted one; root's client
		r.rec("tcp_rcv", 3, 1, 8), r.rec("sock_send", 4, 2, 8), r.rec("sock_recv", 5, 1, 7), r.rec("sock_send", 6, 2, 8))
	r.want("the user", r.user, "conn_open@1/1~1000", "tcp_rcv@3/1~1000", "sock_recv@5/1~1000")
	if len(r.h.held) != 0 {
		t.Errorf("%d events still held", len(r.h.held))
	}
}

// TestHubHeldBound: the held events are bounded; past the bound the
// oldest go on (to their owner if known by then, else to no one).
func TestHubHeldBound(t *testing.T) {
	r := newHubRig(t)
	r.user.q = make(chan item, maxHeld+16)
	recs := [][]byte{r.task(7, 7, rigUID, "client", 0.001), r.open(1, 7, 0.001), r.open(2, 0, 0.002)}
	for i := range maxHeld + 10 {
		recs = append(recs, r.f.rec(t, "sock_send", uint64(3000+i), 1, 7, 1, nil))
	}
	r.feed(uint64(time.Millisecond)+reorderSlack, recs...)
	if n := len(r.h.held); n > maxHeld {
		t.Errorf("%d events held, bound %d", n, maxHeld)
	}
	// The one forced out first is connection 2's conn_open (nobody's): the
	// user got its own sends in order, and never connection 2.
	evs := drainQueue(r.user)
	for i, ev := range evs {
		if ev.fe.Conn != 1 || i > 0 && ev.fe.TimeNs < evs[i-1].fe.TimeNs {
			t.Fatalf("event %d: %s of %d at %d", i, ev.fe.Name, ev.fe.Conn, ev.fe.TimeNs)
		}
	}
	if len(evs) < 10 {
		t.Errorf("the user got %d events: the bound forced none out", len(evs))
	}
}

// FuzzHubBatch: whatever bytes a batch holds, the hub neither panics nor
// keeps anything back once the recording ends.
func FuzzHubBatch(f *testing.F) {
	hdr := testHeader(f)
	fr := &fakeRecorder{hdr: hdr}
	var seed []byte
	for _, rec := range fr.connOpen(f, 1, 7, 7, 0, "c", "10.0.0.1:1", "10.0.0.2:2", 5) {
		seed = append(seed, rec...)
	}
	seed = append(seed, fr.rec(f, "sock_send", 3, 1, 7, 10, nil)...)
	f.Add(seed, uint64(4))
	f.Fuzz(func(t *testing.T, data []byte, complete uint64) {
		h := newHub(live.NewTable(live.DefaultConfig))
		h.enabled.Store(^uint32(0))
		if _, err := h.newSink(hdr); err != nil {
			t.Fatal(err)
		}
		flt, _ := filter.Parse(magnetclient.Filter{}, filter.Options{})
		h.subs.Store(newSubSet(map[uint64]*sub{1: {kind: kindEvents, who: identity{uid: 5}, f: flt, q: make(chan item, 1<<10)}}))
		// Valid types only, so that the hub's complaint about the rest
		// does not flood the output.
		for i := 0; i+32 <= len(data); {
			et := hdr.TypeByID(data[i+30])
			if et == nil {
				data[i+30] = uint8(event.SockSend)
				et = hdr.TypeByID(data[i+30])
			}
			i += et.Size
		}
		b := &batch{buf: data, completeNs: complete, handed: true}
		h.add(b)
		h.release(complete)
		h.release(^uint64(0))
		h.releaseHeld(^uint64(0), false)
		if h.order.len() != 0 || len(h.held) != 0 {
			t.Errorf("kept back %d, held %d after the end", h.order.len(), len(h.held))
		}
	})
}

// TestReorderPush: records come out in time order, ties in arrival order,
// whether they are a few places out (the walk back) or far (the search),
// and across releases that leave some kept (the control records ahead).
func TestReorderPush(t *testing.T) {
	var q reorder
	rng := rand.New(rand.NewPCG(1, 2))
	type key struct{ time, arrival uint64 }
	var out []key
	var arrival uint64
	for round := range 50 {
		for i := range 400 {
			tm := uint64(round*1000 + i)
			switch rng.IntN(10) {
			case 0:
				tm += 900 // a control record, ahead of the ring's
			case 1:
				tm -= uint64(rng.IntN(min(int(tm)+1, 300))) // far back
			case 2:
				tm = uint64(round * 1000) // ties
			}
			arrival++
			q.push(pending{time: tm, data: binary.NativeEndian.AppendUint64(nil, arrival)})
		}
		upTo := uint64(round*1000 + 500)
		for q.head < len(q.recs) && q.recs[q.head].time <= upTo {
			p := q.recs[q.head]
			q.head++
			out = append(out, key{p.time, binary.NativeEndian.Uint64(p.data)})
		}
	}
	for q.head < len(q.recs) {
		p := q.recs[q.head]
		q.head++
		out = append(out, key{p.time, binary.NativeEndian.Uint64(p.data)})
	}
	if len(out) != int(arrival) {
		t.Fatalf("%d records out of %d", len(out), arrival)
	}
	// No record is older than a release made before it came (the far
	// ones go back at most 300, the releases lag 500 behind the round),
	// so the whole output is in order.
	for i := 1; i < len(out); i++ {
		a, b := out[i-1], out[i]
		if b.time < a.time || b.time == a.time && b.arrival < a.arrival {
			t.Fatalf("record %d (time %d, arrival %d) after (time %d, arrival %d)", i, b.time, b.arrival, a.time, a.arrival)
		}
	}
}

// TestHubKeptBatchesBound: records timed far ahead (no bug should make
// them) keep their batches back at most maxKeptBatches at a time; every
// other record goes on in time.
func TestHubKeptBatchesBound(t *testing.T) {
	r := newHubRig(t)
	ms := uint64(time.Millisecond)
	r.feed(ms+reorderSlack, r.task(7, 7, rigUID, "client", 1), r.open(1, 7, 1))
	got(r.root)
	for i := range 3 * maxKeptBatches {
		at := float64(2 + i)
		r.feed(uint64(at)*ms+reorderSlack, r.rec("sock_send", at, 1, 7), r.rec("sock_send", 1e9+at, 1, 7))
		if r.h.keptBatches > maxKeptBatches {
			t.Fatalf("%d batches kept, bound %d", r.h.keptBatches, maxKeptBatches)
		}
	}
	n := 0
	for _, ev := range drainQueue(r.root) {
		if ev.fe.TimeNs < 1e9*ms {
			n++
		}
	}
	if n != 3*maxKeptBatches {
		t.Errorf("%d sends in time went on, want %d", n, 3*maxKeptBatches)
	}
}
