// SPDX-License-Identifier: Apache-2.0

package evselect

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/trace"
)

func TestSplitArgs(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.mgt"), filepath.Join(dir, "b.mgt")
	for _, p := range []string{a, b} {
		os.WriteFile(p, nil, 0o644)
	}
	for _, tc := range []struct {
		args   []string
		dash   int
		traces string
		expr   string
	}{
		{[]string{a}, -1, a, ""},
		{[]string{a, b}, -1, a + "," + b, ""},
		{[]string{a, "tcp", "port", "80"}, -1, a, "tcp port 80"},
		{[]string{a, b, "host 10.0.0.1"}, -1, a + "," + b, "host 10.0.0.1"},
		{[]string{dir, "udp"}, -1, dir, "udp"},
		{[]string{"s3://bucket/x", "udp"}, -1, "s3://bucket/x", "udp"},
		// After "--" everything is the expression, even a file's name.
		{[]string{a, b, "udp"}, 1, a, b + " udp"},
		{[]string{"missing.mgt", "udp"}, -1, "", "missing.mgt udp"},
	} {
		tr, e := SplitArgs(tc.args, tc.dash)
		if strings.Join(tr, ",") != tc.traces || e != tc.expr {
			t.Errorf("%q dash %d: traces %q expr %q, want %q %q", tc.args, tc.dash, tr, e, tc.traces, tc.expr)
		}
	}
	if _, err := ParsePcap("missing.mgt udp"); err == nil || !strings.Contains(err.Error(), "missing.mgt: no such file") {
		t.Errorf("a missing trace reads as %v", err)
	}
	if _, err := ParsePcap("./x udp"); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("a missing path reads as %v", err)
	}
}

// A name no trace has is an error, not an empty result.
func TestUnknownNames(t *testing.T) {
	in := []trace.Source{{Name: "bigendian.mgt", Paths: []string{"../../testdata/bigendian.mgt"}}}
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Types: []string{"tcp_xmit", "tcp_xmt"}}, `unknown event type "tcp_xmt" (the traces have `},
		{Options{Groups: []string{"bogus"}}, `unknown event group "bogus"`},
		{Options{Expr: "fields.srtt > 1"}, `--filter: column 8: no event in the traces has a field "srtt"`},
		{Options{Expr: `size > 0 && fields["nope"] == 1`}, `column 21: no event in the traces has a field "nope"`},
		{Options{Expr: "nosuchvar == 1"}, "undeclared reference to 'nosuchvar'"},
		{Options{Expr: "size +"}, "--filter: bad filter: expr: column 7: "},
	} {
		_, err := New(in, tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%+v: %v, want one line with %q", tc.opts, err, tc.want)
		}
	}
	s, err := New(in, Options{Expr: "fields.seq > 0 && comm == 'curl'", Types: []string{"tcp_xmit"}})
	if err != nil {
		t.Fatal(err)
	}
	s.Apply(in)
	r, err := in[0].Open()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	n := 0
	for {
		rec, err := r.Next()
		if err != nil {
			break
		}
		if name := rec.Type.Name; name != "task" && name != "iface" {
			if name != "tcp_xmit" {
				t.Errorf("selected a %s record", name)
			}
			n++
		}
	}
	if n == 0 {
		t.Error("selected no tcp_xmit of curl")
	}
}

// Live, fed a trace's records in order as the recorder's drain feeds it,
// keeps the events the readers' selection keeps, and every control record.
func TestLiveEqualsReaders(t *testing.T) {
	path := "../../testdata/bigendian.mgt"
	for _, expr := range []string{"size > 0", `comm == "curl" && type == "tcp_xmit"`, `rport == 80 && fields.retrans == 1`} {
		in := []trace.Source{{Name: path, Paths: []string{path}}}
		s, err := New(in, Options{Expr: expr})
		if err != nil {
			t.Fatal(err)
		}
		s.Apply(in)
		want := readEvents(t, in[0])
		r, err := trace.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		l, err := NewLive(r.Header(), expr)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		all := 0
		for {
			rec, err := r.Next()
			if err != nil {
				break
			}
			keep := l.Keep(rec)
			if Control(rec.Type.Name) {
				if !keep {
					t.Errorf("%q: left out a %s record", expr, rec.Type.Name)
				}
				continue
			}
			all++
			if keep {
				got = append(got, fmt.Sprint(rec.Type.Name, rec.Time(), rec.Conn()))
			}
		}
		r.Close()
		if len(want) == 0 || len(want) == all {
			t.Fatalf("%q selects %d of %d events: the test needs some of each", expr, len(want), all)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%q: Live kept %d events, the readers %d", expr, len(got), len(want))
		}
	}
	if _, err := NewLive(&trace.Header{}, "size >"); err == nil || !strings.Contains(err.Error(), "--filter: bad filter") {
		t.Errorf("bad expression: %v", err)
	}
}

func readEvents(t *testing.T, in trace.Source) []string {
	t.Helper()
	r, err := in.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var evs []string
	for {
		rec, err := r.Next()
		if err != nil {
			break
		}
		if !Control(rec.Type.Name) {
			evs = append(evs, fmt.Sprint(rec.Type.Name, rec.Time(), rec.Conn()))
		}
	}
	return evs
}
