// SPDX-License-Identifier: Apache-2.0

package probe

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"io"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/ring"
)

// loopbackPair connects a client to a server on 127.0.0.1; the server
// reads everything in the background.
func loopbackPair(t *testing.T, ln net.Listener) net.Conn {
	t.Helper()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
		io.Copy(io.Discard, c)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srv := <-accepted
	t.Cleanup(func() {
		c.Close()
		if srv != nil {
			srv.Close()
		}
	})
	return c
}

// ringReaders maps every CPU's events ring of p; they are closed with the
// test.
func ringReaders(t *testing.T, p *Probe) []*ring.Reader {
	t.Helper()
	rs, err := p.EventRings()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, rd := range rs {
			rd.Close()
		}
	})
	return rs
}

// drainRing reads every record now in the rings (all were submitted before
// the call: the socket calls that made them have returned), each without
// the struct mg_task that may follow it.
func drainRing(t *testing.T, rs []*ring.Reader) [][]byte {
	t.Helper()
	var out [][]byte
	for _, rd := range rs {
		for {
			rec, st, err := rd.Peek()
			if err != nil {
				t.Fatal(err)
			}
			if st != ring.Record {
				break
			}
			out = append(out, bytes.Clone(rec))
			rd.Advance()
		}
		rd.Commit()
	}
	return out
}

func countType(recs [][]byte, typ event.Type) int {
	n := 0
	for _, r := range recs {
		if r[30] == uint8(typ) {
			n++
		}
	}
	return n
}

// loadForListener loads groups with the port filter of a new listener on
// 127.0.0.1; both are closed with the test. It skips without root.
func loadForListener(t *testing.T, groups event.Group) (*Probe, net.Listener) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loading BPF needs root")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	port := ln.Addr().(*net.TCPAddr).Port
	p, err := Load(Options{Groups: groups, BufferBytes: 4 << 20, ControlBytes: 64 << 10, Filters: Filters{Port: uint16(port)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, ln
}

// TestSetGroups changes the enabled groups while the programs run: events
// of a group switched off stop at once, and come back when it is switched
// on again, with nothing reloaded.
func TestSetGroups(t *testing.T) {
	all := event.GroupSock | event.GroupTCP | event.GroupTCPSend | event.GroupTCPState | event.GroupConn
	p, ln := loadForListener(t, all)
	rd := ringReaders(t, p)

	c := loopbackPair(t, ln)
	msg := make([]byte, 1000)
	send := func(n int) {
		for range n {
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Both ends count: the client's sends; the server's reads are not
	// sock_send, so only the client's three show.
	send(3)
	if got := countType(drainRing(t, rd), event.SockSend); got != 3 {
		t.Fatalf("sock enabled: %d sock_send events, want 3", got)
	}
	if err := p.SetGroups(event.GroupTCP | event.GroupTCPSend | event.GroupConn); err != nil {
		t.Fatal(err)
	}
	send(3)
	recs := drainRing(t, rd)
	if got := countType(recs, event.SockSend); got != 0 {
		t.Fatalf("sock disabled: %d sock_send events, want 0", got)
	}
	if got := countType(recs, event.TCPSend); got < 3 {
		t.Fatalf("tcpsend stays enabled: %d tcp_send events, want at least 3", got)
	}
	// The sock group's programs are detached (they would cost the traffic
	// even returning at once); sockops never is.
	attached := p.AttachedPrograms()
	for _, prog := range []string{"sock_send_length", "sock_recv_length"} {
		if slices.Contains(attached, prog) {
			t.Errorf("sock disabled: %s still attached (%v)", prog, attached)
		}
	}
	for _, prog := range []string{"tcp_sendmsg_locked", "tcp_probe", "tcp_segments", "inet_sock_set_state"} {
		if !slices.Contains(attached, prog) {
			t.Errorf("tcp, tcpsend and conn enabled: %s not attached (%v)", prog, attached)
		}
	}
	// tcpsend off, tcp on: tcp_send stops and its program is detached,
	// while tcp_xmit goes on.
	if err := p.SetGroups(event.GroupTCP | event.GroupConn); err != nil {
		t.Fatal(err)
	}
	send(3)
	recs = drainRing(t, rd)
	if got := countType(recs, event.TCPSend); got != 0 {
		t.Fatalf("tcpsend disabled: %d tcp_send events, want 0", got)
	}
	if got := countType(recs, event.TCPXmit); got < 3 {
		t.Fatalf("tcp stays enabled: %d tcp_xmit events, want at least 3", got)
	}
	if attached := p.AttachedPrograms(); slices.Contains(attached, "tcp_sendmsg_locked") {
		t.Errorf("tcpsend disabled: tcp_sendmsg_locked still attached (%v)", attached)
	}
	if err := p.SetGroups(all); err != nil {
		t.Fatal(err)
	}
	send(3)
	if got := countType(drainRing(t, rd), event.SockSend); got != 3 {
		t.Fatalf("sock enabled again: %d sock_send events, want 3", got)
	}
	if attached := p.AttachedPrograms(); !slices.Contains(attached, "sock_send_length") {
		t.Errorf("sock enabled again: sock_send_length not attached (%v)", attached)
	}
	// Nothing enabled: everything but the connection lifecycle's programs
	// is detached; after Detach nothing attaches again.
	if err := p.SetGroups(0); err != nil {
		t.Fatal(err)
	}
	for _, prog := range p.AttachedPrograms() {
		if i := slices.IndexFunc(Hooks, func(h Hook) bool { return h.Program == prog }); Hooks[i].Groups&event.GroupConn == 0 {
			t.Errorf("nothing enabled: %s still attached", prog)
		}
	}
	p.Detach()
	if err := p.SetGroups(all); err != nil {
		t.Fatal(err)
	}
	if attached := p.AttachedPrograms(); len(attached) > 0 {
		t.Errorf("after Detach: attached %v, want none", attached)
	}
}

// TestDeliveryRate checks that tcp_state carries the kernel's delivery-rate
// sample: a sender on loopback gets samples with segments and an interval.
func TestDeliveryRate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loading BPF needs root")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	p, err := Load(Options{Groups: event.GroupTCPState | event.GroupConn, BufferBytes: 4 << 20, ControlBytes: 64 << 10, Filters: Filters{Port: uint16(port)}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rd := ringReaders(t, p)

	c := loopbackPair(t, ln)
	chunk := make([]byte, 64<<10)
	// Snapshots are throttled to one per 4 ms: send for long enough to
	// get several.
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
		if _, err := c.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	var snaps, withRate int
	for _, r := range drainRing(t, rd) {
		if r[30] != uint8(event.TCPState) {
			continue
		}
		var st magnetMgTcpState
		if err := binary.Read(bytes.NewReader(r[:binary.Size(st)]), binary.NativeEndian, &st); err != nil {
			t.Fatal(err)
		}
		snaps++
		if st.Delivered > 0 && st.RateDelivered > 0 && st.RateIntervalUs > 0 && st.Mss > 0 {
			withRate++
		}
		if st.RateAppLimited > 1 {
			t.Errorf("rate_app_limited = %d, want 0 or 1", st.RateAppLimited)
		}
	}
	if snaps == 0 || withRate == 0 {
		t.Fatalf("%d tcp_state snapshots, %d with a delivery-rate sample; want some of each", snaps, withRate)
	}
	t.Logf("%d snapshots, %d with a delivery-rate sample", snaps, withRate)
}

// TestSilence empties the event mask with every program left attached:
// no event is produced or lost (connections' openings aside), and sockets
// connected meanwhile get tcp_xmit as soon as the groups come back (IP
// egress needs no per-socket flag; sockops, where it serves tcp_xmit, still
// flags them while silenced).
func TestSilence(t *testing.T) {
	all := event.GroupSock | event.GroupTCP | event.GroupConn
	p, ln := loadForListener(t, all)
	rd := ringReaders(t, p)
	before := p.AttachedPrograms()
	if err := p.Silence(); err != nil {
		t.Fatal(err)
	}
	if after := p.AttachedPrograms(); !slices.Equal(before, after) {
		t.Fatalf("silenced: attached %v, was %v", after, before)
	}

	c := loopbackPair(t, ln)
	msg := make([]byte, 1000)
	for range 3 {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
	}
	if recs := drainRing(t, rd); len(recs) != 0 {
		t.Fatalf("silenced: %d records", len(recs))
	}
	produced, lost, err := p.CountersOf()
	if err != nil {
		t.Fatal(err)
	}
	for typ := range produced {
		// The connection's opening is told whatever the mask: the
		// recorder's connection table needs it (control ring).
		if event.Type(typ) == event.ConnOpen {
			continue
		}
		if produced[typ] != 0 || lost[typ] != 0 {
			t.Errorf("silenced: type %d produced %d, lost %d", typ, produced[typ], lost[typ])
		}
	}

	if err := p.SetGroups(all); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
	}
	recs := drainRing(t, rd)
	if got := countType(recs, event.SockSend); got != 3 {
		t.Errorf("groups back: %d sock_send events, want 3", got)
	}
	// The connection was made while silenced: its segments are reported
	// all the same (IP egress and net_dev_queue need no per-socket flag;
	// sockops, where it serves them, sets the flag while silenced too).
	if got := countType(recs, event.TCPXmit); got < 3 {
		t.Errorf("groups back: %d tcp_xmit events for a connection made while silenced, want at least 3", got)
	}
}

// TestSegmentCallbacksOnlyForTCP: TCP runs the sockops program for each
// segment only for sockets that connected while sockops served tcp_xmit or
// tcp_rate: where IP egress (the default) or net_dev_queue (XmitAtDevice)
// serves them, and with
// neither recorded, those runs would find nothing to do. The run count of
// the program over 200 writes (a segment each, Go sets TCP_NODELAY) shows
// it: at least 200 more runs with tcp served by sockops, and
// otherwise fewer than 100 (the program is attached to the root cgroup:
// other processes' connections opening meanwhile run it a few times each,
// and nothing else). The flag is the socket's, and TCP then runs every
// sockops program of the cgroup: another recorder on the machine that
// flags sockets (other packages' tests, an older build) would flag ours
// too, so the test skips, saying so, when it finds runs while another
// sockops program was attached at its start or end.
func TestSegmentCallbacksOnlyForTCP(t *testing.T) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Skipf("run counts: %v", err)
	}
	defer stats.Close()
	for _, tc := range []struct {
		name    string
		groups  event.Group
		atDev   bool
		perSegs bool
		disable []string
	}{
		{"sock", event.GroupSock | event.GroupConn, false, false, nil},
		{"tcp at IP egress", event.GroupSock | event.GroupTCP | event.GroupConn, false, false, nil},
		{"tcp at the device", event.GroupSock | event.GroupTCP | event.GroupConn, true, false, nil},
		{"tcp by sockops", event.GroupSock | event.GroupTCP | event.GroupConn, false, true, []string{"ip_egress"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if os.Geteuid() != 0 {
				t.Skip("loading BPF needs root")
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			p, err := Load(Options{Groups: tc.groups, BufferBytes: 4 << 20, ControlBytes: 64 << 10,
				Filters: Filters{Port: uint16(ln.Addr().(*net.TCPAddr).Port)}, XmitAtDevice: tc.atDev,
				// fentry, where the kernel allows it, would serve
				// tcp_xmit instead of sockops or IP egress.
				Disable: append([]string{"tcp_xmit_fentry"}, tc.disable...)})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			prog := p.coll.Programs["tcp_segments"]
			if prog == nil {
				t.Fatal("no tcp_segments program")
			}
			c := loopbackPair(t, ln)
			runs := func() uint64 {
				s, err := prog.Stats()
				if err != nil {
					t.Fatal(err)
				}
				return s.RunCount
			}
			alone := onlySockops(t)
			before := runs()
			msg := make([]byte, 100)
			for range 200 {
				if _, err := c.Write(msg); err != nil {
					t.Fatal(err)
				}
			}
			n := runs() - before
			t.Logf("%s: tcp_segments ran %d times over 200 writes", tc.name, n)
			if tc.perSegs && n < 200 {
				t.Errorf("%d runs, want at least one per segment (200)", n)
			}
			if !tc.perSegs && n >= 100 {
				if !alone || !onlySockops(t) {
					t.Skipf("%d runs, but another sockops program is attached to the root cgroup (another recorder): it may flag sockets for all", n)
				}
				t.Errorf("%d runs, want none per segment", n)
			}
		})
	}
}

// onlySockops says whether one sockops program (ours) is attached to the
// root cgroup.
func onlySockops(t *testing.T) bool {
	t.Helper()
	root, err := Cgroup2Root()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	q, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupSockOps})
	if err != nil {
		t.Fatalf("query the root cgroup's sockops programs: %v", err)
	}
	return len(q.Programs) == 1
}

// TestLoadSilent: Options.Silent (record --hooks-only, the bench's floor)
// attaches exactly the programs the same groups attach when recording,
// tcp_xmit's server at IP egress among them, and no event comes out of
// them (connections' openings and closes aside), while the programs do
// run: the floor counts the hooks, not their absence.
func TestLoadSilent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loading BPF needs root")
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Skipf("run counts: %v", err)
	}
	defer stats.Close()
	p, ln, attached := loadAsRecording(t, func(o *Options) { o.Silent = true })
	if !slices.Contains(attached, "ip_egress") {
		t.Fatalf("the default groups attach %v: no ip_egress to serve tcp_xmit", attached)
	}
	rd := ringReaders(t, p)
	runs := func() uint64 {
		s, err := p.coll.Programs["ip_egress"].Stats()
		if err != nil {
			t.Fatal(err)
		}
		return s.RunCount
	}
	before := runs()
	writeSegments(t, loopbackPair(t, ln), 20)
	if n := runs() - before; n < 20 {
		t.Errorf("ip_egress ran %d times over 20 writes, want at least one per segment", n)
	}
	noEvents(t, p, rd, "silent", event.ConnOpen, event.ConnClose)
}

// TestLoadNoEmit: Options.NoEmit (record --no-emit, the bench's bodies
// without records) attaches what recording attaches, and every program
// does its work up to the record, which goes to its CPU's scratch record:
// no event reaches the events rings or the counts (the control ring's
// connections and interfaces do), yet a scratch record holds an
// event of the test's connection, of a type the default groups write.
func TestLoadNoEmit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loading BPF needs root")
	}
	p, ln, _ := loadAsRecording(t, func(o *Options) { o.NoEmit = true })
	rd := ringReaders(t, p)
	writeSegments(t, loopbackPair(t, ln), 20)
	// The control ring's records are written as when recording.
	noEvents(t, p, rd, "no-emit", event.ConnOpen, event.ConnClose, event.Iface)
	var states []magnetCpuState
	if err := p.coll.Maps["cpu_states"].Lookup(uint32(0), &states); err != nil {
		t.Fatal(err)
	}
	kinds := map[event.Type]bool{event.SockSend: true, event.TCPXmit: true, event.TCPRcv: true,
		event.DevQueue: true, event.DevXmit: true, event.DevRecv: true, event.SockRecv: true,
		event.TCPState: true, event.TCPRate: true}
	found := false
	for cpu, st := range states {
		conn := binary.LittleEndian.Uint64(st.Scratch[8:16])
		typ := event.Type(st.Scratch[30])
		t.Logf("cpu %d scratch: conn %d, type %v", cpu, conn, typ)
		// Only the test's two sockets pass the port filter: any
		// connection there is one of them.
		found = found || conn != 0 && kinds[typ]
	}
	if !found {
		t.Fatal("no CPU's scratch record holds an event of the test's connection")
	}
}

// loadAsRecording loads the default groups for a loopback listener's port
// with the options changed by mode, and fails unless that attaches
// exactly the programs recording the same groups attaches: a benchmark
// mode measures the same hooks as the recording it stands for.
func loadAsRecording(t *testing.T, mode func(*Options)) (*Probe, net.Listener, []string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	opts := Options{Groups: event.DefaultGroups, BufferBytes: 4 << 20, ControlBytes: 64 << 10,
		Filters: Filters{Port: uint16(ln.Addr().(*net.TCPAddr).Port)}}
	loud, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	want := loud.AttachedPrograms()
	loud.Close()
	mode(&opts)
	p, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if got := p.AttachedPrograms(); !slices.Equal(got, want) {
		t.Fatalf("attached %v, recording attaches %v", got, want)
	}
	return p, ln, want
}

// writeSegments writes n messages of 1000 bytes on c.
func writeSegments(t *testing.T, c net.Conn, n int) {
	t.Helper()
	msg := make([]byte, 1000)
	for range n {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
	}
}

// noEvents fails if the events rings hold a record or any type but those
// allowed was produced or lost.
func noEvents(t *testing.T, p *Probe, rd []*ring.Reader, mode string, allowed ...event.Type) {
	t.Helper()
	if recs := drainRing(t, rd); len(recs) != 0 {
		t.Fatalf("%s: %d records in the events rings", mode, len(recs))
	}
	produced, lost, err := p.CountersOf()
	if err != nil {
		t.Fatal(err)
	}
	for typ := range produced {
		if slices.Contains(allowed, event.Type(typ)) {
			continue
		}
		if produced[typ] != 0 || lost[typ] != 0 {
			t.Errorf("%s: type %d produced %d, lost %d", mode, typ, produced[typ], lost[typ])
		}
	}
}

// TestXmitFlags: tcp_xmit's flags are the TCP header's flag byte as the
// segment went out (read at IP egress by default): the client's one SYN
// carries SYN alone, its data segments ACK and never SYN or FIN, and the
// FIN its close sends FIN and ACK. TCP sends nothing else on this
// connection, so the counts are exact.
func TestXmitFlags(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loading BPF needs root")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	p, err := Load(Options{Groups: event.GroupTCP | event.GroupConn, BufferBytes: 4 << 20, ControlBytes: 64 << 10,
		Filters: Filters{Port: port}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rd := ringReaders(t, p)
	c := loopbackPair(t, ln)
	writeSegments(t, c, 5)
	// shutdown() sends the FIN in the call (the window has room for it
	// on loopback), through IP egress, where its tcp_xmit is written: it
	// is in the ring when the call returns.
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	var syn, data, fin int
	for _, r := range drainRing(t, rd) {
		if event.Type(r[30]) != event.TCPXmit {
			continue
		}
		flags, size := r[31], int32(binary.LittleEndian.Uint32(r[20:24]))
		switch {
		case flags&0x02 != 0:
			syn++
			if flags != 0x02 {
				t.Errorf("SYN sent with flags %#x, want 0x02", flags)
			}
		case flags&0x01 != 0:
			fin++
			if flags != 0x11 {
				t.Errorf("FIN sent with flags %#x, want 0x11 (FIN, ACK)", flags)
			}
		case size > 0:
			data++
			if flags&0x10 == 0 {
				t.Errorf("data segment of %d bytes sent with flags %#x, without ACK", size, flags)
			}
		}
	}
	// Both ends are recorded (the port filter names the server's port):
	// the server sends a SYN-ACK from its request socket, which
	// __tcp_transmit_skb never sees, and no data.
	if syn != 1 || fin != 1 || data == 0 {
		t.Fatalf("tcp_xmit: %d SYN (want 1), %d FIN (want 1), %d data segments (want some)", syn, fin, data)
	}
}

// TestTCPStateThrottle: tcp_probe writes a throttled tcp_state exactly
// when it is due (docs/EVENTS.md): at a connection's first segment, and at
// each segment 4 ms or more after its last snapshot (on loopback srtt stays
// far below 4 ms, and nothing is lost, so ssthresh and retrans_out never
// change). Both ways are checked, at each tcp_rcv: a snapshot at the same
// time where one was due, none where it was not. Each CPU decides most
// segments from its copy of the socket's last snapshot (struct
// state_memo), the rest from the socket's storage: a copy that decided
// otherwise than the rule shows here. (Without loss, ssthresh and
// retrans_out never change back to a copy's values, the case the copies'
// counts guard; that needs the loss tests' traffic.)
func TestTCPStateThrottle(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loading BPF needs root")
	}
	// The rule is exact to check only while srtt stays below the 4 ms
	// floor (above it the gap follows the live srtt, which tcp_rcv does
	// not carry). A loaded machine can delay loopback ACKs past 4 ms:
	// then the run proves nothing and is made again.
	for try := 1; !throttleRun(t); try++ {
		if try == 3 {
			t.Fatal("loopback srtt reached 4 ms in 3 runs: the throttle's rule cannot be checked on this machine now")
		}
		t.Logf("run %d: loopback srtt reached 4 ms (a loaded machine); again", try)
	}
}

// throttleRun makes one run of TestTCPStateThrottle and reports whether it
// could judge it: false when srtt reached the 4 ms floor.
func throttleRun(t *testing.T) bool {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p, err := Load(Options{Groups: event.GroupTCP | event.GroupTCPState | event.GroupConn, BufferBytes: 4 << 20,
		ControlBytes: 64 << 10, Filters: Filters{Port: uint16(ln.Addr().(*net.TCPAddr).Port)}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rd := ringReaders(t, p)
	c := loopbackPair(t, ln)
	msg := make([]byte, 1000)
	// Paced writes (the workload, not a wait): ~40 windows of 4 ms.
	for range 160 {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	recs := drainRing(t, rd)
	_, lost, err := p.CountersOf()
	if err != nil {
		t.Fatal(err)
	}
	if n := lost[event.TCPRcv] + lost[event.TCPState]; n != 0 {
		t.Fatalf("%d records lost", n)
	}
	const gap = 4_000_000
	// In time order (the rings are per CPU); within one run tcp_rcv is
	// written before its tcp_state, at the same time.
	slices.SortStableFunc(recs, func(a, b []byte) int {
		if c := cmp.Compare(binary.LittleEndian.Uint64(a[0:8]), binary.LittleEndian.Uint64(b[0:8])); c != 0 {
			return c
		}
		return cmp.Compare(b2i(a[30] == uint8(event.TCPState)), b2i(b[30] == uint8(event.TCPState)))
	})
	last := map[uint64]uint64{}    // conn -> time of its last tcp_state
	states := map[[2]uint64]bool{} // (conn, time) of each tcp_state
	for _, r := range recs {
		if event.Type(r[30]) == event.TCPState {
			conn, at := binary.LittleEndian.Uint64(r[8:16]), binary.LittleEndian.Uint64(r[0:8])
			states[[2]uint64{conn, at}] = true
			if srtt := binary.LittleEndian.Uint32(r[40:44]); srtt >= gap/1000 {
				t.Logf("srtt %d µs on loopback: the gap is not 4 ms", srtt)
				return false
			}
		}
	}
	var due, quiet int
	for _, r := range recs {
		switch event.Type(r[30]) {
		case event.TCPState:
			conn, at := binary.LittleEndian.Uint64(r[8:16]), binary.LittleEndian.Uint64(r[0:8])
			last[conn] = at
		case event.TCPRcv:
			conn, at := binary.LittleEndian.Uint64(r[8:16]), binary.LittleEndian.Uint64(r[0:8])
			prev, seen := last[conn]
			want := !seen || at-prev >= gap
			got := states[[2]uint64{conn, at}]
			if want != got {
				t.Errorf("conn %d: tcp_rcv at %d, last snapshot %d ns before (seen %v): snapshot %v, want %v",
					conn, at, at-prev, seen, got, want)
			}
			if want {
				due++
			} else {
				quiet++
			}
		}
	}
	if due < 10 || quiet < 10 {
		t.Fatalf("%d segments found a snapshot due, %d none: want both", due, quiet)
	}
	t.Logf("%d segments with a snapshot due, %d without", due, quiet)
	return true
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
