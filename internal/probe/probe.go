// SPDX-License-Identifier: Apache-2.0

// Package probe loads magnet's BPF programs (bpf/magnet.bpf.c) and attaches
// each to its kernel hook. A hook this kernel lacks, or a program its
// verifier refuses, makes only that hook's events unavailable: Load says
// which and why, and the rest keep working.
package probe

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/pcapfilter"
	"github.com/magnet-tracer/magnet/internal/ring"
)

// Hook is one BPF program and the kernel hook it attaches to.
type Hook struct {
	Program string      // program name in bpf/layer/*.c
	Kind    string      // tp_btf, sockops, cgroup_skb, cgroup_sock
	Target  string      // tracepoint name or cgroup attach point
	Groups  event.Group // the program is attached when any of these is enabled
	Events  []string    // events it produces
}

// Hooks lists every hook magnet uses. Each row's Events are the events
// whose annotation in bpf/events.h names its program (hookEvents): adding
// an event to a program changes no row here.
var Hooks = withEvents([]hookRow{
	{"sock_send_length", "tp_btf", "sock_send_length", event.GroupSock},
	{"sock_recv_length", "tp_btf", "sock_recv_length", event.GroupSock},
	{"tcp_sendmsg_locked", "tp_btf", "tcp_sendmsg_locked", event.GroupTCPSend},
	{"tcp_xmit_fentry", "fentry", "__tcp_transmit_skb", event.GroupTCP | event.GroupRate},
	// Where fentry is refused, tcp_xmit (and the tcp_rate a segment
	// carries out) is read at IP egress: once per skb, in a program that
	// returns early for other packets, where sockops' per-segment callback
	// ran 2.3 times per packet. Before sockops, so that it is attached
	// first and sockops flags no socket. Load takes tcp_xmit from it when
	// it does not serve it (fentry, --xmit-at-device, summary mode).
	{"ip_egress", "cgroup_skb", "egress", event.GroupIP | event.GroupTCP | event.GroupRate},
	{"tcp_segments", "sockops", "sockops", event.GroupTCP | event.GroupConn | event.GroupRate},
	{"tcp_probe", "tp_btf", "tcp_probe", event.GroupTCP | event.GroupTCPState | event.GroupRate},
	{"tcp_retransmit_skb", "tp_btf", "tcp_retransmit_skb", event.GroupTCP},
	{"inet_sock_set_state", "tp_btf", "inet_sock_set_state", event.GroupConn},
	{"udp_release", "cgroup_sock", "sock_release", event.GroupConn},
	{"udp_bind4", "cgroup_sock", "post_bind4", event.GroupConn},
	{"udp_bind6", "cgroup_sock", "post_bind6", event.GroupConn},
	{"ip_ingress", "cgroup_skb", "ingress", event.GroupIP},
	// With Options.XmitAtDevice, Load adds tcp_xmit and tcp_rate (and
	// their groups) to net_dev_queue's and takes them from ip_egress's
	// and sockops'.
	{"net_dev_queue", "tp_btf", "net_dev_queue", event.GroupDev},
	{"net_dev_start_xmit", "tp_btf", "net_dev_start_xmit", event.GroupDev | event.GroupHeaders},
	{"netif_receive_skb", "tp_btf", "netif_receive_skb", event.GroupDev | event.GroupHeaders},
	{"kfree_skb", "tp_btf", "kfree_skb", event.GroupDrop},
	// Bare tracepoints (6.16+) bracketing __schedule(): no events of their
	// own (no annotation in events.h names them), they time the switch
	// that sched_switch records. Before it, so that they are attached
	// first and detached last.
	{"sched_entry_tp", "tp_btf", "sched_entry_tp", event.GroupSched},
	{"sched_exit_tp", "tp_btf", "sched_exit_tp", event.GroupSched},
	{"sched_switch", "tp_btf", "sched_switch", event.GroupSched},
	{"sched_wakeup", "tp_btf", "sched_wakeup", event.GroupSched},
	{"sched_process_fork", "tp_btf", "sched_process_fork", event.GroupSched},
	{"sched_process_exit", "tp_btf", "sched_process_exit", event.GroupSched},
})

// hookRow is a row of Hooks as written: a Hook but for its Events.
type hookRow struct {
	program, kind, target string
	groups                event.Group
}

// withEvents makes each row a Hook, with its Events from hookEvents.
func withEvents(rows []hookRow) []Hook {
	hooks := make([]Hook, len(rows))
	for i, r := range rows {
		hooks[i] = Hook{r.program, r.kind, r.target, r.groups, slices.Clone(hookEvents[r.program])}
	}
	return hooks
}

// xmitEvents are what the program serving tcp_xmit writes of it: the
// preferred one's (fentry's) events, which ip_egress, sockops and, with
// --xmit-at-device, net_dev_queue write only while they serve it.
var xmitEvents = hookEvents["tcp_xmit_fentry"]

// withoutXmit is events less xmitEvents.
func withoutXmit(events []string) []string {
	return slices.DeleteFunc(slices.Clone(events), func(ev string) bool { return slices.Contains(xmitEvents, ev) })
}

// timingFor names, for a hook that produces no event of its own, what it
// times in another hook's events.
var timingFor = map[string]string{
	"sched_entry_tp": "sched_switch's pick_ns (context-switch time)",
	"sched_exit_tp":  "sched_switch's pick_ns (context-switch time)",
}

// Serves says what a hook gives: its events, or what it times in another
// hook's events.
func (h Hook) Serves() string {
	if len(h.Events) == 0 {
		return timingFor[h.Program]
	}
	return strings.Join(h.Events, ",")
}

// HookStatus says whether a hook serves its events on this kernel.
type HookStatus struct {
	Hook
	Available bool   `json:"available"`
	Attached  bool   `json:"attached"`
	Reason    string `json:"reason,omitempty"` // why not, when not
}

// Filters restrict what is recorded; zero values mean "any".
type Filters struct {
	NetNS    uint32 // network namespace inode
	Port     uint16 // local or remote port
	TGID     uint32 // process id
	CgroupID uint64 // cgroup2 id: the cgroup and its descendants
	// Pcap is a compiled pcap-filter expression (pcapfilter.Expr.Compile),
	// which each socket must pass when first seen; nil: none.
	Pcap []pcapfilter.Insn
}

// Options configure Load.
type Options struct {
	Groups       event.Group
	Filters      Filters
	BufferBytes  int // events rings, all CPUs together; a power of two, at least one page
	ControlBytes int // control ring
	SelfTGID     uint32
	// ExcludeCgroupID is a cgroup2 id whose sockets are never traced, at
	// any layer: the collect service ships traces from it. 0 = none.
	ExcludeCgroupID uint64
	// Disable lists programs not to load, as if this kernel lacked their
	// hooks (for testing the fallback, and for working around a bad hook).
	Disable []string
	// WakeupFill is how full (a fraction of its size) an events ring gets
	// before BPF wakes the reader; 0 means DefaultWakeupFill. A fraction
	// below one record wakes it as soon as the ring holds anything; 1 only
	// when the ring is
	// full, which leaves the reader to its poll interval.
	WakeupFill float64
	// XmitAtDevice reads tcp_xmit (and the tcp_rate a segment carries
	// out) at net_dev_queue instead of at IP egress or fentry: one
	// program run fewer per skb sent, but it sees only the skbs that
	// reach a device (docs/EVENTS.md). Not in summary mode.
	XmitAtDevice bool
	// Silent loads and attaches the programs of Groups with no group
	// enabled: every run returns at its first check (see Silence). The
	// bench's floor: what the hooks alone cost.
	Silent bool
	// NoEmit loads the programs so that each does all its work (the
	// connection lookup, the filters, the reads) but writes its events
	// into a per-CPU scratch record nobody reads: no event reaches the
	// rings. The bench's record-noemit, which tells what the records
	// themselves cost from what the bodies cost. The control ring's
	// records (connections' openings and closes, interfaces) are still
	// written.
	NoEmit bool
	// Summary loads the programs in summary mode: they add to each
	// connection's figures in the summaries map (Probe.ReadSummaries)
	// instead of writing events; connection lifecycle still goes to the
	// control ring. The sock and tcp groups' figures of a TCP connection
	// are then read from its socket (SocketGroups) and their per-packet
	// programs are not loaded.
	Summary bool
	// orderedPublish publishes events as on CPUs that reorder stores,
	// for the tests on x86.
	orderedPublish bool
}

// eventsMask is the events_mask the programs start with.
func eventsMask(opts Options) event.Group {
	if opts.Silent {
		return 0
	}
	return opts.Groups
}

// DefaultWakeupFill: half a ring leaves the reader the other half to come
// back in (~100 ms at 1 M events/s with the default 8 MiB on 2 CPUs), as
// ftrace's buffer_percent does by default. Each wake-up costs the reader
// context switches and a round of its loop: woken at an eighth, the earlier
// default, it used 1.10-1.15 times the CPU time per event it uses woken at
// half (64 KiB and 64-byte veth floods, paired; at a quarter, 1.07), and
// at half it lost nothing in the bench's synthetic rates and loss sweep
// (docs/BENCH.md at d71bc17, "The drain, eighth round").
const DefaultWakeupFill = 1.0 / 2

// wakeupBytes is the events_wakeup threshold of a ring of perCPU bytes.
func wakeupBytes(perCPU int, fill float64) uint64 {
	if fill <= 0 {
		fill = DefaultWakeupFill
	}
	return max(1, uint64(float64(perCPU)*min(fill, 1)))
}

// SocketGroups are the groups whose figures summary mode reads from each
// TCP socket (what the kernel keeps in struct tcp_sock: bytes written and
// read, sent and received, segments, retransmissions, srtt, cwnd), every
// interval and at close, instead of counting them per packet: their
// programs, which run per packet or per call, are not loaded.
const SocketGroups = event.GroupSock | event.GroupTCP

// sockIterProgram reads the sockets' figures in summary mode: an iterator
// over the sockets that have a sock_last (bpf/lib/summary.h).
const sockIterProgram = "sock_figures"

// ErrPermission is returned when the caller lacks the privileges to load BPF.
var ErrPermission = errors.New("need CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN (run as root)")

// Probe is a loaded and attached set of magnet's programs. Close detaches
// and unloads them; the caller must call it.
type Probe struct {
	// Areas holds the events areas (bpf/magnet.bpf.c): one per CPU online
	// at Load, and one nested area each. EventRings opens their readers.
	Areas    *ebpf.Map
	Nested   *ebpf.Map
	AreaPos  *ebpf.Map
	AreaCPUs []int     // the CPU of each slot
	Doorbell *ebpf.Map // ring buffer whose records only wake the reader
	Control  *ebpf.Map // ring buffer of connection lifecycle
	Counters *ebpf.Map // per-CPU produced/lost counters per type
	Lost     *ebpf.Map // per-CPU losses not yet reported in the stream
	// Summaries holds each connection's figures per CPU in summary mode
	// (Options.Summary): cookie → struct mg_conn_summary.
	Summaries *ebpf.Map
	// SockSummaries holds, in summary mode, the figures read from each TCP
	// connection's socket (SocketGroups), as totals: cookie → struct
	// mg_conn_summary.
	SockSummaries *ebpf.Map
	// sockIter fills SockSummaries from the sockets (summary mode).
	sockIter *link.Iter
	Status   []HookStatus // as attached by Load; SetGroups does not change it
	coll     *ebpf.Collection
	mask     *ebpf.Variable
	cgroup   string
	// settings are the values Load gave the object's constants
	// (bpf/lib/settings.h), by name, for LoadSharing.
	settings map[string]any

	mu    sync.Mutex
	links map[int]link.Link // by index in Status: the programs attached now
	// attaches counts attaches and detaches: a reader of run counts knows
	// by it whether the programs stayed attached between two reads.
	attaches uint64
	stopped  bool // Detach was called: nothing attaches again
	// xmitAt: where tcp_xmit is read when a program below TCP serves it
	// (XmitAtIP, XmitAtDevice), "" otherwise.
	xmitAt string
}

// Load loads the programs the enabled groups need and attaches them.
func Load(opts Options) (*Probe, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock limit: %w", err)
	}
	spec, err := loadMagnet()
	if err != nil {
		return nil, fmt.Errorf("parse bpf object: %w", err)
	}
	possible, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("count CPUs: %w", err)
	}
	online := OnlineCPUs(possible)
	perCPU := RingBytesPerCPU(opts.BufferBytes, len(online))
	slots, err := sizeAreas(spec, online, perCPU)
	if err != nil {
		return nil, err
	}
	spec.Maps["control"].MaxEntries = uint32(opts.ControlBytes)
	set := func(name string, v any) error {
		if err := spec.Variables[name].Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
		return nil
	}
	// Wake the reader once a ring is filled past opts.WakeupFill; it also polls.
	settings := map[string]any{}
	for _, kv := range []struct {
		name string
		v    any
	}{
		{"filter_netns", opts.Filters.NetNS},
		{"filter_port", opts.Filters.Port},
		{"filter_tgid", opts.Filters.TGID},
		{"filter_cgroup", opts.Filters.CgroupID},
		{"self_tgid", opts.SelfTGID},
		{"exclude_cgroup", opts.ExcludeCgroupID},
		{"events_wakeup", wakeupBytes(perCPU, opts.WakeupFill)},
		{"area_size", uint64(perCPU)},
		{"nested_size", uint64(NestedBytes(perCPU))},
		{"nested_wakeup", wakeupBytes(NestedBytes(perCPU), opts.WakeupFill)},
		{"area_slot_of", slots},
		{"publish_ordered", publishOrdered(runtime.GOARCH) | b2u(opts.orderedPublish)},
		{"control_wakeup", uint64(opts.ControlBytes / 8)},
		{"events_mask", uint32(eventsMask(opts))},
		{"summary_mode", uint8(b2u(opts.Summary))},
		{"no_emit", uint8(b2u(opts.NoEmit))},
		{"pcap_len", uint32(len(opts.Filters.Pcap))},
		{"pcap_prog", pcapProg(opts.Filters.Pcap)},
	} {
		if err := set(kv.name, kv.v); err != nil {
			return nil, err
		}
		settings[kv.name] = kv.v
	}

	status := CheckHooks()
	cgroupRoot, cgErr := Cgroup2Root()
	atDev := opts.XmitAtDevice && !opts.Summary
	usable := func(program string) bool {
		i := slices.IndexFunc(status, func(st HookStatus) bool { return st.Program == program })
		return i >= 0 && status[i].Available && !slices.Contains(opts.Disable, program)
	}
	// tcp_xmit at IP egress unless fentry (exact at TCP, and needing no
	// cgroup) can serve it, or the device is asked to; with ip_egress
	// disabled, sockops serves it.
	atIP := !opts.Summary && !atDev && opts.Groups&(event.GroupTCP|event.GroupRate) != 0 &&
		!usable("tcp_xmit_fentry") && usable("ip_egress") && cgErr == nil
	xmitAt := ""
	switch {
	case atDev:
		xmitAt = XmitAtDevice
	case atIP:
		xmitAt = XmitAtIP
	}
	perPacket := opts.Groups
	if opts.Summary {
		perPacket &^= SocketGroups
	} else {
		delete(spec.Programs, sockIterProgram)
	}
	for i := range status {
		st := &status[i]
		switch {
		case st.Program == "net_dev_queue" && atDev:
			st.Groups |= event.GroupTCP | event.GroupRate
			st.Events = append(slices.Clone(st.Events), xmitEvents...)
		case st.Program == "ip_egress" && !atIP:
			st.Groups = event.GroupIP
			st.Events = withoutXmit(st.Events)
		case st.Program == "tcp_segments" && atIP:
			st.Events = withoutXmit(st.Events)
		}
		if st.Groups&perPacket == 0 {
			st.Reason = "not enabled"
		}
		if slices.Contains(opts.Disable, st.Program) {
			st.Available, st.Reason = false, "disabled"
		}
		if st.Available && (strings.HasPrefix(st.Kind, "cgroup") || st.Kind == "sockops") && cgErr != nil {
			st.Available, st.Reason = false, cgErr.Error()
		}
		if !st.Available || st.Groups&perPacket == 0 {
			delete(spec.Programs, st.Program)
		}
	}
	// Where net_dev_queue serves tcp_xmit, fentry would only add a program
	// run per segment; and sockops, attached before it (Hooks order), must
	// flag no socket from the start.
	if atDev && spec.Programs["net_dev_queue"] != nil {
		if err := set("xmit_at_dev", uint8(1)); err != nil {
			return nil, err
		}
		for i := range status {
			if st := &status[i]; st.Program == "tcp_xmit_fentry" && spec.Programs[st.Program] != nil {
				st.Available, st.Reason = false, FentryStandsBack
				delete(spec.Programs, st.Program)
			}
		}
	}
	if atIP && spec.Programs["ip_egress"] != nil {
		if err := set("xmit_at_ip", uint8(1)); err != nil {
			return nil, err
		}
	}

	for _, name := range LearnPrograms {
		if slices.Contains(opts.Disable, name) {
			delete(spec.Programs, name)
		}
	}

	// A program the verifier refuses is dropped and the rest loaded again.
	var coll *ebpf.Collection
	for attempt := 0; ; attempt++ {
		coll, err = ebpf.NewCollection(spec)
		if err == nil {
			break
		}
		if errors.Is(err, os.ErrPermission) && os.Geteuid() != 0 {
			return nil, ErrPermission
		}
		name := failedProgram(err, spec)
		if name == "" || attempt > len(Hooks) {
			return nil, fmt.Errorf("load bpf programs: %s", firstLine(err))
		}
		delete(spec.Programs, name)
		for i := range status {
			if status[i].Program == name {
				status[i].Available, status[i].Reason = false, "verifier refused: "+firstLine(err)
			}
		}
	}

	p := &Probe{
		Areas:         coll.Maps["areas"],
		Nested:        coll.Maps["nested_areas"],
		AreaPos:       coll.Maps["area_pos"],
		AreaCPUs:      online,
		Doorbell:      coll.Maps["doorbell"],
		Control:       coll.Maps["control"],
		Counters:      coll.Maps["counters"],
		Lost:          coll.Maps["lost_states"],
		Summaries:     coll.Maps["summaries"],
		SockSummaries: coll.Maps["sock_summaries"],
		coll:          coll,
		mask:          coll.Variables["events_mask"],
		cgroup:        cgroupRoot,
		links:         map[int]link.Link{},
		settings:      settings,
		xmitAt:        xmitAt,
	}
	for i := range status {
		st := &status[i]
		if coll.Programs[st.Program] == nil {
			continue
		}
		// Attached before sockops (Hooks order), which then stands back
		// from tcp_xmit when fentry serves it.
		if err := p.attach(i, st); err != nil {
			st.Reason = firstLine(err)
			continue
		}
		st.Attached = true
	}
	if server := xmitServer(xmitAt); server != "" {
		i := slices.IndexFunc(status, func(st HookStatus) bool { return st.Program == server })
		if i >= 0 && status[i].Attached {
			for j := range status {
				if status[j].Program == "tcp_segments" {
					status[j].Events = withoutXmit(status[j].Events)
				}
			}
		} else if v := p.coll.Variables[xmitVariable(server, xmitAt)]; v != nil {
			// Refused or failed to attach: sockops (fentry is not
			// loaded) serves tcp_xmit after all.
			p.xmitAt = ""
			if err := v.Set(uint8(0)); err != nil {
				p.Close()
				return nil, fmt.Errorf("set %s: %w", xmitVariable(server, xmitAt), err)
			}
			for j := range status {
				if status[j].Program == "tcp_segments" {
					status[j].Events = slices.Clone(hookEvents["tcp_segments"])
				}
			}
		}
	}
	p.Status = status
	if opts.Summary {
		it, err := link.AttachIter(link.IterOptions{Program: coll.Programs[sockIterProgram], Map: coll.Maps["sock_lasts"]})
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("summary mode: attach the socket iterator: %w", err)
		}
		p.sockIter = it
	}
	return p, nil
}

// LoadSharing loads the programs of spec, an object built from the same
// bpf/lib headers as magnet's (bpf/synthevent.bpf.c), so that they write
// events into this probe's rings exactly as its own programs do: every map
// of spec that this probe has by name (areas, positions, per-CPU state,
// counters, rings) is this probe's, and every setting of bpf/lib/settings.h
// takes the value Load gave it. Nothing is attached. The caller must Close
// the collection, before or after the probe. It exists so that programs
// the product never loads (the lab's synthetic events) stay out of
// magnet's own object.
func (p *Probe) LoadSharing(spec *ebpf.CollectionSpec) (*ebpf.Collection, error) {
	spec = spec.Copy()
	replace := map[string]*ebpf.Map{}
	for name, ms := range spec.Maps {
		m := p.coll.Maps[name]
		if m == nil || strings.HasPrefix(name, ".") {
			// Sections of globals (.rodata, .bss) are each object's own.
			continue
		}
		// The sizes Load chose for this machine (sizeAreas), not the
		// object's defaults.
		ms.KeySize, ms.ValueSize, ms.MaxEntries = m.KeySize(), m.ValueSize(), m.MaxEntries()
		replace[name] = m
	}
	for name, v := range p.settings {
		if sv := spec.Variables[name]; sv != nil {
			if err := sv.Set(v); err != nil {
				return nil, fmt.Errorf("set %s: %w", name, err)
			}
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: replace})
	if err != nil {
		return nil, fmt.Errorf("load beside the probe: %s", firstLine(err))
	}
	return coll, nil
}

// attach attaches the program of status[i]. p.mu must be held, or p not
// yet shared.
func (p *Probe) attach(i int, st *HookStatus) error {
	l, err := attach(st.Hook, p.coll.Programs[st.Program], p.cgroup)
	if err != nil {
		return fmt.Errorf("attach: %w", err)
	}
	if v := xmitVariable(st.Program, p.xmitAt); v != "" {
		if err := p.coll.Variables[v].Set(uint8(1)); err != nil {
			l.Close()
			return fmt.Errorf("enable: %w", err)
		}
	}
	p.links[i] = l
	p.attaches++
	return nil
}

// detach detaches the program of status[i]. p.mu must be held.
func (p *Probe) detach(i int, st *HookStatus) {
	if v := xmitVariable(st.Program, p.xmitAt); v != "" {
		// sockops takes tcp_xmit back (when its group is enabled again
		// and this program cannot attach).
		_ = p.coll.Variables[v].Set(uint8(0))
	}
	p.links[i].Close()
	delete(p.links, i)
	p.attaches++
}

// FentryStandsBack is the reason fentry/__tcp_transmit_skb is not loaded
// where it could be.
const FentryStandsBack = "not needed: tcp_xmit served at net_dev_queue"

// Where a program below TCP serves tcp_xmit (Probe.xmitAt); "" where
// fentry or sockops does.
const (
	XmitAtIP     = "ip"     // cgroup_skb/egress, the default where fentry is refused
	XmitAtDevice = "device" // net_dev_queue, Options.XmitAtDevice
)

// xmitServer names the program that serves tcp_xmit from below TCP.
func xmitServer(xmitAt string) string {
	switch xmitAt {
	case XmitAtIP:
		return "ip_egress"
	case XmitAtDevice:
		return "net_dev_queue"
	}
	return ""
}

// xmitVariable names the global that tells the other tcp_xmit programs to
// stand back while program serves tcp_xmit; "" if it does not. fentry
// always sets its own; ip_egress and net_dev_queue serve tcp_xmit only as
// Load chose (xmitAt): not in summary mode, whose per-connection figures
// of a segment are read from the socket.
func xmitVariable(program, xmitAt string) string {
	switch {
	case program == "tcp_xmit_fentry":
		return "xmit_by_fentry"
	case program == xmitServer(xmitAt) && xmitAt == XmitAtDevice:
		return "xmit_at_dev"
	case program == xmitServer(xmitAt) && xmitAt == XmitAtIP:
		return "xmit_at_ip"
	}
	return ""
}

// detachable says whether a hook's program may be detached while none of
// its groups is enabled. The connection lifecycle's may not: they learn
// each socket as it binds or connects (sockops also arms the socket's
// per-segment callbacks then), so a socket born while they were detached
// would stay unknown after they return.
func detachable(h Hook) bool { return h.Kind != "sockops" && h.Groups&event.GroupConn == 0 }

// ServedBy says, for each event, which hook produces it: the first in Hooks
// order that is attached (or, before anything is loaded, available), so a
// preferred hook (fentry) wins over its fallback.
func ServedBy(status []HookStatus) map[string]string {
	loaded := slices.ContainsFunc(status, func(st HookStatus) bool { return st.Attached })
	out := map[string]string{}
	for _, st := range status {
		if loaded && !st.Attached || !loaded && !st.Available {
			continue
		}
		for _, ev := range st.Events {
			if _, ok := out[ev]; !ok {
				out[ev] = st.Kind + "/" + st.Target
			}
		}
	}
	return out
}

func attach(h Hook, prog *ebpf.Program, cgroupRoot string) (link.Link, error) {
	switch h.Kind {
	case "tp_btf":
		return link.AttachTracing(link.TracingOptions{Program: prog, AttachType: ebpf.AttachTraceRawTp})
	case "fentry":
		return link.AttachTracing(link.TracingOptions{Program: prog, AttachType: ebpf.AttachTraceFEntry})
	case "sockops":
		return link.AttachCgroup(link.CgroupOptions{Path: cgroupRoot, Attach: ebpf.AttachCGroupSockOps, Program: prog})
	case "cgroup_skb":
		at := ebpf.AttachCGroupInetEgress
		if h.Target == "ingress" {
			at = ebpf.AttachCGroupInetIngress
		}
		return link.AttachCgroup(link.CgroupOptions{Path: cgroupRoot, Attach: at, Program: prog})
	case "cgroup_sock":
		at := ebpf.AttachCgroupInetSockRelease
		switch h.Target {
		case "post_bind4":
			at = ebpf.AttachCGroupInet4PostBind
		case "post_bind6":
			at = ebpf.AttachCGroupInet6PostBind
		}
		return link.AttachCgroup(link.CgroupOptions{Path: cgroupRoot, Attach: at, Program: prog})
	}
	return nil, fmt.Errorf("unknown hook kind %q", h.Kind)
}

// SetGroups changes the enabled event groups while the programs run.
// A program none of whose groups is enabled is detached, so that it costs
// the traffic nothing (an attached program runs even when it returns at
// once); it is attached again, before its groups are enabled, when one is.
// Programs of groups enabled before and after are never touched, so they
// lose no events. Programs not attached at Load stay detached. Where
// sockops serves tcp_xmit (neither fentry nor IP egress can), TCP runs it
// for each segment only for sockets that connected while tcp or rate was
// enabled: switching them on later gives no tcp_xmit for the connections
// opened in between (docs/EVENTS.md, tcp_xmit).
func (p *Probe) SetGroups(g event.Group) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var added []int
	if !p.stopped {
		for i := range p.Status {
			st := &p.Status[i]
			if _, on := p.links[i]; on || !st.Attached || st.Groups&g == 0 {
				continue
			}
			if err := p.attach(i, st); err != nil {
				for _, j := range added {
					p.detach(j, &p.Status[j])
				}
				return fmt.Errorf("%s: %w", st.Program, err)
			}
			added = append(added, i)
		}
	}
	if err := p.mask.Set(uint32(g)); err != nil {
		for _, j := range added {
			p.detach(j, &p.Status[j])
		}
		return err
	}
	// After the mask: the events of a group switched off stop first.
	for i := range p.Status {
		st := &p.Status[i]
		if _, on := p.links[i]; on && st.Groups&g == 0 && detachable(st.Hook) {
			p.detach(i, st)
		}
	}
	return nil
}

// Silence disables every event group but, unlike SetGroups(0), leaves each
// program attached: every run then returns at its first check, and sockets
// keep asking TCP for the per-segment callbacks. The bench measures what the
// hooks alone cost this way. Connections' openings are still told (the
// control ring), as they are whatever the groups.
func (p *Probe) Silence() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.mask.Set(uint32(0)); err != nil {
		return fmt.Errorf("clear the event mask: %w", err)
	}
	return nil
}

// AttachedPrograms lists the programs attached now, in Hooks order.
func (p *Probe) AttachedPrograms() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for i := range p.Status {
		if _, on := p.links[i]; on {
			out = append(out, p.Status[i].Program)
		}
	}
	return out
}

// Detach stops every program, so no more events are produced; the maps
// stay readable until Close.
func (p *Probe) Detach() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	// In the reverse of the attach order (Hooks'), so that a program that
	// times what a later one records outlives it.
	for i := len(p.Status) - 1; i >= 0; i-- {
		if l, ok := p.links[i]; ok {
			l.Close()
			delete(p.links, i)
			p.attaches++
		}
	}
}

// Close detaches and unloads everything.
func (p *Probe) Close() error {
	p.Detach()
	if p.sockIter != nil {
		p.sockIter.Close()
	}
	p.coll.Close()
	return nil
}

// RingBytesPerCPU is the size of each CPU's events ring when cpus CPUs share
// total bytes: the largest power of two that fits, and at least a page (so
// a tiny total may be exceeded).
func RingBytesPerCPU(total, cpus int) int {
	n := os.Getpagesize()
	for n*2*max(cpus, 1) <= total {
		n *= 2
	}
	return n
}

// OnlineCPUs lists the CPUs online now (/sys/devices/system/cpu/online),
// or all possible ones if that cannot be read.
func OnlineCPUs(possible int) []int {
	all := make([]int, possible)
	for i := range all {
		all[i] = i
	}
	data, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return all
	}
	cpus, err := parseCPUList(strings.TrimSpace(string(data)))
	if err != nil || len(cpus) == 0 {
		return all
	}
	var out []int
	for _, c := range cpus {
		if c < possible {
			out = append(out, c)
		}
	}
	return out
}

// parseCPUList parses the kernel's CPU list format: "0-3,5,7-8".
func parseCPUList(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("cpu list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("cpu list %q: %w", s, err)
			}
		}
		if a < 0 || b < a || b-a > 1<<16 {
			return nil, fmt.Errorf("cpu list %q: bad range %q", s, part)
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	return out, nil
}

// publishOrdered is 1 where the CPU may make stores visible out of order
// (arm64, …): an event's position is then published with an exchange,
// which orders the record's stores before it; x86 keeps stores in order.
func publishOrdered(goarch string) uint32 {
	if goarch == "amd64" || goarch == "386" {
		return 0
	}
	return 1
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// areaSlots is how many CPUs the areas maps can serve (AREA_MAX_CPUS).
const areaSlots = 1024

// sizeAreas sizes the events areas for the online CPUs, perCPU bytes each
// and a nested area of NestedBytes(perCPU), and returns the area slot of
// every CPU id, + 1 (0: none), for area_slot_of. Programs on a CPU without a
// slot (one that came online later) lose their events, counted.
func sizeAreas(spec *ebpf.CollectionSpec, online []int, perCPU int) ([areaSlots]uint32, error) {
	var slots [areaSlots]uint32
	for i, cpu := range online {
		if cpu >= areaSlots {
			return slots, fmt.Errorf("CPU %d: events areas serve CPUs 0-%d", cpu, areaSlots-1)
		}
		slots[cpu] = uint32(i + 1)
	}
	n := uint32(max(len(online), 1))
	spec.Maps["areas"].ValueSize = uint32(perCPU)
	spec.Maps["areas"].MaxEntries = n
	spec.Maps["nested_areas"].ValueSize = uint32(NestedBytes(perCPU))
	spec.Maps["nested_areas"].MaxEntries = n
	spec.Maps["area_pos"].MaxEntries = 2 * n
	return slots, nil
}

// NestedBytes is the size of a CPU's nested area (the one a program takes
// when it interrupted another of this CPU's between reserving and
// publishing a record): an eighth of its area, at least a page. Such
// interruptions are rare; the area only needs to hold their records until
// the next drain.
func NestedBytes(perCPU int) int {
	return max(perCPU/8, os.Getpagesize())
}

// EventRings opens a reader of every events area: the area of each CPU in
// AreaCPUs order, then their nested areas. The caller closes them.
func (p *Probe) EventRings() ([]*ring.Reader, error) {
	var rs []*ring.Reader
	fail := func(err error) ([]*ring.Reader, error) {
		for _, r := range rs {
			r.Close()
		}
		return nil, err
	}
	for level, m := range []*ebpf.Map{p.Areas, p.Nested} {
		for slot, cpu := range p.AreaCPUs {
			r, err := ring.NewAreaReader(m, slot, p.AreaPos, 2*slot+level)
			if err != nil {
				return fail(fmt.Errorf("events area of CPU %d: %w", cpu, err))
			}
			rs = append(rs, r)
		}
	}
	return rs, nil
}

// CheckHooks reports, without loading anything, which hooks this kernel
// offers: each tracepoint must exist in the kernel's BTF.
func CheckHooks() []HookStatus {
	kernel, kerr := btf.LoadKernelSpec()
	spec, serr := loadMagnet()
	var out []HookStatus
	for _, h := range Hooks {
		st := HookStatus{Hook: h, Available: true}
		if kerr == nil && serr == nil {
			if missing := missingKfunc(spec.Programs[h.Program], kernel); missing != "" {
				st.Available, st.Reason = false, missing
				out = append(out, st)
				continue
			}
		}
		switch h.Kind {
		case "tp_btf":
			if kerr != nil {
				st.Available, st.Reason = false, "kernel BTF unavailable: "+firstLine(kerr)
				break
			}
			var fn *btf.Typedef
			if err := kernel.TypeByName("btf_trace_"+h.Target, &fn); err != nil {
				st.Available, st.Reason = false, "tracepoint "+h.Target+" not in this kernel"
			}
		case "fentry":
			if kerr != nil {
				st.Available, st.Reason = false, "kernel BTF unavailable: "+firstLine(kerr)
				break
			}
			var fn *btf.Func
			if err := kernel.TypeByName(h.Target, &fn); err != nil {
				st.Available, st.Reason = false, "function "+h.Target+" not in this kernel's BTF"
				break
			}
			if err := tryLoad(h.Program); err != nil {
				st.Available, st.Reason = false, err.Error()
			}
		case "sockops", "cgroup_skb", "cgroup_sock":
			if _, err := Cgroup2Root(); err != nil {
				st.Available, st.Reason = false, err.Error()
			}
		}
		out = append(out, st)
	}
	return out
}

// VerifyHooks loads, without attaching, every program that CheckHooks
// found a hook for, as recording with the default settings loads them:
// a hook whose tracepoint exists may still be refused by the verifier.
// Each refused program is marked unavailable with the verifier's first
// line. Without root nothing can be loaded and the statuses are returned
// as they are, with the reason why.
func VerifyHooks(status []HookStatus) ([]HookStatus, error) {
	if os.Geteuid() != 0 {
		return status, errors.New("programs not loaded: checking them with the verifier needs root")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return status, fmt.Errorf("remove memlock limit: %w", err)
	}
	spec, err := loadMagnet()
	if err != nil {
		return status, err
	}
	avail := map[string]bool{}
	for _, st := range status {
		// fentry was loaded by CheckHooks already.
		if st.Available && st.Kind != "fentry" {
			avail[st.Program] = true
		}
	}
	for name := range spec.Programs {
		if !avail[name] {
			delete(spec.Programs, name)
		}
	}
	if _, err := sizeAreas(spec, []int{0}, os.Getpagesize()); err != nil {
		return status, err
	}
	spec.Maps["control"].MaxEntries = uint32(os.Getpagesize())
	coll, err := ebpf.NewCollection(spec)
	if err == nil {
		coll.Close()
		return status, nil
	}
	// One program refused: find which, one at a time.
	out := slices.Clone(status)
	for i := range out {
		if avail[out[i].Program] {
			if err := tryLoad(out[i].Program); err != nil {
				out[i].Available, out[i].Reason = false, err.Error()
			}
		}
	}
	return out, nil
}

// kfuncSince names the kernel release that added each kernel function the
// programs call, for the reason a hook is unavailable on an older kernel.
var kfuncSince = map[string]string{
	"bpf_rdonly_cast":      "6.2",
	"bpf_cast_to_kern_ctx": "6.2",
}

// missingKfunc says which kernel function the program calls that this
// kernel's BTF lacks ("" when none): such a program fails to load with a
// verifier message that does not say what to upgrade, so the hook is
// reported unavailable beforehand with the release that has it.
func missingKfunc(prog *ebpf.ProgramSpec, kernel *btf.Spec) string {
	if prog == nil {
		return ""
	}
	for _, ins := range prog.Instructions {
		if !ins.IsKfuncCall() {
			continue
		}
		name := ins.Reference() // the ksym the call is linked against
		if name == "" {
			continue
		}
		var kfn *btf.Func
		if err := kernel.TypeByName(name, &kfn); err == nil {
			continue
		}
		if since := kfuncSince[name]; since != "" {
			return "needs the kernel function " + name + " (Linux " + since + "+), absent from this kernel"
		}
		return "needs the kernel function " + name + ", absent from this kernel"
	}
	return ""
}

// tryLoad loads one program (and the maps it uses, made small) to learn
// whether this kernel accepts it: fentry is refused on some kernels (e.g.
// under lockdown) although its target exists.
func tryLoad(program string) error {
	if os.Geteuid() != 0 {
		return errors.New("not known: testing needs root")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("remove memlock limit: %w", err)
	}
	spec, err := loadMagnet()
	if err != nil {
		return err
	}
	for name := range spec.Programs {
		if name != program {
			delete(spec.Programs, name)
		}
	}
	if _, err := sizeAreas(spec, []int{0}, os.Getpagesize()); err != nil {
		return err
	}
	spec.Maps["control"].MaxEntries = uint32(os.Getpagesize())
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		return fmt.Errorf("refused by this kernel: %s", firstLine(err))
	}
	coll.Close()
	return nil
}

// Cgroup2Root finds where the cgroup2 hierarchy is mounted.
func Cgroup2Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("find cgroup2: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts ... - fstype source superopts
		fields := strings.Fields(sc.Text())
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" && len(fields) > 4 && fields[3] == "/" {
				return fields[4], nil
			}
		}
	}
	return "", errors.New("no cgroup2 mount: mount one (mount -t cgroup2 none /sys/fs/cgroup/unified) to trace sockets and IP")
}

// failedProgram names the program a load error is about.
func failedProgram(err error, spec *ebpf.CollectionSpec) string {
	msg := err.Error()
	for name := range spec.Programs {
		if strings.Contains(msg, "program "+name+":") || strings.Contains(msg, "program "+name+" ") {
			return name
		}
	}
	return ""
}

func firstLine(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	// cilium/ebpf's hint is wrong here: the limit was already removed.
	return strings.TrimSuffix(s, " (MEMLOCK may be too low, consider rlimit.RemoveMemlock)")
}

// TaskSuffixSize is the size of struct mg_task, which follows an event in a
// ring record when the reader may not know the event's thread yet (always
// in the control ring), and is not written to traces as such: a ring record
// is exactly its event's size, or that plus TaskSuffixSize.
var TaskSuffixSize = int(reflect.TypeOf(magnetMgTask{}).Size())

// CountersOf sums the per-CPU produced and lost counters by event type: the
// counters map's, and the events each CPU counted in its cpu_states value
// (by area level, without atomics).
func (p *Probe) CountersOf() (produced, lost [event.NumTypes]uint64, err error) {
	var percpu []magnetMgCounters
	if err := p.Counters.Lookup(uint32(0), &percpu); err != nil {
		return produced, lost, fmt.Errorf("read counters: %w", err)
	}
	for _, c := range percpu {
		for i := range produced {
			produced[i] += c.Produced[i]
			lost[i] += c.Lost[i]
		}
	}
	var states []magnetCpuState
	if err := p.coll.Maps["cpu_states"].Lookup(uint32(0), &states); err != nil {
		return produced, lost, fmt.Errorf("read cpu states: %w", err)
	}
	for _, st := range states {
		for _, level := range st.Produced {
			for i := range produced {
				produced[i] += level[i]
			}
		}
	}
	return produced, lost, nil
}

// PendingLoss is what one CPU lost on one ring and has not yet reported in
// the stream.
type PendingLoss struct {
	CPU     int
	Ring    uint32
	FirstNs uint64
	LastNs  uint64
	Counts  [event.NumTypes]uint32
}

// PendingLosses reads the losses not yet written as `lost` records; after
// Detach they are final.
func (p *Probe) PendingLosses() ([]PendingLoss, error) {
	var out []PendingLoss
	for ring := uint32(0); ring < 2; ring++ {
		var percpu []magnetLostState
		if err := p.Lost.Lookup(ring, &percpu); err != nil {
			return nil, fmt.Errorf("read pending losses: %w", err)
		}
		for cpu, ls := range percpu {
			var total uint32
			for _, n := range ls.Counts {
				total += n
			}
			if total == 0 {
				continue
			}
			out = append(out, PendingLoss{CPU: cpu, Ring: ring, FirstNs: ls.FirstNs, LastNs: ls.LastNs, Counts: ls.Counts})
		}
	}
	return out, nil
}

// Missed is what the kernel says of one of magnet's programs: how many
// times it did not run it. A tracepoint program (tp_btf, raw_tp) is
// skipped when it is already running on that CPU, which happens when an
// interrupt over it (or the softirqs run on its way out) reaches its
// tracepoint again; the events of those runs were never produced, so no
// loss count has them.
type Missed struct {
	Program string `json:"program"`
	// RecursionMisses is bpf_prog_info.recursion_misses (Linux 5.12+).
	RecursionMisses uint64 `json:"recursion_misses"`
	// RunCount is bpf_prog_info.run_cnt: 0 unless the kernel's run
	// statistics are on (sysctl kernel.bpf_stats_enabled), which cost every
	// run two clock reads, so magnet does not turn them on.
	RunCount uint64 `json:"run_count,omitempty"`
}

// Unrecorded names the reasons of bpf/lib/unrecorded.h (enum
// mg_unrecorded), in order: packets the device and drop programs saw in
// the recorded network namespace and made no record of.
var Unrecorded = []string{
	"dev_socket_filtered",  // the packet's socket is one the filters leave out
	"dev_address_filtered", // found by address: its ports or its socket left out
	"dev_no_connection",    // no socket of its addresses (or not TCP/UDP), and a filter needs one
	"dev_stale_tuple",      // its addresses name a socket the table no longer has
	"drop_filtered",        // a drop of a socket the filters leave out
	"drop_no_connection",   // a drop with no (full) socket, and a filter needs one
}

// UnrecordedCounts reads, by reason (Unrecorded), the packets the device
// and drop programs left without a record, summed over the CPUs; the
// reasons with none are left out.
func (p *Probe) UnrecordedCounts() (map[string]uint64, error) {
	m := p.coll.Maps["unrecorded"]
	if m == nil {
		return nil, nil
	}
	var percpu []magnetMgUnrecordedCounts
	if err := m.Lookup(uint32(0), &percpu); err != nil {
		return nil, fmt.Errorf("read unrecorded counts: %w", err)
	}
	out := map[string]uint64{}
	for _, c := range percpu {
		for i, n := range c.N {
			if n > 0 && i < len(Unrecorded) {
				out[Unrecorded[i]] += n
			}
		}
	}
	return out, nil
}

// MissedRuns reads the run statistics of every program loaded, in Hooks
// order, with the total of recursion misses. The counts are the programs'
// own, from their load: they cover this recording only.
func (p *Probe) MissedRuns() ([]Missed, uint64, error) {
	var out []Missed
	var total uint64
	for _, st := range p.Status {
		prog := p.coll.Programs[st.Program]
		if prog == nil {
			continue
		}
		s, err := prog.Stats()
		if err != nil {
			return nil, 0, fmt.Errorf("program %s statistics: %w", st.Program, err)
		}
		out = append(out, Missed{Program: st.Program, RecursionMisses: s.RecursionMisses, RunCount: s.RunCount})
		total += s.RecursionMisses
	}
	return out, total, nil
}

// ReadSummaries calls fn with each connection's figures (summary mode):
// one struct mg_conn_summary per CPU from the summaries map, and one more
// with the figures of its socket (SockSummaries, read first), in the
// host's byte order, valid during the call only. The figures of a
// connection are the sum of the values.
func (p *Probe) ReadSummaries(fn func(cookie uint64, perCPU [][]byte) error) error {
	if p.sockIter != nil {
		if err := p.readSockets(); err != nil {
			return err
		}
	}
	var (
		cookie uint64
		vals   []magnetMgConnSummary
		val    magnetMgConnSummary
		bufs   [][]byte
	)
	size := int(unsafe.Sizeof(magnetMgConnSummary{}))
	bytesOf := func(v *magnetMgConnSummary) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(v)), size) }
	// The sockets' figures first, by cookie, so that each connection is
	// given to fn once with all its values.
	socks := map[uint64][]byte{}
	if p.SockSummaries != nil {
		it := p.SockSummaries.Iterate()
		for it.Next(&cookie, &val) {
			socks[cookie] = bytes.Clone(bytesOf(&val))
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read the sockets' summaries: %w", err)
		}
	}
	it := p.Summaries.Iterate()
	for it.Next(&cookie, &vals) {
		for len(bufs) < len(vals)+1 {
			bufs = append(bufs, make([]byte, size))
		}
		for i := range vals {
			copy(bufs[i], bytesOf(&vals[i]))
		}
		n := len(vals)
		if v, ok := socks[cookie]; ok {
			bufs[n] = v
			n++
			delete(socks, cookie)
		}
		if err := fn(cookie, bufs[:n]); err != nil {
			return err
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read summaries: %w", err)
	}
	for cookie, v := range socks {
		if err := fn(cookie, [][]byte{v}); err != nil {
			return err
		}
	}
	return nil
}

// readSockets runs the socket iterator (summary mode): it writes nothing,
// and reads every recorded TCP socket's figures into SockSummaries.
func (p *Probe) readSockets() error {
	r, err := p.sockIter.Open()
	if err != nil {
		return fmt.Errorf("read the sockets: %w", err)
	}
	defer r.Close()
	if _, err := io.Copy(io.Discard, r); err != nil {
		return fmt.Errorf("read the sockets: %w", err)
	}
	return nil
}

// ForgetSummary deletes a connection's figures from the summaries maps and
// returns them as they were deleted (lookup and delete in one step: a
// program adding between a read and a delete would lose its add), one
// value per CPU and the socket's, as ReadSummaries gives them.
func (p *Probe) ForgetSummary(cookie uint64) ([][]byte, error) {
	size := int(unsafe.Sizeof(magnetMgConnSummary{}))
	bytesOf := func(v *magnetMgConnSummary) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(v)), size) }
	var out [][]byte
	if p.Summaries != nil {
		var vals []magnetMgConnSummary
		err := p.Summaries.LookupAndDelete(cookie, &vals)
		switch {
		case err == nil:
			for i := range vals {
				out = append(out, bytes.Clone(bytesOf(&vals[i])))
			}
		case !errors.Is(err, ebpf.ErrKeyNotExist):
			return nil, fmt.Errorf("delete summary of %d: %w", cookie, err)
		}
	}
	if p.SockSummaries != nil {
		var val magnetMgConnSummary
		err := p.SockSummaries.LookupAndDelete(cookie, &val)
		switch {
		case err == nil:
			out = append(out, bytes.Clone(bytesOf(&val)))
		case !errors.Is(err, ebpf.ErrKeyNotExist):
			return nil, fmt.Errorf("delete socket summary of %d: %w", cookie, err)
		}
	}
	return out, nil
}

// pcapProg lays prog out as the BPF object's pcap_prog array: the address
// and mask bytes go into the words as they are in memory.
func pcapProg(prog []pcapfilter.Insn) [pcapfilter.MaxInsns]magnetPcapInsn {
	var out [pcapfilter.MaxInsns]magnetPcapInsn
	for i, in := range prog[:min(len(prog), pcapfilter.MaxInsns)] {
		o := &out[i]
		o.Op, o.End, o.Val = in.Op, in.End, in.Val
		o.Lo, o.Hi, o.Jt, o.Jf = in.Lo, in.Hi, in.JT, in.JF
		for w := range 4 {
			o.Addr[w] = binary.NativeEndian.Uint32(in.Addr[4*w:])
			o.Mask[w] = binary.NativeEndian.Uint32(in.Mask[4*w:])
		}
	}
	return out
}

// DevRuns counts the runs of the device programs on one interface
// (bpf/lib/devruns.h), from the first on it: every run, before the
// program does anything else.
type DevRuns struct {
	Queue       uint64 // net_dev_queue
	QueueDirect uint64 // of which on a tx queue without a qdisc that holds packets
	Xmit        uint64 // net_dev_start_xmit
	Recv        uint64 // netif_receive_skb
}

// DevRunsByInterface reads the device programs' runs by interface, keyed
// netns inode << 32 | ifindex, summed over the CPUs: each CPU counts an
// interface in a slot of its own (dev_run_slots) or, when another took
// that slot, in a table (dev_runs). Interfaces no device program ran on are
// absent.
func (p *Probe) DevRunsByInterface() (map[uint64]DevRuns, error) {
	out := map[uint64]DevRuns{}
	add := func(key uint64, n [4]uint64) {
		r := out[key]
		r.Queue += n[0]
		r.QueueDirect += n[1]
		r.Xmit += n[2]
		r.Recv += n[3]
		out[key] = r
	}
	if m := p.coll.Maps["dev_run_slots"]; m != nil {
		slots, err := readDevRunSlots(m)
		if err != nil {
			return nil, fmt.Errorf("read device program runs: %w", err)
		}
		for _, s := range slots {
			if s.Key != 0 {
				add(s.Key-1, s.Runs.N)
			}
		}
	}
	if m := p.coll.Maps["dev_runs"]; m != nil {
		var key uint64
		var percpu []magnetMgDevRuns
		it := m.Iterate()
		for it.Next(&key, &percpu) {
			for _, c := range percpu {
				add(key, c.N)
			}
		}
		if err := it.Err(); err != nil {
			return nil, fmt.Errorf("read device program runs: %w", err)
		}
	}
	return out, nil
}

// readDevRunSlots returns every CPU's value of every slot of the per-CPU
// array m. One batch lookup reads them all: walking the slots one key at
// a time took two system calls a slot (64 slots, at every comparison of
// the device runs, twice a second or more), most of the recorder's system
// calls while no traffic flowed.
func readDevRunSlots(m *ebpf.Map) ([]magnetMgDevRunSlot, error) {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, err
	}
	n := int(m.MaxEntries())
	keys := make([]uint32, n)
	vals := make([]magnetMgDevRunSlot, n*cpus)
	var cursor ebpf.MapBatchCursor
	got, err := m.BatchLookup(&cursor, keys, vals, nil)
	switch {
	case errors.Is(err, ebpf.ErrNotSupported):
		return iterateDevRunSlots(m)
	case err != nil && !errors.Is(err, ebpf.ErrKeyNotExist):
		return nil, err
	case got != n:
		// An array has every key: a short batch would leave slots unread.
		return nil, fmt.Errorf("batch lookup read %d of %d slots", got, n)
	}
	return vals, nil
}

// iterateDevRunSlots is readDevRunSlots for kernels without batch lookups.
func iterateDevRunSlots(m *ebpf.Map) ([]magnetMgDevRunSlot, error) {
	var out []magnetMgDevRunSlot
	var slot uint32
	var percpu []magnetMgDevRunSlot
	it := m.Iterate()
	for it.Next(&slot, &percpu) {
		out = append(out, percpu...)
	}
	return out, it.Err()
}

// DevAttached says which device programs are attached now, and the count
// of attaches and detaches so far: where it is the same at two reads, the
// programs attached at both stayed attached in between.
func (p *Probe) DevAttached() (queue, xmit, recv bool, attaches uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, st := range p.Status {
		if _, on := p.links[i]; !on {
			continue
		}
		switch st.Program {
		case "net_dev_queue":
			queue = true
		case "net_dev_start_xmit":
			xmit = true
		case "netif_receive_skb":
			recv = true
		}
	}
	return queue, xmit, recv, p.attaches
}
