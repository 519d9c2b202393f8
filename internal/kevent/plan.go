// SPDX-License-Identifier: Apache-2.0

package kevent

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"

	"github.com/magnet-tracer/magnet/internal/tpformat"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// Limits of the records (bpf/kevent.h).
const (
	// MaxEvents is how many kernel events one recording can take.
	MaxEvents = 64
	// StrLen is how many bytes of a __data_loc field (a device name, a
	// string of variable length) are kept: longer ones are cut.
	StrLen = 64
	// maxStrs, maxZero: __data_loc fields and kernel addresses per event.
	maxStrs = 4
	maxZero = 8
	// LostID is the type id of kevent_lost records, and FirstID that of
	// the first kernel event: above every built-in event type's id
	// (event.NumTypes bounds those).
	LostID  = 63
	FirstID = 64
	// LostName names the loss records of kernel events.
	LostName = "kevent_lost"
)

// Event is one kernel event of a recording, resolved against this kernel.
type Event struct {
	Spec Spec
	// Type is the event's entry in the trace's dictionary.
	Type trace.EventType
	// Slot is the event's index: its counters' and lost counts' slot.
	Slot int
	// Format is a tracepoint's format.
	Format *tpformat.Format
	// Dropped lists the fields not recorded, and why.
	Dropped []string
	preds   []tpformat.Predicate
	args    []keventKevArg // a USDT probe's arguments
	usdt    usdtProbe
	copy    int
	strs    []strCopy
	zero    []uint16
}

type strCopy struct {
	src, dst int
	rel      bool
	text     bool
}

// commonNames are the trace's common header fields: a tracepoint field of
// the same name is recorded as tp_NAME.
var commonNames = map[string]bool{}

func init() {
	for _, f := range trace.CommonFields {
		commonNames[f.Name] = true
	}
}

// tracefsRoot finds tracefs; tests point it at formats of their own.
var tracefsRoot = tpformat.Root

// Plan resolves specs on this kernel: a tracepoint's format from tracefs,
// its filter compiled, every event given a type id and a name no other
// event of the trace has (taken says which names the built-in events
// have). Every problem is one line naming the event.
func Plan(specs []Spec, taken func(name string) bool) ([]*Event, error) {
	if len(specs) > MaxEvents {
		return nil, fmt.Errorf("%d kernel events asked for: at most %d", len(specs), MaxEvents)
	}
	var root string
	names := map[string]bool{LostName: true}
	var out []*Event
	for i, s := range specs {
		ev := &Event{Spec: s, Slot: i}
		var err error
		switch s.Kind {
		case Tracepoint:
			if root == "" {
				if root, err = tracefsRoot(); err != nil {
					return nil, fmt.Errorf("%s: %w", s, err)
				}
			}
			err = ev.planTracepoint(root)
		case Uprobe, USDT:
			err = ev.planUprobe()
		case Kprobe:
			if err = kprobeAvailable(s.Name); err == nil {
				err = ev.planUprobe()
			}
		}
		if err != nil {
			return nil, err
		}
		name := ev.baseName()
		if taken(name) || names[name] {
			name = ev.fullName()
		}
		for n := 2; taken(name) || names[name]; n++ {
			name = ev.fullName() + "_" + strconv.Itoa(n)
		}
		names[name] = true
		ev.Type.ID = uint8(FirstID + i)
		ev.Type.Name = name
		ev.Type.Group = s.Group
		out = append(out, ev)
	}
	return out, nil
}

func (ev *Event) baseName() string {
	switch ev.Spec.Kind {
	case Uprobe:
		return sanitize(ev.Spec.Symbol)
	case Kprobe:
		return sanitize(ev.Spec.Name)
	}
	return sanitize(ev.Spec.Name)
}

func (ev *Event) fullName() string {
	switch ev.Spec.Kind {
	case Uprobe:
		return "uprobe_" + sanitize(ev.Spec.Symbol)
	case USDT:
		return sanitize(ev.Spec.Provider + "_" + ev.Spec.Name)
	case Kprobe:
		return "kprobe_" + sanitize(ev.Spec.Name)
	}
	return sanitize(ev.Spec.System + "_" + ev.Spec.Name)
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	if len(b) > 60 {
		b = b[:60]
	}
	return string(b)
}

// planTracepoint lays out a tracepoint's record: the common header, then
// the raw record's fixed part after its 8 bytes of common fields (so a
// field at raw offset o is at 24 + o), then a StrLen-byte slot for each
// __data_loc field. Pointers are kernel addresses and are blanked; fields
// of no fixed size are dropped.
func (ev *Event) planTracepoint(root string) error {
	s := ev.Spec
	f, err := tpformat.Read(root, s.System, s.Name)
	if err != nil {
		return err
	}
	ev.Format = f
	if ev.preds, err = tpformat.ParseFilter(f, s.Filter); err != nil {
		return fmt.Errorf("tracepoint %s:%s: %w", s.System, s.Name, err)
	}
	fixed := f.Size()
	if fixed > tpformat.MaxRecordBytes {
		return fmt.Errorf("tracepoint %s:%s: its record's fixed part is %d bytes, more than the %d magnet copies", s.System, s.Name, fixed, tpformat.MaxRecordBytes)
	}
	ev.copy = fixed - tpformat.CommonSize
	next := align8(trace.CommonSize + ev.copy)
	const shift = trace.CommonSize - tpformat.CommonSize
	for _, fl := range f.Fields {
		name := fl.Name
		if commonNames[name] {
			name = "tp_" + name
		}
		tf := trace.Field{Name: name, Offset: fl.Offset + shift, Size: fl.Size, CType: fl.CType}
		switch {
		case fl.DataLoc:
			if len(ev.strs) == maxStrs {
				ev.Dropped = append(ev.Dropped, fl.Name+": more than 4 fields of variable length")
				continue
			}
			ev.strs = append(ev.strs, strCopy{src: fl.Offset, dst: next, rel: fl.RelLoc, text: fl.Char()})
			tf.Offset, tf.Size, tf.Kind = next, StrLen, trace.KindBytes
			if fl.Char() {
				tf.Kind = trace.KindStr
			}
			next += StrLen
		case fl.Pointer():
			if fl.Size != 8 || fl.Offset%8 != 0 || len(ev.zero) == maxZero {
				return fmt.Errorf("tracepoint %s:%s: field %s (%s) is a kernel address magnet cannot blank", s.System, s.Name, fl.Name, fl.CType)
			}
			ev.zero = append(ev.zero, uint16(fl.Offset+shift))
			ev.Dropped = append(ev.Dropped, fl.Name+": a kernel address, never recorded")
			continue
		case fl.Size == 0:
			ev.Dropped = append(ev.Dropped, fl.Name+": no fixed size")
			continue
		case fl.Integer():
			tf.Kind = trace.KindUint
			if fl.Signed {
				tf.Kind = trace.KindInt
			}
		case fl.Char():
			tf.Kind = trace.KindStr
		default:
			tf.Kind = trace.KindBytes
		}
		ev.Type.Fields = append(ev.Type.Fields, tf)
	}
	ev.Type.Size = align8(next)
	return nil
}

// planUprobe lays out a uprobe's or kprobe's record: the six argument
// registers of the calling convention, read from the same pt_regs.
func (ev *Event) planUprobe() error {
	if runtime.GOARCH != "amd64" {
		return fmt.Errorf("%s: uprobes and kprobes record x86-64 registers; this is %s", ev.Spec, runtime.GOARCH)
	}
	if ev.Spec.Kind == USDT {
		return ev.planUSDT()
	}
	for i := 0; i < 6; i++ {
		ev.Type.Fields = append(ev.Type.Fields, trace.Field{Name: "arg" + strconv.Itoa(i), Offset: trace.CommonSize + 8*i, Size: 8, Kind: trace.KindUint})
	}
	ev.Type.Size = trace.CommonSize + 6*8
	return nil
}

func align8(n int) int { return (n + 7) &^ 7 }

// Dictionary is the trace's dictionary entries of events: each event's
// type, and kevent_lost, whose n_NAME fields count each event's losses.
func Dictionary(events []*Event) []trace.EventType {
	if len(events) == 0 {
		return nil
	}
	lost := trace.EventType{ID: LostID, Name: LostName, Group: "kevent", Size: lostSize, Fields: []trace.Field{
		{Name: "first_ns", Offset: 32, Size: 8, Kind: trace.KindUint},
		{Name: "last_ns", Offset: 40, Size: 8, Kind: trace.KindUint},
		{Name: "total", Offset: 48, Size: 4, Kind: trace.KindUint},
	}}
	out := []trace.EventType{lost}
	for _, ev := range events {
		out[0].Fields = append(out[0].Fields, trace.Field{Name: "n_" + ev.Type.Name, Offset: 56 + 4*ev.Slot, Size: 4, Kind: trace.KindUint})
		out = append(out, ev.Type)
	}
	return out
}

// Describe says what an event records, for the recorder's start-up notes.
func (ev *Event) Describe() string {
	var fs []string
	for _, f := range ev.Type.Fields {
		fs = append(fs, f.Name)
	}
	d := fmt.Sprintf("%s as %s (%d bytes: %s)", ev.Spec, ev.Type.Name, ev.Type.Size, strings.Join(fs, ", "))
	if len(ev.Dropped) > 0 {
		d += "; not recorded: " + strings.Join(ev.Dropped, "; ")
	}
	return d
}
