// SPDX-License-Identifier: Apache-2.0

package overhead

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/internal/tracerproc"
)

// traced is what a tracer says it did over a run.
type traced struct {
	Events  uint64 // events (tcpdump: packets received by its filter; perf: samples)
	Lost    uint64 // events lost before the file (tcpdump: dropped by kernel)
	Written int64  // bytes of its output file
	// TraceSent and TraceRecv are, for a magnet trace with socket events,
	// the application bytes its sock_send and sock_recv events give the
	// workload's data connection; -1 when it cannot say.
	TraceSent, TraceRecv int64
}

// tracer is whatever records beside the workload.
type tracer interface {
	// pid is the tracer's process, 0 for none.
	pid() int
	// stop ends the tracer the way a user would (SIGINT) and says what it did.
	stop() (traced, error)
}

type nothing struct{}

func (nothing) pid() int              { return 0 }
func (nothing) stop() (traced, error) { return traced{TraceSent: -1, TraceRecv: -1}, nil }

// proc is a tracer process as the benchmark starts it: ready within a
// minute, given two to write out what it holds when stopped.
type proc struct{ *tracerproc.Proc }

func startProc(name string, cmd *exec.Cmd, output, mark, readyPath string) (*proc, error) {
	p, err := tracerproc.Start(name, cmd, output, mark, readyPath, 60*time.Second)
	if err != nil {
		return nil, err
	}
	return &proc{p}, nil
}

func (p *proc) pid() int       { return p.Pid() }
func (p *proc) end() error     { return p.End(2 * time.Minute) }
func (p *proc) size() int64    { return p.Size() }
func (p *proc) output() string { return p.Output }

// magnetTracer is `magnet record` on the whole host, as a user runs it.
type magnetTracer struct {
	*proc
	// server is the workload's listening address and client the
	// sender's, to find its connection among the host's.
	server netip.AddrPort
	client netip.Addr
	name   string // the configuration's
}

func startMagnet(ctx context.Context, bin, work string, seq int, c Config, server netip.AddrPort, client netip.Addr) (*magnetTracer, error) {
	out := filepath.Join(work, fmt.Sprintf("run-%d.mgt", seq))
	ready := out + ".ready"
	args := append([]string{"record", "-q", "-o", out, "--ready-file", ready}, c.Args...)
	p, err := startProc("magnet record", exec.CommandContext(ctx, bin, args...), out, "", ready)
	if err != nil {
		return nil, err
	}
	return &magnetTracer{proc: p, server: server, client: client, name: c.Name}, nil
}

func (t *magnetTracer) stop() (traced, error) {
	defer os.Remove(t.output())
	if err := t.end(); err != nil {
		return traced{}, err
	}
	tr := traced{Written: t.size(), TraceSent: -1, TraceRecv: -1}
	if t.name == RecordFlight {
		// The flight recorder writes a file only on a trigger, and the
		// bench's never fires: a file means it did.
		if written, _ := filepath.Glob(strings.TrimSuffix(t.output(), ".mgt") + "-*.mgt"); len(written) > 0 {
			return tr, errors.New("the flight recorder wrote a file although its trigger cannot fire")
		}
		return tr, nil
	}
	r, err := trace.Open(t.output())
	if err != nil {
		return tr, fmt.Errorf("read the trace: %w", err)
	}
	defer r.Close()
	conns, _, err := export.Conns(r)
	if err != nil {
		return tr, fmt.Errorf("read the trace: %w", err)
	}
	sum := r.Summary()
	if sum == nil {
		return tr, errors.New("read the trace: no summary (recording did not end properly)")
	}
	tr.Lost = sum.Lost
	if t.name == RecordFloor || t.name == RecordNoEmit {
		// Their programs write nothing but the connections' openings and
		// closes: no event to divide the added CPU by.
		return tr, nil
	}
	for name, n := range sum.Events {
		// Task and interface records describe events, lost records
		// count them: none is an event.
		if name != "task" && name != "iface" && name != "lost" {
			tr.Events += n
		}
	}
	// A summary trace's socket bytes are in its conn_summary records, which
	// TestSummaryTruth checks against the application's counts.
	if hasSock(r.Header()) && t.name != RecordSummary {
		tr.TraceSent, tr.TraceRecv = dataBytes(conns, t.server, t.client)
	}
	return tr, nil
}

// hasSock reports whether the trace records socket calls (its settings
// name the groups recorded).
func hasSock(h *trace.Header) bool {
	for _, e := range h.Settings.Events {
		if e == "sock" || e == "sock_send" || e == "sock_recv" {
			return true
		}
	}
	return false
}

// dataBytes returns what the trace's socket events say the workload's data
// connection carried: the bytes sent by the client's end (from client to
// server) and received by the server's end (at server, from client) of
// the connection between them that carried most. A control connection to
// the same port (iperf3's) carries far less; the lab's addresses are its
// own, other labs' connections (the trace is the whole host's) are not.
func dataBytes(conns []*export.Conn, server netip.AddrPort, client netip.Addr) (sent, recv int64) {
	sent, recv = -1, -1
	for _, c := range conns {
		if c.Proto != "tcp" {
			continue
		}
		if c.Remote == server && c.Local.Addr() == client && c.SentApp > sent {
			sent = c.SentApp
		}
		if c.Local == server && c.Remote.Addr() == client && c.RecvApp > recv {
			recv = c.RecvApp
		}
	}
	return sent, recv
}

// tcpdumpTracer is tcpdump writing the sender's veth to a file.
type tcpdumpTracer struct{ *proc }

func startTcpdump(lab *netlab.Lab, work string, seq, snaplen int) (*tcpdumpTracer, error) {
	out := filepath.Join(work, fmt.Sprintf("run-%d.pcap", seq))
	// -Z root: tcpdump would otherwise drop to a user that cannot write
	// the work directory.
	cmd := lab.Command(lab.Client, "tcpdump", "-n", "-i", lab.Client.Iface, "-s", strconv.Itoa(snaplen), "-w", out, "-Z", "root")
	p, err := startProc("tcpdump", cmd, out, "listening on", "")
	if err != nil {
		return nil, err
	}
	return &tcpdumpTracer{p}, nil
}

var (
	reReceived = regexp.MustCompile(`(\d+) packets? received by filter`)
	reDropped  = regexp.MustCompile(`(\d+) packets? dropped by kernel`)
)

func (t *tcpdumpTracer) stop() (traced, error) {
	defer os.Remove(t.output())
	if err := t.end(); err != nil {
		return traced{}, err
	}
	msg := t.Stderr()
	// Its events are the packets the kernel handed it: "captured" counts
	// only those it had read when SIGINT stopped it, and on a loaded
	// machine a short run's packets can all still wait in its ring then.
	return traced{Events: tracerproc.FirstNumber(reReceived, msg), Lost: tracerproc.FirstNumber(reDropped, msg), Written: t.size(), TraceSent: -1, TraceRecv: -1}, nil
}

// perfTracer is perf record of magnet's tracepoints on every CPU.
type perfTracer struct{ *proc }

func startPerf(ctx context.Context, work string, seq int) (*perfTracer, error) {
	out := filepath.Join(work, fmt.Sprintf("run-%d.perf", seq))
	// -D 1 makes perf say "Events enabled" once its events are on: the
	// only sign of readiness it gives. --no-buildid: the build-id pass
	// over the samples at the end is not what recording costs.
	args := []string{"record", "-a", "-D", "1", "--no-buildid", "-o", out}
	for _, tp := range tracepoints {
		args = append(args, "-e", tp)
	}
	p, err := startProc("perf record", exec.CommandContext(ctx, "perf", args...), out, "Events enabled", "")
	if err != nil {
		return nil, err
	}
	return &perfTracer{p}, nil
}

var (
	reSamples  = regexp.MustCompile(`SAMPLE events:\s+(\d+)`)
	rePerfLost = regexp.MustCompile(`lost (\d+) chunks`)
)

// stop ends perf and counts the samples it wrote with perf report --stats
// (perf record, without its build-id pass, does not count them).
func (t *perfTracer) stop() (traced, error) {
	defer os.Remove(t.output())
	if err := t.end(); err != nil {
		return traced{}, err
	}
	tr := traced{Lost: tracerproc.FirstNumber(rePerfLost, t.Stderr()), Written: t.size(), TraceSent: -1, TraceRecv: -1}
	out, err := exec.Command("perf", "report", "--stats", "-i", t.output()).CombinedOutput()
	if err != nil {
		return tr, fmt.Errorf("perf report --stats: %v: %s", err, tracerproc.OneLine(string(out)))
	}
	// The first SAMPLE line is every event's together.
	tr.Events = tracerproc.FirstNumber(reSamples, string(out))
	tr.Lost += tracerproc.FirstNumber(rePerfLost, string(out))
	return tr, nil
}

// bpftraceScript prints a line per event of the tracepoints perf records.
// BEGIN runs once every probe is attached; the file it touches says so
// (output to a file is block-buffered: a printed line would not show).
const bpftraceScript = `
BEGIN { system("touch READY_FILE"); }
tracepoint:sock:sock_send_length { printf("%llu %d %d sock_send %d\n", nsecs, cpu, tid, args->ret); }
tracepoint:sock:sock_recv_length { printf("%llu %d %d sock_recv %d\n", nsecs, cpu, tid, args->ret); }
tracepoint:tcp:tcp_probe { printf("%llu %d %d tcp_rcv %u %u %u\n", nsecs, cpu, tid, args->data_len, args->snd_nxt, args->snd_una); }
tracepoint:tcp:tcp_retransmit_skb { printf("%llu %d %d tcp_retrans\n", nsecs, cpu, tid); }
tracepoint:sock:inet_sock_set_state { printf("%llu %d %d tcp_state %d %d\n", nsecs, cpu, tid, args->oldstate, args->newstate); }
tracepoint:net:net_dev_queue { printf("%llu %d %d dev_queue %u\n", nsecs, cpu, tid, args->len); }
tracepoint:net:net_dev_start_xmit { printf("%llu %d %d dev_xmit %u %u\n", nsecs, cpu, tid, args->len, args->gso_segs); }
tracepoint:net:netif_receive_skb { printf("%llu %d %d dev_recv %u\n", nsecs, cpu, tid, args->len); }
tracepoint:skb:kfree_skb { printf("%llu %d %d drop %d\n", nsecs, cpu, tid, args->reason); }
`

type bpftraceTracer struct{ *proc }

func startBpftrace(ctx context.Context, work string, seq int) (*bpftraceTracer, error) {
	out := filepath.Join(work, fmt.Sprintf("run-%d.bt", seq))
	ready := out + ".ready"
	script := strings.ReplaceAll(bpftraceScript, "READY_FILE", ready)
	p, err := startProc("bpftrace", exec.CommandContext(ctx, "bpftrace", "--unsafe", "-B", "full", "-o", out, "-e", script), out, "", ready)
	if err != nil {
		return nil, err
	}
	return &bpftraceTracer{p}, nil
}

func (t *bpftraceTracer) stop() (traced, error) {
	defer os.Remove(t.output())
	if err := t.end(); err != nil {
		return traced{}, err
	}
	tr := traced{Written: t.size(), TraceSent: -1, TraceRecv: -1}
	var err error
	tr.Events, tr.Lost, err = tracerproc.BpftraceCount(t.output(), t.Stderr())
	return tr, err
}

// procCPU is a process's CPU time in nanoseconds: the sum of its threads'
// run time from /proc/PID/task/*/schedstat. /proc/PID/stat counts in
// 10 ms ticks, coarser than what a recorder uses in a few seconds' run.
func procCPU(pid int) uint64 {
	if pid == 0 {
		return 0
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum uint64
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread ended between the listing and the read
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			n, _ := strconv.ParseUint(f[0], 10, 64)
			sum += n
		}
	}
	return sum
}
