// SPDX-License-Identifier: Apache-2.0

package record

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/hostcheck"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// buildHeader describes this host, its clock and the recording's settings,
// so that a trace can be read anywhere, later, without magnet's source.
func buildHeader(cfg Config, hooks []probe.HookStatus, hc *hostcheck.Report) (*trace.Header, error) {
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		return nil, fmt.Errorf("build event dictionary: %w", err)
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	host, _ := os.Hostname()
	h := &trace.Header{
		Format:      trace.FormatName,
		Version:     trace.Version,
		Clock:       clockInfo(),
		Host:        host,
		Kernel:      unix.ByteSliceToString(uts.Release[:]),
		Arch:        runtime.GOARCH,
		CPUs:        runtime.NumCPU(),
		CPUModel:    cpuModel(),
		StartWallNs: time.Now().UnixNano(),
		Settings: trace.Settings{
			Events:      cfg.Groups.Names(),
			Filters:     filterSettings(cfg.Filters),
			BufferBytes: cfg.BufferBytes,
			Command:     cfg.Command,
		},
		Common: trace.CommonFields,
		Types:  types,
		Enums:  enums(),
	}
	hookInfo := map[string]string{}
	for _, hs := range hooks {
		state := "attached"
		if !hs.Attached {
			state = "unavailable: " + hs.Reason
			if hs.Reason == "not enabled" {
				continue
			}
		}
		hookInfo[hs.Kind+"/"+hs.Target] = state
	}
	h.Extra = map[string]any{"hooks": hookInfo, "served_by": probe.ServedBy(hooks)}
	if cfg.Summary > 0 {
		// Readers tell a summary recording by this: its data events are
		// conn_summary records, not events.
		h.Extra["summary_interval_ns"] = cfg.Summary.Nanoseconds()
	}
	// Traces of one boot share CLOCK_MONOTONIC: an analysis of several
	// traces can then compare their times directly, not through wall
	// clocks (export.Timeline).
	if id, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		h.Extra["boot_id"] = strings.TrimSpace(string(id))
	}
	// What this host can measure (magnet hostcheck --quick), so that an
	// analysis can say when a trace asks more of its host than it gives.
	if hc != nil {
		h.Extra["hostcheck"] = hc
		h.Extra["host_limits"] = hc.Limits()
	}
	return h, nil
}

func filterSettings(f Filters) map[string]string {
	m := map[string]string{}
	if f.PID > 0 {
		m["pid"] = strconv.Itoa(f.PID)
	}
	if f.Cgroup != "" {
		m["cgroup"] = f.Cgroup
	}
	if f.NetNS != "" {
		m["netns"] = f.NetNS
	}
	if f.Port > 0 {
		m["port"] = strconv.Itoa(f.Port)
	}
	if f.Pcap != "" {
		m["pcap"] = f.Pcap
	}
	if f.CEL != "" {
		m["cel"] = f.CEL
	}
	if len(m) == 0 {
		return nil
	}
	return m
}

// clockInfo gives the clock BPF timestamps come from (bpf_ktime_get_ns is
// CLOCK_MONOTONIC) and the offset that turns it into wall-clock time,
// measured as the middle of a wall reading bracketed by two monotonic ones.
func clockInfo() trace.Clock {
	var res, m1, m2, wall unix.Timespec
	_ = unix.ClockGetres(unix.CLOCK_MONOTONIC, &res)
	best := int64(-1)
	var offset int64
	for i := 0; i < 5; i++ {
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &m1)
		_ = unix.ClockGettime(unix.CLOCK_REALTIME, &wall)
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &m2)
		span := m2.Nano() - m1.Nano()
		if best < 0 || span < best {
			best = span
			offset = wall.Nano() - (m1.Nano()+m2.Nano())/2
		}
	}
	src, _ := os.ReadFile("/sys/devices/system/clocksource/clocksource0/current_clocksource")
	return trace.Clock{
		Source:       "CLOCK_MONOTONIC",
		ResolutionNs: res.Nano(),
		WallOffsetNs: offset,
		Kernel:       strings.TrimSpace(string(src)),
	}
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// enums names the numeric values some fields carry. Drop reasons come from
// this kernel's BTF, since they differ between kernels.
func enums() map[string]map[string]string {
	out := map[string]map[string]string{
		"tcp_state": {"1": "ESTABLISHED", "2": "SYN_SENT", "3": "SYN_RECV", "4": "FIN_WAIT1", "5": "FIN_WAIT2",
			"6": "TIME_WAIT", "7": "CLOSE", "8": "CLOSE_WAIT", "9": "LAST_ACK", "10": "LISTEN", "11": "CLOSING", "12": "NEW_SYN_RECV"},
		"ca_state": {"0": "Open", "1": "Disorder", "2": "CWR", "3": "Recovery", "4": "Loss"},
		"ipproto":  {"1": "icmp", "6": "tcp", "17": "udp", "58": "icmpv6"},
	}
	if spec, err := btf.LoadKernelSpec(); err == nil {
		var e *btf.Enum
		if spec.TypeByName("skb_drop_reason", &e) == nil {
			m := map[string]string{}
			for _, v := range e.Values {
				m[strconv.FormatUint(v.Value, 10)] = strings.TrimPrefix(v.Name, "SKB_DROP_REASON_")
			}
			out["drop_reason"] = m
		}
	}
	return out
}
