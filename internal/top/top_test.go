// SPDX-License-Identifier: Apache-2.0

package top

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// conns are three connections as the daemon's API gives them.
func conns() []magnetclient.Connection {
	bulk := magnetclient.Connection{
		ID: 8193, Proto: "tcp", Local: "10.200.0.1:43210", Remote: "10.200.0.2:5201",
		Owner: &magnetclient.Owner{PID: 5120, Comm: "iperf3", UID: 1000},
		State: &magnetclient.TCPState{State: "ESTABLISHED", Cwnd: 310, SrttUs: 1840, Lost: 5,
			DeliveryRateBPS: 9.41e8},
		// Per-ACK samples: the window's mean of those not app-limited wins
		// over the last tcp_state's sample.
		Delivery: &magnetclient.Delivery{Samples: 900, Window: magnetclient.DeliveryWindow{Samples: 850, MeanBPS: 9.38e8, MaxBPS: 2e9},
			Last: magnetclient.DeliverySample{BPS: 9.5e8}},
		Retransmits: magnetclient.Retransmits{Count: 3},
		Drops:       magnetclient.Drops{Count: 1},
	}
	bulk.App.Send.ByTime.BPS = 9.3e8
	bulk.Wire.Send.ByTime.BPS = 9.6e8
	bulk.Wire.Recv.ByTime.BPS = 1.2e7

	chat := magnetclient.Connection{
		ID: 4097, Proto: "tcp", Local: "127.0.0.1:22", Remote: "127.0.0.1:51000",
		Owner: &magnetclient.Owner{PID: 77, Comm: "sshd", UID: 0},
		State: &magnetclient.TCPState{State: "ESTABLISHED", Cwnd: 10, SrttUs: 25000,
			DeliveryRateBPS: 2.5e5, DeliveryAppLimited: true},
	}
	chat.App.Recv.ByTime.BPS = 1500
	chat.App.Send.ByTime.BPS = 2500

	closed := magnetclient.Connection{ID: 12, Proto: "udp", Local: "10.0.0.1:53", Remote: "10.0.0.2:40000", CloseNs: 5}
	return []magnetclient.Connection{bulk, chat, closed}
}

func rows() []Row {
	var rs []Row
	for _, c := range conns() {
		rs = append(rs, RowOf(c))
	}
	return rs
}

func TestRender(t *testing.T) {
	rs := rows()
	DefaultOrder.Sort(rs)
	got := strings.Join(Render(rs, DefaultOrder, 0), "\n")
	want := strings.Join([]string{
		"  ID   PID  COMM    LOCAL             REMOTE             APPv    WIRE  DELIVERY  CWND    SRTT  RETRANS  LOST  DROPS  STATE",
		"8193  5120  iperf3  10.200.0.1:43210  10.200.0.2:5201  930.0M  972.0M   938.0M    310  1840us        3     5      1  ESTABLISHED",
		"4097    77  sshd    127.0.0.1:22      127.0.0.1:51000    4.0k       0   250.0k*    10  25.0ms        0     0      0  ESTABLISHED",
		"  12     -          10.0.0.1:53       10.0.0.2:40000        0       0         -     -       -        0     -      0  closed",
	}, "\n")
	if got != want {
		t.Fatalf("table:\n%s\nwant:\n%s", got, want)
	}
}

func TestRenderCutsToWidth(t *testing.T) {
	for _, l := range Render(rows(), DefaultOrder, 40) {
		if len(l) > 40 {
			t.Fatalf("line of %d characters, want at most 40: %q", len(l), l)
		}
	}
}

func TestSort(t *testing.T) {
	ids := func(rs []Row) []uint64 {
		var out []uint64
		for _, r := range rs {
			out = append(out, r.ID)
		}
		return out
	}
	cases := []struct {
		column string
		desc   bool
		want   []uint64
	}{
		{"app", true, []uint64{8193, 4097, 12}},
		{"app", false, []uint64{12, 4097, 8193}},
		{"id", false, []uint64{12, 4097, 8193}},
		{"srtt", true, []uint64{4097, 8193, 12}},
		{"comm", false, []uint64{12, 8193, 4097}},   // "" < "iperf3" < "sshd"
		{"retrans", true, []uint64{8193, 12, 4097}}, // ties by id
	}
	for _, c := range cases {
		i, err := ColumnIndex(c.column)
		if err != nil {
			t.Fatal(err)
		}
		rs := rows()
		Order{By: i, Desc: c.desc}.Sort(rs)
		if got := ids(rs); !equal(got, c.want) {
			t.Errorf("sort by %s desc=%v: %v, want %v", c.column, c.desc, got, c.want)
		}
	}
	if _, err := ColumnIndex("bogus"); err == nil || !strings.Contains(err.Error(), "wire") {
		t.Fatalf("unknown column: %v", err)
	}
}

func TestOrderNext(t *testing.T) {
	o := Order{By: 0, Desc: true}
	if got := o.Next(-1); got.By != len(Columns)-1 || got.Desc {
		t.Fatalf("left of the first column: %+v, want the last (text, ascending)", got)
	}
	if got := DefaultOrder.Next(1); Columns[got.By].Name != "WIRE" || !got.Desc {
		t.Fatalf("right of APP: %+v, want WIRE descending", got)
	}
}

func TestParseKeys(t *testing.T) {
	keys, rest := parseKeys([]byte("r>\x1b[D\x1b[C q\x1b["))
	want := []int{keyReverse, keyRight, keyLeft, keyRight, keyRefresh, keyQuit}
	if !equal(keys, want) || string(rest) != "\x1b[" {
		t.Fatalf("keys %v rest %q, want %v and an incomplete escape", keys, rest, want)
	}
	keys, rest = parseKeys(append(rest, 'D'))
	if !equal(keys, []int{keyLeft}) || len(rest) != 0 {
		t.Fatalf("completed escape: %v rest %q", keys, rest)
	}
	if keys, _ := parseKeys([]byte{3}); !equal(keys, []int{keyQuit}) {
		t.Fatalf("Ctrl-C: %v", keys)
	}
}

// syncBuffer is a bytes.Buffer safe for Run's writes and the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
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

// waitFor polls cond; Run draws asynchronously.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRun(t *testing.T) {
	var calls sync.WaitGroup
	calls.Add(1)
	var once sync.Once
	fail := true
	var mu sync.Mutex
	src := SourceFunc(func(ctx context.Context) ([]magnetclient.Connection, error) {
		once.Do(calls.Done)
		mu.Lock()
		defer mu.Unlock()
		if fail {
			fail = false
			return nil, errors.New("connect: no such\nfile")
		}
		return conns(), nil
	})
	keysR, keysW := io.Pipe()
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- Run(context.Background(), src, keysR, out, Options{
			Interval: 20 * time.Millisecond, Order: DefaultOrder,
			Size:  func() (int, int) { return 200, 5 },
			Where: "/run/magnet.sock",
			Now:   func() time.Time { return time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC) },
		})
	}()
	waitFor(t, "the error line", func() bool {
		return strings.Contains(out.String(), "error: connect: no such file (retrying)")
	})
	waitFor(t, "the table", func() bool { return strings.Contains(out.String(), "8193  5120  iperf3") })
	if !strings.Contains(out.String(), "magnet top  /run/magnet.sock  03:04:05  3 connections (2 open)  sort APP desc") {
		t.Fatalf("no title in:\n%q", out.String())
	}
	keysW.Write([]byte(">"))
	waitFor(t, "sorting by WIRE", func() bool { return strings.Contains(out.String(), "sort WIRE desc") })
	keysW.Write([]byte("r"))
	waitFor(t, "ascending", func() bool { return strings.Contains(out.String(), "sort WIRE asc") })

	// The last frame is cut to the terminal's 5 lines: title, keys, header
	// and two rows.
	s := out.String()
	last := s[strings.LastIndex(s, "\x1b[H")+3:]
	if n := strings.Count(last, "\r\n") + 1; n != 5 {
		t.Fatalf("last frame has %d lines, want 5:\n%q", n, last)
	}
	keysW.Write([]byte("q"))
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("q did not end Run")
	}
	if !strings.HasPrefix(out.String(), "\x1b[?1049h") || !strings.HasSuffix(out.String(), "\x1b[?25h\x1b[?1049l") {
		t.Fatal("the alternate screen is not entered and left")
	}
	keysW.Close()
}

func TestRate(t *testing.T) {
	for bps, want := range map[float64]string{0: "0", -1: "0", 999: "999", 1000: "1.0k", 9.4e8: "940.0M", 1.25e9: "1.25G"} {
		if got := Rate(bps); got != want {
			t.Errorf("Rate(%g) = %q, want %q", bps, got, want)
		}
	}
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzParseKeys feeds arbitrary terminal input: no panic, and whatever is
// left over is a prefix of an escape sequence, at most two bytes.
func FuzzParseKeys(f *testing.F) {
	for _, s := range []string{"q", "\x1b[C\x1b[D", "\x1b", "\x1b[", "\x1bx", "r<> ,.hl\x03"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, rest := parseKeys(b)
		for _, k := range keys {
			if k < keyQuit || k > keyRefresh {
				t.Fatalf("key %d out of range", k)
			}
		}
		if len(rest) > 2 || len(rest) > 0 && rest[0] != 0x1b {
			t.Fatalf("left over %q", rest)
		}
	})
}
