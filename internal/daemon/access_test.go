// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
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
// that it holds its subscription.
func requestClient() int {
	sock := os.Getenv(requestsEnv)
	var open []io.Closer
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
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
