// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/flight"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// traceRecords reads every record of a trace file, with the flight
// recorder's result if its summary has one.
func traceRecords(t *testing.T, path string) (recs []trace.Record, res *flight.Result) {
	t.Helper()
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		rec.Data = bytes.Clone(rec.Data)
		recs = append(recs, rec)
	}
	if sum := r.Summary(); sum != nil {
		if v, ok := sum.Extra[flight.ExtraKey]; ok {
			b, _ := json.Marshal(v)
			res = new(flight.Result)
			if err := json.Unmarshal(b, res); err != nil {
				t.Fatalf("%s: flight result %s: %v", path, b, err)
			}
		}
	}
	return recs, res
}

// countsIn counts the records of each type with a time in [from, to),
// leaving out copies carried into a file and task records (a recorder
// writes one when a thread is new to its own stream).
func countsIn(recs []trace.Record, from, to uint64) map[string]int {
	out := map[string]int{}
	for _, r := range recs {
		if r.Time() < from || r.Time() >= to || r.Type.Name == "task" {
			continue
		}
		if (r.Type.Name == "conn_open" || r.Type.Name == "iface") && r.Flags()&trace.FlagCarried != 0 {
			continue
		}
		out[r.Type.Name]++
	}
	return out
}

// clockSkew bounds how far apart two recorders' times of one event are:
// each has its own programs on the same hook, which read the clock one
// after the other (microseconds apart; a millisecond leaves room for an
// interrupt between them).
const clockSkew = uint64(time.Millisecond)

// TestFlightRetransTrigger runs a normal recording and a flight recorder
// (--flight 2s --flight-after 1s --trigger retrans) side by side while a
// paced iperf3 transfer (no loss) is followed by a bulk one across a lossy
// bottleneck. The flight file must exist, have the first retransmission
// the full recording has as its trigger, hold the 2 s before it (the paced
// transfer's events reach back to its asked start), and hold, type by
// type, the events the full recording has in the same interval: at least
// those clockSkew inside it and at most those clockSkew around it, the two
// recorders' clocks being read apart.
func TestFlightRetransTrigger(t *testing.T) {
	needRoot(t)
	needTools(t, "iperf3")
	p := lossyPath(t)
	port := uniquePort()
	dir := t.TempDir()
	var fl *flight.Sink
	const window, after = 2 * time.Second, time.Second
	flightRec := startRecording(t, record.Config{
		Output:  filepath.Join(dir, "flight.mgt"),
		Filters: record.Filters{Port: port},
		NewSink: func(h *trace.Header) (record.Sink, error) {
			s, err := flight.New(h, flight.Options{Output: filepath.Join(dir, "flight.mgt"), Window: window, After: after, Triggers: flight.Triggers{Retrans: true}})
			fl = s
			return s, err
		},
	})
	full := startRecording(t, record.Config{Filters: record.Filters{Port: port}})

	// 1 kB every 5 ms for 3 s: far below the bottleneck, no loss.
	addr := p.Receiver.Addr.String() + ":" + strconv.Itoa(port)
	srv := p.Command(p.Receiver, magnetBin, "workload", "serve", "--listen", addr, "--count", "600", "--size", "1000")
	srvOut, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Wait()
	if _, err := bufio.NewReader(srvOut).ReadString('\n'); err != nil {
		t.Fatalf("workload server: %v", err)
	}
	run(t, p.Command(p.Sender, magnetBin, "workload", "send", "--to", addr, "--count", "600", "--size", "1000", "--interval", "5ms"))
	pathIperf3Server(t, p, port)
	pathIperf3Send(t, p, port, "24M")
	pathQuiet(t, p, port)
	// The capture ends once the recorder has drained past its end.
	time.Sleep(after + 3*time.Second)
	fullRes := full.stop(t)
	flightRes := flightRec.stop(t)
	if fullRes.Lost != 0 || flightRes.Lost != 0 {
		t.Fatalf("lost events (full %d, flight %d): the comparison needs both complete", fullRes.Lost, flightRes.Lost)
	}
	t.Logf("drained: full %v (missed %d), flight %v (missed %d)", fullRes.Events, fullRes.Missed, flightRes.Events, flightRes.Missed)
	files := fl.Files()
	if len(files) == 0 {
		t.Fatal("no flight file written")
	}
	fullRecs, _ := traceRecords(t, full.path)
	var firstRetrans uint64
	for _, r := range fullRecs {
		if r.Type.Name == "tcp_retrans" {
			firstRetrans = r.Time()
			break
		}
	}
	if firstRetrans == 0 {
		t.Fatal("no tcp_retrans in the full recording: the bottleneck did not drop")
	}
	recs, res := traceRecords(t, files[0])
	if res == nil {
		t.Fatalf("%s: no flight result in its summary", files[0])
	}
	if len(res.Triggers) == 0 || res.Triggers[0].Reason != "retrans" || res.Triggers[0].TimeNs+clockSkew < firstRetrans || res.Triggers[0].TimeNs > firstRetrans+clockSkew {
		t.Fatalf("first trigger %+v, want retrans at %d (the full recording's first tcp_retrans)", res.Triggers, firstRetrans)
	}
	for _, r := range recs {
		if r.Type.Name == "tcp_retrans" {
			if r.Time() != res.Triggers[0].TimeNs {
				t.Errorf("the file's first tcp_retrans at %d, its trigger at %d", r.Time(), res.Triggers[0].TimeNs)
			}
			break
		}
	}
	if res.AskedFromNs != res.Triggers[0].TimeNs-uint64(window) || res.FromNs != res.AskedFromNs || res.EvictedRecords != 0 {
		t.Errorf("window [%d (asked %d), %d), %d evicted; want the full %v before %d", res.FromNs, res.AskedFromNs, res.ToNs, res.EvictedRecords, window, firstRetrans)
	}
	var first uint64
	for _, r := range recs {
		if r.Flags()&trace.FlagCarried == 0 && r.Type.Name != "task" {
			first = r.Time()
			break
		}
	}
	// The paced transfer makes events every millisecond or so.
	if first < res.FromNs || first > res.FromNs+uint64(100*time.Millisecond) {
		t.Errorf("first event at %d, window from %d: want events back to its start", first, res.FromNs)
	}
	got := countsIn(recs, res.FromNs, res.ToNs)
	inner := countsIn(fullRecs, res.FromNs+clockSkew, res.ToNs-clockSkew)
	outer := countsIn(fullRecs, res.FromNs-clockSkew, res.ToNs+clockSkew)
	if len(inner) < 5 {
		t.Fatalf("the full recording has only %v in the window", inner)
	}
	// The two recorders' programs do not see exactly the same events:
	// the kernel skips a run of a program already running on its CPU
	// (Result.Missed; tcp_probe's, mostly), and tcp_state's once-per-srtt
	// sampling reads each recorder's own clock. Per type, the window may
	// differ by what the whole recordings differ by, no more.
	exact := 0
	for name, n := range outer {
		slack := int(fullRes.Events[name]) - int(flightRes.Events[name])
		slack = max(slack, -slack)
		if got[name] < inner[name]-slack || got[name] > n+slack {
			t.Errorf("%s: %d in the flight file; the full recording has %d to %d in the same interval (the recordings differ by %d)", name, got[name], inner[name], n, slack)
		}
		if inner[name] == n && slack == 0 {
			exact++
			if got[name] != n {
				t.Errorf("%s: %d in the flight file, %d in the full recording", name, got[name], n)
			}
		}
	}
	for name, n := range got {
		if _, ok := outer[name]; !ok {
			t.Errorf("%s: %d in the flight file, none in the full recording's same interval", name, n)
		}
	}
	var carried int
	for _, r := range recs {
		if r.Flags()&trace.FlagCarried != 0 {
			carried++
		}
	}
	if uint64(carried) != res.Carried || carried == 0 {
		t.Errorf("%d carried records, the result says %d; want the live connections' conn_open at least", carried, res.Carried)
	}
	t.Logf("%d flight file(s); first: %d records, %d carried, triggers %v, window %v + %v; counts %v (%d of %d types compared exactly)", len(files), len(recs), carried, res.Fired, window, time.Duration(res.ToNs-res.Triggers[0].TimeNs), got, exact, len(outer))
}

// startFlightCLI runs `magnet record --flight` as a user would, with args,
// and returns once its probes are attached.
func startFlightCLI(t *testing.T, dir string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	ready := filepath.Join(dir, "ready")
	cmd := exec.Command(magnetBin, append([]string{"record", "-o", filepath.Join(dir, "x.mgt"), "--ready-file", ready}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := os.Stat(ready); err == nil {
			return cmd, &stderr
		}
		if time.Now().After(deadline) {
			t.Fatalf("recorder not ready: %s", stderr.String())
		}
		// The ready file is the recorder's only sign; it has no pipe.
		time.Sleep(20 * time.Millisecond)
	}
}

func flightFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "x-*.mgt"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestFlightSignalAndNoTrigger: SIGUSR1 writes a file whatever --trigger
// says, holding the events before it; with no trigger and no signal,
// nothing is written.
func TestFlightSignalAndNoTrigger(t *testing.T) {
	needRoot(t)
	lab := netlab.ForTest(t, netlab.Options{})
	t.Run("signal", func(t *testing.T) {
		port := uniquePort()
		dir := t.TempDir()
		cmd, stderr := startFlightCLI(t, dir, "--flight", "5s", "--flight-after", "0s", "--trigger", "retrans", "--port", strconv.Itoa(port))
		ftp(t, lab, "tcp", port, 20)
		if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		// The trigger is acted on at the recorder's next flush (every
		// second) and the file closes once its time is drained; SIGINT then
		// ends the recording, which ends a file still open.
		var files []string
		for deadline := time.Now().Add(10 * time.Second); len(files) == 0 && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
			files = flightFiles(t, dir)
		}
		cmd.Process.Signal(syscall.SIGINT)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("record: %v\n%s", err, stderr)
		}
		files = flightFiles(t, dir)
		if len(files) != 1 {
			t.Fatalf("flight files %v, want one\n%s", files, stderr)
		}
		recs, res := traceRecords(t, files[0])
		if res == nil || len(res.Triggers) != 1 || res.Triggers[0].Reason != "signal" {
			t.Fatalf("flight result %+v, want one signal trigger", res)
		}
		counts := countsIn(recs, res.FromNs, res.ToNs)
		if counts["sock_send"] != 20 {
			t.Errorf("sock_send %d in the file, the workload sent 20 messages (%v)", counts["sock_send"], counts)
		}
		if !strings.Contains(stderr.String(), files[0]) {
			t.Errorf("the recorder did not name %s:\n%s", files[0], stderr)
		}
	})
	t.Run("none", func(t *testing.T) {
		port := uniquePort()
		dir := t.TempDir()
		cmd, stderr := startFlightCLI(t, dir, "--flight", "5s", "--trigger", "retrans,drop", "--port", strconv.Itoa(port))
		ftp(t, lab, "tcp", port, 20)
		cmd.Process.Signal(syscall.SIGINT)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("record: %v\n%s", err, stderr)
		}
		if files := flightFiles(t, dir); len(files) != 0 {
			t.Errorf("flight files %v with no trigger", files)
		}
		if !strings.Contains(stderr.String(), "no trigger fired") {
			t.Errorf("the recorder did not say nothing was written:\n%s", stderr)
		}
		if _, err := os.Stat(filepath.Join(dir, "x.mgt")); err == nil {
			t.Error("x.mgt itself was written")
		}
	})
}
