// SPDX-License-Identifier: Apache-2.0

// Package record is the `magnet record` command.
package record

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/magnet-tracer/magnet/internal/bytesize"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/evselect"
	"github.com/magnet-tracer/magnet/internal/flight"
	"github.com/magnet-tracer/magnet/internal/outfile"
	"github.com/magnet-tracer/magnet/internal/pcapfilter"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/record"
	"github.com/magnet-tracer/magnet/internal/rotate"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// New returns the record command.
func New() *cobra.Command {
	var (
		output, events, buffer, cgroup, netns, readyFile, cpuProfile string
		celFilter                                                    string
		wakeupFill                                                   float64
		pollInterval, flushEvery                                     time.Duration
		pid, port                                                    int
		duration                                                     time.Duration
		quiet                                                        bool
		disable                                                      []string
		xmitAtDevice, hooksOnly, noEmit                              bool
		rotateEvery                                                  time.Duration
		rotateSize, onFull                                           string
		keep                                                         int
		kernel                                                       kernelFlags
		summaryEvery                                                 time.Duration
		flightWindow, flightAfter                                    time.Duration
		flightMemory, triggers                                       string
	)
	cmd := &cobra.Command{
		Use:   "record -o FILE [flags] [EXPRESSION] [-- COMMAND [ARGS...]]",
		Short: "Record network-stack events into a trace file",
		Long: `Record every step of data through the network stack into a trace file.

Runs until COMMAND exits, --duration ends, or SIGINT/SIGTERM; then it drains
everything still buffered and closes the file. With COMMAND, only the command
and its children are recorded (they run in a cgroup of their own).

EXPRESSION is a pcap-filter expression, as tcpdump takes it ('tcp port 443 and
net 10.1.0.0/16'): it selects connections, judged in the kernel by each
socket's addresses and ports when it is first seen, and the trace keeps every
event of the connections it selects, at every layer (docs/FILTERS.md).

With --rotate or --rotate-size the recording goes on across files: -o is a
pattern whose verbs are expanded as each file starts (UTC): %Y %m %d, %H (the
host name, or the hour once %Y, %m or %d came before it), %M %S, %s (Unix
seconds), %h (host name), %n (file number), %%. No event is lost or doubled
at a seam; each file reads on its own, and parse, report and export read the
files of a chain as one timeline. --keep N deletes the oldest finished files.

To leave it on: --summary[=INTERVAL] reads each TCP connection's figures from
its socket (bytes written, read, sent and received, segments,
retransmissions, srtt and cwnd) at every interval and at close, counts its
drops (and, with --groups ...,ip,dev, its packets at those layers) in the
kernel, and writes one conn_summary record per active connection every
INTERVAL instead of events; --flight WINDOW keeps the events in memory and
writes nothing until a --trigger fires or SIGUSR1 comes, then -o's
stem-<UTC time>.mgt with the WINDOW before it and --flight-after past it.

Event groups (--groups, comma-separated; "-group" removes one; --events is the
same flag):
` + event.GroupHelp() + kernelGroupHelp(),
		Example: `  sudo magnet record -o ftp.mgt -- curl -s -o /dev/null http://10.0.0.2/big
  sudo magnet record -o host.mgt --duration 30s --port 5201
  sudo magnet record -o web.mgt 'tcp port 443 and net 10.1.0.0/16'
  sudo magnet record -o all.mgt --groups default,sched,headers --duration 5s
  sudo magnet record --summary=10s --rotate 1h -o /var/lib/magnet/%h-%Y%m%dT%H%M%S.mgt
  sudo magnet record --rotate 1h --rotate-size 1GiB --keep 48 -o /var/lib/magnet/%H-%Y%m%dT%H%M%S.mgt`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("filter") && strings.TrimSpace(celFilter) == "" {
				return fmt.Errorf("record: --filter is empty: give a CEL expression (docs/FILTERS.md), or omit it")
			}
			var pcap string
			if dash := cmd.ArgsLenAtDash(); dash >= 0 {
				pcap, args = strings.Join(args[:dash], " "), args[dash:]
			} else {
				pcap, args = strings.Join(args, " "), nil
			}
			if err := checkExpression(pcap); err != nil {
				return fmt.Errorf("record: %w", err)
			}
			if output == "" {
				return fmt.Errorf("record: an output file is required (-o FILE)")
			}
			if cmd.Flags().Changed("groups") && strings.TrimSpace(events) == "" {
				return fmt.Errorf("record: --groups is empty: name the groups to record, or omit it for the default")
			}
			events, kspecs, err := kernel.specs(events)
			if err != nil {
				return fmt.Errorf("record: %w", err)
			}
			groups, err := event.ParseGroups(events)
			if err != nil {
				return fmt.Errorf("record: %w", err)
			}
			bufBytes, err := record.ParseBufferSize(buffer)
			if err != nil {
				return fmt.Errorf("record: --buffer: %w", err)
			}
			fill, err := wakeupFraction(wakeupFill)
			if err != nil {
				return fmt.Errorf("record: --wakeup-fill: %w", err)
			}
			if cmd.Flags().Changed("poll-interval") && (pollInterval < time.Millisecond || pollInterval > time.Minute) {
				return fmt.Errorf("record: --poll-interval %v: want between 1ms and 1m", pollInterval)
			}
			if cgroup != "" && len(args) > 0 {
				return fmt.Errorf("record: --cgroup and a command cannot be combined (the command gets a cgroup of its own)")
			}
			if duration < 0 || cmd.Flags().Changed("duration") && duration == 0 {
				return fmt.Errorf("record: --duration %v: want a positive duration (omit the flag to record until COMMAND exits or a signal)", duration)
			}
			if err := checkHooks(disable); err != nil {
				return fmt.Errorf("record: %w", err)
			}
			if noEmit && (hooksOnly || cmd.Flags().Changed("summary")) {
				return fmt.Errorf("record: --no-emit runs the programs in full: it cannot be combined with --hooks-only or --summary")
			}
			if !cmd.Flags().Changed("flush-every") {
				flushEvery = record.FlushEveryFor(rotateEvery)
			}
			if cmd.Flags().Changed("summary") {
				if summaryEvery < 100*time.Millisecond {
					return fmt.Errorf("record: --summary %v: want an interval of at least 100ms", summaryEvery)
				}
				if !cmd.Flags().Changed("groups") {
					groups = 0 // what summary mode summarizes
				}
				if !cmd.Flags().Changed("buffer") {
					bufBytes = 0 // summary mode's small default
				}
			}
			cfg := record.Config{
				Output:       output,
				Groups:       groups,
				Filters:      record.Filters{PID: pid, Cgroup: cgroup, NetNS: netns, Port: port, Pcap: pcap, CEL: celFilter},
				BufferBytes:  bufBytes,
				Duration:     duration,
				Command:      args,
				DisableHooks: disable,
				XmitAtDevice: xmitAtDevice,
				HooksOnly:    hooksOnly,
				NoEmit:       noEmit,
				WakeupFill:   fill,
				PollInterval: pollInterval,
				FlushEvery:   flushEvery,
				KernelEvents: kspecs,
				Summary:      summaryEvery,
			}
			if !cmd.Flags().Changed("summary") {
				cfg.Summary = 0
			}
			var fl **flight.Sink
			if cmd.Flags().Changed("flight") {
				if cfg.Summary > 0 || rotateEvery > 0 || rotateSize != "" || keep > 0 {
					return fmt.Errorf("record: --flight writes a file per trigger: it cannot be combined with --summary, --rotate, --rotate-size or --keep")
				}
				if fl, err = flightRecorder(&cfg, cmd.Flags().Changed("groups"), flightWindow, flightAfter, flightMemory, triggers, quiet); err != nil {
					return fmt.Errorf("record: %w", err)
				}
			} else if cmd.Flags().Changed("trigger") || cmd.Flags().Changed("flight-after") || cmd.Flags().Changed("flight-memory") {
				return fmt.Errorf("record: --trigger, --flight-after and --flight-memory need --flight")
			}
			sink, err := rotation(&cfg, rotateEvery, rotateSize, keep, onFull, quiet)
			if err != nil {
				return fmt.Errorf("record: %w", err)
			}
			// After rotation's own checks, so that a bad --rotate is
			// reported as such.
			if err := checkFlushEvery(flushEvery, rotateEvery); err != nil {
				return fmt.Errorf("record: %w", err)
			}
			if !quiet && term.IsTerminal(int(os.Stderr.Fd())) {
				cfg.Live = os.Stderr
			}
			var profile *os.File
			if cpuProfile != "" {
				// Where the recorder's own CPU goes once it records (not
				// the loading before it).
				if profile, err = outfile.Create(cpuProfile, outfile.Options{}); err != nil {
					return fmt.Errorf("record: --cpuprofile: %w", err)
				}
				defer profile.Close()
				defer pprof.StopCPUProfile()
			}
			cfg.Ready = func() {
				if profile != nil {
					if err := pprof.StartCPUProfile(profile); err != nil {
						fmt.Fprintf(os.Stderr, "magnet: warning: --cpuprofile: %v\n", err)
					}
				}
				if readyFile != "" {
					if err := outfile.WriteFile(readyFile, []byte("ready\n")); err != nil {
						fmt.Fprintf(os.Stderr, "magnet: warning: --ready-file: %v\n", err)
					}
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if fl != nil {
				// SIGUSR1 fires the flight recorder, whatever its
				// --trigger: the operator saw something.
				usr1 := make(chan os.Signal, 1)
				signal.Notify(usr1, syscall.SIGUSR1)
				defer signal.Stop(usr1)
				go func() {
					for range usr1 {
						if *fl != nil {
							(*fl).Trigger("signal")
						}
					}
				}()
			}
			record.OneProc()
			res, err := record.Run(ctx, cfg)
			if cfg.Live != nil {
				fmt.Fprint(os.Stderr, "\r\033[K")
			}
			if res != nil && !quiet {
				what := res.Output
				if fl != nil {
					what = "into memory (flight recorder)"
				}
				printSummary(res, what)
				if fl != nil && *fl != nil {
					printFlight((*fl).Files())
				}
				if sink != nil && *sink != nil {
					st := (*sink).Stats()
					fmt.Fprintf(os.Stderr, "  files:  %d started, %d finished files dropped (%d bytes)\n", st.Files, st.Dropped, st.DroppedBytes)
				}
			}
			if err != nil {
				return fmt.Errorf("record: %w", err)
			}
			if res.ExitCode != 0 {
				return &exitStatus{res.ExitCode}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&output, "output", "o", "", "trace file to write")
	evselect.RegisterRecordGroups(f, &events, "default", "event groups to record (--events is the same)")
	f.StringVar(&buffer, "buffer", "8MiB", "kernel buffers for events (an area per CPU), all CPUs together, a power of two (e.g. 8MiB, 256 KiB)")
	f.Float64Var(&wakeupFill, "wakeup-fill", 100*probe.DefaultWakeupFill, "wake the recorder when a CPU's events area is this full (per cent of its size; 0 = as soon as it holds anything, 100 = never: poll only)")
	f.DurationVar(&pollInterval, "poll-interval", 0, "read the rings at least this often, woken or not (default: the --flush-every interval)")
	f.DurationVar(&flushEvery, "flush-every", record.DefaultFlushEvery, "write the trace's buffered records out at least this often (what a crash can lose; longer costs the recorder less; with --rotate, by default a fifth of its interval if that is less)")
	f.DurationVarP(&duration, "duration", "d", 0, "stop after this long (e.g. 30s)")
	f.IntVar(&pid, "pid", 0, "record only sockets of this process")
	f.StringVar(&cgroup, "cgroup", "", "record only sockets and tasks of this cgroup2 (path) and its descendants")
	f.StringVar(&netns, "netns", "", "record only this network namespace (name under /run/netns, or a path)")
	f.IntVar(&port, "port", 0, "record only connections with this local or remote port")
	f.BoolVarP(&quiet, "quiet", "q", false, "no live status line and no summary")
	f.StringVar(&readyFile, "ready-file", "", "write this file once the probes are attached (for scripts and tests)")
	f.DurationVar(&rotateEvery, "rotate", 0, "start a new file this often (e.g. 1h); -o is then a pattern, see below")
	f.StringVar(&rotateSize, "rotate-size", "", "start a new file before one grows past this size (e.g. 1GiB)")
	f.IntVar(&keep, "keep", 0, "with rotation: keep this many finished files, deleting the oldest (0 = all)")
	f.StringVar(&onFull, "on-disk-full", "stop", "with rotation: stop (end the current file properly) or drop (delete the oldest finished files and go on)")
	f.DurationVar(&summaryEvery, "summary", time.Second, "summary mode (off unless given): instead of events, write each connection's figures (bytes and segments read from its TCP socket, retransmissions, drops, srtt and cwnd sampled at each read; ip and dev per packet if given to --groups) every interval as conn_summary records (--summary or --summary=5s)")
	f.Lookup("summary").NoOptDefVal = "1s"
	f.DurationVar(&flightWindow, "flight", 30*time.Second, "flight recorder (off unless given): keep the last this long of events in memory and write nothing until a trigger (--trigger, SIGUSR1); then write -o's stem-<time>.mgt with that much before it")
	f.DurationVar(&flightAfter, "flight-after", 2*time.Second, "flight recorder: go on writing this long after the last trigger of a file")
	f.StringVar(&flightMemory, "flight-memory", "256MiB", "flight recorder: memory for the kept events, taken (and resident) from the start so that keeping them takes no page fault (the window falls short past it, and the files say so)")
	f.StringVar(&triggers, "trigger", "", "flight recorder: what writes a file, comma-separated: retrans (a retransmission), drop (a drop that loses data: not a teardown's or a duplicate's, as report tells them apart), rtt>DURATION (a smoothed RTT above it); SIGUSR1 always does")
	kernel.add(f)
	f.StringVar(&celFilter, "filter", "", "write only the events for which this CEL expression over the event's fields is true, as the readers' --filter selects them (docs/FILTERS.md); connection, task and loss records are always written")
	f.BoolVar(&xmitAtDevice, "xmit-at-device", false, "read tcp_xmit where each skb TCP sent reaches its device (net_dev_queue) instead of at IP egress: one program run fewer per packet sent, but segments that never reach a device have none, and TCP's own counts (nstat) can exceed the trace's (docs/EVENTS.md)")
	// Benchmarks only (magnet bench's record-floor): what the hooks cost
	// with nothing behind them.
	f.BoolVar(&hooksOnly, "hooks-only", false, "attach the programs of the chosen groups but record no event: every run returns at its first check (the benchmark's floor)")
	_ = f.MarkHidden("hooks-only")
	// Benchmarks only (magnet bench's record-noemit): what the programs
	// cost doing all their work, without the records.
	f.BoolVar(&noEmit, "no-emit", false, "run every program of the chosen groups in full but write no event (connections' openings and closes only): the benchmark's bodies without records")
	_ = f.MarkHidden("no-emit")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a Go CPU profile of the recorder, from when it is ready to its end, to this file (go tool pprof)")
	_ = f.MarkHidden("cpuprofile")
	f.StringSliceVar(&disable, "disable-hook", nil, "do not load these BPF programs (their names as magnet status --json lists them, or learn_tcp and learn_udp, which learn the sockets that exist at start), as if the kernel lacked them")
	return cmd
}

// checkExpression parses the pcap-filter expression and compiles it, so
// that a bad one is refused before anything loads. A command given
// without "--" reads as an expression: when it does not parse and its
// first word is a program, the error says where the command goes.
func checkExpression(s string) error {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	e, err := pcapfilter.Parse(s)
	if err != nil {
		first, _, _ := strings.Cut(strings.TrimSpace(s), " ")
		if _, lerr := exec.LookPath(first); lerr == nil {
			return fmt.Errorf("unexpected argument %q (put the command to record after --): %w", first, err)
		}
		return err
	}
	if _, err := e.Compile(); err != nil {
		return fmt.Errorf("%w: %q %v: record a wider selection and give the expression when reading (magnet parse FILE '%s')", pcapfilter.ErrSyntax, s, err, s)
	}
	return nil
}

// checkHooks refuses a --disable-hook name that is no program's: it would
// disable nothing.
func checkHooks(names []string) error {
	for _, n := range names {
		if !slices.ContainsFunc(probe.Hooks, func(h probe.Hook) bool { return h.Program == n }) && !slices.Contains(probe.LearnPrograms, n) {
			var valid []string
			for _, h := range probe.Hooks {
				valid = append(valid, h.Program)
			}
			valid = append(valid, probe.LearnPrograms...)
			return fmt.Errorf("--disable-hook %q: no such program (valid: %s)", n, strings.Join(valid, ", "))
		}
	}
	return nil
}

// rotation sets cfg up to write a chain of files when any rotation flag is
// given or the output is a pattern. It returns where the sink will be.
func rotation(cfg *record.Config, every time.Duration, size string, keep int, onFull string, quiet bool) (**rotate.Sink, error) {
	if every == 0 && size == "" && keep == 0 && !strings.Contains(cfg.Output, "%") {
		return nil, nil
	}
	if every < 0 || keep < 0 {
		return nil, fmt.Errorf("--rotate and --keep must be positive")
	}
	if every > 0 && every < time.Second {
		return nil, fmt.Errorf("--rotate %s: want at least 1s", every)
	}
	var maxBytes int64
	if size != "" {
		n, err := bytesize.Parse(size)
		if err != nil {
			return nil, fmt.Errorf("--rotate-size: %w", err)
		}
		if n < 1<<20 {
			return nil, fmt.Errorf("--rotate-size %s: want at least 1MiB", size)
		}
		maxBytes = n
	}
	if onFull != "stop" && onFull != "drop" {
		return nil, fmt.Errorf("--on-disk-full %q: want stop or drop", onFull)
	}
	host, _ := os.Hostname()
	pat, err := rotate.ParsePattern(cfg.Output, host)
	if err != nil {
		return nil, err
	}
	if keep > 0 && every == 0 && maxBytes == 0 {
		return nil, fmt.Errorf("--keep needs --rotate or --rotate-size")
	}
	logf := func(format string, args ...any) {
		if !quiet {
			fmt.Fprintf(os.Stderr, "\r\033[Kmagnet: "+format+"\n", args...)
		}
	}
	sink := new(*rotate.Sink)
	cfg.NewSink = func(h *trace.Header) (record.Sink, error) {
		s, err := rotate.New(h, rotate.Options{Pattern: pat, Interval: every, MaxBytes: maxBytes, Keep: keep, DropOnFull: onFull == "drop", Log: logf})
		*sink = s
		return s, err
	}
	return sink, nil
}

// flightRecorder sets cfg up to keep the recording in memory and write a
// file per trigger. It returns where the sink will be.
func flightRecorder(cfg *record.Config, eventsSet bool, window, after time.Duration, memory, trig string, quiet bool) (**flight.Sink, error) {
	if window < time.Second {
		return nil, fmt.Errorf("--flight %v: want a window of at least 1s", window)
	}
	if after < 0 {
		return nil, fmt.Errorf("--flight-after %v: want a duration of 0 or more", after)
	}
	mem, err := bytesize.Parse(memory)
	if err != nil {
		return nil, fmt.Errorf("--flight-memory: %w", err)
	}
	tr, err := flight.ParseTriggers(trig)
	if err != nil {
		return nil, fmt.Errorf("--trigger: %w", err)
	}
	if strings.Contains(cfg.Output, "%") {
		return nil, fmt.Errorf("--flight names its files after -o (x.mgt: x-<time>.mgt); -o %q is a pattern", cfg.Output)
	}
	// The triggers' events must be recorded for them to fire.
	if need := tr.Groups(); cfg.Groups&need != need {
		if eventsSet {
			return nil, fmt.Errorf("--trigger %s needs the %s events: add them to --groups", tr, need&^cfg.Groups)
		}
		cfg.Groups |= need
	}
	logf := func(format string, args ...any) {
		if !quiet {
			fmt.Fprintf(os.Stderr, "\r\033[Kmagnet: "+format+"\n", args...)
		}
	}
	sink := new(*flight.Sink)
	cfg.NewSink = func(h *trace.Header) (record.Sink, error) {
		s, err := flight.New(h, flight.Options{Output: cfg.Output, Window: window, After: after, Memory: mem, Triggers: tr, Log: logf})
		*sink = s
		return s, err
	}
	return sink, nil
}

func printFlight(files []string) {
	if len(files) == 0 {
		fmt.Fprintln(os.Stderr, "  flight: no trigger fired: nothing written")
		return
	}
	fmt.Fprintf(os.Stderr, "  flight: %d file(s): %s\n", len(files), strings.Join(files, ", "))
}

// exitStatus passes the recorded command's exit code on as magnet's.
type exitStatus struct{ code int }

func (e *exitStatus) Error() string { return fmt.Sprintf("command exited with status %d", e.code) }
func (e *exitStatus) ExitCode() int { return e.code }
func (e *exitStatus) Silent() bool  { return true }

func printSummary(res *record.Result, what string) {
	fmt.Fprintf(os.Stderr, "magnet: recorded %s\n", what)
	var parts []string
	var total uint64
	for _, name := range record.SortedCounts(res.Events) {
		if name == "task" || name == "iface" {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %d", name, res.Events[name]))
		if name != "lost" {
			total += res.Events[name]
		}
	}
	fmt.Fprintf(os.Stderr, "  events: %d (%s)\n", total, strings.Join(parts, ", "))
	if res.Unwritten > 0 {
		fmt.Fprintf(os.Stderr, "  lost:   %d (%d never reached the file: writing it failed; %d in the kernel)\n", res.Unwritten+res.Lost, res.Unwritten, res.Lost)
	} else if res.Lost > 0 {
		var lp []string
		for _, name := range record.SortedCounts(res.LostBy) {
			lp = append(lp, fmt.Sprintf("%s %d", name, res.LostBy[name]))
		}
		fmt.Fprintf(os.Stderr, "  lost:   %d (%s); a bigger --buffer or fewer --groups helps\n", res.Lost, strings.Join(lp, ", "))
	} else {
		fmt.Fprintf(os.Stderr, "  lost:   0\n")
	}
	if res.Filtered > 0 {
		var fp []string
		for _, name := range record.SortedCounts(res.FilteredBy) {
			fp = append(fp, fmt.Sprintf("%s %d", name, res.FilteredBy[name]))
		}
		fmt.Fprintf(os.Stderr, "  filtered: %d left out by --filter (%s)\n", res.Filtered, strings.Join(fp, ", "))
	}
	if res.Missed > 0 {
		var mp []string
		for _, name := range record.SortedCounts(res.MissedBy) {
			mp = append(mp, fmt.Sprintf("%s %d", name, res.MissedBy[name]))
		}
		fmt.Fprintf(os.Stderr, "  missed: %d runs the kernel skipped, their events missing (%s): another run of the program was under way on that CPU\n", res.Missed, strings.Join(mp, ", "))
	} else {
		fmt.Fprintf(os.Stderr, "  missed: 0\n")
	}
	if l := res.Learned; l.Err != "" {
		fmt.Fprintf(os.Stderr, "  learned: none of the sockets that existed at start (%s): each is met at its next event at a hook that has its socket\n", l.Err)
	} else {
		fmt.Fprintf(os.Stderr, "  learned: %d sockets that existed at start, in %d network namespaces: %d announced, %d met by the hooks first, %d with their owner (%s after loading; the walk of /proc for owners %s, while loading)\n",
			l.Sockets, l.NetNS, l.Announced, l.Known, l.Owned, l.Took.Round(time.Millisecond), l.WalkTook.Round(time.Millisecond))
	}
	if len(res.Unrecorded) > 0 {
		var up []string
		for _, name := range record.SortedCounts(res.Unrecorded) {
			up = append(up, fmt.Sprintf("%s %d", name, res.Unrecorded[name]))
		}
		fmt.Fprintf(os.Stderr, "  unrecorded packets: %s (seen by the device and drop programs, no event made: filtered, or no connection)\n", strings.Join(up, ", "))
	}
	if ks := res.KernelSkipped; ks != nil {
		for i, l := range ks.Lines() {
			if i == 0 {
				l = "kernel skipped: " + l
			}
			fmt.Fprintf(os.Stderr, "  %s\n", l)
		}
	} else if res.KernelSkippedErr != "" {
		fmt.Fprintf(os.Stderr, "  kernel skipped: not checked (%s)\n", res.KernelSkippedErr)
	}
	fmt.Fprintf(os.Stderr, "  file:   %d bytes", res.Bytes)
	if total > 0 {
		fmt.Fprintf(os.Stderr, " (%.1f bytes/event)", float64(res.Bytes)/float64(total))
	}
	fmt.Fprintln(os.Stderr)
	fmt.Fprintf(os.Stderr, "  CPU:    %s getting ready, %s recording", res.CPU.Setup.Round(time.Millisecond), res.CPU.Record.Round(100*time.Microsecond))
	if total > 0 {
		fmt.Fprintf(os.Stderr, " (%.1f ns per event)", res.CPU.PerEvent(total))
	}
	fmt.Fprintln(os.Stderr)
	served := probe.ServedBy(res.Hooks)
	for _, h := range res.Hooks {
		if h.Attached || h.Reason == "not enabled" {
			continue
		}
		var lost, fallback []string
		for _, ev := range h.Events {
			if by := served[ev]; by != "" {
				fallback = append(fallback, ev+" from "+by)
			} else {
				lost = append(lost, ev)
			}
		}
		fmt.Fprintf(os.Stderr, "  hook %s/%s unavailable: %s\n", h.Kind, h.Target, h.Reason)
		if len(lost) > 0 {
			fmt.Fprintf(os.Stderr, "    not recorded: %s\n", strings.Join(lost, ", "))
		}
		if len(fallback) > 0 {
			fmt.Fprintf(os.Stderr, "    instead: %s\n", strings.Join(fallback, ", "))
		}
	}
	if res.Truncated {
		fmt.Fprintln(os.Stderr, "  the trace was cut short; it is readable up to its last complete block")
	}
}

// checkFlushEvery refuses a --flush-every that is not a sensible interval:
// under 1 ms the recorder would do little but flush, over a minute a crash
// loses that much and the file lags as far; longer than --rotate, files
// would start late (rotation happens at a flush).
func checkFlushEvery(d, rotateEvery time.Duration) error {
	if d < time.Millisecond || d > time.Minute {
		return fmt.Errorf("--flush-every %v: want between 1ms and 1m", d)
	}
	if rotateEvery > 0 && d > rotateEvery {
		return fmt.Errorf("--flush-every %v: longer than --rotate %v (files would start late)", d, rotateEvery)
	}
	return nil
}

// wakeupFraction turns --wakeup-fill's per cent into record.Config's
// fraction: 0 per cent is "as soon as the ring holds anything", a fill
// below any record.
func wakeupFraction(percent float64) (float64, error) {
	if percent < 0 || percent > 100 || percent != percent {
		return 0, fmt.Errorf("%g: want a per cent between 0 and 100", percent)
	}
	if percent == 0 {
		return 1e-12, nil
	}
	return percent / 100, nil
}
