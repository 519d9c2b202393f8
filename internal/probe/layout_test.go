// SPDX-License-Identifier: Apache-2.0

package probe

import (
	"fmt"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/cilium/ebpf/btf"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/trace"
)

// The C<->Go boundary: every Go mirror the recorder decodes must match the
// C struct in the compiled object's BTF, byte for byte. These tests only
// parse the embedded ELF, so they run unprivileged.

func objectBTF(t *testing.T) *btf.Spec {
	t.Helper()
	spec, err := loadMagnet()
	if err != nil {
		t.Fatalf("parse bpf object: %v", err)
	}
	if spec.Types == nil {
		t.Fatal("bpf object has no BTF")
	}
	return spec.Types
}

func cStruct(t *testing.T, types *btf.Spec, name string) *btf.Struct {
	t.Helper()
	var s *btf.Struct
	if err := types.TypeByName(name, &s); err != nil {
		t.Fatalf("struct %s in BTF: %v", name, err)
	}
	return s
}

// cName turns a bpf2go type name back into the C struct name:
// magnetMgTcpXmit → mg_tcp_xmit.
func cName(goName string) string {
	var b strings.Builder
	for i, r := range strings.TrimPrefix(goName, "magnet") {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

func TestCName(t *testing.T) {
	for goName, want := range map[string]string{
		"magnetMgHdr":         "mg_hdr",
		"magnetMgTcpXmit":     "mg_tcp_xmit",
		"magnetMgIp":          "mg_ip",
		"magnetMgTaskRec":     "mg_task_rec",
		"magnetMgSchedSwitch": "mg_sched_switch",
		"magnetLostState":     "lost_state",
	} {
		if got := cName(goName); got != want {
			t.Errorf("cName(%q) = %q, want %q", goName, got, want)
		}
	}
}

// sameName reports whether a bpf2go field name is the C member name:
// SrttUs ~ srtt_us, Pad ~ _pad.
func sameName(goName, c string) bool {
	return strings.EqualFold(goName, strings.ReplaceAll(c, "_", ""))
}

// compareLayout checks that Go type gt has C struct cs's size and, member by
// member, its names, offsets, sizes and integer kinds, descending into
// nested structs. path names the struct in messages.
func compareLayout(t *testing.T, path string, gt reflect.Type, cs *btf.Struct) {
	t.Helper()
	if gt.Kind() != reflect.Struct {
		t.Errorf("%s: Go type %s is not a struct", path, gt)
		return
	}
	if int(gt.Size()) != int(cs.Size) {
		t.Errorf("%s: Go size %d, C size %d", path, gt.Size(), cs.Size)
	}
	var fields []reflect.StructField
	for i := 0; i < gt.NumField(); i++ {
		// "_" fields are structs.HostLayout markers and padding bpf2go
		// adds where C has implicit padding; the size check covers them.
		if f := gt.Field(i); f.Name != "_" {
			fields = append(fields, f)
		}
	}
	if len(fields) != len(cs.Members) {
		t.Errorf("%s: %d Go fields, %d C members", path, len(fields), len(cs.Members))
		return
	}
	for i, m := range cs.Members {
		f := fields[i]
		where := path + "." + m.Name
		if !sameName(f.Name, m.Name) {
			t.Errorf("%s: Go field %d is %s", where, i, f.Name)
		}
		if m.BitfieldSize != 0 {
			t.Errorf("%s: bitfields cannot be mirrored in Go", where)
			continue
		}
		if m.Offset%8 != 0 || int(m.Offset.Bytes()) != int(f.Offset) {
			t.Errorf("%s: Go offset %d, C offset %d bits", where, f.Offset, m.Offset)
		}
		csize, err := btf.Sizeof(m.Type)
		if err != nil {
			t.Errorf("%s: size of C type: %v", where, err)
			continue
		}
		if csize != int(f.Type.Size()) {
			t.Errorf("%s: Go size %d, C size %d", where, f.Type.Size(), csize)
		}
		compareType(t, where, f.Type, btf.UnderlyingType(m.Type))
	}
}

// compareType checks that a member's Go and C types are of the same kind:
// integers of the same signedness, arrays of the same length, structs
// member by member.
func compareType(t *testing.T, where string, gt reflect.Type, ct btf.Type) {
	t.Helper()
	switch c := ct.(type) {
	case *btf.Struct:
		compareLayout(t, where, gt, c)
	case *btf.Array:
		if gt.Kind() != reflect.Array {
			t.Errorf("%s: C array, Go %s", where, gt)
			return
		}
		if gt.Len() != int(c.Nelems) {
			t.Errorf("%s: Go length %d, C length %d", where, gt.Len(), c.Nelems)
		}
		compareType(t, where+"[]", gt.Elem(), btf.UnderlyingType(c.Type))
	case *btf.Int:
		var signed bool
		switch gt.Kind() {
		case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			signed = true
		case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		default:
			t.Errorf("%s: C integer, Go %s", where, gt)
			return
		}
		if cSigned := c.Encoding&btf.Signed != 0; cSigned != signed {
			t.Errorf("%s: Go %s, C %s (encoding %v)", where, gt, c.Name, c.Encoding)
		}
		if int(c.Size) != int(gt.Size()) {
			t.Errorf("%s: Go %s, C %s of %d bytes", where, gt, c.Name, c.Size)
		}
	default:
		t.Errorf("%s: C type %v has no Go mirror check", where, ct)
	}
}

func TestEventLayoutsMatchBTF(t *testing.T) {
	types := objectBTF(t)
	layouts := Layouts()
	for _, in := range event.Catalogue {
		gt, ok := layouts[in.Type]
		if !ok {
			t.Errorf("Layouts has no type for %s", in.Name)
			continue
		}
		name := cName(gt.Name())
		t.Run(in.Name+"/"+name, func(t *testing.T) {
			cs := cStruct(t, types, name)
			compareLayout(t, name, gt, cs)
			if cs.Size%8 != 0 {
				t.Errorf("struct %s: size %d is not a multiple of 8", name, cs.Size)
			}
			// Every record starts with the common header.
			if name != "mg_hdr" {
				if len(cs.Members) == 0 || cs.Members[0].Name != "hdr" || cs.Members[0].Offset != 0 {
					t.Fatalf("struct %s does not start with struct mg_hdr hdr", name)
				}
				if h, ok := btf.UnderlyingType(cs.Members[0].Type).(*btf.Struct); !ok || h.Name != "mg_hdr" {
					t.Errorf("struct %s: hdr is %v, want struct mg_hdr", name, cs.Members[0].Type)
				}
			}
		})
	}
	if len(layouts) != len(event.Catalogue) {
		t.Errorf("Layouts has %d types, the catalogue %d", len(layouts), len(event.Catalogue))
	}
}

// TestMapValueLayoutsMatchBTF covers the structs the recorder reads from
// maps and the ring buffer besides the records themselves.
func TestMapValueLayoutsMatchBTF(t *testing.T) {
	types := objectBTF(t)
	for _, gt := range []reflect.Type{
		reflect.TypeOf(magnetMgTask{}),
		reflect.TypeOf(magnetMgCounters{}),
		reflect.TypeOf(magnetLostState{}),
	} {
		name := cName(gt.Name())
		compareLayout(t, name, gt, cStruct(t, types, name))
	}
}

func TestTaskSuffixSize(t *testing.T) {
	task := cStruct(t, objectBTF(t), "mg_task")
	if TaskSuffixSize != int(task.Size) {
		t.Errorf("TaskSuffixSize = %d, struct mg_task is %d bytes", TaskSuffixSize, task.Size)
	}
	if TaskSuffixSize%8 != 0 {
		t.Errorf("TaskSuffixSize = %d makes ring records that are not a multiple of 8", TaskSuffixSize)
	}
}

// TestCommonFieldsMatchBTF checks the trace package's fixed description of
// the common header against struct mg_hdr.
func TestCommonFieldsMatchBTF(t *testing.T) {
	hdr := cStruct(t, objectBTF(t), "mg_hdr")
	if int(hdr.Size) != trace.CommonSize {
		t.Errorf("struct mg_hdr is %d bytes, trace.CommonSize %d", hdr.Size, trace.CommonSize)
	}
	if len(hdr.Members) != len(trace.CommonFields) {
		t.Fatalf("struct mg_hdr has %d members, trace.CommonFields %d", len(hdr.Members), len(trace.CommonFields))
	}
	for i, m := range hdr.Members {
		f := trace.CommonFields[i]
		if f.Name != m.Name {
			t.Errorf("common field %d: trace %s, C %s", i, f.Name, m.Name)
		}
		if int(m.Offset.Bytes()) != f.Offset {
			t.Errorf("%s: trace offset %d, C offset %d", m.Name, f.Offset, m.Offset.Bytes())
		}
		size, err := btf.Sizeof(m.Type)
		if err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		if size != f.Size {
			t.Errorf("%s: trace size %d, C size %d", m.Name, f.Size, size)
		}
		in, ok := btf.UnderlyingType(m.Type).(*btf.Int)
		if !ok {
			t.Errorf("%s: C type %v is not an integer", m.Name, m.Type)
			continue
		}
		want := trace.KindUint
		if in.Encoding&btf.Signed != 0 {
			want = trace.KindInt
		}
		if f.Kind != want {
			t.Errorf("%s: trace kind %q, C type %s wants %q", m.Name, f.Kind, in.Name, want)
		}
	}
}

func TestRingBytesPerCPU(t *testing.T) {
	page := os.Getpagesize()
	for _, tc := range []struct{ total, cpus, want int }{
		{8 << 20, 2, 4 << 20},
		{8 << 20, 3, 2 << 20},
		{8 << 20, 64, 128 << 10},
		{page, 2, page},
		{page, 1, page},
		{64 << 10, 2, 32 << 10},
	} {
		if got := RingBytesPerCPU(tc.total, tc.cpus); got != tc.want {
			t.Errorf("RingBytesPerCPU(%d, %d) = %d, want %d", tc.total, tc.cpus, got, tc.want)
		}
	}
}

func TestParseCPUList(t *testing.T) {
	got, err := parseCPUList("0-3,5,7-8")
	if err != nil || !slices.Equal(got, []int{0, 1, 2, 3, 5, 7, 8}) {
		t.Fatalf("parseCPUList = %v, %v", got, err)
	}
	for _, bad := range []string{"", "a", "3-1", "1-", "-1"} {
		if _, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q) accepted", bad)
		}
	}
	if cpus := OnlineCPUs(runtime.NumCPU()); len(cpus) == 0 {
		t.Error("no online CPU")
	}
}

// TestEnumsMatchBTF compares the event package's type and group constants
// (generated from events.h) with the enums in the compiled object's BTF,
// by name: a type or group bit moved in C and not regenerated fails here.
func TestEnumsMatchBTF(t *testing.T) {
	types := objectBTF(t)
	for _, c := range []struct {
		enum, prefix string
		check        func(name string, v uint64) error
	}{
		{"mg_type", "MG_", func(name string, v uint64) error {
			if name == "none" || name == "type_max" {
				return nil
			}
			in, ok := event.ByName(name)
			if !ok || uint64(in.Type) != v {
				return fmt.Errorf("event %s: Go %d (%v), C %d", name, in.Type, ok, v)
			}
			return nil
		}},
		{"mg_group", "MG_G_", func(name string, v uint64) error {
			if got := event.Group(v).Names(); len(got) != 1 || got[0] != name {
				return fmt.Errorf("group %s = %#x in C, in Go %v", name, v, got)
			}
			return nil
		}},
	} {
		var e *btf.Enum
		if err := types.TypeByName(c.enum, &e); err != nil {
			t.Fatalf("enum %s in BTF: %v", c.enum, err)
		}
		for _, v := range e.Values {
			if err := c.check(strings.ToLower(strings.TrimPrefix(v.Name, c.prefix)), v.Value); err != nil {
				t.Error(err)
			}
		}
	}
	for typ, c := range bpfTypes {
		if uint64(typ) != uint64(c) {
			t.Errorf("event type %d, bpf2go's %d", typ, c)
		}
	}
	for g, c := range bpfGroups {
		if uint64(g) != uint64(c) {
			t.Errorf("event group %#x, bpf2go's %#x", g, c)
		}
	}
}

// Every reason of bpf/lib/unrecorded.h has its name.
func TestUnrecordedNames(t *testing.T) {
	if n := len(magnetMgUnrecordedCounts{}.N); len(Unrecorded) != n {
		t.Fatalf("%d names for the %d reasons of enum mg_unrecorded", len(Unrecorded), n)
	}
}
