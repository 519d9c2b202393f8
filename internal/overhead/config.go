// SPDX-License-Identifier: Apache-2.0

package overhead

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"

	"github.com/magnet-tracer/magnet/internal/event"
)

// Kind is what a configuration runs beside the workload.
type Kind int

// The kinds of configuration.
const (
	// Nothing: the baseline every other configuration is compared with,
	// in the same repetition.
	Nothing Kind = iota
	// Magnet is `magnet record -o FILE` with Config.Args, as a process, on
	// the whole host.
	Magnet
	// Tcpdump is `tcpdump -s 96 -w FILE` on the sender's veth.
	Tcpdump
	// Perf is `perf record -a` of the tracepoints magnet's default groups
	// use.
	Perf
	// Bpftrace prints a line per event of the same tracepoints to a file.
	Bpftrace
)

var kindNames = [...]string{Nothing: "nothing", Magnet: "magnet", Tcpdump: "tcpdump", Perf: "perf", Bpftrace: "bpftrace"}

// String names the kind.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind %d", int(k))
}

// MarshalText writes the kind by name in JSON reports.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// Config is one way of running the workload: with nothing, with magnet in
// one of its modes, or with another tool.
type Config struct {
	Name string   `json:"name"`
	Kind Kind     `json:"kind"`
	Args []string `json:"args,omitempty"` // magnet record's own arguments
	What string   `json:"what"`           // one line for the tables
}

// Names of the configurations the goals judge.
const (
	Baseline      = "baseline"
	BaselineAgain = "baseline-again"
	Record        = "record"
	RecordSummary = "record-summary"
	RecordFlight  = "record-flight"
	RecordXmitDev = "record-xmit-at-device"
	RecordFloor   = "record-floor"
	RecordNoEmit  = "record-noemit"
	TcpdumpName   = "tcpdump"
	PerfName      = "perf"
	BpftraceName  = "bpftrace"
)

// GoalConfigs are the configurations the goals compare (with the noise
// reference and what the floor is made of): the only ones Options.GoalReps
// repeats.
var GoalConfigs = []string{Baseline, Record, RecordSummary, RecordFlight, RecordFloor, RecordNoEmit, BaselineAgain, TcpdumpName}

// goalConfigs keeps the configurations of cs that GoalConfigs names, in
// their order.
func goalConfigs(cs []Config) []Config {
	var out []Config
	for _, c := range cs {
		if slices.Contains(GoalConfigs, c.Name) {
			out = append(out, c)
		}
	}
	return out
}

// configNamed is the configuration of cs called name, or nil.
func configNamed(cs []Config, name string) *Config {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

// recordModes are magnet record's modes, each a configuration; the goals
// find them by name.
var recordModes = []Config{
	{Name: Record, Kind: Magnet, What: "`magnet record`, default groups"},
	{Name: RecordSummary, Kind: Magnet, Args: []string{"--summary=1s"}, What: "`magnet record --summary=1s`: per-connection figures read from each TCP socket (and drops), no program per packet"},
	// A trigger that never fires: the cost between triggers.
	{Name: RecordFlight, Kind: Magnet, Args: []string{"--flight", "30s", "--trigger", "rtt>10s"}, What: "`magnet record --flight 30s --trigger 'rtt>10s'`: events kept in memory, none written"},
	{Name: RecordXmitDev, Kind: Magnet, Args: []string{"--xmit-at-device"}, What: "`magnet record --xmit-at-device`: default groups, tcp_xmit read at the device instead of at IP egress (opt-in)"},
	// What the floor is made of: the default groups' hooks with bodies
	// that return at once.
	{Name: RecordFloor, Kind: Magnet, Args: []string{"--hooks-only"}, What: "`magnet record --hooks-only` (benchmark only): every program the default groups attach, each returning at its first check: what the hooks alone cost"},
	// Between the floor and record: the bodies' work without the records
	// (their areas, wake-ups and the recorder's reading and writing).
	{Name: RecordNoEmit, Kind: Magnet, Args: []string{"--no-emit"}, What: "`magnet record --no-emit` (benchmark only): every program the default groups attach doing all its work but writing no event: the hooks and bodies without the records"},
}

// Configs returns every configuration in the order a repetition runs them:
// the baseline, each default event group alone, magnet's modes, then the
// other tools.
func Configs() []Config {
	cs := []Config{{Name: Baseline, Kind: Nothing, What: "nothing recording"}}
	// conn is always on: alone it is the least any recording attaches,
	// and every other group alone carries it.
	cs = append(cs, Config{Name: "record-conn", Kind: Magnet, Args: []string{"--events", "conn"},
		What: "`magnet record --events conn`: connection lifecycle only, the least a recording attaches"})
	for _, g := range event.DefaultGroups.Names() {
		if g == "conn" {
			continue
		}
		cs = append(cs, Config{Name: "record-" + g, Kind: Magnet, Args: []string{"--events", g},
			What: fmt.Sprintf("`magnet record --events %s` (with conn)", g)})
	}
	// ip left the defaults (the device records carry its facts): its
	// cost alone is still what choosing it adds.
	cs = append(cs, Config{Name: "record-ip", Kind: Magnet, Args: []string{"--events", "ip"},
		What: "`magnet record --events ip` (with conn; opt-in: two cgroup_skb runs per packet)"})
	cs = append(cs, recordModes...)
	return append(cs, again,
		Config{Name: TcpdumpName, Kind: Tcpdump, What: "`tcpdump -s 96 -w FILE` on the sender's veth"},
		Config{Name: PerfName, Kind: Perf, What: "`perf record -a` of the default groups' tracepoints"},
		Config{Name: BpftraceName, Kind: Bpftrace, What: "bpftrace, a line per event of the same tracepoints, to a file"},
	)
}

// again is the baseline run a second time in each repetition, halfway
// through it: its difference from the baseline is what this host's noise
// alone makes of "more CPU per GB" (an A/A comparison), the yardstick for
// every other configuration's.
var again = Config{Name: BaselineAgain, Kind: Nothing, What: "nothing recording, again, later in the repetition: the run's own noise"}

// SaturationDefault are the configurations run at saturation unless told
// otherwise: the goal compares magnet's default with tcpdump.
//
// The floor shows what the hooks alone take from a saturated link, and
// summary mode what the always-on mode takes.
var SaturationDefault = []string{Baseline, Record, RecordXmitDev, RecordSummary, RecordFloor, BaselineAgain, TcpdumpName, PerfName, BpftraceName}

// Select returns the configurations of Configs named in names (comma-
// separated), in Configs' order, with the baseline always first.
func Select(names string) ([]Config, error) {
	all := Configs()
	want := map[string]bool{Baseline: true}
	for _, n := range strings.Split(names, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		found := false
		for _, c := range all {
			found = found || c.Name == n
		}
		if !found {
			var known []string
			for _, c := range all {
				known = append(known, c.Name)
			}
			return nil, fmt.Errorf("unknown configuration %q (want %s)", n, strings.Join(known, ","))
		}
		want[n] = true
	}
	var out []Config
	for _, c := range all {
		if want[c.Name] {
			out = append(out, c)
		}
	}
	return out, nil
}

// Names lists the names of cs.
func Names(cs []Config) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

// tool is the program a configuration needs besides magnet.
func (c Config) tool() string {
	switch c.Kind {
	case Tcpdump:
		return "tcpdump"
	case Perf:
		return "perf"
	case Bpftrace:
		return "bpftrace"
	}
	return ""
}

// unavailable says why c cannot run here, or "".
func (c Config) unavailable() string {
	if t := c.tool(); t != "" {
		if _, err := exec.LookPath(t); err != nil {
			return t + " not installed (bench/cost.sh installs it)"
		}
	}
	return ""
}

// tracepoints are the tracepoints magnet's default groups attach to
// (tp_btf programs); perf and bpftrace record these. magnet's tcp_xmit
// (fentry), ip_send and ip_recv (cgroup_skb) have no tracepoint.
var tracepoints = []string{
	"sock:sock_send_length", "sock:sock_recv_length",
	"tcp:tcp_probe", "tcp:tcp_retransmit_skb", "sock:inet_sock_set_state",
	"net:net_dev_queue", "net:net_dev_start_xmit", "net:netif_receive_skb",
	"skb:kfree_skb",
}
