// SPDX-License-Identifier: Apache-2.0

package topcmd

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// fakeDaemon answers /v1/connections on a Unix socket with conns, and
// records the query it was asked.
func fakeDaemon(t *testing.T, conns []magnetclient.Connection) (socket string, query *string) {
	t.Helper()
	socket = filepath.Join(t.TempDir(), "magnet.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	query = new(string)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/connections" {
			http.Error(w, `{"error":"no such path"}`, http.StatusNotFound)
			return
		}
		*query = r.URL.RawQuery
		json.NewEncoder(w).Encode(magnetclient.ConnectionList{NowNs: 1, Connections: conns})
	}))
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return socket, query
}

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := New()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestOnce(t *testing.T) {
	c := magnetclient.Connection{ID: 7, Proto: "tcp", Local: "10.200.0.1:40000", Remote: "10.200.0.2:5201",
		Owner: &magnetclient.Owner{PID: 42, Comm: "sender"},
		State: &magnetclient.TCPState{Cwnd: 20, SrttUs: 300}}
	c.App.Send.ByTime.BPS = 1e8
	socket, query := fakeDaemon(t, []magnetclient.Connection{c})

	out, err := run(t, "--socket", socket, "--port", "5201", "--window", "500ms", "--sort", "srtt")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "SRTTv") ||
		!strings.Contains(lines[1], " 7   42  sender  10.200.0.1:40000  10.200.0.2:5201  100.0M") {
		t.Fatalf("output (not a terminal, so printed once):\n%s", out)
	}
	if *query != "delivery=true&ports=5201&window=500ms" {
		t.Fatalf("query %q, want the port filter and the window", *query)
	}

	out, err = run(t, "--socket", socket, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got []magnetclient.Connection
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 1 || got[0].ID != 7 {
		t.Fatalf("--json: %v %+v\n%s", err, got, out)
	}
}

func TestBadFlags(t *testing.T) {
	socket, _ := fakeDaemon(t, nil)
	for args, want := range map[string]string{
		"--sort nope":                   `unknown column "nope"`,
		"--port 0":                      "--port 0",
		"--interval 1ms":                "at least 100ms",
		"--token-file /nonexistent/tok": "read token",
	} {
		_, err := run(t, append([]string{"--socket", socket}, strings.Fields(args)...)...)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %v, want one line with %q", args, err, want)
		}
	}
	_, err := run(t, "--socket", filepath.Join(t.TempDir(), "none.sock"))
	if err == nil || !strings.Contains(err.Error(), "is magnet daemon running?") {
		t.Fatalf("no daemon: %v", err)
	}
}
