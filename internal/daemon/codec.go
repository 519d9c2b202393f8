// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"strconv"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// fieldKind is how the API shows a field: addresses as text, enums by
// name, bytes as hex, integers as numbers.
type fieldKind uint8

const (
	kindUint fieldKind = iota
	kindInt
	kindIP
	kindStr
	kindBytes
	kindEnum
)

// fieldCodec is one field of an event type, resolved once per recording so
// that the per-event paths never look a field up by name.
type fieldCodec struct {
	name   string
	key    []byte // "name": ready to append
	kind   fieldKind
	offset int
	size   int
	enum   map[uint64]string // kindEnum: the recording's names
}

// typeCodec decodes and encodes the fields of one event type.
type typeCodec struct {
	fields []fieldCodec
	family int // index in fields of "family", -1 if none
	caplen int // the same for "caplen"
}

// enumTables turns the header's enum tables (decimal text keys) into
// number-keyed maps, once per recording.
func enumTables(hdr *trace.Header) map[string]map[uint64]string {
	out := map[string]map[uint64]string{}
	for name, table := range hdr.Enums {
		m := make(map[uint64]string, len(table))
		for k, v := range table {
			if n, err := strconv.ParseUint(k, 10, 64); err == nil {
				m[n] = v
			}
		}
		out[name] = m
	}
	return out
}

func newTypeCodec(et *trace.EventType, enums map[string]map[uint64]string) *typeCodec {
	c := &typeCodec{family: -1, caplen: -1}
	for _, f := range et.Fields {
		fc := fieldCodec{name: f.Name, key: append(appendString(nil, f.Name), ':'), offset: f.Offset, size: f.Size}
		switch {
		case f.Kind == trace.KindIP:
			fc.kind = kindIP
		case f.Kind == trace.KindStr:
			fc.kind = kindStr
		case f.Kind == trace.KindBytes:
			fc.kind = kindBytes
		case f.Enum() != "":
			fc.kind, fc.enum = kindEnum, enums[f.Enum()]
		case f.Kind == trace.KindInt:
			fc.kind = kindInt
		default:
			fc.kind = kindUint
		}
		switch f.Name {
		case "family":
			c.family = len(c.fields)
		case "caplen":
			c.caplen = len(c.fields)
		}
		c.fields = append(c.fields, fc)
	}
	return c
}

// field is the field called name, or nil (also for a type the recording
// lacks).
func (c *typeCodec) field(name string) *fieldCodec {
	if c == nil {
		return nil
	}
	for i := range c.fields {
		if c.fields[i].name == name {
			return &c.fields[i]
		}
	}
	return nil
}

// raw is the field's bytes in data, or nil when the record is too short.
func (fc *fieldCodec) raw(data []byte) []byte {
	if fc.offset < 0 || fc.size <= 0 || fc.offset > len(data)-fc.size {
		return nil
	}
	return data[fc.offset : fc.offset+fc.size]
}

// uint is the field as an unsigned integer (0 if it is not one, or fc is
// nil: a field the recording lacks).
func (fc *fieldCodec) uint(data []byte) uint64 {
	if fc == nil {
		return 0
	}
	b := fc.raw(data)
	switch len(b) {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.NativeEndian.Uint16(b))
	case 4:
		return uint64(binary.NativeEndian.Uint32(b))
	case 8:
		return binary.NativeEndian.Uint64(b)
	}
	return 0
}

func (fc *fieldCodec) int(data []byte) int64 {
	b := fc.raw(data)
	switch len(b) {
	case 1:
		return int64(int8(b[0]))
	case 2:
		return int64(int16(binary.NativeEndian.Uint16(b)))
	case 4:
		return int64(int32(binary.NativeEndian.Uint32(b)))
	case 8:
		return int64(binary.NativeEndian.Uint64(b))
	}
	return 0
}

func (c *typeCodec) v4(data []byte) bool {
	return c.family < 0 || c.fields[c.family].uint(data) != 6
}

func (fc *fieldCodec) addr(data []byte, v4 bool) netip.Addr {
	b := fc.raw(data)
	if len(b) != 16 {
		return netip.Addr{}
	}
	if v4 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16([16]byte(b))
}

func (fc *fieldCodec) str(data []byte) []byte {
	b := fc.raw(data)
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return b
}

func (c *typeCodec) bytes(fc *fieldCodec, data []byte) []byte {
	b := fc.raw(data)
	if c.caplen >= 0 {
		if n := c.fields[c.caplen].uint(data); int(n) <= len(b) {
			b = b[:n]
		}
	}
	return b
}

// value is field i as the API and expressions see it: int64 or string.
func (c *typeCodec) value(i int, data []byte) any {
	fc := &c.fields[i]
	switch fc.kind {
	case kindIP:
		return fc.addr(data, c.v4(data)).String()
	case kindStr:
		return string(fc.str(data))
	case kindBytes:
		return hex.EncodeToString(c.bytes(fc, data))
	case kindEnum:
		v := fc.uint(data)
		if name, ok := fc.enum[v]; ok {
			return name
		}
		return int64(v)
	case kindInt:
		return fc.int(data)
	}
	return int64(fc.uint(data))
}

// appendFields writes the fields as the members of a JSON object, without
// an intermediate map: this runs for every event delivered.
func (c *typeCodec) appendFields(b []byte, data []byte) []byte {
	v4 := c.v4(data)
	for i := range c.fields {
		fc := &c.fields[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, fc.key...)
		switch fc.kind {
		case kindIP:
			b = append(b, '"')
			if a := fc.addr(data, v4); a.IsValid() {
				b = a.AppendTo(b)
			} else {
				b = append(b, "invalid IP"...) // as netip.Addr.String
			}
			b = append(b, '"')
		case kindStr:
			b = appendString(b, string(fc.str(data)))
		case kindBytes:
			b = append(b, '"')
			b = hex.AppendEncode(b, c.bytes(fc, data))
			b = append(b, '"')
		case kindEnum:
			v := fc.uint(data)
			if name, ok := fc.enum[v]; ok {
				b = appendString(b, name)
			} else {
				b = strconv.AppendInt(b, int64(v), 10)
			}
		case kindInt:
			b = strconv.AppendInt(b, fc.int(data), 10)
		default:
			b = strconv.AppendInt(b, int64(fc.uint(data)), 10)
		}
	}
	return b
}
