// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"bytes"
	"encoding/binary"
	"net/netip"
)

// Record is one record of a trace, in native byte order.
type Record struct {
	Type   *EventType // the record's dictionary entry
	Data   []byte     // the whole record, common header included; see Reader.Next for its lifetime
	Offset int64      // file offset of the record
}

// Time returns the record's time_ns: nanoseconds on the clock described by
// Header.Clock.
func (r Record) Time() uint64 { return binary.NativeEndian.Uint64(r.Data[offTime:]) }

// Conn returns the record's connection id (0 when the event belongs to no
// connection).
func (r Record) Conn() uint64 { return binary.NativeEndian.Uint64(r.Data[offConn:]) }

// TID returns the id of the thread the event happened in.
func (r Record) TID() uint32 { return binary.NativeEndian.Uint32(r.Data[offTID:]) }

// Size returns the record's size field: the byte count the event is about.
func (r Record) Size() int32 { return int32(binary.NativeEndian.Uint32(r.Data[offSize:])) }

// NetNS returns the inode number of the network namespace of the event.
func (r Record) NetNS() uint32 { return binary.NativeEndian.Uint32(r.Data[offNetNS:]) }

// CPU returns the CPU the event was seen on.
func (r Record) CPU() uint16 { return binary.NativeEndian.Uint16(r.Data[offCPU:]) }

// TypeID returns the record's type id, the byte at offset 30.
func (r Record) TypeID() uint8 { return r.Data[offType] }

// Flags returns the record's flags byte.
func (r Record) Flags() uint8 { return r.Data[offFlags] }

// Value decodes field f of the record: uint64 for "u" and enum fields,
// int64 for "i", string for "str" (up to the first NUL byte), netip.Addr
// holding all 16 bytes for "ip" (for an IPv4 address use the first 4 bytes,
// see Addr), and []byte aliasing Data for "bytes". It returns nil when f
// does not lie inside the record or has an unknown kind.
func (r Record) Value(f Field) any {
	b, ok := r.bytes(f)
	if !ok {
		return nil
	}
	switch {
	case f.Kind == KindInt:
		v, ok := decodeInt(b)
		if !ok {
			return nil
		}
		return v
	case f.isInteger():
		v, ok := decodeUint(b)
		if !ok {
			return nil
		}
		return v
	case f.Kind == KindStr:
		return cString(b)
	case f.Kind == KindIP:
		if len(b) != 16 {
			return nil
		}
		return netip.AddrFrom16([16]byte(b))
	case f.Kind == KindBytes:
		return b
	}
	return nil
}

// Uint returns the value of the unsigned integer or enum field called name.
// It reports false when the record's type has no such field or the field
// is of another kind.
func (r Record) Uint(name string) (uint64, bool) {
	f, ok := r.field(name)
	if !ok || f.Kind == KindInt || !f.isInteger() {
		return 0, false
	}
	b, ok := r.bytes(f)
	if !ok {
		return 0, false
	}
	return decodeUint(b)
}

// FieldUint returns the value of unsigned integer or enum field f of the
// record's type, without looking it up by name: what a loop over a type's
// Fields wants. It reports false when f is of another kind or does not lie
// inside the record.
func (r Record) FieldUint(f Field) (uint64, bool) {
	if f.Kind == KindInt || !f.isInteger() {
		return 0, false
	}
	b, ok := r.bytes(f)
	if !ok {
		return 0, false
	}
	return decodeUint(b)
}

// FieldInt is FieldUint for a signed integer field.
func (r Record) FieldInt(f Field) (int64, bool) {
	if f.Kind != KindInt {
		return 0, false
	}
	b, ok := r.bytes(f)
	if !ok {
		return 0, false
	}
	return decodeInt(b)
}

// Int returns the value of the signed integer field called name. It reports
// false when the record's type has no such field or the field is of another
// kind.
func (r Record) Int(name string) (int64, bool) {
	f, ok := r.field(name)
	if !ok || f.Kind != KindInt {
		return 0, false
	}
	b, ok := r.bytes(f)
	if !ok {
		return 0, false
	}
	return decodeInt(b)
}

// Str returns the text of the "str" field called name, up to its first NUL
// byte. It reports false when the record's type has no such field or the
// field is of another kind.
func (r Record) Str(name string) (string, bool) {
	f, ok := r.field(name)
	if !ok || f.Kind != KindStr {
		return "", false
	}
	b, ok := r.bytes(f)
	if !ok {
		return "", false
	}
	return cString(b), true
}

// Bytes returns the raw bytes of the field called name, of any kind,
// aliasing Data. Integers come in native byte order.
func (r Record) Bytes(name string) ([]byte, bool) {
	f, ok := r.field(name)
	if !ok {
		return nil, false
	}
	return r.bytes(f)
}

// Addr returns the "ip" field called name as an address: from its first 4
// bytes when v4 is true, else from all 16. The record does not say which
// applies; a family field next to the address usually does.
func (r Record) Addr(name string, v4 bool) (netip.Addr, bool) {
	f, ok := r.field(name)
	if !ok || f.Kind != KindIP {
		return netip.Addr{}, false
	}
	b, ok := r.bytes(f)
	if !ok || len(b) != 16 {
		return netip.Addr{}, false
	}
	if v4 {
		return netip.AddrFrom4([4]byte(b[:4])), true
	}
	return netip.AddrFrom16([16]byte(b)), true
}

func (r Record) field(name string) (Field, bool) {
	if r.Type == nil {
		return Field{}, false
	}
	return r.Type.Field(name)
}

func (r Record) bytes(f Field) ([]byte, bool) {
	if f.Offset < 0 || f.Size <= 0 || f.Offset > len(r.Data)-f.Size {
		return nil, false
	}
	return r.Data[f.Offset : f.Offset+f.Size : f.Offset+f.Size], true
}

func decodeUint(b []byte) (uint64, bool) {
	switch len(b) {
	case 1:
		return uint64(b[0]), true
	case 2:
		return uint64(binary.NativeEndian.Uint16(b)), true
	case 4:
		return uint64(binary.NativeEndian.Uint32(b)), true
	case 8:
		return binary.NativeEndian.Uint64(b), true
	}
	return 0, false
}

func decodeInt(b []byte) (int64, bool) {
	switch len(b) {
	case 1:
		return int64(int8(b[0])), true
	case 2:
		return int64(int16(binary.NativeEndian.Uint16(b))), true
	case 4:
		return int64(int32(binary.NativeEndian.Uint32(b))), true
	case 8:
		return int64(binary.NativeEndian.Uint64(b)), true
	}
	return 0, false
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
