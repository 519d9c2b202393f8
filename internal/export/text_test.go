// SPDX-License-Identifier: Apache-2.0

package export_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// t0 is the time_ns of the test trace's first record.
const t0 = 1_000_000_000_000

// hdr is the common header of a record to build; the type comes from the
// record's name.
type hdr struct {
	time  uint64
	conn  uint64
	tid   uint32
	size  int32
	netns uint32
	cpu   uint16
	flags uint8
}

// vals are a record's own fields: int for integers and enums, string for
// text, netip.Addr for addresses (IPv4 in the first 4 bytes), []byte for
// raw bytes.
type vals map[string]any

type recSpec struct {
	name string
	h    hdr
	v    vals
}

func testHeader(t *testing.T) *trace.Header {
	t.Helper()
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		t.Fatalf("Dictionary: %v", err)
	}
	return &trace.Header{
		Clock: trace.Clock{Source: "CLOCK_MONOTONIC", ResolutionNs: 1, WallOffsetNs: 1_699_999_000_000_000_000},
		Host:  "testhost",
		Types: types,
		Enums: map[string]map[string]string{
			// 7 (CLOSE) is left out on purpose: unnamed values print as numbers.
			"tcp_state":   {"1": "ESTABLISHED", "2": "SYN_SENT"},
			"ipproto":     {"6": "tcp", "17": "udp"},
			"drop_reason": {"2": "NOT_SPECIFIED"},
		},
	}
}

// encode lays a record out at the dictionary's offsets, in native byte order.
func encode(t *testing.T, h *trace.Header, rs recSpec) []byte {
	t.Helper()
	et := h.TypeByName(rs.name)
	if et == nil {
		t.Fatalf("no event type %s", rs.name)
	}
	b := make([]byte, et.Size)
	ne := binary.NativeEndian
	ne.PutUint64(b[0:], rs.h.time)
	ne.PutUint64(b[8:], rs.h.conn)
	ne.PutUint32(b[16:], rs.h.tid)
	ne.PutUint32(b[20:], uint32(rs.h.size))
	ne.PutUint32(b[24:], rs.h.netns)
	ne.PutUint16(b[28:], rs.h.cpu)
	b[30] = et.ID
	b[31] = rs.h.flags
	for name, v := range rs.v {
		f, ok := et.Field(name)
		if !ok {
			t.Fatalf("%s has no field %s", rs.name, name)
		}
		dst := b[f.Offset : f.Offset+f.Size]
		switch v := v.(type) {
		case int:
			switch f.Size {
			case 1:
				dst[0] = uint8(v)
			case 2:
				ne.PutUint16(dst, uint16(v))
			case 4:
				ne.PutUint32(dst, uint32(v))
			case 8:
				ne.PutUint64(dst, uint64(v))
			default:
				t.Fatalf("%s.%s: integer of size %d", rs.name, name, f.Size)
			}
		case string:
			if len(v) > f.Size {
				t.Fatalf("%s.%s: %q is longer than %d bytes", rs.name, name, v, f.Size)
			}
			copy(dst, v)
		case netip.Addr:
			if v.Is4() {
				a := v.As4()
				copy(dst, a[:])
			} else {
				a := v.As16()
				copy(dst, a[:])
			}
		case []byte:
			copy(dst, v)
		default:
			t.Fatalf("%s.%s: value of type %T", rs.name, name, v)
		}
	}
	return b
}

var (
	addr1 = netip.MustParseAddr("10.0.0.1")
	addr2 = netip.MustParseAddr("10.0.0.2")
	any4  = netip.MustParseAddr("0.0.0.0")
)

// testRecords is a small trace: a TCP connection between two namespaces
// (conns 11 and 12), a loss, a UDP client (21) and an unconnected UDP
// server (22), and the metadata that names their threads and interface.
// splitAt is the index of the first record of the second block.
func testRecords() (recs []recSpec, splitAt int) {
	return []recSpec{
		{"task", hdr{time: t0, tid: 7}, vals{"pid": 5, "comm": "curl"}},
		{"task", hdr{time: t0, tid: 9}, vals{"pid": 9, "comm": "nginx"}},
		{"task", hdr{time: t0, tid: 8}, vals{"pid": 8, "comm": "my app\t1"}},
		{"iface", hdr{time: t0 + 1, netns: 100}, vals{"ifindex": 2, "name": "veth0"}},
		// Opened while nginx's thread was current: not the owner.
		{"conn_open", hdr{time: t0 + 1000, conn: 11, tid: 9, netns: 100, cpu: 1},
			vals{"proto": 6, "family": 4, "state": 1, "lport": 40000, "rport": 80, "laddr": addr1, "raddr": addr2}},
		{"conn_open", hdr{time: t0 + 2000, conn: 12, netns: 200, cpu: 2},
			vals{"proto": 6, "family": 4, "state": 1, "lport": 80, "rport": 40000, "laddr": addr2, "raddr": addr1}},
		{"sock_send", hdr{time: t0 + 1_500_000_000, conn: 11, tid: 7, size: 1000, netns: 100, cpu: 1}, nil},
		{"tcp_xmit", hdr{time: t0 + 1_500_001_000, conn: 11, tid: 7, size: 1000, netns: 100, cpu: 1, flags: 0x18},
			vals{"seq": 123, "gso_segs": 1}},
		{"dev_xmit", hdr{time: t0 + 1_500_002_000, conn: 11, tid: 7, size: 1066, netns: 100, cpu: 1},
			vals{"ifindex": 2, "gso_segs": 1}},
		{"sock_recv", hdr{time: t0 + 1_500_010_000, conn: 12, tid: 9, size: 1000, netns: 200, cpu: 2}, nil},
		// Second block.
		{"sock_recv", hdr{time: t0 + 1_600_000_000, conn: 11, tid: 7, size: 500, netns: 100, cpu: 1}, nil},
		// Another process uses nginx's socket: the owner stays nginx.
		{"sock_send", hdr{time: t0 + 1_600_000_100, conn: 12, tid: 7, size: 500, netns: 200, cpu: 2}, nil},
		{"lost", hdr{time: t0 + 2_000_000_000, cpu: 3},
			vals{"first_ns": t0 + 1_900_000_000, "last_ns": t0 + 1_950_000_000, "total": 5, "n_dev_xmit": 2, "n_tcp_xmit": 3}},
		{"conn_open", hdr{time: t0 + 3_000_000_000, conn: 21, tid: 8, netns: 100},
			vals{"proto": 17, "family": 4, "state": 7, "lport": 5000, "rport": 53, "laddr": addr1, "raddr": addr2}},
		{"conn_open", hdr{time: t0 + 3_000_000_500, conn: 22, netns: 200, cpu: 2},
			vals{"proto": 17, "family": 4, "state": 7, "lport": 53, "rport": 0, "laddr": addr2, "raddr": any4}},
		{"sock_send", hdr{time: t0 + 3_000_001_000, conn: 21, tid: 8, size: 40, netns: 100}, nil},
		{"sock_send", hdr{time: t0 + 3_000_002_000, conn: 21, tid: 8, size: -11, netns: 100}, nil},
		{"sock_recv", hdr{time: t0 + 3_000_003_000, conn: 22, tid: 9, size: 40, netns: 200, cpu: 2}, nil},
		{"conn_close", hdr{time: t0 + 4_000_000_000, conn: 11, netns: 100, cpu: 1},
			vals{"bytes_acked": 1000, "bytes_received": 500, "state": 7}},
	}, 10
}

// buildTrace writes testRecords to a trace in memory, in two blocks, and
// returns it with the file offset of the second block.
func buildTrace(t *testing.T) (file []byte, secondBlock int64) {
	t.Helper()
	h := testHeader(t)
	var buf bytes.Buffer
	w, err := trace.NewWriter(&buf, h, trace.WriterOptions{})
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	recs, split := testRecords()
	for i, rs := range recs {
		if i == split {
			if err := w.Flush(); err != nil {
				t.Fatalf("Flush: %v", err)
			}
			secondBlock = w.Bytes()
		}
		if err := w.Write(encode(t, h, rs)); err != nil {
			t.Fatalf("write %s: %v", rs.name, err)
		}
	}
	if err := w.Close(&trace.Summary{}); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return buf.Bytes(), secondBlock
}

func newReader(t *testing.T, file []byte) *trace.Reader {
	t.Helper()
	r, err := trace.NewReader(bytes.NewReader(file))
	if err != nil {
		t.Fatalf("NewReader: %v", err)
	}
	return r
}

const headerLine = "time\tcpu\tpid\ttid\tcomm\tnetns\tconn\tevent\tsize\tfields"

// wantEvents are the lines of the test trace's data records, relative time.
var wantEvents = []string{
	"0.000001000\t1\t9\t9\tnginx\t100\t11\tconn_open\t0\tproto=tcp family=4 state=ESTABLISHED lport=40000 rport=80 laddr=10.0.0.1 raddr=10.0.0.2",
	"0.000002000\t2\t0\t0\tswapper\t200\t12\tconn_open\t0\tproto=tcp family=4 state=ESTABLISHED lport=80 rport=40000 laddr=10.0.0.2 raddr=10.0.0.1",
	"1.500000000\t1\t5\t7\tcurl\t100\t11\tsock_send\t1000\t-",
	"1.500001000\t1\t5\t7\tcurl\t100\t11\ttcp_xmit\t1000\ttcpflags=P. seq=123 gso_segs=1 retrans=0",
	"1.500002000\t1\t5\t7\tcurl\t100\t11\tdev_xmit\t1066\tifindex=2 iface=veth0 gso_segs=1 ip_id=0 ttl=0 tos=0 proto=0 family=0 seq=0",
	"1.500010000\t2\t9\t9\tnginx\t200\t12\tsock_recv\t1000\t-",
	"1.600000000\t1\t5\t7\tcurl\t100\t11\tsock_recv\t500\t-",
	"1.600000100\t2\t5\t7\tcurl\t200\t12\tsock_send\t500\t-",
	"2.000000000\t3\t-\t0\t-\t0\t-\tlost\t0\tfirst_ns=1001900000000 last_ns=1001950000000 total=5 ring=0 types=tcp_xmit:3,dev_xmit:2",
	"3.000000000\t0\t8\t8\tmy_app_1\t100\t21\tconn_open\t0\tproto=udp family=4 state=7 lport=5000 rport=53 laddr=10.0.0.1 raddr=10.0.0.2",
	"3.000000500\t2\t0\t0\tswapper\t200\t22\tconn_open\t0\tproto=udp family=4 state=7 lport=53 rport=0 laddr=10.0.0.2 raddr=0.0.0.0",
	"3.000001000\t0\t8\t8\tmy_app_1\t100\t21\tsock_send\t40\t-",
	"3.000002000\t0\t8\t8\tmy_app_1\t100\t21\tsock_send\t-11\t-",
	"3.000003000\t2\t9\t9\tnginx\t200\t22\tsock_recv\t40\t-",
	"4.000000000\t1\t0\t0\tswapper\t100\t11\tconn_close\t0\tbytes_acked=1000 bytes_received=500 total_retrans=0 state=7",
}

// wantMeta are the lines of the metadata records, which come first.
var wantMeta = []string{
	"0.000000000\t0\t5\t7\tcurl\t0\t-\ttask\t0\tpid=5 uid=0 comm=curl",
	"0.000000000\t0\t9\t9\tnginx\t0\t-\ttask\t0\tpid=9 uid=0 comm=nginx",
	"0.000000000\t0\t8\t8\tmy_app_1\t0\t-\ttask\t0\tpid=8 uid=0 comm=my_app_1",
	"0.000000001\t0\t0\t0\tswapper\t100\t-\tiface\t0\tifindex=2 name=veth0",
}

func writeText(t *testing.T, file []byte, opts export.TextOptions) []string {
	t.Helper()
	var out bytes.Buffer
	if err := export.WriteText(&out, newReader(t, file), opts); err != nil {
		t.Fatalf("WriteText: %v", err)
	}
	s := out.String()
	if !strings.HasSuffix(s, "\n") {
		t.Fatalf("output does not end in a newline: %q", s)
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

func checkLines(t *testing.T, got, want []string) {
	t.Helper()
	for i := 0; i < max(len(got), len(want)); i++ {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			t.Errorf("line %d:\n got %q\nwant %q", i+1, g, w)
		}
	}
}

func TestColumns(t *testing.T) {
	if got := strings.Join(export.Columns, "\t"); got != headerLine {
		t.Errorf("Columns = %q, want %q", got, headerLine)
	}
}

func TestWriteText(t *testing.T) {
	file, _ := buildTrace(t)
	got := writeText(t, file, export.TextOptions{})
	checkLines(t, got, append([]string{headerLine}, wantEvents...))
}

func TestWriteTextMeta(t *testing.T) {
	file, _ := buildTrace(t)
	got := writeText(t, file, export.TextOptions{Meta: true})
	want := append([]string{headerLine}, wantMeta...)
	checkLines(t, got, append(want, wantEvents...))
}

func TestWriteTextTimeFormats(t *testing.T) {
	file, _ := buildTrace(t)
	// Fields after the time column are the same in every format.
	rest := func(line string) string { _, r, _ := strings.Cut(line, "\t"); return r }

	raw := writeText(t, file, export.TextOptions{Time: export.TimeRaw})
	abs := writeText(t, file, export.TextOptions{Time: export.TimeAbsolute})
	if len(raw) != len(wantEvents)+1 || len(abs) != len(wantEvents)+1 {
		t.Fatalf("got %d raw and %d abs lines, want %d", len(raw), len(abs), len(wantEvents)+1)
	}
	for _, tc := range []struct {
		line     int
		raw, abs string
	}{
		{1, "1000000001000", "2023-11-14T22:13:20.000001000Z"},
		{3, "1001500000000", "2023-11-14T22:13:21.500000000Z"},
		{15, "1004000000000", "2023-11-14T22:13:24.000000000Z"},
	} {
		if got, _, _ := strings.Cut(raw[tc.line], "\t"); got != tc.raw {
			t.Errorf("raw time of line %d = %q, want %q", tc.line, got, tc.raw)
		}
		if got, _, _ := strings.Cut(abs[tc.line], "\t"); got != tc.abs {
			t.Errorf("absolute time of line %d = %q, want %q", tc.line, got, tc.abs)
		}
	}
	for i, w := range wantEvents {
		if rest(raw[i+1]) != rest(w) || rest(abs[i+1]) != rest(w) {
			t.Errorf("line %d differs beyond the time column:\nraw %q\nabs %q\nwant %q", i+2, raw[i+1], abs[i+1], w)
		}
	}
}

func TestWriteTextFilter(t *testing.T) {
	file, _ := buildTrace(t)
	var seen []string
	got := writeText(t, file, export.TextOptions{Filter: func(rec trace.Record) bool {
		seen = append(seen, rec.Type.Name)
		return rec.Conn() == 12
	}})
	// The filter never sees metadata records, yet the pid and command of
	// tid 9 are resolved from them.
	checkLines(t, got, []string{headerLine, wantEvents[1], wantEvents[5], wantEvents[7]})
	if len(seen) != len(wantEvents) {
		t.Errorf("filter called %d times, want %d (once per data record): %v", len(seen), len(wantEvents), seen)
	}

	// With Meta, the filter selects among metadata records too.
	got = writeText(t, file, export.TextOptions{Meta: true, Filter: func(rec trace.Record) bool {
		return rec.Type.Name == "iface" || rec.Type.Name == "lost"
	}})
	checkLines(t, got, []string{headerLine, wantMeta[3], wantEvents[8]})
}

func TestWriteTextCorrupt(t *testing.T) {
	file, second := buildTrace(t)
	file[second+32] ^= 0xff // first payload byte of the second block
	var out bytes.Buffer
	err := export.WriteText(&out, newReader(t, file), export.TextOptions{})
	if !errors.Is(err, trace.ErrCorrupt) {
		t.Fatalf("WriteText error = %v, want ErrCorrupt", err)
	}
	// Every record of the first block is written, none of the second.
	got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	checkLines(t, got, append([]string{headerLine}, wantEvents[:6]...))
}

func TestWriteTextEmpty(t *testing.T) {
	var buf bytes.Buffer
	w, err := trace.NewWriter(&buf, testHeader(t), trace.WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(nil); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := export.WriteText(&out, newReader(t, buf.Bytes()), export.TextOptions{}); err != nil {
		t.Fatalf("WriteText: %v", err)
	}
	if out.String() != headerLine+"\n" {
		t.Errorf("empty trace gives %q, want the header line alone", out.String())
	}
}

// record builds a trace.Record directly, for AppendLine.
func record(t *testing.T, h *trace.Header, rs recSpec) trace.Record {
	t.Helper()
	return trace.Record{Type: h.TypeByName(rs.name), Data: encode(t, h, rs)}
}

func TestAppendLine(t *testing.T) {
	h := testHeader(t)
	rs := export.NewResolver(h)
	v6a, v6b := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	for _, m := range []recSpec{
		{"task", hdr{time: 5000, tid: 3}, vals{"pid": 1, "comm": "a b\x7fc"}},
		{"iface", hdr{time: 5000, netns: 1}, vals{"ifindex": 4, "name": "eth 0"}},
	} {
		if !rs.Observe(record(t, h, m)) {
			t.Fatalf("Observe(%s) = false, want true", m.name)
		}
	}
	if pid, comm, ok := rs.Task(3); !ok || pid != 1 || comm != "a b\x7fc" {
		t.Errorf("Task(3) = %d, %q, %v; want 1, %q, true", pid, comm, ok, "a b\x7fc")
	}
	if _, _, ok := rs.Task(4); ok {
		t.Errorf("Task(4) found, want unknown")
	}
	for _, tc := range []struct {
		rs   recSpec
		tf   export.TimeFormat
		want string
	}{
		{recSpec{"conn_open", hdr{time: 6000, conn: 1, tid: 3, netns: 1},
			vals{"proto": 6, "family": 6, "state": 2, "lport": 443, "rport": 5555, "laddr": v6a, "raddr": v6b}}, export.TimeRelative,
			"0.000001000\t0\t1\t3\ta_b_c\t1\t1\tconn_open\t0\tproto=tcp family=6 state=SYN_SENT lport=443 rport=5555 laddr=fd00::1 raddr=fd00::2"},
		// Before the first record: negative relative time.
		{recSpec{"tcp_rcv", hdr{time: 4500, conn: 1, tid: 4, size: 0, flags: 0x12}, vals{"seq": 1, "ack": 2, "wnd": 65536}}, export.TimeRelative,
			"-0.000000500\t0\t-\t4\t-\t0\t1\ttcp_rcv\t0\ttcpflags=S. seq=1 ack=2 wnd=65536"},
		{recSpec{"tcp_retrans", hdr{time: 5000 + 2_000_000_000, conn: 1, size: -110}, vals{"seq": 9, "state": 1}}, export.TimeRelative,
			"2.000000000\t0\t0\t0\tswapper\t0\t1\ttcp_retrans\t-110\ttcpflags=none seq=9 state=ESTABLISHED"},
		{recSpec{"drop", hdr{time: 5000, netns: 1, size: 60}, vals{"reason": 2, "ifindex": 4, "l3proto": 0x800, "l4proto": 6}}, export.TimeRaw,
			"5000\t0\t0\t0\tswapper\t1\t-\tdrop\t60\treason=NOT_SPECIFIED ifindex=4 iface=eth_0 l3proto=2048 l4proto=tcp"},
		{recSpec{"drop", hdr{time: 5000, netns: 2}, vals{"reason": 77, "ifindex": 4, "l4proto": 132}}, export.TimeRaw,
			"5000\t0\t0\t0\tswapper\t2\t-\tdrop\t0\treason=77 ifindex=4 l3proto=0 l4proto=132"},
		// Headers: data cut to caplen, in hex.
		{recSpec{"headers", hdr{time: 5000, netns: 1, size: 98}, vals{"ifindex": 4, "caplen": 3, "dir": 1, "data": []byte{0x45, 0x00, 0x54, 0xff}}}, export.TimeRaw,
			"5000\t0\t0\t0\tswapper\t1\t-\theaders\t98\tifindex=4 iface=eth_0 caplen=3 dir=1 data=450054"},
		{recSpec{"sched_fork", hdr{time: 5000, tid: 3}, vals{"child_tid": 10, "child_pid": 10}}, export.TimeRaw,
			"5000\t0\t1\t3\ta_b_c\t0\t-\tsched_fork\t0\tchild_tid=10 child_pid=10 child_comm=-"},
		{recSpec{"lost", hdr{time: 5000, cpu: 1}, vals{"total": 0, "ring": 1}}, export.TimeRaw,
			"5000\t1\t-\t0\t-\t0\t-\tlost\t0\tfirst_ns=0 last_ns=0 total=0 ring=1 types="},
	} {
		rec := record(t, h, tc.rs)
		if rs.Observe(rec) {
			t.Errorf("Observe(%s) = true, want false", tc.rs.name)
		}
		got := string(rs.AppendLine([]byte("prefix:"), rec, tc.tf))
		if want := "prefix:" + tc.want + "\n"; got != want {
			t.Errorf("%s:\n got %q\nwant %q", tc.rs.name, got, want)
		}
	}
}

func TestTCPFlags(t *testing.T) {
	for _, tc := range []struct {
		f    uint8
		want string
	}{
		{0, "none"},
		{0x02, "S"},
		{0x12, "S."},
		{0x11, "F."},
		{0x10, "."},
		{0x18, "P."},
		{0x04, "R"},
		{0x14, "R."},
		{0x19, "FP."},
		{0xc2, "SEW"},
		{0xff, "SFPRUEW."},
	} {
		if got := export.TCPFlags(tc.f); got != tc.want {
			t.Errorf("TCPFlags(%#02x) = %q, want %q", tc.f, got, tc.want)
		}
	}
}

func TestParseTimeFormat(t *testing.T) {
	for in, want := range map[string]export.TimeFormat{
		"": export.TimeRelative, "rel": export.TimeRelative, "relative": export.TimeRelative,
		"abs": export.TimeAbsolute, "absolute": export.TimeAbsolute, "wall": export.TimeAbsolute,
		"raw": export.TimeRaw, "ns": export.TimeRaw,
	} {
		got, err := export.ParseTimeFormat(in)
		if err != nil || got != want {
			t.Errorf("ParseTimeFormat(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	_, err := export.ParseTimeFormat("ABS")
	if err == nil || err.Error() != `unknown time format "ABS" (want rel, abs or raw)` {
		t.Errorf("ParseTimeFormat(ABS) error = %v", err)
	}
}

func TestEndpoint(t *testing.T) {
	for _, tc := range []struct {
		a    string
		port uint16
		want string
	}{
		{"10.0.0.1", 80, "10.0.0.1:80"},
		{"0.0.0.0", 0, "0.0.0.0:0"},
		{"fd00::1", 443, "[fd00::1]:443"},
	} {
		if got := export.Endpoint(netip.MustParseAddr(tc.a), tc.port); got != tc.want {
			t.Errorf("Endpoint(%s, %d) = %q, want %q", tc.a, tc.port, got, tc.want)
		}
	}
}
