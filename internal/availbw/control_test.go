// SPDX-License-Identifier: Apache-2.0

package availbw

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestDecodeMessage(t *testing.T) {
	good := `{"type":"stream","stream":{"id":3,"count":50,"size":1200,"gap_ns":100000}}`
	m, err := decodeMessage([]byte(good))
	if err != nil || m.Type != msgStream || m.Stream.Count != 50 || m.Stream.Rate() != 96e6 {
		t.Fatalf("decode %s: %+v, %v", good, m, err)
	}
	for _, bad := range []string{
		``,
		`{}`,
		`{"type":"launch"}`,
		`{"type":"hello","extra":1}`,
		`{"type":"hello"} {"type":"hello"}`,
		`{"type":"stream"}`,
		`{"type":"stream","stream":{"id":1,"count":0,"size":1200,"gap_ns":1000}}`,
		`{"type":"stream","stream":{"id":1,"count":5000,"size":1200,"gap_ns":1000}}`,
		`{"type":"stream","stream":{"id":1,"count":50,"size":9000,"gap_ns":1000}}`,
		`{"type":"stream","stream":{"id":1,"count":50,"size":1200,"gap_ns":0}}`,
		`{"type":"start","port":70000}`,
		`{"type":"challenge","max_rate_bps":-1}`,
		`{"type":"sent"}`,
		`{"type":"hello","nonce":"` + strings.Repeat("a", 100) + `"}`,
	} {
		if _, err := decodeMessage([]byte(bad)); !errors.Is(err, errMessage) {
			t.Errorf("decode %q: %v, want a bad-message error", bad, err)
		}
	}
}

func TestConnLimitsLineLength(t *testing.T) {
	long := strings.Repeat("x", maxMessage+10) + "\n"
	c := newConn(struct {
		io.Reader
		io.Writer
	}{strings.NewReader(long), io.Discard})
	if _, err := c.read(); !errors.Is(err, errMessage) {
		t.Fatalf("oversized line: %v, want a bad-message error", err)
	}
}

func TestConnRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	c := newConn(&buf)
	want := message{Type: msgSent, Report: &SendReport{ID: 4, Sent: 50, First: 10, Last: 20}}
	if err := c.write(want); err != nil {
		t.Fatal(err)
	}
	got, err := c.expect(msgSent)
	if err != nil || *got.Report != *want.Report {
		t.Fatalf("read back %+v, %v", got, err)
	}
	if err := c.write(message{Type: msgError, Error: "busy"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.expect(msgReady); err == nil || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("error message: %v, want the server's complaint", err)
	}
}

func TestProof(t *testing.T) {
	p := proof("s3cret", "client", "aa", "bb")
	if !validProof(p, "s3cret", "client", "aa", "bb") {
		t.Fatal("own proof rejected")
	}
	for _, tc := range []struct{ secret, role, cn, sn string }{
		{"other", "client", "aa", "bb"},  // wrong secret
		{"s3cret", "server", "aa", "bb"}, // reflected to the other side
		{"s3cret", "client", "ab", "bb"}, // another session
		{"s3cret", "client", "aa", "bc"},
	} {
		if validProof(p, tc.secret, tc.role, tc.cn, tc.sn) {
			t.Errorf("proof accepted for %+v", tc)
		}
	}
}

func FuzzDecodeMessage(f *testing.F) {
	f.Add([]byte(`{"type":"hello","version":1,"nonce":"00"}`))
	f.Add([]byte(`{"type":"stream","stream":{"id":3,"count":50,"size":1200,"gap_ns":100000}}`))
	f.Add([]byte(`{"type":"sent","report":{"id":3,"sent":50,"first_ns":1,"last_ns":2}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decodeMessage(data)
		if err != nil {
			return
		}
		// Whatever passes must be safe to act on.
		if m.Type == msgStream {
			if s := m.Stream; s.Count < 1 || s.Count > MaxStreamPackets || s.Size < MinPacketSize || s.Size > MaxPacketSize || s.GapNs <= 0 {
				t.Fatalf("accepted stream %+v", *s)
			}
		}
		if m.Port < 0 || m.Port > 65535 {
			t.Fatalf("accepted port %d", m.Port)
		}
	})
}
