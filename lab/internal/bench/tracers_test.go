// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/tracerproc"
)

// TestBpftraceDevQueueLikeMagnet runs the bench's bpftrace script over two
// labs and checks that it prints dev_queue where magnet writes it: on a
// device whose qdisc can queue (tbf), and not on a noqueue veth, where both
// still print dev_xmit. Otherwise the peer tracer would print an event per
// packet that magnet does not, and the comparison would favour magnet.
// bpftrace traces every namespace, so each lab's datagrams have a size no
// other traffic is likely to have, and only lines of that size count.
func TestBpftraceDevQueueLikeMagnet(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and bpftrace")
	}
	if _, err := exec.LookPath("bpftrace"); err != nil {
		t.Skip("bpftrace is not installed (lab/scripts/run.sh installs it)")
	}
	if testing.Short() {
		t.Skip("starts bpftrace, which takes seconds")
	}
	queued := netlab.ForTest(t, netlab.Options{Name: "btq", RateMbit: 100})
	direct := netlab.ForTest(t, netlab.Options{Name: "btd"})
	const sends = 40
	// Frame lengths as the tracepoints see them: UDP payload + 8 + 20 + 14.
	const queuedPayload, directPayload = 1371, 1373
	queuedLen, directLen := queuedPayload+42, directPayload+42

	dir := t.TempDir()
	out, ready := filepath.Join(dir, "bt.out"), filepath.Join(dir, "ready")
	script := strings.ReplaceAll(bpftraceScript, "READY_FILE", ready)
	// -B line rather than the bench's full buffering, so that lines can be
	// waited for while bpftrace runs.
	bt := exec.Command("bpftrace", "--unsafe", "-B", "line", "-o", out, "-e", script)
	var stderr bytes.Buffer
	bt.Stderr = &stderr
	if err := bt.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- bt.Wait() }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = bt.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = bt.Process.Kill()
			<-exited
		}
	}
	t.Cleanup(stop)
	waitFor(t, exited, &stderr, func() bool { _, err := os.Stat(ready); return err == nil }, "bpftrace to attach")

	sendUDP(t, queued, queuedPayload, sends)
	sendUDP(t, direct, directPayload, sends)
	count := func() map[string]int {
		b, _ := os.ReadFile(out)
		n := map[string]int{}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) >= 5 && (f[4] == fmt.Sprint(queuedLen) || f[4] == fmt.Sprint(directLen)) {
				n[f[3]+" "+f[4]]++
			}
		}
		return n
	}
	key := func(ev string, n int) string { return fmt.Sprintf("%s %d", ev, n) }
	all := func() bool {
		n := count()
		return n[key("dev_queue", queuedLen)] >= sends && n[key("dev_xmit", directLen)] >= sends
	}
	// bpftrace may hold its lines until it exits (-B line does not always
	// reach a file): what it writes at the end counts too.
	if !waitUntil(t, exited, &stderr, all, "the datagrams' lines") && !func() bool { stop(); return all() }() {
		// bpftrace traces the whole host: other tests' traffic can
		// overflow its buffers, and the datagrams' lines are then among
		// those it lost.
		if _, lost, _ := tracerproc.BpftraceCount(out, stderr.String()); lost > 0 {
			t.Skipf("bpftrace lost %d events to the host's other traffic; the datagrams' lines are not all there: %v", lost, count())
		}
		t.Fatalf("no the datagrams' lines after 60 s, none lost: %v; %s", count(), stderr.String())
	}
	stop()
	n := count()
	if got := n[key("dev_queue", queuedLen)]; got != sends {
		t.Errorf("tbf device: %d dev_queue lines, want %d", got, sends)
	}
	if got := n[key("dev_queue", directLen)]; got != 0 {
		t.Errorf("noqueue veth: %d dev_queue lines, want none (magnet writes none there)", got)
	}
	if got := n[key("dev_xmit", directLen)]; got != sends {
		t.Errorf("noqueue veth: %d dev_xmit lines, want %d", got, sends)
	}
}

// sendUDP sends n datagrams of size bytes from lab's client to a socket on
// its server.
func sendUDP(t *testing.T, lab *netlab.Lab, size, n int) {
	t.Helper()
	var srv *net.UDPConn
	err := lab.Server.Do(func() (err error) {
		srv, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(lab.Server.Addr, 0)))
		return err
	})
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer srv.Close()
	err = lab.Client.Do(func() error {
		c, err := net.DialUDP("udp4", nil, srv.LocalAddr().(*net.UDPAddr))
		if err != nil {
			return err
		}
		defer c.Close()
		b := make([]byte, size)
		for i := 0; i < n; i++ {
			if _, err := c.Write(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("send datagrams: %v", err)
	}
}

// waitFor polls cond until it holds, failing if bpftrace exits first or
// 60 s pass.
func waitFor(t *testing.T, exited <-chan error, stderr *bytes.Buffer, cond func() bool, what string) {
	t.Helper()
	if !waitUntil(t, exited, stderr, cond, what) {
		t.Fatalf("no %s after 60 s: %s", what, stderr.String())
	}
}

// waitUntil waits up to 60 s for cond, and says whether it came.
func waitUntil(t *testing.T, exited <-chan error, stderr *bytes.Buffer, cond func() bool, what string) bool {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		select {
		case err := <-exited:
			t.Fatalf("bpftrace exited while waiting for %s: %v: %s", what, err, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}
