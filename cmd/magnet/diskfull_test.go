// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// A recording that fills its disk says what the file holds, not what it
// tried to write, and counts the events that never reached it as lost.
func TestRecordDiskFull(t *testing.T) {
	needRoot(t)
	small := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(small, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", small, "tmpfs", 0, "size=2m"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(small, syscall.MNT_DETACH) })
	lab := netlab.ForTest(t, netlab.Options{Name: "mgfull"})
	out, ready := filepath.Join(small, "full.mgt"), filepath.Join(t.TempDir(), "ready")
	port := 30000 + (os.Getpid()+7)%10000
	rec := exec.Command(bin, "record", "-o", out, "--port", fmt.Sprint(port), "--ready-file", ready)
	var e bytes.Buffer
	rec.Stderr = &e
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- rec.Wait() }()
	defer func() {
		rec.Process.Kill()
		<-done
	}()
	waitFor(t, func() bool { _, err := os.Stat(ready); return err == nil })
	addr := fmt.Sprintf("%s:%d", lab.Server.Addr, port)
	serveTCP(t, lab, addr)
	// 3 s of flood is some 400,000 events, 15 MB of trace: the recorder
	// fills the 2 MiB and stops on its own while it runs or soon after.
	cli := lab.Command(lab.Client, bin, "workload", "send", "--proto", "tcp", "--to", addr, "--flood", "3s", "--size", "1024")
	if o, cerr := cli.CombinedOutput(); cerr != nil {
		t.Fatalf("client: %v %s", cerr, o)
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the recorder did not stop on a full disk:\n%s", e.String())
	}
	done <- err // for the deferred wait
	stderr := e.String()
	if err == nil || !strings.Contains(stderr, "no space left on device") {
		t.Fatalf("record on a full disk: %v\n%s", err, stderr)
	}

	// Ground truth: the file itself.
	fi, serr := os.Stat(out)
	if serr != nil {
		t.Fatal(serr)
	}
	r, oerr := trace.Open(out)
	if oerr != nil {
		t.Fatal(oerr)
	}
	defer r.Close()
	var inFile uint64
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read the full disk's trace: %v", err)
		}
		if n := rec.Type.Name; n != "task" && n != "iface" && n != "lost" {
			inFile++
		}
	}
	if cut, _ := r.Truncated(); !cut {
		t.Fatalf("the trace on a full disk has an end block")
	}
	num := func(re string) uint64 {
		m := regexp.MustCompile(re).FindStringSubmatch(stderr)
		if m == nil {
			t.Fatalf("summary lacks %q:\n%s", re, stderr)
		}
		n, _ := strconv.ParseUint(m[1], 10, 64)
		return n
	}
	if got := num(`events: (\d+) `); got != inFile {
		t.Errorf("summary says %d events, the file holds %d", got, inFile)
	}
	if got := num(`file:   (\d+) bytes`); got != uint64(fi.Size()) {
		t.Errorf("summary says %d bytes, the file has %d", got, fi.Size())
	}
	if unwritten := num(`\((\d+) never reached the file`); unwritten == 0 {
		t.Errorf("no event counted as never reaching the file:\n%s", stderr)
	}
	t.Logf("file %d bytes, %d events; summary:\n%s", fi.Size(), inFile, stderr)
}
