// SPDX-License-Identifier: Apache-2.0

package event_test

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/probe"
	"github.com/magnet-tracer/magnet/internal/trace"
)

func dictionary(t *testing.T) []trace.EventType {
	t.Helper()
	types, err := event.Dictionary(probe.Layouts())
	if err != nil {
		t.Fatalf("Dictionary: %v", err)
	}
	return types
}

func byName(t *testing.T, types []trace.EventType, name string) trace.EventType {
	t.Helper()
	for _, et := range types {
		if et.Name == name {
			return et
		}
	}
	t.Fatalf("dictionary has no %s", name)
	return trace.EventType{}
}

func TestDictionaryCoversCatalogue(t *testing.T) {
	types := dictionary(t)
	if len(types) != len(event.Catalogue) {
		t.Fatalf("dictionary has %d types, catalogue %d", len(types), len(event.Catalogue))
	}
	for i, in := range event.Catalogue {
		et := types[i]
		if et.ID != uint8(in.Type) || et.Name != in.Name {
			t.Errorf("dictionary[%d] = %d %s, want %d %s", i, et.ID, et.Name, in.Type, in.Name)
		}
		if want := in.Group.String(); et.Group != want {
			t.Errorf("%s: group %q, want %q", et.Name, et.Group, want)
		}
		if et.Size < trace.CommonSize || et.Size%8 != 0 {
			t.Errorf("%s: size %d is not a multiple of 8 of at least %d", et.Name, et.Size, trace.CommonSize)
		}
		for _, f := range et.Fields {
			if f.Name == "pad" || f.Name == "_pad" || strings.HasPrefix(f.Name, "pad") || f.Name == "hdr" || f.Name == "_" {
				t.Errorf("%s: field %q should not be in the dictionary", et.Name, f.Name)
			}
			if f.Offset < trace.CommonSize || f.Offset+f.Size > et.Size {
				t.Errorf("%s: field %s at %d+%d lies outside bytes %d..%d", et.Name, f.Name, f.Offset, f.Size, trace.CommonSize, et.Size)
			}
		}
	}
}

func TestDictionaryLayouts(t *testing.T) {
	types := dictionary(t)
	u := func(name string, off, size int) trace.Field {
		return trace.Field{Name: name, Offset: off, Size: size, Kind: trace.KindUint}
	}
	for _, tc := range []trace.EventType{
		{ID: 1, Name: "sock_send", Group: "sock", Size: 32},
		{ID: 2, Name: "sock_recv", Group: "sock", Size: 32},
		{ID: 3, Name: "tcp_send", Group: "tcpsend", Size: 32},
		{ID: 4, Name: "tcp_xmit", Group: "tcp", Size: 40, Fields: []trace.Field{
			u("seq", 32, 4), u("gso_segs", 36, 2), u("retrans", 38, 1),
		}},
		{ID: 6, Name: "tcp_state", Group: "tcpstate", Size: 96, Fields: []trace.Field{
			u("cwnd", 32, 4), u("ssthresh", 36, 4), u("srtt_us", 40, 4), u("snd_wnd", 44, 4),
			u("rcv_wnd", 48, 4), u("snd_una", 52, 4), u("snd_nxt", 56, 4), u("packets_out", 60, 4),
			u("retrans_out", 64, 4), u("total_retrans", 68, 4),
			{Name: "state", Offset: 72, Size: 1, Kind: "enum:tcp_state"},
			{Name: "ca_state", Offset: 73, Size: 1, Kind: "enum:ca_state"},
			u("rate_app_limited", 74, 1), u("mss", 76, 4),
			u("delivered", 80, 4), u("rate_delivered", 84, 4), u("rate_interval_us", 88, 4), u("lost", 92, 4),
		}},
		{ID: 8, Name: "ip_send", Group: "ip", Size: 40, Fields: []trace.Field{
			u("ip_id", 32, 2), u("ttl", 34, 1), u("tos", 35, 1),
			{Name: "proto", Offset: 36, Size: 1, Kind: "enum:ipproto"},
			u("family", 37, 1),
		}},
		{ID: 11, Name: "dev_xmit", Group: "dev", Size: 48, Fields: []trace.Field{
			u("ifindex", 32, 4), u("gso_segs", 36, 2), u("ip_id", 38, 2), u("ttl", 40, 1), u("tos", 41, 1),
			{Name: "proto", Offset: 42, Size: 1, Kind: "enum:ipproto"},
			u("family", 43, 1), u("seq", 44, 4),
		}},
		{ID: 13, Name: "drop", Group: "drop", Size: 48, Fields: []trace.Field{
			{Name: "reason", Offset: 32, Size: 4, Kind: "enum:drop_reason"},
			u("ifindex", 36, 4), u("l3proto", 40, 2),
			{Name: "l4proto", Offset: 42, Size: 1, Kind: "enum:ipproto"},
		}},
		{ID: 14, Name: "conn_open", Group: "conn", Size: 72, Fields: []trace.Field{
			{Name: "proto", Offset: 32, Size: 1, Kind: "enum:ipproto"},
			u("family", 33, 1),
			{Name: "state", Offset: 34, Size: 1, Kind: "enum:tcp_state"},
			u("lport", 36, 2), u("rport", 38, 2),
			{Name: "laddr", Offset: 40, Size: 16, Kind: trace.KindIP},
			{Name: "raddr", Offset: 56, Size: 16, Kind: trace.KindIP},
		}},
		{ID: 15, Name: "conn_close", Group: "conn", Size: 56, Fields: []trace.Field{
			u("bytes_acked", 32, 8), u("bytes_received", 40, 8), u("total_retrans", 48, 4),
			{Name: "state", Offset: 52, Size: 1, Kind: "enum:tcp_state"},
		}},
		{ID: 16, Name: "sched_switch", Group: "sched", Size: 72, Fields: []trace.Field{
			u("next_tid", 32, 4), u("next_pid", 36, 4), u("prev_state", 40, 4), u("pick_ns", 44, 4),
			{Name: "next_comm", Offset: 48, Size: 16, Kind: trace.KindStr},
			u("last_switch_ns", 64, 4),
		}},
		{ID: 21, Name: "headers", Group: "headers", Size: 168, Fields: []trace.Field{
			u("ifindex", 32, 4), u("caplen", 36, 2), u("dir", 38, 1),
			{Name: "data", Offset: 40, Size: 128, Kind: trace.KindBytes},
		}},
		{ID: 22, Name: "task", Group: "conn", Size: 56, Fields: []trace.Field{
			u("pid", 32, 4), u("uid", 36, 4),
			{Name: "comm", Offset: 40, Size: 16, Kind: trace.KindStr},
		}},
		{ID: 23, Name: "iface", Group: "conn", Size: 56, Fields: []trace.Field{
			u("ifindex", 32, 4),
			{Name: "name", Offset: 40, Size: 16, Kind: trace.KindStr},
		}},
	} {
		got := byName(t, types, tc.Name)
		if !reflect.DeepEqual(got, tc) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.Name, got, tc)
		}
	}
}

func TestDictionaryLost(t *testing.T) {
	lost := byName(t, dictionary(t), "lost")
	if lost.ID != uint8(event.Lost) || lost.Size != 184 || lost.Group != "conn" {
		t.Errorf("lost: id %d size %d group %q, want id %d size 184 group conn", lost.ID, lost.Size, lost.Group, event.Lost)
	}
	want := []trace.Field{
		{Name: "first_ns", Offset: 32, Size: 8, Kind: trace.KindUint},
		{Name: "last_ns", Offset: 40, Size: 8, Kind: trace.KindUint},
		{Name: "total", Offset: 48, Size: 4, Kind: trace.KindUint},
		{Name: "ring", Offset: 52, Size: 4, Kind: trace.KindUint},
	}
	// One count per catalogue type, at its slot of counts[MG_NTYPES].
	for _, in := range event.Catalogue {
		want = append(want, trace.Field{Name: "n_" + in.Name, Offset: 56 + 4*int(in.Type), Size: 4, Kind: trace.KindUint})
	}
	if !reflect.DeepEqual(lost.Fields, want) {
		t.Errorf("lost fields:\n got %+v\nwant %+v", lost.Fields, want)
	}
	for _, name := range []string{"n_sock_send", "n_tcp_xmit", "n_dev_xmit", "n_iface"} {
		f, ok := lost.Field(name)
		in, _ := event.ByName(strings.TrimPrefix(name, "n_"))
		if !ok || f.Offset != 56+4*int(in.Type) {
			t.Errorf("lost.Field(%q) = %+v, %v; want offset %d", name, f, ok, 56+4*int(in.Type))
		}
	}
}

// TestDictionaryValidates writes a header with the dictionary and reads it
// back: the trace package must accept it unchanged.
func TestDictionaryValidates(t *testing.T) {
	types := dictionary(t)
	var buf bytes.Buffer
	w, err := trace.NewWriter(&buf, &trace.Header{Types: types}, trace.WriterOptions{})
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	if err := w.Close(&trace.Summary{}); err != nil {
		t.Fatalf("Close: %v", err)
	}
	r, err := trace.NewReader(&buf)
	if err != nil {
		t.Fatalf("NewReader: %v", err)
	}
	if !reflect.DeepEqual(r.Header().Types, types) {
		t.Errorf("dictionary changed on the way through a file:\n got %+v\nwant %+v", r.Header().Types, types)
	}
	if !reflect.DeepEqual(r.Header().Common, trace.CommonFields) {
		t.Errorf("common fields = %+v, want %+v", r.Header().Common, trace.CommonFields)
	}
}

func TestDictionaryErrors(t *testing.T) {
	good := probe.Layouts()

	missing := map[event.Type]reflect.Type{}
	for k, v := range good {
		missing[k] = v
	}
	delete(missing, event.TCPRcv)
	if _, err := event.Dictionary(missing); err == nil || err.Error() != "no layout for event tcp_rcv" {
		t.Errorf("missing layout: err = %v, want %q", err, "no layout for event tcp_rcv")
	}

	type odd struct {
		Hdr [32]byte
		Seq uint32
	}
	badSize := map[event.Type]reflect.Type{}
	for k, v := range good {
		badSize[k] = v
	}
	badSize[event.TCPRcv] = reflect.TypeOf(odd{})
	if _, err := event.Dictionary(badSize); err == nil || err.Error() != "event tcp_rcv: size 36 is not a multiple of 8" {
		t.Errorf("odd size: err = %v", err)
	}

	type floaty struct {
		Hdr [32]byte
		Seq float64
	}
	badKind := map[event.Type]reflect.Type{}
	for k, v := range good {
		badKind[k] = v
	}
	badKind[event.TCPRcv] = reflect.TypeOf(floaty{})
	if _, err := event.Dictionary(badKind); err == nil || err.Error() != "event tcp_rcv field seq: no trace kind for Go type float64" {
		t.Errorf("float field: err = %v", err)
	}
}
