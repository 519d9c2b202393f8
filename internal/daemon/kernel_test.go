// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// needKernel skips a test that needs root, BPF and namespaces when they
// are not there (CI runs as root).
func needKernel(t *testing.T) *netlab.Lab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF and builds network namespaces")
	}
	if err := netlab.Available(); err != nil {
		t.Skip(err)
	}
	lab, err := netlab.New(netlab.Options{Name: "magnetd"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	return lab
}

// testCgroup makes a cgroup for a test's workloads. The daemon under test
// records only it (filter.cgroup): other tests and other work on the host
// can then neither overflow its rings nor match its filters.
type testCgroup struct {
	path string
	fd   *os.File
}

func newTestCgroup(t *testing.T) *testCgroup {
	t.Helper()
	root, err := probe.Cgroup2Root()
	if err != nil {
		t.Skip(err)
	}
	path := filepath.Join(root, fmt.Sprintf("magnetd-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-")))
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	cg := &testCgroup{path: path, fd: fd}
	t.Cleanup(func() {
		fd.Close()
		os.WriteFile(filepath.Join(path, "cgroup.kill"), []byte("1"), 0o644)
		for range 100 {
			if err := os.Remove(path); err == nil || os.IsNotExist(err) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("cgroup %s left behind", path)
	})
	return cg
}

// in makes cmd start inside the cgroup (clone3 CLONE_INTO_CGROUP).
func (cg *testCgroup) in(cmd *exec.Cmd) *exec.Cmd {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(cg.fd.Fd())
	return cmd
}

// startReal runs a daemon with the real recorder.
func startReal(t *testing.T, edit func(*Config)) *testDaemon {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Socket = filepath.Join(socketDir(t), "magnet.sock")
	if edit != nil {
		edit(&cfg)
	}
	td := &testDaemon{sock: cfg.Socket, done: make(chan error, 1), log: &syncBuffer{}}
	ready := make(chan struct{})
	d, err := New(cfg, Options{Log: td.log, Ready: func() { close(ready) }, StatusDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	td.d = d
	ctx, cancel := context.WithCancel(context.Background())
	td.cancel = cancel
	go func() { td.done <- d.Run(ctx) }()
	select {
	case <-ready:
	case err := <-td.done:
		t.Fatalf("daemon ended before it was ready: %v", err)
	}
	t.Cleanup(func() { td.stop(t) })
	return td
}

// systemUser adds a system user name (no home, no shell) for the test
// and deletes it when the test ends.
func systemUser(t *testing.T, name string) *user.User {
	t.Helper()
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("userdel", name).Run() })
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// startSubscriber runs this test binary as cred with env set to the
// daemon's socket (the binary's TestMain then acts as the client that env
// names), and waits until it says it subscribed. It returns the client's
// process, stdin and stdout.
func startSubscriber(t *testing.T, who, env, sock string, cred *syscall.Credential) (*exec.Cmd, io.WriteCloser, *bufio.Reader) {
	t.Helper()
	helper := exec.Command(testBin)
	helper.Env = append(os.Environ(), env+"="+sock)
	helper.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	stdin, _ := helper.StdinPipe()
	stdout, _ := helper.StdoutPipe()
	helper.Stderr = os.Stderr
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		helper.Process.Kill()
		helper.Wait()
	})
	out := bufio.NewReader(stdout)
	if line, err := out.ReadString('\n'); err != nil || line != "subscribed\n" {
		t.Fatalf("%s: %q %v", who, line, err)
	}
	return helper, stdin, out
}

// testPorts returns n ports below the ephemeral range, different for each
// test process, so that filters by port select this test's traffic.
func testPorts(n int) []uint16 {
	base := 10000 + (os.Getpid()%900)*10
	out := make([]uint16, n)
	for i := range out {
		out[i] = uint16(base + i)
	}
	return out
}

// serve starts a workload server in h listening on port.
func serve(t *testing.T, cg *testCgroup, lab *netlab.Lab, h netlab.Host, port uint16) {
	t.Helper()
	cmd := cg.in(lab.Command(h, magnetBin, "workload", "serve", "--listen", net.JoinHostPort(h.Addr.String(), strconv.Itoa(int(port)))))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "listening ") {
		t.Fatalf("server did not start: %q", sc.Text())
	}
	go io.Copy(io.Discard, stdout)
}

// send runs the FTP-like workload: count messages of size bytes.
func send(cg *testCgroup, lab *netlab.Lab, to netlab.Host, port uint16, count, size int, interval time.Duration) error {
	out, err := cg.in(lab.Command(lab.Client, magnetBin, "workload", "send", "--to", net.JoinHostPort(to.Addr.String(), strconv.Itoa(int(port))),
		"--count", strconv.Itoa(count), "--size", strconv.Itoa(size), "--interval", interval.String())).CombinedOutput()
	if err != nil {
		return fmt.Errorf("workload send: %v: %s", err, out)
	}
	return nil
}

// waitProcessed waits until the daemon has handed every event up to now
// to the subscriptions.
func waitProcessed(t *testing.T, c *magnetclient.Client) {
	t.Helper()
	now := monotonicNs()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := c.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.Recorder.Lost > 0 {
			t.Fatalf("the recorder lost %d events (%v): exact counts cannot hold", st.Recorder.Lost, st.Recorder.LostByType)
		}
		if st.Recorder.ProcessedNs > now {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the daemon did not catch up in 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// expectation is what one subscription must receive of the workload.
type expectation struct {
	name   string
	filter magnetclient.Filter
	events int           // exactly this many events
	sizes  map[int32]int // of these sizes (nil: any)
	bytes  int64         // or, for reads, exactly these bytes (events ≥ 1)
}

// TestHundredSubscribers: 100 concurrent subscriptions with different
// filters, over the FTP pattern (ten connections to ten ports, each ten
// sends of its own size). Ninety-nine receive exactly what matches; one
// stalls on a bigger transfer, loses events, and is told how many; the
// others lose none.
func TestHundredSubscribers(t *testing.T) {
	lab := needKernel(t)
	cg := newTestCgroup(t)
	td := startReal(t, func(c *Config) { c.Filter.Cgroup = cg.path })
	c := td.client(t)
	ctx := context.Background()
	ports := testPorts(11)
	bulkPort := ports[10]
	ports = ports[:10]
	const count, bulk = 10, 3000
	size := func(i int) int { return 1000 + 37*i }
	clientNS := strconv.FormatUint(uint64(lab.Client.NetNSInode), 10)
	serverNS := strconv.FormatUint(uint64(lab.Server.NetNSInode), 10)

	var exps []expectation
	add := func(name string, f magnetclient.Filter, events int, sizes map[int32]int, bytes int64) {
		exps = append(exps, expectation{name, f, events, sizes, bytes})
	}
	send1 := func(i int) map[int32]int { return map[int32]int{int32(size(i)): count} }
	for i, p := range ports {
		pp := []uint16{p}
		add("sock_send port", magnetclient.Filter{Types: []string{"sock_send"}, Ports: pp}, count, send1(i), 0)
		add("sock_send rport tcp", magnetclient.Filter{Types: []string{"sock_send"}, RemotePorts: pp, Protos: []string{"tcp"}}, count, send1(i), 0)
		add("sock_send lport (none: the client's port is ephemeral)", magnetclient.Filter{Types: []string{"sock_send"}, LocalPorts: pp, NetNS: []string{clientNS}}, 0, nil, 0)
		add("expr on size", magnetclient.Filter{Types: []string{"sock_send"}, Expr: fmt.Sprintf("size == %d", size(i)), NetNS: []string{clientNS}}, count, send1(i), 0)
		add("client address", magnetclient.Filter{Types: []string{"sock_send"}, Ports: pp, Addrs: []string{lab.Client.Addr.String()}}, count, send1(i), 0)
		add("server netns by name", magnetclient.Filter{Types: []string{"sock_recv"}, LocalPorts: pp, NetNS: []string{lab.Server.NS}}, 0, nil, int64(count*size(i)))
		add("server reads, expr", magnetclient.Filter{Types: []string{"sock_recv"}, NetNS: []string{serverNS}, Expr: fmt.Sprintf("lport == %d && size > 0", p)}, 0, nil, int64(count*size(i)))
		add("group sock, server side", magnetclient.Filter{Groups: []string{"sock"}, Ports: pp, NetNS: []string{serverNS}}, 0, nil, int64(count*size(i)))
		add("owner comm and uid", magnetclient.Filter{Types: []string{"sock_send"}, Ports: pp, Comms: []string{"magnet"}, UIDs: []uint32{0}}, count, send1(i), 0)
	}
	all := map[int32]int{}
	for i := range ports {
		all[int32(size(i))] = count
	}
	add("every port", magnetclient.Filter{Types: []string{"sock_send"}, Ports: ports}, 10*count, all, 0)
	add("client netns", magnetclient.Filter{Types: []string{"sock_send"}, NetNS: []string{clientNS}, Ports: ports}, 10*count, all, 0)
	add("expr on ports and sizes", magnetclient.Filter{Types: []string{"sock_send"}, NetNS: []string{clientNS}, Expr: fmt.Sprintf("rport >= %d && rport <= %d && size >= %d", ports[0], ports[9], size(5))}, 5*count, map[int32]int{int32(size(5)): count, int32(size(6)): count, int32(size(7)): count, int32(size(8)): count, int32(size(9)): count}, 0)
	add("udp (none)", magnetclient.Filter{Types: []string{"sock_send"}, Protos: []string{"udp"}, NetNS: []string{clientNS}}, 0, nil, 0)
	add("owner expr", magnetclient.Filter{Types: []string{"sock_send"}, Ports: ports, Expr: "owner.comm == 'magnet' && owner.uid == 0 && raddr == '" + lab.Server.Addr.String() + "'"}, 10*count, all, 0)
	add("other address (none)", magnetclient.Filter{Types: []string{"sock_send"}, Ports: ports, Addrs: []string{"10.255.255.0/24"}}, 0, nil, 0)
	add("netns both, sends", magnetclient.Filter{Types: []string{"sock_send"}, NetNS: []string{clientNS, serverNS}, Ports: ports}, 10*count, all, 0)
	add("first and last ports", magnetclient.Filter{Types: []string{"sock_send"}, Ports: []uint16{ports[0], ports[9]}}, 2*count, map[int32]int{int32(size(0)): count, int32(size(9)): count}, 0)
	// The bulk transfer of the stalled subscriber, seen by one that keeps
	// up: sends that would block come back as -EAGAIN, as many as there
	// are, so this one says how many events match.
	add("bulk, keeping up", magnetclient.Filter{Types: []string{"sock_send"}, Ports: []uint16{bulkPort}}, 0, nil, bulk*100)
	if len(exps) != 99 {
		t.Fatalf("%d expectations, want 99", len(exps))
	}

	type running struct {
		exp expectation
		col *collector
		s   *magnetclient.Stream
	}
	subs := make([]running, len(exps))
	var wg sync.WaitGroup
	errs := make(chan error, len(exps))
	for i, e := range exps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := c.Subscribe(ctx, e.filter, 0)
			if err != nil {
				errs <- fmt.Errorf("%s: %w", e.name, err)
				return
			}
			subs[i] = running{e, collect(s), s}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	defer func() {
		for _, r := range subs {
			r.s.Close()
		}
	}()
	stalled, err := c.Subscribe(ctx, magnetclient.Filter{Types: []string{"sock_send"}, Ports: []uint16{bulkPort}}, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()

	for _, p := range append(ports, bulkPort) {
		serve(t, cg, lab, lab.Server, p)
	}
	var sendWG sync.WaitGroup
	sendErrs := make(chan error, 11)
	for i, p := range ports {
		sendWG.Add(1)
		go func() {
			defer sendWG.Done()
			if err := send(cg, lab, lab.Server, p, count, size(i), time.Millisecond); err != nil {
				sendErrs <- err
			}
		}()
	}
	sendWG.Add(1)
	go func() {
		defer sendWG.Done()
		if err := send(cg, lab, lab.Server, bulkPort, bulk, 100, 0); err != nil {
			sendErrs <- err
		}
	}()
	sendWG.Wait()
	close(sendErrs)
	for err := range sendErrs {
		t.Fatal(err)
	}
	waitProcessed(t, c)

	var bulkMatching int
	for _, r := range subs {
		e := r.exp
		var got []*magnetclient.Event
		if e.bytes > 0 {
			var sum int64
			for sum < e.bytes {
				evs, lost := r.col.events(t, 1)
				if len(lost) > 0 {
					t.Fatalf("%s: lost %+v", e.name, lost)
				}
				got = append(got, evs...)
				if evs[0].Size > 0 {
					sum += int64(evs[0].Size)
				}
			}
		} else {
			var lost []*magnetclient.Lost
			got, lost = r.col.events(t, e.events)
			if len(lost) > 0 {
				t.Fatalf("%s: lost %+v", e.name, lost)
			}
		}
		if e.sizes != nil {
			seen := map[int32]int{}
			for _, ev := range got {
				seen[ev.Size]++
			}
			for sz, n := range e.sizes {
				if seen[sz] != n {
					t.Errorf("%s: %d events of %d bytes, want %d (%v)", e.name, seen[sz], sz, n, seen)
				}
			}
		}
		if e.name == "bulk, keeping up" {
			bulkMatching = len(got)
		}
	}
	// Nothing more for anyone: what they got is exactly what matches. A
	// byte count may be followed by calls that moved nothing (the reader's
	// end of stream, -EAGAIN).
	time.Sleep(300 * time.Millisecond)
	for _, r := range subs {
		for more := true; more; {
			select {
			case m := <-r.col.msgs:
				if m.Event == nil || r.exp.bytes == 0 || m.Event.Size > 0 {
					t.Errorf("%s: extra message %+v", r.exp.name, m)
				} else if r.exp.name == "bulk, keeping up" {
					bulkMatching++
				}
			default:
				more = false
			}
		}
	}

	// The stalled one now reads: delivered + lost = every matching event,
	// and the others lost nothing (checked above, and by the daemon).
	st := must[*magnetclient.Status](t)(c.Status(ctx))
	for _, s := range st.Subscriptions {
		if s.ID != stalled.Subscribed().ID && s.Dropped != 0 {
			t.Errorf("subscription %d (%v) dropped %d", s.ID, s.Filter, s.Dropped)
		}
	}
	sc := collect(stalled)
	var delivered int
	var lost uint64
	for delivered+int(lost) < bulkMatching {
		select {
		case m := <-sc.msgs:
			if m.Event != nil {
				delivered++
			}
			if m.Lost != nil {
				lost += m.Lost.Count
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("stalled subscriber: %d delivered + %d lost of %d", delivered, lost, bulkMatching)
		}
	}
	if lost == 0 || delivered+int(lost) != bulkMatching {
		t.Fatalf("stalled subscriber: %d delivered + %d lost, want %d with losses", delivered, lost, bulkMatching)
	}
	t.Logf("stalled subscriber: %d delivered, %d lost, told in-band", delivered, lost)
}

// TestGroupChangesKeepEvents turns groups on and off while a subscription
// counts the sends of a paced transfer: none of them is lost.
func TestGroupChangesKeepEvents(t *testing.T) {
	lab := needKernel(t)
	cg := newTestCgroup(t)
	td := startReal(t, func(c *Config) { c.Events.Baseline = "sock"; c.Filter.Cgroup = cg.path })
	c := td.client(t)
	ctx := context.Background()
	port := testPorts(12)[11]
	const n = 300
	s, err := c.Subscribe(ctx, magnetclient.Filter{Types: []string{"sock_send"}, Ports: []uint16{port}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sends := collect(s)
	serve(t, cg, lab, lab.Server, port)
	done := make(chan error, 1)
	go func() { done <- send(cg, lab, lab.Server, port, n, 200, 3*time.Millisecond) }()
	var devEvents, changes int
	for running := true; running; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			running = false
		default:
			// dev on, then off again.
			d, err := c.Subscribe(ctx, magnetclient.Filter{Groups: []string{"dev"}, Ports: []uint16{port}}, 0)
			if err != nil {
				t.Fatal(err)
			}
			if g := strings.Join(d.Subscribed().Groups, ","); !strings.Contains(g, "dev") {
				t.Fatalf("dev not enabled: %s", g)
			}
			dc := collect(d)
			time.Sleep(40 * time.Millisecond) // the workload runs meanwhile
			d.Close()
			for m := range dc.msgs {
				if m.Event != nil {
					devEvents++
				}
			}
			changes++
		}
	}
	waitProcessed(t, c)
	evs, lost := sends.events(t, n)
	if len(lost) > 0 {
		t.Fatalf("lost %+v", lost)
	}
	for _, e := range evs {
		if e.Size != 200 {
			t.Fatalf("event %+v", e)
		}
	}
	sends.quiet(t, 200*time.Millisecond)
	if devEvents == 0 {
		t.Error("no dev events while dev was enabled")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := must[*magnetclient.Status](t)(c.Status(ctx))
		if strings.Join(st.Groups.Enabled, ",") == "sock,conn" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("groups after: %v", st.Groups.Enabled)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Groups nobody wants cost nothing: their programs are detached.
	td.d.probeMu.Lock()
	attached := td.d.probe.AttachedPrograms()
	td.d.probeMu.Unlock()
	for _, prog := range []string{"net_dev_queue", "net_dev_start_xmit", "netif_receive_skb", "kfree_skb", "sched_switch", "tcp_probe"} {
		if slices.Contains(attached, prog) {
			t.Errorf("only sock and conn enabled, yet %s is attached (%v)", prog, attached)
		}
	}
	if !slices.Contains(attached, "sock_send_length") {
		t.Errorf("sock enabled, yet sock_send_length is not attached (%v)", attached)
	}
	t.Logf("%d sends counted across %d group changes; %d dev events while enabled", n, 2*changes, devEvents)
}

// userResult is what the unprivileged client reports.
type userResult struct {
	UID          uint32   `json:"uid"`
	SeesAll      bool     `json:"sees_all"`
	EventConns   []uint64 `json:"event_conns"`
	EventOwners  []int64  `json:"event_owners"`
	EventPIDs    []uint32 `json:"event_pids"`
	EventComms   []string `json:"event_comms"`
	EventTypes   []string `json:"event_types"`
	Sends        int      `json:"sends"`
	Listed       []uint64 `json:"listed"`
	OwnStatus    string   `json:"own_status"`
	OtherStatus  string   `json:"other_status"`
	OtherErrorIs bool     `json:"other_forbidden"`
}

// userClient is the unprivileged client of TestUnprivilegedUser, run as
// another user by re-executing the test binary. It subscribes, says so,
// then, told the ids of its own and another's connection, reports what it
// could see.
func userClient() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "user client:", err)
		return 1
	}
	c, err := magnetclient.Dial(os.Getenv(helperEnv))
	if err != nil {
		return fail(err)
	}
	ctx := context.Background()
	s, err := c.Subscribe(ctx, magnetclient.Filter{}, 0)
	if err != nil {
		return fail(err)
	}
	col := collect(s)
	fmt.Println("subscribed")
	var own, other uint64
	if _, err := fmt.Scan(&own, &other); err != nil {
		return fail(err)
	}
	// The test has waited for the daemon to process the workload.
	var res userResult
	st, err := c.Status(ctx)
	if err != nil {
		return fail(err)
	}
	res.UID, res.SeesAll = st.Client.UID, st.Client.SeesAll
	for done := false; !done; {
		select {
		case m := <-col.msgs:
			if m.Event != nil {
				res.EventConns = append(res.EventConns, m.Event.Conn)
				res.EventPIDs = append(res.EventPIDs, m.Event.PID)
				res.EventComms = append(res.EventComms, m.Event.Comm)
				res.EventTypes = append(res.EventTypes, m.Event.Type)
				if m.Event.Owner != nil {
					res.EventOwners = append(res.EventOwners, m.Event.Owner.UID)
				} else {
					res.EventOwners = append(res.EventOwners, -2)
				}
				if m.Event.Type == "sock_send" {
					res.Sends++
				}
			}
		case <-time.After(500 * time.Millisecond):
			done = true
		}
	}
	list, err := c.Connections(ctx, magnetclient.Filter{}, magnetclient.Window{})
	if err != nil {
		return fail(err)
	}
	for _, l := range list {
		res.Listed = append(res.Listed, l.ID)
	}
	res.OwnStatus = "ok"
	if _, err := c.Connection(ctx, own, magnetclient.Window{}); err != nil {
		res.OwnStatus = err.Error()
	}
	_, err = c.Connection(ctx, other, magnetclient.Window{})
	res.OtherStatus = fmt.Sprint(err)
	res.OtherErrorIs = errors.Is(err, magnetclient.ErrForbidden)
	s.Close()
	c.Close()
	json.NewEncoder(os.Stdout).Encode(res)
	return 0
}

// TestUnprivilegedUser: a user sees its own connection and its events,
// nothing of root's, and gets 403 for root's connection.
func TestUnprivilegedUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a user and loads BPF")
	}
	if _, err := exec.LookPath("useradd"); err != nil {
		t.Skip("useradd not found")
	}
	name := fmt.Sprintf("mgtest%d", os.Getpid()%100000)
	u := systemUser(t, name)
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}

	cg := newTestCgroup(t)
	td := startReal(t, func(c *Config) { c.Filter.Cgroup = cg.path })
	c := td.client(t)
	ports := testPorts(14)
	userPort, rootPort := ports[12], ports[13]

	helper, stdin, out := startSubscriber(t, "user client", helperEnv, td.sock, cred)

	// Two transfers on loopback, each from a client to a root server: one
	// client runs as the user, the other as root.
	for _, p := range []uint16{userPort, rootPort} {
		srv := cg.in(exec.Command(magnetBin, "workload", "serve", "--listen", "127.0.0.1:"+strconv.Itoa(int(p))))
		so, _ := srv.StdoutPipe()
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			srv.Process.Kill()
			srv.Wait()
		})
		if line, err := bufio.NewReader(so).ReadString('\n'); err != nil || !strings.HasPrefix(line, "listening") {
			t.Fatalf("server: %q %v", line, err)
		}
	}
	// Root's view, to check that the user's connection did carry root's
	// tasks, which the user's stream must mask.
	rootStream := collect(must[*magnetclient.Stream](t)(c.Subscribe(context.Background(), magnetclient.Filter{}, 0)))
	run := func(p uint16, cred *syscall.Credential) int {
		cmd := exec.Command(magnetBin, "workload", "send", "--to", "127.0.0.1:"+strconv.Itoa(int(p)), "--count", "5", "--size", "500", "--interval", "1ms")
		if cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		cg.in(cmd)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("send: %v: %s", err, out)
		}
		return cmd.Process.Pid
	}
	userPID := run(userPort, cred)
	run(rootPort, nil)
	waitProcessed(t, c)

	// The client ends of both transfers, as root sees them.
	ctx := context.Background()
	conns := func(p uint16) uint64 {
		list := must[[]magnetclient.Connection](t)(c.Connections(ctx, magnetclient.Filter{RemotePorts: []uint16{p}, Addrs: []string{"127.0.0.1"}}, magnetclient.Window{}))
		if len(list) != 1 || list[0].Owner == nil {
			t.Fatalf("client connection to %d: %+v", p, list)
		}
		return list[0].ID
	}
	own, other := conns(userPort), conns(rootPort)
	fmt.Fprintf(stdin, "%d %d\n", own, other)
	var res userResult
	if err := json.NewDecoder(out).Decode(&res); err != nil {
		t.Fatal(err)
	}
	if err := helper.Wait(); err != nil {
		t.Fatalf("user client: %v", err)
	}
	if res.UID != uint32(uid) || res.SeesAll {
		t.Fatalf("the daemon took the user for uid %d (sees all: %v)", res.UID, res.SeesAll)
	}
	if res.Sends != 5 {
		t.Errorf("the user saw %d of its 5 sends", res.Sends)
	}
	// On loopback the root server's ACKs reach the user's socket in a
	// softirq run by the server's task: root's stream shows that task on
	// the user's connection, the user's shows no task but its own.
	rootTasks := 0
	for done := false; !done; {
		select {
		case m := <-rootStream.msgs:
			if e := m.Event; e != nil && e.Conn == own && e.PID != 0 && e.PID != uint32(userPID) {
				rootTasks++
			}
		case <-time.After(500 * time.Millisecond):
			done = true
		}
	}
	if rootTasks == 0 {
		t.Errorf("root saw no other task on the user's connection %d: the masking is not exercised", own)
	}
	masked := 0
	for i, conn := range res.EventConns {
		if pid := res.EventPIDs[i]; pid != 0 && pid != uint32(userPID) {
			t.Errorf("the user saw task %d (%s) in %s of connection %d: not its own (%d)", pid, res.EventComms[i], res.EventTypes[i], conn, userPID)
		} else if pid == 0 && res.EventComms[i] != "" {
			t.Errorf("a masked task kept its comm %q", res.EventComms[i])
		} else if pid == 0 {
			masked++
		}
		if conn != own && res.EventOwners[i] != int64(uid) {
			t.Errorf("the user saw an event of connection %d (owner uid %d)", conn, res.EventOwners[i])
		}
		if conn == other {
			t.Errorf("the user saw root's connection %d", other)
		}
	}
	t.Logf("root saw %d events of other tasks on the user's connection; the user saw %d events, %d with the task masked", rootTasks, len(res.EventConns), masked)
	if masked == 0 {
		t.Errorf("the user saw no masked task, though root saw %d other tasks on its connection", rootTasks)
	}
	if len(res.Listed) != 1 || res.Listed[0] != own {
		t.Errorf("the user lists %v, want only %d", res.Listed, own)
	}
	if res.OwnStatus != "ok" {
		t.Errorf("own connection: %s", res.OwnStatus)
	}
	if !res.OtherErrorIs || !strings.Contains(res.OtherStatus, "403") {
		t.Errorf("root's connection: %s, want 403", res.OtherStatus)
	}
}

// TestBinarySIGTERM runs `magnet daemon` as a user would, with a TCP
// listener: its own TCP traffic never shows, and SIGTERM ends every
// stream with an end message and exits 0.
func TestBinarySIGTERM(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF")
	}
	dir := socketDir(t)
	sock := filepath.Join(dir, "magnet.sock")
	tokFile := filepath.Join(dir, "token")
	token := "token-for-the-sigterm-test"
	os.WriteFile(tokFile, []byte(token+"\n"), 0o600)
	ready := filepath.Join(dir, "ready")
	conf := filepath.Join(dir, "magnetd.yaml")
	os.WriteFile(conf, []byte("events:\n  baseline: sock,tcp\n"), 0o644)
	cmd := exec.Command(magnetBin, "daemon", "--config", conf, "--socket", sock, "--listen", "127.0.0.1:0", "--token-file", tokFile, "--ready-file", ready)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("daemon exited: %v\n%s", err, stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon not ready after 30 s\n%s", stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// "serving on SOCK and 127.0.0.1:PORT"
	log := stderr.String()
	i := strings.LastIndex(log, " and ")
	if i < 0 {
		t.Fatalf("log: %s", log)
	}
	tcpAddr := strings.TrimSpace(log[i+len(" and "):])
	_, portText, _ := net.SplitHostPort(tcpAddr)
	port, _ := strconv.Atoi(portText)

	ctx := context.Background()
	tc := must[*magnetclient.Client](t)(magnetclient.Dial("tcp://"+tcpAddr, magnetclient.WithToken(token)))
	defer tc.Close()
	// Everything on loopback, over TCP: the stream's own traffic would
	// feed it if the daemon traced itself.
	over := collect(must[*magnetclient.Stream](t)(tc.Subscribe(ctx, magnetclient.Filter{Addrs: []string{"127.0.0.1"}}, 0)))
	uc := must[*magnetclient.Client](t)(magnetclient.Dial(sock))
	defer uc.Close()
	push := collect(must[*magnetclient.Stream](t)(uc.Push(ctx, magnetclient.Filter{}, magnetclient.PushOptions{Every: 50 * time.Millisecond})))
	<-push.msgs
	for range 20 {
		must[*magnetclient.Status](t)(tc.Status(ctx))
	}
	list := must[[]magnetclient.Connection](t)(uc.Connections(ctx, magnetclient.Filter{Ports: []uint16{uint16(port)}}, magnetclient.Window{}))
	if len(list) != 0 {
		t.Errorf("the daemon shows its own connections: %+v", list)
	}

	// SIGHUP reloads the file.
	if g := must[*magnetclient.Status](t)(uc.Status(ctx)).Groups.Baseline; strings.Join(g, ",") != "sock,tcp,conn" {
		t.Fatalf("baseline from the file: %v", g)
	}
	os.WriteFile(conf, []byte("events:\n  baseline: sock,tcp,sched\n"), 0o644)
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); ; {
		g := must[*magnetclient.Status](t)(uc.Status(ctx)).Groups.Baseline
		if strings.Join(g, ",") == "sock,tcp,conn,sched" {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("after SIGHUP the baseline is %v\n%s", g, stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for _, col := range []*collector{over, push} {
		var end bool
		for m := range col.msgs {
			if m.Event != nil && (strings.HasSuffix(m.Event.Local, ":"+portText) || strings.HasSuffix(m.Event.Remote, ":"+portText)) {
				t.Errorf("an event of the daemon's own TCP traffic: %+v", m.Event)
			}
			end = end || m.End != nil
		}
		if !end {
			t.Error("a stream closed without its end message")
		}
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("daemon exited with %v\n%s", err, stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("daemon still running 20 s after SIGTERM")
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind")
	}
}

// TestWatch runs `magnet watch` against the daemon, as a user would.
func TestWatch(t *testing.T) {
	lab := needKernel(t)
	cg := newTestCgroup(t)
	td := startReal(t, func(c *Config) { c.Filter.Cgroup = cg.path })
	port := testPorts(15)[14]
	for _, asJSON := range []bool{false, true} {
		args := []string{"watch", "--socket", td.sock, "--conn-port", strconv.Itoa(int(port)), "--type", "sock_send"}
		if asJSON {
			args = append(args, "--json")
		}
		cmd := exec.Command(magnetBin, args...)
		stdout, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// A watch that hangs is killed, so that the test fails instead.
		watchdog := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
		defer watchdog.Stop()
		lines := bufio.NewScanner(stdout)
		if !asJSON {
			if !lines.Scan() || !strings.HasPrefix(lines.Text(), "# watching") {
				t.Fatalf("first line %q", lines.Text())
			}
		} else {
			// The subscription is registered once the first line is out;
			// in JSON mode that line is not printed, so wait on the status.
			c := td.client(t)
			for must[*magnetclient.Status](t)(c.Status(context.Background())).Subscribers == 0 {
				time.Sleep(10 * time.Millisecond)
			}
		}
		serve(t, cg, lab, lab.Server, port)
		if err := send(cg, lab, lab.Server, port, 3, 777, time.Millisecond); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if !lines.Scan() {
				t.Fatalf("watch ended early: %v", lines.Err())
			}
			l := lines.Text()
			if asJSON {
				var m magnetclient.Message
				if err := json.Unmarshal([]byte(l), &m); err != nil || m.Event == nil || m.Event.Size != 777 || m.Event.Type != "sock_send" {
					t.Fatalf("json line %q: %v", l, err)
				}
			} else if !strings.Contains(l, " sock_send ") || !strings.Contains(l, " 777 ") || !strings.Contains(l, ":"+strconv.Itoa(int(port))) {
				t.Fatalf("line %q", l)
			}
		}
		cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("watch after SIGINT: %v", err)
		}
		port++ // a fresh server for the next round
	}
}
