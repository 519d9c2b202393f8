// SPDX-License-Identifier: Apache-2.0

// Package trace reads and writes magnet's trace files.
//
// A trace file is self-describing: a short binary preamble, a JSON header
// that carries the recording's facts and the dictionary of event types, then
// blocks of fixed-size binary records, then an end block with a JSON
// summary. Records are stored in the byte order of the machine that wrote
// them; a Reader translates them into the native byte order of the machine
// that reads them. docs/FORMAT.md describes the layout byte by byte.
//
// A file without an end block was cut short (the recorder was killed, the
// machine lost power or the disk filled up). Such a file is still readable:
// the Reader returns every record of every complete block and reports where
// the cut-short data begins.
package trace

import (
	"errors"
	"fmt"
	"strings"
)

// FormatName is the value of Header.Format in every trace file.
const FormatName = "magnet-trace"

// Version is the format version this package writes and the only one it reads.
const Version = 1

// CommonSize is the size in bytes of the common header every record starts with.
const CommonSize = 32

// MaxRecordSize is the largest record size a dictionary may declare.
const MaxRecordSize = 64 << 10

// Field kinds. An enum field's kind is KindEnumPrefix followed by the name of
// its table in Header.Enums, for example "enum:drop_reason".
const (
	KindUint       = "u"     // unsigned integer of 1, 2, 4 or 8 bytes, writer byte order
	KindInt        = "i"     // signed integer of 1, 2, 4 or 8 bytes, writer byte order
	KindStr        = "str"   // text padded with NUL bytes
	KindIP         = "ip"    // 16-byte address in network byte order
	KindBytes      = "bytes" // raw bytes, never swapped
	KindEnumPrefix = "enum:" // unsigned integer whose names are in Header.Enums
)

// CommonFields is the layout of the 32-byte header every record starts with.
// It is fixed by the BPF side (bpf/events.h). Writers copy it into
// Header.Common so that readers in other languages need nothing hard-coded,
// and this package's Reader rejects a file whose Header.Common differs.
var CommonFields = []Field{
	{Name: "time_ns", Offset: 0, Size: 8, Kind: KindUint},
	{Name: "conn", Offset: 8, Size: 8, Kind: KindUint},
	{Name: "tid", Offset: 16, Size: 4, Kind: KindUint},
	{Name: "size", Offset: 20, Size: 4, Kind: KindInt},
	{Name: "netns", Offset: 24, Size: 4, Kind: KindUint},
	{Name: "cpu", Offset: 28, Size: 2, Kind: KindUint},
	{Name: "type", Offset: 30, Size: 1, Kind: KindUint},
	{Name: "flags", Offset: 31, Size: 1, Kind: KindUint},
}

// Offsets of the common header fields that this package reads directly.
const (
	offTime  = 0
	offConn  = 8
	offTID   = 16
	offSize  = 20
	offNetNS = 24
	offCPU   = 28
	offType  = 30
	offFlags = 31
)

// Header is the JSON header of a trace file: the facts of the recording and
// the dictionary that gives the layout of every record.
type Header struct {
	Format      string                       `json:"format"` // always FormatName
	Version     int                          `json:"version"`
	Clock       Clock                        `json:"clock"`
	Host        string                       `json:"host"`
	Kernel      string                       `json:"kernel"`
	Arch        string                       `json:"arch"`
	CPUs        int                          `json:"cpus"`
	CPUModel    string                       `json:"cpu_model"`
	StartWallNs int64                        `json:"start_wall_ns"` // wall-clock ns since the Unix epoch when recording started
	Settings    Settings                     `json:"settings"`
	Common      []Field                      `json:"common"`          // layout of the common record header
	Types       []EventType                  `json:"types"`           // the event dictionary
	Enums       map[string]map[string]string `json:"enums,omitempty"` // enum name → decimal value → name
	Extra       map[string]any               `json:"extra,omitempty"` // room for later additions
}

// Clock describes the clock that stamped the records' time_ns.
type Clock struct {
	Source       string `json:"source"`                       // e.g. "CLOCK_MONOTONIC" (bpf_ktime_get_ns)
	ResolutionNs int64  `json:"resolution_ns"`                // from clock_getres
	WallOffsetNs int64  `json:"wall_offset_ns"`               // wall-clock ns since the Unix epoch = time_ns + WallOffsetNs
	Kernel       string `json:"kernel_clocksource,omitempty"` // e.g. "tsc"
}

// Settings records how the trace was taken.
type Settings struct {
	Events      []string          `json:"events"`
	Filters     map[string]string `json:"filters,omitempty"`
	BufferBytes int               `json:"buffer_bytes"`
	Command     []string          `json:"command,omitempty"`
}

// EventType is one entry of the event dictionary.
type EventType struct {
	ID     uint8   `json:"id"`     // the byte at offset 30 of each record of this type
	Name   string  `json:"name"`   // e.g. "tcp_xmit"
	Group  string  `json:"group"`  // e.g. "tcp"
	Size   int     `json:"size"`   // whole record size in bytes, common header included; a multiple of 8
	Fields []Field `json:"fields"` // event-specific fields; offsets count from the record start
}

// Field describes one field of a record.
type Field struct {
	Name   string `json:"name"`
	Offset int    `json:"offset"` // from the start of the record
	Size   int    `json:"size"`   // in bytes
	Kind   string `json:"kind"`   // one of the Kind constants, or "enum:NAME"
	// CType is the kernel's C type of a field of a kernel event recorded
	// from its tracefs format ("unsigned int", "__data_loc char[]"):
	// informative only, Kind says how to decode it.
	CType string `json:"ctype,omitempty"`
}

// Enum returns the name of f's enum table when f is an enum field, and ""
// otherwise.
func (f Field) Enum() string {
	name, ok := strings.CutPrefix(f.Kind, KindEnumPrefix)
	if !ok {
		return ""
	}
	return name
}

// isInteger reports whether f holds an integer in the writer's byte order,
// which is the case for the kinds "u", "i" and "enum:NAME".
func (f Field) isInteger() bool {
	return f.Kind == KindUint || f.Kind == KindInt || strings.HasPrefix(f.Kind, KindEnumPrefix)
}

// TypeByID returns the dictionary entry with the given id, or nil.
func (h *Header) TypeByID(id uint8) *EventType {
	for i := range h.Types {
		if h.Types[i].ID == id {
			return &h.Types[i]
		}
	}
	return nil
}

// TypeByName returns the dictionary entry with the given name, or nil.
func (h *Header) TypeByName(name string) *EventType {
	for i := range h.Types {
		if h.Types[i].Name == name {
			return &h.Types[i]
		}
	}
	return nil
}

// HostLimit returns one of the figures the recording host measured of
// itself, as magnet record puts them in extra.host_limits (clock_step_ns,
// send_cost_ns, memcpy_gbps, idle_wakeup_ns: docs/FORMAT.md), or 0 when the
// trace does not have it.
func (h *Header) HostLimit(key string) float64 {
	lim, _ := h.Extra["host_limits"].(map[string]any)
	v, _ := lim[key].(float64)
	return v
}

// EnumName returns the name of value v of enum field f, looked up in
// h.Enums. It reports false when f is not an enum field or the value has no
// name.
func (h *Header) EnumName(f Field, v uint64) (string, bool) {
	table, ok := h.Enums[f.Enum()]
	if !ok {
		return "", false
	}
	name, ok := table[fmt.Sprint(v)]
	return name, ok
}

// Field returns the field with the given name: one of t's own fields or one
// of CommonFields.
func (t *EventType) Field(name string) (Field, bool) {
	for _, f := range t.Fields {
		if f.Name == name {
			return f, true
		}
	}
	for _, f := range CommonFields {
		if f.Name == name {
			return f, true
		}
	}
	return Field{}, false
}

// Bounds on what a header may hold (docs/FORMAT.md, "Bounds"). A Reader
// rejects a header beyond them and a Writer never writes one: exports repeat
// the header's strings into every row (a host name of megabytes made
// gigabytes of Parquet) and make a column of every field (Parquet takes at
// most 65,534).
const (
	// MaxHeaderString bounds host, kernel, arch, cpu_model and the clock's
	// names, in bytes.
	MaxHeaderString = 256
	// MaxName bounds the names of event types, groups, fields and enum
	// tables and values, in bytes.
	MaxName = 128
	// MaxFields bounds the fields of the whole dictionary.
	MaxFields = 4096
	// MaxEnumValues bounds the entries of one enum table.
	MaxEnumValues = 1 << 16
	// MaxSetting bounds each string of Settings (events, filters, the
	// recorded command's arguments): the kernel's own bound on one
	// argument (MAX_ARG_STRLEN), so that any command it runs can be
	// recorded. Their number is bounded by the header's size.
	MaxSetting = 128 << 10
)

// checkBounds checks h against the bounds above.
func (h *Header) checkBounds() error {
	for _, s := range []struct{ name, v string }{
		{"host", h.Host}, {"kernel", h.Kernel}, {"arch", h.Arch}, {"cpu_model", h.CPUModel},
		{"clock source", h.Clock.Source}, {"kernel clocksource", h.Clock.Kernel},
	} {
		if len(s.v) > MaxHeaderString {
			return fmt.Errorf("%s is %d bytes, more than the limit of %d", s.name, len(s.v), MaxHeaderString)
		}
	}
	fields := 0
	for _, t := range h.Types {
		if len(t.Name) > MaxName || len(t.Group) > MaxName {
			return fmt.Errorf("event type %.32q...: name or group longer than %d bytes", t.Name, MaxName)
		}
		for _, f := range t.Fields {
			if len(f.Name) > MaxName || len(f.Kind) > MaxName+len(KindEnumPrefix) {
				return fmt.Errorf("event type %s: field %.32q...: name or kind longer than %d bytes", t.Name, f.Name, MaxName)
			}
		}
		fields += len(t.Fields)
	}
	if fields > MaxFields {
		return fmt.Errorf("the dictionary has %d fields, more than the limit of %d", fields, MaxFields)
	}
	if len(h.Enums) > MaxFields {
		return fmt.Errorf("%d enum tables, more than the limit of %d", len(h.Enums), MaxFields)
	}
	for name, table := range h.Enums {
		if len(name) > MaxName {
			return fmt.Errorf("enum table %.32q...: name longer than %d bytes", name, MaxName)
		}
		if len(table) > MaxEnumValues {
			return fmt.Errorf("enum table %s has %d entries, more than the limit of %d", name, len(table), MaxEnumValues)
		}
		for k, v := range table {
			if len(k) > MaxName || len(v) > MaxName {
				return fmt.Errorf("enum table %s: entry %.32q...: longer than %d bytes", name, k, MaxName)
			}
		}
	}
	set := h.Settings
	strs := append(append([]string(nil), set.Events...), set.Command...)
	for k, v := range set.Filters {
		strs = append(strs, k, v)
	}
	for _, v := range strs {
		if len(v) > MaxSetting {
			return fmt.Errorf("a setting is %d bytes, more than the limit of %d", len(v), MaxSetting)
		}
	}
	return nil
}

// validate checks everything a Reader relies on: the format name and
// version, the common header layout, the bounds and the dictionary.
func (h *Header) validate() error {
	if err := h.checkBounds(); err != nil {
		return err
	}
	if h.Format != FormatName {
		return fmt.Errorf("format is %q, want %q", h.Format, FormatName)
	}
	if h.Version != Version {
		return fmt.Errorf("version is %d, want %d", h.Version, Version)
	}
	if len(h.Common) != len(CommonFields) {
		return errors.New("common record header differs from format version 1")
	}
	for i, f := range h.Common {
		if f != CommonFields[i] {
			return fmt.Errorf("common field %q differs from format version 1", f.Name)
		}
	}
	return validateTypes(h.Types)
}

// validateTypes checks the dictionary: unique ids and names, sizes that are
// multiples of 8 and at least CommonSize, and fields that lie inside the
// record, after the common header, with a known kind and a size that suits it.
func validateTypes(types []EventType) error {
	var seenID [256]bool
	seenName := make(map[string]bool, len(types))
	for i := range types {
		t := &types[i]
		if t.Name == "" {
			return fmt.Errorf("event type %d has no name", t.ID)
		}
		if seenID[t.ID] {
			return fmt.Errorf("event type id %d is used twice", t.ID)
		}
		seenID[t.ID] = true
		if seenName[t.Name] {
			return fmt.Errorf("event type name %q is used twice", t.Name)
		}
		seenName[t.Name] = true
		if t.Size < CommonSize || t.Size > MaxRecordSize || t.Size%8 != 0 {
			return fmt.Errorf("event type %s: size %d is not a multiple of 8 between %d and %d", t.Name, t.Size, CommonSize, MaxRecordSize)
		}
		fieldNames := make(map[string]bool, len(t.Fields))
		for _, f := range t.Fields {
			if err := validateField(t, f); err != nil {
				return fmt.Errorf("event type %s: %w", t.Name, err)
			}
			if fieldNames[f.Name] {
				return fmt.Errorf("event type %s: field %q is declared twice", t.Name, f.Name)
			}
			fieldNames[f.Name] = true
		}
	}
	return nil
}

func validateField(t *EventType, f Field) error {
	if f.Name == "" {
		return fmt.Errorf("field at offset %d has no name", f.Offset)
	}
	for _, c := range CommonFields {
		if c.Name == f.Name {
			return fmt.Errorf("field %q repeats a common header field", f.Name)
		}
	}
	if f.Offset < CommonSize || f.Size <= 0 || f.Offset > t.Size-f.Size {
		return fmt.Errorf("field %s (offset %d, size %d) lies outside bytes %d to %d of the record", f.Name, f.Offset, f.Size, CommonSize, t.Size)
	}
	switch {
	case f.isInteger():
		if f.Kind == KindEnumPrefix {
			return fmt.Errorf("field %s: enum kind without a table name", f.Name)
		}
		if f.Size != 1 && f.Size != 2 && f.Size != 4 && f.Size != 8 {
			return fmt.Errorf("field %s: integer size %d is not 1, 2, 4 or 8", f.Name, f.Size)
		}
	case f.Kind == KindIP:
		if f.Size != 16 {
			return fmt.Errorf("field %s: ip size %d is not 16", f.Name, f.Size)
		}
	case f.Kind == KindStr, f.Kind == KindBytes:
	default:
		return fmt.Errorf("field %s: unknown kind %q", f.Name, f.Kind)
	}
	return nil
}

// Summary is the JSON payload of the end block.
type Summary struct {
	EndWallNs int64             `json:"end_wall_ns"` // wall-clock ns since the Unix epoch when recording ended
	Events    map[string]uint64 `json:"events"`      // records in the file, by type name
	Lost      uint64            `json:"lost"`        // events the kernel dropped before they reached the file
	// Missed counts the runs of the recorder's BPF programs the kernel
	// skipped (recursion protection), whose events were never made; nil in
	// traces written before it was counted, which cannot say.
	Missed *uint64 `json:"missed,omitempty"`
	// KernelSkipped counts the device program runs the kernel did not make
	// for frames the recorded interfaces counted (docs/EVENTS.md, Loss
	// accounting; by interface in Extra["kernel_skipped_by_interface"]);
	// nil in traces written before it was counted, which cannot say.
	KernelSkipped *uint64        `json:"kernel_skipped,omitempty"`
	Blocks        uint64         `json:"blocks"` // data blocks in the file
	Extra         map[string]any `json:"extra,omitempty"`
}
