// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// orderEnv makes this test binary act as orderClient.
const orderEnv = "MAGNET_DAEMON_TEST_ORDER"

// orderedEvent is what the order test checks of each event a stream gave.
type orderedEvent struct {
	TimeNs   uint64 `json:"t"`
	Type     string `json:"type"`
	Conn     uint64 `json:"conn"`
	OwnerUID int64  `json:"owner"` // -2: no owner shown
	LagNs    int64  `json:"lag"`   // from time_ns to its arrival at the client
}

// stamped is a stream's messages with the time (CLOCK_MONOTONIC, the
// events' clock) each arrived.
type stamped struct {
	msgs chan stampedMsg
}

type stampedMsg struct {
	m  magnetclient.Message
	at uint64
}

func collectStamped(s *magnetclient.Stream) *stamped {
	c := &stamped{msgs: make(chan stampedMsg, 1<<16)}
	go func() {
		defer close(c.msgs)
		for {
			m, err := s.Next()
			if err != nil {
				return
			}
			c.msgs <- stampedMsg{m, monotonicNs()}
		}
	}()
	return c
}

// orderClient subscribes to every event it may see, says so, and once
// told (a line on its standard input) that the workload is over and
// processed, prints the events it got, in the order it got them.
func orderClient() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "order client:", err)
		return 1
	}
	c, err := magnetclient.Dial(os.Getenv(orderEnv))
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	s, err := c.Subscribe(context.Background(), magnetclient.Filter{}, 0)
	if err != nil {
		return fail(err)
	}
	col := collectStamped(s)
	fmt.Println("subscribed")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return fail(err)
	}
	evs := drain(col)
	s.Close()
	json.NewEncoder(os.Stdout).Encode(evs)
	return 0
}

// drain takes a stream's events until it is quiet for a second: the
// daemon hands events over within ~50 ms, and holds a user's unowned
// connections at most holdFor more.
func drain(col *stamped) []orderedEvent {
	var out []orderedEvent
	for {
		select {
		case sm, ok := <-col.msgs:
			if !ok {
				return out
			}
			if e := sm.m.Event; e != nil {
				o := orderedEvent{TimeNs: e.TimeNs, Type: e.Type, Conn: e.Conn, OwnerUID: -2, LagNs: int64(sm.at - e.TimeNs)}
				if e.Owner != nil {
					o.OwnerUID = e.Owner.UID
				}
				out = append(out, o)
			}
		case <-time.After(time.Second):
			return out
		}
	}
}

// userLab is two namespaces, a cgroup and a user made for a test, to run
// the workload as that user or as root.
type userLab struct {
	t   *testing.T
	lab *netlab.Lab
	cg  *testCgroup
	u   *user.User
	uid uint64
	gid uint32
}

func newUserLab(t *testing.T, prefix string) *userLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a user and loads BPF")
	}
	for _, tool := range []string{"useradd", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skip(tool + " not found")
		}
	}
	ul := &userLab{t: t, lab: needKernel(t)}
	name := fmt.Sprintf("%s%d", prefix, os.Getpid()%100000)
	u := systemUser(t, name)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	ul.u, ul.gid = u, uint32(gid)
	ul.uid, _ = strconv.ParseUint(u.Uid, 10, 32)
	ul.cg = newTestCgroup(t)
	return ul
}

// as runs magnet with args in the client (server false) or server
// namespace, as the user (asUser) or root.
func (ul *userLab) as(asUser, server bool, args ...string) *exec.Cmd {
	host := ul.lab.Client
	if server {
		host = ul.lab.Server
	}
	if asUser {
		args = append([]string{"setpriv", "--reuid=" + ul.u.Uid, "--regid=" + ul.u.Gid, "--clear-groups", magnetBin}, args...)
	} else {
		args = append([]string{magnetBin}, args...)
	}
	return ul.cg.in(ul.lab.Command(host, args[0], args[1:]...))
}

// transfer runs a server in the server namespace on a port the kernel
// gives, and a client in the client namespace sending it 5 × 500 bytes,
// both as the user (asUser) or root; it returns the port.
func (ul *userLab) transfer(asUser bool) uint16 {
	t := ul.t
	srv := ul.as(asUser, true, "workload", "serve", "--listen", net.JoinHostPort(ul.lab.Server.Addr.String(), "0"))
	so, _ := srv.StdoutPipe()
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Process.Kill()
		srv.Wait()
	})
	line, err := bufio.NewReader(so).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		t.Fatalf("server: %q %v", line, err)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	cl := ul.as(asUser, false, "workload", "send", "--to", addr, "--count", "5", "--size", "500", "--interval", "1ms")
	if out, err := cl.CombinedOutput(); err != nil {
		t.Fatalf("send: %v: %s", err, out)
	}
	return ap.Port()
}

// TestUserStreamOrder: an unprivileged user's stream holds the whole life
// of its own connections (conn_open, every send and receive, conn_close),
// whether it opened them (connect) or accepted them, in time order, and
// nothing of root's; root's stream is in time order too. Real BPF, real
// traffic between two namespaces; both ends of each transfer run as the
// same user (the user's transfer) or as root.
func TestUserStreamOrder(t *testing.T) {
	ul := newUserLab(t, "mgord")
	lab, cg, uid := ul.lab, ul.cg, ul.uid
	td := startReal(t, func(c *Config) { c.Filter.Cgroup = cg.path })
	c := td.client(t)

	helper, stdin, out := startSubscriber(t, "order client", orderEnv, td.sock, &syscall.Credential{Uid: uint32(uid), Gid: ul.gid})
	rootStream := collectStamped(must[*magnetclient.Stream](t)(c.Subscribe(context.Background(), magnetclient.Filter{}, 0)))
	transfer := ul.transfer
	userPort := transfer(true)
	rootPort := transfer(false)
	waitProcessed(t, c)

	ctx := context.Background()
	// Both ends of each transfer, as root sees them.
	ends := func(port uint16) (client, server uint64) {
		list := must[[]magnetclient.Connection](t)(c.Connections(ctx, magnetclient.Filter{Ports: []uint16{port}, Protos: []string{"tcp"}}, magnetclient.Window{}))
		srv := net.JoinHostPort(lab.Server.Addr.String(), strconv.Itoa(int(port)))
		for _, l := range list {
			switch {
			case l.Remote == srv:
				client = l.ID
			case l.Local == srv && strings.HasPrefix(l.Remote, lab.Client.Addr.String()+":"):
				server = l.ID
			}
		}
		if client == 0 || server == 0 {
			t.Fatalf("the two ends of the transfer to port %d: %+v", port, list)
		}
		return client, server
	}
	userClientConn, userServerConn := ends(userPort)
	rootClientConn, rootServerConn := ends(rootPort)

	fmt.Fprintln(stdin, "go")
	var userEvs []orderedEvent
	if err := json.NewDecoder(out).Decode(&userEvs); err != nil {
		t.Fatal(err)
	}
	if err := helper.Wait(); err != nil {
		t.Fatalf("order client: %v", err)
	}
	rootEvs := drain(rootStream)

	inOrder := func(who string, evs []orderedEvent) {
		for i := 1; i < len(evs); i++ {
			if evs[i].TimeNs < evs[i-1].TimeNs {
				t.Errorf("%s's stream: event %d (%s of %d at %d) comes after %s of %d at %d, %d ns later",
					who, i, evs[i].Type, evs[i].Conn, evs[i].TimeNs, evs[i-1].Type, evs[i-1].Conn, evs[i-1].TimeNs, evs[i-1].TimeNs-evs[i].TimeNs)
			}
		}
	}
	inOrder("root", rootEvs)
	inOrder("the user", userEvs)

	// life checks one connection's events in a stream: conn_open first,
	// then the workload's 5 sends (client) or reads (server), conn_close
	// after every send. conn_close need not be last: the tcp_state of the
	// close, and the client's read of the end of the stream after the
	// server's FIN, come after it in time.
	life := func(who string, evs []orderedEvent, conn uint64, client bool) []orderedEvent {
		var mine []orderedEvent
		var types []string
		sends, closes, lastSend, closeAt := 0, 0, -1, -1
		for _, e := range evs {
			if e.Conn != conn {
				continue
			}
			switch e.Type {
			case "sock_send":
				sends++
				lastSend = len(types)
			case "conn_close":
				closes++
				closeAt = len(types)
			}
			mine = append(mine, e)
			types = append(types, e.Type)
		}
		if len(types) == 0 {
			t.Errorf("%s saw nothing of connection %d", who, conn)
			return nil
		}
		if types[0] != "conn_open" {
			t.Errorf("%s: connection %d begins with %v, not conn_open", who, conn, types[:min(len(types), 5)])
		}
		if closes != 1 || closeAt < lastSend {
			t.Errorf("%s: connection %d has %d conn_close (at %d, the last send at %d): %v", who, conn, closes, closeAt, lastSend, types)
		}
		if client && sends != 5 {
			t.Errorf("%s: %d sock_send on connection %d, the workload made 5", who, sends, conn)
		}
		if !client && !slices.Contains(types, "sock_recv") {
			t.Errorf("%s: no sock_recv on the server's connection %d: %v", who, conn, types)
		}
		return mine
	}
	life("root", rootEvs, rootClientConn, true)
	life("root", rootEvs, rootServerConn, false)
	// The user gets exactly what root gets of its connections: each
	// event, in the same order.
	for _, conn := range []uint64{userClientConn, userServerConn} {
		client := conn == userClientConn
		// Root gets an accepted connection's first events before its
		// owner is known, so without it; the user gets them once it is.
		strip := func(evs []orderedEvent) []orderedEvent {
			for i := range evs {
				evs[i].OwnerUID, evs[i].LagNs = 0, 0
			}
			return evs
		}
		if got, want := strip(life("the user", userEvs, conn, client)), strip(life("root", rootEvs, conn, client)); !slices.Equal(got, want) {
			t.Errorf("connection %d: the user got %d events, root %d:\n%v\n%v", conn, len(got), len(want), got, want)
		}
	}
	for _, e := range userEvs {
		if e.Conn == 0 || e.OwnerUID != int64(uid) {
			t.Errorf("the user got %s of connection %d (owner uid %d): not its own", e.Type, e.Conn, e.OwnerUID)
		}
		if e.Conn == rootClientConn || e.Conn == rootServerConn {
			t.Errorf("the user got %s of root's connection %d", e.Type, e.Conn)
		}
	}
	// Latency: root's events are never held, and wait at most for the
	// hand-over after the recorder's pass that follows them (25 ms
	// apart), plus the stream's write gap; a user's wait at most holdFor
	// more. The bounds below leave 200 ms for a machine other tests load.
	maxLag := func(evs []orderedEvent) (lag time.Duration) {
		for _, e := range evs {
			lag = max(lag, time.Duration(e.LagNs))
		}
		return lag
	}
	rootLag, userLag := maxLag(rootEvs), maxLag(userEvs)
	if rootLag > 250*time.Millisecond {
		t.Errorf("root got an event %v after it happened", rootLag)
	}
	if userLag > time.Duration(holdFor)+250*time.Millisecond {
		t.Errorf("the user got an event %v after it happened", userLag)
	}
	t.Logf("root's stream: %d events, at most %v after they happened; the user's: %d, at most %v", len(rootEvs), rootLag, len(userEvs), userLag)
}

// TestUserWatch: `magnet watch --json` run by an unprivileged user, as the
// user would type it, shows the lifecycle of the user's own connections
// (conn_open and conn_close of both ends of its transfer, and of its
// listener's conn_open) and nothing of root's transfer beside it.
func TestUserWatch(t *testing.T) {
	ul := newUserLab(t, "mgwat")
	td := startReal(t, func(c *Config) { c.Filter.Cgroup = ul.cg.path })
	c := td.client(t)
	cmd := exec.Command("setpriv", "--reuid="+ul.u.Uid, "--regid="+ul.u.Gid, "--clear-groups",
		magnetBin, "watch", "--socket", td.sock, "--json", "--types", "conn_open,conn_close")
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	watchdog := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	defer watchdog.Stop()
	for must[*magnetclient.Status](t)(c.Status(context.Background())).Subscribers == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	userPort := ul.transfer(true)
	rootPort := ul.transfer(false)
	// A last transfer of the user's: its stream is in time order, so
	// once both its conn_close are out, anything of root's transfer
	// before it would be out too.
	lastPort := ul.transfer(true)
	lines := bufio.NewScanner(stdout)
	seen := map[string]int{}
	for seen["last client conn_close"] == 0 || seen["last server conn_close"] == 0 {
		if !lines.Scan() {
			t.Fatalf("watch ended early (%v) having shown %v", lines.Err(), seen)
		}
		var m magnetclient.Message
		if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
			t.Fatalf("watch line %q: %v", lines.Text(), err)
		}
		e := m.Event
		if e == nil {
			continue
		}
		if e.Owner == nil || e.Owner.UID != int64(ul.uid) {
			t.Errorf("the user's watch showed %s of connection %d (%s %s), owner %+v", e.Type, e.Conn, e.Local, e.Remote, e.Owner)
		}
		for who, p := range map[string]uint16{"user": userPort, "root": rootPort, "last": lastPort} {
			srv := net.JoinHostPort(ul.lab.Server.Addr.String(), strconv.Itoa(int(p)))
			switch {
			case e.Remote == srv:
				seen[who+" client "+e.Type]++
			case e.Local == srv && strings.HasPrefix(e.Remote, ul.lab.Client.Addr.String()+":"):
				seen[who+" server "+e.Type]++
			case e.Local == srv:
				seen[who+" listener "+e.Type]++
			}
		}
	}
	cmd.Process.Signal(os.Interrupt)
	go io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("watch after SIGINT: %v", err)
	}
	for k := range seen {
		if strings.HasPrefix(k, "last ") {
			delete(seen, k)
		}
	}
	want := map[string]int{
		"user client conn_open": 1, "user client conn_close": 1,
		"user server conn_open": 1, "user server conn_close": 1,
		// workload serve ends after its one connection.
		"user listener conn_open": 1, "user listener conn_close": 1,
	}
	if !maps.Equal(seen, want) {
		t.Errorf("the user's watch showed %v, want %v", seen, want)
	}
}
