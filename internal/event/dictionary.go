// SPDX-License-Identifier: Apache-2.0

package event

import (
	"fmt"
	"reflect"
	"strings"
	"unicode"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// fieldKinds gives fields whose kind is not plain from their Go type.
var fieldKinds = map[string]string{
	"laddr":    "ip",
	"raddr":    "ip",
	"reason":   "enum:drop_reason",
	"state":    "enum:tcp_state",
	"ca_state": "enum:ca_state",
	"proto":    "enum:ipproto",
	"l4proto":  "enum:ipproto",
	"data":     "bytes",
}

// Dictionary builds a trace's event dictionary from the Go mirrors of the
// C structs (bpf2go output): one entry per type, its size and every field
// but the common header and padding. Lost records' per-type counts become
// one field per event type, named n_<type>.
func Dictionary(layouts map[Type]reflect.Type) ([]trace.EventType, error) {
	var out []trace.EventType
	for _, in := range Catalogue {
		rt, ok := layouts[in.Type]
		if !ok {
			return nil, fmt.Errorf("no layout for event %s", in.Name)
		}
		et := trace.EventType{ID: uint8(in.Type), Name: in.Name, Group: groupName(in.Group), Size: int(rt.Size())}
		if et.Size%8 != 0 {
			return nil, fmt.Errorf("event %s: size %d is not a multiple of 8", in.Name, et.Size)
		}
		for i := 0; i < rt.NumField(); i++ {
			f := rt.Field(i)
			if f.Name == "_" || f.Name == "Hdr" || strings.HasPrefix(f.Name, "Pad") {
				continue
			}
			if rt.Name() == "magnetMgHdr" {
				break // sock_send/sock_recv: the header only
			}
			name := snake(f.Name)
			if name == "counts" && in.Type == Lost {
				for ti := 0; ti < f.Type.Len(); ti++ {
					ci, ok := ByType(Type(ti))
					if !ok {
						continue
					}
					et.Fields = append(et.Fields, trace.Field{Name: "n_" + ci.Name, Offset: int(f.Offset) + 4*ti, Size: 4, Kind: "u"})
				}
				continue
			}
			if f.Type.Kind() == reflect.Array && f.Type.Elem().Kind() != reflect.Int8 && f.Type.Elem().Kind() != reflect.Uint8 {
				// A histogram: one field per bucket, name_<i>.
				ek, err := kindOf(f.Type.Elem())
				if err != nil {
					return nil, fmt.Errorf("event %s field %s: %w", in.Name, name, err)
				}
				es := int(f.Type.Elem().Size())
				for i := 0; i < f.Type.Len(); i++ {
					et.Fields = append(et.Fields, trace.Field{Name: fmt.Sprintf("%s_%d", name, i), Offset: int(f.Offset) + es*i, Size: es, Kind: ek})
				}
				continue
			}
			kind, err := kindOf(f.Type)
			if err != nil {
				return nil, fmt.Errorf("event %s field %s: %w", in.Name, name, err)
			}
			if k, ok := fieldKinds[name]; ok {
				kind = k
			}
			et.Fields = append(et.Fields, trace.Field{Name: name, Offset: int(f.Offset), Size: int(f.Type.Size()), Kind: kind})
		}
		out = append(out, et)
	}
	return out, nil
}

func kindOf(t reflect.Type) (string, error) {
	switch t.Kind() {
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "u", nil
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "i", nil
	case reflect.Array:
		switch t.Elem().Kind() {
		case reflect.Int8:
			return "str", nil
		case reflect.Uint8:
			return "bytes", nil
		}
	}
	return "", fmt.Errorf("no trace kind for Go type %s", t)
}

func groupName(g Group) string {
	for _, gn := range groupNames {
		if gn.g == g {
			return gn.name
		}
	}
	return ""
}

// snake turns a bpf2go field name (SrttUs, IpId, L3proto) back into the C
// name (srtt_us, ip_id, l3proto).
func snake(s string) string {
	var b strings.Builder
	rs := []rune(s)
	for i, r := range rs {
		if unicode.IsUpper(r) {
			if i > 0 && !unicode.IsUpper(rs[i-1]) {
				b.WriteByte('_')
			}
			b.WriteRune(unicode.ToLower(r))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
