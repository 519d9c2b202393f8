// SPDX-License-Identifier: Apache-2.0

package kevent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

var lostSize = int(reflect.TypeOf(keventKevLost{}).Size())

// TaskSuffixSize is the struct mg_task after every record in the ring.
var TaskSuffixSize = int(reflect.TypeOf(keventMgTask{}).Size())

// Options configure Load.
type Options struct {
	// RingBytes sizes the ring the events share (a power of two, at least
	// a page).
	RingBytes int
	// The recording's filters: applied to events of a task (tracepoints
	// asked for by name, uprobes), not to the system-wide groups.
	TGID     uint32
	CgroupID uint64
	NetNS    uint32
	SelfTGID uint32 // the recorder, never recorded
	// WakeupFill is the ring's fill (a fraction) past which an event wakes
	// the recorder; below it the recorder's periodic poll reads the ring.
	WakeupFill float64
}

// Set is the loaded and attached kernel events of a recording.
type Set struct {
	// Ring holds every event's records, each followed by struct mg_task.
	Ring     *ebpf.Map
	counters *ebpf.Map
	pending  *ebpf.Map
	colls    []*ebpf.Collection
	progs    []*ebpf.Program // by event slot
	links    []link.Link
	events   []*Event
}

// Load loads bpf/kevent.bpf.c once per event, with the event's layout, and
// attaches it. The first load's ring and counters serve all of them. The
// caller must Close the Set.
func Load(events []*Event, opts Options) (s *Set, err error) {
	s = &Set{events: events}
	defer func() {
		if err != nil {
			s.Close()
			s = nil
		}
	}()
	for _, ev := range events {
		spec, err := loadKevent()
		if err != nil {
			return nil, fmt.Errorf("load kernel events object: %w", err)
		}
		prog := "kevent_tp"
		// A kprobe runs the uprobe's program: both are kprobe-type
		// programs given the probed task's registers.
		if ev.Spec.Kind == Uprobe || ev.Spec.Kind == USDT || ev.Spec.Kind == Kprobe {
			prog = "kevent_uprobe"
		}
		for name := range spec.Programs {
			if name != prog {
				delete(spec.Programs, name)
			}
		}
		if err := setVariables(spec, ev, opts); err != nil {
			return nil, fmt.Errorf("%s: %w", ev.Spec, err)
		}
		var copts ebpf.CollectionOptions
		spec.Maps["kev_ring"].MaxEntries = uint32(opts.RingBytes)
		if s.Ring != nil {
			copts.MapReplacements = map[string]*ebpf.Map{"kev_ring": s.Ring, "kev_counters": s.counters, "kev_pending": s.pending}
		}
		coll, err := ebpf.NewCollectionWithOptions(spec, copts)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", ev.Spec, err)
		}
		s.colls = append(s.colls, coll)
		if s.Ring == nil {
			s.Ring, s.counters, s.pending = coll.Maps["kev_ring"], coll.Maps["kev_counters"], coll.Maps["kev_pending"]
		}
		s.progs = append(s.progs, coll.Programs[prog])
	}
	for i, ev := range events {
		var l link.Link
		switch ev.Spec.Kind {
		case Tracepoint:
			l, err = link.Tracepoint(ev.Spec.System, ev.Spec.Name, s.progs[i], nil)
		case Uprobe:
			var ex *link.Executable
			if ex, err = link.OpenExecutable(ev.Spec.Binary); err == nil {
				l, err = ex.Uprobe(ev.Spec.Symbol, s.progs[i], nil)
			}
		case USDT:
			// The kernel counts the probe's semaphore up while attached,
			// so that the program runs the code that feeds the probe.
			var ex *link.Executable
			if ex, err = link.OpenExecutable(ev.Spec.Binary); err == nil {
				l, err = ex.Uprobe("", s.progs[i], &link.UprobeOptions{Address: ev.usdt.Offset, RefCtrOffset: ev.usdt.Semaphore})
			}
		case Kprobe:
			l, err = link.Kprobe(ev.Spec.Name, s.progs[i], nil)
		default:
			err = errors.New("cannot be attached")
		}
		if err != nil {
			return nil, fmt.Errorf("attach %s: %w", ev.Spec, err)
		}
		s.links = append(s.links, l)
	}
	return s, nil
}

func setVariables(spec *ebpf.CollectionSpec, ev *Event, opts Options) error {
	var strs [maxStrs]keventKevStr
	for i, c := range ev.strs {
		strs[i] = keventKevStr{Src: uint16(c.src), Dst: uint16(c.dst), Rel: b2u(c.rel), Text: b2u(c.text)}
	}
	var zero [maxZero]uint16
	copy(zero[:], ev.zero)
	var args [6]keventKevArg
	copy(args[:], ev.args)
	var preds [8]keventKevPred
	for i, p := range ev.preds {
		preds[i] = keventKevPred{Value: p.Value, Off: uint16(p.Field.Offset), Size: uint8(p.Field.Size), Op: uint8(p.Op), IsSigned: b2u(p.Field.Signed), NewTerm: b2u(p.NewTerm)}
	}
	wake := uint64(float64(opts.RingBytes) * opts.WakeupFill)
	if opts.WakeupFill == 0 {
		wake = uint64(opts.RingBytes / 2)
	}
	vars := map[string]any{
		"kev_type":        ev.Type.ID,
		"kev_lost_type":   uint8(LostID),
		"kev_slot":        uint32(ev.Slot),
		"kev_size":        uint32(ev.Type.Size),
		"kev_copy":        uint32(ev.copy),
		"kev_nstrs":       uint32(len(ev.strs)),
		"kev_strs":        strs,
		"kev_nzero":       uint32(len(ev.zero)),
		"kev_zero":        zero,
		"kev_npreds":      uint32(len(ev.preds)),
		"kev_preds":       preds,
		"kev_task_filter": b2u(!ev.Spec.SystemWide),
		"kev_nargs":       uint32(len(ev.args)),
		"kev_args":        args,
		"filter_tgid":     opts.TGID,
		"filter_cgroup":   opts.CgroupID,
		"filter_netns":    opts.NetNS,
		"self_tgid":       opts.SelfTGID,
		"wakeup_bytes":    wake,
	}
	for name, v := range vars {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("object has no variable %s", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	return nil
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// Detach stops every event; what the ring holds stays to be read.
func (s *Set) Detach() {
	for _, l := range s.links {
		l.Close()
	}
	s.links = nil
}

// Close detaches the events and frees the kernel objects.
func (s *Set) Close() error {
	if s == nil {
		return nil
	}
	s.Detach()
	for _, c := range s.colls {
		c.Close()
	}
	s.colls = nil
	return nil
}

// Counters returns, by event slot, the events produced and lost: those the
// programs counted (lost when the ring was full) and the runs the kernel
// skipped because a BPF program was already running on the CPU
// (recursion misses: an interrupt over another tracing program), which
// are both produced and lost.
func (s *Set) Counters() (produced, lost, skipped []uint64, err error) {
	n := len(s.events)
	produced, lost, skipped = make([]uint64, n), make([]uint64, n), make([]uint64, n)
	var percpu []keventKevCounters
	if err := s.counters.Lookup(uint32(0), &percpu); err != nil {
		return nil, nil, nil, fmt.Errorf("read kernel event counters: %w", err)
	}
	for _, c := range percpu {
		for i := 0; i < n; i++ {
			produced[i] += c.Produced[i]
			lost[i] += c.Lost[i]
		}
	}
	for i, p := range s.progs {
		st, err := p.Stats()
		if err != nil {
			continue // before 5.12: no such count
		}
		skipped[i] = st.RecursionMisses
		produced[i] += st.RecursionMisses
		lost[i] += st.RecursionMisses
	}
	return produced, lost, skipped, nil
}

// PendingLosses returns the kevent_lost records the programs could not yet
// write (the ring stayed full until the end), one per CPU that owes one,
// and one more with CPU 65535 for the runs the kernel skipped (skipped, by
// slot, from Counters), so that the trace's own loss records add up to
// every loss.
func (s *Set) PendingLosses(skipped []uint64, now uint64) ([][]byte, error) {
	var percpu []keventKevLost
	if err := s.pending.Lookup(uint32(0), &percpu); err != nil {
		return nil, fmt.Errorf("read kernel event losses: %w", err)
	}
	var out [][]byte
	for cpu, p := range percpu {
		if p.Total == 0 {
			continue
		}
		out = append(out, lostRecord(uint16(cpu), p.FirstNs, p.LastNs, p.Counts[:]))
	}
	var counts [MaxEvents]uint32
	any := false
	for i, n := range skipped {
		counts[i] = uint32(min(n, 1<<32-1))
		any = any || n > 0
	}
	if any {
		out = append(out, lostRecord(0xffff, now, now, counts[:]))
	}
	return out, nil
}

func lostRecord(cpu uint16, first, last uint64, counts []uint32) []byte {
	b := make([]byte, lostSize)
	var total uint32
	for i, n := range counts {
		binary.NativeEndian.PutUint32(b[56+4*i:], n)
		total += n
	}
	binary.NativeEndian.PutUint64(b[0:], last)
	binary.NativeEndian.PutUint32(b[20:], total)
	binary.NativeEndian.PutUint16(b[28:], cpu)
	b[30] = LostID
	binary.NativeEndian.PutUint64(b[32:], first)
	binary.NativeEndian.PutUint64(b[40:], last)
	binary.NativeEndian.PutUint32(b[48:], total)
	return b
}

// LostTotal is the number of events a kevent_lost record counts.
func LostTotal(rec []byte) uint64 {
	return uint64(binary.NativeEndian.Uint32(rec[48:52]))
}
