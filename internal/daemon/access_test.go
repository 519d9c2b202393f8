// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// requestsEnv makes this test binary act as requestClient.
const requestsEnv = "MAGNET_DAEMON_TEST_REQUESTS"

// requestClient sends the requests of its stdin's lines ("GET /v1/events?…")
// to the daemon's socket, one connection each, and prints each answer's
// status; a stream that is answered 200 stays open until stdin ends, so
// that it holds its subscription. "NEXT" prints the next event line of the
// last stream.
func requestClient() int {
	sock := os.Getenv(requestsEnv)
	var open []io.Closer
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	var last *bufio.Reader
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "NEXT" {
			for last != nil {
				line, err := last.ReadString('\n')
				if err != nil {
					fmt.Fprintln(os.Stderr, "request client:", err)
					return 1
				}
				if strings.HasPrefix(line, `{"event"`) {
					fmt.Print(line)
					break
				}
			}
			continue
		}
		method, path, _ := strings.Cut(in.Text(), " ")
		conn, err := net.Dial("unix", sock)
		if err != nil {
			fmt.Fprintln(os.Stderr, "request client:", err)
			return 1
		}
		open = append(open, conn)
		fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: magnet\r\nContent-Length: 0\r\n\r\n", method, path)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, "request client:", err)
			return 1
		}
		last = bufio.NewReader(resp.Body)
		fmt.Println(resp.StatusCode)
	}
	return 0
}

// asUser runs requestClient as uid against the daemon's socket; send
// writes one request line and returns its status.
type asUser struct {
	in  io.WriteCloser
	out *bufio.Reader
	cmd *exec.Cmd
}

func runAs(t *testing.T, sock string, uid uint32) *asUser {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: connects to the daemon as other users")
	}
	cmd := exec.Command(testBin)
	cmd.Env = append(os.Environ(), requestsEnv+"="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	u := &asUser{in: in, out: bufio.NewReader(out), cmd: cmd}
	t.Cleanup(u.close)
	return u
}

func (u *asUser) send(t *testing.T, line string) int {
	t.Helper()
	fmt.Fprintln(u.in, line)
	s, err := u.out.ReadString('\n')
	if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(s))
	return n
}

// close ends the client and with it every stream it holds.
func (u *asUser) close() {
	if u.cmd == nil {
		return
	}
	u.in.Close()
	u.cmd.Wait()
	u.cmd = nil
}

// TestPerUserLimit: one user cannot hold every subscription; others, and
// root, still subscribe; a user's streams ended free its share.
func TestPerUserLimit(t *testing.T) {
	td := startFake(t, func(c *Config) { c.Subscribers.Max = 8; c.Subscribers.PerUser = 3 })
	a := runAs(t, td.sock, 60101)
	for i := range 3 {
		if got := a.send(t, "GET /v1/events"); got != 200 {
			t.Fatalf("user A's subscription %d: %d", i+1, got)
		}
	}
	if got := a.send(t, "GET /v1/events"); got != http.StatusTooManyRequests {
		t.Errorf("user A's fourth subscription: %d, want 429", got)
	}
	if got := a.send(t, "GET /v1/figures?every=1s"); got != http.StatusTooManyRequests {
		t.Errorf("user A's figure stream past its share: %d, want 429", got)
	}
	b := runAs(t, td.sock, 60102)
	if got := b.send(t, "GET /v1/events"); got != 200 {
		t.Errorf("user B after A took its share: %d, want 200", got)
	}
	s, err := td.client(t).Subscribe(context.Background(), magnetclient.Filter{}, 0)
	if err != nil {
		t.Errorf("root after the users: %v", err)
	} else {
		s.Close()
	}
	a.close()
	a = runAs(t, td.sock, 60101)
	if got := a.send(t, "GET /v1/events"); got != 200 {
		t.Errorf("user A after its streams ended: %d, want 200", got)
	}
}

// TestCostlyGroupsNeedPrivilege: groups that cost every connection on
// the host are switched on by root, or by users when the configuration
// says so; the rate group (top's delivery figures) by anyone.
func TestCostlyGroupsNeedPrivilege(t *testing.T) {
	td := startFake(t, nil)
	u := runAs(t, td.sock, 60103)
	for _, tc := range []struct {
		req  string
		want int
	}{
		{"GET /v1/events?groups=headers", http.StatusForbidden},
		{"GET /v1/events?types=sched_switch", http.StatusForbidden},
		{"GET /v1/events?groups=ip", http.StatusForbidden},
		{"GET /v1/events?types=sock_recv", 200},
		{"GET /v1/events?groups=rate", 200},
		{"GET /v1/connections?delivery=true", 200},
		{"GET /v1/figures?every=1s&delivery=true", 200},
	} {
		if got := u.send(t, tc.req); got != tc.want {
			t.Errorf("user: %s: %d, want %d", tc.req, got, tc.want)
		}
	}
	if en := td.d.hub.enabled.Load(); event.Group(en)&(event.GroupHeaders|event.GroupSched|event.GroupIP) != 0 {
		t.Errorf("a user's refused request enabled %s", event.Group(en))
	}
	if s, err := td.client(t).Subscribe(context.Background(), magnetclient.Filter{Groups: []string{"headers"}}, 0); err != nil {
		t.Errorf("root: headers: %v", err)
	} else {
		s.Close()
	}

	td2 := startFake(t, func(c *Config) { c.Access.UserGroups = "sched"; c.Events.Baseline = "sock,tcp" })
	u2 := runAs(t, td2.sock, 60103)
	for _, tc := range []struct {
		req  string
		want int
	}{
		{"GET /v1/events?groups=sched", 200},
		{"GET /v1/events?groups=rate", http.StatusForbidden},
		{"GET /v1/connections?delivery=true", http.StatusForbidden},
		{"GET /v1/events?groups=dev", http.StatusForbidden}, // not in this baseline
	} {
		if got := u2.send(t, tc.req); got != tc.want {
			t.Errorf("user, user_groups sched: %s: %d, want %d", tc.req, got, tc.want)
		}
	}
}

// next reads the next event of the client's last stream.
func (u *asUser) next(t *testing.T) magnetclient.Event {
	t.Helper()
	fmt.Fprintln(u.in, "NEXT")
	line, err := u.out.ReadString('\n')
	if err != nil {
		t.Fatalf("next event: %v", err)
	}
	var m magnetclient.Message
	if err := json.Unmarshal([]byte(line), &m); err != nil || m.Event == nil {
		t.Fatalf("next event: %q: %v", line, err)
	}
	return *m.Event
}

// TestTaskMasking: a user sees the events of its own connection, but not
// the tasks of other users they ran in (a softirq runs in whatever task it
// interrupted), nor the other task of a scheduler event; root sees both.
func TestTaskMasking(t *testing.T) {
	td := startFake(t, func(c *Config) { c.Access.UserGroups = "rate,sched" })
	const uid = 60105
	f := td.fake
	t0 := monotonicNs()
	f.send(f.rec(t, "task", t0, 0, 300, 0, map[string]any{"pid": 300, "uid": 0, "comm": "rootd"}))
	f.send(f.connOpen(t, 9, 200, 200, uid, "userapp", "10.0.0.2:5000", "10.0.0.1:6000", t0)...)
	f.send(f.rec(t, "sock_send", t0+1, 9, 200, 100, nil)) // makes userapp the owner
	waitProcessed(t, td.client(t))

	u := runAs(t, td.sock, uid)
	if got := u.send(t, "GET /v1/events?types=sock_send,tcp_rcv,sched_switch"); got != 200 {
		t.Fatalf("subscribe: %d", got)
	}
	byExpr := runAs(t, td.sock, uid)
	if got := byExpr.send(t, "GET /v1/events?expr="+url.QueryEscape(`comm == "rootd" || pid == 300 || type == "sock_send"`)); got != 200 {
		t.Fatalf("subscribe: %d", got)
	}
	root := collect(must[*magnetclient.Stream](t)(td.client(t).Subscribe(context.Background(), magnetclient.Filter{Types: []string{"tcp_rcv", "sched_switch"}}, 0)))
	f.send(f.rec(t, "sock_send", t0+2, 9, 200, 100, nil))
	f.send(f.rec(t, "tcp_rcv", t0+3, 9, 300, 100, nil)) // softirq in rootd
	f.send(f.rec(t, "sched_switch", t0+4, 0, 200, 0, map[string]any{"next_tid": 300, "next_pid": 300, "next_comm": "rootd"}))
	f.send(f.rec(t, "tcp_rcv", t0+5, 9, 200, 100, nil)) // softirq in userapp
	f.send(f.rec(t, "sock_send", t0+6, 9, 200, 100, nil))

	if e := u.next(t); e.Type != "sock_send" || e.PID != 200 || e.Comm != "userapp" {
		t.Errorf("own task: %+v", e)
	}
	if e := u.next(t); e.Type != "tcp_rcv" || e.Conn != 9 || e.PID != 0 || e.TID != 0 || e.Comm != "" || e.Owner == nil || e.Owner.Comm != "userapp" {
		t.Errorf("root's task on the user's connection: %+v, want pid 0, comm empty", e)
	}
	if e := u.next(t); e.Type != "sched_switch" || e.PID != 200 || e.Fields["next_comm"] != "" || fmt.Sprint(e.Fields["next_pid"]) != "0" || fmt.Sprint(e.Fields["next_tid"]) != "0" {
		t.Errorf("root's task switched to: %+v, want next_* zero", e)
	}
	if e := u.next(t); e.Type != "tcp_rcv" || e.PID != 200 || e.Comm != "userapp" {
		t.Errorf("own task in softirq: %+v", e)
	}
	// The expression sees what the stream shows: only its own sends match.
	for range 2 {
		if e := byExpr.next(t); e.Type != "sock_send" {
			t.Errorf("expression on masked fields matched %+v", e)
		}
	}
	evs, _ := root.events(t, 3)
	if evs[0].Comm != "rootd" || evs[0].PID != 300 || evs[1].Fields["next_comm"] != "rootd" {
		t.Errorf("root sees %+v", evs)
	}
}
