// SPDX-License-Identifier: Apache-2.0

// Package record runs a recording: it loads the probes, drains both ring
// buffers into a trace file, keeps a status file up to date, and at the end
// writes every loss it knows of, so that recorded + lost == produced.
package record

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/bytesize"
	"github.com/magnet-tracer/magnet/internal/devskip"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/evselect"
	"github.com/magnet-tracer/magnet/internal/filter"
	"github.com/magnet-tracer/magnet/internal/hostcheck"
	"github.com/magnet-tracer/magnet/internal/kevent"
	"github.com/magnet-tracer/magnet/internal/outfile"
	"github.com/magnet-tracer/magnet/internal/pcapfilter"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/ring"
	"github.com/magnet-tracer/magnet/internal/streamfile"
	"github.com/magnet-tracer/magnet/internal/summary"
	"github.com/magnet-tracer/magnet/internal/trace"
	"github.com/magnet-tracer/magnet/pkg/magnetclient"
)

// DefaultBufferBytes is the default size of the events ring buffers, all
// CPUs together: 8 MiB. A bulk transfer at 10 Gbit/s with TSO makes ~1 M
// events/s of ~40 bytes in the rings; the reader is woken when a ring is
// half full (and polls every second), so 8 MiB rides out ~100 ms of reader
// delay (a busy disk, a descheduled reader) at that rate on 2 CPUs, where
// MAGNeT's measurements showed 1 MB sufficed at 1 Gbit/s.
const DefaultBufferBytes = 8 << 20

// ControlBufferBytes sizes the control ring (connection lifecycle, interface
// names): small, because these events are rare, and separate so that a flood
// of data events never crowds them out.
const ControlBufferBytes = 256 << 10

// Filters are the user's filters, before they are resolved to kernel ids.
type Filters struct {
	PID    int    // process id; 0 = any
	Cgroup string // cgroup2 path; "" = any
	NetNS  string // netns name (under /run/netns) or path; "" = any
	Port   int    // local or remote port; 0 = any
	// Pcap is a pcap-filter expression over connections (docs/FILTERS.md),
	// judged in BPF for each socket when first seen; "" = any.
	Pcap string
	// CEL is an expression over each event's fields (docs/FILTERS.md),
	// judged in the drain as the readers judge it (internal/evselect):
	// events it is false for are counted, not written; "" = all.
	CEL string
}

// Config configures a recording.
type Config struct {
	Output      string
	Groups      event.Group
	Filters     Filters
	BufferBytes int
	Duration    time.Duration // 0 = until the command exits or a signal
	Command     []string      // run this and record it and its children only
	// Live, if set, receives a one-line status every second (a terminal).
	Live io.Writer
	// Checking, if set, is given the comparison of the device programs'
	// runs with the interfaces' counters once it started (devskip).
	Checking func(*devskip.Checker)
	// Ready, if set, is called once the probes are attached and before the
	// command starts.
	Ready func()
	// FlushEvery bounds what a crash can lose: blocks are written at least
	// this often; 0 means DefaultFlushEvery.
	FlushEvery time.Duration
	// StatusDir holds the status file `magnet status` reads.
	StatusDir string
	// DisableHooks lists BPF programs not to load (see probe.Options).
	DisableHooks []string
	// XmitAtDevice reads tcp_xmit at the device (probe.Options).
	XmitAtDevice bool
	// HooksOnly attaches the programs of Groups but enables no group:
	// every run returns at its first check and nothing but connections'
	// openings and closes is recorded (probe.Options.Silent). For the
	// bench's floor.
	HooksOnly bool
	// NoEmit runs every program of Groups in full but writes no event
	// (probe.Options.NoEmit): only connections' openings and closes are
	// recorded. For the bench's split of the cost into hooks, bodies and
	// records.
	NoEmit bool
	// NewSink, if set, replaces the trace file at Output: it is called once
	// with the trace header, after the probes load and before any record.
	// Rotation and the daemon use it to put records somewhere else.
	NewSink func(hdr *trace.Header) (Sink, error)
	// Loaded, if set, is called with the loaded probe before recording
	// starts, for callers that change it at run time (probe.SetGroups).
	Loaded func(p *probe.Probe)
	// WriteInLoop writes the trace file from the drain loop, which then
	// waits whenever the file system does, instead of from a goroutine
	// behind a queue (the bench compares both). Not used with NewSink.
	WriteInLoop bool
	// ExcludeCgroupID is a cgroup2 id whose sockets are never recorded:
	// the collect service's shipper runs in it. 0 = none.
	ExcludeCgroupID uint64
	// WakeupFill is the fill of an events ring (a fraction of its size)
	// at which BPF wakes the recorder; 0 means probe.DefaultWakeupFill.
	WakeupFill float64
	// PollInterval is how long the recorder sleeps at most while the
	// rings look empty; 0 means FlushEvery (see pollEvery).
	PollInterval time.Duration
	// KernelEvents are kernel events chosen at run time (tracepoints,
	// uprobes, the irq and napi groups), recorded beside Groups.
	KernelEvents []kevent.Spec
	// Summary, if not 0, records in summary mode: the programs add to
	// per-connection figures in the kernel instead of writing events, and
	// a conn_summary record per active connection is written every
	// Summary (connection lifecycle is recorded as usual).
	Summary time.Duration
}

// SummaryGroups are the groups summary mode summarizes: a group outside
// them has nothing to add to the figures.
const SummaryGroups = event.GroupSock | event.GroupTCP | event.GroupIP | event.GroupDev | event.GroupDrop | event.GroupConn

// DefaultSummaryGroups are what summary mode summarizes when no group is
// asked for: the figures a TCP socket keeps, read from it every interval
// and at close (probe.SocketGroups), and drops, which are rare events. The
// IP and device layers' figures need a program run per packet (three at
// the device), so they are summarized only when asked for.
const DefaultSummaryGroups = probe.SocketGroups | event.GroupDrop | event.GroupConn

// DefaultSummaryBufferBytes sizes the events areas of a summary recording,
// into which nothing but loss records goes: a page per CPU is enough.
const DefaultSummaryBufferBytes = 64 << 10

// Sink takes the records of a recording, in drain order. trace.Writer is
// the Sink of an ordinary recording.
type Sink interface {
	// Write takes one on-disk record (a 32-byte header and its body); rec
	// is reused once Write returns.
	Write(rec []byte) error
	// Flush makes what was written durable, or visible, so far.
	Flush() error
	// Close ends the output with the recording's summary.
	Close(s *trace.Summary) error
	// Bytes tells how much has been written.
	Bytes() int64
}

// DrainedSink is a Sink that wants to know how complete the records it was
// given are. The recorder writes its rings in drain order: the control
// ring's records first (connection records before the events that need
// them), then the per-CPU events rings merged by time, so a record can come
// before older ones of other rings. After each pass over the rings, Drained
// says up to which time every record the rings held was written: a sink
// that keeps what it got back until then can pass records on in time order.
// Only records whose program was still writing them when the pass read
// their ring (microseconds, unless the program was preempted) and records
// whose time precedes their making (tcp_xmit served at the device, up to
// 1 ms: docs/EVENTS.md) can still come later.
type DrainedSink interface {
	Sink
	Drained(completeNs uint64)
}

// fileSink is the Sink of an ordinary recording: the trace's blocks go to a
// streamfile.Writer, which writes them from a goroutine of its own, so that
// a file system that makes a write wait does not stop the drain, and around
// the page cache where the file system allows.
type fileSink struct {
	*trace.Writer
	file *streamfile.Writer
}

// Flush ends the current block and hands everything to the file's writer.
func (s *fileSink) Flush() error {
	if err := s.Writer.Flush(); err != nil {
		return err
	}
	return s.file.Flush()
}

// Close ends the trace and waits until all of it is written.
func (s *fileSink) Close(sum *trace.Summary) error {
	if err := s.Writer.Close(sum); err != nil {
		return err
	}
	return s.file.Close()
}

// Result is what a recording did.
type Result struct {
	Output string
	Events map[string]uint64 // records in the trace by type (task, iface included)
	Lost   uint64
	// Missed counts the runs of magnet's programs the kernel skipped
	// (recursion protection: the program was already running on that
	// CPU); their events were never produced, so Lost does not have them.
	// MissedBy has them by program, those with any only.
	Missed   uint64
	MissedBy map[string]uint64
	// KernelSkipped compares, on every interface of the recorded
	// namespaces, the device programs' runs with the frames the interface
	// counted (devskip): the frames the kernel ran no program for. Nil
	// when it could not (KernelSkippedErr says why).
	KernelSkipped    *devskip.Report
	KernelSkippedErr string
	// Unrecorded counts, by reason (probe.Unrecorded), the packets of the
	// recorded network namespace that the device and drop programs saw and
	// made no record of: left out by the filters, or with no connection
	// where a filter needs one. Neither lost nor missed: no event was made.
	Unrecorded map[string]uint64
	Produced   map[string]uint64 // events the BPF side produced, by type
	LostBy     map[string]uint64 // events lost, by type
	// Filtered counts the events Filters.CEL left out of the trace;
	// FilteredBy has them by type. Produced = written + lost + filtered.
	Filtered   uint64
	FilteredBy map[string]uint64
	Bytes      int64
	Hooks      []probe.HookStatus
	CPU        CPU // the process's CPU time, getting ready and recording
	ExitCode   int // the command's exit code, if there was one
	Truncated  bool
	// Unwritten counts the events (task, iface and lost records aside)
	// that were recorded but never reached the file because writing it
	// failed, as on a full disk; UnwrittenBy has every type. Events and
	// Bytes then say what the file holds.
	Unwritten   uint64
	UnwrittenBy map[string]uint64
	// Learned says what learning the sockets that existed at start did.
	Learned Learned
}

// ErrStopped marks a recording that ended because of a write error; what was
// recorded before stays readable.
var ErrStopped = errors.New("recording stopped")

// DefaultFlushEvery is how often the trace's current block is written out
// at least (`magnet record --flush-every`): what a crash or SIGKILL can lose,
// and how far a reader of the growing file lags the recording. Each flush is
// a direct write of whatever the file writer's chunk holds, with its system
// call and wake-ups; docs/BENCH.md at d71bc17 ("The drain, seventh round") has what a
// longer interval saves. A second: with the polls following it, the
// recorder used 0.76-0.80 (64 KiB veth flood) and 0.92 (64-byte) of its CPU
// at 200 ms (paired). Tracers users know buffer longer still (tcpdump -w
// until its buffer fills, LTTng and perf until a sub-buffer does);
// --flush-every 200ms keeps the old bound.
const DefaultFlushEvery = time.Second

// FlushEveryFor is the default flush interval of a recording rotated every
// rotateEvery (0: not by time). Time rotation happens at a flush, so a file
// can start up to a flush interval late: a fifth of the rotation interval
// at most keeps that small (200 ms for `--rotate 1s`, the shortest).
func FlushEveryFor(rotateEvery time.Duration) time.Duration {
	if rotateEvery > 0 {
		return min(DefaultFlushEvery, rotateEvery/5)
	}
	return DefaultFlushEvery
}

// prefaultBytes is how much of the trace file's queue is made present in
// memory before the probes attach (see streamfile.Options.Prefault): the
// chunks a steady drain goes round with, so that it takes no page fault
// while the first events wait.
const prefaultBytes = 8 << 20

// Run records until ctx is done, the duration ends or the command exits.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	res, err := run(ctx, cfg)
	if res != nil && res.Truncated && cfg.NewSink == nil {
		// The file is closed now: count what reached it.
		recount(cfg.Output, res)
	}
	return res, err
}

// recount makes res say what the trace file holds after a write failed (a
// full disk): the writer counted the records and bytes it handed on, not
// those that reached the file. Those that did not are lost, and counted so.
func recount(path string, res *Result) {
	fi, err := os.Stat(path)
	if err != nil {
		return
	}
	in := map[string]uint64{}
	if r, err := trace.Open(path); err == nil {
		for {
			rec, err := r.Next()
			if err != nil {
				break
			}
			in[rec.Type.Name]++
		}
		r.Close()
	}
	res.UnwrittenBy = map[string]uint64{}
	for name, n := range res.Events {
		if n > in[name] {
			res.UnwrittenBy[name] = n - in[name]
			if name != "task" && name != "iface" && name != "lost" {
				res.Unwritten += n - in[name]
			}
		}
	}
	res.Events = in
	res.Bytes = fi.Size()
}

func run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Summary < 0 {
		return nil, fmt.Errorf("summary interval %v: want a positive duration", cfg.Summary)
	}
	if cfg.Summary > 0 {
		if cfg.Groups == 0 {
			cfg.Groups = DefaultSummaryGroups
		}
		if cfg.Groups&^(SummaryGroups|event.GroupTCPState|event.GroupSummary) != 0 {
			return nil, fmt.Errorf("summary mode summarizes %s; %s cannot be summarized (record them without --summary)", SummaryGroups, cfg.Groups&^(SummaryGroups|event.GroupTCPState|event.GroupSummary))
		}
		if len(cfg.KernelEvents) > 0 {
			return nil, errors.New("summary mode records no kernel events (--tracepoint, --uprobe, --usdt): record them without --summary")
		}
		// tcp_state is not written in summary mode: its srtt and cwnd go to
		// the histograms.
		cfg.Groups = cfg.Groups&SummaryGroups | event.GroupConn
		if cfg.BufferBytes == 0 {
			cfg.BufferBytes = DefaultSummaryBufferBytes
		}
	} else if cfg.Groups&event.GroupSummary != 0 {
		return nil, errors.New("conn_summary records are written in summary mode: use --summary")
	}
	if cfg.BufferBytes == 0 {
		cfg.BufferBytes = DefaultBufferBytes
	}
	if err := CheckBufferSize(cfg.BufferBytes); err != nil {
		return nil, err
	}
	if cfg.Groups == 0 {
		cfg.Groups = event.DefaultGroups
	}
	if cfg.FlushEvery < 0 {
		return nil, fmt.Errorf("flush interval %v: want a positive duration", cfg.FlushEvery)
	}
	if cfg.FlushEvery == 0 {
		cfg.FlushEvery = DefaultFlushEvery
	}
	if cfg.WakeupFill < 0 || cfg.WakeupFill > 1 {
		return nil, fmt.Errorf("wake-up fill %g: want a fraction of the ring between 0 and 1", cfg.WakeupFill)
	}
	if cfg.PollInterval < 0 {
		return nil, fmt.Errorf("poll interval %v: want a positive duration", cfg.PollInterval)
	}
	cfg.PollInterval = pollEvery(cfg.PollInterval, cfg.FlushEvery)
	if cfg.StatusDir == "" {
		cfg.StatusDir = DefaultStatusDir
	}
	kf, err := resolveFilters(cfg.Filters)
	if err != nil {
		return nil, err
	}
	if cfg.Filters.CEL != "" {
		// Before anything is loaded or created; the fields it names are
		// checked against the header once there is one.
		if _, err := filter.Parse(magnetclient.Filter{Expr: cfg.Filters.CEL}, filter.Options{}); err != nil {
			return nil, fmt.Errorf("--filter: %w", err)
		}
	}
	if cfg.Filters.Pcap != "" {
		if err := checkPcapGroups(cfg.Groups, len(cfg.KernelEvents) > 0); err != nil {
			return nil, err
		}
	}
	kev, err := planKernelEvents(cfg.KernelEvents)
	if err != nil {
		return nil, err
	}
	if cfg.Filters.CEL != "" {
		// The fields it names, against the dictionary the trace will
		// have, before the output is created: a misspelt field must not
		// leave the file at -o replaced by an empty one.
		types, err := event.Dictionary(probe.Layouts())
		if err != nil {
			return nil, err
		}
		if kev != nil {
			types = append(types, kevent.Dictionary(kev.events)...)
		}
		if err := evselect.CheckFields(cfg.Filters.CEL, types); err != nil {
			return nil, err
		}
	}
	if err := checkPrivileges(); err != nil {
		return nil, err
	}
	if len(cfg.Command) > 0 {
		if _, err := exec.LookPath(cfg.Command[0]); err != nil {
			return nil, fmt.Errorf("command %q: %w", cfg.Command[0], errors.Unwrap(err))
		}
	}
	// The output is created before anything loads, so that a bad path fails
	// at once.
	var out *os.File
	if cfg.NewSink == nil {
		// Locked while recording: a second recorder on the same file
		// would interleave its blocks with ours.
		out, err = outfile.Create(cfg.Output, outfile.Options{Lock: true})
		if err != nil {
			return nil, err
		}
		defer out.Close()
	}

	var cg *commandCgroup
	if len(cfg.Command) > 0 {
		cg, err = newCommandCgroup()
		if err != nil {
			return nil, err
		}
		defer cg.remove()
		kf.CgroupID = cg.id
	}

	// Measured before the probes load: its loopback sends must not appear
	// in the trace.
	hc, _ := hostcheck.Run(ctx, hostcheck.Options{Quick: true})

	// The owners of the sockets that exist now, found while the probes
	// load (see learnSockets).
	walk := startWalk("/proc")
	p, err := probe.Load(probe.Options{
		Groups:          cfg.Groups,
		Filters:         kf,
		BufferBytes:     cfg.BufferBytes,
		ControlBytes:    ControlBufferBytes,
		SelfTGID:        uint32(os.Getpid()),
		Disable:         cfg.DisableHooks,
		XmitAtDevice:    cfg.XmitAtDevice,
		Silent:          cfg.HooksOnly,
		NoEmit:          cfg.NoEmit,
		ExcludeCgroupID: cfg.ExcludeCgroupID,
		WakeupFill:      cfg.WakeupFill,
		Summary:         cfg.Summary > 0,
	})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	if kev != nil {
		if err := kev.load(cfg, kf); err != nil {
			return nil, err
		}
		defer kev.close()
	}

	hdr, err := buildHeader(cfg, p.Status, hc)
	if err != nil {
		return nil, err
	}
	kev.header(hdr)
	var sel *evselect.Live
	if cfg.Filters.CEL != "" {
		// Before the header is written: a field no recorded event has is
		// refused with nothing in the file yet.
		if sel, err = evselect.NewLive(hdr, cfg.Filters.CEL); err != nil {
			return nil, err
		}
	}
	var w Sink
	if cfg.NewSink != nil {
		w, err = cfg.NewSink(hdr)
	} else {
		queue := 0
		if cfg.WriteInLoop {
			queue = -1
		}
		// Direct: the trace never goes through the page cache (see
		// streamfile), unless writing in the loop, which has no chunks.
		sf := streamfile.New(out, streamfile.Options{Queue: queue, Direct: true, Prefault: prefaultBytes})
		defer sf.Close() // after an error; the sink's Close waits for it first
		var tw *trace.Writer
		if tw, err = trace.NewWriter(sf, hdr, trace.WriterOptions{}); err == nil {
			w = &fileSink{Writer: tw, file: sf}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("write trace header: %w", err)
	}
	if cfg.Loaded != nil {
		cfg.Loaded(p)
	}
	r := newRecorder(cfg, w, hdr)
	r.probe = p
	if sel != nil {
		// Every record goes through handle, which judges it; the copy
		// into the sink's blocks is for the unfiltered drain only.
		r.sel, r.bs = sel, nil
	}
	if cfg.Summary > 0 {
		if r.sum, err = summary.New(p, hdr.TypeByID(uint8(event.ConnSummary)), r.now()); err != nil {
			return nil, err
		}
		r.nextSummary = time.Now().Add(cfg.Summary)
		// No state change will announce a connection established
		// before now: learning the existing sockets below starts its
		// figures.
	}
	if r.events, err = p.EventRings(); err != nil {
		return nil, err
	}
	defer func() {
		for _, rd := range r.events {
			if kev == nil || rd != kev.ring {
				rd.Close()
			}
		}
	}()
	var polled []*ring.Reader
	if kev != nil {
		// Merged by time with the events areas, as one more ring.
		r.kev = kev
		r.events = append(r.events, kev.ring)
		polled = append(polled, kev.ring)
	}
	if r.control, err = ring.NewReader(p.Control); err != nil {
		return nil, fmt.Errorf("open control ring: %w", err)
	}
	defer r.control.Close()
	if r.doorbell, err = ring.NewReader(p.Doorbell); err != nil {
		return nil, fmt.Errorf("open doorbell ring: %w", err)
	}
	defer r.doorbell.Close()
	if r.poll, err = ring.NewPoller(append([]*ring.Reader{r.control, r.doorbell}, polled...)...); err != nil {
		return nil, err
	}
	defer r.poll.Close()
	// Whatever ends the recording also ends the wait for the rings: the
	// loop looks for it only between waits, which last up to a flush
	// interval (an hour, if asked).
	stopWaking := context.AfterFunc(ctx, r.poll.Wake)
	defer stopWaking()

	learned := r.learnSockets(walk, kf.NetNS)
	// After the programs attached (and the learning, which sends
	// nothing): frames before are the interfaces' alone.
	r.devCheck = devskip.NewChecker(p, r.netns)
	if r.netns == nil {
		r.devCheckErr = fmt.Errorf("the recorded network namespaces are not known: %s", learned.Err)
	} else if err := r.devCheck.Start(); err != nil {
		r.devCheckErr = err
	} else if cfg.Checking != nil {
		cfg.Checking(r.devCheck)
	}
	status := newStatusFile(cfg, p, r)
	defer status.remove()
	r.readyUser, r.readySystem = processCPU()
	if cfg.Ready != nil {
		cfg.Ready()
	}

	var cmd *exec.Cmd
	cmdDone := make(chan error, 1)
	if len(cfg.Command) > 0 {
		cmd, err = cg.start(cfg.Command)
		if err != nil {
			return nil, err
		}
		go func() {
			cmdDone <- cmd.Wait()
			r.poll.Wake()
		}()
	}
	var deadline <-chan time.Time
	if cfg.Duration > 0 {
		r.stopAt = time.Now().Add(cfg.Duration)
		t := time.NewTimer(cfg.Duration)
		defer t.Stop()
		deadline = t.C
	}

	res := &Result{Output: cfg.Output, Hooks: p.Status, Learned: learned}
	runErr := r.loop(ctx, cmdDone, deadline, status, res)
	if cmd != nil && cmd.ProcessState == nil {
		// Stopped by a signal or the duration: end the command too.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-cmdDone:
			res.ExitCode = exitCode(err)
		case <-time.After(3 * time.Second):
			_ = cmd.Process.Kill()
			res.ExitCode = exitCode(<-cmdDone)
		}
	}
	finErr := r.finish(res)
	if runErr != nil {
		return res, runErr
	}
	return res, finErr
}

type taskKey struct {
	pid  uint32
	uid  uint32
	comm [16]byte
}

type recorder struct {
	cfg   Config
	probe *probe.Probe
	// netns: the recorded network namespaces (inode → path), as the walk
	// of /proc found them; devCheck compares the device programs' runs on
	// their interfaces with the interfaces' counters (devCheckErr: why not).
	netns       map[uint32]string
	devCheck    *devskip.Checker
	devCheckErr error
	w           Sink
	drained     DrainedSink // w, when it wants to know how complete a pass was
	hdr         *trace.Header
	events      []*ring.Reader // one per CPU and area level (probe.EventRings)
	control     *ring.Reader
	doorbell    *ring.Reader // its records only say "drain": skipped
	poll        *ring.Poller
	// readyUser and readySystem are the process's CPU time when the probes
	// were attached (Result.CPU).
	readyUser, readySystem time.Duration
	heads                  []heapItem    // drain's merge of the events rings
	complete               uint64        // the last pass wrote every record up to this time (DrainedSink)
	cur                    []ringHead    // by CPU
	bs                     blockSink     // w, when the drain may copy records into its blocks
	now                    func() uint64 // the records' clock, now (monotonicClock)
	room                   []byte        // room bs lent for a run's records (open while not nil)
	tally                  trace.Tally   // the records in room
	tasks                  map[uint32]taskKey
	// taskCache holds the threads of tasks seen last, by tid's low bits:
	// a map lookup for each record that carries struct mg_task cost a few
	// percent of a recorder's time.
	taskCache [64]taskSlot
	// taskSuffix is probe.TaskSuffixSize, for the drain's hot path.
	taskSuffix int
	counts     [256]uint64
	// sel judges events by Filters.CEL (nil: none); filtered counts those
	// it left out, by type.
	sel      *evselect.Live
	filtered [256]uint64
	types    [256]*trace.EventType // by id, for sel
	total    uint64                // ring records written, lost records aside
	lost     uint64                // events the lost records written so far count
	started  time.Time
	taskSize int
	lostSize int
	sizes    [256]int // record size by type id; 0 = not in the dictionary
	// copySizes is sizes for the types whose events the drain copies into
	// bs's room itself (all but lost records); 0 for the others.
	copySizes [256]int
	scratch   []byte
	// owners names the owners of sockets first seen in softirq; opened
	// holds such a conn_open, rewritten to name its owner.
	owners   *owners
	opened   []byte
	writeErr error
	stopAt   time.Time // the end of Config.Duration; zero if none
	kev      *kernelEvents
	// sum writes the conn_summary records of summary mode (nil
	// otherwise), at nextSummary.
	sum         *summary.Collector
	nextSummary time.Time
}

// newRecorder makes a recorder that writes to w, whose header is hdr; Run
// gives it the probes and rings.
func newRecorder(cfg Config, w Sink, hdr *trace.Header) *recorder {
	r := &recorder{cfg: cfg, w: w, hdr: hdr, tasks: map[uint32]taskKey{}, started: time.Now()}
	r.bs, _ = w.(blockSink)
	r.drained, _ = w.(DrainedSink)
	r.now = monotonicClock()
	r.taskSize = hdr.TypeByID(uint8(event.Task)).Size
	r.lostSize = hdr.TypeByID(uint8(event.Lost)).Size
	r.taskSuffix = probe.TaskSuffixSize
	r.owners = newOwners("/proc")
	for i, t := range hdr.Types {
		r.types[t.ID] = &hdr.Types[i]
		r.sizes[t.ID] = t.Size
		if !isLossRecord(t.ID) {
			r.copySizes[t.ID] = t.Size
		}
	}
	return r
}

func (r *recorder) loop(ctx context.Context, cmdDone <-chan error, deadline <-chan time.Time, st *statusFile, res *Result) error {
	lastStatus := time.Now()
	clock := newWaitClock(lastStatus, r.cfg.PollInterval, r.cfg.FlushEvery, r.stopAt)
	var lastTotal uint64
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-deadline:
			return nil
		case err := <-cmdDone:
			res.ExitCode = exitCode(err)
			return nil
		default:
		}
		n, busy, err := r.drain()
		if err != nil {
			return err
		}
		if r.drained != nil && r.complete != 0 {
			r.drained.Drained(r.complete)
		}
		// Timers right after a drain, before any wait: a Sink's Flush may
		// stand for "everything produced until now is written" (the
		// daemon's processed-up-to time), which holds only then.
		now := time.Now()
		flush := clock.flushDue(now)
		if r.sum != nil && !now.Before(r.nextSummary) {
			if err := r.writeSummaries(); err != nil {
				return err
			}
			r.nextSummary = r.nextSummary.Add(r.cfg.Summary)
			if r.nextSummary.Before(now) {
				r.nextSummary = now.Add(r.cfg.Summary)
			}
			// The summaries are flushed with the records before them,
			// and the flushes' grid starts again from them: on grids of
			// their own the two woke the recorder twice a second, and
			// each wake-up costs more than the work it does (Go's sysmon
			// polls every 20 µs for a millisecond after one).
			flush = true
		}
		if flush {
			if err := r.w.Flush(); err != nil {
				return r.stopOnWrite(err)
			}
			clock.flushed(now)
		}
		clock.read(now)
		// A status falls due with the wake-up that flushes: the timers
		// it rides on come back a second later give or take a few
		// milliseconds, and one a little short of the second would wait
		// for a wake-up of its own.
		if now.Sub(lastStatus) >= time.Second-statusSlack {
			total := r.total
			rate := float64(total-lastTotal) / now.Sub(lastStatus).Seconds()
			lastTotal, lastStatus = total, now
			st.update()
			if r.cfg.Live != nil {
				fmt.Fprintf(r.cfg.Live, "\r\033[Krecording: %.0f events/s, %d events, %s written, %d lost", rate, total, humanBytes(r.w.Bytes()), r.lost)
			}
		}
		switch {
		case busy && n == 0:
			// A producer is between reserving and committing a record
			// (preempted, most likely): it will not wake us up.
			time.Sleep(100 * time.Microsecond)
		case n == 0:
			// Until the next flush, poll or the end (waitClock), or
			// the next summary.
			until := clock.until()
			if r.sum != nil && r.nextSummary.Before(until) {
				until = r.nextSummary
			}
			if err := r.poll.Wait(max(time.Until(until), 0)); err != nil {
				return err
			}
		}
	}
}

// statusSlack is how much earlier than a second after the last the status
// is rewritten when the loop is awake anyway (see loop).
const statusSlack = 50 * time.Millisecond

// pollEvery is the poll interval of a recording: poll, if set, else the
// flush interval. It bounds how long the recorder sleeps while the rings
// look empty: BPF wakes it up only once a ring is half full (see
// probe.Load), so this is how late a record can be read when events are
// few. A record read sooner than the next flush would wait for it anyway
// before a reader of the trace sees it.
//
// It is not shorter because every expiry of the wait's deadline wakes the
// process, also while the rings wake the recorder far more often: Go's
// sysmon and the thread in the network poller sleep until the earliest
// timer. With 50 ms, and a deadline then pushed back at each wait (they
// still woke at the old one), that was 20 futile wake-ups a second of each;
// 200 ms used 0.78 ± 0.08 and 0.92 ± 0.03 of the recorder's CPU time
// (64 KiB and 64-byte veth floods, `magnet-lab bench --cost --compare-with`).
// The deadline is also fixed between flushes now (waitClock).
//
// So the rings are read as often as the trace is flushed unless asked
// otherwise: a longer --flush-every lengthens the polls with it (their
// timer wake-ups were part of what a longer interval saves).
func pollEvery(poll, flush time.Duration) time.Duration {
	if poll == 0 {
		return flush
	}
	return poll
}

// drain writes what the rings hold now, the control ring's records first,
// and at most about the events rings' size, so that the loop comes back to
// its timers. The per-CPU events rings are merged by time: each ring is in
// its CPU's order, and the trace stays close to time order (records whose
// producer was still writing them when their ring was read may come later).
// drain returns how many ring records it wrote and whether it stopped at a
// record still being written.
//
// Records are handled where the kernel wrote them, a run at a time: the
// ring holding the oldest record gives records until its next one is no
// longer the oldest of all, each checked and, for a block sink, copied
// into the trace's block in one pass (copyRun). Their space goes back to
// the kernel every sixteenth of a ring and at the end, rather than after
// each record: the kernel reads the consumer position at every
// reservation, and a position that changes with every record is a cache
// miss for it each time.
func (r *recorder) drain() (n int, busy bool, err error) {
	if err := r.ringOff(); err != nil {
		return 0, false, err
	}
	if n, busy, err = r.drainControl(); err != nil {
		return n, busy, err
	}
	defer func() {
		for _, rd := range r.events {
			rd.Commit()
		}
	}()
	if len(r.cur) != len(r.events) {
		r.cur = make([]ringHead, len(r.events))
	}
	// The pass writes the records made before it looked at the rings, and
	// none after: a ring found empty is not looked at again in this pass,
	// and records its CPU makes meanwhile would come after the other
	// rings' newer ones. A pass that writes for long (a rotation writing
	// in the loop, a slow disk) put records 15 ms late that way.
	cutoff := r.now()
	h := r.heads[:0]
	for i, rd := range r.events {
		t, st, err := r.head(i, rd)
		if err != nil {
			return n, busy, err
		}
		busy = busy || st == ring.Busy
		if st == ring.Record {
			h = append(h, heapItem{time: t, ring: i})
		}
	}
	heapify(h)
	budget := 0
	for _, rd := range r.events {
		budget += rd.Size()
	}
	defer func() {
		if aerr := r.appendRoom(); err == nil {
			err = aerr
		}
	}()
	wrote := false
	for len(h) > 0 && budget > 0 {
		if h[0].time > cutoff && wrote {
			break // the next pass takes it, with every ring looked at again
		}
		i := h[0].ring
		// Connection records are produced before the events that need them;
		// writing whatever the control ring holds first keeps that order.
		if r.control.Pending() {
			if err := r.appendRoom(); err != nil {
				return n, busy, err
			}
			m, _, err := r.drainControl()
			n += m
			if err != nil {
				return n, busy, err
			}
		}
		limit := uint64(math.MaxUint64)
		if len(h) > 1 {
			limit = h[1].time
		}
		if len(h) > 2 {
			limit = min(limit, h[2].time)
		}
		m, used, next, more, err := r.copyRun(i, min(limit, cutoff))
		n += m
		wrote = true
		if err != nil {
			return n, busy, err
		}
		budget -= used
		rd, cur := r.events[i], &r.cur[i]
		if cur.sinceCommit += used; cur.sinceCommit >= cur.commitEvery {
			rd.Commit()
			cur.sinceCommit = 0
		}
		if !more {
			// The run ended where the ring's view ended: ask the ring.
			t, st, err := r.head(i, rd)
			if err != nil {
				return n, busy, err
			}
			if st == ring.Record {
				next = t
			} else {
				busy = busy || st == ring.Busy
				h[0] = h[len(h)-1]
				h = h[:len(h)-1]
				siftDown(h, 0)
				continue
			}
		}
		h[0].time = next
		// A ring's next record is most often still the oldest of all (its
		// CPU made a run of them): then the heap is in order as it is.
		if len(h) > 1 && (h[1].time < next || len(h) > 2 && h[2].time < next) {
			siftDown(h, 0)
		}
	}
	// Every record up to the cutoff was written, but for those of rings
	// the budget left unread, which are no older than the oldest head
	// left.
	r.complete = cutoff
	if len(h) > 0 && h[0].time <= cutoff {
		r.complete = h[0].time - 1
	}
	r.heads = h[:0]
	return n, busy, nil
}

// monotonicClock returns a clock of the records' time base
// (CLOCK_MONOTONIC, which bpf_ktime_get_ns reads): one reading of it, then
// Go's monotonic clock (the same clock, read through the vDSO without a
// system call) for the time since.
func monotonicClock() func() uint64 {
	var ts unix.Timespec
	start := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// Without it no pass is cut short: the order is only as before.
		return func() uint64 { return math.MaxUint64 }
	}
	base := uint64(ts.Nano())
	return func() uint64 { return base + uint64(time.Since(start)) }
}

// head looks at events ring i's next record: its time when it is a
// committed record, whose ring view the drain's runs then read.
func (r *recorder) head(i int, rd *ring.Reader) (uint64, ring.State, error) {
	rec, st, err := rd.Peek()
	if err != nil {
		return 0, st, fmt.Errorf("read events ring %d: %w", i, err)
	}
	if st != ring.Record {
		return 0, st, nil
	}
	r.cur[i].unread, r.cur[i].read = rd.Unread(), 0
	r.cur[i].commitEvery = rd.Size() / 16
	return binary.NativeEndian.Uint64(rec), st, nil
}

// ringHead is what drain knows of one events ring.
type ringHead struct {
	unread      []byte // the ring's view from its reader's position (ring.Reader.Unread) when head looked
	read        int    // bytes of unread the drain's runs took since
	sinceCommit int    // bytes consumed since the ring's last Commit
	commitEvery int    // a sixteenth of the ring
}

// heapItem is a ring in drain's min-heap, by the time of its next record.
type heapItem struct {
	time uint64
	ring int
}

// heapify orders h as a binary min-heap by time.
func heapify(h []heapItem) {
	for i := len(h)/2 - 1; i >= 0; i-- {
		siftDown(h, i)
	}
}

func siftDown(h []heapItem, i int) {
	for {
		least := i
		if l := 2*i + 1; l < len(h) && h[l].time < h[least].time {
			least = l
		}
		if r := 2*i + 2; r < len(h) && h[r].time < h[least].time {
			least = r
		}
		if least == i {
			return
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
}

// ringOff takes the doorbell's records, which only woke the recorder, so
// that the doorbell never fills up: a full one would wake nobody.
func (r *recorder) ringOff() error {
	if r.doorbell == nil {
		return nil // rings made up by a test
	}
	defer r.doorbell.Commit()
	for {
		_, st, err := r.doorbell.Peek()
		if err != nil {
			return fmt.Errorf("read doorbell ring: %w", err)
		}
		if st != ring.Record {
			return nil
		}
		r.doorbell.Advance()
	}
}

// drainControl writes every record the control ring holds.
func (r *recorder) drainControl() (n int, busy bool, err error) {
	defer r.control.Commit()
	for {
		rec, st, err := r.control.Peek()
		if err != nil {
			return n, false, fmt.Errorf("read control ring: %w", err)
		}
		if st != ring.Record {
			return n, st == ring.Busy, nil
		}
		if err := r.handle(rec); err != nil {
			return n, false, err
		}
		r.control.Advance()
		n++
	}
}

// bufferUsed is what the events rings hold, in bytes.
func (r *recorder) bufferUsed() int {
	n := 0
	for _, rd := range r.events {
		n += rd.Available()
	}
	return n
}

// drainAll empties the rings once nothing produces any more.
func (r *recorder) drainAll() error {
	giveUp := time.Now().Add(2 * time.Second)
	for {
		n, busy, err := r.drain()
		if err != nil {
			return err
		}
		if n > 0 {
			continue
		}
		if !busy && r.bufferUsed() == 0 && r.control.Available() == 0 {
			return nil
		}
		// Detach waited for running programs, so nothing stays busy long.
		if time.Now().After(giveUp) {
			return errors.New("read ring buffers: a record was never committed")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// handle writes one ring record: its event, preceded by a task record when
// the record carries its thread's struct mg_task and that thread is new to
// the trace or has a new pid, uid or name.
func (r *recorder) handle(raw []byte) error {
	if len(raw) < trace.CommonSize {
		return fmt.Errorf("short ring record (%d bytes)", len(raw))
	}
	typ := raw[30]
	size := r.sizes[typ]
	switch {
	case size == 0:
		return fmt.Errorf("ring record of unknown type %d", typ)
	case len(raw) == size:
	case len(raw) == size+probe.TaskSuffixSize:
		tid, k := taskOf(raw, size)
		if tid == 0 && typ == uint8(event.ConnOpen) && r.owners != nil {
			// A socket first seen in softirq: name its owner (see owners).
			if w, ok := r.owners.of(raw); ok {
				// A copy: the ring's memory is the kernel's to reuse.
				r.opened = append(r.opened[:0], raw[:size]...)
				raw = r.opened
				binary.NativeEndian.PutUint32(raw[16:20], w.pid)
				tid, k = w.pid, w.key
			}
		}
		// tid 0 is each CPU's idle task (swapper/N): nothing to resolve.
		if tid != 0 && !r.knownTask(tid, k) {
			r.rememberTask(tid, k)
			if err := r.writeTask(raw, tid, k); err != nil {
				return err
			}
		}
		raw = raw[:size]
	default:
		return fmt.Errorf("ring record of type %d is %d bytes, want %d or %d", typ, len(raw), size, size+probe.TaskSuffixSize)
	}
	if r.sum != nil {
		switch event.Type(typ) {
		case event.ConnOpen:
			r.sum.Opened(binary.NativeEndian.Uint64(raw[8:]), binary.NativeEndian.Uint32(raw[24:]))
		case event.ConnClose:
			r.sum.Closed(binary.NativeEndian.Uint64(raw[8:]))
		}
	}
	if r.sel != nil && !r.sel.Keep(trace.Record{Type: r.types[typ], Data: raw}) {
		r.filtered[typ]++
		return nil
	}
	if err := r.w.Write(raw); err != nil {
		return r.stopOnWrite(err)
	}
	r.counts[typ]++
	if isLossRecord(typ) {
		r.lost += uint64(binary.NativeEndian.Uint32(raw[32+16:]))
	} else {
		r.total++
	}
	return nil
}

// taskOf returns the thread of ring record raw, whose event is size bytes
// and followed by struct mg_task, and that struct's ids and name.
func taskOf(raw []byte, size int) (tid uint32, k taskKey) {
	t := raw[size:]
	k.pid = binary.NativeEndian.Uint32(t[0:4])
	k.uid = binary.NativeEndian.Uint32(t[4:8])
	copy(k.comm[:], t[8:24])
	return binary.NativeEndian.Uint32(raw[16:20]), k
}

// taskSlot is an entry of recorder.taskCache.
type taskSlot struct {
	tid uint32 // 0: none
	key taskKey
}

// knownTask says whether the trace already has a task record of thread
// tid with k's ids and name (the last one for tid).
func (r *recorder) knownTask(tid uint32, k taskKey) bool {
	s := &r.taskCache[tid%uint32(len(r.taskCache))]
	if s.tid == tid {
		return s.key == k
	}
	old, ok := r.tasks[tid]
	if ok {
		*s = taskSlot{tid, old}
	}
	return ok && old == k
}

// rememberTask notes that the trace now has a task record of thread tid
// with k's ids and name.
func (r *recorder) rememberTask(tid uint32, k taskKey) {
	r.tasks[tid] = k
	r.taskCache[tid%uint32(len(r.taskCache))] = taskSlot{tid, k}
}

// writeTask writes the task record of thread tid, whose ids and name are
// k, for ring event ev, which introduced them.
func (r *recorder) writeTask(ev []byte, tid uint32, k taskKey) error {
	b := r.buf(r.taskSize)
	putTask(b, ev, tid, k)
	if err := r.w.Write(b); err != nil {
		return r.stopOnWrite(err)
	}
	r.counts[event.Task]++
	if r.sel != nil {
		r.sel.Keep(trace.Record{Type: r.types[event.Task], Data: b}) // names the thread for expressions
	}
	return nil
}

// putTask fills b, a zeroed task record, with thread tid's ids and name k
// and the time, network namespace and CPU of event ev.
func putTask(b, ev []byte, tid uint32, k taskKey) {
	copy(b[0:8], ev[0:8]) // time of the event that introduced it
	binary.NativeEndian.PutUint32(b[16:], tid)
	binary.NativeEndian.PutUint32(b[24:], binary.NativeEndian.Uint32(ev[24:28]))
	binary.NativeEndian.PutUint16(b[28:], binary.NativeEndian.Uint16(ev[28:30]))
	b[30] = uint8(event.Task)
	binary.NativeEndian.PutUint32(b[32:], k.pid)
	binary.NativeEndian.PutUint32(b[36:], k.uid)
	copy(b[40:56], k.comm[:])
}

func (r *recorder) buf(n int) []byte {
	if cap(r.scratch) < n {
		r.scratch = make([]byte, n)
	}
	b := r.scratch[:n]
	clear(b)
	return b
}

func (r *recorder) stopOnWrite(err error) error {
	if r.writeErr == nil {
		r.writeErr = err
	}
	return fmt.Errorf("%w: write trace: %w; the trace is readable up to its last complete block", ErrStopped, err)
}

// finish stops production, drains what is left, writes the losses not yet
// in the stream and closes the trace.
func (r *recorder) finish(res *Result) error {
	// Detaching is a fixed cost of stopping (milliseconds of cgroup and
	// link teardown), not the events': Result.CPU leaves it out.
	// Before detaching: a frame after it is the interfaces' alone.
	if r.devCheckErr == nil {
		rep, err := r.devCheck.Check()
		if err != nil {
			r.devCheckErr = err
		} else {
			res.KernelSkipped = &rep
		}
	}
	if r.devCheckErr != nil {
		res.KernelSkippedErr = r.devCheckErr.Error()
	}
	du0, ds0 := processCPU()
	r.probe.Detach()
	if r.kev != nil {
		r.kev.set.Detach()
	}
	du1, ds1 := processCPU()
	var err error
	if r.writeErr == nil {
		err = r.drainAll()
	}
	produced, lostBy, cerr := r.probe.CountersOf()
	if cerr != nil && err == nil {
		err = cerr
	}
	missed, missedTotal, merr := r.probe.MissedRuns()
	if merr != nil && err == nil {
		err = merr
	}
	unrec, uerr := r.probe.UnrecordedCounts()
	if uerr != nil && err == nil {
		err = uerr
	}
	res.Unrecorded = unrec
	res.Missed = missedTotal
	res.MissedBy = map[string]uint64{}
	for _, m := range missed {
		if m.RecursionMisses > 0 {
			res.MissedBy[m.Program] = m.RecursionMisses
		}
	}
	if r.sum != nil && r.writeErr == nil && err == nil {
		// The last interval: after the drain, so that its records come
		// after the conn_close records of connections that ended in it.
		err = r.writeSummaries()
	}
	if r.writeErr == nil && err == nil {
		err = r.writePendingLosses()
	}
	user, system := processCPU()
	user -= r.readyUser + du1 - du0
	system -= r.readySystem + ds1 - ds0
	res.CPU = CPU{Setup: r.readyUser + r.readySystem, Record: user + system, RecordSystem: system}
	res.Events = map[string]uint64{}
	res.Produced = map[string]uint64{}
	res.LostBy = map[string]uint64{}
	res.FilteredBy = map[string]uint64{}
	for _, in := range event.Catalogue {
		if n := r.filtered[in.Type]; n > 0 {
			res.FilteredBy[in.Name] = n
			res.Filtered += n
		}
		if n := r.counts[in.Type]; n > 0 {
			res.Events[in.Name] = n
		}
		if int(in.Type) < len(produced) && produced[in.Type] > 0 {
			res.Produced[in.Name] = produced[in.Type]
		}
		if int(in.Type) < len(lostBy) && lostBy[in.Type] > 0 {
			res.LostBy[in.Name] = lostBy[in.Type]
			res.Lost += lostBy[in.Type]
		}
	}
	if kerr := r.kev.finish(r, res); kerr != nil && err == nil {
		err = kerr
	}
	if r.writeErr == nil {
		sum := &trace.Summary{
			EndWallNs: time.Now().UnixNano(),
			Events:    res.Events,
			Lost:      res.Lost,
			Missed:    &res.Missed,
			Extra:     map[string]any{"produced": res.Produced, "lost_by_type": res.LostBy, "missed_by_program": res.MissedBy, "recorder_cpu_ns": res.CPU.summary()},
		}
		if r.sel != nil {
			sum.Extra["filtered_by_type"] = res.FilteredBy
		}
		sum.Extra["learned_at_start"] = res.Learned.summary()
		if len(res.Unrecorded) > 0 {
			sum.Extra["unrecorded"] = res.Unrecorded
		}
		if ks := res.KernelSkipped; ks != nil {
			sum.KernelSkipped = &ks.Skipped
			sum.Extra["kernel_skipped_by_interface"] = ks
		} else {
			sum.Extra["kernel_skipped_error"] = res.KernelSkippedErr
		}
		if cerr := r.w.Close(sum); cerr != nil {
			if err == nil {
				err = r.stopOnWrite(cerr)
			}
			res.Truncated = true
		}
	} else {
		res.Truncated = true
	}
	res.Bytes = r.w.Bytes()
	return err
}

// writeSummaries writes a conn_summary record for each connection whose
// figures moved since its last one (summary mode).
func (r *recorder) writeSummaries() error {
	_, err := r.sum.Collect(r.now(), func(rec []byte) error {
		if err := r.w.Write(rec); err != nil {
			return r.stopOnWrite(err)
		}
		r.counts[event.ConnSummary]++
		return nil
	})
	return err
}

// writePendingLosses writes the losses BPF counted but could not yet put in
// the stream (the ring stayed full until the end).
func (r *recorder) writePendingLosses() error {
	pending, err := r.probe.PendingLosses()
	if err != nil {
		return err
	}
	for _, pl := range pending {
		b := r.buf(r.lostSize)
		var total uint32
		for _, n := range pl.Counts {
			total += n
		}
		binary.NativeEndian.PutUint64(b[0:], pl.LastNs)
		binary.NativeEndian.PutUint32(b[20:], total)
		binary.NativeEndian.PutUint16(b[28:], uint16(pl.CPU))
		b[30] = uint8(event.Lost)
		binary.NativeEndian.PutUint64(b[32:], pl.FirstNs)
		binary.NativeEndian.PutUint64(b[40:], pl.LastNs)
		binary.NativeEndian.PutUint32(b[48:], total)
		binary.NativeEndian.PutUint32(b[52:], pl.Ring)
		for i, n := range pl.Counts {
			binary.NativeEndian.PutUint32(b[56+4*i:], n)
		}
		if err := r.w.Write(b); err != nil {
			return r.stopOnWrite(err)
		}
		r.counts[event.Lost]++
	}
	return nil
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return 1
}

// CheckBufferSize validates a ring buffer size: the kernel wants a power of
// two and a multiple of the page size.
func CheckBufferSize(n int) error {
	page := os.Getpagesize()
	if n < page || n&(n-1) != 0 || n > 1<<30 {
		return fmt.Errorf("buffer size %d: want a power of two between %s and 1GiB", n, humanBytes(int64(page)))
	}
	return nil
}

// ParseBufferSize reads a ring buffer size as people type it ("8MiB",
// "8 MiB": bytesize.Parse) and checks it with CheckBufferSize.
func ParseBufferSize(s string) (int, error) {
	n, err := bytesize.Parse(s)
	if err != nil {
		return 0, err
	}
	if n > 1<<30 {
		return 0, fmt.Errorf("buffer size %s: want a power of two up to 1GiB", strings.TrimSpace(s))
	}
	if err := CheckBufferSize(int(n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// checkPrivileges fails early, with one line, when BPF cannot be loaded.
func checkPrivileges() error {
	if os.Geteuid() == 0 {
		return nil
	}
	data, err := os.ReadFile("/proc/self/status")
	if err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
				caps, _ := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				const capNetAdmin, capPerfmon, capBPF = 12, 38, 39
				need := uint64(1)<<capNetAdmin | 1<<capPerfmon | 1<<capBPF
				if caps&need == need {
					return nil
				}
			}
		}
	}
	return probe.ErrPermission
}

// resolveFilters turns names and paths into the ids BPF compares.
func resolveFilters(f Filters) (probe.Filters, error) {
	var kf probe.Filters
	if f.Port < 0 || f.Port > 65535 {
		return kf, fmt.Errorf("port %d: want 1-65535", f.Port)
	}
	kf.Port = uint16(f.Port)
	if f.PID < 0 {
		return kf, fmt.Errorf("pid %d: want a positive process id", f.PID)
	}
	if f.PID > 0 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", f.PID)); err != nil {
			return kf, fmt.Errorf("pid %d: no such process", f.PID)
		}
		kf.TGID = uint32(f.PID)
	}
	if f.NetNS != "" {
		path := f.NetNS
		if !strings.Contains(path, "/") {
			path = filepath.Join("/run/netns", path)
		}
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			return kf, fmt.Errorf("netns %s: %w", f.NetNS, err)
		}
		var fs unix.Statfs_t
		if err := unix.Statfs(path, &fs); err != nil || (fs.Type != unix.NSFS_MAGIC && fs.Type != unix.PROC_SUPER_MAGIC) {
			return kf, fmt.Errorf("netns %s: not a network namespace", f.NetNS)
		}
		kf.NetNS = uint32(st.Ino)
	}
	if f.Cgroup != "" {
		var fs unix.Statfs_t
		if err := unix.Statfs(f.Cgroup, &fs); err != nil {
			return kf, fmt.Errorf("cgroup %s: %w", f.Cgroup, err)
		}
		if fs.Type != unix.CGROUP2_SUPER_MAGIC {
			return kf, fmt.Errorf("cgroup %s: not in a cgroup2 hierarchy", f.Cgroup)
		}
		var st unix.Stat_t
		if err := unix.Stat(f.Cgroup, &st); err != nil {
			return kf, fmt.Errorf("cgroup %s: %w", f.Cgroup, err)
		}
		kf.CgroupID = st.Ino
	}
	if f.Pcap != "" {
		e, err := pcapfilter.Parse(f.Pcap)
		if err != nil {
			return kf, err
		}
		if kf.Pcap, err = e.Compile(); err != nil {
			return kf, fmt.Errorf("%w: %q %v: record a wider selection and give the expression when reading (magnet parse FILE '%s')", pcapfilter.ErrSyntax, f.Pcap, err, f.Pcap)
		}
	}
	return kf, nil
}

// checkPcapGroups refuses event groups whose events have no connection
// with an expression: it selects connections, so it would keep none of
// them (the readers apply it the same way).
func checkPcapGroups(g event.Group, kernelEvents bool) error {
	if g&event.GroupSched != 0 {
		return fmt.Errorf("the sched group with a pcap-filter expression: scheduler events have no connection, so an expression keeps none (leave sched out, or record without the expression and give it when reading)")
	}
	if kernelEvents {
		return fmt.Errorf("kernel events with a pcap-filter expression: they have no connection, so an expression keeps none (record without the expression and give it when reading)")
	}
	return nil
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// SortedCounts returns m's entries sorted by name, for printing.
func SortedCounts(m map[string]uint64) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
