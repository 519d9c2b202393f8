// SPDX-License-Identifier: Apache-2.0

package trace

import (
	"encoding/binary"
	"testing"
)

// A thread announced at the same instant as a connection it owns comes
// first, whatever their type ids; the copies are flagged and the
// originals untouched.
func TestCarried(t *testing.T) {
	rec := func(ts uint64, typ byte) []byte {
		b := make([]byte, 40)
		binary.NativeEndian.PutUint64(b, ts)
		b[30] = typ
		return b
	}
	task, iface := rec(20, 21), rec(5, 22)
	open, early := rec(20, 14), rec(10, 14)
	out := Carried([][]byte{task, iface}, [][]byte{open, early})
	want := [][]byte{iface, early, task, open}
	if len(out) != len(want) {
		t.Fatalf("%d records, want %d", len(out), len(want))
	}
	for i, w := range want {
		if binary.NativeEndian.Uint64(out[i]) != binary.NativeEndian.Uint64(w) || out[i][30] != w[30] {
			t.Errorf("record %d: time %d type %d, want time %d type %d", i, binary.NativeEndian.Uint64(out[i]), out[i][30], binary.NativeEndian.Uint64(w), w[30])
		}
		if out[i][31]&FlagCarried == 0 {
			t.Errorf("record %d not flagged carried", i)
		}
	}
	if task[31] != 0 || open[31] != 0 {
		t.Error("an original was flagged")
	}
}
