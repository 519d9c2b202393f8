// SPDX-License-Identifier: Apache-2.0

package probeaccuracy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/magnet-tracer/magnet/internal/analyze"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// passivePort is the TCP port of the passive transfer.
const passivePort = 7208

// tcpGoodputShare is the share of a 1514-byte frame that is TCP payload
// (MSS 1448: 20 bytes of IP, 32 of TCP with timestamps, 14 of Ethernet):
// what a TCP transfer can deliver of the available bandwidth.
// Over IPv6 the IP header is 20 bytes longer: MSS 1428.
const (
	tcpGoodputShare  = 1448.0 / (1500 + 14)
	tcp6GoodputShare = 1428.0 / (1500 + 14)
)

// PassiveMeasured is a TCP transfer over the same path recorded by magnet.
type PassiveMeasured struct {
	// GoodputBps is the delivery rate the trace shows: bytes the
	// receiving application read, first to last read.
	GoodputBps float64 `json:"goodput_bps"`
	// TrueBps is the available bandwidth as TCP payload:
	// (capacity − cross) × 1448/1514, cross measured during the transfer.
	TrueBps  float64 `json:"true_bps"`
	CrossBps float64 `json:"cross_bps"`
	Err      float64 `json:"err"`
	// Bytes the transfer moved and how long it ran.
	Bytes  int64   `json:"bytes"`
	TookS  float64 `json:"took_s"`
	Events uint64  `json:"events"`
	Lost   uint64  `json:"lost"`
	Failed string  `json:"failed,omitempty"`
}

// passive runs a TCP flood from the sender to the receiver for
// PassiveDuration while `magnet record` (the binary, as a user runs it)
// records the receiver's namespace, and reads the delivery rate back from
// the trace.
func (l *lab) passive(ctx context.Context, capBits float64) (*PassiveMeasured, error) {
	work, err := os.MkdirTemp("", "magnet-probeaccuracy-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	trace := filepath.Join(work, "transfer.mgt")
	rec, err := l.startRecord(ctx, trace, filepath.Join(work, "ready"))
	if err != nil {
		return nil, err
	}
	defer rec.kill()

	before, err := l.crossCounter()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	moved, xerr := l.transfer(ctx)
	took := time.Since(t0)
	after, err := l.crossCounter()
	if err != nil {
		return nil, err
	}
	summary, err := rec.stop()
	if err != nil {
		return nil, err
	}
	if xerr != nil {
		return nil, xerr
	}
	pm := &PassiveMeasured{Bytes: moved, TookS: took.Seconds(), Lost: summary.Lost}
	for name, n := range summary.Events {
		if name != "task" && name != "iface" && name != "lost" {
			pm.Events += n
		}
	}
	pm.CrossBps = float64(after-before) * 8 / took.Seconds()
	share := tcpGoodputShare
	if l.opts.IPv6 {
		share = tcp6GoodputShare
	}
	pm.TrueBps = (capBits - pm.CrossBps) * share
	rep, err := analyze.Modulation([]string{trace}, 0)
	if err != nil {
		return nil, fmt.Errorf("analyze the trace: %w", err)
	}
	for _, c := range rep.Conns {
		if c.Throughput != nil && c.Throughput.AppBytes > 0 && c.Throughput.AppFirstLast > pm.GoodputBps {
			pm.GoodputBps = c.Throughput.AppFirstLast
		}
	}
	if pm.GoodputBps == 0 {
		return nil, errors.New("the trace shows no data read by the receiver")
	}
	pm.Err = (pm.GoodputBps - pm.TrueBps) / pm.TrueBps
	return pm, nil
}

// recorder is a running `magnet record`.
type recorder struct {
	cmd    *exec.Cmd
	stderr *strings.Builder
	exited chan error // receives Wait's result once the process is gone
	trace  string
	done   bool
}

// recordReadyWait bounds how long `magnet record` may take to attach its
// probes: loading and verifying them takes seconds on a busy host.
const recordReadyWait = 60 * time.Second

// startRecord starts `magnet record` on the receiver's namespace and the
// transfer's port, writing trace, and waits until its probes are attached
// (it writes ready then).
func (l *lab) startRecord(ctx context.Context, trace, ready string) (*recorder, error) {
	cmd := exec.CommandContext(ctx, l.opts.Magnet, "record", "-q", "-o", trace, "--netns", l.path.Receiver.NS,
		"--port", strconv.Itoa(passivePort), "--ready-file", ready)
	r := &recorder{cmd: cmd, stderr: &strings.Builder{}, exited: make(chan error, 1), trace: trace}
	cmd.Stderr = r.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start magnet record: %w", err)
	}
	go func() { r.exited <- cmd.Wait() }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(recordReadyWait)
	for {
		if _, err := os.Stat(ready); err == nil {
			return r, nil
		}
		select {
		case err := <-r.exited:
			r.done = true
			return nil, fmt.Errorf("magnet record ended before it was ready: %v: %s", err, oneLine(r.stderr.String()))
		case <-deadline:
			r.kill()
			return nil, fmt.Errorf("magnet record not ready after %v: %s", recordReadyWait, oneLine(r.stderr.String()))
		case <-tick.C:
		}
	}
}

// stop ends the recording as a user would (SIGINT), waits for the trace
// to be complete and returns its summary.
func (r *recorder) stop() (*trace.Summary, error) {
	if err := r.cmd.Process.Signal(os.Interrupt); err != nil {
		return nil, fmt.Errorf("stop magnet record: %w", err)
	}
	err := <-r.exited
	r.done = true
	if err != nil {
		return nil, fmt.Errorf("magnet record: %v: %s", err, oneLine(r.stderr.String()))
	}
	tr, err := trace.Open(r.trace)
	if err != nil {
		return nil, err
	}
	defer tr.Close()
	for {
		if _, err := tr.Next(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("read the trace: %w", err)
		}
	}
	if tr.Summary() == nil {
		return nil, errors.New("the trace was cut short: magnet record did not finish it")
	}
	return tr.Summary(), nil
}

// kill ends the recorder if it still runs.
func (r *recorder) kill() {
	if r.done {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.exited
	r.done = true
}

// transfer runs `magnet workload serve` on the receiver and `magnet
// workload send --flood` on the sender, and returns the bytes received.
func (l *lab) transfer(ctx context.Context) (int64, error) {
	addr := netip.AddrPortFrom(l.addr(l.path.Receiver), passivePort).String()
	srv := l.command(ctx, l.path.Receiver, "workload", "serve", "--proto", "tcp", "--listen", addr)
	out, err := srv.StdoutPipe()
	if err != nil {
		return 0, err
	}
	var srvErr strings.Builder
	srv.Stderr = &srvErr
	if err := srv.Start(); err != nil {
		return 0, fmt.Errorf("start transfer receiver: %w", err)
	}
	waited := false
	defer func() {
		if !waited {
			_ = srv.Process.Kill()
			_ = srv.Wait()
		}
	}()
	lines := bufio.NewScanner(out)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "listening") {
		return 0, fmt.Errorf("transfer receiver did not start: %s", oneLine(srvErr.String()))
	}
	snd := l.command(ctx, l.path.Sender, "workload", "send", "--proto", "tcp", "--to", addr,
		"--flood", l.opts.PassiveDuration.String(), "--size", "65536")
	if msg, err := snd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("transfer sender: %v: %s", err, oneLine(string(msg)))
	}
	var got int64
	for lines.Scan() {
		if _, err := fmt.Sscanf(lines.Text(), "received %d bytes", &got); err == nil {
			break
		}
	}
	waited = true
	if err := srv.Wait(); err != nil {
		return 0, fmt.Errorf("transfer receiver: %v: %s", err, oneLine(srvErr.String()))
	}
	return got, nil
}

func (l *lab) command(ctx context.Context, h netlab.Host, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.NS, l.opts.Magnet}, args...)...)
}
