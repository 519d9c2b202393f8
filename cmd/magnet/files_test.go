// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// copyFixture copies the test trace into dir and returns its path and
// content.
func copyFixture(t *testing.T, dir, name string) (string, []byte) {
	t.Helper()
	b, err := os.ReadFile(exportFixture)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, b
}

func sameContent(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s was overwritten (%d bytes, was %d)", path, len(got), len(want))
	}
}

// An output that is an input, by its name, a symbolic link or a hard link,
// is refused before anything is written.
func TestOutputIsInput(t *testing.T) {
	dir := t.TempDir()
	in, orig := copyFixture(t, dir, "in.mgt")
	link := filepath.Join(dir, "chart.svg")
	if err := os.Symlink(in, link); err != nil {
		t.Fatal(err)
	}
	hard := filepath.Join(dir, "hard.csv")
	if err := os.Link(in, hard); err != nil {
		t.Fatal(err)
	}
	cases := [][]string{
		{"export", in, "-f", "csv", "-o", in},
		{"export", in, "-f", "csv", "-o", hard},
		{"export", in, "-f", "pcapng", "-o", in},
		{"export", in, "-f", "perfetto", "-o", in},
		{"export", in, "-f", "csv", "-o", filepath.Join(dir, "out.csv"), "--conns-output", in},
		{"plot", in, "-o", link},
		{"report", in, "--html", link},
	}
	for _, args := range cases {
		r := magnet(t, args...)
		oneLineError(t, r, "refusing to overwrite what it reads")
		sameContent(t, in, orig)
	}
	same := filepath.Join(dir, "same.csv")
	oneLineError(t, magnet(t, "export", in, "-f", "csv", "-o", same, "--conns-output", same), "is also the output "+same)
	// The connection table is checked before the events are written: a
	// refused table leaves no events' output behind either.
	for _, p := range []string{filepath.Join(dir, "out.csv"), same} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s was written by an export that was refused: %v", p, err)
		}
	}
}

// A second recorder on the file a recorder is writing is refused with one
// line naming the first, and the first's trace stays whole.
func TestRecordSameOutputTwice(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	out, ready := filepath.Join(dir, "same.mgt"), filepath.Join(dir, "ready")
	var e bytes.Buffer
	rec := startRecorder(t, &e, ready, "-q", "-o", out)
	r := magnet(t, "record", "-q", "-o", out, "--duration", "1s")
	oneLineError(t, r, fmt.Sprintf("%s (pid %d, magnet): output is being written by another process", out, rec.Process.Pid))
	// Nor may an export or a chart replace it.
	oneLineError(t, magnet(t, "export", exportFixture, "-f", "csv", "--no-conns", "-o", out), "being written by another process")
	rec.Process.Signal(syscall.SIGTERM)
	if err := rec.Wait(); err != nil {
		t.Fatalf("first recorder: %v\n%s", err, e.String())
	}
	if p := magnet(t, "parse", out); p.code != 0 || p.stderr != "" {
		t.Fatalf("parse of the first recorder's trace: code %d, %s", p.code, p.stderr)
	}
}

// Run as root, no command follows a symbolic link another user planted in
// a sticky world-writable directory (fs.protected_symlinks may be off).
func TestPlantedSymlink(t *testing.T) {
	needRoot(t)
	shared := filepath.Join(t.TempDir(), "tmp")
	if err := os.Mkdir(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	target, orig := copyFixture(t, t.TempDir(), "precious.mgt")
	plant := func(name string) string {
		p := filepath.Join(shared, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		return p
	}
	in, _ := copyFixture(t, t.TempDir(), "in.mgt")
	for _, args := range [][]string{
		{"record", "-q", "-o", plant("rec.mgt"), "--duration", "1s"},
		{"export", in, "-f", "csv", "--no-conns", "-o", plant("out.csv")},
		{"export", in, "-f", "csv", "-o", filepath.Join(shared, "events.csv"), "--conns-output", plant("conns.csv")},
		{"plot", in, "-o", plant("chart.svg")},
	} {
		oneLineError(t, magnet(t, args...), "is a symbolic link in "+shared+", a sticky world-writable directory")
		sameContent(t, target, orig)
	}
	if _, err := os.Stat(filepath.Join(shared, "events.csv")); !os.IsNotExist(err) {
		t.Errorf("an export whose connection table was refused wrote its events: %v", err)
	}
	r := magnet(t, "record", "-q", "-o", filepath.Join(shared, "ok.mgt"), "--duration", "1s", "--ready-file", plant("ready"))
	if r.code != 0 || !strings.Contains(r.stderr, "warning: --ready-file: ") || !strings.Contains(r.stderr, "is a symbolic link") {
		t.Fatalf("record with a planted ready file: code %d, stderr %q", r.code, r.stderr)
	}
	sameContent(t, target, orig)

	// The daemon's ready file and CPU profile: the daemon serves on, and
	// says why it wrote no ready file.
	sock := filepath.Join(t.TempDir(), "magnet.sock")
	d := exec.Command(bin, "daemon", "--socket", sock, "--ready-file", plant("daemon-ready"))
	log := &lockedBuffer{}
	d.Stderr = log
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.Wait() }()
	deadline := time.After(60 * time.Second)
	for !strings.Contains(log.String(), "warning: --ready-file: ") {
		select {
		case err := <-exited:
			t.Fatalf("daemon exited: %v\n%s", err, log.String())
		case <-deadline:
			_ = d.Process.Kill()
			t.Fatalf("no warning about the planted ready file within 60s\n%s", log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	_ = d.Process.Signal(syscall.SIGTERM)
	if err := <-exited; err != nil {
		t.Errorf("daemon exit: %v\n%s", err, log.String())
	}
	if !strings.Contains(log.String(), "is a symbolic link") {
		t.Errorf("daemon's warning: %s", log.String())
	}
	sameContent(t, target, orig)
	oneLineError(t, magnet(t, "daemon", "--socket", filepath.Join(t.TempDir(), "m.sock"), "--cpuprofile", plant("daemon.pprof")), "is a symbolic link in "+shared)
	sameContent(t, target, orig)
	oneLineError(t, magnet(t, "record", "-q", "-o", filepath.Join(shared, "prof.mgt"), "--duration", "1s", "--cpuprofile", plant("record.pprof")), "is a symbolic link in "+shared)
	sameContent(t, target, orig)
}

// TestRecordCPUProfile: record --cpuprofile (hidden) writes a Go CPU
// profile, gzip-compressed protobuf as pprof reads it, of the recording.
func TestRecordCPUProfile(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	prof := filepath.Join(dir, "cpu.pprof")
	r := magnet(t, "record", "-q", "-o", filepath.Join(dir, "t.mgt"), "--duration", "1s", "--cpuprofile", prof)
	if r.code != 0 {
		t.Fatalf("record: code %d, %s", r.code, r.stderr)
	}
	f, err := os.Open(prof)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("profile is not gzip: %v", err)
	}
	b, err := io.ReadAll(zr)
	if err != nil || len(b) == 0 {
		t.Fatalf("profile: %d bytes, %v", len(b), err)
	}
	// The profile's string table names the sample type.
	if !bytes.Contains(b, []byte("nanoseconds")) {
		t.Error("profile names no CPU time unit")
	}
}

// blockyTrace rewrites the test trace with small blocks, so that damage to
// one block leaves others whole, and returns the file and its records.
func blockyTrace(t *testing.T, path string) int {
	t.Helper()
	r, err := trace.Open(exportFixture)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := trace.NewWriter(f, r.Header(), trace.WriterOptions{ByteOrder: r.ByteOrder(), BlockSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Write(rec.Data); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if err := w.Close(r.Summary()); err != nil {
		t.Fatal(err)
	}
	return n
}

// A bit flipped in a block's length of a complete file is damage, not a
// file cut short: parse says so and fails; --salvage reads on.
func TestDamagedLength(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "flip.mgt")
	blockyTrace(t, p)
	good := magnet(t, "parse", "--meta", "--time", "raw", p)
	if good.code != 0 || good.stderr != "" {
		t.Fatalf("parse of the rewritten trace: %d %s", good.code, good.stderr)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	first := bytes.Index(b, []byte("MGBK"))
	second := first + 4 + bytes.Index(b[first+4:], []byte("MGBK"))
	if first < 0 || second < first+4 {
		t.Fatalf("no second block")
	}
	third := second + 4 + bytes.Index(b[second+4:], []byte("MG"))
	b[second+5] |= 0x10 // big-endian length: +1 MiB, past the end of the file
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	r := magnet(t, "parse", p)
	if r.code == 0 || !strings.Contains(r.stderr, fmt.Sprintf("corrupt block at offset %d: its length", second)) ||
		!strings.Contains(r.stderr, "damaged, not cut short") || strings.Contains(r.stderr, "cut short (recorder killed") {
		t.Fatalf("parse of a damaged trace: code %d, stderr %q", r.code, r.stderr)
	}
	s := magnet(t, "parse", "--salvage", "--meta", "--time", "raw", p)
	if s.code != 0 || !strings.Contains(s.stderr, fmt.Sprintf("--salvage skipped 1 damaged stretch(es), %d bytes, the first at offset %d", third-second, second)) ||
		!strings.Contains(s.stderr, "were read (") {
		t.Fatalf("parse --salvage: code %d, stderr %q", s.code, s.stderr)
	}
	// What salvage printed is what the good file has, less one block.
	goodLines, salvLines := strings.Split(good.stdout, "\n"), strings.Split(s.stdout, "\n")
	if len(salvLines) >= len(goodLines) || len(salvLines) < len(goodLines)/2 {
		t.Fatalf("salvaged %d lines of %d", len(salvLines), len(goodLines))
	}
	for _, args := range [][]string{
		{"report", "--salvage", p},
		{"export", "--salvage", p, "-f", "csv", "-o", filepath.Join(dir, "x.csv")},
	} {
		if r := magnet(t, args...); r.code != 0 || !strings.Contains(r.stdout+r.stderr, "--salvage skipped 1 damaged") {
			t.Errorf("%v: code %d, stdout %q stderr %q", args, r.code, r.stdout, r.stderr)
		}
		if r := magnet(t, args[0], args[2]); r.code == 0 {
			t.Errorf("%s without --salvage: exit 0", args[0])
		}
	}
}

// Flags that meant something other than what they said are refused with
// one line; plot prints the warnings the other commands print.
func TestFlagsSayWhatTheyDo(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "x.mgt")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"record", "-o", out, "--duration", "0s"}, "--duration 0s: want a positive duration (omit the flag to record until COMMAND exits or a signal)"},
		{[]string{"record", "-o", out, "--duration", "-5s"}, "--duration -5s: want a positive duration"},
		{[]string{"record", "-o", out, "--events", ""}, "--groups is empty"},
		{[]string{"daemon", "--socket", filepath.Join(dir, "d.sock"), "--events", ""}, "--groups is empty: name the groups always enabled, or omit it for the baseline"},
		{[]string{"record", "-o", out, "--disable-hook", "tcp_probe,no_such_hook"}, `--disable-hook "no_such_hook": no such program (valid: sock_send_length, `},
		{[]string{"parse", exportFixture, "--since", "2300-01-01"}, `--since: time "2300-01-01" is outside 1678-2262`},
		{[]string{"export", exportFixture, "-f", "csv", "-o", "-", "--until", "1600-01-01T00:00:00Z"}, "is outside 1678-2262"},
		{[]string{"export", exportFixture, "-o", filepath.Join(dir, "no-format.csv")}, "--format is required (tsv, csv, "},
	} {
		oneLineError(t, magnet(t, c.args...), c.want)
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("a refused record created %s", out)
	}
	help := magnet(t, "record", "--help")
	if !strings.Contains(help.stdout, "--disable-hook strings") {
		t.Errorf("record --help: --disable-hook's value is not named strings:\n%s", help.stdout)
	}

	b, err := os.ReadFile(exportFixture)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(dir, "cut.mgt")
	if err := os.WriteFile(cut, b[:len(b)-100], 0o644); err != nil {
		t.Fatal(err)
	}
	r := magnet(t, "plot", cut, "-o", filepath.Join(dir, "cut.svg"))
	if r.code != 0 || !strings.Contains(r.stderr, "magnet: warning: "+cut+" was cut short at offset") {
		t.Fatalf("plot of a cut-short trace: code %d, stderr %q", r.code, r.stderr)
	}
}

// plot of a chain with files missing prints the warning parse prints, and
// exits 0 with the chart of what is there.
func TestPlotChainMissing(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{Name: "mgplotch"})
	dir := t.TempDir()
	ready := filepath.Join(t.TempDir(), "ready")
	port := 30000 + (os.Getpid()+11)%10000
	var e bytes.Buffer
	rec := startRecorder(t, &e, ready, "-q", "--rotate-size", "1MiB", "-o", filepath.Join(dir, "c-%n.mgt"), "--port", fmt.Sprint(port))
	addr := fmt.Sprintf("%s:%d", lab.Server.Addr, port)
	serveTCP(t, lab, addr)
	// A second of flood is some 100,000 events, 4 MB of trace: four files
	// or more at 1 MiB each.
	cli := lab.Command(lab.Client, bin, "workload", "send", "--proto", "tcp", "--to", addr, "--flood", "1s", "--size", "1024")
	if o, err := cli.CombinedOutput(); err != nil {
		t.Fatalf("client: %v %s", err, o)
	}
	rec.Process.Signal(syscall.SIGINT)
	if err := rec.Wait(); err != nil {
		t.Fatalf("record: %v\n%s", err, e.String())
	}
	files, _ := filepath.Glob(filepath.Join(dir, "c-*.mgt"))
	if len(files) < 4 {
		t.Fatalf("%d files, want 4 or more to take one from the middle", len(files))
	}
	if err := os.Remove(files[1]); err != nil {
		t.Fatal(err)
	}
	rest := append([]string{files[0]}, files[2:]...)
	want := "files 1 to 1 of recording " // then its id
	want2 := fmt.Sprintf("are missing between %s and %s", filepath.Base(files[0]), filepath.Base(files[2]))
	p := magnet(t, append([]string{"parse"}, rest...)...)
	if p.code != 0 || !strings.Contains(p.stderr, want) || !strings.Contains(p.stderr, want2) {
		t.Fatalf("parse of the chain less one file: code %d, stderr %q", p.code, p.stderr)
	}
	r := magnet(t, append(append([]string{"plot"}, rest...), "-o", filepath.Join(dir, "chain.svg"))...)
	if r.code != 0 || !strings.Contains(r.stderr, "magnet: warning: ") || !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, want2) {
		t.Fatalf("plot of the chain less one file: code %d, stderr %q", r.code, r.stderr)
	}
	if fi, err := os.Stat(filepath.Join(dir, "chain.svg")); err != nil || fi.Size() == 0 {
		t.Fatalf("no chart: %v", err)
	}
}

// export -f parquet of traces whose dictionaries add up to more columns
// than Parquet takes: one line and a non-zero exit, not parquet-go's panic.
func TestExportParquetTooManyColumns(t *testing.T) {
	dir := t.TempDir()
	args := []string{"export", "-f", "parquet", "--no-conns", "-o", filepath.Join(dir, "out.parquet")}
	for h := range 17 { // 17 x 4,096 fields > 65,534 columns
		et := trace.EventType{ID: 1, Name: "e", Size: 32 + trace.MaxFields}
		for i := range trace.MaxFields {
			et.Fields = append(et.Fields, trace.Field{Name: fmt.Sprintf("f%d_%d", h, i), Offset: 32 + i, Size: 1, Kind: trace.KindUint})
		}
		p := filepath.Join(dir, fmt.Sprintf("t%d.mgt", h))
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		w, err := trace.NewWriter(f, &trace.Header{Host: "h", Types: []trace.EventType{et}}, trace.WriterOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Close(&trace.Summary{}); err != nil {
			t.Fatal(err)
		}
		f.Close()
		args = append(args, p)
	}
	oneLineError(t, magnet(t, args...), "more than the 65534 columns Parquet takes")
}
