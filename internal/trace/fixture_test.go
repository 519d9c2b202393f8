// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"bytes"
	"encoding/binary"
	"flag"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/bigendian.mgt at the repository root")

// fixturePath is the committed big-endian trace, at the repository root.
var fixturePath = filepath.Join("..", "..", "testdata", "bigendian.mgt")

// fixtureHeader is the header of the big-endian fixture: a recording of a
// short HTTP request on an s390x machine.
func fixtureHeader() *Header {
	return &Header{
		Clock:       Clock{Source: "CLOCK_MONOTONIC", ResolutionNs: 1, WallOffsetNs: 1_717_999_000_000_000_000, Kernel: "tod"},
		Host:        "zbox",
		Kernel:      "6.8.0-31-generic",
		Arch:        "s390x",
		CPUs:        4,
		CPUModel:    "IBM/S390 3931",
		StartWallNs: 1_718_000_000_000_000_000,
		Settings: Settings{
			Events:      []string{"sock", "tcp", "conn", "task"},
			BufferBytes: 8 << 20,
			Command:     []string{"curl", "-s", "http://10.0.0.2/"},
		},
		Types: magnetTypes(),
		Enums: map[string]map[string]string{"tcp_state": {"1": "ESTABLISHED", "2": "SYN_SENT", "7": "CLOSE"}},
	}
}

// fixtureRecords are the records of the big-endian fixture.
func fixtureRecords() []rec {
	const conn4, conn6 = 0x1001, 0x1002
	c := func(ts, conn, size int, more map[string]any) map[string]any {
		v := map[string]any{"time_ns": ts, "conn": conn, "tid": 3171, "size": size, "netns": 4026531840, "cpu": 2}
		for k, x := range more {
			v[k] = x
		}
		return v
	}
	return []rec{
		{"task", c(1_000_000_000, 0, 0, map[string]any{"pid": 3171, "comm": "curl"})},
		{"conn_open", c(1_000_100_000, conn4, 0, map[string]any{"proto": 6, "family": 2, "state": 1, "lport": 43210, "rport": 80,
			"laddr": netip.MustParseAddr("10.0.0.1"), "raddr": netip.MustParseAddr("10.0.0.2")})},
		{"sock_send", c(1_000_200_000, conn4, 78, nil)},
		{"tcp_xmit", c(1_000_210_000, conn4, 78, map[string]any{"seq": 2_882_400_001, "gso_segs": 1, "retrans": 0})},
		{"tcp_xmit", c(1_201_210_000, conn4, 78, map[string]any{"seq": 2_882_400_001, "gso_segs": 1, "retrans": 1, "flags": 1})},
		{"conn_open", c(1_300_000_000, conn6, 0, map[string]any{"proto": 6, "family": 10, "state": 2, "lport": 50001, "rport": 8080,
			"laddr": netip.MustParseAddr("fd00::1"), "raddr": netip.MustParseAddr("fd00::2")})},
		{"sock_send", c(1_300_500_000, conn6, -11, nil)},
		{"task", c(1_400_000_000, 0, 0, map[string]any{"pid": 3172, "comm": "a-long-command-n"})},
	}
}

// fixtureSummary is the summary the fixture's end block is written with.
var fixtureSummary = Summary{EndWallNs: 1_718_000_000_500_000_000, Lost: 3}

func writeFixture(t *testing.T) {
	h := fixtureHeader()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h, WriterOptions{ByteOrder: binary.BigEndian, BlockSize: 128})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range fixtureRecords() {
		if err := w.Write(encode(t, h, r)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(&fixtureSummary); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fixturePath, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBigEndianFixture reads the committed big-endian trace and checks every
// value in it, so that the reader keeps reading files written by earlier
// versions and by machines of the other byte order. Run it with -update to
// rewrite the file.
func TestBigEndianFixture(t *testing.T) {
	if *update {
		writeFixture(t)
	}
	file, err := os.ReadFile(fixturePath)
	if err != nil {
		t.Fatalf("%v (regenerate with: go test ./internal/trace -run TestBigEndianFixture -update)", err)
	}
	if len(file) > 4096 {
		t.Errorf("fixture is %d bytes, keep it under 4 KiB", len(file))
	}
	r, err := NewReader(bytes.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	if r.ByteOrder() != binary.BigEndian {
		t.Errorf("fixture byte order is %v, want big-endian", r.ByteOrder())
	}
	h := r.Header()
	if h.Host != "zbox" || h.Arch != "s390x" || h.Clock.WallOffsetNs != 1_717_999_000_000_000_000 {
		t.Errorf("header host %q, arch %q, wall offset %d", h.Host, h.Arch, h.Clock.WallOffsetNs)
	}
	var names []string
	for _, typ := range h.Types {
		names = append(names, typ.Name)
	}
	if want := []string{"sock_send", "tcp_xmit", "conn_open", "task"}; !reflect.DeepEqual(names, want) {
		t.Errorf("type names = %v, want %v", names, want)
	}

	want := fixtureRecords()
	var got []Record
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		rec.Data = bytes.Clone(rec.Data)
		got = append(got, rec)
	}
	if len(got) != len(want) {
		t.Fatalf("fixture holds %d records, want %d", len(got), len(want))
	}
	for i, rec := range got {
		if rec.Type.Name != want[i].typ {
			t.Errorf("record %d is %s, want %s", i, rec.Type.Name, want[i].typ)
			continue
		}
		if wantData := encode(t, h, want[i]); !bytes.Equal(rec.Data, wantData) {
			t.Errorf("record %d (%s) = %x, want %x", i, rec.Type.Name, rec.Data, wantData)
		}
	}

	// A few values spelled out, as a reader of this test would check them.
	if v, _ := got[0].Str("comm"); v != "curl" {
		t.Errorf("task comm = %q, want curl", v)
	}
	if a, _ := got[1].Addr("raddr", true); a != netip.MustParseAddr("10.0.0.2") {
		t.Errorf("conn_open raddr = %v, want 10.0.0.2", a)
	}
	if p, _ := got[1].Uint("lport"); p != 43210 {
		t.Errorf("conn_open lport = %d, want 43210", p)
	}
	if s, _ := got[1].Uint("state"); s != 1 {
		t.Errorf("conn_open state = %d, want 1 (ESTABLISHED)", s)
	}
	if seq, _ := got[4].Uint("seq"); seq != 2_882_400_001 || got[4].Flags() != 1 || got[4].Time() != 1_201_210_000 {
		t.Errorf("tcp_xmit seq %d, flags %d, time %d", seq, got[4].Flags(), got[4].Time())
	}
	if a, _ := got[5].Addr("laddr", false); a != netip.MustParseAddr("fd00::1") {
		t.Errorf("conn_open laddr = %v, want fd00::1", a)
	}
	if got[6].Size() != -11 || got[6].CPU() != 2 || got[6].TID() != 3171 || got[6].NetNS() != 4026531840 || got[6].Conn() != 0x1002 {
		t.Errorf("sock_send common header: size %d, cpu %d, tid %d, netns %d, conn %#x",
			got[6].Size(), got[6].CPU(), got[6].TID(), got[6].NetNS(), got[6].Conn())
	}

	if cut, off := r.Truncated(); cut {
		t.Errorf("fixture is truncated at offset %d", off)
	}
	wantSum := fixtureSummary
	wantSum.Blocks = 4
	wantSum.Events = map[string]uint64{"task": 2, "conn_open": 2, "sock_send": 2, "tcp_xmit": 2}
	if s := r.Summary(); s == nil || !reflect.DeepEqual(*s, wantSum) {
		t.Errorf("summary = %+v, want %+v", s, wantSum)
	}
}
