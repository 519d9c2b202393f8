// SPDX-License-Identifier: Apache-2.0

// Package collect is the always-on collection service: it records with
// rotation into a local spool, ships every finished file (zstd-compressed,
// verified) to one or more archives, deletes it locally only once every
// archive has confirmed it, and keeps the spool within a disk budget.
// docs/COLLECT.md describes the configuration and the guarantees.
package collect

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/magnet-tracer/magnet/internal/bytesize"
	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/export"
	"github.com/magnet-tracer/magnet/internal/flight"
	"github.com/magnet-tracer/magnet/internal/pcapfilter"
	"github.com/magnet-tracer/magnet/internal/rotate"
)

// Config is the collect service's configuration (collect.yaml). Every key
// is documented in docs/COLLECT.md.
type Config struct {
	Host    string       `yaml:"host"`
	Spool   string       `yaml:"spool"`
	Pattern string       `yaml:"pattern"`
	Rotate  RotateConfig `yaml:"rotate"`
	Events  string       `yaml:"events"`
	// Summary, if set, records in summary mode: per-connection figures
	// every Summary instead of events (record --summary).
	Summary time.Duration `yaml:"summary"`
	// Flight, with a window, records as magnet record --flight does: the
	// events stay in memory and a trigger writes a file into the spool.
	Flight     FlightConfig  `yaml:"flight"`
	Filters    Filters       `yaml:"filters"`
	Buffer     string        `yaml:"buffer"`
	DiskBudget string        `yaml:"disk_budget"`
	Compress   *bool         `yaml:"compress"`
	Ship       ShipConfig    `yaml:"ship"`
	Targets    []Target      `yaml:"targets"`
	Metrics    MetricsConfig `yaml:"metrics"`
	Dataset    DatasetConfig `yaml:"dataset"`

	// Parsed from the text fields by Load.
	budget    int64
	rotateMax int64
	groups    event.Group
	buffer    int
	flight    *flight.Options // nil: no flight recorder
}

// FlightConfig configures the flight recorder (docs/COLLECT.md): nothing
// is written until a trigger, then one file in the spool, named by the
// pattern, holding the Window before it and After past its last trigger.
type FlightConfig struct {
	Window   time.Duration  `yaml:"window"`
	After    *time.Duration `yaml:"after"` // nil: 2s
	Triggers string         `yaml:"triggers"`
	Memory   string         `yaml:"memory"` // "": flight.DefaultMemory
}

// DatasetConfig, when Dir is set, has the shipper add each finished trace
// file to a Hive-partitioned Parquet dataset under Dir, as `magnet export
// --dataset DIR --partition ...` would, before it ships the file.
type DatasetConfig struct {
	Dir       string   `yaml:"dir"`
	Partition []string `yaml:"partition"` // default host, date
}

// RotateConfig says when a new file starts.
type RotateConfig struct {
	Interval time.Duration `yaml:"interval"`
	Size     string        `yaml:"size"`
}

// Filters select what is recorded, as magnet record's flags do.
type Filters struct {
	PID    int    `yaml:"pid"`
	Cgroup string `yaml:"cgroup"`
	NetNS  string `yaml:"netns"`
	Port   int    `yaml:"port"`
	Pcap   string `yaml:"pcap"` // a pcap-filter expression, as magnet record takes it
}

// ShipConfig tunes the shipper.
type ShipConfig struct {
	Interval     time.Duration `yaml:"interval"`
	RetryInitial time.Duration `yaml:"retry_initial"`
	RetryMax     time.Duration `yaml:"retry_max"`
	Timeout      time.Duration `yaml:"timeout"`
	// Stall is how long one shipment may run before it is logged as
	// stalled (and the target's stalled metric set).
	Stall time.Duration `yaml:"stall"`
}

// MetricsConfig says where the shipper's Prometheus metrics go.
type MetricsConfig struct {
	// Listen is an address to serve /metrics on ("" = none).
	Listen string `yaml:"listen"`
	// Textfile is a file rewritten every 5 seconds for node_exporter's
	// textfile collector ("" = none).
	Textfile string `yaml:"textfile"`
}

// Target is one archive: type dir, ssh or s3, with the keys of its type.
type Target struct {
	Name string `yaml:"name"`
	Type string `yaml:"type"`
	// Timeout bounds one shipment to this target (default ship.timeout).
	Timeout time.Duration `yaml:"timeout"`
	// dir and ssh: the archive's root directory.
	Path string `yaml:"path"`
	// ssh
	SSHHost      string   `yaml:"host"`
	User         string   `yaml:"user"`
	Port         int      `yaml:"port"`
	IdentityFile string   `yaml:"identity_file"`
	KnownHosts   string   `yaml:"known_hosts"`
	SSHOptions   []string `yaml:"ssh_options"`
	// s3
	Endpoint     string `yaml:"endpoint"`
	Bucket       string `yaml:"bucket"`
	Prefix       string `yaml:"prefix"`
	Region       string `yaml:"region"`
	AccessKey    string `yaml:"access_key"`
	SecretKey    string `yaml:"secret_key"`
	AccessKeyEnv string `yaml:"access_key_env"`
	SecretKeyEnv string `yaml:"secret_key_env"`
}

// Defaults.
const (
	DefaultSpool   = "/var/lib/magnet/spool"
	DefaultPattern = "%H-%Y%m%dT%H%M%S.mgt"
)

// Load reads and checks a configuration file. Unknown keys are errors, so
// that a typo does not silently leave a default in place.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(data)
}

// fillFlight checks the flight recorder's keys; the triggers' groups join
// the default events, and must be among events that are given.
func (c *Config) fillFlight() error {
	f := c.Flight
	if f.Window == 0 {
		if f.After != nil || f.Triggers != "" || f.Memory != "" {
			return errors.New("flight.after, flight.triggers and flight.memory need flight.window")
		}
		return nil
	}
	if f.Window < time.Second {
		return fmt.Errorf("flight.window %s: want at least 1s (0: no flight recorder)", f.Window)
	}
	if c.Summary > 0 {
		return errors.New("flight and summary: a flight recorder keeps events, summary mode records none; use one")
	}
	o := &flight.Options{Window: f.Window, After: 2 * time.Second, Memory: flight.DefaultMemory}
	if f.After != nil {
		if *f.After < 0 {
			return fmt.Errorf("flight.after %s: want 0 or more", *f.After)
		}
		o.After = *f.After
	}
	if f.Memory != "" {
		n, err := bytesize.Parse(f.Memory)
		if err != nil || n < flight.MinMemory {
			return fmt.Errorf("flight.memory %q: want a size of at least %d bytes", f.Memory, flight.MinMemory)
		}
		o.Memory = n
	}
	var err error
	if o.Triggers, err = flight.ParseTriggers(f.Triggers); err != nil {
		return fmt.Errorf("flight.triggers: %w", err)
	}
	if need := o.Triggers.Groups(); c.groups&need != need {
		if strings.TrimSpace(c.Events) != "" {
			return fmt.Errorf("flight.triggers %s needs the %s events: add them to events", o.Triggers, need&^c.groups)
		}
		c.groups |= need
	}
	c.flight = o
	return nil
}

// Parse checks a configuration and fills in the defaults.
func Parse(data []byte) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) { // empty: all defaults
		return nil, fmt.Errorf("config: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if err := c.fill(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return &c, nil
}

func (c *Config) fill() error {
	if c.Host == "" {
		c.Host, _ = os.Hostname()
	}
	if c.Spool == "" {
		c.Spool = DefaultSpool
	}
	if c.Pattern == "" {
		c.Pattern = DefaultPattern
	}
	if strings.Contains(c.Pattern, "/") {
		return fmt.Errorf("pattern %q: a file name, without directory (the directory is spool)", c.Pattern)
	}
	if _, err := rotate.ParsePattern(c.Spool+"/"+c.Pattern, c.Host); err != nil {
		return err
	}
	if c.Rotate.Interval == 0 && c.Rotate.Size == "" {
		c.Rotate.Interval = time.Hour
	}
	if c.Rotate.Interval < 0 || c.Rotate.Interval > 0 && c.Rotate.Interval < time.Second {
		return fmt.Errorf("rotate.interval %s: want at least 1s", c.Rotate.Interval)
	}
	if c.Rotate.Size != "" {
		n, err := bytesize.Parse(c.Rotate.Size)
		if err != nil {
			return fmt.Errorf("rotate.size: %w", err)
		}
		c.rotateMax = n
	}
	var err error
	if c.groups, err = event.ParseGroups(c.Events); err != nil {
		return fmt.Errorf("events: %w", err)
	}
	if c.Summary < 0 || c.Summary > 0 && c.Summary < 100*time.Millisecond {
		return fmt.Errorf("summary %s: want an interval of at least 100ms", c.Summary)
	}
	if c.Summary > 0 && strings.TrimSpace(c.Events) == "" {
		c.groups = 0 // what summary mode summarizes
	}
	if err := c.fillFlight(); err != nil {
		return err
	}
	if c.Filters.Pcap != "" {
		e, err := pcapfilter.Parse(c.Filters.Pcap)
		if err == nil {
			_, err = e.Compile()
		}
		if err != nil {
			return fmt.Errorf("filters.pcap: %w", err)
		}
	}
	if c.Buffer != "" {
		n, err := bytesize.Parse(c.Buffer)
		if err != nil || n > 1<<30 {
			return fmt.Errorf("buffer %q: want a power of two up to 1GiB", c.Buffer)
		}
		c.buffer = int(n)
	}
	if c.DiskBudget != "" {
		if c.budget, err = bytesize.Parse(c.DiskBudget); err != nil {
			return fmt.Errorf("disk_budget: %w", err)
		}
	}
	if c.Compress == nil {
		t := true
		c.Compress = &t
	}
	if c.Ship.Interval == 0 {
		c.Ship.Interval = 10 * time.Second
	}
	if c.Ship.RetryInitial == 0 {
		c.Ship.RetryInitial = time.Second
	}
	if c.Ship.RetryMax == 0 {
		c.Ship.RetryMax = 5 * time.Minute
	}
	if c.Ship.Timeout == 0 {
		c.Ship.Timeout = 10 * time.Minute
	}
	if c.Ship.Stall == 0 {
		c.Ship.Stall = 30 * time.Second
	}
	if c.Ship.Interval < 0 || c.Ship.RetryInitial < 0 || c.Ship.RetryMax < c.Ship.RetryInitial || c.Ship.Timeout < 0 || c.Ship.Stall < 0 {
		return errors.New("ship: intervals must be positive and retry_max at least retry_initial")
	}
	if c.Dataset.Dir != "" {
		if c.Dataset.Partition == nil {
			c.Dataset.Partition = []string{"host", "date"}
		}
		if err := export.CheckPartition(c.Dataset.Partition); err != nil {
			return fmt.Errorf("dataset: %w", err)
		}
		// The shipper adds each file to the dataset before shipping it,
		// and runs only when there is somewhere to ship.
		if len(c.Targets) == 0 {
			return errors.New("dataset: needs a target (the shipper writes the dataset as it ships; a dir target keeps the traces on this host)")
		}
	}
	names := map[string]bool{}
	for i := range c.Targets {
		t := &c.Targets[i]
		if err := t.check(); err != nil {
			return fmt.Errorf("targets[%d]: %w", i, err)
		}
		if t.Name == "" {
			t.Name = fmt.Sprintf("%s-%d", t.Type, i)
		}
		if t.Timeout < 0 {
			return fmt.Errorf("targets[%d]: timeout %s: want positive", i, t.Timeout)
		}
		if names[t.Name] {
			return fmt.Errorf("targets[%d]: name %q used twice", i, t.Name)
		}
		names[t.Name] = true
	}
	return nil
}

func (t *Target) check() error {
	switch t.Type {
	case "dir":
		if t.Path == "" {
			return errors.New("dir target needs path")
		}
	case "ssh":
		if t.SSHHost == "" || t.Path == "" {
			return errors.New("ssh target needs host and path")
		}
		if t.Port < 0 || t.Port > 65535 {
			return fmt.Errorf("ssh port %d: want 1-65535", t.Port)
		}
		if strings.HasPrefix(t.SSHHost, "-") || strings.HasPrefix(t.User, "-") {
			return errors.New("ssh host and user may not start with '-'")
		}
	case "s3":
		if t.Endpoint == "" || t.Bucket == "" {
			return errors.New("s3 target needs endpoint and bucket")
		}
	case "":
		return errors.New("type is required: dir, ssh or s3")
	default:
		return fmt.Errorf("unknown type %q (want dir, ssh or s3)", t.Type)
	}
	return nil
}
