// SPDX-License-Identifier: Apache-2.0

// Package tpformat reads the kernel's description of a tracepoint's record
// (tracefs: events/SYSTEM/NAME/format) and tells which of its fields can be
// recorded and how a trace's dictionary describes them. It also compiles
// the filters users write on those fields into the predicates magnet's BPF
// program checks in the kernel.
package tpformat

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// CommonSize is the size of the fields every tracepoint record starts with
// (common_type, common_flags, common_preempt_count, common_pid): magnet's
// own record header already says what they say.
const CommonSize = 8

// MaxRecordBytes bounds the fixed part of a tracepoint record that one
// event copies; a tracepoint whose fields reach beyond it cannot be
// recorded whole.
const MaxRecordBytes = 256

// maxFormatBytes bounds the format text Parse accepts.
const maxFormatBytes = 64 << 10

// Field is one field of a tracepoint's record, as tracefs lists it.
type Field struct {
	Name   string // e.g. "work"
	CType  string // the C type as tracefs gives it, e.g. "__data_loc char[]", "struct napi_struct *"
	Offset int    // in the raw record, common fields included
	Size   int    // bytes in the fixed part (4 for a __data_loc)
	Signed bool
	// ArrayLen is the element count of a fixed array ("char comm[16]"),
	// 0 if the field is not one.
	ArrayLen int
	// DataLoc is a __data_loc (or __rel_loc) field: a 32-bit word whose
	// low half is where its data lies in the record (from the record's
	// start, or from the end of the word for __rel_loc) and whose high
	// half is its length.
	DataLoc bool
	RelLoc  bool
}

// Pointer says whether the field is a pointer: a kernel address, which
// magnet never records.
func (f Field) Pointer() bool {
	return strings.Contains(f.CType, "*") && !f.DataLoc
}

// Char says whether the field's elements are characters: text.
func (f Field) Char() bool {
	t := strings.TrimSuffix(strings.TrimSpace(f.baseType()), "[]")
	t = strings.TrimPrefix(t, "const ")
	switch strings.TrimSpace(t) {
	case "char", "signed char", "unsigned char":
		return f.ArrayLen > 0 || f.DataLoc
	}
	return false
}

func (f Field) baseType() string {
	t := strings.TrimPrefix(f.CType, "__data_loc ")
	return strings.TrimPrefix(t, "__rel_loc ")
}

// Integer says whether the field is a plain integer of 1, 2, 4 or 8 bytes.
func (f Field) Integer() bool {
	if f.DataLoc || f.ArrayLen > 0 || f.Pointer() {
		return false
	}
	switch f.Size {
	case 1, 2, 4, 8:
		return true
	}
	return false
}

// Format is a tracepoint's record layout.
type Format struct {
	System, Name string
	ID           uint32 // the tracepoint's id (its perf event config)
	Common       []Field
	Fields       []Field // the tracepoint's own fields, in record order
	PrintFmt     string
}

// Size is the size of the record's fixed part: the end of its last field.
func (f *Format) Size() int {
	n := CommonSize
	for _, fl := range f.Fields {
		n = max(n, fl.Offset+fl.Size)
	}
	return n
}

// Field returns the field called name.
func (f *Format) Field(name string) (Field, bool) {
	for _, fl := range f.Fields {
		if fl.Name == name {
			return fl, true
		}
	}
	return Field{}, false
}

// Parse parses the text of a tracefs format file. system and name are the
// tracepoint's, for messages: the text's own name line must agree.
func Parse(system, name string, text []byte) (*Format, error) {
	if len(text) > maxFormatBytes {
		return nil, fmt.Errorf("format of %s:%s: %d bytes, more than %d", system, name, len(text), maxFormatBytes)
	}
	f := &Format{System: system, Name: name}
	seenName, seenID := false, false
	for i, line := range strings.Split(string(text), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || line == "format:":
		case strings.HasPrefix(line, "name:"):
			n := strings.TrimSpace(strings.TrimPrefix(line, "name:"))
			if name != "" && n != name {
				return nil, fmt.Errorf("format of %s:%s: names %q", system, name, n)
			}
			f.Name, seenName = n, true
		case strings.HasPrefix(line, "ID:"):
			id, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(line, "ID:")), 10, 32)
			if err != nil {
				return nil, fmt.Errorf("format of %s:%s, line %d: bad ID", system, name, i+1)
			}
			f.ID, seenID = uint32(id), true
		case strings.HasPrefix(line, "field:"):
			fl, err := parseField(line)
			if err != nil {
				return nil, fmt.Errorf("format of %s:%s, line %d: %w", system, name, i+1, err)
			}
			if strings.HasPrefix(fl.Name, "common_") {
				f.Common = append(f.Common, fl)
				continue
			}
			if fl.Offset < CommonSize {
				return nil, fmt.Errorf("format of %s:%s, line %d: field %s at offset %d, inside the common fields", system, name, i+1, fl.Name, fl.Offset)
			}
			for _, o := range f.Fields {
				if o.Name == fl.Name {
					return nil, fmt.Errorf("format of %s:%s, line %d: field %s twice", system, name, i+1, fl.Name)
				}
			}
			f.Fields = append(f.Fields, fl)
		case strings.HasPrefix(line, "print fmt:"):
			f.PrintFmt = strings.TrimSpace(strings.TrimPrefix(line, "print fmt:"))
		default:
			return nil, fmt.Errorf("format of %s:%s, line %d: unexpected %q", system, name, i+1, clip(line))
		}
	}
	if !seenName || !seenID {
		return nil, fmt.Errorf("format of %s:%s: no name or ID line", system, name)
	}
	return f, nil
}

// parseField parses "field:TYPE NAME;\toffset:N;\tsize:N;\tsigned:N;".
func parseField(line string) (Field, error) {
	var fl Field
	parts := strings.Split(line, ";")
	decl := strings.TrimSpace(strings.TrimPrefix(parts[0], "field:"))
	seen := map[string]bool{}
	for _, p := range parts[1:] {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		k, v, ok := strings.Cut(p, ":")
		if !ok {
			return fl, fmt.Errorf("field %q: bad attribute %q", clip(decl), clip(p))
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n > maxFormatBytes {
			return fl, fmt.Errorf("field %q: bad %s %q", clip(decl), k, clip(v))
		}
		switch strings.TrimSpace(k) {
		case "offset":
			fl.Offset = n
		case "size":
			fl.Size = n
		case "signed":
			fl.Signed = n != 0
		default:
			continue // a later kernel's attribute
		}
		seen[strings.TrimSpace(k)] = true
	}
	if !seen["offset"] || !seen["size"] {
		return fl, fmt.Errorf("field %q: no offset or size", clip(decl))
	}
	// The name is the declaration's last word, with the array length, if
	// any, after it: "char comm[16]", "__data_loc char[] name".
	i := strings.LastIndexAny(decl, " \t*")
	if i < 0 || i == len(decl)-1 {
		return fl, fmt.Errorf("field %q: no type and name", clip(decl))
	}
	typ, name := strings.TrimSpace(decl[:i+1]), decl[i+1:]
	if j := strings.IndexByte(name, '['); j >= 0 {
		if !strings.HasSuffix(name, "]") {
			return fl, fmt.Errorf("field %q: bad array", clip(decl))
		}
		dim := name[j+1 : len(name)-1]
		name = name[:j]
		n, err := strconv.Atoi(dim)
		if err != nil || n <= 0 {
			// "[FOO_LEN]" unexpanded: the size still says how big it is.
			n = 1
		}
		fl.ArrayLen = n
		typ += " []"
	}
	if !validName(name) || typ == "" {
		return fl, fmt.Errorf("field %q: bad name", clip(decl))
	}
	fl.Name, fl.CType = name, typ
	switch {
	case strings.HasPrefix(typ, "__data_loc "):
		fl.DataLoc = true
	case strings.HasPrefix(typ, "__rel_loc "):
		fl.DataLoc, fl.RelLoc = true, true
	}
	if fl.DataLoc && fl.Size != 4 {
		return fl, fmt.Errorf("field %s: a %s of %d bytes, want 4", name, typ, fl.Size)
	}
	if fl.Size == 0 && !fl.DataLoc {
		// A flexible array at the end of the record: nothing fixed to copy.
		fl.ArrayLen = 0
	}
	return fl, nil
}

func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i, r := range s {
		switch {
		case r == '_', r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

func clip(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

// ErrUnknown means the kernel has no such tracepoint.
var ErrUnknown = errors.New("no such tracepoint")

// Find returns where tracefs is mounted, or "" if nowhere.
func Find() string {
	for _, dir := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
		if _, err := os.Stat(filepath.Join(dir, "events")); err == nil {
			return dir
		}
	}
	return ""
}

// Root returns the tracefs mount point, mounting tracefs at
// /sys/kernel/tracing if it is mounted nowhere (root only). The mount is
// the kernel's usual one and is left in place, as systemd would make it.
func Root() (string, error) {
	if dir := Find(); dir != "" {
		return dir, nil
	}
	dir := "/sys/kernel/tracing"
	if err := unix.Mount("tracefs", dir, "tracefs", 0, ""); err != nil {
		return "", fmt.Errorf("mount tracefs at %s: %w", dir, err)
	}
	return dir, nil
}

// Read reads and parses the format of tracepoint system:name from tracefs
// at root. A tracepoint the kernel does not have is ErrUnknown.
func Read(root, system, name string) (*Format, error) {
	if !validName(system) || !validName(name) {
		return nil, fmt.Errorf("tracepoint %s:%s: %w", system, name, ErrUnknown)
	}
	text, err := os.ReadFile(filepath.Join(root, "events", system, name, "format"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("tracepoint %s:%s: %w (see %s/available_events)", system, name, ErrUnknown, root)
	}
	if err != nil {
		return nil, fmt.Errorf("tracepoint %s:%s: %w", system, name, err)
	}
	return Parse(system, name, text)
}
