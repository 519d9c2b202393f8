// SPDX-License-Identifier: Apache-2.0

package collect

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/flight"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/rotate"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// Options are how the service is run (not what it does: that is Config).
type Options struct {
	// ConfigPath is passed to the shipper child.
	ConfigPath string
	// Self is the magnet binary the shipper child runs; "" = this one.
	Self string
	// Log receives the service's lines (files started, shipped, dropped).
	Log func(format string, args ...any)
	// Ready, if set, is called once the probes are attached.
	Ready func()
	// StatusDir is passed to the recorder ("" = record's default).
	StatusDir string
	// Trigger, if set, fires the flight recorder (flight.window) once per
	// value received, named by it ("signal"); without one it is ignored.
	Trigger <-chan string
}

// Run is the service: it records with rotation into the spool and keeps a
// shipper child process running beside it, until ctx ends. The shipper runs
// in a cgroup of its own that the recorder excludes (probe exclude_cgroup),
// so the traffic of shipping never appears in the traces.
func Run(ctx context.Context, cfg *Config, opts Options) (*record.Result, error) {
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	if opts.Self == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("collect: find own binary: %w", err)
		}
		opts.Self = self
	}
	if err := os.MkdirAll(cfg.Spool, 0o755); err != nil {
		return nil, fmt.Errorf("create spool: %w", err)
	}
	pat, err := rotate.ParsePattern(filepath.Join(cfg.Spool, cfg.Pattern), cfg.Host)
	if err != nil {
		return nil, err
	}
	// Without targets there is no shipper whose traffic to leave out, and
	// so no cgroup to find (nor to fail to make).
	var cg *shipperCgroup
	var excluded uint64
	if len(cfg.Targets) > 0 {
		if cg, err = newShipperCgroup(); err != nil {
			return nil, err
		}
		defer cg.remove()
		excluded = cg.id
		opts.Log("the shipper runs in %s, %s, which the recorder excludes", cg.path, cg.how)
	}

	sup := &supervisor{opts: opts, cg: cg}
	if len(cfg.Targets) > 0 {
		if err := sup.start(); err != nil {
			return nil, err
		}
		shipCtx, stopShip := context.WithCancel(context.Background())
		defer func() {
			stopShip()
			sup.stop()
		}()
		go sup.watch(shipCtx)
	} else {
		opts.Log("no targets: files stay in %s", cfg.Spool)
	}

	rcfg := record.Config{
		Output:          pat.Expand(time.Now(), 0),
		Groups:          cfg.groups,
		Summary:         cfg.Summary,
		Filters:         record.Filters{PID: cfg.Filters.PID, Cgroup: cfg.Filters.Cgroup, NetNS: cfg.Filters.NetNS, Port: cfg.Filters.Port, Pcap: cfg.Filters.Pcap},
		BufferBytes:     cfg.buffer,
		Ready:           opts.Ready,
		StatusDir:       opts.StatusDir,
		ExcludeCgroupID: excluded,
		FlushEvery:      record.FlushEveryFor(cfg.Rotate.Interval),
		NewSink: func(h *trace.Header) (record.Sink, error) {
			h.Host = cfg.Host
			return rotate.New(h, cfg.sinkOptions(pat, sup.wake, opts.Log))
		},
	}
	if cfg.flight != nil {
		rcfg.NewSink = cfg.flightSink(pat, sup.wake, opts)
	}
	return record.Run(ctx, rcfg)
}

// flightSink makes the recording's sink a flight recorder whose files are
// named by the spool's pattern (so the shipper takes them once finished),
// never with a name the spool used before, and which opts.Trigger fires.
func (cfg *Config) flightSink(pat *rotate.Pattern, finished func(), opts Options) func(*trace.Header) (record.Sink, error) {
	return func(h *trace.Header) (record.Sink, error) {
		h.Host = cfg.Host
		names := loadNames(filepath.Join(cfg.Spool, namesLog))
		names.log = opts.Log
		o := *cfg.flight
		seq := 0
		o.Name = func(now time.Time) string {
			p := pat.Expand(now, seq)
			seq++
			return p
		}
		o.Taken, o.OnStart = names.has, names.add
		o.OnFinish = func(string) {
			cfg.keepBudget(pat, opts.Log)
			finished()
		}
		o.Log = opts.Log
		s, err := flight.New(h, o)
		if err != nil {
			return nil, err
		}
		if opts.Trigger != nil {
			// The recording outlives no trigger: the goroutine ends with
			// the channel (the caller closes it when Run returns).
			go func() {
				for reason := range opts.Trigger {
					s.Trigger(reason)
				}
			}()
		}
		opts.Log("flight recorder: the last %s kept in memory; triggers %q, SIGUSR1", o.Window, o.Triggers)
		return s, nil
	}
}

// sinkOptions is how the service rotates: the configured interval and size,
// the disk budget — which counts the shipper's staging copies too — and the
// oldest finished files dropped (with their staging copies, and logged in
// the spool's .dropped.log) when the budget or the disk runs out.
func (cfg *Config) sinkOptions(pat *rotate.Pattern, finished func(), log func(string, ...any)) rotate.Options {
	staging := filepath.Join(cfg.Spool, stagingDir)
	names := loadNames(filepath.Join(cfg.Spool, namesLog))
	names.log = log
	return rotate.Options{
		Pattern:    pat,
		Interval:   cfg.Rotate.Interval,
		MaxBytes:   cfg.rotateMax,
		Budget:     cfg.budget,
		Extra:      func() int64 { return dirBytes(staging) },
		Taken:      names.has,
		OnStart:    names.add,
		DropOnFull: true,
		OnFinish:   func(string) { finished() },
		OnDrop:     cfg.onDrop(log),
		Log:        log,
	}
}

// onDrop is what follows a finished file dropped from the spool.
func (cfg *Config) onDrop(log func(string, ...any)) func(path string, size int64, why string) {
	dropLog := filepath.Join(cfg.Spool, droppedLog)
	staging := filepath.Join(cfg.Spool, stagingDir)
	return func(path string, size int64, why string) {
		// A dropped file is not being shipped (the shipper holds a
		// file's lock while it ships it): its staging copies are idle.
		removeStaged(staging, filepath.Base(path))
		if err := appendLine(dropLog, fmt.Sprintf("%s\t%s\t%d\t%s\n", time.Now().UTC().Format(time.RFC3339), filepath.Base(path), size, why)); err != nil {
			log("record dropped file in %s: %v", dropLog, err)
		}
	}
}

// keepBudget drops the oldest finished files of the spool while they and
// the staging copies are over disk_budget, as the rotating sink does
// after each file it finishes (the flight recorder's files are finished
// files of the same pattern).
func (cfg *Config) keepBudget(pat *rotate.Pattern, log func(string, ...any)) {
	if cfg.budget <= 0 {
		return
	}
	onDrop := cfg.onDrop(log)
	for {
		total := dirBytes(filepath.Join(cfg.Spool, stagingDir))
		fs, _ := rotate.Finished(pat, "")
		for _, f := range fs {
			total += f.Size
		}
		if total <= cfg.budget || len(fs) == 0 {
			return
		}
		if err := os.Remove(fs[0].Path); err != nil {
			log("could not drop %s: %v", fs[0].Path, err)
			return
		}
		log("dropped %s (%d bytes): budget", fs[0].Path, fs[0].Size)
		onDrop(fs[0].Path, fs[0].Size, "budget")
	}
}

// names remembers the base names of the last files recorded into the
// spool, across restarts (SPOOL/.names, one per line): a file shipped and
// deleted leaves no trace in the spool, and a recording restarted within the
// same second would give its first file the name of the last one, which it
// would then replace in the archive.
type names struct {
	path string
	seen map[string]bool
	log  func(string, ...any)
}

// keepNames is how many names the file keeps (the newest): far more than
// could fall within one second of a restart.
const keepNames = 256

func loadNames(path string) *names {
	n := &names{path: path, seen: map[string]bool{}}
	data, _ := os.ReadFile(path)
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > keepNames {
		lines = lines[len(lines)-keepNames:]
		// Best effort: a failed trim leaves the longer list, still right.
		_ = writeFileSync(path, []byte(strings.Join(lines, "\n")+"\n"))
	}
	for _, l := range lines {
		n.seen[l] = true
	}
	return n
}

func (n *names) has(path string) bool { return n.seen[filepath.Base(path)] }

func (n *names) add(path string) {
	n.seen[filepath.Base(path)] = true
	if err := appendLine(n.path, filepath.Base(path)+"\n"); err != nil && n.log != nil {
		n.log("remember file name in %s: %v", n.path, err)
	}
}

// dirBytes is the size of the regular files in dir.
func dirBytes(dir string) int64 {
	ents, _ := os.ReadDir(dir)
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}

// removeStaged removes the staging copies of the spool file name: NAME.zst
// (or NAME itself when not compressed), its manifest, and .part files.
func removeStaged(staging, name string) {
	ents, _ := os.ReadDir(staging)
	for _, e := range ents {
		if stagedBase(e.Name()) == name {
			os.Remove(filepath.Join(staging, e.Name()))
		}
	}
}

// stagedBase is the spool file a staging file belongs to.
func stagedBase(staged string) string {
	return strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(staged, ".part"), ".json"), ".zst")
}

// appendLine appends line to path and syncs it.
func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(line)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Dropped reads the spool's log of dropped files: how many, how many bytes.
func Dropped(spool string) (files int, bytes int64) {
	data, _ := os.ReadFile(filepath.Join(spool, droppedLog))
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Split(line, "\t")
		if len(f) == 4 {
			var n int64
			fmt.Sscan(f[2], &n)
			files++
			bytes += n
		}
	}
	return files, bytes
}

// supervisor keeps the shipper child running; its stdin is the wake-up
// line, and its end (EOF) tells the child to stop.
type supervisor struct {
	opts Options
	cg   *shipperCgroup

	mu    sync.Mutex
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
}

func (s *supervisor) start() error {
	cmd := exec.Command(s.opts.Self, "collect", "--config", s.opts.ConfigPath, "--ship-only")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	// A process group of its own: a terminal's ^C or `timeout` stops the
	// service, which then stops the shipper after a last pass.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if s.cg.fd != nil {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(s.cg.fd.Fd())
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start shipper: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.stdin, s.done = cmd, stdin, done
	s.mu.Unlock()
	return nil
}

// watch restarts the shipper when it dies, with a growing delay.
func (s *supervisor) watch(ctx context.Context) {
	var b backoff
	for {
		s.mu.Lock()
		done := s.done
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-done:
		}
		d := b.fail(time.Now(), time.Second, time.Minute)
		s.opts.Log("shipper exited (%v); restarting in %s", s.cmd.ProcessState, d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		if err := s.start(); err != nil {
			s.opts.Log("%v", err)
		}
	}
}

func (s *supervisor) wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stdin != nil {
		_, _ = s.stdin.Write([]byte("finished\n"))
	}
}

// stop closes the child's stdin, which makes it ship what it can in a last
// pass of at most finalPass, and waits for it (a shipment cut off is redone
// by the next start anyway).
func (s *supervisor) stop() {
	s.mu.Lock()
	cmd, stdin, done := s.cmd, s.stdin, s.done
	s.stdin = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	stdin.Close()
	select {
	case <-done:
	case <-time.After(finalPass + 5*time.Second):
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
}

// finalPass bounds the shipper's last pass when the service stops.
const finalPass = 30 * time.Second

// Ship is the shipper child's main loop: ship until stdin ends or ctx does;
// each line on stdin asks for a pass now. At the end of stdin (the service
// stopped, or died) it makes a last pass of at most finalPass, so that the
// file the recorder closed last goes too.
func Ship(ctx context.Context, cfg *Config, stdin io.Reader, log func(string, ...any)) error {
	s, err := NewShipper(cfg)
	if err != nil {
		return err
	}
	s.Log = log
	defer s.Close()
	if cfg.Metrics.Listen != "" {
		ln, err := net.Listen("tcp", cfg.Metrics.Listen)
		if err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", s.MetricsHandler())
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
		log("metrics on http://%s/metrics", ln.Addr())
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	wake := make(chan struct{}, 1)
	eof := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			select {
			case wake <- struct{}{}:
			default:
			}
		}
		close(eof)
		cancel()
	}()
	if err := s.Run(runCtx, wake); err != nil {
		return err
	}
	select {
	case <-eof:
		last, stop := context.WithTimeout(ctx, finalPass)
		defer stop()
		s.Pass(last)
	default:
	}
	return nil
}

// shipperCgroup is the cgroup2 the shipper runs in, whose id the recorder
// excludes from tracing.
type shipperCgroup struct {
	path string   // the cgroup
	fd   *os.File // open on it, to start the shipper in it; nil: the shipper inherits it
	id   uint64
	made bool // made here, removed at the end
	how  string
}

// newShipperCgroup finds a cgroup for the shipper that holds nothing that
// should be traced:
//
//  1. the service's own cgroup, when only the service runs in it (a systemd
//     service, a container): nothing to create, and so nothing to write in
//     a cgroup2 file system that the unit's ProtectControlGroups= or the
//     container's read-only mount keeps read-only;
//  2. else a cgroup of its own, magnet-collect-PID under the cgroup2 root
//     (a service run from a shell, whose cgroup is the shell's session);
//  3. else, a delegated subtree: magnet-shipper under its own cgroup.
//
// Excluding the service's cgroup leaves out the recorder too, which the
// recorder's self filter does anyway.
func newShipperCgroup() (*shipperCgroup, error) {
	root, err := probe.Cgroup2Root()
	if err != nil {
		return nil, err
	}
	own, ownErr := ownCgroup(root)
	if ownErr == nil && own != root && onlyUs(own) {
		id, err := cgroupID(own)
		if err != nil {
			return nil, err
		}
		return &shipperCgroup{path: own, id: id, how: "the service's own cgroup (nothing else runs in it)"}, nil
	}
	removeStaleCgroups(root)
	cg, err := makeCgroup(filepath.Join(root, fmt.Sprintf("magnet-collect-%d", os.Getpid())))
	if err == nil {
		cg.how = "a cgroup of its own"
		return cg, nil
	}
	why := err.Error()
	if ownErr == nil && own != root {
		cg, err2 := makeCgroup(filepath.Join(own, "magnet-shipper"))
		if err2 == nil {
			cg.how = "a cgroup of its own, in the service's"
			return cg, nil
		}
		why += "; " + err2.Error()
	} else if ownErr != nil {
		why += "; " + ownErr.Error()
	} else {
		why += "; the service runs in the root cgroup"
	}
	return nil, fmt.Errorf("no cgroup to keep the shipper's traffic out of the trace: %s (run it as a systemd service or in a container of its own, or with a writable cgroup2 mount)", why)
}

// makeCgroup creates the cgroup path and opens it.
func makeCgroup(path string) (*shipperCgroup, error) {
	if err := os.Mkdir(path, 0o755); err != nil && !os.IsExist(err) {
		return nil, fmt.Errorf("create shipper cgroup: %w", err)
	}
	fd, err := os.Open(path)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("open shipper cgroup: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(fd.Fd()), &st); err != nil {
		fd.Close()
		os.Remove(path)
		return nil, fmt.Errorf("shipper cgroup: %w", err)
	}
	return &shipperCgroup{path: path, fd: fd, id: st.Ino, made: true}, nil
}

// cgroupID is a cgroup's id: its inode in the cgroup2 file system.
func cgroupID(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", path, err)
	}
	return st.Ino, nil
}

// ownCgroup is the directory of this process's cgroup under root. In a
// cgroup namespace (a container) /proc/self/cgroup names it from the
// namespace's root, which is not root when root is the host's hierarchy
// mounted in: then it is found by its cgroup.procs.
func ownCgroup(root string) (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("own cgroup: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rel, ok := strings.CutPrefix(line, "0::"); ok {
			if p := filepath.Join(root, rel); holds(p, os.Getpid()) {
				return p, nil
			}
		}
	}
	found := ""
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if holds(p, os.Getpid()) {
			found = p
			return filepath.SkipAll
		}
		return nil
	})
	if found == "" {
		return "", errors.New("own cgroup not found under " + root)
	}
	return found, nil
}

// pids reads a cgroup's cgroup.procs.
func pids(cg string) ([]int, error) {
	data, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(data)) {
		var n int
		fmt.Sscan(f, &n)
		out = append(out, n)
	}
	return out, nil
}

func holds(cg string, pid int) bool {
	ps, err := pids(cg)
	return err == nil && slices.Contains(ps, pid)
}

// onlyUs says whether every process in the cgroup cg is this one or one of
// its descendants.
func onlyUs(cg string) bool {
	ps, err := pids(cg)
	if err != nil || len(ps) == 0 {
		return false
	}
	self := os.Getpid()
	for _, p := range ps {
		for p != self {
			if p <= 1 {
				return false
			}
			p = parentPID(p)
		}
	}
	return true
}

// parentPID is pid's parent, from /proc (0 if gone).
func parentPID(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: comm may hold spaces, so cut after ')'.
	i := strings.LastIndexByte(string(data), ')')
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 2 {
		return 0
	}
	var pp int
	fmt.Sscan(f[1], &pp)
	return pp
}

// removeStaleCgroups removes the shipper cgroups of services that died
// (SIGKILL): their name holds a pid that is gone; rmdir fails while a
// process is still inside.
func removeStaleCgroups(root string) {
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "magnet-collect-%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); errors.Is(err, os.ErrNotExist) {
			os.Remove(filepath.Join(root, e.Name()))
		}
	}
}

func (c *shipperCgroup) remove() {
	if c.fd != nil {
		c.fd.Close()
	}
	if !c.made {
		return
	}
	for i := 0; i < 50; i++ {
		if err := os.Remove(c.path); err == nil || os.IsNotExist(err) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
