// SPDX-License-Identifier: Apache-2.0

package probe

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/magnet-tracer/magnet/internal/event"
)

// TestDevRunSlotsBatch reads the device runs' per-CPU slots with one batch
// lookup: every CPU's value of every slot must come back, as walking the
// slots one key at a time reads them. Runs written into a free slot under
// a key no interface has (the device programs leave a slot another key
// holds alone) must be summed exactly over the CPUs.
func TestDevRunSlotsBatch(t *testing.T) {
	p, _ := loadForListener(t, event.GroupDev|event.GroupConn)
	m := p.coll.Maps["dev_run_slots"]
	if m == nil {
		t.Fatal("no dev_run_slots map with the dev group")
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	// A free slot: key 0 on every CPU.
	free := -1
	for i := range int(m.MaxEntries()) {
		var percpu []magnetMgDevRunSlot
		if err := m.Lookup(uint32(i), &percpu); err != nil {
			t.Fatal(err)
		}
		used := false
		for _, s := range percpu {
			used = used || s.Key != 0
		}
		if !used {
			free = i
			break
		}
	}
	if free < 0 {
		t.Skip("every device-run slot is taken by this host's interfaces")
	}
	const key = uint64(0xfffffff0)<<32 | 7 // netns inode and ifindex no interface has
	vals := make([]magnetMgDevRunSlot, cpus)
	var want DevRuns
	for c := range vals {
		n := [4]uint64{uint64(10*c + 1), uint64(10*c + 2), uint64(10*c + 3), uint64(10*c + 4)}
		vals[c] = magnetMgDevRunSlot{Key: key + 1, Runs: magnetMgDevRuns{N: n}}
		want.Queue += n[0]
		want.QueueDirect += n[1]
		want.Xmit += n[2]
		want.Recv += n[3]
	}
	if err := m.Update(uint32(free), vals, ebpf.UpdateExist); err != nil {
		t.Fatal(err)
	}

	batch, err := readDevRunSlots(m)
	if err != nil {
		t.Fatal(err)
	}
	if len(batch) != int(m.MaxEntries())*cpus {
		t.Fatalf("batch read %d values, want %d slots × %d CPUs", len(batch), m.MaxEntries(), cpus)
	}
	for c := range cpus {
		if got := batch[free*cpus+c]; got != vals[c] {
			t.Errorf("slot %d CPU %d: batch read %+v, wrote %+v", free, c, got, vals[c])
		}
	}
	walked, err := iterateDevRunSlots(m)
	if err != nil {
		t.Fatal(err)
	}
	if len(walked) != len(batch) {
		t.Fatalf("walk read %d values, batch %d", len(walked), len(batch))
	}
	for i := range walked {
		// Other slots may change between the two reads (this host's
		// traffic); only their keys stay once taken.
		if walked[i].Key != batch[i].Key && batch[i].Key != 0 {
			t.Errorf("value %d: walk has key %#x, batch %#x", i, walked[i].Key, batch[i].Key)
		}
	}

	got, err := p.DevRunsByInterface()
	if err != nil {
		t.Fatal(err)
	}
	if got[key] != want {
		t.Errorf("runs of the written key: %+v, want %+v", got[key], want)
	}
}
