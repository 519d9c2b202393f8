// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// get fetches url over TCP with the token, if any.
func get(t *testing.T, url, token string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header
}

// TestMetricsAndPageAccess: the page is public, /metrics follows the
// token unless configured public, the API always does; over the Unix
// socket /metrics is for see-all clients.
func TestMetricsAndPageAccess(t *testing.T) {
	dir := socketDir(t)
	tokFile := filepath.Join(dir, "token")
	token := "metrics-token-0123456789"
	if err := os.WriteFile(tokFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	td := startFake(t, func(c *Config) { c.Listen = "127.0.0.1:0"; c.TokenFile = tokFile; seeAll(t, c) })
	f := td.fake
	f.send(f.connOpen(t, 42, 7, 7, 1000, "sender", "10.9.0.1:40000", "10.9.0.2:5201", ms)...)
	f.send(f.rec(t, "sock_send", 2*ms, 42, 7, 65536, nil), f.rec(t, "sock_send", 3*ms, 42, 7, 65536, nil))
	base := "http://" + td.d.TCPAddr()

	code, body, h := get(t, base+"/", "")
	if code != 200 || !strings.Contains(body, "<title>magnet scope</title>") || !strings.Contains(h.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Fatalf("GET / without a token: %d %q", code, h)
	}
	if code, body, _ := get(t, base+"/nosuch", token); code != 404 || !strings.Contains(body, `"error"`) {
		t.Fatalf("GET /nosuch: %d %s", code, body)
	}
	if code, _, _ := get(t, base+"/metrics", ""); code != http.StatusUnauthorized {
		t.Fatalf("metrics without a token: %d", code)
	}
	var expo string
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(expo, `magnet_connection_bytes_total{conn="42",proto="tcp",local="10.9.0.1:40000",remote="10.9.0.2:5201",comm="sender",layer="app",dir="send"} 131072`) {
		if time.Now().After(deadline) {
			t.Fatalf("no series of connection 42 with 131072 bytes sent:\n%s", expo)
		}
		var code int
		var h http.Header
		code, expo, h = get(t, base+"/metrics", token)
		if code != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/plain; version=0.0.4") {
			t.Fatalf("metrics with the token: %d %q", code, h.Get("Content-Type"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, want := range []string{`magnet_recorder_events_total{type="sock_send"} 2`, "magnet_connections_tracked 1", "magnet_subscribers 0"} {
		if !strings.Contains(expo, want+"\n") {
			t.Errorf("no %q in\n%s", want, expo)
		}
	}
	if code, body := raw(t, td.sock, http.MethodGet, "/metrics", ""); code != 200 || !strings.Contains(body, "magnet_connections_tracked") {
		t.Fatalf("metrics over the Unix socket as root (or a see-all group): %d", code)
	}
	if code, _ := raw(t, td.sock, http.MethodPost, "/metrics", ""); code != http.StatusMethodNotAllowed {
		t.Fatalf("POST /metrics: %d", code)
	}

	// Another user over the Unix socket: no metrics (they show everyone's
	// connections).
	if curl, err := exec.LookPath("curl"); err == nil && os.Geteuid() == 0 {
		cmd := exec.Command(curl, "-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", td.sock, "http://magnet/metrics")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.Output()
		if err != nil || string(out) != "403" {
			t.Fatalf("metrics as nobody: %v %q", err, out)
		}
	}

	cfg := DefaultConfig()
	cfg.Socket, cfg.Listen, cfg.TokenFile = td.sock, "127.0.0.1:0", tokFile
	cfg.Metrics.Public = true
	if err := td.d.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := get(t, base+"/metrics", ""); code != 200 {
		t.Fatalf("public metrics without a token: %d", code)
	}
	if code, _, _ := get(t, base+"/v1/status", ""); code != http.StatusUnauthorized {
		t.Fatalf("the API without a token, metrics public: %d", code)
	}
}

func TestMetricsConfig(t *testing.T) {
	c := DefaultConfig()
	if c.Metrics.MaxConnections != 100 || c.Metrics.Public {
		t.Fatalf("defaults %+v", c.Metrics)
	}
	p := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(p, []byte("metrics:\n  max_connections: -1\n"), 0o644)
	c, err := LoadConfig(p)
	if err == nil {
		_, err = c.resolve()
	}
	if err == nil || !strings.Contains(err.Error(), "metrics.max_connections -1") {
		t.Fatalf("negative limit: %v", err)
	}
}
