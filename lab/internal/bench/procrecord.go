// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/internal/tracerproc"
)

// Configurations that run `magnet record --netns <sender's namespace>` as a
// process, as users run it: this build's binary, and the --compare-with
// build's. Both go through the same harness, so their difference in the
// same interleaved run is the change between the builds.
const (
	RecordSenderProc  = "record-sender-proc"
	RecordSenderOther = "record-sender-other"
)

// KnownConfigs are every configuration --configs takes: AllConfigs, the
// two that record as a process (the full run adds them when it has a build
// to compare with) and record-other-port (the churn measurement's).
var KnownConfigs = append(append([]string{}, AllConfigs...), RecordSenderProc, RecordSenderOther, RecordOtherPort, RecordOtherExpr)

// unlimitedOnly are the configurations run on the unlimited link only: the
// link where recording costs throughput (the rate-limited links have room
// to spare, and the full run's time is bounded).
var unlimitedOnly = map[string]bool{RecordSenderProc: true, RecordSenderOther: true}

// recordProc is a `magnet record` process.
type recordProc struct {
	cmd  *exec.Cmd
	done chan error // the process's exit
	// cpuReady is its CPU time when it got ready (processCPUNs), cpu0 when
	// the transfer started (the same until the caller says otherwise).
	cpuReady, cpu0 uint64
	output         string
	stderr         strings.Builder
}

// startRecordProc starts bin's `magnet record` on the sender's namespace of lab.
func (b *bencher) startRecordProc(ctx context.Context, lab *netlab.Lab, bin string) (*recordProc, error) {
	b.seq++
	t := &recordProc{done: make(chan error, 1), output: filepath.Join(b.work, fmt.Sprintf("proc-%d.mgt", b.seq))}
	ready := t.output + ".ready"
	name, args := b.onCPU(lab, lab.Client, bin, "record", "-q", "--netns", lab.Client.NS, "-o", t.output, "--ready-file", ready)
	t.cmd = exec.CommandContext(ctx, name, args...)
	t.cmd.Stderr = &t.stderr
	if err := t.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s record: %w", bin, err)
	}
	go func() { t.done <- t.cmd.Wait() }()
	// The recorder announces itself with its ready file: no other event to
	// wait on from here.
	deadline := time.After(60 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			os.Remove(ready)
			t.cpuReady = processCPUNs(t.cmd.Process.Pid)
			t.cpu0 = t.cpuReady
			return t, nil
		}
		select {
		case <-t.done:
			os.Remove(t.output)
			return nil, fmt.Errorf("%s record exited before it was ready: %s", bin, tracerproc.OneLine(t.stderr.String()))
		case <-deadline:
			_ = t.cmd.Process.Kill()
			<-t.done
			os.Remove(t.output)
			return nil, fmt.Errorf("%s record did not get ready in 60s: %s", bin, tracerproc.OneLine(t.stderr.String()))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// stop ends the recording as a user would (SIGINT) and reads what it wrote.
// CPU: the process's from the moment it was ready (probes attached) to the
// end of the transfer, as for the recorder run in the bench's process
// (loading the programs, which the verifier makes costly, is left out).
func (t *recordProc) stop() (Traced, error) {
	cpu := processCPUNs(t.cmd.Process.Pid) - t.cpu0
	tr, err := t.end()
	tr.CPUS = float64(cpu) / 1e9
	return tr, err
}

// drainNs is what the recorder spent draining the transfer's events: its
// own account (record.CPU.Record, probes attached to last event drained,
// detaching left out) less what it spent before the transfer started
// (idle, while the bench set the transfer up). Unlike the CPU time over
// the transfer, it includes draining what the rings still held at the
// transfer's end. 0 if the build gives no account of its own.
func (t *recordProc) drainNs(tr Traced) uint64 {
	own := uint64(tr.RecordCPUS * 1e9)
	before := t.cpu0 - t.cpuReady
	if own <= before {
		return 0
	}
	return own - before
}

// kill ends the process without waiting for its trace.
func (t *recordProc) kill() {
	_ = t.cmd.Process.Kill()
	<-t.done
	os.Remove(t.output)
}

// end stops the process (SIGINT: it drains and closes its trace, killed if
// it takes over a minute) and counts what the trace holds: events written
// (task, iface and lost records are not events), lost, and produced (the
// BPF counters the recorder put in the summary), and the file's size.
func (t *recordProc) end() (Traced, error) {
	_ = t.cmd.Process.Signal(syscall.SIGINT)
	var err error
	select {
	case err = <-t.done:
	case <-time.After(60 * time.Second):
		_ = t.cmd.Process.Kill()
		err = <-t.done
	}
	defer os.Remove(t.output)
	if err != nil {
		return Traced{}, fmt.Errorf("record: %v: %s", err, tracerproc.OneLine(t.stderr.String()))
	}
	var tr Traced
	if fi, err := os.Stat(t.output); err == nil {
		tr.Bytes = fi.Size()
	}
	r, err := trace.Open(t.output)
	if err != nil {
		return Traced{}, err
	}
	defer r.Close()
	for {
		if _, err := r.Next(); err != nil {
			break
		}
	}
	sum := r.Summary()
	if sum == nil {
		return Traced{}, errors.New("record: trace without a summary")
	}
	tr.Lost = sum.Lost
	tr.ConnOpens, tr.ConnCloses = sum.Events["conn_open"], sum.Events["conn_close"]
	for name, n := range sum.Events {
		if name != "task" && name != "iface" && name != "lost" {
			tr.Events += n
		}
	}
	if cpu, ok := sum.Extra["recorder_cpu_ns"].(map[string]any); ok {
		rec, _ := cpu["record"].(float64)
		sys, _ := cpu["record_system"].(float64)
		tr.RecordCPUS, tr.RecordSysS = rec/1e9, sys/1e9
	}
	if produced, ok := sum.Extra["produced"].(map[string]any); ok {
		for name, v := range produced {
			if f, ok := v.(float64); ok && name != "iface" {
				tr.Produced += uint64(f)
			}
		}
	}
	return tr, nil
}
