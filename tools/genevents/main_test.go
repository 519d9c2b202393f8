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
enum mg_type { MG_NONE = 0, MG_SOCK_SEND = 1, MG_IP_SEND = 2, MG_TASK = 3, MG_TCP_XMIT = 4, MG_TYPE_MAX = 5, };
enum mg_group { MG_G_SOCK = 1 << 0, /* comment, with a comma */ MG_G_IP = 1 << 3, };
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
