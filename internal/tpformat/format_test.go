// SPDX-License-Identifier: Apache-2.0

package tpformat

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".format"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseNapiPoll(t *testing.T) {
	f, err := Parse("napi", "napi_poll", readTestdata(t, "napi_poll"))
	if err != nil {
		t.Fatal(err)
	}
	if f.ID != 2291 || len(f.Common) != 4 || len(f.Fields) != 4 || f.Size() != 28 {
		t.Fatalf("napi_poll: id %d, %d common, %d fields, size %d", f.ID, len(f.Common), len(f.Fields), f.Size())
	}
	want := []Field{
		{Name: "napi", CType: "struct napi_struct *", Offset: 8, Size: 8},
		{Name: "dev_name", CType: "__data_loc char[]", Offset: 16, Size: 4, DataLoc: true},
		{Name: "work", CType: "int", Offset: 20, Size: 4, Signed: true},
		{Name: "budget", CType: "int", Offset: 24, Size: 4, Signed: true},
	}
	for i, w := range want {
		if f.Fields[i] != w {
			t.Errorf("field %d: %+v, want %+v", i, f.Fields[i], w)
		}
	}
	if !f.Fields[0].Pointer() || f.Fields[0].Integer() {
		t.Error("napi: want a pointer, not an integer")
	}
	if !f.Fields[1].Char() || f.Fields[1].Pointer() {
		t.Error("dev_name: want text")
	}
	if !f.Fields[2].Integer() {
		t.Error("work: want an integer")
	}
}

func TestParseArrays(t *testing.T) {
	f, err := Parse("sched", "sched_switch", readTestdata(t, "sched_switch"))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := f.Field("prev_comm")
	if c.ArrayLen != 16 || c.Size != 16 || !c.Char() || c.Integer() {
		t.Fatalf("prev_comm: %+v", c)
	}
	st, _ := f.Field("prev_state")
	if st.Size != 8 || !st.Signed || !st.Integer() {
		t.Fatalf("prev_state: %+v", st)
	}
	p, err := Parse("tcp", "tcp_probe", readTestdata(t, "tcp_probe"))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := p.Field("saddr")
	if a.ArrayLen != 28 || a.Char() || a.Integer() {
		t.Fatalf("saddr: %+v", a)
	}
}

func TestParseAllTestdata(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.format")
	if len(files) < 5 {
		t.Fatalf("only %d formats in testdata", len(files))
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".format")
		f, err := Parse("", name, readTestdata(t, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if len(f.Fields) == 0 || f.Size() > MaxRecordBytes {
			t.Errorf("%s: %d fields, size %d", name, len(f.Fields), f.Size())
		}
	}
}

func TestParseErrors(t *testing.T) {
	good := string(readTestdata(t, "softirq_entry"))
	for _, tc := range []struct{ name, text, want string }{
		{"other name", strings.Replace(good, "name: softirq_entry", "name: x", 1), "names"},
		{"no id", strings.Replace(good, "ID: 223", "", 1), "no name or ID"},
		{"bad id", strings.Replace(good, "ID: 223", "ID: x", 1), "bad ID"},
		{"bad offset", strings.Replace(good, "offset:8;", "offset:x;", 1), "bad offset"},
		{"no size", strings.Replace(good, "size:4;", "", 1), "no offset or size"},
		{"garbage", good + "\nwhat\n", "unexpected"},
		{"in common", strings.Replace(good, "vec;\toffset:8", "vec;\toffset:4", 1), "inside the common"},
		{"twice", strings.Replace(good, "\nprint", "\tfield:unsigned int vec;\toffset:12;\tsize:4;\tsigned:0;\nprint", 1), "twice"},
		{"bad name", strings.Replace(good, "unsigned int vec;", "unsigned int 9x;", 1), "bad name"},
		{"bad loc", strings.Replace(good, "unsigned int vec;\toffset:8;\tsize:4;", "__data_loc char[] vec;\toffset:8;\tsize:8;", 1), "want 4"},
	} {
		_, err := Parse("irq", "softirq_entry", []byte(tc.text))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestFilter(t *testing.T) {
	f, err := Parse("napi", "napi_poll", readTestdata(t, "napi_poll"))
	if err != nil {
		t.Fatal(err)
	}
	preds, err := ParseFilter(f, "work > 0 && budget == 64 || work == -1")
	if err != nil {
		t.Fatal(err)
	}
	if len(preds) != 3 || preds[0].NewTerm || preds[1].NewTerm || !preds[2].NewTerm || preds[2].Value != ^uint64(0) {
		t.Fatalf("predicates %+v", preds)
	}
	rec := func(work, budget int32) []byte {
		b := make([]byte, 28)
		binary.NativeEndian.PutUint32(b[20:], uint32(work))
		binary.NativeEndian.PutUint32(b[24:], uint32(budget))
		return b
	}
	for _, tc := range []struct {
		work, budget int32
		want         bool
	}{{1, 64, true}, {0, 64, false}, {5, 8, false}, {-1, 8, true}, {-2, 64, false}} {
		if got := Match(preds, rec(tc.work, tc.budget), binary.NativeEndian); got != tc.want {
			t.Errorf("work %d budget %d: %v, want %v", tc.work, tc.budget, got, tc.want)
		}
	}
	s, _ := Parse("irq", "softirq_entry", readTestdata(t, "softirq_entry"))
	for _, tc := range []struct{ expr, want string }{
		{"vec = 3", "no operator"},
		{"foo == 3", `no field "foo"`},
		{"vec == -3", "unsigned"},
		{"vec == 0x100000000", "32-bit"},
		{"vec == three", "not a 32-bit"},
		{"(vec == 3)", "parentheses"},
		{"vec == 3 &&", "empty test"},
		{"vec", "no operator"},
		{strings.Repeat("vec == 1 || ", 8) + "vec == 2", "more than 8"},
	} {
		if _, err := ParseFilter(s, tc.expr); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.expr, err, tc.want)
		}
	}
	if _, err := ParseFilter(f, "napi == 0"); err == nil || !strings.Contains(err.Error(), "cannot be tested") {
		t.Errorf("pointer test: %v", err)
	}
	if _, err := ParseFilter(f, "dev_name == 0"); err == nil || !strings.Contains(err.Error(), "cannot be tested") {
		t.Errorf("string test: %v", err)
	}
	p, err := ParseFilter(s, "vec & 0xc")
	if err != nil || len(p) != 1 || p[0].Op != OpAnd || p[0].Value != 12 {
		t.Fatalf("bit test: %+v %v", p, err)
	}
}

func TestRead(t *testing.T) {
	root, err := Root()
	if err != nil {
		t.Skipf("no tracefs: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "events/napi/napi_poll/format")); err != nil {
		t.Skipf("tracefs not readable here: %v", err)
	}
	f, err := Read(root, "napi", "napi_poll")
	if err != nil || f.ID == 0 {
		t.Fatalf("napi:napi_poll: %v", err)
	}
	for _, bad := range []string{"napi:nope", "../../x:y"} {
		sys, name, _ := strings.Cut(bad, ":")
		if _, err := Read(root, sys, name); err == nil || !strings.Contains(err.Error(), "no such tracepoint") {
			t.Errorf("%s: %v", bad, err)
		}
	}
}
