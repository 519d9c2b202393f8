// SPDX-License-Identifier: Apache-2.0

package record

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"math"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/ring"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// The tests here drive the recorder's drain loop over in-memory rings laid
// out as the kernel's, with records as BPF writes them; no root needed.

type memRecorder struct {
	*recorder
	events  *ring.Memory // CPU 0's events ring
	cpus    []*ring.Memory
	control *ring.Memory
	out     *bytes.Buffer
}

// newMemRecorder makes a recorder of cpus events rings of ringSize bytes.
func newMemRecorder(t testing.TB, out io.Writer, cpus, ringSize int) *memRecorder {
	t.Helper()
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		t.Fatal(err)
	}
	hdr := &trace.Header{Common: trace.CommonFields, Types: types}
	w, err := trace.NewWriter(out, hdr, trace.WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := &memRecorder{recorder: newRecorder(Config{}, w, hdr), control: ring.NewMemory(4096)}
	for i := 0; i < cpus; i++ {
		mem := ring.NewMemory(ringSize)
		m.cpus = append(m.cpus, mem)
		m.recorder.events = append(m.recorder.events, mem.Reader())
	}
	m.events = m.cpus[0]
	m.recorder.control = m.control.Reader()
	if b, ok := out.(*bytes.Buffer); ok {
		m.out = b
	}
	return m
}

// ringRecord is a record as BPF puts it in a ring: the event (size bytes,
// the common header filled in), then struct mg_task if task is not nil.
func ringRecord(typ event.Type, size int, timeNs uint64, tid uint32, task *taskKey) []byte {
	b := make([]byte, size, size+probe.TaskSuffixSize)
	binary.NativeEndian.PutUint64(b[0:], timeNs)
	binary.NativeEndian.PutUint64(b[8:], 77) // conn
	binary.NativeEndian.PutUint32(b[16:], tid)
	binary.NativeEndian.PutUint32(b[20:], 100) // size
	binary.NativeEndian.PutUint32(b[24:], 4026531840)
	binary.NativeEndian.PutUint16(b[28:], 1) // cpu
	b[30] = uint8(typ)
	if task != nil {
		var t [24]byte
		binary.NativeEndian.PutUint32(t[0:], task.pid)
		binary.NativeEndian.PutUint32(t[4:], task.uid)
		copy(t[8:], task.comm[:])
		b = append(b, t[:]...)
	}
	return b
}

func task(pid uint32, comm string) *taskKey {
	k := &taskKey{pid: pid}
	copy(k.comm[:], comm)
	return k
}

func (m *memRecorder) closeAndRead(t *testing.T) []trace.Record {
	t.Helper()
	if err := m.w.Close(nil); err != nil {
		t.Fatal(err)
	}
	rd, err := trace.NewReader(bytes.NewReader(m.out.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	var out []trace.Record
	for {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		rec.Data = bytes.Clone(rec.Data)
		out = append(out, rec)
	}
}

// TestTaskRecords checks that a task record precedes an event exactly when
// the event's thread is new to the trace or has a new pid, uid or name, however
// often BPF repeats struct mg_task (once per CPU); alike when the drain
// copies the records into the trace's blocks itself and when it takes
// them one by one.
func TestTaskRecords(t *testing.T) {
	t.Run("copied", func(t *testing.T) { testTaskRecords(t, true) })
	t.Run("one by one", func(t *testing.T) { testTaskRecords(t, false) })
}

func testTaskRecords(t *testing.T, copied bool) {
	m := newMemRecorder(t, &bytes.Buffer{}, 1, 1<<16)
	if !copied {
		m.recorder.w = oneByOne{m.recorder.w}
		m.recorder.bs = nil
	}
	send := func(tid uint32, k *taskKey) {
		if !m.events.Output(ringRecord(event.SockSend, 32, uint64(1000+len(m.tasks)), tid, k)) {
			t.Fatal("ring full")
		}
	}
	send(5, task(5, "curl"))      // new: task
	send(5, task(5, "curl"))      // another CPU repeats it: nothing new
	send(5, nil)                  // known on this CPU
	send(6, task(5, "curl"))      // another thread of the process: task
	send(5, task(5, "curl-work")) // renamed: task
	send(5, task(9, "curl-work")) // pid changed (exec by a thread): task
	setuid := task(9, "curl-work")
	setuid.uid = 1000
	send(5, setuid)               // uid changed (setuid): task
	send(5, task(5, "curl"))      // back to what it was before: task
	send(69, task(69, "other"))   // a thread whose tid shares 5's low bits: task
	send(5, task(5, "curl"))      // nothing new
	send(69, task(69, "other"))   // nothing new
	send(0, task(0, "swapper/1")) // idle: never a task
	send(7, nil)                  // never seen with its task: written as is
	n, busy, err := m.drain()
	if err != nil || busy || n != 13 {
		t.Fatalf("drain = %d, %v, %v", n, busy, err)
	}
	var got []string
	for _, rec := range m.closeAndRead(t) {
		s := rec.Type.Name
		if s == "task" {
			pid, _ := rec.Uint("pid")
			uid, _ := rec.Uint("uid")
			comm, _ := rec.Str("comm")
			s += "(" + strings.Join([]string{strconv.FormatUint(uint64(rec.TID()), 10), strconv.FormatUint(pid, 10), strconv.FormatUint(uid, 10), comm}, ",") + ")"
		}
		got = append(got, s)
	}
	want := []string{
		"task(5,5,0,curl)", "sock_send", "sock_send", "sock_send",
		"task(6,5,0,curl)", "sock_send",
		"task(5,5,0,curl-work)", "sock_send",
		"task(5,9,0,curl-work)", "sock_send",
		"task(5,9,1000,curl-work)", "sock_send",
		"task(5,5,0,curl)", "sock_send",
		"task(69,69,0,other)", "sock_send",
		"sock_send", "sock_send",
		"sock_send", "sock_send",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("trace holds\n%v\nwant\n%v", got, want)
	}
	if m.total != 13 || m.counts[event.Task] != 7 {
		t.Errorf("total %d, task records %d", m.total, m.counts[event.Task])
	}
}

func TestBadRingRecords(t *testing.T) {
	for _, tc := range []struct {
		name string
		rec  []byte
		want string
	}{
		{"short", make([]byte, 16), "short ring record"},
		{"unknown type", ringRecord(99, 32, 1, 1, nil), "unknown type 99"},
		{"wrong size", ringRecord(event.SockSend, 40, 1, 1, nil), "is 40 bytes, want 32 or 56"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMemRecorder(t, &bytes.Buffer{}, 1, 4096)
			m.events.Output(tc.rec)
			if _, _, err := m.drain(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("drain error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestControlFirst checks that what the control ring holds is written
// before the events ring's records, which may refer to it.
func TestControlFirst(t *testing.T) {
	m := newMemRecorder(t, &bytes.Buffer{}, 1, 4096)
	m.events.Output(ringRecord(event.SockSend, 32, 2, 5, task(5, "a")))
	m.control.Output(ringRecord(event.ConnOpen, 72, 1, 5, task(5, "a")))
	if _, _, err := m.drain(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, rec := range m.closeAndRead(t) {
		got = append(got, rec.Type.Name)
	}
	if want := "task conn_open sock_send"; strings.Join(got, " ") != want {
		t.Fatalf("trace holds %v, want %s", got, want)
	}
}

// TestMergeByTime checks that the events rings of several CPUs are merged
// by time, each ring's own order kept, with the control ring first.
func TestMergeByTime(t *testing.T) {
	m := newMemRecorder(t, &bytes.Buffer{}, 3, 4096)
	k := task(5, "a")
	times := [][]uint64{
		{10, 40, 41, 90},
		{20, 30, 35, 100, 99}, // 99 after 100: its CPU's order wins
		{},
	}
	for cpu, ts := range times {
		for _, tm := range ts {
			m.cpus[cpu].Output(ringRecord(event.SockSend, 32, tm, 5, k))
			k = nil
		}
	}
	m.control.Output(ringRecord(event.ConnOpen, 72, 50, 5, task(5, "a")))
	n, busy, err := m.drain()
	if err != nil || busy || n != 10 {
		t.Fatalf("drain = %d, %v, %v", n, busy, err)
	}
	var got []string
	for _, rec := range m.closeAndRead(t) {
		got = append(got, rec.Type.Name+"@"+strconv.FormatUint(rec.Time(), 10))
	}
	want := "task@50 conn_open@50 sock_send@10 sock_send@20 sock_send@30 sock_send@35 sock_send@40 sock_send@41 sock_send@90 sock_send@100 sock_send@99"
	if strings.Join(got, " ") != want {
		t.Fatalf("trace holds\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
}

// TestBusyRingDoesNotBlockOthers: a record still being written holds back
// its own ring only.
func TestBusyRingDoesNotBlockOthers(t *testing.T) {
	m := newMemRecorder(t, &bytes.Buffer{}, 2, 4096)
	pos := m.cpus[0].Reserve(32)
	m.cpus[0].Write(pos, 0, ringRecord(event.SockSend, 32, 1, 5, nil))
	m.cpus[1].Output(ringRecord(event.SockSend, 32, 2, 5, nil))
	if n, busy, err := m.drain(); err != nil || !busy || n != 1 {
		t.Fatalf("drain = %d, %v, %v; want 1, busy", n, busy, err)
	}
	m.cpus[0].Submit(pos)
	if n, busy, err := m.drain(); err != nil || busy || n != 1 {
		t.Fatalf("drain = %d, %v, %v; want 1, not busy", n, busy, err)
	}
}

// BenchmarkDrain measures the recorder's cost per ring record on a mix like
// a bulk TCP transfer's, from two CPUs' rings merged by time to the trace
// writer's blocks: what `magnet-lab bench`'s "drain ns/event" is made of, minus
// the write system calls and the cache misses of reading what another CPU
// just wrote. The CPUs take turns in runs of records: "single" is the worst
// case for the drain's merge, a CPU change at every record; "veth" has runs
// as a recording of a 64 KiB flood over a veth pair had them (mean 5.9
// records, 70 % of them 4 or shorter).
// go test -bench Drain -cpuprofile cpu.out ./internal/record
func BenchmarkDrain(b *testing.B) {
	b.Run("single", func(b *testing.B) { benchmarkDrain(b, []int{1}) })
	b.Run("veth", func(b *testing.B) { benchmarkDrain(b, []int{1, 2, 3, 4, 1, 2, 3, 4, 20, 19}) })
}

func benchmarkDrain(b *testing.B, runs []int) {
	const ringSize = 4 << 20
	m := newMemRecorder(b, io.Discard, 2, ringSize)
	mix := []struct {
		typ  event.Type
		size int
	}{
		{event.SockSend, 32}, {event.TCPSend, 32}, {event.TCPXmit, 40}, {event.IPSend, 40},
		{event.DevQueue, 48}, {event.DevXmit, 48}, {event.DevRecv, 48}, {event.IPRecv, 40},
		{event.TCPRcv, 40}, {event.SockRecv, 32},
	}
	var now uint64
	cpu, run, inRun := 0, 0, 0
	fill := func() int {
		n := 0
		for {
			x := mix[n%len(mix)]
			var k *taskKey
			if n%50 == 0 {
				k = task(uint32(100+n%4), "worker")
			}
			now += 100
			if !m.cpus[cpu].Output(ringRecord(x.typ, x.size, now, uint32(100+n%4), k)) {
				return n
			}
			n++
			if inRun++; inRun == runs[run] {
				cpu, run, inRun = 1-cpu, (run+1)%len(runs), 0
			}
		}
	}
	// The drain's thread's CPU time too: on a machine shared with other
	// work, time spent descheduled is not the drain's.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var spent time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	var done int
	for done < b.N {
		b.StopTimer()
		want := fill()
		b.StartTimer()
		start := threadCPU(b)
		for left := want; left > 0; {
			n, _, err := m.drain()
			if err != nil {
				b.Fatal(err)
			}
			left -= n
		}
		spent += threadCPU(b) - start
		done += want
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(done), "ns/record")
	b.ReportMetric(float64(spent.Nanoseconds())/float64(done), "cpu-ns/record")
}

// threadCPU returns the CPU time of the calling thread.
func threadCPU(tb testing.TB) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ts.Nano())
}

// oneByOne hides a trace.Writer's Room and AppendTallied, as the Sinks
// that look at each record do (the daemon's): the drain then takes every
// record through handle.
type oneByOne struct{ Sink }

// TestRunsMatchOneByOne checks that the drain's copying of runs writes
// exactly what it writes record by record: the same records in the same
// order, task records, lost records and counts alike, over several CPUs
// whose records interleave in time, discarded frames, and drains that
// find the rings partly filled.
func TestRunsMatchOneByOne(t *testing.T) {
	var bufRuns, bufOne bytes.Buffer
	runs := newMemRecorder(t, &bufRuns, 3, 1<<14)
	one := newMemRecorder(t, &bufOne, 3, 1<<14)
	one.recorder.w = oneByOne{one.recorder.w}
	one.recorder.bs = nil
	both := []*memRecorder{runs, one}

	rnd := uint64(42)
	next := func(n uint64) uint64 { // xorshift: the same sequence for both
		rnd ^= rnd << 13
		rnd ^= rnd >> 7
		rnd ^= rnd << 17
		return rnd % n
	}
	types := []struct {
		typ  event.Type
		size int
	}{{event.SockSend, 32}, {event.TCPXmit, 40}, {event.DevXmit, 48}, {event.IPRecv, 40}}
	var now uint64 // one clock: the CPUs' records interleave in time
	var produced uint64
	for round := 0; round < 40; round++ {
		for i := 0; i < 60; i++ {
			cpu := int(next(3))
			now += 1 + next(300)
			x := types[next(uint64(len(types)))]
			tid := uint32(100 + next(3))
			var k *taskKey
			if next(8) == 0 {
				k = task(tid, "w"+strconv.Itoa(int(next(2))))
			}
			rec := ringRecord(x.typ, x.size, now, tid, k)
			if next(20) == 0 {
				rec = ringRecord(event.Lost, 184, now, 0, nil)
				binary.NativeEndian.PutUint32(rec[48:], uint32(1+next(5)))
			}
			discard := next(15) == 0
			for _, m := range both {
				if discard {
					m.cpus[cpu].Discard(m.cpus[cpu].Reserve(24))
				}
				if !m.cpus[cpu].Output(rec) {
					t.Fatal("ring full")
				}
			}
			if rec[30] != uint8(event.Lost) {
				produced++
			}
		}
		if round%7 == 3 {
			for _, m := range both {
				m.control.Output(ringRecord(event.ConnOpen, 72, now, 5, task(5, "c")))
			}
		}
		for _, m := range both {
			if _, busy, err := m.drain(); err != nil || busy {
				t.Fatalf("drain: busy %v, %v", busy, err)
			}
		}
	}
	if runs.total != one.total || runs.lost != one.lost || runs.counts != one.counts || runs.total < produced {
		t.Errorf("runs: total %d lost %d; one by one: total %d lost %d; counts equal %v",
			runs.total, runs.lost, one.total, one.lost, runs.counts == one.counts)
	}
	got, want := runs.closeAndRead(t), one.closeAndRead(t)
	// The sink kept the counts and time ranges of the records the drain
	// counted for it (trace.Tally) as those of the records it took one by
	// one.
	if gotSum, wantSum := checkBlocks(t, runs.out.Bytes(), runs.hdr), checkBlocks(t, one.out.Bytes(), one.hdr); !maps.Equal(gotSum, wantSum) {
		t.Errorf("summary counts %v copied in runs, %v one by one", gotSum, wantSum)
	}
	if len(got) != len(want) || len(got) < 2400 {
		t.Fatalf("%d records copied in runs, %d one by one", len(got), len(want))
	}
	var last uint64
	for i := range got {
		if !bytes.Equal(got[i].Data, want[i].Data) {
			t.Fatalf("record %d: %s@%d copied in runs, %s@%d one by one", i, got[i].Type.Name, got[i].Time(), want[i].Type.Name, want[i].Time())
		}
		// The events rings merge in time order (the control ring's
		// records, thread 5, go first whatever their time).
		if got[i].TID() != 5 {
			if got[i].Time() < last {
				t.Fatalf("record %d (%s@%d) is older than the one before it (%d)", i, got[i].Type.Name, got[i].Time(), last)
			}
			last = got[i].Time()
		}
	}
}

// checkBlocks walks the blocks of a trace file written in native byte
// order and checks that every data block's header tells the truth about
// its records (their number and time range), that the end block's time
// range is the file's, and that the summary counts each type's records
// as the file holds them. It returns the summary's counts.
func checkBlocks(t *testing.T, file []byte, hdr *trace.Header) map[string]uint64 {
	t.Helper()
	var sizes [256]int
	var names [256]string
	for _, et := range hdr.Types {
		sizes[et.ID], names[et.ID] = et.Size, et.Name
	}
	u32 := func(off int) int { return int(binary.NativeEndian.Uint32(file[off:])) }
	u64 := func(off int) uint64 { return binary.NativeEndian.Uint64(file[off:]) }
	off := 24 + u32(16) // the preamble, the header
	off += -off & 7
	counts := map[string]uint64{}
	fileFirst, fileLast := uint64(math.MaxUint64), uint64(0)
	for blocks := 0; ; blocks++ {
		magic, size, records, first, last := string(file[off:off+4]), u32(off+4), u32(off+8), u64(off+16), u64(off+24)
		payload := file[off+32 : off+32+size]
		if magic == "MGEN" {
			if blocks > 0 && (first != fileFirst || last != fileLast) {
				t.Errorf("end block: times %d..%d, the records' %d..%d", first, last, fileFirst, fileLast)
			}
			var sum trace.Summary
			if err := json.Unmarshal(payload, &sum); err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(sum.Events, counts) {
				t.Errorf("summary counts %v, the file holds %v", sum.Events, counts)
			}
			return sum.Events
		}
		n, lo, hi := 0, uint64(math.MaxUint64), uint64(0)
		for p := 0; p < len(payload); p += sizes[payload[p+30]] {
			ts := binary.NativeEndian.Uint64(payload[p:])
			lo, hi = min(lo, ts), max(hi, ts)
			counts[names[payload[p+30]]]++
			n++
		}
		if n != records || lo != first || hi != last {
			t.Errorf("block %d: header says %d records at %d..%d, holds %d at %d..%d", blocks, records, first, last, n, lo, hi)
		}
		fileFirst, fileLast = min(fileFirst, lo), max(fileLast, hi)
		off += 32 + size
	}
}

// TestPassStopsAtItsStart checks that a drain pass writes only records
// made before it looked at the rings: a ring found empty is not looked at
// again in the pass, and what its CPU makes meanwhile must not come after
// the other rings' newer records.
func TestPassStopsAtItsStart(t *testing.T) {
	m := newMemRecorder(t, &bytes.Buffer{}, 2, 4096)
	for tm := uint64(10); tm <= 100; tm += 10 {
		m.cpus[0].Output(ringRecord(event.SockSend, 32, tm, 5, nil))
	}
	m.now = func() uint64 { return 55 } // the pass starts at 55: 60 … 100 are made during it
	if n, _, err := m.drain(); err != nil || n != 5 {
		t.Fatalf("first pass = %d, %v; want the 5 records before 55", n, err)
	}
	m.cpus[1].Output(ringRecord(event.SockSend, 32, 57, 5, nil)) // CPU 1, during that pass
	m.now = func() uint64 { return 1000 }
	if n, _, err := m.drain(); err != nil || n != 6 {
		t.Fatalf("second pass = %d, %v; want 6", n, err)
	}
	var got []string
	for _, rec := range m.closeAndRead(t) {
		got = append(got, strconv.FormatUint(rec.Time(), 10))
	}
	if want := "10 20 30 40 50 57 60 70 80 90 100"; strings.Join(got, " ") != want {
		t.Fatalf("trace holds %s, want %s", strings.Join(got, " "), want)
	}
	// A pass always writes something, so that a clock behind the records'
	// cannot stop the drain.
	m2 := newMemRecorder(t, &bytes.Buffer{}, 1, 4096)
	m2.events.Output(ringRecord(event.SockSend, 32, 500, 5, nil))
	m2.events.Output(ringRecord(event.SockSend, 32, 600, 5, nil))
	m2.now = func() uint64 { return 1 }
	if n, _, err := m2.drain(); err != nil || n != 1 {
		t.Fatalf("pass with the clock behind = %d, %v; want 1", n, err)
	}
}

// TestDrainComplete: after a pass, every record up to the time it says
// complete (DrainedSink) was written: the pass's start, though the control
// ring's younger records were written too.
func TestDrainComplete(t *testing.T) {
	m := newMemRecorder(t, &bytes.Buffer{}, 2, 4096)
	for tm := uint64(10); tm <= 100; tm += 10 {
		m.cpus[0].Output(ringRecord(event.SockSend, 32, tm, 5, nil))
	}
	m.cpus[1].Output(ringRecord(event.SockSend, 32, 54, 5, nil))
	m.control.Output(ringRecord(event.ConnClose, 56, 70, 5, nil))
	m.now = func() uint64 { return 55 }
	if n, _, err := m.drain(); err != nil || n != 7 {
		t.Fatalf("pass = %d, %v; want the conn_close and the 6 records before 55", n, err)
	}
	if m.complete != 55 {
		t.Errorf("complete = %d after a pass that began at 55", m.complete)
	}
	if m.drained != nil {
		t.Error("drained set for a sink that is no DrainedSink")
	}
}
