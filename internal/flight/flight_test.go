// SPDX-License-Identifier: Apache-2.0

package flight

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/trace"
)

func TestParseTriggers(t *testing.T) {
	tr, err := ParseTriggers("retrans, drop,rtt>50ms")
	if err != nil || !tr.Retrans || !tr.Drop || tr.RTT != 50*time.Millisecond {
		t.Fatalf("ParseTriggers = %+v, %v", tr, err)
	}
	if tr.String() != "retrans,drop,rtt>50ms" {
		t.Errorf("String = %q", tr.String())
	}
	if g := tr.Groups(); g != event.GroupTCP|event.GroupDrop|event.GroupTCPState {
		t.Errorf("Groups = %s", g)
	}
	if tr, err := ParseTriggers(""); err != nil || tr != (Triggers{}) {
		t.Errorf("empty: %+v, %v", tr, err)
	}
	for bad, want := range map[string]string{
		"loss":       `unknown trigger "loss"`,
		"rtt>fast":   "rtt>DURATION",
		"rtt>-5ms":   "rtt>DURATION",
		"retrans,rt": `unknown trigger "rt"`,
	} {
		if _, err := ParseTriggers(bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", bad, err, want)
		}
	}
}

func header(t *testing.T) *trace.Header {
	t.Helper()
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		t.Fatal(err)
	}
	return &trace.Header{Format: trace.FormatName, Version: trace.Version, Common: trace.CommonFields, Types: types,
		Enums: map[string]map[string]string{"drop_reason": {"5": "TCP_OLD_DATA", "6": "QDISC_DROP"}}}
}

// record makes a record of type typ at time ts on connection conn.
func record(h *trace.Header, typ event.Type, ts, conn uint64) []byte {
	et := h.TypeByID(uint8(typ))
	b := make([]byte, et.Size)
	binary.NativeEndian.PutUint64(b[0:], ts)
	binary.NativeEndian.PutUint64(b[8:], conn)
	b[30] = uint8(typ)
	return b
}

func readFile(t *testing.T, path string) (map[string]int, []trace.Record, Result) {
	t.Helper()
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	counts := map[string]int{}
	var recs []trace.Record
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		counts[rec.Type.Name]++
		recs = append(recs, rec)
	}
	var res Result
	b, _ := json.Marshal(r.Summary().Extra[ExtraKey])
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	return counts, recs, res
}

// TestWindowAndState: a retransmission writes the window before it, after
// the state announced before the window (carried) and not what the window
// has itself; a second trigger within After extends the same file; nothing
// before a trigger is written.
func TestWindowAndState(t *testing.T) {
	h := header(t)
	dir := t.TempDir()
	now := time.Date(2026, 11, 29, 1, 2, 3, 0, time.UTC)
	s, err := New(h, Options{Output: filepath.Join(dir, "x.mgt"), Window: 2 * time.Second, After: time.Second,
		Triggers: Triggers{Retrans: true}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	const sec = uint64(time.Second)
	w := func(typ event.Type, ts, conn uint64) {
		t.Helper()
		if err := s.Write(record(h, typ, ts, conn)); err != nil {
			t.Fatal(err)
		}
	}
	w(event.ConnOpen, 1*sec, 7)
	w(event.ConnOpen, 2*sec, 8)
	w(event.ConnClose, 3*sec, 8) // closed before the window: not carried
	for ts := 1 * sec; ts < 10*sec; ts += sec / 100 {
		w(event.SockSend, ts, 7)
	}
	if len(s.Files()) != 0 {
		t.Fatal("a file before any trigger")
	}
	w(event.ConnOpen, 9*sec, 9) // in the window: not carried, written
	w(event.TCPRetrans, 10*sec, 7)
	for ts := 10 * sec; ts < 12*sec; ts += sec / 100 {
		w(event.SockSend, ts, 7)
	}
	w(event.TCPRetrans, 10*sec+sec/2, 7) // late, within the file: extends it
	if err := s.Close(nil); err != nil {
		t.Fatal(err)
	}
	files := s.Files()
	if len(files) != 1 || filepath.Base(files[0]) != "x-20261129T010203.000Z.mgt" {
		t.Fatalf("files %v", files)
	}
	counts, recs, res := readFile(t, files[0])
	if res.AskedFromNs != 8*sec || res.FromNs != 8*sec || res.ToNs != 11*sec+sec/2 || res.Fired["retrans"] != 2 || res.Carried != 1 {
		t.Errorf("result %+v", res)
	}
	// sock_send at 8.00 .. 11.99 s: 400 (the file was open when those past
	// its end came), conn 7 carried, conn 9 in the window.
	if counts["sock_send"] != 400 || counts["tcp_retrans"] != 2 || counts["conn_open"] != 2 || counts["conn_close"] != 0 {
		t.Errorf("counts %v", counts)
	}
	if recs[0].Type.Name != "conn_open" || recs[0].Conn() != 7 || recs[0].Flags()&trace.FlagCarried == 0 {
		t.Errorf("first record %s conn %d flags %x, want conn 7's conn_open carried", recs[0].Type.Name, recs[0].Conn(), recs[0].Flags())
	}
}

// TestMemoryBound: past Memory the oldest chunks go even inside the
// window, and the file says how many records that took and where its
// window starts instead.
func TestMemoryBound(t *testing.T) {
	h := header(t)
	dir := t.TempDir()
	s, err := New(h, Options{Output: filepath.Join(dir, "x.mgt"), Window: time.Hour, Memory: 4 * chunkBytes})
	if err != nil {
		t.Fatal(err)
	}
	rec := record(h, event.SockSend, 0, 7)
	n := 6 * chunkBytes / len(rec)
	// Times of the last minute: Trigger's time is now.
	base := monotonic() - uint64(time.Minute)
	for i := 0; i < n; i++ {
		binary.NativeEndian.PutUint64(rec, base+uint64(i))
		if err := s.Write(rec); err != nil {
			t.Fatal(err)
		}
	}
	s.Trigger("api")
	if err := s.Close(nil); err != nil {
		t.Fatal(err)
	}
	if len(s.Files()) != 1 {
		t.Fatalf("files %v", s.Files())
	}
	counts, _, res := readFile(t, s.Files()[0])
	if res.EvictedRecords == 0 || uint64(counts["sock_send"])+res.EvictedRecords != uint64(n) {
		t.Errorf("%d in the file + %d evicted, %d written", counts["sock_send"], res.EvictedRecords, n)
	}
	if res.FromNs != res.EvictedToNs+1 || res.Fired["api"] != 1 {
		t.Errorf("result %+v", res)
	}
}

// TestArenaReused: the records of a long recording are kept in the slots
// of the one arena New made, reused in place: no chunk is ever allocated
// after it (an allocation would be a first touch, a page fault, in the
// middle of a recording), whether chunks leave the window or the memory
// bound pushes them out.
func TestArenaReused(t *testing.T) {
	h := header(t)
	for _, window := range []time.Duration{time.Second, time.Hour} {
		s, err := New(h, Options{Output: filepath.Join(t.TempDir(), "x.mgt"), Window: window, Memory: 5*chunkBytes + 12345})
		if err != nil {
			t.Fatal(err)
		}
		if len(s.arena) != 5*chunkBytes || len(s.free) != 5 {
			t.Fatalf("arena of %d bytes in %d slots, want 5 chunks", len(s.arena), len(s.free))
		}
		arena := &s.arena[0]
		rec := record(h, event.SockSend, 0, 7)
		n := 40 * chunkBytes / len(rec)
		ts := uint64(0)
		// AllocsPerRun runs it twice: 80 chunks of records 1 ms apart.
		allocs := testing.AllocsPerRun(1, func() {
			for i := 0; i < n; i++ {
				ts += uint64(time.Millisecond)
				binary.NativeEndian.PutUint64(rec, ts)
				if err := s.Write(rec); err != nil {
					t.Fatal(err)
				}
			}
		})
		// The marks of chunks evicted for memory are the only allocation.
		if allocs > 8 {
			t.Errorf("window %s: %.0f allocations for %d records", window, allocs, n)
		}
		if len(s.chunks)+len(s.free) != 5 {
			t.Errorf("window %s: %d chunks + %d free slots, want 5", window, len(s.chunks), len(s.free))
		}
		lo := uintptr(unsafe.Pointer(arena))
		for _, c := range s.chunks {
			if p := uintptr(unsafe.Pointer(unsafe.SliceData(c.buf))); p < lo || p >= lo+uintptr(len(s.arena)) || cap(c.buf) != chunkBytes {
				t.Fatalf("window %s: a chunk outside the arena", window)
			}
		}
		// A short window gives slots back as chunks leave it; an hour
		// long one only when memory is over its bound.
		if window == time.Hour && len(s.evicted) == 0 {
			t.Errorf("window %s: nothing evicted for memory", window)
		}
		if window == time.Second && len(s.evicted) != 0 {
			t.Errorf("window %s: %d chunks evicted for memory, all left the window first", window, len(s.evicted))
		}
		if err := s.Close(nil); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRoomAppend: records copied into lent room are kept like written ones.
func TestRoomAppend(t *testing.T) {
	h := header(t)
	s, err := New(h, Options{Output: filepath.Join(t.TempDir(), "x.mgt"), Window: time.Hour, Triggers: Triggers{Drop: true}})
	if err != nil {
		t.Fatal(err)
	}
	room, err := s.Room(4096)
	if err != nil {
		t.Fatal(err)
	}
	var tally trace.Tally
	for i := 0; i < 10; i++ {
		r := record(h, event.SockSend, uint64(1e9+i), 7)
		room = append(room, r...)
		tally.Add(r[30], uint64(1e9+i))
	}
	// A duplicate freed (TCP_OLD_DATA) loses nothing: no trigger; a
	// qdisc drop does.
	reason, _ := h.TypeByID(uint8(event.Drop)).Field("reason")
	dup := record(h, event.Drop, 2e9-1, 7)
	binary.NativeEndian.PutUint32(dup[reason.Offset:], 5)
	room = append(room, dup...)
	tally.Add(dup[30], 2e9-1)
	drop := record(h, event.Drop, 2e9, 7)
	binary.NativeEndian.PutUint32(drop[reason.Offset:], 6)
	room = append(room, drop...)
	tally.Add(drop[30], 2e9)
	if err := s.AppendTallied(room, &tally); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendTallied(make([]byte, len(drop)), &tally); err == nil {
		t.Error("records outside the lent room were taken")
	}
	if err := s.Close(nil); err != nil {
		t.Fatal(err)
	}
	if len(s.Files()) != 1 {
		t.Fatalf("files %v", s.Files())
	}
	counts, _, res := readFile(t, s.Files()[0])
	if counts["sock_send"] != 10 || counts["drop"] != 2 || res.Triggers[0].Reason != "drop" || res.Triggers[0].TimeNs != 2e9 || res.Fired["drop"] != 1 {
		t.Errorf("counts %v, result %+v", counts, res)
	}
}

// FuzzParseTriggers: any --trigger value parses or fails with an error,
// never a panic, and what parses prints back to the same triggers.
func FuzzParseTriggers(f *testing.F) {
	for _, s := range []string{"retrans", "drop,rtt>50ms", "rtt>1h2m", " retrans , drop ", "rtt>", "rtt>0s", ",,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tr, err := ParseTriggers(s)
		if err != nil {
			return
		}
		back, err := ParseTriggers(tr.String())
		if err != nil || back != tr {
			t.Fatalf("%q: %+v prints as %q, which parses to %+v, %v", s, tr, tr.String(), back, err)
		}
	})
}
