// SPDX-License-Identifier: Apache-2.0

package probe

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/magnet-tracer/magnet/internal/event"
	"github.com/magnet-tracer/magnet/internal/pcapfilter"
)

// TestLoadAll loads every program on this kernel, as an ordinary recording,
// with a pcap-filter expression, in summary mode and both: each setting
// makes other code reachable, and the verifier judges each anew (an
// expression adds conn_slow and pcap_eval to a hook's call chain, whose
// frames together must stay within 512 bytes). On a kernel that has the
// hooks (6.8+, as on CI) every one must load and attach: a skip must never
// hide a verifier regression.
func TestLoadAll(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loading BPF needs root")
	}
	e, err := pcapfilter.Parse("tcp port 80 and net 10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	expr, err := e.Compile()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		pcap    []pcapfilter.Insn
		summary bool
		atDev   bool
	}{
		{"plain", nil, false, false},
		{"expression", expr, false, false},
		{"summary", nil, true, false},
		{"summary+expression", expr, true, false},
		{"xmit-at-device", nil, false, true},
		{"xmit-at-device+expression", expr, false, true},
		{"xmit-at-device+summary", nil, true, true},
		{"sockops", nil, false, false},
		{"sockops+expression", expr, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var disable []string
			if strings.HasPrefix(c.name, "sockops") {
				// sockops' per-segment callback serves tcp_xmit
				// where IP egress cannot.
				disable = []string{"ip_egress"}
			}
			loadAll(t, Options{Groups: event.AllGroups(), BufferBytes: 1 << 20, ControlBytes: 64 << 10,
				Filters: Filters{Pcap: c.pcap}, Summary: c.summary, XmitAtDevice: c.atDev, Disable: disable})
		})
	}
}

func loadAll(t *testing.T, opts Options) {
	t.Helper()
	p, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	perPacket := opts.Groups
	if opts.Summary {
		// The socket groups' figures are read from each socket: their
		// programs, which run per packet, must not be there.
		perPacket &^= SocketGroups
		if p.sockIter == nil {
			t.Error("summary mode without its socket iterator")
		}
	}
	for _, st := range p.Status {
		if st.Groups&perPacket == 0 {
			if st.Attached {
				t.Errorf("%s (groups %s) attached in summary mode: its figures are read from the socket", st.Program, st.Groups)
			}
			continue
		}
		if st.Available && !st.Attached {
			t.Errorf("%s (%s %s): available but not attached: %s", st.Program, st.Kind, st.Target, st.Reason)
		}
		// fentry is refused on some kernels (ours among them): then sockops
		// must serve tcp_xmit. Everything else must load.
		if !st.Available && st.Reason != "disabled" && !(st.Kind == "fentry" && (strings.HasPrefix(st.Reason, "refused") || st.Reason == FentryStandsBack)) {
			t.Errorf("%s: unavailable on this kernel: %s", st.Program, st.Reason)
		}
	}
	if opts.Summary {
		return
	}
	served := ServedBy(p.Status)
	for _, in := range event.Catalogue {
		if in.Hook == "recorder" || in.Name == "lost" || in.Name == "headers" || in.Name == "iface" {
			continue
		}
		if served[in.Name] == "" && !(in.Name == "ip_send" && slices.Contains(opts.Disable, "ip_egress")) {
			t.Errorf("no hook serves %s", in.Name)
		}
	}
	// At the device when asked; otherwise fentry where the kernel allows
	// it, else IP egress (sockops only if ip_egress cannot be had).
	want := []string{"fentry/__tcp_transmit_skb", "cgroup_skb/egress"}
	if slices.Contains(opts.Disable, "ip_egress") {
		want = []string{"fentry/__tcp_transmit_skb", "sockops/sockops"}
	}
	if opts.XmitAtDevice && !opts.Summary {
		want = []string{"tp_btf/net_dev_queue"}
	}
	if got := served["tcp_xmit"]; !slices.Contains(want, got) {
		t.Errorf("tcp_xmit served by %q", got)
	}
	t.Logf("tcp_xmit served by %s", served["tcp_xmit"])
}

// TestObjectHasNoLabPrograms: the product's object carries only its hooks'
// programs and the iterators that learn the existing sockets; the lab's synthetic events are in bpf/synthevent.bpf.c, loaded
// beside it (LoadSharing), never shipped in it.
func TestObjectHasNoLabPrograms(t *testing.T) {
	spec, err := loadMagnet()
	if err != nil {
		t.Fatal(err)
	}
	hooked := map[string]bool{sockIterProgram: true}
	for _, h := range Hooks {
		hooked[h.Program] = true
	}
	for _, name := range LearnPrograms {
		hooked[name] = true
	}
	for name := range spec.Programs {
		if !hooked[name] {
			t.Errorf("program %s in magnet's object is no hook's (a lab program belongs in an object of its own)", name)
		}
	}
}

// TestXmitVariable: the global that makes the other tcp_xmit programs stand
// back is set by fentry always, and by ip_egress or net_dev_queue only when
// Load chose it to serve tcp_xmit.
func TestXmitVariable(t *testing.T) {
	for _, c := range []struct {
		program, xmitAt, want string
	}{
		{"tcp_xmit_fentry", "", "xmit_by_fentry"},
		{"tcp_xmit_fentry", XmitAtDevice, "xmit_by_fentry"},
		{"net_dev_queue", "", ""},
		{"net_dev_queue", XmitAtIP, ""},
		{"net_dev_queue", XmitAtDevice, "xmit_at_dev"},
		{"ip_egress", "", ""},
		{"ip_egress", XmitAtDevice, ""},
		{"ip_egress", XmitAtIP, "xmit_at_ip"},
		{"tcp_segments", XmitAtIP, ""},
		{"tcp_segments", XmitAtDevice, ""},
	} {
		if got := xmitVariable(c.program, c.xmitAt); got != c.want {
			t.Errorf("xmitVariable(%q, %q) = %q, want %q", c.program, c.xmitAt, got, c.want)
		}
	}
}
