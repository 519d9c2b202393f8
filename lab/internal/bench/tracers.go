// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/tracerproc"
)

// tracer is whatever watches a transfer; stop ends it and says what it did.
type tracer interface {
	stop() (Traced, error)
}

// unavailable says why a configuration cannot run on this machine, or "".
func unavailable(config string) string {
	tool := map[string]string{TcpdumpSender: "tcpdump", TcpdumpReceiver: "tcpdump", Bpftrace: "bpftrace"}[config]
	if tool == "" {
		return ""
	}
	if _, err := exec.LookPath(tool); err != nil {
		return fmt.Sprintf("not available: %s not installed (lab/scripts/run.sh installs it with apt)", tool)
	}
	return ""
}

func (b *bencher) start(ctx context.Context, lab *netlab.Lab, config string, port, buffer int) (tracer, error) {
	switch config {
	case Baseline:
		return nopTracer{}, nil
	case Loaded:
		return startLoaded(buffer, probe.Filters{})
	case Hooks:
		return startHooks(buffer)
	case RecordSender:
		return b.startPinned(lab, lab.Client, func() (tracer, error) {
			return b.startRecord(ctx, record.Filters{NetNS: lab.Client.NS}, buffer, nil)
		})
	case RecordReceiver:
		return b.startPinned(lab, lab.Server, func() (tracer, error) {
			return b.startRecord(ctx, record.Filters{NetNS: lab.Server.NS}, buffer, nil)
		})
	case RecordSenderSock:
		return b.startPinned(lab, lab.Client, func() (tracer, error) {
			return b.startRecord(ctx, record.Filters{NetNS: lab.Client.NS}, buffer, nil, func(c *record.Config) {
				c.Groups = event.GroupSock | event.GroupConn
			})
		})
	case RecordOtherPort:
		return b.startPinned(lab, lab.Client, func() (tracer, error) {
			return b.startRecord(ctx, record.Filters{Port: OtherPort}, buffer, nil)
		})
	case RecordOtherExpr:
		return b.startPinned(lab, lab.Client, func() (tracer, error) {
			return b.startRecord(ctx, record.Filters{Pcap: OtherExpr}, buffer, nil)
		})
	case TcpdumpSender:
		return b.startTcpdump(lab, lab.Client)
	case TcpdumpReceiver:
		return b.startTcpdump(lab, lab.Server)
	case Bpftrace:
		return b.startBpftrace()
	case RecordSenderProc:
		return b.startRecordProc(ctx, lab, b.opts.Magnet)
	case RecordSenderOther:
		return b.startRecordProc(ctx, lab, b.opts.CompareWith)
	}
	return nil, fmt.Errorf("unknown configuration %q", config)
}

type nopTracer struct{}

func (nopTracer) stop() (Traced, error) { return Traced{}, nil }

// loadedTracer holds magnet's programs attached, every default group, no
// filter, with nobody reading the ring: once it is full every event is
// counted as lost, which is the cheapest a loaded magnet can be. Silenced
// (the hooks configuration, probe.Silence), none produces an event.
type loadedTracer struct {
	p      *probe.Probe
	silent bool
	// The counts when the transfer's measurement began: what other
	// traffic made between the load and the silence is not the transfer's.
	produced0, lost0 [event.NumTypes]uint64
}

func startLoaded(buffer int, f probe.Filters) (*loadedTracer, error) {
	p, err := probe.Load(probe.Options{
		Groups:       event.DefaultGroups,
		Filters:      f,
		BufferBytes:  buffer,
		ControlBytes: record.ControlBufferBytes,
		SelfTGID:     uint32(os.Getpid()),
	})
	if err != nil {
		return nil, fmt.Errorf("load probes: %w", err)
	}
	return &loadedTracer{p: p}, nil
}

func startHooks(buffer int) (*loadedTracer, error) {
	t, err := startLoaded(buffer, probe.Filters{})
	if err != nil {
		return nil, err
	}
	if err := t.p.Silence(); err != nil {
		t.p.Close()
		return nil, fmt.Errorf("silence probes: %w", err)
	}
	t.silent = true
	if t.produced0, t.lost0, err = t.p.CountersOf(); err != nil {
		t.p.Close()
		return nil, err
	}
	return t, nil
}

// stop counts the events produced and lost since the start. Silenced, that
// should be none: the control ring's records (connections' openings and
// closes, interfaces), told whatever the mask for any connection on the
// host, are left out.
func (t *loadedTracer) stop() (Traced, error) {
	t.p.Detach()
	produced, lost, err := t.p.CountersOf()
	t.p.Close()
	if err != nil {
		return Traced{}, err
	}
	var tr Traced
	for i := range produced {
		switch event.Type(i) {
		case event.ConnOpen, event.ConnClose, event.Iface:
			if t.silent {
				continue
			}
		}
		tr.Produced += produced[i] - t.produced0[i]
		tr.Lost += lost[i] - t.lost0[i]
	}
	return tr, nil
}

// recordTracer is record.Run in this process, as `magnet record` runs it;
// its CPU time is this process's from the moment the probes are attached to
// the moment the trace is closed (the bench itself only waits meanwhile).
type recordTracer struct {
	cancel context.CancelFunc
	done   chan recordDone
	ru0    unix.Rusage
	output string
}

type recordDone struct {
	res *record.Result
	err error
}

// startRecordWith is startRecord with a last say over the configuration.
func (b *bencher) startRecordWith(ctx context.Context, f record.Filters, buffer int, onReady func(), adjust func(*record.Config)) (*recordTracer, error) {
	if adjust == nil {
		return b.startRecord(ctx, f, buffer, onReady)
	}
	return b.startRecord(ctx, f, buffer, onReady, adjust)
}

// startRecord starts a recording; onReady, if set, runs once the probes are
// attached (the cost measurement opens the programs then).
func (b *bencher) startRecord(ctx context.Context, f record.Filters, buffer int, onReady func(), tune ...func(*record.Config)) (*recordTracer, error) {
	b.seq++
	t := &recordTracer{done: make(chan recordDone, 1), output: filepath.Join(b.work, fmt.Sprintf("run-%d.mgt", b.seq))}
	rctx, cancel := context.WithCancel(ctx)
	t.cancel = cancel
	ready := make(chan struct{})
	cfg := record.Config{
		Output:      t.output,
		Groups:      event.DefaultGroups,
		Filters:     f,
		BufferBytes: buffer,
		StatusDir:   b.work,
		Ready: func() {
			if onReady != nil {
				onReady()
			}
			_ = unix.Getrusage(unix.RUSAGE_SELF, &t.ru0)
			close(ready)
		},
	}
	for _, f := range tune {
		f(&cfg)
	}
	go func() {
		res, err := record.Run(rctx, cfg)
		t.done <- recordDone{res, err}
	}()
	select {
	case <-ready:
		return t, nil
	case d := <-t.done:
		cancel()
		os.Remove(t.output)
		if d.err == nil {
			d.err = errors.New("ended before it was ready")
		}
		return nil, fmt.Errorf("record: %w", d.err)
	}
}

func (t *recordTracer) stop() (Traced, error) {
	t.cancel()
	d := <-t.done
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	defer os.Remove(t.output)
	if d.err != nil {
		return Traced{}, fmt.Errorf("record: %w", d.err)
	}
	tr := Traced{Lost: d.res.Lost, Bytes: d.res.Bytes, ConnOpens: d.res.Events["conn_open"], ConnCloses: d.res.Events["conn_close"]}
	for name, n := range d.res.Events {
		// Task and interface records describe events; lost records
		// count them; neither is an event itself.
		if name != "task" && name != "iface" && name != "lost" {
			tr.Events += n
		}
	}
	for name, n := range d.res.Produced {
		// Interface records are produced by BPF but are not events: count
		// them on neither side, or every run shows one per interface
		// "unaccounted".
		if name != "iface" {
			tr.Produced += n
		}
	}
	tr.CPUS = rusageSeconds(ru) - rusageSeconds(t.ru0)
	tr.SysS = float64(ru.Stime.Sec-t.ru0.Stime.Sec) + float64(ru.Stime.Usec-t.ru0.Stime.Usec)/1e6
	return tr, nil
}

func rusageSeconds(ru unix.Rusage) float64 {
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

// procTracer is an external tracer process (tcpdump, bpftrace) whose
// stderr is kept for its summary.
type procTracer struct{ *tracerproc.Proc }

// end stops the process with SIGINT (both tools then flush and print their
// summary), killing it if it lingers, and returns its CPU time.
func (t procTracer) end() (float64, error) {
	err := t.End(30 * time.Second)
	return cpuSeconds(t.Cmd.ProcessState), err
}

// startProc starts a tracer and waits until it is ready: it printed mark on
// stderr or, if readyPath is set, created that file.
func (b *bencher) startProc(name string, cmd *exec.Cmd, output, mark, readyPath string) (procTracer, error) {
	p, err := tracerproc.Start(name, cmd, output, mark, readyPath, 20*time.Second)
	return procTracer{p}, err
}

type tcpdumpTracer struct{ procTracer }

// startTcpdump captures on h's veth into a file, as `tcpdump -w` does;
// -Z root keeps it from dropping to a user that cannot write our work dir.
func (b *bencher) startTcpdump(lab *netlab.Lab, h netlab.Host) (tracer, error) {
	b.seq++
	out := filepath.Join(b.work, fmt.Sprintf("run-%d.pcap", b.seq))
	args := []string{"-n", "-i", h.Iface, "-w", out, "-Z", "root"}
	if b.opts.TcpdumpSnaplen > 0 {
		args = append(args, "-s", strconv.Itoa(b.opts.TcpdumpSnaplen))
	}
	t, err := b.startProc("tcpdump", b.labCommand(lab, h, "tcpdump", args...), out, "listening on", "")
	if err != nil {
		return nil, err
	}
	return tcpdumpTracer{t}, nil
}

var (
	reCaptured = regexp.MustCompile(`(\d+) packets? captured`)
	reDropped  = regexp.MustCompile(`(\d+) packets? dropped by kernel`)
)

func (t tcpdumpTracer) stop() (Traced, error) {
	defer os.Remove(t.Output)
	cpu, err := t.end()
	if err != nil {
		return Traced{}, err
	}
	msg := t.Stderr()
	tr := Traced{CPUS: cpu, Events: tracerproc.FirstNumber(reCaptured, msg), Drops: tracerproc.FirstNumber(reDropped, msg)}
	if fi, err := os.Stat(t.Output); err == nil {
		tr.Bytes = fi.Size()
	}
	return tr, nil
}

// bpftraceScript is the nearest bpftrace gets to magnet's default groups
// with tracepoints only: socket calls, TCP receive/state/retransmit,
// device queue/transmit/receive and drops, one printf line per event.
// tcp_sendmsg_locked is left out, as magnet's default leaves out tcp_send
// (group tcpsend, opt-in), and dev_queue is printed only where the tx
// queue's qdisc can queue, as magnet writes it (on a noqueue device such as
// a veth, dev_xmit follows in the same call).
// magnet's tcp_xmit (sockops) and ip_send/ip_recv (cgroup_skb) have no
// tracepoint, and without kprobes bpftrace cannot reach them. It traces
// every namespace: a tracepoint has no cheap namespace filter.
//
// BEGIN runs once every probe is attached; the file it touches tells us so
// (output to a file is block-buffered, so a printed line would not show).
const bpftraceScript = `
BEGIN { system("touch READY_FILE"); }
tracepoint:sock:sock_send_length { printf("%llu %d %d sock_send %d\n", nsecs, cpu, tid, args->ret); }
tracepoint:sock:sock_recv_length { printf("%llu %d %d sock_recv %d\n", nsecs, cpu, tid, args->ret); }
tracepoint:tcp:tcp_probe { printf("%llu %d %d tcp_rcv %u %u %u %u\n", nsecs, cpu, tid, args->data_len, args->snd_nxt, args->snd_una, args->snd_cwnd); }
tracepoint:tcp:tcp_retransmit_skb { printf("%llu %d %d tcp_retrans\n", nsecs, cpu, tid); }
tracepoint:sock:inet_sock_set_state { printf("%llu %d %d tcp_state %d %d\n", nsecs, cpu, tid, args->oldstate, args->newstate); }
tracepoint:net:net_dev_queue {
	$skb = (struct sk_buff *)args->skbaddr;
	$txq = $skb->dev->_tx + $skb->queue_mapping;
	if ($txq->qdisc->enqueue != 0) { printf("%llu %d %d dev_queue %u\n", nsecs, cpu, tid, args->len); }
}
tracepoint:net:net_dev_start_xmit { printf("%llu %d %d dev_xmit %u %u\n", nsecs, cpu, tid, args->len, args->gso_segs); }
tracepoint:net:netif_receive_skb { printf("%llu %d %d dev_recv %u\n", nsecs, cpu, tid, args->len); }
tracepoint:skb:kfree_skb { printf("%llu %d %d drop %d\n", nsecs, cpu, tid, args->reason); }
`

type bpftraceTracer struct{ procTracer }

func (b *bencher) startBpftrace() (tracer, error) {
	b.seq++
	out := filepath.Join(b.work, fmt.Sprintf("run-%d.bt", b.seq))
	ready := out + ".ready"
	defer os.Remove(ready)
	script := strings.ReplaceAll(bpftraceScript, "READY_FILE", ready)
	t, err := b.startProc("bpftrace", exec.Command("bpftrace", "--unsafe", "-B", "full", "-o", out, "-e", script), out, "", ready)
	if err != nil {
		return nil, err
	}
	return bpftraceTracer{t}, nil
}

func (t bpftraceTracer) stop() (Traced, error) {
	defer os.Remove(t.Output)
	cpu, err := t.end()
	if err != nil {
		return Traced{}, err
	}
	tr := Traced{CPUS: cpu, Bytes: t.Size()}
	tr.Events, tr.Lost, err = tracerproc.BpftraceCount(t.Output, t.Stderr())
	return tr, err
}
