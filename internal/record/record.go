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
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/hostcheck"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// DefaultBufferBytes is the default size of the events ring buffer: 8 MiB.
// A bulk transfer at 10 Gbit/s with TSO makes ~1 M events/s of ~80 bytes in
// the ring; the reader polls every 50 ms and is woken at 1/8 full, so 8 MiB
// rides out ~100 ms of reader delay (a busy disk, a descheduled reader) at
// that rate, where MAGNeT's measurements showed 1 MB sufficed at 1 Gbit/s.
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
	// Ready, if set, is called once the probes are attached and before the
	// command starts.
	Ready func()
	// FlushEvery bounds what a crash can lose: blocks are written at least
	// this often.
	FlushEvery time.Duration
	// StatusDir holds the status file `magnet status` reads.
	StatusDir string
	// DisableHooks lists BPF programs not to load (see probe.Options).
	DisableHooks []string
	// NewSink, if set, replaces the trace file at Output: it is called once
	// with the trace header, after the probes load and before any record.
	// Rotation and the daemon use it to put records somewhere else.
	NewSink func(hdr *trace.Header) (Sink, error)
	// Loaded, if set, is called with the loaded probe before recording
	// starts, for callers that change it at run time (probe.SetGroups).
	Loaded func(p *probe.Probe)
	// ExcludeCgroupID is a cgroup2 id whose sockets are never recorded:
	// the collect service's shipper runs in it. 0 = none.
	ExcludeCgroupID uint64
}

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

// Result is what a recording did.
type Result struct {
	Output    string
	Events    map[string]uint64 // records in the trace by type (task, iface included)
	Lost      uint64
	Produced  map[string]uint64 // events the BPF side produced, by type
	LostBy    map[string]uint64 // events lost, by type
	Bytes     int64
	Hooks     []probe.HookStatus
	ExitCode  int // the command's exit code, if there was one
	Truncated bool
}

// ErrStopped marks a recording that ended because of a write error; what was
// recorded before stays readable.
var ErrStopped = errors.New("recording stopped")

// Run records until ctx is done, the duration ends or the command exits.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.BufferBytes == 0 {
		cfg.BufferBytes = DefaultBufferBytes
	}
	if err := CheckBufferSize(cfg.BufferBytes); err != nil {
		return nil, err
	}
	if cfg.Groups == 0 {
		cfg.Groups = event.DefaultGroups
	}
	if cfg.FlushEvery == 0 {
		cfg.FlushEvery = 200 * time.Millisecond
	}
	if cfg.StatusDir == "" {
		cfg.StatusDir = DefaultStatusDir
	}
	kf, err := resolveFilters(cfg.Filters)
	if err != nil {
		return nil, err
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
		out, err = os.OpenFile(cfg.Output, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, fmt.Errorf("create output: %w", err)
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

	p, err := probe.Load(probe.Options{
		Groups:          cfg.Groups,
		Filters:         kf,
		BufferBytes:     cfg.BufferBytes,
		ControlBytes:    ControlBufferBytes,
		SelfTGID:        uint32(os.Getpid()),
		Disable:         cfg.DisableHooks,
		ExcludeCgroupID: cfg.ExcludeCgroupID,
	})
	if err != nil {
		return nil, err
	}
	defer p.Close()

	hdr, err := buildHeader(cfg, p.Status, hc)
	if err != nil {
		return nil, err
	}
	var w Sink
	if cfg.NewSink != nil {
		w, err = cfg.NewSink(hdr)
	} else {
		w, err = trace.NewWriter(out, hdr, trace.WriterOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("write trace header: %w", err)
	}
	if cfg.Loaded != nil {
		cfg.Loaded(p)
	}
	r := &recorder{cfg: cfg, probe: p, w: w, hdr: hdr, tasks: map[uint32]taskKey{}, started: time.Now()}
	if r.events, err = ringbuf.NewReader(p.Events); err != nil {
		return nil, fmt.Errorf("open events ring: %w", err)
	}
	defer r.events.Close()
	if r.control, err = ringbuf.NewReader(p.Control); err != nil {
		return nil, fmt.Errorf("open control ring: %w", err)
	}
	defer r.control.Close()
	r.taskSize = hdr.TypeByID(uint8(event.Task)).Size
	r.lostSize = hdr.TypeByID(uint8(event.Lost)).Size

	status := newStatusFile(cfg, p, r)
	defer status.remove()
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
		go func() { cmdDone <- cmd.Wait() }()
	}
	var deadline <-chan time.Time
	if cfg.Duration > 0 {
		t := time.NewTimer(cfg.Duration)
		defer t.Stop()
		deadline = t.C
	}

	res := &Result{Output: cfg.Output, Hooks: p.Status}
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
	cfg             Config
	probe           *probe.Probe
	w               Sink
	hdr             *trace.Header
	events, control *ringbuf.Reader
	rec             ringbuf.Record
	tasks           map[uint32]taskKey
	counts          [256]uint64
	total           atomic.Uint64
	lost            atomic.Uint64
	started         time.Time
	taskSize        int
	lostSize        int
	scratch         []byte
	writeErr        error
}

func (r *recorder) loop(ctx context.Context, cmdDone <-chan error, deadline <-chan time.Time, st *statusFile, res *Result) error {
	lastFlush, lastStatus := time.Now(), time.Now()
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
		if err := r.drain(r.control, 0); err != nil {
			return err
		}
		if err := r.drain(r.events, 50*time.Millisecond); err != nil {
			return err
		}
		now := time.Now()
		if now.Sub(lastFlush) >= r.cfg.FlushEvery {
			if err := r.w.Flush(); err != nil {
				return r.stopOnWrite(err)
			}
			lastFlush = now
		}
		if now.Sub(lastStatus) >= time.Second {
			total := r.total.Load()
			rate := float64(total-lastTotal) / now.Sub(lastStatus).Seconds()
			lastTotal, lastStatus = total, now
			st.update()
			if r.cfg.Live != nil {
				fmt.Fprintf(r.cfg.Live, "\r\033[Krecording: %.0f events/s, %d events, %s written, %d lost", rate, total, humanBytes(r.w.Bytes()), r.lost.Load())
			}
		}
	}
}

// drain reads one ring until it is empty, or for at most wait when the ring
// keeps delivering.
func (r *recorder) drain(rd *ringbuf.Reader, wait time.Duration) error {
	end := time.Now().Add(wait)
	rd.SetDeadline(end)
	for n := 0; ; n++ {
		err := rd.ReadInto(&r.rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read ring buffer: %w", err)
		}
		// Connection records are produced before the events that need them;
		// writing whatever the control ring holds first keeps that order.
		if rd == r.events && r.control.AvailableBytes() > 0 {
			if err := r.drainControl(r.rec.RawSample); err != nil {
				return err
			}
		}
		if err := r.handle(r.rec.RawSample); err != nil {
			return err
		}
		if n&1023 == 1023 && time.Now().After(end) {
			return nil
		}
	}
}

// drainControl writes the control ring's records while holding pending, a
// record of the events ring that must not be overwritten.
func (r *recorder) drainControl(pending []byte) error {
	r.control.SetDeadline(time.Now())
	var rec ringbuf.Record
	for {
		err := r.control.ReadInto(&rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read control ring: %w", err)
		}
		if err := r.handle(rec.RawSample); err != nil {
			return err
		}
	}
}

// drainAll empties both rings once nothing produces any more: drain stops
// after a batch once its deadline has passed, so loop until both are empty.
func (r *recorder) drainAll() error {
	for {
		if err := r.drain(r.control, 0); err != nil {
			return err
		}
		if err := r.drain(r.events, 0); err != nil {
			return err
		}
		if r.events.AvailableBytes() == 0 && r.control.AvailableBytes() == 0 {
			return nil
		}
	}
}

// handle writes one ring record: a task record first when its thread is new,
// renamed or of another uid, then the event without its struct mg_task
// prefix.
func (r *recorder) handle(raw []byte) error {
	pre := probe.TaskPrefixSize
	if len(raw) < pre+32 {
		return fmt.Errorf("short ring record (%d bytes)", len(raw))
	}
	rec := raw[pre:]
	typ := rec[30]
	tid := binary.NativeEndian.Uint32(rec[16:20])
	var k taskKey
	k.pid = binary.NativeEndian.Uint32(raw[0:4])
	k.uid = binary.NativeEndian.Uint32(raw[4:8])
	copy(k.comm[:], raw[8:24])
	// tid 0 is each CPU's idle task (swapper/N): nothing to resolve.
	if old, ok := r.tasks[tid]; tid != 0 && (!ok || old != k) {
		r.tasks[tid] = k
		if err := r.writeTask(rec, tid, k); err != nil {
			return err
		}
	}
	if err := r.w.Write(rec); err != nil {
		return r.stopOnWrite(err)
	}
	r.counts[typ]++
	if typ == uint8(event.Lost) {
		r.lost.Add(uint64(binary.NativeEndian.Uint32(rec[32+16:])))
	} else {
		r.total.Add(1)
	}
	return nil
}

func (r *recorder) writeTask(ev []byte, tid uint32, k taskKey) error {
	b := r.buf(r.taskSize)
	copy(b[0:8], ev[0:8]) // time of the event that introduced it
	binary.NativeEndian.PutUint32(b[16:], tid)
	binary.NativeEndian.PutUint32(b[24:], binary.NativeEndian.Uint32(ev[24:28]))
	binary.NativeEndian.PutUint16(b[28:], binary.NativeEndian.Uint16(ev[28:30]))
	b[30] = uint8(event.Task)
	binary.NativeEndian.PutUint32(b[32:], k.pid)
	binary.NativeEndian.PutUint32(b[36:], k.uid)
	copy(b[40:56], k.comm[:])
	if err := r.w.Write(b); err != nil {
		return r.stopOnWrite(err)
	}
	r.counts[event.Task]++
	return nil
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
	r.probe.Detach()
	var err error
	if r.writeErr == nil {
		err = r.drainAll()
	}
	produced, lostBy, cerr := r.probe.CountersOf()
	if cerr != nil && err == nil {
		err = cerr
	}
	if r.writeErr == nil && err == nil {
		err = r.writePendingLosses()
	}
	res.Events = map[string]uint64{}
	res.Produced = map[string]uint64{}
	res.LostBy = map[string]uint64{}
	for _, in := range event.Catalogue {
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
	if r.writeErr == nil {
		sum := &trace.Summary{
			EndWallNs: time.Now().UnixNano(),
			Events:    res.Events,
			Lost:      res.Lost,
			Extra:     map[string]any{"produced": res.Produced, "lost_by_type": res.LostBy},
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
	return kf, nil
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
