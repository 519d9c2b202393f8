// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The committed files are what events.h says now: a type or group moved
// in C without `go generate ./internal/probe` fails here, unprivileged.
func TestGeneratedFilesUpToDate(t *testing.T) {
	root := filepath.Join("..", "..")
	files, err := generateFrom(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		have, err := os.ReadFile(filepath.Join(root, f.path))
		if err != nil {
			t.Fatal(err)
		}
		if string(have) != string(f.data) {
			t.Errorf("%s differs from what bpf/events.h gives: run go generate ./internal/probe and commit the result", f.path)
		}
	}
}

func TestGoName(t *testing.T) {
	for c, want := range map[string]string{
		"MG_SOCK_SEND": "SockSend", "MG_TCP_XMIT": "TCPXmit", "MG_IP_RECV": "IPRecv", "MG_TCP_RATE": "TCPRate",
		"MG_G_TCPSTATE": "TCPState", "MG_G_TCPSEND": "TCPSend", "MG_G_IP": "IP", "MG_G_HEADERS": "Headers",
	} {
		prefix := "MG_"
		if strings.HasPrefix(c, "MG_G_") {
			prefix = "MG_G_"
		}
		if got := goName(c, prefix); got != want {
			t.Errorf("goName(%s) = %s, want %s", c, got, want)
		}
	}
	if got := bpf2goName("mg_tcp_xmit"); got != "magnetMgTcpXmit" {
		t.Errorf("bpf2goName(mg_tcp_xmit) = %s", got)
	}
}

const sample = `
#define MG_NTYPES 8
enum mg_type {
	MG_NONE = 0,
	/* group: sock
	 * programs: send_prog
	 * hook: tp_btf/send
	 * what: bytes sent */
	MG_SOCK_SEND = 1,
	/*
	 * group: ip
	 * programs: egress, send_prog
	 * hook: cgroup_skb/egress
	 * what: a packet: its id,
	 *   TTL and length
	 */
	MG_IP_SEND = 2,
	/* group: sock
	 * programs: none
	 * hook: recorder
	 * what: a task */
	MG_TASK = 3,
	/* group: ip
	 * programs: egress
	 * hook: fentry
	 * what: a segment */
	MG_TCP_XMIT = 4,
	MG_TYPE_MAX = 5,
};
enum mg_group {
	/* help: socket layer, with a comma */
	MG_G_SOCK = 1 << 0,
	/*
	 * help: IP layer:
	 *   ip_send
	 */
	MG_G_IP = 1 << 3,
};
struct mg_hdr { __u64 t; };
struct mg_task { __u32 pid; };
struct mg_task_rec { struct mg_hdr hdr; };
struct mg_ip { struct mg_hdr hdr; };
struct mg_tcp_xmit { struct mg_hdr hdr; };
`

// The record struct of each type follows the rule in the package doc.
func TestRecordStruct(t *testing.T) {
	h, err := parse(sample)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"sock_send": "mg_hdr", "ip_send": "mg_ip", "task": "mg_task_rec", "tcp_xmit": "mg_tcp_xmit"} {
		if got := h.recordStruct(name); got != want {
			t.Errorf("recordStruct(%s) = %s, want %s", name, got, want)
		}
	}
	if len(h.groups) != 2 || h.groups[1].value != 8 {
		t.Errorf("groups %+v", h.groups)
	}
	files, err := h.generate()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(files[0].data), "GroupIP   Group = 1 << 3 // MG_G_IP") {
		t.Errorf("event constants:\n%s", files[0].data)
	}
}

// The annotations become the catalogue, the groups' help and each
// program's events: its own (named first) before the others.
func TestCatalogueFromAnnotations(t *testing.T) {
	h, err := parse(sample)
	if err != nil {
		t.Fatal(err)
	}
	files, err := h.generate()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range files {
		got[f.path] = string(f.data)
	}
	for _, want := range []string{
		`{SockSend, "sock_send", GroupSock, "tp_btf/send", "bytes sent"},`,
		`{IPSend, "ip_send", GroupIP, "cgroup_skb/egress", "a packet: its id, TTL and length"},`,
		`{Task, "task", GroupSock, "recorder", "a task"},`,
		`{"sock", GroupSock, "socket layer, with a comma"},`,
		`{"ip", GroupIP, "IP layer: ip_send"},`,
	} {
		if !strings.Contains(got[catOut], want) {
			t.Errorf("%s lacks %s:\n%s", catOut, want, got[catOut])
		}
	}
	for _, want := range []string{
		`"egress":    {"ip_send", "tcp_xmit"},`,
		`"send_prog": {"sock_send", "ip_send"},`,
	} {
		if !strings.Contains(got[hooksOut], want) {
			t.Errorf("%s lacks %s:\n%s", hooksOut, want, got[hooksOut])
		}
	}
}

func TestParseErrors(t *testing.T) {
	for in, want := range map[string]string{
		"enum mg_type { MG_A = 1, }; enum mg_group { MG_G_A = 1, }; struct mg_hdr {};":                      "MG_NTYPES",
		"#define MG_NTYPES 8\nenum mg_type { MG_A = x, };":                                                  "want NAME = N",
		"#define MG_NTYPES 8\nenum mg_group { MG_G_A = 1, };":                                               "no enum mg_type",
		"#define MG_NTYPES 8\nenum mg_type { MG_A = 1, }; enum mg_group { MG_G_A = 1, };":                   "no struct mg_hdr",
		"#define MG_NTYPES 8\nenum mg_type { MG_A = 9, }; enum mg_group { MG_G_A = 1, }; struct mg_hdr {};": "want 1 to MG_NTYPES-1",
	} {
		h, err := parse(in)
		if err == nil {
			_, err = h.generate()
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", in, err, want)
		}
	}
}

// Each malformed annotation is one error naming its line and what is wrong.
func TestAnnotationErrors(t *testing.T) {
	for _, tc := range []struct{ from, to, want string }{
		{"\t/* group: sock\n\t * programs: send_prog\n\t * hook: tp_btf/send\n\t * what: bytes sent */\n", "", "line 5: MG_SOCK_SEND: no annotation"},
		{" * what: bytes sent */", " */", "line 5: MG_SOCK_SEND: no what: field"},
		{" * what: bytes sent */", " * what:\n\t */", "line 5: MG_SOCK_SEND: no what: field"},
		{" * hook: tp_btf/send", " * hook: tp_btf/send\n\t * hook: again", "line 8: MG_SOCK_SEND: hook: given twice"},
		{" * hook: tp_btf/send", " * hooks: tp_btf/send", `line 7: MG_SOCK_SEND: "hooks: tp_btf/send": want a field`},
		{" * hook: tp_btf/send", " * hook tp_btf/send", `line 7: MG_SOCK_SEND: "hook tp_btf/send": want a field`},
		{" * hook: tp_btf/send", "hook: tp_btf/send\n\ttp_btf/more", `line 8: MG_SOCK_SEND: "tp_btf/more": want a field`},
		{"/* group: sock\n", "/* group: socks\n", `line 9: MG_SOCK_SEND: group "socks" is not in enum mg_group (want one of sock, ip)`},
		{" * programs: send_prog\n", " * programs: send prog\n", `line 9: MG_SOCK_SEND: programs "send prog": want distinct program names`},
		{" * programs: egress, send_prog", " * programs: egress, egress", `line 17: MG_IP_SEND: programs "egress, egress"`},
		{"\tMG_SOCK_SEND = 1,", "\t/* spare */\n\tMG_SOCK_SEND = 1,", "line 10: MG_SOCK_SEND: 2 comments before it"},
		{"\tMG_SOCK_SEND = 1,", "\t// spare\n\tMG_SOCK_SEND = 1,", "line 9: enum mg_type: a // comment"},
		{"\t/* help: socket layer, with a comma */\n", "", "line 31: MG_G_SOCK: no annotation (want /* help: ... */ before it)"},
		{"/* help: socket layer, with a comma */", "/* what: socket layer */", `"what: socket layer": want a field, KEY: VALUE with KEY one of help`},
	} {
		if !strings.Contains(sample, tc.from) {
			t.Fatalf("sample lacks %q", tc.from)
		}
		src := strings.Replace(sample, tc.from, tc.to, 1)
		h, err := parse(src)
		if err == nil {
			_, err = h.generate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q -> %q: error %v, want %q", tc.from, tc.to, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("error %q is not one line", err)
		}
	}
}

// Whatever the header, genevents says what is wrong or generates Go that
// gofmt accepts: it never panics.
func FuzzGenerate(f *testing.F) {
	f.Add(sample)
	f.Add(strings.Replace(sample, "*/", "", 1))
	f.Add(strings.Replace(sample, "};", "", 1))
	f.Add("#define MG_NTYPES 8\nenum mg_type { /* group: a */ MG_A = 1 }; enum mg_group { /* help: x */ MG_G_A = 1, }; struct mg_hdr {};")
	f.Fuzz(func(t *testing.T, src string) {
		h, err := parse(src)
		if err != nil {
			return
		}
		if _, err := h.generate(); err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("error %q is not one line", err)
		}
	})
}

// What `go generate` prints for a malformed annotation names the file, the
// line and the enumerator.
func TestGenerateFromNamesFile(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "bpf"), 0o755); err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(sample, " * hook: tp_btf/send", " * hooks: tp_btf/send", 1)
	if err := os.WriteFile(filepath.Join(root, headerPath), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := generateFrom(root)
	if want := `bpf/events.h: line 7: MG_SOCK_SEND: "hooks: tp_btf/send": want a field`; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %v, want it to start with %q", err, want)
	}
}
