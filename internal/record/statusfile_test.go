// SPDX-License-Identifier: Apache-2.0

package record

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestStatusRewrittenInPlace: a shorter status written over a longer one
// leaves a file that reads as the shorter one (the rest blanks), and a file
// that does not parse (a write caught half done, every time) is not a
// status.
func TestStatusRewrittenInPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "record-1.json")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	s := &statusFile{path: path, f: f}
	defer s.remove()
	for _, st := range []Status{
		{PID: 1, Output: "/a/long/name/of/a/trace/file.mgt", Events: []string{"sock", "tcp", "ip", "dev"}, Recorded: 123456789},
		{PID: 1, Output: "/b.mgt", Recorded: 7},
	} {
		data, err := json.Marshal(&st)
		if err != nil {
			t.Fatal(err)
		}
		s.write(data)
		got, ok := readStatus(path)
		if !ok || got.Output != st.Output || got.Recorded != st.Recorded || len(got.Events) != len(st.Events) {
			t.Fatalf("read %+v (%v), wrote %+v", got, ok, st)
		}
	}
	if fi, err := os.Stat(path); err != nil || int(fi.Size()) != s.size || s.size < 100 {
		t.Errorf("file size %v (%v), status size %d: the longer status's size should stay", fi.Size(), err, s.size)
	}
	if err := os.WriteFile(path, []byte(`{"pid": 1, "outp`), 0o644); err != nil {
		t.Fatal(err)
	}
	if st, ok := readStatus(path); ok {
		t.Errorf("a torn file read as %+v", st)
	}
}
