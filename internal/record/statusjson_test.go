// SPDX-License-Identifier: Apache-2.0

package record

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/magnet-tracer/magnet/internal/probe"
)

// TestStatusJSON: the status file's hand-made encoding is byte for byte
// what json.MarshalIndent writes, for statuses with and without each
// optional field, strings that need escaping, and across updates that
// change the paths and figures.
func TestStatusJSON(t *testing.T) {
	skipped := uint64(3)
	hooks := []probe.HookStatus{
		{Hook: probe.Hook{Program: "tcp_probe", Kind: "tp_btf", Target: "tcp_probe", Events: []string{"tcp_rcv"}}, Available: true, Attached: true},
		{Hook: probe.Hook{Program: "ip_egress", Kind: "cgroup_skb", Target: "egress"}, Reason: `no "cgroup" <here> & there`},
	}
	base := Status{
		PID: 4242, Output: "/tmp/a b/trace.mgt", Started: time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.UTC),
		Updated: time.Now(), Events: []string{"sock", "tcp"}, BufferBytes: 8 << 20, Hooks: hooks,
	}
	cases := []func(*Status){
		func(*Status) {},
		func(s *Status) {
			s.Previous, s.Filters, s.Command = "/tmp/prev\t<1>.mgt", map[string]string{"port": "5201", "netns": "4026531840"}, []string{"iperf3", `-c "x"`}
		},
		func(s *Status) {
			s.KernelSkipped, s.KernelSkippedChecked = &skipped, 6
			s.BufferUsed, s.Recorded, s.Lost, s.Missed, s.Written = 4096, 1<<40, 7, 2, 1<<33
		},
		func(s *Status) { s.Events, s.Hooks = nil, nil },
		func(s *Status) { s.Output = "" },
	}
	for i, change := range cases {
		st := base
		change(&st)
		var e statusEncoding
		for round := range 3 {
			// Later rounds: what changes while recording.
			st.Updated = st.Updated.Add(time.Second + 7*time.Nanosecond)
			st.Recorded += uint64(round) * 1000
			if round == 2 {
				st.Output, st.Previous = st.Output+".2", st.Output
			}
			want, err := json.MarshalIndent(&st, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			if got := st.appendJSON(nil, &e); string(got) != string(want) {
				t.Errorf("case %d round %d:\n got %s\nwant %s", i, round, got, want)
			}
		}
	}
}

func BenchmarkStatusJSON(b *testing.B) {
	st := Status{Events: []string{"sock", "tcp"}, Filters: map[string]string{"port": "5201"}, Updated: time.Now()}
	for range 14 {
		st.Hooks = append(st.Hooks, probe.HookStatus{Hook: probe.Hook{Program: "tcp_probe", Kind: "tp_btf", Target: "tcp_probe", Events: []string{"tcp_rcv", "tcp_xmit"}}, Available: true, Attached: true})
	}
	var e statusEncoding
	for b.Loop() {
		e.buf = st.appendJSON(e.buf[:0], &e)
	}
}
