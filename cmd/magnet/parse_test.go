// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/internal/tracegen"
)

// eventLines returns the lines of a parse after its header line.
func eventLines(t *testing.T, r result) []string {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("parse: exit %d: %s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	return lines[1:]
}

// TestParseSeveral: a sender's and a receiver's trace printed as one
// timeline, each line naming its trace, every record once; --file-order
// prints them one after the other as stored.
func TestParseSeveral(t *testing.T) {
	dir := t.TempDir()
	snd, rcv := filepath.Join(dir, "snd.mgt"), filepath.Join(dir, "rcv.mgt")
	fs, err := os.Create(snd)
	if err != nil {
		t.Fatal(err)
	}
	fr, err := os.Create(rcv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tracegen.WritePair(fs, fr, tracegen.Options{Events: 20_000, Conns: 2}); err != nil {
		t.Fatal(err)
	}
	fs.Close()
	fr.Close()
	one := map[string][]string{"snd.mgt": eventLines(t, magnet(t, "parse", "--time", "raw", snd)), "rcv.mgt": eventLines(t, magnet(t, "parse", "--time", "raw", rcv))}

	r := magnet(t, "parse", "--time", "raw", snd, rcv)
	if !strings.HasPrefix(r.stdout, "trace\ttime\tcpu\t") || strings.Contains(r.stderr, "warning") {
		t.Fatalf("parse of two traces: header %q, stderr %q", strings.SplitN(r.stdout, "\n", 2)[0], r.stderr)
	}
	merged := eventLines(t, r)
	if len(merged) != len(one["snd.mgt"])+len(one["rcv.mgt"]) {
		t.Fatalf("%d lines, want %d + %d", len(merged), len(one["snd.mgt"]), len(one["rcv.mgt"]))
	}
	// The two traces share one clock (one machine): raw times never go
	// back, and each trace's lines keep their own order.
	var last uint64
	got := map[string][]string{}
	for i, l := range merged {
		name, rest, _ := strings.Cut(l, "\t")
		ts, _ := strconv.ParseUint(strings.SplitN(rest, "\t", 2)[0], 10, 64)
		if ts < last {
			t.Fatalf("line %d: time %d after %d", i+2, ts, last)
		}
		last = ts
		got[name] = append(got[name], rest)
	}
	for name, want := range one {
		if !slices.Equal(got[name], want) {
			t.Errorf("%s: its lines in the merge differ from its own parse", name)
		}
	}
	fo := eventLines(t, magnet(t, "parse", "--file-order", "--time", "raw", snd, rcv))
	if n := len(one["snd.mgt"]); len(fo) != len(merged) || fo[0] != "snd.mgt\t"+one["snd.mgt"][0] || fo[n] != "rcv.mgt\t"+one["rcv.mgt"][0] {
		t.Errorf("--file-order: not the sender's lines then the receiver's")
	}
	oneLineError(t, magnet(t, "parse", "--types", "tcp_xmit,bogus", snd, rcv), `unknown event type "bogus"`)
	if r := magnet(t, "parse", "--types", "sock_send", "--conn", strconv.FormatUint(tracegen.ConnID(1, false), 10), snd, rcv); r.code != 0 || strings.Count(r.stdout, "\tsock_send\t") == 0 || strings.Count(r.stdout, "\n") != strings.Count(r.stdout, "\tsock_send\t")+1 {
		t.Errorf("--types --conn over two traces: exit %d, %d lines", r.code, strings.Count(r.stdout, "\n"))
	}
	// --events, the old name of --types, still selects types, and says so.
	if a, b := magnet(t, "parse", "--events", "sock_send", snd), magnet(t, "parse", "--types", "sock_send", snd); a.code != 0 || a.stdout != b.stdout || !strings.Contains(a.stderr, "use --types") {
		t.Errorf("parse --events: exit %d, same output %v, stderr %q", a.code, a.stdout == b.stdout, a.stderr)
	}
}

// TestParseLate: a record stored further out of time order than the
// reorder window is printed late, with a warning that counts it.
func TestParseLate(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "s.mgt"), filepath.Join(dir, "late.mgt")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tracegen.Write(f, tracegen.Options{Events: 5000, Conns: 1}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// Copy the trace with its 100th record moved 3,000 records later.
	r, err := trace.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var recs [][]byte
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, slices.Clone(rec.Data))
	}
	moved := recs[100]
	recs = slices.Insert(slices.Delete(recs, 100, 101), 3100, moved)
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	w, err := trace.NewWriter(out, r.Header(), trace.WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range recs {
		if err := w.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(&trace.Summary{}); err != nil {
		t.Fatal(err)
	}
	out.Close()

	p := magnet(t, "parse", dst)
	if p.code != 0 || !strings.Contains(p.stderr, "warning: 1 records were further out of time order") {
		t.Fatalf("parse: exit %d, stderr %q; want a warning counting 1 late record", p.code, p.stderr)
	}
	if fo := magnet(t, "parse", "--file-order", dst); fo.code != 0 || fo.stderr != "" {
		t.Errorf("--file-order: exit %d, stderr %q; want no warning", fo.code, fo.stderr)
	}
}
