// SPDX-License-Identifier: Apache-2.0

package witness

import (
	"reflect"
	"strings"
	"testing"
)

func TestScript(t *testing.T) {
	s := Script(Options{NetNS: []uint32{4026532177, 4026532246}, Port: 5201, Hooks: []Hook{Xmit, Recv}, Frames: true, Drops: true})
	for _, want := range []string{
		"tracepoint:net:net_dev_start_xmit {", "tracepoint:net:netif_receive_skb {", "tracepoint:skb:kfree_skb {",
		"$ns == 4026532177 || $ns == 4026532246",
		"$t->source == 20756 || $t->dest == 20756", // 5201 = 0x1451, read little-endian 0x5114
		"@f[2, $ns", "@f[3, $ns", "args->reason",
		"interval:ms:100",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("script has no %q:\n%s", want, s)
		}
	}
	if strings.Contains(Script(Options{NetNS: []uint32{1}, Port: 1}), "@f[") {
		t.Error("frames keyed without Options.Frames")
	}
	if strings.Contains(Script(Options{NetNS: []uint32{1}, Port: 1}), "net_dev_queue") {
		t.Error("net_dev_queue counted without asking")
	}
}

func TestParse(t *testing.T) {
	out := `Attaching 4 probes...
tick

@b[2, 4026532177, 2, 6, 20756, 44623]: 30000
@d[4026532177, 2, 64, 6, 44623, 20756]: 3
@d[4026532177, 2, 2, 0, 0, 0]: 1
@f[2, 4026532177, 2, 6, 20756, 44623, 16777216, 1514]: 2
@f[2, 4026532177, 2, 6, 20756, 44623, 33554432, 66]: 1
@n[2, 4026532177, 2, 6, 20756, 44623]: 3
`
	c, err := Parse(out, map[int]string{64: "QDISC_DROP", 2: "NOT_SPECIFIED"})
	if err != nil {
		t.Fatal(err)
	}
	k := Key{Hook: Xmit, NetNS: 4026532177, IfIndex: 2, Proto: 6, SPort: 5201, DPort: 20398}
	if got := c.Packets[k]; got != (Tally{N: 3, Bytes: 30000}) {
		t.Errorf("packets %v: %+v", k, c.Packets)
	}
	if got := c.Sum(Match{Hook: Xmit, SPort: 5201}); got != (Tally{N: 3, Bytes: 30000}) {
		t.Errorf("sum %+v", got)
	}
	if got := c.Sum(Match{Hook: Recv}); got != (Tally{}) {
		t.Errorf("recv sum %+v, want none", got)
	}
	want := map[Frame]int{{Seq: 1, Len: 1514}: 2, {Seq: 2, Len: 66}: 1}
	if got := c.FramesOf(Match{Hook: Xmit}); !reflect.DeepEqual(got, want) {
		t.Errorf("frames %v, want %v", got, want)
	}
	if n := c.DropsOf(4026532177, 2, "QDISC_DROP", 5201); n != 3 {
		t.Errorf("qdisc drops of port 5201: %d, want 3", n)
	}
	if n := c.DropsOf(4026532177, 0, "NOT_SPECIFIED", 0); n != 1 {
		t.Errorf("drops of any port: %d, want 1", n)
	}
	if n := c.DropsOf(4026532177, 0, "NOT_SPECIFIED", 5201); n != 0 {
		t.Errorf("a drop of no port counted for port 5201")
	}
	if _, err := Parse("@n[1, 2]: 3\n", nil); err == nil {
		t.Error("a line with too few keys parsed")
	}
}

func TestSubtract(t *testing.T) {
	a := map[Frame]int{{1, 100}: 2, {2, 100}: 1, {3, 66}: 1}
	b := map[Frame]int{{1, 100}: 1, {3, 66}: 1, {4, 66}: 1}
	aOnly, bOnly := Subtract(a, b)
	if !reflect.DeepEqual(aOnly, []Frame{{1, 100}, {2, 100}}) || !reflect.DeepEqual(bOnly, []Frame{{4, 66}}) {
		t.Errorf("a only %v, b only %v", aOnly, bOnly)
	}
}
