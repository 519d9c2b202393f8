// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// fakeRecorder stands in for record.Run in tests that need no kernel: it
// hands the daemon the records a test writes, as the recorder would.
type fakeRecorder struct {
	hdr  *trace.Header
	recs chan []byte
}

func testHeader(t testing.TB) *trace.Header {
	t.Helper()
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		t.Fatal(err)
	}
	return &trace.Header{
		Format: trace.FormatName, Version: trace.Version, Types: types, Common: trace.CommonFields,
		Clock: trace.Clock{Source: "CLOCK_MONOTONIC", WallOffsetNs: 1_700_000_000_000_000_000},
		Enums: map[string]map[string]string{
			"tcp_state":   {"1": "ESTABLISHED", "7": "CLOSE"},
			"ca_state":    {"0": "Open"},
			"ipproto":     {"6": "tcp", "17": "udp"},
			"drop_reason": {"2": "NOT_SPECIFIED"},
		},
	}
}

func (f *fakeRecorder) run(ctx context.Context, cfg record.Config) (*record.Result, error) {
	sink, err := cfg.NewSink(f.hdr)
	if err != nil {
		return nil, err
	}
	cfg.Loaded(nil)
	cfg.Ready()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case r := <-f.recs:
			sink.Write(r)
		case <-tick.C:
			// As the recorder: everything until now is written.
			sink.(record.DrainedSink).Drained(monotonicNs())
			sink.Flush()
		case <-ctx.Done():
			for {
				select {
				case r := <-f.recs:
					sink.Write(r)
					continue
				default:
				}
				break
			}
			return &record.Result{}, sink.Close(&trace.Summary{})
		}
	}
}

// rec builds one record of type name: header fields, then named fields.
func (f *fakeRecorder) rec(t testing.TB, name string, timeNs, conn uint64, tid uint32, size int32, fields map[string]any) []byte {
	t.Helper()
	et := f.hdr.TypeByName(name)
	if et == nil {
		t.Fatalf("no type %s", name)
	}
	b := make([]byte, et.Size)
	binary.NativeEndian.PutUint64(b[0:], timeNs)
	binary.NativeEndian.PutUint64(b[8:], conn)
	binary.NativeEndian.PutUint32(b[16:], tid)
	binary.NativeEndian.PutUint32(b[20:], uint32(size))
	b[30] = et.ID
	for k, v := range fields {
		fd, ok := et.Field(k)
		if !ok {
			t.Fatalf("%s has no field %s", name, k)
		}
		switch v := v.(type) {
		case netip.Addr:
			a := v.As16()
			if v.Is4() {
				copy(b[fd.Offset:], v.AsSlice())
			} else {
				copy(b[fd.Offset:], a[:])
			}
		case string:
			copy(b[fd.Offset:fd.Offset+fd.Size], v)
		case int:
			switch fd.Size {
			case 1:
				b[fd.Offset] = byte(v)
			case 2:
				binary.NativeEndian.PutUint16(b[fd.Offset:], uint16(v))
			case 4:
				binary.NativeEndian.PutUint32(b[fd.Offset:], uint32(v))
			case 8:
				binary.NativeEndian.PutUint64(b[fd.Offset:], uint64(v))
			}
		default:
			t.Fatalf("field %s: value %T", k, v)
		}
	}
	return b
}

func (f *fakeRecorder) send(recs ...[]byte) {
	for _, r := range recs {
		f.recs <- r
	}
}

// testDaemon is a daemon on a socket in a temporary directory.
type testDaemon struct {
	d      *Daemon
	fake   *fakeRecorder
	sock   string
	cancel context.CancelFunc
	done   chan error
	log    *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// socketDir makes a directory any user can reach, for the socket.
func socketDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "magnetd-test-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// fakeHeader, if set, adjusts the fake recorder's trace header.
var fakeHeader func(*trace.Header)

// startFake runs a daemon over a fake recorder; edit adjusts the config.
// seeAll lets the user running the test see every event and connection,
// as root does, by naming its group in access.see_all_groups: a test of
// what an administrator sees then holds under any user's go test, where
// the fake recorder's events belong to nobody it owns. As root it changes
// nothing, so such a test checks root's own rule.
func seeAll(t testing.TB, c *Config) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	g, err := user.LookupGroupId(strconv.Itoa(os.Getegid()))
	if err != nil {
		t.Skipf("cannot name this user's group %d for access.see_all_groups: %v", os.Getegid(), err)
	}
	c.Access.SeeAllGroups = append(c.Access.SeeAllGroups, g.Name)
}

func startFake(t *testing.T, edit func(*Config)) *testDaemon {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Socket = filepath.Join(socketDir(t), "magnet.sock")
	if edit != nil {
		edit(&cfg)
	}
	hdr := testHeader(t)
	if fakeHeader != nil {
		fakeHeader(hdr)
	}
	td := &testDaemon{fake: &fakeRecorder{hdr: hdr, recs: make(chan []byte, 1024)}, sock: cfg.Socket, done: make(chan error, 1), log: &syncBuffer{}}
	ready := make(chan struct{})
	d, err := New(cfg, Options{Log: td.log, Ready: func() { close(ready) }, StatusDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	d.runRecorder = td.fake.run
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

func (td *testDaemon) stop(t *testing.T) {
	t.Helper()
	if td.cancel == nil {
		return
	}
	td.cancel()
	td.cancel = nil
	select {
	case err := <-td.done:
		if err != nil {
			t.Errorf("daemon: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Error("daemon did not stop")
	}
}

func (td *testDaemon) client(t *testing.T) *magnetclient.Client {
	t.Helper()
	c, err := magnetclient.Dial(td.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// raw sends one HTTP request over the socket and returns the status and
// body.
func raw(t *testing.T, sock, method, path, body string) (int, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequest(method, "http://magnet"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// connOpen makes the records of a TCP connection's announcement and its
// owner's task record.
func (f *fakeRecorder) connOpen(t testing.TB, conn uint64, tid, pid, uid uint32, comm string, local, remote string, at uint64) [][]byte {
	l, r := netip.MustParseAddrPort(local), netip.MustParseAddrPort(remote)
	return [][]byte{
		f.rec(t, "task", at, 0, tid, 0, map[string]any{"pid": int(pid), "uid": int(uid), "comm": comm}),
		f.rec(t, "conn_open", at, conn, tid, 0, map[string]any{
			"proto": 6, "family": 4, "state": 1, "lport": int(l.Port()), "rport": int(r.Port()),
			"laddr": l.Addr(), "raddr": r.Addr(),
		}),
	}
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

var _ = fmt.Sprint
