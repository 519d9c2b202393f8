// SPDX-License-Identifier: Apache-2.0

package netlab

import (
	"os/exec"
	"strings"
	"testing"
)

func TestSetRate(t *testing.T) {
	l := ForTest(t, Options{Name: "netlabrate", RateMbit: 50})
	qdisc := func(h Host) string {
		out, err := exec.Command("tc", "-n", h.NS, "qdisc", "show", "dev", h.Iface).CombinedOutput()
		if err != nil {
			t.Fatalf("tc qdisc show: %v: %s", err, out)
		}
		return string(out)
	}
	if q := qdisc(l.Client); !strings.Contains(q, "tbf") || !strings.Contains(q, "rate 50Mbit") {
		t.Fatalf("before: %s", q)
	}
	if err := l.SetRate(20); err != nil {
		t.Fatal(err)
	}
	for _, h := range []Host{l.Client, l.Server} {
		if q := qdisc(h); !strings.Contains(q, "rate 20Mbit") || strings.Count(q, "qdisc tbf") != 1 {
			t.Fatalf("%s after SetRate(20): %s", h.NS, q)
		}
	}
	if l.RateMbit != 20 {
		t.Fatalf("RateMbit %d", l.RateMbit)
	}
	if err := l.SetRate(0); err == nil {
		t.Fatal("SetRate(0) accepted")
	}
}
