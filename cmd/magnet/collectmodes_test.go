// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/magnet-tracer/magnet/internal/flight"
	"github.com/magnet-tracer/magnet/internal/rotate"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// loopbackTransfer listens on a port the kernel gives and returns it, and
// a function that sends writes×size bytes to it over one connection and
// waits until the server has read them all.
func loopbackTransfer(t *testing.T, writes, size int) (int, func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().(*net.TCPAddr).Port, func() {
		t.Helper()
		got := make(chan int64, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				got <- -1
				return
			}
			defer c.Close()
			n, _ := io.Copy(io.Discard, c)
			got <- n
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		buf := bytes.Repeat([]byte{'m'}, size)
		for i := 0; i < writes; i++ {
			if _, err := c.Write(buf); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
		if n := <-got; n != int64(writes*size) {
			t.Fatalf("the server read %d bytes, the client wrote %d", n, writes*size)
		}
	}
}

// runCollect starts `magnet collect --config cfgPath --ready-file ready`
// with env added to its environment and its stderr to stderr; it is
// killed at the end of the test unless the test waited for it.
func runCollect(t *testing.T, stderr io.Writer, cfgPath, ready string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, "collect", "--config", cfgPath, "--ready-file", ready)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd
}

// startCollect runs `magnet collect` on config (no targets: files stay in
// the spool) until it is ready.
func startCollect(t *testing.T, dir, config string) (*exec.Cmd, *lockedBuffer) {
	t.Helper()
	cfgPath := filepath.Join(dir, "collect.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(dir, "ready")
	logs := &lockedBuffer{}
	cmd := runCollect(t, logs, cfgPath, ready)
	waitFor(t, func() bool { _, err := os.Stat(ready); return err == nil })
	return cmd, logs
}

func stopCollect(t *testing.T, cmd *exec.Cmd, logs *lockedBuffer) {
	t.Helper()
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("collect after SIGTERM: %v\n%s", err, logs.String())
	}
}

// readTrace returns a trace file's records and its flight result (nil for
// an ordinary trace).
func readTrace(t *testing.T, path string) ([]trace.Record, *flight.Result) {
	t.Helper()
	r, err := trace.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var recs []trace.Record
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		rec.Data = bytes.Clone(rec.Data)
		recs = append(recs, rec)
	}
	var res *flight.Result
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

// TestCollectFlight: `magnet collect` with flight.window writes nothing
// while no trigger fires; each SIGUSR1 writes one file into the spool,
// named by the spool's pattern (so the shipper takes it) and never over
// another, holding the window before it: the bytes and calls of a loopback
// transfer the test made, as the application counted them.
func TestCollectFlight(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	spool := filepath.Join(dir, "spool")
	const writes, size = 25, 10000
	port, transfer := loopbackTransfer(t, writes, size)
	cmd, logs := startCollect(t, dir, fmt.Sprintf(`host: fr
spool: %s
pattern: "%%h-%%Y%%m%%dT%%H%%M%%S.mgt"
filters: {port: %d}
flight: {window: 30s, after: 0s, triggers: "retrans", memory: 16MiB}
`, spool, port))
	spoolFiles := func() []string {
		files, _ := filepath.Glob(filepath.Join(spool, "fr-*.mgt"))
		return files
	}
	finished := func(n int) func() bool {
		return func() bool {
			files := spoolFiles()
			if len(files) != n {
				return false
			}
			for _, f := range files {
				if rotate.InUse(f) {
					return false
				}
			}
			return true
		}
	}
	transfer()
	if files := spoolFiles(); len(files) != 0 {
		t.Fatalf("files %v before any trigger", files)
	}
	// Two triggers in the same second: two files, the second with a
	// name of its own.
	cmd.Process.Signal(syscall.SIGUSR1)
	waitFor(t, finished(1))
	cmd.Process.Signal(syscall.SIGUSR1)
	waitFor(t, finished(2))
	stopCollect(t, cmd, logs)
	files := spoolFiles()
	if len(files) != 2 {
		t.Fatalf("spool files %v, want two\n%s", files, logs.String())
	}
	pat, err := rotate.ParsePattern(filepath.Join(spool, "%h-%Y%m%dT%H%M%S.mgt"), "fr")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !pat.Matches(filepath.Base(f)) {
			t.Errorf("%s does not match the spool's pattern: the shipper would not take it", f)
		}
		recs, res := readTrace(t, f)
		if res == nil || res.Fired["signal"] != 1 || len(res.Triggers) != 1 {
			t.Fatalf("%s: flight result %+v, want one signal trigger", f, res)
		}
		var sent, calls, recvd int64
		for _, r := range recs {
			if r.Time() < res.FromNs {
				continue
			}
			switch r.Type.Name {
			case "sock_send":
				sent += int64(r.Size())
				calls++
			case "sock_recv":
				if r.Size() > 0 {
					recvd += int64(r.Size())
				}
			}
		}
		// Both files' windows reach back before the transfer.
		if sent != writes*size || calls != writes || recvd != writes*size {
			t.Errorf("%s: sock_send %d bytes in %d calls, sock_recv %d bytes; the application wrote and read %d bytes in %d writes",
				f, sent, calls, recvd, writes*size, writes)
		}
	}
	if !strings.Contains(logs.String(), "flight recorder: the last 30s kept in memory") {
		t.Errorf("the service did not say it runs a flight recorder:\n%s", logs.String())
	}
}

// TestCollectSummary: `magnet collect` with summary writes conn_summary
// records into the spool whose bytes add up to what the application wrote
// and read over loopback. They are read from the sockets, which keep no
// count of calls: sock_send_calls stays 0.
func TestCollectSummary(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	spool := filepath.Join(dir, "spool")
	const writes, size = 25, 10000
	port, transfer := loopbackTransfer(t, writes, size)
	cmd, logs := startCollect(t, dir, fmt.Sprintf(`host: sm
spool: %s
pattern: "%%h-%%Y%%m%%dT%%H%%M%%S.mgt"
filters: {port: %d}
summary: 200ms
`, spool, port))
	transfer()
	stopCollect(t, cmd, logs)
	files, _ := filepath.Glob(filepath.Join(spool, "sm-*.mgt"))
	if len(files) == 0 {
		t.Fatalf("no file in the spool\n%s", logs.String())
	}
	var sent, calls, recvd, summaries uint64
	for _, f := range files {
		recs, _ := readTrace(t, f)
		for _, r := range recs {
			if r.Type.Name != "conn_summary" {
				continue
			}
			summaries++
			for name, sum := range map[string]*uint64{"sock_send_bytes": &sent, "sock_send_calls": &calls, "sock_recv_bytes": &recvd} {
				v, ok := r.Uint(name)
				if !ok {
					t.Fatalf("conn_summary has no %s", name)
				}
				*sum += v
			}
		}
	}
	if sent != writes*size || calls != 0 || recvd != writes*size {
		t.Errorf("%d conn_summary records: sock_send %d bytes in %d calls (want none counted), sock_recv %d bytes; the application wrote and read %d bytes in %d writes",
			summaries, sent, calls, recvd, writes*size, writes)
	}
}
