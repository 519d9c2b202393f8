// SPDX-License-Identifier: Apache-2.0

package record_test

import (
	"testing"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/netlab"
	"github.com/magnet-tracer/magnet/internal/record"
)

// attached says whether res's recording attached program.
func attached(res *record.Result, program string) bool {
	for _, h := range res.Hooks {
		if h.Program == program {
			return h.Attached
		}
	}
	return false
}

// TestDefaultEventSet: what the default set leaves out. tcp_send is opt-in
// (group tcpsend): a default recording has none and does not even attach
// tcp_sendmsg_locked; default,tcpsend has them. dev_queue is written only
// where the device's tx queue has a qdisc that can queue: on a bare veth
// (noqueue) none, and dev_xmit alone carries each packet, as many and as
// large as at ip_send; behind tbf, dev_queue and dev_xmit both, alike in
// count and bytes.
func TestDefaultEventSet(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name   string
		rate   int
		groups event.Group
	}{
		{"unlimited default", 0, event.DefaultGroups | event.GroupIP},
		{"tbf default,tcpsend", 100, event.DefaultGroups | event.GroupIP | event.GroupTCPSend},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lab := netlab.ForTest(t, netlab.Options{Name: "mgset", RateMbit: tc.rate})
			port := uniquePort()
			rec := startRecording(t, record.Config{Filters: record.Filters{Port: port}, Groups: tc.groups})
			const sends, size = 20, 10240
			ftp(t, lab, "tcp", port, sends)
			res := rec.stop(t)
			_, evs, _ := readTrace(t, rec.path)
			client, server := ends(t, conns(t, rec.path), lab, port)

			withSend := tc.groups&event.GroupTCPSend != 0
			if got := attached(res, "tcp_sendmsg_locked"); got != withSend {
				t.Errorf("tcp_sendmsg_locked attached = %v, want %v", got, withSend)
			}
			ts := count(evs, "tcp_send", client.ID)
			if !withSend && (ts.n != 0 || res.Produced["tcp_send"] != 0) {
				t.Errorf("%d tcp_send events (%d produced) without the tcpsend group", ts.n, res.Produced["tcp_send"])
			}
			if withSend {
				// At least one per send call, each what TCP can take in one
				// step: more than nothing, no more than the call's bytes.
				if ts.n < sends {
					t.Errorf("%d tcp_send events for %d sends", ts.n, sends)
				}
				for _, e := range evs {
					if e.name == "tcp_send" && e.conn == client.ID && (e.size <= 0 || e.size > size) {
						t.Errorf("tcp_send of %d bytes, want 1..%d", e.size, size)
					}
				}
			}

			for _, c := range []struct {
				side string
				id   uint64
			}{{"client", client.ID}, {"server", server.ID}} {
				ip, queue, xmit := count(evs, "ip_send", c.id), count(evs, "dev_queue", c.id), count(evs, "dev_xmit", c.id)
				if ip.n == 0 || xmit.n != ip.n {
					t.Errorf("%s: %d dev_xmit for %d ip_send, want one each", c.side, xmit.n, ip.n)
				}
				// dev_xmit's size is the whole frame: the IP packet and
				// its 14-byte Ethernet header.
				if xmit.sum != ip.sum+14*int64(ip.n) {
					t.Errorf("%s: dev_xmit %d bytes, want ip_send's %d + 14 × %d", c.side, xmit.sum, ip.sum, ip.n)
				}
				if tc.rate == 0 && queue.n != 0 {
					t.Errorf("%s: %d dev_queue on a veth without a qdisc, want none", c.side, queue.n)
				}
				if tc.rate != 0 && queue != xmit {
					t.Errorf("%s: dev_queue %d events %d bytes, dev_xmit %d events %d bytes: want the same behind tbf",
						c.side, queue.n, queue.sum, xmit.n, xmit.sum)
				}
			}
			if tc.rate == 0 && res.Produced["dev_queue"] != 0 {
				t.Errorf("%d dev_queue produced on a veth without a qdisc", res.Produced["dev_queue"])
			}
			t.Logf("events %v", res.Events)
		})
	}
}
