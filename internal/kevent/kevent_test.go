// SPDX-License-Identifier: Apache-2.0

package kevent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/trace"
)

// fakeTracefs serves the formats of tpformat's testdata as a tracefs.
func fakeTracefs(t *testing.T) {
	t.Helper()
	root := t.TempDir()
	for sys, names := range map[string][]string{"napi": {"napi_poll"}, "irq": {"irq_handler_entry", "softirq_entry"}, "skb": {"consume_skb"}, "sched": {"sched_switch"}, "tcp": {"tcp_probe"}} {
		for _, n := range names {
			b, err := os.ReadFile(filepath.Join("../tpformat/testdata", n+".format"))
			if err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(root, "events", sys, n)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "format"), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	old := tracefsRoot
	tracefsRoot = func() (string, error) { return root, nil }
	t.Cleanup(func() { tracefsRoot = old })
}

func TestParseSpecs(t *testing.T) {
	s, err := ParseTracepoint("irq:softirq_entry if vec == 3 || vec == 2")
	if err != nil || s.System != "irq" || s.Name != "softirq_entry" || s.Filter != "vec == 3 || vec == 2" {
		t.Fatalf("%+v %v", s, err)
	}
	for _, bad := range []string{"napi", "napi:", ":x", "a b:c", "napi:napi_poll if", "napi:napi_poll if  "} {
		if _, err := ParseTracepoint(bad); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := ParseUprobe("/no/such/binary:f"); err == nil {
		t.Error("uprobe on a missing binary")
	}
	if _, err := ParseUprobe("/bin/sh"); err == nil || !strings.Contains(err.Error(), "BINARY:SYMBOL") {
		t.Errorf("uprobe without symbol: %v", err)
	}
	if u, err := ParseUSDT("/bin/sh:prov:name"); err != nil || u.Provider != "prov" || u.Name != "name" {
		t.Errorf("usdt: %+v %v", u, err)
	}
	if _, err := ParseKprobe("tcp sendmsg"); err == nil {
		t.Error("kprobe with a space")
	}
}

// TestPlanLayout: a tracepoint's record layout in the dictionary: fields
// shifted by 24 (the trace's 32-byte header replaces the 8 bytes of common
// fields), a __data_loc string in a 64-byte slot after them, pointers left
// out and blanked, names of common fields renamed, filters compiled.
func TestPlanLayout(t *testing.T) {
	fakeTracefs(t)
	var specs []Spec
	for _, v := range []string{"napi:napi_poll if work > 0", "skb:consume_skb", "sched:sched_switch", "irq:softirq_entry"} {
		s, err := ParseTracepoint(v)
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, s)
	}
	evs, err := Plan(specs, func(n string) bool { return n == "sched_switch" })
	if err != nil {
		t.Fatal(err)
	}
	napi := evs[0]
	want := []trace.Field{
		{Name: "dev_name", Offset: 56, Size: 64, Kind: "str", CType: "__data_loc char[]"},
		{Name: "work", Offset: 44, Size: 4, Kind: "i", CType: "int"},
		{Name: "budget", Offset: 48, Size: 4, Kind: "i", CType: "int"},
	}
	if napi.Type.ID != FirstID || napi.Type.Name != "napi_poll" || napi.Type.Size != 120 || len(napi.Type.Fields) != 3 {
		t.Fatalf("napi_poll: %+v", napi.Type)
	}
	for i, w := range want {
		if napi.Type.Fields[i] != w {
			t.Errorf("napi_poll field %d: %+v, want %+v", i, napi.Type.Fields[i], w)
		}
	}
	if len(napi.zero) != 1 || napi.zero[0] != 32 || napi.copy != 20 || len(napi.preds) != 1 || len(napi.strs) != 1 || napi.strs[0] != (strCopy{src: 16, dst: 56, text: true}) {
		t.Errorf("napi_poll plan: zero %v copy %d preds %d strs %+v", napi.zero, napi.copy, len(napi.preds), napi.strs)
	}
	if c := evs[1]; len(c.Type.Fields) != 0 || len(c.zero) != 2 || len(c.Dropped) != 2 {
		t.Errorf("consume_skb: %+v, zero %v", c.Type, c.zero)
	}
	if s := evs[2]; s.Type.Name != "sched_sched_switch" {
		t.Errorf("sched_switch, taken by a built-in event, named %s", s.Type.Name)
	}
	d := Dictionary(evs)
	if len(d) != 5 || d[0].Name != LostName || d[0].ID != LostID || d[0].Size != 312 {
		t.Fatalf("dictionary: %+v", d[0])
	}
	if f, ok := d[0].Field("n_softirq_entry"); !ok || f.Offset != 56+4*3 {
		t.Errorf("kevent_lost n_softirq_entry: %+v", f)
	}
	// The dictionary is one a trace accepts.
	h := &trace.Header{Format: trace.FormatName, Version: trace.Version, Common: trace.CommonFields, Types: d}
	if _, err := trace.NewWriter(discard{}, h, trace.WriterOptions{}); err != nil {
		t.Errorf("trace writer refuses the dictionary: %v", err)
	}
	for _, tc := range []struct{ spec, want string }{
		{"napi:no_poll", "no such tracepoint"},
		{"napi:napi_poll if napi == 0", "cannot be tested"},
		{"napi:napi_poll if wrk > 1", `no field "wrk"`},
	} {
		s, _ := ParseTracepoint(tc.spec)
		if _, err := Plan([]Spec{s}, func(string) bool { return false }); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.spec, err, tc.want)
		}
	}
}

type discard struct{}

func (discard) Write(b []byte) (int, error) { return len(b), nil }

func TestUSDTArgs(t *testing.T) {
	args, err := parseUSDTArgs("8@%rbx -4@112(%rsp) -4@%eax 2@$-5 1@-8(%rbp)")
	if err != nil {
		t.Fatal(err)
	}
	want := []keventKevArg{
		{Kind: 1, Reg: 40, Size: 8},
		{Kind: 2, Reg: 152, Size: -4, Disp: 112},
		{Kind: 1, Reg: 80, Size: -4},
		{Kind: 3, Size: 2, Disp: -5},
		{Kind: 2, Reg: 32, Size: 1, Disp: -8},
	}
	for i, w := range want {
		if args[i] != w {
			t.Errorf("arg %d: %+v, want %+v", i, args[i], w)
		}
	}
	for _, bad := range []string{"3@%rax", "8@%foo", "8@(%rax,%rbx,8)", "8%rax", "8@$x", "8@a(%rax)"} {
		if _, err := parseUSDTArgs(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestSplitGroups(t *testing.T) {
	rest, specs, _, err := SplitGroups("default,napi,-dev,irq,napi")
	if err != nil {
		t.Fatal(err)
	}
	if rest != "default,-dev" {
		t.Errorf("rest %q", rest)
	}
	var names []string
	for _, s := range specs {
		if !s.SystemWide {
			t.Errorf("%s is not system-wide", s)
		}
		names = append(names, s.Name)
	}
	got := strings.Join(names, ",")
	if !strings.HasPrefix(got, "napi_poll,") || !strings.HasSuffix(got, "softirq_entry,softirq_exit") {
		t.Errorf("specs %s", got)
	}
	if rest, _, _, _ := SplitGroups("napi"); rest != "conn" {
		t.Errorf("--events napi alone: rest %q, want conn", rest)
	}
}

// A kprobe is planned only on a kernel with kprobes and for a function it
// has; the answer names what is missing: an unknown function first, then
// the kernel's lack of kprobes and whether it refuses fentry too.
func TestKprobeAvailable(t *testing.T) {
	if ok, err := inKallsyms("tcp_sendmsg"); err != nil || !ok {
		t.Fatalf("tcp_sendmsg in /proc/kallsyms: %v, %v", ok, err)
	}
	if ok, _ := inKallsyms("no_such_function_here"); ok {
		t.Error("a function no kernel has was found")
	}
	if err := kprobeAvailable("no_such_function_here"); err == nil || !strings.Contains(err.Error(), "no such kernel function") {
		t.Errorf("unknown function: %v", err)
	}
	err := kprobeAvailable("tcp_sendmsg")
	if _, serr := os.Stat("/sys/bus/event_source/devices/kprobe"); serr == nil {
		if err != nil {
			t.Errorf("tcp_sendmsg: %v", err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), "CONFIG_KPROBE_EVENTS") || !strings.Contains(err.Error(), "fentry") || strings.Contains(err.Error(), "MEMLOCK") {
		t.Errorf("kernel without kprobes: %v, want both kprobes and fentry named", err)
	}
	// Whether fentry is refused is the kernel's answer to a load, which
	// only root may try.
	if os.Geteuid() == 0 {
		ferr := fentryLoads("tcp_sendmsg")
		if refused := strings.Contains(err.Error(), "refuses fentry"); refused != (ferr != nil) {
			t.Errorf("kprobe error %q; an fentry program's load: %v", err, ferr)
		}
	}
}

// TestPlanUnrecordable: fields magnet cannot record are refused with one
// line naming the tracepoint and the field: a record whose fixed part is
// larger than the copy the BPF program makes, and a kernel address it
// cannot blank (not 8 bytes at an 8-byte offset). No tracepoint of the
// test kernel has either, so their formats are made here.
func TestPlanUnrecordable(t *testing.T) {
	const common = "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n" +
		"\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n" +
		"\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n" +
		"\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
	root := t.TempDir()
	for name, fields := range map[string]string{
		"big_record":  "\tfield:char blob[300];\toffset:8;\tsize:300;\tsigned:0;\n",
		"odd_pointer": "\tfield:int n;\toffset:8;\tsize:4;\tsigned:1;\n\tfield:void * p;\toffset:12;\tsize:8;\tsigned:0;\n",
	} {
		dir := filepath.Join(root, "events", "test", name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		text := "name: " + name + "\nID: 1\nformat:\n" + common + fields + "\nprint fmt: \"\"\n"
		if err := os.WriteFile(filepath.Join(dir, "format"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := tracefsRoot
	tracefsRoot = func() (string, error) { return root, nil }
	t.Cleanup(func() { tracefsRoot = old })
	for _, tc := range []struct{ spec, want string }{
		{"test:big_record", "tracepoint test:big_record: its record's fixed part is 308 bytes, more than the 256 magnet copies"},
		{"test:odd_pointer", "tracepoint test:odd_pointer: field p (void *) is a kernel address magnet cannot blank"},
	} {
		s, err := ParseTracepoint(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Plan([]Spec{s}, func(string) bool { return false })
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s: %v, want %q", tc.spec, err, tc.want)
		}
	}
}
