// SPDX-License-Identifier: Apache-2.0

package hostcheck

import (
	"encoding/binary"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"
)

// bit encodes one verbose ethtool bitset bit.
func bit(index uint32, name string, value bool) []byte {
	var b []byte
	b = appendAttr(b, unix.ETHTOOL_A_BITSET_BIT_INDEX, binary.NativeEndian.AppendUint32(nil, index))
	b = appendAttr(b, unix.ETHTOOL_A_BITSET_BIT_NAME, append([]byte(name), 0))
	if value {
		b = appendAttr(b, unix.ETHTOOL_A_BITSET_BIT_VALUE, nil)
	}
	return appendAttr(nil, unix.ETHTOOL_A_BITSET_BITS_BIT|unix.NLA_F_NESTED, b)
}

func TestParseBitsetList(t *testing.T) {
	var bits []byte
	bits = append(bits, bit(14, featureGRO, false)...)
	bits = append(bits, bit(16, featureGSO, false)...)
	var set []byte
	set = appendAttr(set, unix.ETHTOOL_A_BITSET_NOMASK, nil)
	set = appendAttr(set, unix.ETHTOOL_A_BITSET_SIZE, binary.NativeEndian.AppendUint32(nil, 64))
	set = appendAttr(set, unix.ETHTOOL_A_BITSET_BITS|unix.NLA_F_NESTED, bits)
	got, err := parseBitset(set)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{featureGRO: true, featureGSO: true}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseBitset = %v, want %v", got, want)
	}
}

func TestParseBitsetWithMask(t *testing.T) {
	var bits []byte
	bits = append(bits, bit(14, featureGRO, true)...)
	bits = append(bits, bit(15, featureLRO, false)...)
	set := appendAttr(nil, unix.ETHTOOL_A_BITSET_BITS|unix.NLA_F_NESTED, bits)
	got, err := parseBitset(set)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{featureGRO: true, featureLRO: false}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseBitset = %v, want %v", got, want)
	}
}

func TestParseBitsetCompactRefused(t *testing.T) {
	set := appendAttr(nil, unix.ETHTOOL_A_BITSET_VALUE, []byte{1, 0, 0, 0})
	if _, err := parseBitset(set); err == nil {
		t.Error("parseBitset accepted a compact bitset it cannot name")
	}
}

func TestAttrsRoundTrip(t *testing.T) {
	var b []byte
	b = appendAttr(b, 1, []byte("abc")) // padded to 8 bytes
	b = appendAttr(b, 2|unix.NLA_F_NESTED, []byte{9, 9, 9, 9})
	if len(b) != 16 {
		t.Fatalf("encoded %d bytes, want 16", len(b))
	}
	got, err := parseAttrs(b)
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint16][]byte{1: []byte("abc"), 2: {9, 9, 9, 9}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseAttrs = %v, want %v", got, want)
	}
	if _, err := parseAttrs([]byte{200, 0, 1, 0}); err == nil {
		t.Error("parseAttrs accepted an attribute longer than its buffer")
	}
}

func TestParseSize(t *testing.T) {
	for s, want := range map[string]int64{"48K": 48 << 10, "2048K": 2 << 20, "32M": 32 << 20, "1G": 1 << 30, "512": 512, "": 0, "xK": 0} {
		if got := parseSize(s); got != want {
			t.Errorf("parseSize(%q) = %d, want %d", s, got, want)
		}
	}
}
