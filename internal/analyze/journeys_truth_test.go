// SPDX-License-Identifier: Apache-2.0

package analyze_test

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// TestJourneysTruth records a transfer between two namespaces (both ends in
// one trace) through a rate-limited veth, so that segments wait in a qdisc,
// and exports its journeys. There must be one row per data packet the
// receiver's veth got, as tshark counts them on it (a packet socket sees
// the packets dev_recv sees: GSO packets, not the segments on a wire), each
// with every layer recorded and its times in the order of the layers; the
// same rows must read back from CSV and Parquet (DuckDB).
func TestJourneysTruth(t *testing.T) {
	needRoot(t)
	needTools(t, "tcpdump", "tshark", "python3")
	if err := exec.Command("python3", "-c", "import duckdb").Run(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("python3 duckdb is missing on CI (scripts/deps.sh installs it)")
		}
		t.Skip("python3 duckdb not installed")
	}
	lab := netlab.ForTest(t, netlab.Options{Name: "mgjourney", RateMbit: 200})
	port := 20000 + os.Getpid()%20000 + 3
	const count, size = 64, 64 << 10
	stop := capture(t, lab.Server, lab.Server.Iface, port)
	var got int64
	path := recordDuring(t, port, event.DefaultGroups|event.GroupIP, func() { got = transfer(t, lab.Command, lab.Client, lab.Server, port, count, size) })
	pcap := stop()
	keepOnFailure(t, path, pcap)
	wirePackets := tsharkData(t, pcap, port)
	if got != count*size {
		t.Fatalf("receiver read %d bytes, want %d", got, count*size)
	}

	dir := t.TempDir()
	files := map[string]string{}
	var rows [][]export.Value
	for _, format := range []string{"csv", "parquet"} {
		file := filepath.Join(dir, "journeys."+format)
		f, err := os.Create(file)
		if err != nil {
			t.Fatal(err)
		}
		rec := &rowRecorder{}
		rw, err := export.NewRowWriter(format, export.JourneyTable(), f)
		if err != nil {
			t.Fatal(err)
		}
		rec.RowWriter = rw
		n, err := analyze.WriteJourneys(trace.Sources([]string{path}), rec)
		if err != nil {
			t.Fatal(err)
		}
		if err := rw.Close(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if n != uint64(len(rec.rows)) {
			t.Fatalf("WriteJourneys says %d rows, wrote %d", n, len(rec.rows))
		}
		files[format], rows = file, rec.rows
	}

	col := map[string]int{}
	for i, c := range export.JourneyColumns {
		col[c.Name] = i
	}
	var payload int64
	complete := 0
	wire := map[uint64]int64{} // ip id → IP length, as tshark reads the receiver's veth
	for _, p := range wirePackets {
		wire[p.id] = p.ipLen
	}
	for i, r := range rows {
		var prev int64
		full := true
		for _, l := range export.JourneyLayers {
			ts, id := r[col[l+"_ns"]], r[col[l+"_id"]]
			if ts.Null != id.Null {
				t.Fatalf("row %d: %s has a time but no id or the other way round", i, l)
			}
			if ts.Null {
				full = false
				if l != "tcp_rcv" && l != "sock_recv" {
					// A row is a packet matched from the sender's device
					// to the receiver's IP layer: these are always there.
					t.Fatalf("row %d: no %s event: %v", i, l, r)
				}
				continue
			}
			if ts.Int < prev {
				t.Errorf("row %d: %s at %d, before the previous layer's %d", i, l, ts.Int, prev)
			}
			prev = ts.Int
		}
		if full {
			complete++
		}
		if r[col["trace"]].Str != r[col["peer_trace"]].Str || r[col["conn"]].Uint == r[col["peer"]].Uint {
			t.Fatalf("row %d: sender and receiver: %v", i, r)
		}
		// Each row is a packet tshark saw, once: same IPv4 id and length.
		id := r[col["ip_id"]].Uint
		if n, ok := wire[id]; !ok || n != r[col["ip_len"]].Int {
			t.Errorf("row %d: ip id %d, length %d; tshark has length %d (seen %v)", i, id, r[col["ip_len"]].Int, n, ok)
		}
		delete(wire, id)
		payload += r[col["ip_len"]].Int
	}
	// The recorder can miss an event (a BPF program does not run while
	// another runs on its CPU, which the kernel counts as a miss; other
	// tracers on the machine make it happen), and a packet with a layer
	// missing below the receiver's IP has no journey. So: as many rows as
	// tshark counts when the trace has every data packet at each of those
	// layers, and never more than the trace has at any of them.
	layers := dataEvents(t, path, map[string]uint32{"tcp_xmit": lab.Client.NetNSInode, "ip_send": lab.Client.NetNSInode,
		"dev_queue": lab.Client.NetNSInode, "dev_xmit": lab.Client.NetNSInode,
		"dev_recv": lab.Server.NetNSInode, "ip_recv": lab.Server.NetNSInode})
	t.Logf("%d journeys (%d with every layer); tshark: %d data packets on the receiver's veth; in the trace: %v; records out of time order by up to %d",
		len(rows), complete, len(wirePackets), layers, lateness(t, path))
	whole := true
	for l, n := range layers {
		if len(rows) > n {
			t.Errorf("%d journeys, only %d data packets at %s in the trace", len(rows), n, l)
		}
		// tcp_xmit is the sender's: a GSO packet sent once is one packet
		// on the receiver's veth too (veth neither splits nor merges).
		whole = whole && n == len(wirePackets)
	}
	if whole && len(rows) != len(wirePackets) {
		t.Errorf("%d journeys; tshark counts %d data packets reaching the receiver's veth, and the trace has each at every layer", len(rows), len(wirePackets))
	}
	if !whole {
		t.Logf("the recorder missed events: the journeys are checked against the trace, not tshark's count")
	}
	// Readback: what DuckDB reads of each file is what was written.
	// Sums of wall-clock ns overflow 64 bits: big, as DuckDB's hugeint.
	var nsSum [8]big.Int
	var idSum [8]uint64
	for _, r := range rows {
		for i, l := range export.JourneyLayers {
			nsSum[i].Add(&nsSum[i], big.NewInt(r[col[l+"_ns"]].Int))
			idSum[i] += r[col[l+"_id"]].Uint
		}
	}
	var sel []string
	var want []string
	for i, l := range export.JourneyLayers {
		sel = append(sel, fmt.Sprintf("coalesce(sum(%s_ns::hugeint),0)", l), fmt.Sprintf("coalesce(sum(%s_id::hugeint),0)", l))
		want = append(want, nsSum[i].String(), strconv.FormatUint(idSum[i], 10))
	}
	want = append([]string{strconv.Itoa(len(rows)), strconv.FormatInt(payload, 10)}, want...)
	for format, file := range files {
		reader := "read_parquet"
		if format == "csv" {
			reader = "read_csv_auto"
		}
		q := fmt.Sprintf("select count(*), sum(ip_len), %s from %s('%s')", strings.Join(sel, ", "), reader, file)
		out, err := exec.Command("python3", "-c", "import duckdb,sys; print(','.join(str(v) for v in duckdb.sql(sys.argv[1]).fetchall()[0]))", q).CombinedOutput()
		if err != nil {
			t.Fatalf("duckdb %s: %v\n%s", format, err, out)
		}
		if got := strings.TrimSpace(string(out)); got != strings.Join(want, ",") {
			t.Errorf("%s read back by DuckDB: %s\nwritten: %s", format, got, strings.Join(want, ","))
		}
	}
	// And the CSV parses back to the very cells written.
	b, err := os.ReadFile(files["csv"])
	if err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(bytes.NewReader(b)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(rows)+1 {
		t.Fatalf("csv has %d lines, want %d rows and a header", len(recs), len(rows))
	}
	for i, r := range rows {
		for j, v := range r {
			if s := v.String(export.JourneyColumns[j].Kind); recs[i+1][j] != s {
				t.Fatalf("csv row %d column %s: %q, written %q", i, export.JourneyColumns[j].Name, recs[i+1][j], s)
			}
		}
	}
}

// keepOnFailure copies files (a trace, a capture) out of the test's
// temporary directories when the test fails, so that a failure seen once in
// many runs can be read afterwards, and logs where they are.
func keepOnFailure(t *testing.T, files ...string) {
	t.Helper()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		dir, err := os.MkdirTemp("", "magnet-"+strings.ReplaceAll(t.Name(), "/", "_")+"-")
		if err != nil {
			t.Logf("keep the failed run's files: %v", err)
			return
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644)
			}
			if err != nil {
				t.Logf("keep %s: %v", f, err)
			}
		}
		t.Logf("the failed run's files are kept in %s", dir)
	})
}

// lateness returns how far out of time order the trace at path is: the
// most records any record comes after that are later in time.
func lateness(t *testing.T, path string) int {
	t.Helper()
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var seen []uint64 // sorted
	most := 0
	for {
		rec, err := r.Next()
		if err != nil {
			break
		}
		ts := rec.Time()
		i := sort.Search(len(seen), func(i int) bool { return seen[i] > ts })
		most = max(most, len(seen)-i)
		seen = slices.Insert(seen, i, ts)
	}
	return most
}

// rowRecorder keeps a copy of every row it passes on.
type rowRecorder struct {
	export.RowWriter
	rows [][]export.Value
}

func (r *rowRecorder) WriteRow(row []export.Value) error {
	r.rows = append(r.rows, append([]export.Value(nil), row...))
	return r.RowWriter.WriteRow(row)
}

// wirePacket is a packet as tshark reads it.
type wirePacket struct {
	id    uint64
	ipLen int64
}

// tsharkData lists the packets in file sent to port that carry data, as
// tshark reads them.
func tsharkData(t *testing.T, file string, port int) []wirePacket {
	t.Helper()
	out, err := exec.Command("tshark", "-r", file, "-T", "fields", "-e", "ip.id", "-e", "ip.len",
		"-Y", fmt.Sprintf("tcp.dstport == %d && tcp.len > 0", port)).Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	var ps []wirePacket
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("tshark: %q", line)
		}
		id, err1 := strconv.ParseUint(strings.TrimPrefix(f[0], "0x"), 16, 16)
		n, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("tshark: %q", line)
		}
		ps = append(ps, wirePacket{id, n})
	}
	return ps
}

// dataEvents counts, for each event type, its records in the trace at
// path in the namespace given that carry data: a TCP payload (tcp_xmit) or
// a packet longer than any header alone (20 bytes of IPv4, 60 of TCP and
// 14 of Ethernet).
func dataEvents(t *testing.T, path string, netns map[string]uint32) map[string]int {
	t.Helper()
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	n := map[string]int{}
	for {
		rec, err := r.Next()
		if err != nil {
			break
		}
		name := rec.Type.Name
		ns, ok := netns[name]
		if !ok || rec.NetNS() != ns {
			continue
		}
		if name == "tcp_xmit" && rec.Size() > 0 || name != "tcp_xmit" && rec.Size() > 94 {
			n[name]++
		}
	}
	return n
}
