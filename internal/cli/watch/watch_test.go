// SPDX-License-Identifier: Apache-2.0

package watch

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// TestIntegersPrintAsIntegers: a tcp_xmit's sequence number and a u64
// counter past 2^53 print as the daemon sent them, not as floats.
func TestIntegersPrintAsIntegers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Write([]byte(`{"subscribed":{"id":1,"kind":"events","groups":["sock"],"filter":{},"queue":1}}` + "\n" +
			`{"event":{"time_ns":1,"wall_ns":1700000000000000000,"type":"tcp_xmit","cpu":1,"pid":7,"tid":7,"comm":"x","netns":1,"conn":3,"size":1448,"fields":{"seq":1866730584,"big":9007199254740993,"ratio":0.5}}}` + "\n"))
	}))
	defer srv.Close()
	c, err := magnetclient.Dial("tcp://"+strings.TrimPrefix(srv.URL, "http://"), magnetclient.WithToken("0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Subscribe(context.Background(), magnetclient.Filter{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	writeText(&out, m)
	for _, want := range []string{" seq=1866730584", " big=9007199254740993", " ratio=0.5"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("line %q lacks %q", out.String(), want)
		}
	}
}
