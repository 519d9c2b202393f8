// SPDX-License-Identifier: Apache-2.0

package probe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

func learnedBytes(ls ...Learned) []byte {
	var b []byte
	for _, l := range ls {
		r := make([]byte, learnedSize)
		binary.NativeEndian.PutUint64(r[0:], l.Cookie)
		binary.NativeEndian.PutUint64(r[8:], l.Inode)
		binary.NativeEndian.PutUint32(r[16:], l.NetNS)
		r[20], r[21], r[22] = l.Proto, l.State, l.Verdict
		if l.Owned {
			r[23] = 1
		}
		b = append(b, r...)
	}
	return b
}

// TestReadLearned: records split across reads (as a seq_file hands out
// what fits) come out whole, in order, each batch after its read.
func TestReadLearned(t *testing.T) {
	want := []Learned{
		{Cookie: 1, Inode: 41235, NetNS: 4026531840, Proto: 6, State: 10, Verdict: LearnSelected, Owned: true},
		{Cookie: 2, Inode: 7, NetNS: 4026531840, Proto: 17, State: 7, Verdict: LearnOut},
		{Cookie: 1 << 40, Inode: 1 << 33, NetNS: 1, Proto: 6, State: 1, Verdict: LearnKnown, Owned: true},
	}
	for _, r := range []io.Reader{
		bytes.NewReader(learnedBytes(want...)),
		iotest.OneByteReader(bytes.NewReader(learnedBytes(want...))),
		iotest.DataErrReader(bytes.NewReader(learnedBytes(want...))),
	} {
		var got []Learned
		calls := 0
		err := ReadLearned(r, func(ls []Learned) error {
			calls++
			got = append(got, ls...)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) || calls == 0 || calls > len(want) {
			t.Fatalf("got %d records in %d calls, want %d", len(got), calls, len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("record %d: %+v, want %+v", i, got[i], want[i])
			}
		}
	}
}

func TestReadLearnedErrors(t *testing.T) {
	b := learnedBytes(Learned{Cookie: 1})
	if err := ReadLearned(bytes.NewReader(append(b, 1, 2, 3)), func([]Learned) error { return nil }); err == nil {
		t.Error("no error for a partial record at the end")
	}
	stop := errors.New("stop")
	if err := ReadLearned(bytes.NewReader(b), func([]Learned) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("callback's error: got %v", err)
	}
	broken := iotest.ErrReader(errors.New("EIO"))
	if err := ReadLearned(broken, func([]Learned) error { return nil }); err == nil {
		t.Error("no error for a failing read")
	}
}
