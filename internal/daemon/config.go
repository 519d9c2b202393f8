// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/magnet-tracer/magnet/internal/bytesize"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/flight"
	"github.com/magnet-tracer/magnet/internal/kevent"
	"github.com/magnet-tracer/magnet/internal/live"
	"github.com/magnet-tracer/magnet/internal/record"
)

// Config is the daemon's configuration: the YAML file's keys
// (docs/DAEMON.md#configuration), overridden by command-line flags.
type Config struct {
	Socket     string `yaml:"socket"`
	SocketMode string `yaml:"socket_mode"`
	Listen     string `yaml:"listen"`
	TokenFile  string `yaml:"token_file"`
	Buffer     string `yaml:"buffer"`
	// Filter restricts the whole daemon in the kernel, as magnet record's
	// flags do: what it leaves out is never recorded, for anyone.
	Filter struct {
		Cgroup string `yaml:"cgroup"`
		NetNS  string `yaml:"netns"`
		Port   int    `yaml:"port"`
	} `yaml:"filter"`
	Events struct {
		Available Groups `yaml:"available"`
		Baseline  Groups `yaml:"baseline"`
	} `yaml:"events"`
	// KernelEvents are kernel events chosen when the daemon starts, as
	// magnet record's --tracepoint, --uprobe, --usdt and the irq and napi
	// groups; their streams show their fields. Only root and the see-all
	// groups see them (they carry no connection).
	KernelEvents struct {
		Groups      Groups   `yaml:"groups"` // irq, napi
		Tracepoints []string `yaml:"tracepoints"`
		Uprobes     []string `yaml:"uprobes"`
		USDT        []string `yaml:"usdt"`
	} `yaml:"kernel_events"`
	Access struct {
		SeeAllGroups []string `yaml:"see_all_groups"`
		// UserGroups are the groups beyond the baseline that any user may
		// switch on by subscribing; the others cost every connection on the
		// host and need a see-all client.
		UserGroups Groups `yaml:"user_groups"`
	} `yaml:"access"`
	Subscribers struct {
		Max      int `yaml:"max"`
		PerUser  int `yaml:"per_user"`
		Queue    int `yaml:"queue"`
		MaxQueue int `yaml:"max_queue"`
	} `yaml:"subscribers"`
	Connections struct {
		Max          int           `yaml:"max"`
		Grace        time.Duration `yaml:"grace"`
		WindowEvents int           `yaml:"window_events"`
		Window       time.Duration `yaml:"window"`
		Bucket       time.Duration `yaml:"bucket"`
		History      time.Duration `yaml:"history"`
	} `yaml:"connections"`
	Metrics MetricsConfig `yaml:"metrics"`
	// Flight runs a flight recorder beside the streams (docs/DAEMON.md):
	// what the daemon records kept in memory for Window and written to a
	// file on a trigger (Triggers, SIGUSR1, POST /v1/flight/trigger).
	Flight FlightConfig `yaml:"flight"`
	// Summary, if set, records in summary mode (docs/DAEMON.md): the
	// programs add to per-connection figures in the kernel, read every
	// Summary as conn_summary records, which feed the connection table and
	// the streams instead of the summarized groups' events.
	Summary time.Duration `yaml:"summary"`
}

// FlightConfig configures the daemon's flight recorder, as magnet record's
// --flight, --flight-after, --flight-memory and --trigger.
type FlightConfig struct {
	Window   time.Duration `yaml:"window"` // 0 = no flight recorder
	After    time.Duration `yaml:"after"`
	Output   string        `yaml:"output"` // x.mgt: x-<time>.mgt per trigger
	Triggers string        `yaml:"triggers"`
	Memory   string        `yaml:"memory"`
}

// Groups is a list of event groups as --events takes it: "sock,tcp" in a
// flag, either that or a YAML list in the file.
type Groups string

// UnmarshalYAML takes a string or a list of strings.
func (g *Groups) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*g = Groups(n.Value)
		return nil
	case yaml.SequenceNode:
		var list []string
		if err := n.Decode(&list); err != nil {
			return err
		}
		*g = Groups(strings.Join(list, ","))
		return nil
	}
	return fmt.Errorf("line %d: want event groups as a list or a comma-separated string", n.Line)
}

// DefaultSocket is where the daemon listens unless configured otherwise.
const DefaultSocket = "/run/magnet.sock"

// BaselineGroups are enabled unless configured otherwise: what the
// per-connection figures are computed from.
const BaselineGroups = event.GroupSock | event.GroupTCP | event.GroupTCPState | event.GroupDev | event.GroupDrop | event.GroupConn

// DefaultUserGroups are the groups beyond the baseline any user may
// enable: the per-ACK delivery-rate samples, which magnet top and the page
// ask for. sched, headers, ip, tcpsend and acks cost every packet or every
// context switch on the host; they need a see-all client unless the
// configuration lists them.
const DefaultUserGroups = event.GroupRate

// DefaultConfig returns the configuration without a file.
func DefaultConfig() Config {
	var c Config
	c.Socket = DefaultSocket
	c.SocketMode = "0666"
	c.Buffer = "8MiB"
	c.Events.Available = "all"
	c.Events.Baseline = Groups(BaselineGroups.String())
	c.Access.SeeAllGroups = []string{}
	c.Access.UserGroups = Groups(DefaultUserGroups.String())
	c.KernelEvents.Tracepoints, c.KernelEvents.Uprobes, c.KernelEvents.USDT = []string{}, []string{}, []string{}
	c.Subscribers.Max = 256
	c.Subscribers.PerUser = 16
	c.Subscribers.Queue = 4096
	c.Subscribers.MaxQueue = 65536
	lc := live.DefaultConfig
	c.Connections.Max = lc.MaxConns
	c.Connections.Grace = lc.Grace
	c.Connections.WindowEvents = lc.WindowEvents
	c.Connections.Window = lc.Window
	c.Connections.Bucket = lc.Bucket
	c.Connections.History = lc.History
	c.Metrics = DefaultMetricsConfig()
	c.Flight = FlightConfig{After: 2 * time.Second, Output: DefaultFlightOutput, Memory: "256MiB"}
	return c
}

// DefaultFlightOutput names the flight recorder's files.
const DefaultFlightOutput = "/var/lib/magnet/flight/flight.mgt"

// LoadConfig reads a YAML file over the defaults. Unknown keys are errors.
func LoadConfig(path string) (Config, error) {
	c := DefaultConfig()
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return c, fmt.Errorf("config %s: %s", path, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return c, nil
}

// settings is a checked Config, with names resolved.
type settings struct {
	Config
	mode       os.FileMode
	listen     string // host:port, host defaulted to loopback
	token      string
	bufBytes   int
	available  event.Group
	baseline   event.Group
	seeAllGIDs []uint32
	userGroups event.Group // what a client that does not see all may enable
	live       live.Config
	kernel     []kevent.Spec
	kernelKey  string          // what was asked for, to tell a reload that changes it
	flight     *flight.Options // nil: no flight recorder
}

// resolve checks c and resolves what it names (groups, files).
func (c Config) resolve() (*settings, error) {
	s := &settings{Config: c}
	if c.Socket == "" {
		return nil, errors.New("config: socket: a path is required")
	}
	mode, err := strconv.ParseUint(c.SocketMode, 8, 32)
	if err != nil || mode > 0o777 {
		return nil, fmt.Errorf("config: socket_mode %q: want an octal mode such as 0666", c.SocketMode)
	}
	s.mode = os.FileMode(mode)
	if c.Listen != "" {
		host, port, err := net.SplitHostPort(c.Listen)
		if err != nil {
			return nil, fmt.Errorf("config: listen %q: want HOST:PORT or :PORT", c.Listen)
		}
		if host == "" {
			host = "127.0.0.1" // loopback unless told otherwise
		}
		s.listen = net.JoinHostPort(host, port)
		if c.TokenFile == "" {
			return nil, errors.New("config: the TCP listener (listen, --listen) needs a bearer token: give token_file (--token-file)")
		}
	}
	if c.TokenFile != "" {
		if s.token, err = readToken(c.TokenFile); err != nil {
			return nil, err
		}
	}
	if s.bufBytes, err = record.ParseBufferSize(c.Buffer); err != nil {
		return nil, fmt.Errorf("config: buffer: %w", err)
	}
	// An empty list would read as record's default groups: a daemon told
	// "nothing" would load and enable what it was not asked for.
	if strings.TrimSpace(string(c.Events.Available)) == "" {
		return nil, errors.New("config: events.available is empty: name the groups to load, or leave it out for all")
	}
	if strings.TrimSpace(string(c.Events.Baseline)) == "" {
		return nil, fmt.Errorf("config: events.baseline is empty: name the groups always enabled, or leave it out for %s", BaselineGroups)
	}
	if s.available, err = event.ParseGroups(string(c.Events.Available)); err != nil {
		return nil, fmt.Errorf("config: events.available: %w", err)
	}
	if s.baseline, err = event.ParseGroups(string(c.Events.Baseline)); err != nil {
		return nil, fmt.Errorf("config: events.baseline: %w", err)
	}
	if s.kernel, s.kernelKey, err = c.kernelSpecs(); err != nil {
		return nil, err
	}
	if s.flight, err = c.Flight.options(); err != nil {
		return nil, err
	}
	if err := s.summaryMode(); err != nil {
		return nil, err
	}
	if s.flight != nil {
		// The triggers' events are recorded whatever the subscriptions.
		need := s.flight.Triggers.Groups()
		if need&^s.available != 0 {
			return nil, fmt.Errorf("config: flight.triggers %s needs %s, which events.available does not load", s.flight.Triggers, need&^s.available)
		}
		s.baseline |= need
	}
	if extra := s.baseline &^ s.available; extra != 0 {
		return nil, fmt.Errorf("config: events.baseline has %s, which events.available does not load", extra)
	}
	if strings.TrimSpace(string(c.Access.UserGroups)) != "" { // ParseGroups takes "" as the default set
		if s.userGroups, err = event.ParseGroups(string(c.Access.UserGroups)); err != nil {
			return nil, fmt.Errorf("config: access.user_groups: %w", err)
		}
	}
	s.userGroups |= s.baseline | event.GroupConn
	for _, name := range c.Access.SeeAllGroups {
		g, err := user.LookupGroup(name)
		if err != nil {
			return nil, fmt.Errorf("config: access.see_all_groups: %w", err)
		}
		gid, _ := strconv.ParseUint(g.Gid, 10, 32)
		s.seeAllGIDs = append(s.seeAllGIDs, uint32(gid))
	}
	if c.Filter.Port < 0 || c.Filter.Port > 65535 {
		return nil, fmt.Errorf("config: filter.port %d: want 1-65535", c.Filter.Port)
	}
	if err := c.Metrics.check(); err != nil {
		return nil, err
	}
	sub := c.Subscribers
	if sub.Max < 1 || sub.Queue < 1 || sub.MaxQueue < sub.Queue || sub.MaxQueue > 1<<22 {
		return nil, fmt.Errorf("config: subscribers: want max ≥ 1, 1 ≤ queue ≤ max_queue ≤ %d", 1<<22)
	}
	if sub.PerUser < 1 {
		return nil, fmt.Errorf("config: subscribers.per_user %d: want at least 1", sub.PerUser)
	}
	cc := c.Connections
	s.live = live.Config{MaxConns: cc.Max, Grace: cc.Grace, WindowEvents: cc.WindowEvents, Window: cc.Window, Bucket: cc.Bucket, History: cc.History}
	if err := s.live.Check(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return s, nil
}

// Check says what is wrong with c, as the daemon would at start.
func (c Config) Check() error {
	_, err := c.resolve()
	return err
}

// readToken reads the bearer token: the file's first line.
func readToken(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("config: token_file: %w", err)
	}
	tok, _, _ := strings.Cut(string(data), "\n")
	tok = strings.TrimSpace(tok)
	if len(tok) < 16 {
		return "", fmt.Errorf("config: token_file %s: the token must be at least 16 bytes", path)
	}
	return tok, nil
}

// restartOnly lists what a reload cannot change, by comparing old and new.
// kernelSpecs resolves kernel_events.
func (c Config) kernelSpecs() ([]kevent.Spec, string, error) {
	var specs []kevent.Spec
	if g := strings.TrimSpace(string(c.KernelEvents.Groups)); g != "" {
		rest, gs, _, err := kevent.SplitGroups(g)
		if err != nil {
			return nil, "", fmt.Errorf("config: kernel_events.groups: %w", err)
		}
		if rest != "conn" {
			return nil, "", fmt.Errorf("config: kernel_events.groups %q: want irq, napi", g)
		}
		specs = append(specs, gs...)
	}
	for _, list := range []struct {
		key   string
		vals  []string
		parse func(string) (kevent.Spec, error)
	}{
		{"tracepoints", c.KernelEvents.Tracepoints, kevent.ParseTracepoint},
		{"uprobes", c.KernelEvents.Uprobes, kevent.ParseUprobe},
		{"usdt", c.KernelEvents.USDT, kevent.ParseUSDT},
	} {
		for _, v := range list.vals {
			sp, err := list.parse(v)
			if err != nil {
				return nil, "", fmt.Errorf("config: kernel_events.%s: %w", list.key, err)
			}
			specs = append(specs, sp)
		}
	}
	var key []string
	for _, sp := range specs {
		key = append(key, sp.String())
	}
	return specs, strings.Join(key, "\n"), nil
}

func restartOnly(old, cur *settings) []string {
	var out []string
	if old.Socket != cur.Socket || old.mode != cur.mode {
		out = append(out, "socket")
	}
	if old.listen != cur.listen {
		out = append(out, "listen")
	}
	if old.bufBytes != cur.bufBytes {
		out = append(out, "buffer")
	}
	if old.available != cur.available {
		out = append(out, "events.available")
	}
	if old.kernelKey != cur.kernelKey {
		out = append(out, "kernel_events")
	}
	if old.Filter != cur.Filter {
		out = append(out, "filter")
	}
	if old.live.Bucket != cur.live.Bucket || old.live.History != cur.live.History {
		out = append(out, "connections.bucket/history")
	}
	if old.Flight != cur.Flight {
		out = append(out, "flight")
	}
	if old.Summary != cur.Summary {
		out = append(out, "summary")
	}
	return out
}

// summaryMode checks summary and, when set, makes the summarized groups
// both what is loaded and the baseline: a connection's summary counts
// every layer only if every layer's hooks run, whatever the subscriptions
// ask for.
func (s *settings) summaryMode() error {
	if s.Summary == 0 {
		return nil
	}
	if s.Summary < 100*time.Millisecond {
		return fmt.Errorf("config: summary %s: want an interval of at least 100ms (0: off)", s.Summary)
	}
	if missing := record.DefaultSummaryGroups &^ s.available; missing != 0 {
		return fmt.Errorf("config: summary needs %s, which events.available does not load", missing)
	}
	if len(s.kernel) > 0 {
		return errors.New("config: summary mode records no kernel events: leave kernel_events empty")
	}
	if s.flight != nil {
		return errors.New("config: flight and summary: a flight recorder keeps events, summary mode records none; use one")
	}
	// The summary group is the recorder's conn_summary records (BPF
	// tests no bit for it): in the baseline, so streams may ask for them.
	s.available = record.DefaultSummaryGroups | event.GroupSummary
	s.baseline = s.available
	return nil
}

// options checks the flight section; nil without a window.
func (f FlightConfig) options() (*flight.Options, error) {
	if f.Window == 0 {
		return nil, nil
	}
	if f.Window < time.Second {
		return nil, fmt.Errorf("config: flight.window %s: want at least 1s (0: no flight recorder)", f.Window)
	}
	if f.After < 0 {
		return nil, fmt.Errorf("config: flight.after %s: want 0 or more", f.After)
	}
	tr, err := flight.ParseTriggers(f.Triggers)
	if err != nil {
		return nil, fmt.Errorf("config: flight.triggers: %w", err)
	}
	mem, err := bytesize.Parse(f.Memory)
	if err != nil || mem < flight.MinMemory {
		return nil, fmt.Errorf("config: flight.memory %q: want a size of at least %d bytes", f.Memory, flight.MinMemory)
	}
	if f.Output == "" || strings.Contains(f.Output, "%") {
		return nil, fmt.Errorf("config: flight.output %q: want a file name (x.mgt gives x-<time>.mgt)", f.Output)
	}
	if fi, err := os.Stat(filepath.Dir(f.Output)); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("config: flight.output %s: its directory must exist", f.Output)
	}
	return &flight.Options{Output: f.Output, Window: f.Window, After: f.After, Memory: mem, Triggers: tr}, nil
}
