// SPDX-License-Identifier: Apache-2.0

package archive

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/internal/tracegen"
)

func TestParseTime(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 30, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"10:00":                     time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC),
		"10:00:05":                  time.Date(2025, 3, 1, 10, 0, 5, 0, time.UTC),
		"2025-02-28T23:59":          time.Date(2025, 2, 28, 23, 59, 0, 0, time.UTC),
		"2025-02-28":                time.Date(2025, 2, 28, 0, 0, 0, 0, time.UTC),
		"2025-02-28T23:59:00+01:00": time.Date(2025, 2, 28, 22, 59, 0, 0, time.UTC),
		"-1h30m":                    time.Date(2025, 3, 1, 11, 0, 0, 0, time.UTC),
	} {
		got, err := ParseTime(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("%s: %v %v, want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "noon", "25:00", "-x"} {
		if _, err := ParseTime(bad, now); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// recording writes a rotated recording of host into dir: a file every
// minute from start, each with one sock_send a second of its time.
func recording(t *testing.T, dir, host string, start time.Time, files int) {
	t.Helper()
	r := tracegen.NewRotated(t, dir, host, "%h-%Y%m%dT%H%M%S.mgt", start)
	r.EverySecond(r.Record("sock_send"), files*60)
	r.Close()
}

func count(t *testing.T, src trace.Source) int {
	t.Helper()
	r, err := src.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	n := 0
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			if len(r.Warnings()) > 0 {
				t.Fatalf("%s: %v", src.Name, r.Warnings())
			}
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Type.Name == "sock_send" {
			n++
		}
	}
}

// TestSelect: hosts and a time window pick files and events; the files of a
// recording become one chain whatever order they come in.
func TestSelect(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	recording(t, filepath.Join(dir, "a"), "a", t0, 5)
	recording(t, filepath.Join(dir, "b"), "b", t0, 5)
	es, err := Scan(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 10 { // 5 minutes of files (the interval ran out at the end: no empty sixth)
		t.Fatalf("%d traces found", len(es))
	}
	all := Select(es, Selection{})
	if len(all) != 2 || len(all[0].Entries) != 5 || all[0].Host != "a" {
		t.Fatalf("chains %+v", all)
	}
	if n := count(t, all[0].Source(Selection{})); n != 300 {
		t.Fatalf("whole chain: %d events, want 300", n)
	}
	sel := Selection{Hosts: []string{"b"}, Since: t0.Add(90 * time.Second), Until: t0.Add(150 * time.Second)}
	cs := Select(es, sel)
	if len(cs) != 1 || cs[0].Host != "b" || len(cs[0].Entries) != 2 || cs[0].Entries[0].Seq != 1 {
		t.Fatalf("selected %+v", cs)
	}
	if n := count(t, cs[0].Source(sel)); n != 60 {
		t.Fatalf("window of 60 s holds %d events", n)
	}

	// Files given one by one, in the wrong order, are one chain.
	paths := []string{es[4].Path, es[2].Path, es[3].Path}
	srcs, cleanup, err := Resolve(paths, Selection{})
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	if len(srcs) != 1 || len(srcs[0].Paths) != 3 || srcs[0].Paths[0] != es[2].Path {
		t.Fatalf("resolved %+v", srcs)
	}
	if n := count(t, srcs[0]); n != 180 {
		t.Fatalf("three files: %d events", n)
	}
	if _, _, err := Resolve([]string{dir}, Selection{Hosts: []string{"c"}}); err == nil {
		t.Fatal("an empty selection resolved")
	}
	if _, _, err := Resolve([]string{filepath.Join(dir, "nope")}, Selection{}); err == nil {
		t.Fatal("a missing path resolved")
	}
	empty := t.TempDir()
	os.WriteFile(filepath.Join(empty, "notes.txt"), []byte("x"), 0o644)
	if _, _, err := Resolve([]string{empty}, Selection{}); err == nil {
		t.Fatal("a directory without traces resolved")
	}
}

func TestParseSSH(t *testing.T) {
	s, err := ParseSSH("ssh://magnet@arch.example.org:2222/srv/magnet-archive/", []string{"IdentityFile=/k"})
	if err != nil {
		t.Fatal(err)
	}
	if s.User != "magnet" || s.Host != "arch.example.org" || s.Port != 2222 || s.Path != "/srv/magnet-archive" || s.Options[0] != "IdentityFile=/k" {
		t.Fatalf("parsed %+v", s)
	}
	if got := s.URL("web1/2025-03-01/a.mgt.zst"); got != "ssh://magnet@arch.example.org:2222/srv/magnet-archive/web1/2025-03-01/a.mgt.zst" {
		t.Fatalf("URL %s", got)
	}
	if k, err := s.key(s.URL("web1/x y.mgt.zst")); err != nil || k != "web1/x y.mgt.zst" {
		t.Fatalf("key %q %v", k, err)
	}
	if s, err := ParseSSH("ssh://[::1]/a", nil); err != nil || s.Host != "::1" || s.Port != 0 || s.User != "" {
		t.Fatalf("ipv6: %+v %v", s, err)
	}
	for u, want := range map[string]string{
		"ssh://host":              "no path",
		"ssh:///srv":              "no host",
		"ssh://-oProxyCommand=x/": "may not start with -",
		"ssh://u:pw@host/srv":     "no password",
		"ssh://host:99999/srv":    "bad port",
		"ssh://host/srv?x=1":      "no ?query",
		"sftp://host/srv":         "not an ssh:// address",
	} {
		if _, err := ParseSSH(u, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", u, err, want)
		}
	}
}
