// SPDX-License-Identifier: Apache-2.0

package primitives

import (
	"encoding/binary"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// Constants of the kernel's BPF ABI (include/uapi/linux/bpf.h) that the
// programs pass to helpers.
const (
	xdpPass      = 2 // XDP_PASS: what every program returns
	rbNoWakeup   = 1 // BPF_RB_NO_WAKEUP: submit without waking a reader
	rbAvailData  = 0 // BPF_RB_AVAIL_DATA: bpf_ringbuf_query's "bytes not consumed"
	recordBytes  = 40
	ringbufHdr   = 8  // BPF_RINGBUF_HDR_SZ: what the ring buffer adds to each record
	slotBytes    = 48 // a record of the array ring: the same 40 bytes and an 8-byte header of its own
	tupleKeySize = 44 // sizeof(struct tuple) in bpf/events.h: magnet's per-connection key
)

// Array ring layout: one element of the BPF_F_MMAPABLE array per CPU, the
// head (records written so far) in its first cache line, so that a reader
// could find it through the mapping, then maps.slots records of slotBytes.
// The slots are as many as a batch's runs, so that a batch writes fresh
// memory as it does in the ring buffer, not a few hot cache lines; an
// array element holds 4 MiB at the most (KMALLOC_MAX_SIZE).
const (
	arrayHeadBytes = 64
	minArraySlots  = 1 << 10
	maxArraySlots  = 1 << 16
)

// Labels every program shares: out returns XDP_PASS, fail counts a failure
// of the program first (a reservation refused, a lookup that missed).
const (
	labelOut  = "out"
	labelFail = "fail"
)

// maps are the maps the programs use, made once for the whole run.
type maps struct {
	failures *ebpf.Map // per-CPU array: failures counted by program index
	counter  *ebpf.Map // per-CPU array, one u64: the atomic and plain adds
	tuples   *ebpf.Map // hash keyed by a 44-byte tuple, holding tupleKey
	ring     *ebpf.Map // BPF ring buffer
	array    *ebpf.Map // BPF_F_MMAPABLE array: one array ring per CPU
	slots    int       // records in each CPU's array ring, a power of two
}

// program is one measured BPF program: what it does once per run.
type program struct {
	Name string // short identifier, as in the report and its JSON
	Does string // what one run does, for the report
	// body is the work of one run, given the maps; it may jump to
	// labelFail to count a failure or labelOut to end.
	body func(m *maps) asm.Instructions
	// usesRing: the program writes into the ring buffer, whose consumer
	// position must be moved to the producer's before each batch.
	usesRing bool
}

// programs is every measured program in the order of the report. The first
// is the empty program that every other figure is taken net of.
var programs = []program{
	{Name: "empty", Does: "nothing: return XDP_PASS (the test run's own cost per run)",
		body: func(*maps) asm.Instructions { return nil }},
	{Name: "ktime_get_ns", Does: "bpf_ktime_get_ns(): the clock magnet stamps every event with (CLOCK_MONOTONIC)",
		body: call(asm.FnKtimeGetNs)},
	{Name: "ktime_get_boot_ns", Does: "bpf_ktime_get_boot_ns() (CLOCK_BOOTTIME)",
		body: call(asm.FnKtimeGetBootNs)},
	{Name: "ktime_get_coarse_ns", Does: "bpf_ktime_get_coarse_ns(): the tick-resolution clock, no clock source read (too coarse for per-step delays)",
		body: call(asm.FnKtimeGetCoarseNs)},
	{Name: "get_smp_processor_id", Does: "bpf_get_smp_processor_id() (the verifier inlines it on x86-64)",
		body: call(asm.FnGetSmpProcessorId)},
	{Name: "get_prandom_u32", Does: "bpf_get_prandom_u32(): a plain helper call",
		body: call(asm.FnGetPrandomU32)},
	{Name: "percpu_atomic_add", Does: "per-CPU array lookup and an atomic add to its u64",
		body: percpuAdd(true)},
	{Name: "percpu_plain_add", Does: "per-CPU array lookup and a plain load, add, store",
		body: percpuAdd(false)},
	{Name: "hash_lookup_44", Does: "hash map lookup of a 44-byte key (magnet's struct tuple) built on the stack, that hits",
		body: hashLookup},
	{Name: "ringbuf_query", Does: "bpf_ringbuf_query(BPF_RB_AVAIL_DATA): how full a ring buffer is (a wake-up policy's look)",
		body: ringbufQuery},
	{Name: "ringbuf_reserve_submit", Does: "bpf_ringbuf_reserve of 40 bytes, 5 stores, bpf_ringbuf_submit(BPF_RB_NO_WAKEUP)",
		body: ringbufRecord(false), usesRing: true},
	{Name: "ringbuf_output", Does: "40 bytes stored on the stack, bpf_ringbuf_output(BPF_RB_NO_WAKEUP) copies them",
		body: ringbufOutput, usesRing: true},
	{Name: "array_ring", Does: "a 48-byte record stored into this CPU's ring in a BPF_F_MMAPABLE array at its head, head advanced, no lock (MAGNeT's design, and how magnet records its events)",
		body: arrayRing(false)},
	{Name: "ktime_ringbuf", Does: "an event's least: bpf_ktime_get_ns, then the ring buffer record above holding the time",
		body: ringbufRecord(true), usesRing: true},
	{Name: "ktime_array_ring", Does: "an event's least: bpf_ktime_get_ns, then the array ring record above holding the time",
		body: arrayRing(true)},
}

// instructions is the whole program: the body, then (when the body can
// fail) the failure count, and the return that every body may jump to. The
// verifier refuses unreachable instructions, so a body that cannot fail
// gets no failure count.
func (p program) instructions(index int, m *maps) asm.Instructions {
	body := p.body(m)
	insns := append(asm.Instructions{}, body...)
	if references(body, labelFail) {
		insns = append(insns,
			asm.Ja.Label(labelOut),
			// Count a failure in failures[index] of this CPU.
			asm.StoreImm(asm.RFP, -4, int64(index), asm.Word).WithSymbol(labelFail),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.LoadMapPtr(asm.R1, m.failures.FD()),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, labelOut),
			asm.Mov.Imm(asm.R1, 1),
			asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 0))
	}
	return append(insns,
		asm.Mov.Imm(asm.R0, xdpPass).WithSymbol(labelOut),
		asm.Return())
}

func references(insns asm.Instructions, label string) bool {
	for _, ins := range insns {
		if ins.Reference() == label {
			return true
		}
	}
	return false
}

func call(fn asm.BuiltinFunc) func(*maps) asm.Instructions {
	return func(*maps) asm.Instructions { return asm.Instructions{fn.Call()} }
}

// lookupZero looks up key 0 of m; R0 is the value, or the program counts a
// failure.
func lookupZero(m *ebpf.Map) asm.Instructions {
	return asm.Instructions{
		asm.StoreImm(asm.RFP, -8, 0, asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, labelFail),
	}
}

func percpuAdd(atomic bool) func(*maps) asm.Instructions {
	return func(m *maps) asm.Instructions {
		insns := lookupZero(m.counter)
		if atomic {
			return append(insns,
				asm.Mov.Imm(asm.R1, 1),
				asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 0))
		}
		return append(insns,
			asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
			asm.Add.Imm(asm.R1, 1),
			asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord))
	}
}

// tupleWords are the 32-bit words of the key the hash program looks up,
// stored one by one as magnet builds a tuple from a socket's fields.
var tupleWords = func() [tupleKeySize / 4]int32 {
	var w [tupleKeySize / 4]int32
	for i := range w {
		w[i] = int32(0x0a000001 + i<<8)
	}
	return w
}()

// tupleKey is tupleWords as the bytes of the key in the hash map.
func tupleKey() []byte {
	key := make([]byte, tupleKeySize)
	for i, w := range tupleWords {
		binary.NativeEndian.PutUint32(key[4*i:], uint32(w))
	}
	return key
}

func hashLookup(m *maps) asm.Instructions {
	const at = -48 // the key's place on the stack, 8-byte aligned
	var insns asm.Instructions
	for i, w := range tupleWords {
		insns = append(insns, asm.StoreImm(asm.RFP, int16(at+4*i), int64(w), asm.Word))
	}
	return append(insns,
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, at),
		asm.LoadMapPtr(asm.R1, m.tuples.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, labelFail))
}

func ringbufQuery(m *maps) asm.Instructions {
	return asm.Instructions{
		asm.LoadMapPtr(asm.R1, m.ring.FD()),
		asm.Mov.Imm(asm.R2, rbAvailData),
		asm.FnRingbufQuery.Call(),
	}
}

// recordValue puts what a record's stores write in R7: the clock's time,
// read now, withClock; else a constant.
func recordValue(withClock bool) asm.Instructions {
	if withClock {
		return asm.Instructions{asm.FnKtimeGetNs.Call(), asm.Mov.Reg(asm.R7, asm.R0)}
	}
	return asm.Instructions{asm.Mov.Imm(asm.R7, 1)}
}

// ringbufRecord reserves 40 bytes, fills them with five 8-byte stores and
// submits them; withClock reads the clock first and stores the time.
func ringbufRecord(withClock bool) func(*maps) asm.Instructions {
	return func(m *maps) asm.Instructions {
		insns := recordValue(withClock)
		insns = append(insns,
			asm.LoadMapPtr(asm.R1, m.ring.FD()),
			asm.Mov.Imm(asm.R2, recordBytes),
			asm.Mov.Imm(asm.R3, 0),
			asm.FnRingbufReserve.Call(),
			asm.JEq.Imm(asm.R0, 0, labelFail))
		for off := int16(0); off < recordBytes; off += 8 {
			insns = append(insns, asm.StoreMem(asm.R0, off, asm.R7, asm.DWord))
		}
		return append(insns,
			asm.Mov.Reg(asm.R1, asm.R0),
			asm.Mov.Imm(asm.R2, rbNoWakeup),
			asm.FnRingbufSubmit.Call())
	}
}

func ringbufOutput(m *maps) asm.Instructions {
	insns := asm.Instructions{asm.Mov.Imm(asm.R7, 1)}
	for off := int16(-recordBytes); off < 0; off += 8 {
		insns = append(insns, asm.StoreMem(asm.RFP, off, asm.R7, asm.DWord))
	}
	return append(insns,
		asm.LoadMapPtr(asm.R1, m.ring.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -recordBytes),
		asm.Mov.Imm(asm.R3, recordBytes),
		asm.Mov.Imm(asm.R4, rbNoWakeup),
		asm.FnRingbufOutput.Call(),
		asm.JNE.Imm(asm.R0, 0, labelFail))
}

// arrayRing stores a 48-byte record at this CPU's head in the mmapable
// array and advances the head: MAGNeT's own design, a ring per CPU that
// only that CPU writes, so no lock. (A reader on another CPU would need
// the head stored after the record; x86-64 keeps stores in order.)
// withClock reads the clock first and stores the time.
func arrayRing(withClock bool) func(*maps) asm.Instructions {
	return func(m *maps) asm.Instructions {
		insns := recordValue(withClock)
		insns = append(insns,
			asm.FnGetSmpProcessorId.Call(),
			asm.StoreMem(asm.RFP, -8, asm.R0, asm.Word),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -8),
			asm.LoadMapPtr(asm.R1, m.array.FD()),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, labelFail),
			asm.Mov.Reg(asm.R6, asm.R0),               // this CPU's ring
			asm.LoadMem(asm.R1, asm.R6, 0, asm.DWord), // head
			asm.Mov.Reg(asm.R2, asm.R1),
			asm.And.Imm(asm.R2, int32(m.slots-1)),
			asm.Mul.Imm(asm.R2, slotBytes),
			asm.Mov.Reg(asm.R3, asm.R6),
			asm.Add.Reg(asm.R3, asm.R2))
		for off := int16(0); off < slotBytes; off += 8 {
			insns = append(insns, asm.StoreMem(asm.R3, arrayHeadBytes+off, asm.R7, asm.DWord))
		}
		return append(insns,
			asm.Add.Imm(asm.R1, 1),
			asm.StoreMem(asm.R6, 0, asm.R1, asm.DWord))
	}
}
