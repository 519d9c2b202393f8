// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * magnet's BPF side: one program per kernel hook, each turning what it sees
 * into a fixed-size record (events.h) in one of two ring buffers:
 *   events  - the data path (socket, TCP, IP, device, drops, sched, headers)
 *   control - connection lifecycle and interface names, small and separate
 *             so that a flood of data events cannot crowd them out.
 * When a ring is full the event is counted per CPU and type; no event of that
 * CPU goes in that ring again before a `lost` record with the counts, so the
 * gap is marked in place in the stream.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "events.h"
#include "magnet.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/*
 * Kernel structures are read in place wherever the verifier knows the
 * pointer's BTF type (tracepoint arguments, the kernel context of cgroup and
 * sockops programs, and what is reached from them): a direct load costs a
 * nanosecond, a bpf_probe_read_kernel() call ten or more. Packet bytes, which
 * are behind a plain address, are typed with bpf_rdonly_cast() for the same.
 * Rare paths (filters, connection open and close) keep BPF_CORE_READ.
 *
 * A pointer field read through a trusted pointer (a tracepoint argument,
 * the current task) costs the verifier, at every visit of the load, up to
 * four searches of the kernel's BTF by name (is the field marked trusted
 * or RCU?), each a linear scan of some hundred thousand types on 6.18.
 * Inlined in every event's path, task->cred and sk->...net made 36 % of
 * `magnet record`'s start (1.2 s of CPU on the CI VM): those two are read
 * through KERNEL_CAST, whose untrusted pointer the verifier does not ask
 * about. The load gains a bounds check, too small to measure (bench
 * --compare-with: 1.00 ± 0.04 of the kernel time).
 */
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;

#define KERNEL_CAST(T, p) ((T *)bpf_rdonly_cast((void *)(p), bpf_core_type_id_kernel(T)))

/* Settings, written by the recorder before load. */
const volatile __u32 filter_netns = 0;   /* 0 = any */
const volatile __u16 filter_port = 0;    /* 0 = any */
const volatile __u32 filter_tgid = 0;    /* 0 = any */
const volatile __u64 filter_cgroup = 0;  /* cgroup2 id; 0 = any */
const volatile __u32 self_tgid = 0;      /* the recorder: never traced */
const volatile __u64 exclude_cgroup = 0; /* cgroup2 id whose sockets and tasks are never traced (collect's shipper); 0 = none */
const volatile __u64 events_wakeup = 1;  /* wake the reader at this fill */
const volatile __u64 area_size = 4096;   /* bytes of each CPU's area (a power of two) */
const volatile __u64 nested_size = 4096; /* and of its nested area */
const volatile __u64 nested_wakeup = 1;
const volatile __u32 publish_ordered = 0; /* not x86: publish with a full barrier */
#define AREA_MAX_CPUS 1024
/* The slot of each CPU's areas, + 1; 0: the CPU has none. */
const volatile __u32 area_slot_of[AREA_MAX_CPUS] = {};
const volatile __u64 control_wakeup = 1;

/* Event groups enabled (enum mg_group). Not const: it may change while the
 * programs run, without losing the groups that stay enabled. */
volatile __u32 events_mask = 0;

/* Set when fentry/__tcp_transmit_skb is attached: it then reports tcp_xmit
 * instead of sockops. */
volatile __u8 xmit_by_fentry = 0;

/* A global of each type of events.h, for bpf2go (tools/genevents). */
#include "events_btf.h"

/*
 * Events go to an area of their CPU: MAGNeT's design, a ring of records in
 * memory the reader maps, written without a lock. A CPU's programs then
 * never wait for another CPU's on a ring's lock, never pull its positions'
 * cache line from another CPU, and pay for a record a few stores instead of
 * bpf_ringbuf_reserve() and bpf_ringbuf_submit() (a spin lock taken with
 * interrupts off, and an atomic exchange: 25-31 ns against 6 by magnet
 * bench primitives). The recorder maps each area twice in a row, as the kernel
 * maps a BPF ring buffer, and reads it with the same code: records carry
 * the ring buffer's 8-byte header, and the space left at the end of an area
 * when a record does not fit there is a discarded record.
 *
 * A program writes its record between reserving and publishing it. A
 * program that interrupts it on the same CPU (a softirq over a system
 * call's event, a hard interrupt over a softirq's) must not use the same
 * area: it takes its CPU's nested area, smaller; a third level is lost,
 * counted. Nesting is strictly last-in first-out on a CPU, so a per-CPU
 * depth counter is enough, and the interrupted program finds the position
 * as the nested one left it.
 *
 * The areas of all CPUs are the elements of one array (areas; nested_areas
 * for the second level), and their positions those of area_pos (element
 * 2 × slot + level, a cache line for the producer's position and one for
 * the reader's). A CPU that came online after the load has no slot and
 * loses its events, counted as such. The reader is woken through doorbell,
 * a small BPF ring buffer: an area cannot wake anyone.
 */
struct area_pos {
	__u64 prod; /* written by this CPU's programs only */
	__u64 _pad0[7];
	__u64 cons; /* written by the reader only */
	__u64 _pad1[7];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, 4096); /* the loader sets the area size */
	__uint(max_entries, 1);   /* and the number of CPUs with a slot */
} areas SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, 4096);
	__uint(max_entries, 1);
} nested_areas SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct area_pos);
	__uint(max_entries, 2);
} area_pos SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 << 10);
} doorbell SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 << 10);
} control SEC(".maps");

/*
 * Per-CPU production and loss counts of what any context may count at once
 * (losses, control records, an event that got no area level), with atomic
 * adds. The events themselves are counted in cpu_state (produced).
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mg_counters);
} counters SEC(".maps");

/* Losses not yet reported in the stream, per CPU, for each ring. */
struct lost_state {
	__u64 first_ns;
	__u64 last_ns;
	__u32 pending;
	__u32 counts[MG_NTYPES];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct lost_state);
} lost_states SEC(".maps");

/* Per-socket state, keyed by socket cookie. */
struct conn_info {
	__u8 selected;
	__u8 proto;
	__u8 closed;   /* conn_close written: late packets stay attributed */
	__u8 eligible; /* passes the netns, port and cgroup filters */
	__u16 lport;   /* as first seen: the kernel zeroes it before TCP_CLOSE */
	__u16 rport;   /* as last announced (conn_open): a UDP socket's changes when it connects */
};

/* The last tcp_state snapshot of a TCP socket, kept in the socket: it is
 * consulted at every segment received, and a socket's own storage is found
 * without hashing. */
struct tcp_state_sent {
	__u64 time_ns;
	__u32 ssthresh;
	__u32 retrans;
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct tcp_state_sent);
} tcp_states SEC(".maps");

/* What the last tcp_rate of a TCP socket carried: a new one is written
 * only when tp->delivered has moved since. */
struct tcp_rate_sent {
	__u32 delivered;
	__u32 rate_delivered;
	__u32 rate_interval_us;
	__u8 app_limited;
	__u8 _pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct tcp_rate_sent);
} tcp_rates SEC(".maps");

/* The peer a connected UDP socket's tuple was last learned for. */
struct udp_peer {
	__u32 daddr;    /* skc_daddr (IPv4, v4-mapped too) */
	__u32 daddr6_3; /* the last word of skc_v6_daddr */
	__u16 dport;
	__u16 _pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct udp_peer);
} udp_peers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct conn_info);
} conns SEC(".maps");

/* Address tuple -> cookie, seen from the socket's side (local, remote), so
 * a packet without a socket (ingress at the device) finds its connection. */
struct tuple {
	__u32 netns;
	__u16 lport;
	__u16 rport;
	__u8 laddr[16];
	__u8 raddr[16];
	__u8 proto;
	__u8 _pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct tuple);
	__type(value, __u64);
} tuples SEC(".maps");

/* IPv4 fragments after the first carry no ports: remember the first's. */
struct frag_key {
	__u32 netns;
	__u32 saddr;
	__u32 daddr;
	__u16 id;
	__u8 proto;
	__u8 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct frag_key);
	__type(value, __u64);
} frags SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u8);
} ifaces_seen SEC(".maps");

/* ---------------------------------------------------------------- */
/* ring buffer protocol */

/* A thread's ids and name, as struct mg_task carries them. */
struct task_id {
	__u64 pid_tgid;
	__u32 uid;
	__u32 _pad;
	__u64 comm[2];
};

#define CONN_CACHE_SLOTS 64
#define IFACE_CACHE_SLOTS 16
#define TUPLE_CACHE_SLOTS 16

/* A cached exact match of the tuples map, valid while its slot's count in
 * tuple_gens is gen. */
struct tuple_slot {
	__u32 key[11]; /* struct tuple */
	__u32 gen;
	__u64 cookie;
};

/*
 * What every event of a CPU consults, in one per-CPU value whose first cache
 * line holds what every event reads: at high rates with large copies
 * between events, each distinct line an event touches is a likely cache
 * miss.
 */
struct cpu_state {
	/* The thread whose (tid, pid, comm) this CPU last put in its events
	 * ring: an event of the same thread needs no struct mg_task after it.
	 * The current task of a CPU changes far less often than events. */
	struct task_id task_sent;
	/* Per ring: lost_states may hold losses not yet in the stream. */
	__u32 lost_pending[2];
	/* The reader was woken since the area was last seen below the
	 * wake-up threshold. */
	__u32 woken;
	/* How many of this CPU's programs are between reserving and
	 * publishing a record in its areas: the area level the next one
	 * takes (0: the area, 1: the nested area). */
	__u32 depth;
	__u32 _pad[4];
	/* Caches in front of the LRU maps on the paths every packet takes,
	 * direct-mapped and never invalidated, so they only hold answers that
	 * cannot change: a selected connection stays selected and one the
	 * netns, port or cgroup filter excluded stays excluded (cookies are
	 * never reused), an announced interface stays announced. */
	__u64 verdicts[CONN_CACHE_SLOTS]; /* cookie << 1 | selected */
	__u64 ifaces[IFACE_CACHE_SLOTS];  /* netns << 32 | ifindex, + 1 */
	/* Packets without a socket (received, at the device) find their
	 * connection by address: these cache the tuples map's exact matches,
	 * all invalidated at once whenever the map changes. */
	struct tuple_slot tuples[TUPLE_CACHE_SLOTS];
	/* Events made by the program holding each area level (depth), by
	 * type: no other program touches a level's counts until it is
	 * released, so a plain add is exact, and the most frequent count of
	 * all costs no locked instruction (which on x86 waits for every store
	 * before it) and no second map (its lookup reads the map's own cache
	 * line). The reader adds them to counters'. */
	__u64 produced[2][MG_NTYPES];
};

/* Bumped whenever the tuples map changes a key of the cache slot, so that
 * no CPU uses a cached answer the map no longer gives. One per slot: with
 * many short connections, the tuples change about as often as packets
 * arrive, and a single count made every CPU's whole cache useless. */
volatile __u32 tuple_gens[TUPLE_CACHE_SLOTS];

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cpu_state);
} cpu_states SEC(".maps");

_Static_assert(sizeof(struct tuple) == sizeof(((struct tuple_slot *)0)->key), "tuple_slot.key");

static __always_inline __u32 tuple_slot_of(const __u32 *w)
{
	/* netns, ports, and the last word of each address. */
	return (w[0] ^ w[1] ^ w[5] ^ w[9]) % TUPLE_CACHE_SLOTS;
}

static __always_inline struct cpu_state *my_state(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&cpu_states, &zero);
}

static __always_inline struct mg_counters *my_counters(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&counters, &zero);
}

/* The ring was full (or this CPU has none): count the event as lost. Out
 * of line, like everything rare here, to keep the programs' common path
 * short and its code dense. */
static __noinline void note_lost(__u32 ringidx, __u32 type, __u64 now)
{
	struct lost_state *ls = bpf_map_lookup_elem(&lost_states, &ringidx);
	struct mg_counters *c = my_counters();
	struct cpu_state *st = my_state();

	if (c && type < MG_NTYPES)
		__sync_fetch_and_add(&c->lost[type], 1);
	if (!ls || type >= MG_NTYPES)
		return;
	if (__sync_fetch_and_add(&ls->pending, 1) == 0)
		ls->first_ns = now;
	ls->last_ns = now;
	__sync_fetch_and_add(&ls->counts[type], 1);
	/* After the counts: a flush that clears the flag first sees them. */
	if (st)
		st->lost_pending[ringidx & 1] = 1;
}

/* What a ring record of sz bytes takes in the ring: its 8-byte header and
 * padding to 8 bytes (BPF_RINGBUF_HDR_SZ). */
static __always_inline __u64 ring_bytes(__u64 sz)
{
	return (sz + 8 + 7) & ~7ULL;
}

/* Whether this CPU's lost_states ls holds losses of ring ringidx not yet in
 * the stream. A flush that took the counts of a loss noted while it ran
 * (nested) left the flag set: it is cleared before looking again, and a
 * loss noted meanwhile sets it after its counts. */
static __always_inline int losses_waiting(struct cpu_state *st, struct lost_state *ls, __u32 ringidx)
{
	if (ls->pending)
		return 1;
	st->lost_pending[ringidx & 1] = 0;
	if (!ls->pending)
		return 0;
	st->lost_pending[ringidx & 1] = 1;
	return 1;
}

/* Move the losses ls counts into the `lost` record r of ring ringidx, and
 * return how many they are (none: r is not to be written). */
static __always_inline __u32 take_losses(struct lost_state *ls, struct mg_lost *r, __u32 ringidx, __u64 now)
{
	__u32 total = 0;

	__builtin_memset(r, 0, sizeof(*r));
	__sync_lock_test_and_set(&ls->pending, 0);
	r->first_ns = ls->first_ns;
	r->last_ns = ls->last_ns;
	for (int i = 0; i < MG_NTYPES; i++) {
		__u32 n = __sync_lock_test_and_set(&ls->counts[i], 0);
		r->counts[i] = n;
		total += n;
	}
	r->total = total;
	r->ring = ringidx;
	r->hdr.time_ns = now;
	r->hdr.cpu = bpf_get_smp_processor_id();
	r->hdr.type = MG_LOST;
	r->hdr.size = total;
	return total;
}

/*
 * Write the pending `lost` record of this CPU (st) into the control ring.
 * Returns 0 if it does not fit now: then no record goes in before it either
 * (the gap is marked where it is, and a record that would fit in a ring
 * this full costs a second reservation that nearly always fails). Events'
 * losses go to their area (area_flush_lost).
 */
static __noinline int flush_control_lost(struct cpu_state *st, __u64 now)
{
	__u32 ringidx = 1;
	struct lost_state *ls = bpf_map_lookup_elem(&lost_states, &ringidx);
	struct mg_lost *r;

	if (!ls || !losses_waiting(st, ls, ringidx))
		return 1;
	/* Asking the ring is cheaper than a reservation it refuses (which
	 * takes its lock with interrupts off), and a ring that was full is
	 * likely to stay so for many records. */
	if (bpf_ringbuf_query(&control, BPF_RB_AVAIL_DATA) + ring_bytes(sizeof(*r)) >=
	    bpf_ringbuf_query(&control, BPF_RB_RING_SIZE))
		return 0;
	r = bpf_ringbuf_reserve(&control, sizeof(*r), 0);
	if (!r)
		return 0;
	st->lost_pending[1] = 0;
	if (!take_losses(ls, r, ringidx, now)) {
		bpf_ringbuf_discard(r, BPF_RB_NO_WAKEUP);
		return 1;
	}
	bpf_ringbuf_submit(r, BPF_RB_FORCE_WAKEUP);
	return 1;
}

/* The current thread's ids, uid and name, read in place: one helper call,
 * no copy (what bpf_get_current_pid_tgid(), bpf_get_current_uid_gid() and
 * bpf_get_current_comm() would return, from the same task_struct). */
static __always_inline void current_task_id(struct task_struct *task, struct task_id *t)
{
	t->pid_tgid = (__u64)task->tgid << 32 | (__u32)task->pid;
	t->uid = KERNEL_CAST(struct task_struct, task)->cred->uid.val;
	t->_pad = 0;
	t->comm[0] = *(__u64 *)&task->comm[0];
	t->comm[1] = *(__u64 *)&task->comm[8];
}

static __always_inline void put_task(struct mg_task *t, const struct task_id *id)
{
	t->pid = id->pid_tgid >> 32;
	t->uid = id->uid;
	__builtin_memcpy(t->comm, id->comm, sizeof(t->comm));
}

static __always_inline void count_produced(__u8 type)
{
	struct mg_counters *c = my_counters();

	if (c && type < MG_NTYPES)
		__sync_fetch_and_add(&c->produced[type], 1);
}

/* Count an event made by the holder of area level (cpu_state.produced). */
static __always_inline void count_produced_at(struct cpu_state *st, __u32 level, __u8 type)
{
	if (type < MG_NTYPES)
		st->produced[level & 1][type]++;
}

/* What an emitter learns when it reserves a record. */
struct emit {
	__u64 pid_tgid; /* the current thread, for the header */
	__u64 wakeup;   /* flags for bpf_ringbuf_submit; for an area, whether to ring the doorbell */
	/* 1 for a record in an area (an event), 0 for one in the control
	 * ring. A whole word, so that the verifier knows it on each path and
	 * never takes an area record for a ring buffer's or the reverse. */
	__u64 area;
	__u64 next;   /* an area's producer position once the record is published */
	/* For an area record, what publishing it touches, kept from the
	 * reservation rather than looked up again (two map lookups fewer;
	 * measured no faster, docs/BENCH.md "One state lookup per run", but
	 * one way to reach them). */
	struct area_pos *ap;  /* the area's positions */
	struct cpu_state *st; /* this CPU's state, whose depth submit() restores */
	__u32 level;  /* the area level (cpu_state.depth before the reservation) */
};

/* Wake the reader once the control ring is filled past threshold (rare
 * records: asking the ring costs nothing that matters); it also polls. */
static __always_inline __u64 wakeup_flag(void *ring, __u64 threshold)
{
	return bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA) >= threshold ? BPF_RB_FORCE_WAKEUP
									: BPF_RB_NO_WAKEUP;
}

/* Whether to ring the doorbell for a record of sz bytes just taken in this
 * CPU's area, whose fill is now n: wake the reader when the area passes
 * events_wakeup, at the first event past it (looking only every few events
 * let a loaded machine's reader sleep past the point of losses, measured).
 * area_take computes the fill for every record, so each event looks.
 *
 * Once per crossing: while the area stays past the threshold the reader
 * has been woken already (its edge-triggered epoll keeps the wake-up until
 * it waits again, and it waits only once it found its rings empty), and
 * each further wake-up costs an interrupt on this CPU (the doorbell's
 * bpf_ringbuf_output queues an irq_work, a self-IPI: ~7 µs in this VM,
 * measured).
 *
 * Past half full (or the threshold, if higher) the reader is late (woken
 * but not running: a loaded machine), and every event wakes it again, as
 * all did before: those interrupts also slow this CPU's producers, which
 * kept a reader that runs late from losing events (measured: synthetic
 * events at 4 M/s for 3 s, load average 6-9, a reader like the recorder's:
 * without this, events lost in 2 runs of 5, 490 k of 11.8 M and 619; with
 * it, and with every event waking the reader, none in 4 and 5).
 */
static __always_inline __u64 events_wakeup_flag(struct cpu_state *st, __u64 n, __u64 sz)
{
	if (n < events_wakeup) {
		st->woken = 0;
		return BPF_RB_NO_WAKEUP;
	}
	if (n >= area_size / 2) {
		st->woken = 1;
		return BPF_RB_FORCE_WAKEUP;
	}
	/* Woken already, and past the threshold before this record too. An
	 * area below it before this record is a new crossing, which matters
	 * where the threshold is below a record (--wakeup-fill 0: an area that
	 * holds anything is past it). */
	if (st->woken && n - ring_bytes(sz) >= events_wakeup)
		return BPF_RB_NO_WAKEUP;
	st->woken = 1;
	return BPF_RB_FORCE_WAKEUP;
}

static __always_inline int cgroup_under(struct cgroup *cg, __u64 id)
{
	for (int i = 0; i < 16; i++) {
		if (!cg)
			return 0;
		if (BPF_CORE_READ(cg, kn, id) == id)
			return 1;
		cg = BPF_CORE_READ(cg, self.parent, cgroup);
	}
	return 0;
}

/*
 * Events a traced socket causes in interrupt context take whatever thread is
 * on the CPU. When that is a thread of the excluded cgroup (collect's
 * shipper), they name no thread instead (tid 0, like the idle task's), so
 * that no record names the shipper. Out of line and asked only when the
 * CPU's thread differs from the one it last announced: the shipper's own
 * sockets are never traced, so such events are rare.
 */
static __noinline int current_excluded(struct task_struct *task)
{
	return cgroup_under(BPF_CORE_READ(task, cgroups, dfl_cgrp), exclude_cgroup);
}

static __always_inline int same_task(const struct task_id *a, const struct task_id *b)
{
	return a->pid_tgid == b->pid_tgid && a->uid == b->uid && a->comm[0] == b->comm[0] &&
	       a->comm[1] == b->comm[1];
}

#define barrier() asm volatile("" ::: "memory")

/* The discard bit of a BPF ring buffer record's header (BPF_RINGBUF_DISCARD_BIT). */
#define AREA_DISCARD (1U << 30)

/*
 * Take room for a record of sz bytes (before its header and padding) at
 * the producer position of area slot at level: of map, whose elements are
 * size bytes. The space an area has left at its end when the record does
 * not fit there becomes a discarded record, and the record goes at the
 * start. Returns where the record goes, or NULL when the area is full;
 * e then holds what area_publish needs, and *fill the area's fill with the
 * record. Nothing is visible to the reader before area_publish: the
 * caller owns the level (cpu_state.depth) until then.
 */
static __always_inline void *area_take(void *map, __u64 size, __u32 slot, __u32 level, __u64 sz,
				       struct emit *e, __u64 *fill)
{
	__u32 pi = slot * 2 + level;
	struct area_pos *ap = bpf_map_lookup_elem(&area_pos, &pi);
	char *data = bpf_map_lookup_elem(map, &slot);
	__u64 step = ring_bytes(sz), pos, off, pad = 0, cons;

	if (!ap || !data)
		return NULL;
	pos = ap->prod;
	/* Positions are multiples of 8; the mask says so to the verifier. */
	off = pos & (size - 8);
	if (off > size - step)
		pad = size - off;
	cons = *(volatile __u64 *)&ap->cons;
	if (pos + pad + step - cons > size)
		return NULL;
	if (pad) {
		*(__u64 *)(data + off) = (pad - 8) | AREA_DISCARD;
		pos += pad;
		off = 0;
	}
	/* The header: the length (no busy bit: the record is not the
	 * reader's before its position is published), then the ring buffer's
	 * page offset, which no reader of an area uses. */
	*(__u64 *)(data + off) = sz;
	e->area = 1;
	e->next = pos + step;
	e->ap = ap;
	e->level = level;
	*fill = pos + step - cons;
	return data + off + 8;
}

/* Make the record taken by area_take visible: its bytes must reach memory
 * before the position moves past them. x86 keeps stores in order, so a
 * plain store does (the barriers keep the compiler from moving it); a CPU
 * that may reorder stores gets an exchange, which the JITs make a full
 * barrier (publish_ordered, set by the loader for such CPUs). */
static __always_inline void area_publish(const struct emit *e)
{
	barrier();
	if (publish_ordered)
		__sync_lock_test_and_set(&e->ap->prod, e->next);
	else
		*(volatile __u64 *)&e->ap->prod = e->next;
	barrier();
}

/* Wake the reader: areas cannot, the doorbell ring can. */
static __always_inline void ring_doorbell(void)
{
	__u64 v = 0;

	bpf_ringbuf_output(&doorbell, &v, sizeof(v), BPF_RB_FORCE_WAKEUP);
}

/*
 * Write this CPU's pending `lost` record into its area at level (owned by
 * the caller). Returns 0 if it does not fit now: then no event goes in
 * before it either (the gap is marked where it is).
 */
static __noinline int area_flush_lost(struct cpu_state *st, __u32 slot, __u32 level, __u64 now)
{
	__u32 ringidx = 0;
	struct lost_state *ls = bpf_map_lookup_elem(&lost_states, &ringidx);
	struct emit e = {};
	struct mg_lost *r;
	__u64 fill;

	if (!ls || !losses_waiting(st, ls, ringidx))
		return 1;
	if (level)
		r = area_take(&nested_areas, nested_size, slot, 1, sizeof(*r), &e, &fill);
	else
		r = area_take(&areas, area_size, slot, 0, sizeof(*r), &e, &fill);
	if (!r)
		return 0;
	st->lost_pending[0] = 0;
	if (!take_losses(ls, r, ringidx, now))
		return 1; /* never published: the space stays free */
	area_publish(&e);
	ring_doorbell();
	return 1;
}

/*
 * Reserve an event of sz bytes of the given type in this CPU's area, with
 * struct mg_task after it when this CPU has not yet sent the current
 * thread's (tid, pid, comm). task is the current task. Counts the attempt
 * as produced; on failure counts it as lost (and sends nothing, so the
 * next event carries the task). A program interrupted between this and
 * submit() leaves its level to the interrupting one's: that one takes the
 * nested area (see the areas' comment). st is this CPU's state (my_state()),
 * which the programs on every packet's path look up once for all they do.
 */
static __always_inline void *reserve_event_of(struct cpu_state *st, struct task_struct *task,
					      __u8 type, __u64 sz, __u64 now, struct emit *e)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct task_id cur;
	__u32 level, slot;
	__u64 need, fill;
	void *r;

	if (!st || cpu >= AREA_MAX_CPUS) {
		count_produced(type);
		note_lost(0, type, now);
		return NULL;
	}
	slot = area_slot_of[cpu];
	level = st->depth;
	if (!slot || level > 1) {
		count_produced(type);
		note_lost(0, type, now);
		return NULL;
	}
	slot--;
	e->st = st;
	st->depth = level + 1;
	barrier();
	count_produced_at(st, level, type);
	if (st->lost_pending[0] && !area_flush_lost(st, slot, level, now))
		goto lost;
	current_task_id(task, &cur);
	if (exclude_cgroup && !same_task(&st->task_sent, &cur) && current_excluded(task))
		__builtin_memset(&cur, 0, sizeof(cur));
	e->pid_tgid = cur.pid_tgid;
	need = same_task(&st->task_sent, &cur) ? sz : sz + sizeof(struct mg_task);
	if (level)
		r = area_take(&nested_areas, nested_size, slot, 1, need, e, &fill);
	else
		r = area_take(&areas, area_size, slot, 0, need, e, &fill);
	if (!r)
		goto lost;
	if (need != sz) {
		put_task(r + sz, &cur);
		/* Only once it is in the area: a lost record taught the reader nothing. */
		st->task_sent = cur;
	}
	if (level)
		e->wakeup = fill >= nested_wakeup ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
	else
		e->wakeup = events_wakeup_flag(st, fill, need);
	return r;
lost:
	barrier();
	st->depth = level;
	note_lost(0, type, now);
	return NULL;
}

/* Publish an event, or submit a control record. */
static __always_inline void submit(void *r, struct emit *e)
{
	if (!e->area) {
		bpf_ringbuf_submit(r, e->wakeup);
		return;
	}
	area_publish(e);
	e->st->depth = e->level;
	if (e->wakeup == BPF_RB_FORCE_WAKEUP)
		ring_doorbell();
}

static __always_inline void *reserve_event(__u8 type, __u64 sz, __u64 now, struct emit *e)
{
	return reserve_event_of(my_state(), bpf_get_current_task_btf(), type, sz, now, e);
}

/* Control records are rare: each carries its struct mg_task, so the reader
 * never depends on the order in which it reads the rings. anon: name no
 * task (tid 0), for a record whose current task is not the one it is about
 * (a softirq's interrupted task). */
static __always_inline void *reserve_control_as(__u8 type, __u64 sz, __u64 now, struct emit *e, int anon)
{
	struct cpu_state *st = my_state();
	struct task_struct *task;
	struct task_id cur;
	void *r;

	count_produced(type);
	if (st && st->lost_pending[1] && !flush_control_lost(st, now)) {
		note_lost(1, type, now);
		return NULL;
	}
	task = bpf_get_current_task_btf();
	current_task_id(task, &cur);
	if (anon || (exclude_cgroup && current_excluded(task)))
		__builtin_memset(&cur, 0, sizeof(cur));
	e->pid_tgid = cur.pid_tgid;
	e->area = 0;
	e->wakeup = wakeup_flag(&control, control_wakeup);
	r = bpf_ringbuf_reserve(&control, sz + sizeof(struct mg_task), 0);
	if (!r) {
		note_lost(1, type, now);
		return NULL;
	}
	put_task(r + sz, &cur);
	return r;
}

/* A ring record is the event T, then struct mg_task when the reader does not
 * know the thread yet (always, in the control ring). */
#define RESERVE_EVENT(T, typ, now, e) ((T *)reserve_event(typ, sizeof(T), now, e))
#define RESERVE_EVENT_OF(st, task, T, typ, now, e) ((T *)reserve_event_of(st, task, typ, sizeof(T), now, e))
#define RESERVE_EVENT_IN(st, T, typ, now, e)                                                       \
	((T *)reserve_event_of(st, bpf_get_current_task_btf(), typ, sizeof(T), now, e))
#define RESERVE_CONTROL(T, typ, now, e) ((T *)reserve_control_as(typ, sizeof(T), now, e, 0))
#define SUBMIT(r, e) submit(r, e)

static __always_inline void fill(struct mg_hdr *h, __u8 type, __u64 now, __u64 pid_tgid,
				 __u64 conn, __s32 size, __u32 netns)
{
	h->time_ns = now;
	h->conn = conn;
	h->tid = (__u32)pid_tgid;
	h->size = size;
	h->netns = netns;
	h->cpu = bpf_get_smp_processor_id();
	h->type = type;
	h->flags = 0;
}

static __always_inline int enabled(__u32 group)
{
	return events_mask & group;
}

/* ---------------------------------------------------------------- */
/* sockets and connections */

static __always_inline __u32 sk_netns(const struct sock *sk)
{
	return KERNEL_CAST(struct sock, sk)->__sk_common.skc_net.net->ns.inum;
}

/* The socket cookie: read where the kernel keeps it once made, else made
 * by the helper (ctx is what the program type's helper takes). */
static __always_inline __u64 cookie_of(const struct sock *sk, void *ctx)
{
	__u64 c = sk->__sk_common.skc_cookie.counter;

	return c ? c : bpf_get_socket_cookie(ctx);
}

/* Whether the port filter turns down a socket or packet of these ports
 * (host order): neither is the filter's. */
static __always_inline int port_filtered(__u16 lport, __u16 rport)
{
	return filter_port && lport != filter_port && rport != filter_port;
}

/* Whether cg is the cgroup with this id or below it (16 levels at most). */
static __always_inline int cgroup_matches(struct cgroup *cg)
{
	return cgroup_under(cg, filter_cgroup);
}

/*
 * A task of the excluded cgroup (collect's shipper, and its ssh children):
 * no scheduler event that names it is recorded. Its cgroup is the one it is
 * in now (task->cgroups->dfl_cgrp), as for --cgroup.
 */
static __always_inline int task_excluded(struct task_struct *t)
{
	return cgroup_under(BPF_CORE_READ(t, cgroups, dfl_cgrp), exclude_cgroup);
}

static __always_inline int task_selected(struct task_struct *t)
{
	if (filter_tgid && BPF_CORE_READ(t, tgid) != filter_tgid)
		return 0;
	if (filter_cgroup && !cgroup_matches(BPF_CORE_READ(t, cgroups, dfl_cgrp)))
		return 0;
	return 1;
}

struct sock_addrs {
	__u8 family;
	__u8 proto;
	__u8 state;
	__u16 lport;
	__u16 rport;
	__u8 laddr[16];
	__u8 raddr[16];
	__u32 netns;
};

/* Plain loads through a kernel-typed pointer rather than a probe-read helper
 * call for each field: a socket is read this way once at its first event
 * and once at its close, which under connection churn is most of what a
 * connection costs the programs. */
static __always_inline void read_addrs(const struct sock *s, struct sock_addrs *a)
{
	const struct sock *sk = KERNEL_CAST(struct sock, s);
	__u16 family = sk->__sk_common.skc_family;

	__builtin_memset(a, 0, sizeof(*a));
	a->family = family == AF_INET6 ? 6 : 4;
	a->proto = sk->sk_protocol;
	a->state = sk->__sk_common.skc_state;
	a->lport = sk->__sk_common.skc_num;
	a->rport = __builtin_bswap16(sk->__sk_common.skc_dport);
	a->netns = sk->__sk_common.skc_net.net->ns.inum;
	if (family == AF_INET6) {
		__builtin_memcpy(a->laddr, sk->__sk_common.skc_v6_rcv_saddr.in6_u.u6_addr32, 16);
		__builtin_memcpy(a->raddr, sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32, 16);
	} else {
		*(__u32 *)a->laddr = sk->__sk_common.skc_rcv_saddr;
		*(__u32 *)a->raddr = sk->__sk_common.skc_daddr;
	}
}

/*
 * An address as the tuples map keys it: a v4-mapped IPv6 address
 * (::ffff:a.b.c.d) as the IPv4 address it stands for. A socket of a
 * dual-stack listener (bound to [::], the default of iperf3, Go's ":port",
 * Java, nginx's `listen [::]`) talks IPv4 to an IPv4 client while its own
 * addresses are v4-mapped; the device sees IPv4 packets, which
 * conn_from_headers keys as IPv4.
 */
static __always_inline void tuple_addr(__u8 *dst, const __u8 *src)
{
	const __u32 *w = (const __u32 *)src;

	if (w[0] == 0 && w[1] == 0 && src[8] == 0 && src[9] == 0 && src[10] == 0xff &&
	    src[11] == 0xff) {
		__builtin_memset(dst, 0, 16);
		__builtin_memcpy(dst, src + 12, 4);
		return;
	}
	__builtin_memcpy(dst, src, 16);
}

static __always_inline void tuple_of(const struct sock_addrs *a, struct tuple *k)
{
	k->netns = a->netns;
	k->lport = a->lport;
	k->rport = a->rport;
	tuple_addr(k->laddr, a->laddr);
	tuple_addr(k->raddr, a->raddr);
	k->proto = a->proto;
}

static __always_inline void remember_tuple(const struct sock_addrs *a, __u64 cookie)
{
	struct tuple k = {};

	if (!a->lport)
		return;
	tuple_of(a, &k);
	bpf_map_update_elem(&tuples, &k, &cookie, BPF_ANY);
	/* Also for a key the map did not have: the LRU map may have evicted
	 * it behind a cache's back. */
	__sync_fetch_and_add(&tuple_gens[tuple_slot_of((const __u32 *)&k)], 1);
}

/* Remove the tuple k if it is still cookie's: sockets may share one (UDP
 * sockets bound to the same address and port, as iperf3 -u's server makes
 * when it connects one and binds another), and the last one to announce
 * itself holds it. */
static __noinline void forget_key(struct tuple *k, __u64 cookie)
{
	__u64 *c = bpf_map_lookup_elem(&tuples, k);

	if (!c || *c != cookie)
		return;
	bpf_map_delete_elem(&tuples, k);
	__sync_fetch_and_add(&tuple_gens[tuple_slot_of((const __u32 *)k)], 1);
}

/* Forget a closing socket's tuple, under the local port it had when first
 * seen (TCP has already released it when the socket reaches TCP_CLOSE). A
 * UDP socket may have been announced unconnected, then learned again once
 * connected (udp_learn_peer): its unconnected tuples go too. */
static __always_inline void forget_conn_tuple(struct sock_addrs *a, const struct conn_info *ci, __u64 cookie)
{
	struct tuple k = {};

	if (ci->lport)
		a->lport = ci->lport;
	tuple_of(a, &k);
	forget_key(&k, cookie);
	if (a->proto != IPPROTO_UDP_ || !a->rport)
		return;
	k.rport = 0;
	__builtin_memset(k.raddr, 0, 16);
	forget_key(&k, cookie);
	__builtin_memset(k.laddr, 0, 16);
	forget_key(&k, cookie);
}

/* Announce a connection. process: the current task is the socket's user
 * (a system call of it); otherwise the record names no task, and the
 * connection's owner is the task of its first socket-layer event: an
 * accepted connection is first seen in the softirq that completes its
 * handshake, on whatever task that interrupted (on one host, often the
 * client). */
static __always_inline void emit_conn_open(const struct sock_addrs *a, __u64 cookie, int process, __u8 flags)
{
	__u64 now = bpf_ktime_get_ns();
	struct mg_conn_open *r;
	struct emit e;

	r = (struct mg_conn_open *)reserve_control_as(MG_CONN_OPEN, sizeof(*r), now, &e, !process);
	if (!r)
		return;
	fill(&r->hdr, MG_CONN_OPEN, now, e.pid_tgid, cookie, 0, a->netns);
	r->hdr.flags = flags;
	r->proto = a->proto;
	r->family = a->family;
	r->state = a->state;
	r->_pad = 0;
	r->lport = a->lport;
	r->rport = a->rport;
	__builtin_memcpy(r->laddr, a->laddr, 16);
	__builtin_memcpy(r->raddr, a->raddr, 16);
	SUBMIT(r, &e);
}

/*
 * conn_of returns the connection id (socket cookie) of sk, announcing the
 * connection with conn_open the first time it is seen, or FILTERED when the
 * filters exclude it. process says whether current is the socket's user
 * (socket-layer events), which the pid filter needs. It reads the clock
 * only to announce a connection: callers read it once they know they have
 * something to record, which a filtered-out packet never has.
 */
#define PROCESS_LISTEN 2 /* process, in listen(): the socket's state is about to be TCP_LISTEN */

#define VERDICT_NONE 0
#define VERDICT_SELECTED 1
#define VERDICT_FILTERED 2

static __always_inline int cached_verdict(struct cpu_state *st, __u64 cookie)
{
	__u64 v;

	if (!st)
		return VERDICT_NONE;
	v = st->verdicts[cookie & (CONN_CACHE_SLOTS - 1)];
	if (v >> 1 != cookie)
		return VERDICT_NONE;
	return v & 1 ? VERDICT_SELECTED : VERDICT_FILTERED;
}

/* Only for verdicts that cannot change. */
static __always_inline void cache_verdict(__u64 cookie, int selected)
{
	struct cpu_state *st = my_state();

	if (st && !(cookie >> 63))
		st->verdicts[cookie & (CONN_CACHE_SLOTS - 1)] = cookie << 1 | !!selected;
}

/*
 * Whether sk can be a connection: a TCP stream or UDP datagram socket.
 * Others are not: ping and raw sockets, and the kernel's per-CPU TCP
 * control sockets (raw sockets of protocol TCP) that send the resets and
 * the ACKs no full socket sends, which would otherwise be announced as a
 * connection of local port 6 that never closes. Their packets pass as
 * unattributed.
 */
static __always_inline int is_connection(const struct sock *s)
{
	const struct sock *sk = KERNEL_CAST(struct sock, s);

	if (sk->sk_protocol == IPPROTO_TCP_)
		return sk->sk_type == SOCK_STREAM;
	return sk->sk_protocol == IPPROTO_UDP_ && sk->sk_type == SOCK_DGRAM;
}

/*
 * Whether a filter leaves sk out with an answer that cannot change while
 * the socket lives: its netns or its cgroup, or, for a TCP socket whose two
 * ports are known (they stay until it closes, when the local one is
 * zeroed, which cannot make a socket match), its ports. Such a socket is
 * kept in neither the table nor the tuples: each CPU's verdict cache
 * answers for it, a CPU that has not seen it asks this again, and a packet
 * looked up by its addresses finds nothing, which these same filters drop
 * as unattributed (unattributed_ok; the netns filter drops it at the
 * device, by the device's netns, before any lookup). A host with many
 * short connections besides the recorded ones would otherwise pay, for
 * each of its sockets, a miss, two insertions and two deletions in the LRU
 * maps. A UDP socket's remote port, and an unconnected socket's, can still
 * change: the table keeps its first verdict, as for any other socket.
 */
static __always_inline int stays_filtered(const struct sock *s)
{
	const struct sock *sk = KERNEL_CAST(struct sock, s);
	__u16 lport, rport;

	if (filter_netns && sk->__sk_common.skc_net.net->ns.inum != filter_netns)
		return 1;
	if (filter_cgroup && !cgroup_matches(BPF_CORE_READ(s, sk_cgrp_data.cgroup)))
		return 1;
	if (!filter_port || sk->sk_protocol != IPPROTO_TCP_)
		return 0;
	lport = sk->__sk_common.skc_num;
	rport = __builtin_bswap16(sk->__sk_common.skc_dport);
	return lport && rport && port_filtered(lport, rport);
}

/* conn_of past the per-CPU cache: the connection table, and the filters
 * for a socket seen for the first time. */
static __noinline __u64 conn_slow(struct sock *sk, __u64 cookie, int process)
{
	struct conn_info *ci, fresh = {};
	struct sock_addrs a;
	int sel = 1;

	if (!is_connection(sk))
		return 0;
	if (stays_filtered(sk)) {
		cache_verdict(cookie, 0);
		return FILTERED;
	}
	ci = bpf_map_lookup_elem(&conns, &cookie);
	if (ci) {
		if (ci->selected) {
			cache_verdict(cookie, 1);
			return cookie;
		}
		if (!ci->eligible) {
			cache_verdict(cookie, 0);
			return FILTERED;
		}
		if (ci->closed)
			return FILTERED;
		/* The pid filter can only be judged in the owner's context. */
		if (!(process && filter_tgid && (bpf_get_current_pid_tgid() >> 32) == filter_tgid))
			return FILTERED;
		ci->selected = 1;
		read_addrs(sk, &a);
		if (process == PROCESS_LISTEN)
			a.state = TCP_LISTEN_;
		emit_conn_open(&a, cookie, process, 0);
		cache_verdict(cookie, 1);
		return cookie;
	}
	read_addrs(sk, &a);
	if (process == PROCESS_LISTEN)
		a.state = TCP_LISTEN_;
	/* What stays_filtered left to the table: the netns and cgroup
	 * filters passed. */
	if (port_filtered(a.lport, a.rport))
		sel = 0;
	/* The collect service ships traces from a cgroup of its own: its
	 * sockets, and so every event of them at any layer, are left out. */
	if (exclude_cgroup && cgroup_under(BPF_CORE_READ(sk, sk_cgrp_data.cgroup), exclude_cgroup))
		sel = 0;
	fresh.eligible = sel;
	if (filter_tgid && !(process && (bpf_get_current_pid_tgid() >> 32) == filter_tgid))
		sel = 0;
	fresh.selected = sel;
	fresh.proto = a.proto;
	fresh.lport = a.lport;
	fresh.rport = a.rport;
	bpf_map_update_elem(&conns, &cookie, &fresh, BPF_NOEXIST);
	remember_tuple(&a, cookie);
	if (sel)
		emit_conn_open(&a, cookie, process, 0);
	if (sel || !fresh.eligible)
		cache_verdict(cookie, sel);
	return sel ? cookie : FILTERED;
}

static __always_inline __u64 conn_of(struct cpu_state *st, struct sock *sk, __u64 cookie, int process)
{
	if (!cookie)
		return 0;
	switch (cached_verdict(st, cookie)) {
	case VERDICT_SELECTED:
		return cookie;
	case VERDICT_FILTERED:
		return FILTERED;
	}
	return conn_slow(sk, cookie, process);
}

/*
 * The cookie the socket already has, for a socket reached through an skb:
 * every socket magnet attributes got one at its first socket- or TCP-layer
 * event, before any of its packets reached a device.
 */
static __always_inline __u64 sk_cookie(const struct sock *sk)
{
	return sk->__sk_common.skc_cookie.counter;
}

static __always_inline int sk_is_full(const struct sock *sk)
{
	__u8 st = sk->__sk_common.skc_state;
	return st != TCP_TIME_WAIT_ && st != TCP_NEW_SYN_RECV_;
}

/* Whether the filters leave the socket of this cookie out whatever it
 * does, right after conn_of judged it FILTERED: a verdict that cannot
 * change (the netns, port or cgroup filter, or the excluded cgroup; not
 * the pid filter's) is the only kind the CPU's verdict cache keeps, and
 * conn_of has just put it there. */
static __always_inline int left_out(struct cpu_state *st, __u64 cookie)
{
	return cached_verdict(st, cookie) == VERDICT_FILTERED;
}

/* An event without a connection passes only when no filter needs one. */
static __always_inline int unattributed_ok(__u32 netns)
{
	if (filter_netns && netns != filter_netns)
		return 0;
	return !filter_port && !filter_tgid && !filter_cgroup;
}

/* Length of a TCP segment's data from its control block. */
static __always_inline __s32 seg_len(const struct tcp_skb_cb *cb)
{
	__u16 tflags = cb->tcp_flags;

	return cb->end_seq - cb->seq - !!(tflags & TCPHDR_SYN) - !!(tflags & TCPHDR_FIN);
}

static __always_inline struct tcp_skb_cb *tcp_cb(struct sk_buff *skb)
{
	return (struct tcp_skb_cb *)&skb->cb[0];
}

/* ---------------------------------------------------------------- */
/* socket layer */


/*
 * A UDP socket is announced when first seen, usually at bind(), before it
 * is connected, and connect() has no hook that runs after it: its tuple
 * is then the unconnected one, which a second socket bound to the same
 * address and port (iperf3 -u's server binds one per client) takes over,
 * and its packets found by address went to that socket. At the socket's
 * first send or receive after connect() (socket layer, process context),
 * its connected tuple is learned. Only connected UDP sockets pay for the
 * check: one look in the socket's own storage per call.
 */
static __noinline void udp_learn_peer(struct sock *sk, __u64 cookie)
{
	struct udp_peer *p = bpf_sk_storage_get(&udp_peers, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	const struct sock *k = KERNEL_CAST(struct sock, sk);
	__u32 daddr = k->__sk_common.skc_daddr;
	__u32 daddr6_3 = k->__sk_common.skc_v6_daddr.in6_u.u6_addr32[3];
	__u16 dport = k->__sk_common.skc_dport;
	struct conn_info *ci;
	struct sock_addrs a;
	int was_learned;

	if (!p || (p->dport == dport && p->daddr == daddr && p->daddr6_3 == daddr6_3))
		return;
	was_learned = p->dport != 0;
	p->dport = dport;
	p->daddr = daddr;
	p->daddr6_3 = daddr6_3;
	read_addrs(sk, &a);
	remember_tuple(&a, cookie);
	/* The connection table has its addresses from its first conn_open
	 * (often at bind: 0.0.0.0:port <-> 0.0.0.0:0, whose ends never pair):
	 * announce them again, unless that conn_open had this peer (a socket
	 * first seen connected). */
	ci = bpf_map_lookup_elem(&conns, &cookie);
	if (ci && ci->rport == a.rport && !was_learned)
		return;
	if (ci)
		ci->rport = a.rport;
	emit_conn_open(&a, cookie, 1, MG_CONN_UPDATE);
}


static __always_inline int sock_event(struct sock *sk, int ret, __u8 type)
{
	struct cpu_state *st;
	struct task_struct *task;
	__u64 now, conn, cookie;
	struct mg_hdr *r;
	struct emit e;
	__u16 family;
	int verdict;

	if (!enabled(MG_G_SOCK) || !sk)
		return 0;
	family = sk->__sk_common.skc_family;
	if (family != AF_INET && family != AF_INET6)
		return 0;
	cookie = cookie_of(sk, sk);
	if (!cookie)
		return 0;
	/* A socket the filters left out (the other end of the connection,
	 * under --netns) is done with before the current task is asked for:
	 * a helper call that only the recorder check and the record need. */
	st = my_state();
	verdict = cached_verdict(st, cookie);
	if (verdict == VERDICT_FILTERED)
		return 0;
	/* One helper call for the recorder check and the record. */
	task = bpf_get_current_task_btf();
	if (self_tgid && task->tgid == self_tgid)
		return 0;
	conn = verdict == VERDICT_SELECTED ? cookie : conn_slow(sk, cookie, 1);
	if (conn == FILTERED || !conn)
		return 0;
	if (sk->sk_protocol == IPPROTO_UDP_ && sk->__sk_common.skc_dport)
		udp_learn_peer(sk, conn);
	now = bpf_ktime_get_ns();
	r = RESERVE_EVENT_OF(st, task, struct mg_hdr, type, now, &e);
	if (!r)
		return 0;
	fill(r, type, now, e.pid_tgid, conn, ret, sk_netns(sk));
	SUBMIT(r, &e);
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(sock_send_length, struct sock *sk, int ret, int flags)
{
	return sock_event(sk, ret, MG_SOCK_SEND);
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(sock_recv_length, struct sock *sk, int ret, int flags)
{
	/* MSG_PEEK reads do not take data from the socket. */
	if (flags & 2)
		return 0;
	return sock_event(sk, ret, MG_SOCK_RECV);
}

/* ---------------------------------------------------------------- */
/* TCP */

SEC("tp_btf/tcp_sendmsg_locked")
int BPF_PROG(tcp_sendmsg_locked, struct sock *sk, struct msghdr *msg, struct sk_buff *skb,
	     int size_goal)
{
	struct mg_hdr *r;
	__u64 now, conn;
	struct emit e;
	__u32 left, room;

	if (!enabled(MG_G_TCPSEND))
		return 0;
	conn = conn_of(my_state(), sk, cookie_of(sk, sk), 1);
	if (conn == FILTERED || !conn)
		return 0;
	now = bpf_ktime_get_ns();
	left = msg->msg_iter.count;
	room = size_goal;
	if (skb)
		room = size_goal - skb->len;
	if ((__s32)room <= 0)
		room = size_goal;
	r = RESERVE_EVENT(struct mg_hdr, MG_TCP_SEND, now, &e);
	if (!r)
		return 0;
	/* What this step of tcp_sendmsg_locked can take: the room left in the
	 * tail skb (or a new one), bounded by what the call has left. */
	fill(r, MG_TCP_SEND, now, e.pid_tgid, conn, left < room ? left : room, sk_netns(sk));
	SUBMIT(r, &e);
	return 0;
}

/* Write a tcp_state snapshot of sk. */
static __noinline void emit_tcp_state_rec(struct sock *sk, __u64 conn, __u64 now)
{
	struct tcp_sock *tp = KERNEL_CAST(struct tcp_sock, sk);
	struct mg_tcp_state *r;
	struct emit e;

	r = RESERVE_EVENT(struct mg_tcp_state, MG_TCP_STATE, now, &e);
	if (!r)
		return;
	fill(&r->hdr, MG_TCP_STATE, now, e.pid_tgid, conn, 0, sk_netns(sk));
	r->cwnd = tp->snd_cwnd;
	r->ssthresh = tp->snd_ssthresh;
	r->srtt_us = tp->srtt_us >> 3;
	r->snd_wnd = tp->snd_wnd;
	r->rcv_wnd = tp->rcv_wnd;
	r->snd_una = tp->snd_una;
	r->snd_nxt = tp->snd_nxt;
	r->packets_out = tp->packets_out;
	r->retrans_out = tp->retrans_out;
	r->total_retrans = tp->total_retrans;
	r->state = sk->__sk_common.skc_state;
	r->ca_state = BPF_CORE_READ_BITFIELD(&tp->inet_conn, icsk_ca_state);
	r->rate_app_limited = BPF_CORE_READ_BITFIELD(tp, rate_app_limited);
	r->_pad = 0;
	r->mss = tp->mss_cache;
	r->delivered = tp->delivered;
	r->rate_delivered = tp->rate_delivered;
	r->rate_interval_us = tp->rate_interval_us;
	r->lost = tp->lost;
	SUBMIT(r, &e);
}

static __always_inline void emit_tcp_state(struct sock *sk, __u64 conn, __u64 now, int force)
{
	struct tcp_sock *tp = KERNEL_CAST(struct tcp_sock, sk);
	struct tcp_state_sent *ts;
	__u32 srtt_us, ssthresh, retrans;
	__u64 gap;

	if (!enabled(MG_G_TCPSTATE))
		return;
	ts = bpf_sk_storage_get(&tcp_states, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!ts)
		return;
	srtt_us = tp->srtt_us >> 3;
	ssthresh = tp->snd_ssthresh;
	retrans = tp->retrans_out;
	/* A snapshot per smoothed RTT (at most one per 4 ms), and whenever loss
	 * recovery changes something, keeps the series faithful at a fraction
	 * of the cost of one per ACK: on a LAN, srtt is tens of microseconds. */
	gap = (__u64)srtt_us * 1000;
	if (gap < 4000000)
		gap = 4000000;
	if (!force && ts->time_ns && now - ts->time_ns < gap && ssthresh == ts->ssthresh &&
	    retrans == ts->retrans)
		return;
	ts->time_ns = now;
	ts->ssthresh = ssthresh;
	ts->retrans = retrans;
	emit_tcp_state_rec(sk, conn, now);
}

/*
 * Write a tcp_rate if tp->delivered moved since the socket's last one. The
 * kernel makes its delivery-rate sample in tcp_ack -> tcp_rate_gen, and no
 * hook this kernel offers runs after it on the ACK path (tcp_probe fires
 * before, at the top of tcp_rcv_established; sockops' RTT callback fires in
 * tcp_clean_rtx_queue, also before): the sample is read at the next hook that
 * sees the socket. On a busy sender that is the segment the ACK releases, in
 * the same softirq; otherwise the next segment received or the next state
 * change. docs/EVENTS.md says what this misses.
 */
static __noinline void emit_tcp_rate(struct sock *sk, __u64 conn, __u64 now)
{
	struct tcp_sock *tp = KERNEL_CAST(struct tcp_sock, sk);
	struct tcp_rate_sent *rs;
	struct mg_tcp_rate *r;
	__u32 delivered, rate_delivered, interval;
	__u8 app_limited;
	struct emit e;

	delivered = tp->delivered;
	rs = bpf_sk_storage_get(&tcp_rates, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!rs || rs->delivered == delivered)
		return;
	rate_delivered = tp->rate_delivered;
	interval = tp->rate_interval_us;
	app_limited = BPF_CORE_READ_BITFIELD(tp, rate_app_limited);
	r = RESERVE_EVENT(struct mg_tcp_rate, MG_TCP_RATE, now, &e);
	if (!r)
		return;
	fill(&r->hdr, MG_TCP_RATE, now, e.pid_tgid, conn, delivered - rs->delivered, sk_netns(sk));
	if (rs->delivered && rate_delivered == rs->rate_delivered && interval == rs->rate_interval_us &&
	    app_limited == rs->app_limited)
		r->hdr.flags = MG_RATE_SAME;
	r->ack_ns = tp->delivered_mstamp * 1000;
	r->delivered = delivered;
	r->lost = tp->lost;
	r->rate_delivered = rate_delivered;
	r->rate_interval_us = interval;
	r->mss = tp->mss_cache;
	r->app_limited = app_limited;
	r->ca_state = BPF_CORE_READ_BITFIELD(&tp->inet_conn, icsk_ca_state);
	r->_pad = 0;
	SUBMIT(r, &e);
	rs->delivered = delivered;
	rs->rate_delivered = rate_delivered;
	rs->rate_interval_us = interval;
	rs->app_limited = app_limited;
}

/* tcp_probe fires for every segment tcp_rcv_established handles. */
SEC("tp_btf/tcp_probe")
int BPF_PROG(tcp_probe, struct sock *sk, struct sk_buff *skb)
{
	struct cpu_state *st = my_state();
	struct mg_tcp_rcv *r;
	struct tcp_skb_cb *cb;
	__u64 now, conn;
	struct emit e;

	if (!enabled(MG_G_TCP | MG_G_TCPSTATE | MG_G_RATE))
		return 0;
	conn = conn_of(st, sk, cookie_of(sk, sk), 0);
	if (conn == FILTERED || !conn)
		return 0;
	now = bpf_ktime_get_ns();
	/* The previous ACK's sample, if no segment sent since carried it. */
	if (enabled(MG_G_RATE))
		emit_tcp_rate(sk, conn, now);
	if (enabled(MG_G_TCP)) {
		cb = tcp_cb(skb);
		r = RESERVE_EVENT_IN(st, struct mg_tcp_rcv, MG_TCP_RCV, now, &e);
		if (r) {
			fill(&r->hdr, MG_TCP_RCV, now, e.pid_tgid, conn, seg_len(cb), sk_netns(sk));
			r->hdr.flags = cb->tcp_flags;
			r->seq = cb->seq;
			r->ack = cb->ack_seq;
			SUBMIT(r, &e);
		}
	}
	emit_tcp_state(sk, conn, now, 0);
	return 0;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(tcp_retransmit_skb, struct sock *sk, struct sk_buff *skb, int err)
{
	struct mg_tcp_retrans *r;
	struct tcp_skb_cb *cb;
	__u64 now, conn;
	struct emit e;

	if (!enabled(MG_G_TCP))
		return 0;
	conn = conn_of(my_state(), sk, cookie_of(sk, sk), 0);
	if (conn == FILTERED || !conn)
		return 0;
	now = bpf_ktime_get_ns();
	cb = tcp_cb(skb);
	r = RESERVE_EVENT(struct mg_tcp_retrans, MG_TCP_RETRANS, now, &e);
	if (!r)
		return 0;
	fill(&r->hdr, MG_TCP_RETRANS, now, e.pid_tgid, conn, err < 0 ? err : seg_len(cb), sk_netns(sk));
	r->hdr.flags = cb->tcp_flags;
	r->seq = cb->seq;
	r->state = sk->__sk_common.skc_state;
	r->_pad[0] = r->_pad[1] = r->_pad[2] = 0;
	SUBMIT(r, &e);
	emit_tcp_state(sk, conn, now, 1);
	return 0;
}

static __always_inline void emit_conn_close(struct sock *sk, struct conn_info *ci, __u64 cookie, __u64 now)
{
	struct mg_conn_close *r;
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct sock_addrs a;
	struct emit e;

	read_addrs(sk, &a);
	/*
	 * A TCP connection's packets do not end at TCP_CLOSE: a socket that
	 * closes on its way to TIME_WAIT (or into the FIN_WAIT2 mini socket
	 * an orphan moves to) still gets the peer's FIN and sends the last
	 * ACK, and after a reset, what was in flight still arrives and is
	 * answered with resets. The kernel's own TIME_WAIT socket answers
	 * for it, and nothing tells a program when that one goes. So its
	 * tuple stays, like its conns entry (closed): those packets stay
	 * attributed to it until a new socket of the same addresses takes
	 * the tuple over, or the LRU map ages it out. A listener's, and a
	 * UDP socket's (which others may share), go.
	 */
	if (a.proto != IPPROTO_TCP_ || !a.rport)
		forget_conn_tuple(&a, ci, cookie);
	r = RESERVE_CONTROL(struct mg_conn_close, MG_CONN_CLOSE, now, &e);
	if (r) {
		fill(&r->hdr, MG_CONN_CLOSE, now, e.pid_tgid, cookie, 0, a.netns);
		if (a.proto == IPPROTO_TCP_) {
			r->bytes_acked = BPF_CORE_READ(tp, bytes_acked);
			r->bytes_received = BPF_CORE_READ(tp, bytes_received);
			r->total_retrans = BPF_CORE_READ(tp, total_retrans);
		} else {
			r->bytes_acked = 0;
			r->bytes_received = 0;
			r->total_retrans = 0;
		}
		r->state = a.state;
		r->_pad[0] = r->_pad[1] = r->_pad[2] = 0;
		SUBMIT(r, &e);
	}
	/* Kept (the LRU map ages it out) so that the last ACKs and a reused
	 * cookie lookup do not announce the connection again. */
	ci->closed = 1;
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(inet_sock_set_state, struct sock *sk, int oldstate, int newstate)
{
	__u64 now, cookie, conn;

	if (sk->sk_protocol != IPPROTO_TCP_)
		return 0;
	/* ACKs that reach a closing connection go through
	 * tcp_rcv_state_process, where tcp_probe does not fire: their sample
	 * is caught at the state change they cause (FIN acknowledged). */
	if (enabled(MG_G_RATE) && newstate >= TCP_FIN_WAIT1_ && newstate <= TCP_CLOSING_ &&
	    newstate != TCP_CLOSE_ && newstate != TCP_LISTEN_) {
		conn = conn_of(my_state(), sk, cookie_of(sk, sk), 0);
		if (conn != FILTERED && conn)
			emit_tcp_rate(sk, conn, bpf_ktime_get_ns());
	}
	if (newstate == TCP_LISTEN_) {
		/* Announced by its owner, in listen(): the first SYN then finds
		 * it by address, and the table names the process that listens
		 * rather than the one a SYN's softirq interrupted. */
		conn_of(my_state(), sk, cookie_of(sk, sk), PROCESS_LISTEN);
		return 0;
	}
	if (newstate != TCP_CLOSE_ && newstate != TCP_ESTABLISHED_)
		return 0;
	cookie = cookie_of(sk, sk);
	if (newstate == TCP_ESTABLISHED_) {
		/* Learn the tuple now that both ends are known. */
		conn_of(my_state(), sk, cookie, 0);
		return 0;
	}
	now = bpf_ktime_get_ns();
	struct conn_info *ci = bpf_map_lookup_elem(&conns, &cookie);
	if (!ci || ci->closed)
		return 0;
	conn = ci->selected ? cookie : 0;
	if (conn && enabled(MG_G_RATE))
		emit_tcp_rate(sk, conn, now);
	if (conn && enabled(MG_G_TCPSTATE))
		emit_tcp_state(sk, conn, now, 1);
	if (conn) {
		emit_conn_close(sk, ci, cookie, now);
	} else {
		struct sock_addrs a;

		read_addrs(sk, &a);
		forget_conn_tuple(&a, ci, cookie);
		bpf_map_delete_elem(&conns, &cookie);
	}
	return 0;
}

/* UDP sockets have no state changes: they end when released. */
SEC("cgroup/sock_release")
int udp_release(struct bpf_sock *ctx)
{
	__u64 cookie, now;
	struct conn_info *ci;
	struct sock *sk;

	if (ctx->protocol != IPPROTO_UDP_)
		return 1;
	cookie = bpf_get_socket_cookie(ctx);
	ci = bpf_map_lookup_elem(&conns, &cookie);
	if (!ci || ci->closed)
		return 1;
	now = bpf_ktime_get_ns();
	sk = (struct sock *)bpf_cast_to_kern_ctx(ctx);
	if (!ci->selected) {
		struct sock_addrs a;

		read_addrs(sk, &a);
		forget_conn_tuple(&a, ci, cookie);
		bpf_map_delete_elem(&conns, &cookie);
		return 1;
	}
	emit_conn_close(sk, ci, cookie, now);
	return 1;
}

/*
 * A UDP socket bound to a port is announced at bind time, so that the
 * first datagram it receives is attributed at the device layer already.
 */
static __always_inline int udp_bound(struct bpf_sock *ctx)
{
	if (ctx->protocol != IPPROTO_UDP_)
		return 1;
	conn_of(my_state(), (struct sock *)bpf_cast_to_kern_ctx(ctx), bpf_get_socket_cookie(ctx), 1);
	return 1;
}

SEC("cgroup/post_bind4")
int udp_bind4(struct bpf_sock *ctx)
{
	return udp_bound(ctx);
}

SEC("cgroup/post_bind6")
int udp_bind6(struct bpf_sock *ctx)
{
	return udp_bound(ctx);
}

static __always_inline void emit_tcp_xmit(struct cpu_state *st, struct sock *sk, struct sk_buff *skb,
					 __u64 conn, __u32 snd_nxt, __u64 now)
{
	struct mg_tcp_xmit *r;
	struct tcp_skb_cb *cb = tcp_cb(skb);
	__u32 seq = cb->seq;
	__s32 len = seg_len(cb);
	__u16 segs = cb->tcp_gso_segs;
	struct emit e;

	r = RESERVE_EVENT_IN(st, struct mg_tcp_xmit, MG_TCP_XMIT, now, &e);
	if (!r)
		return;
	fill(&r->hdr, MG_TCP_XMIT, now, e.pid_tgid, conn, len, sk_netns(sk));
	r->hdr.flags = cb->tcp_flags;
	r->seq = seq;
	r->gso_segs = segs ? segs : 1;
	r->retrans = len > 0 && seq_before(seq, snd_nxt);
	r->_pad = 0;
	SUBMIT(r, &e);
}

/*
 * sockops: enable the per-segment header callbacks on every TCP socket as it
 * connects or is accepted; BPF_SOCK_OPS_HDR_OPT_LEN_CB then runs for each
 * segment TCP builds, before it goes to IP. We reserve no option space, so
 * the wire is untouched.
 */
SEC("sockops")
int tcp_segments(struct bpf_sock_ops *skops)
{
	struct bpf_sock_ops_kern *k;
	struct cpu_state *st;
	struct sock *sk;
	struct sk_buff *skb;
	__u64 now, conn;

	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB: {
		__u64 cookie = bpf_get_socket_cookie(skops);

		k = bpf_cast_to_kern_ctx(skops);
		sk = k->sk;
		st = my_state();
		conn = sk ? conn_of(st, sk, cookie, skops->op == BPF_SOCK_OPS_TCP_CONNECT_CB) : 0;
		/* The flag makes TCP run this program for every segment it
		 * sends and every time it works out its MSS: a socket the
		 * filters leave out for good (another netns, port or cgroup;
		 * not one the pid filter may still select) goes without. */
		if (!xmit_by_fentry && !(conn == FILTERED && left_out(st, cookie)))
			bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags |
								 BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
		return 1;
	}
	case BPF_SOCK_OPS_HDR_OPT_LEN_CB:
		break;
	default:
		return 1;
	}
	k = bpf_cast_to_kern_ctx(skops);
	skb = k->skb;
	/* tcp_current_mss() asks for the option length with no skb, once or
	 * more per send call: a third of this program's runs return here,
	 * before anything outside the context is read. */
	if (!skb)
		return 1;
	if (!enabled(MG_G_TCP | MG_G_RATE) || xmit_by_fentry)
		return 1;
	sk = k->sk;
	if (!sk)
		return 1;
	st = my_state();
	conn = conn_of(st, sk, cookie_of(sk, skops), 0);
	if (conn == FILTERED || !conn)
		return 1;
	now = bpf_ktime_get_ns();
	/* The sample of the ACK that let this segment go comes first. */
	if (enabled(MG_G_RATE))
		emit_tcp_rate(sk, conn, now);
	if (enabled(MG_G_TCP))
		emit_tcp_xmit(st, sk, skb, conn, skops->snd_nxt, now);
	return 1;
}

/*
 * Where the kernel allows fentry, tcp_xmit (and the tcp_rate a segment
 * carries out) comes from __tcp_transmit_skb itself: it needs no per-socket
 * flag, so it also sees connections that existed before recording started.
 * The recorder then sets xmit_by_fentry and sockops stops reporting segments.
 */
SEC("fentry/__tcp_transmit_skb")
int BPF_PROG(tcp_xmit_fentry, struct sock *sk, struct sk_buff *skb)
{
	struct cpu_state *st;
	__u64 now, conn;

	if (!enabled(MG_G_TCP | MG_G_RATE) || !xmit_by_fentry)
		return 0;
	st = my_state();
	conn = conn_of(st, sk, cookie_of(sk, sk), 0);
	if (conn == FILTERED || !conn)
		return 0;
	now = bpf_ktime_get_ns();
	if (enabled(MG_G_RATE))
		emit_tcp_rate(sk, conn, now);
	if (enabled(MG_G_TCP))
		emit_tcp_xmit(st, sk, skb, conn, KERNEL_CAST(struct tcp_sock, sk)->snd_nxt, now);
	return 0;
}

/* ---------------------------------------------------------------- */
/* IP: cgroup_skb sees each packet as it leaves / reaches a socket. */

static __always_inline void ip_event(struct __sk_buff *ctx, __u8 type)
{
	struct cpu_state *st;
	struct mg_ip *r;
	struct sk_buff *skb;
	struct sock *sk;
	struct iphdr *ip;
	__u64 now, conn;
	struct emit e;

	if (!enabled(MG_G_IP))
		return;
	skb = bpf_cast_to_kern_ctx(ctx);
	sk = skb->sk;
	if (!sk)
		return;
	st = my_state();
	conn = conn_of(st, sk, cookie_of(sk, ctx), 0);
	if (conn == FILTERED || !conn)
		return;
	now = bpf_ktime_get_ns();
	/* Here skb->data is the IP header, in the linear part. */
	ip = KERNEL_CAST(struct iphdr, skb->data);
	r = RESERVE_EVENT_IN(st, struct mg_ip, type, now, &e);
	if (!r)
		return;
	fill(&r->hdr, type, now, e.pid_tgid, conn, ctx->len, sk_netns(sk));
	if (BPF_CORE_READ_BITFIELD(ip, version) == 4) {
		r->ip_id = __builtin_bswap16(ip->id);
		r->ttl = ip->ttl;
		r->tos = ip->tos;
		r->proto = ip->protocol;
		r->family = 4;
	} else {
		struct ipv6hdr *ip6 = (struct ipv6hdr *)ip;

		r->ip_id = 0;
		r->ttl = ip6->hop_limit;
		r->tos = (BPF_CORE_READ_BITFIELD(ip6, priority) << 4) | (ip6->flow_lbl[0] >> 4);
		r->proto = ip6->nexthdr;
		r->family = 6;
	}
	r->_pad = 0;
	SUBMIT(r, &e);
}

SEC("cgroup_skb/egress")
int ip_egress(struct __sk_buff *ctx)
{
	ip_event(ctx, MG_IP_SEND);
	return 1;
}

SEC("cgroup_skb/ingress")
int ip_ingress(struct __sk_buff *ctx)
{
	ip_event(ctx, MG_IP_RECV);
	return 1;
}

/* ---------------------------------------------------------------- */
/* device */

/* The cookie of the socket a packet belongs to: connected, else bound to
 * the local address only, else bound to the wildcard address; 0 if none.
 * k is changed. */
static __always_inline __u64 tuple_cookie(struct cpu_state *st, struct tuple *k)
{
	const __u32 *w = (const __u32 *)k;
	__u32 slot = tuple_slot_of(w);
	__u32 gen = tuple_gens[slot]; /* before the lookup: a change after it invalidates */
	struct tuple_slot *ts = NULL;
	__u64 *c;

	if (st) {
		ts = &st->tuples[slot];
		if (ts->gen == gen && ts->cookie && ts->key[0] == w[0] && ts->key[1] == w[1] &&
		    ts->key[2] == w[2] && ts->key[3] == w[3] && ts->key[4] == w[4] &&
		    ts->key[5] == w[5] && ts->key[6] == w[6] && ts->key[7] == w[7] &&
		    ts->key[8] == w[8] && ts->key[9] == w[9] && ts->key[10] == w[10])
			return ts->cookie;
	}
	c = bpf_map_lookup_elem(&tuples, k);
	if (c) {
		__u64 cookie = *c;

		if (ts) {
			__builtin_memcpy(ts->key, k, sizeof(ts->key));
			ts->gen = gen;
			ts->cookie = cookie;
		}
		return cookie;
	}
	__builtin_memset(k->raddr, 0, 16);
	k->rport = 0;
	c = bpf_map_lookup_elem(&tuples, k);
	if (c)
		return *c;
	__builtin_memset(k->laddr, 0, 16);
	c = bpf_map_lookup_elem(&tuples, k);
	return c ? *c : 0;
}

/*
 * Find the connection of a packet from its headers at l3 (IPv4/IPv6).
 * ingress says whether the packet arrives (then the socket's local end is
 * the packet's destination). FILTERED, without a lookup, for a packet
 * whose ports the port filter does not name: no recorded socket has them.
 */
static __always_inline __u64 conn_from_headers(struct cpu_state *st, unsigned char *l3,
					       __u16 l3proto, __u32 netns, int ingress)
{
	struct tuple k = {};
	struct udphdr *ports;
	__u16 sport, dport;
	__u64 *c, cookie;

	k.netns = netns;
	if (l3proto == ETH_P_IP) {
		struct iphdr *ip = KERNEL_CAST(struct iphdr, l3);
		struct frag_key fk = {};
		__u32 saddr, daddr;
		__u16 frag;

		k.proto = ip->protocol;
		if (k.proto != IPPROTO_TCP_ && k.proto != IPPROTO_UDP_)
			return 0;
		frag = __builtin_bswap16(ip->frag_off);
		saddr = ip->saddr;
		daddr = ip->daddr;
		if (frag & (IP_OFFSET | IP_MF)) {
			fk.netns = netns;
			fk.saddr = saddr;
			fk.daddr = daddr;
			fk.id = ip->id;
			fk.proto = k.proto;
		}
		if (frag & IP_OFFSET) {
			c = bpf_map_lookup_elem(&frags, &fk);
			return c ? *c : 0;
		}
		/* TCP and UDP both start with the two ports. */
		ports = KERNEL_CAST(struct udphdr, l3 + BPF_CORE_READ_BITFIELD(ip, ihl) * 4);
		sport = ports->source;
		dport = ports->dest;
		if (ingress) {
			__builtin_memcpy(k.laddr, &daddr, 4);
			__builtin_memcpy(k.raddr, &saddr, 4);
		} else {
			__builtin_memcpy(k.laddr, &saddr, 4);
			__builtin_memcpy(k.raddr, &daddr, 4);
		}
		k.lport = __builtin_bswap16(ingress ? dport : sport);
		k.rport = __builtin_bswap16(ingress ? sport : dport);
		if (port_filtered(k.lport, k.rport))
			return FILTERED;
		cookie = tuple_cookie(st, &k);
		if (cookie && (frag & IP_MF))
			bpf_map_update_elem(&frags, &fk, &cookie, BPF_ANY);
		return cookie;
	}
	if (l3proto == ETH_P_IPV6) {
		struct ipv6hdr *ip6 = KERNEL_CAST(struct ipv6hdr, l3);

		k.proto = ip6->nexthdr;
		if (k.proto != IPPROTO_TCP_ && k.proto != IPPROTO_UDP_)
			return 0;
		ports = KERNEL_CAST(struct udphdr, l3 + sizeof(struct ipv6hdr));
		sport = ports->source;
		dport = ports->dest;
		if (ingress) {
			__builtin_memcpy(k.laddr, &ip6->daddr, 16);
			__builtin_memcpy(k.raddr, &ip6->saddr, 16);
		} else {
			__builtin_memcpy(k.laddr, &ip6->saddr, 16);
			__builtin_memcpy(k.raddr, &ip6->daddr, 16);
		}
		k.lport = __builtin_bswap16(ingress ? dport : sport);
		k.rport = __builtin_bswap16(ingress ? sport : dport);
		if (port_filtered(k.lport, k.rport))
			return FILTERED;
		return tuple_cookie(st, &k);
	}
	return 0;
}

/* The connection of a cookie found from a packet's addresses: itself if
 * selected, FILTERED if not, 0 if the table no longer has it (a stale
 * tuple: not announced, not ours). */
static __always_inline __u64 conn_known(struct cpu_state *st, __u64 cookie)
{
	struct conn_info *ci;

	switch (cached_verdict(st, cookie)) {
	case VERDICT_SELECTED:
		return cookie;
	case VERDICT_FILTERED:
		return FILTERED;
	}
	ci = bpf_map_lookup_elem(&conns, &cookie);
	if (!ci)
		return 0;
	if (ci->selected) {
		cache_verdict(cookie, 1);
		return cookie;
	}
	if (!ci->eligible)
		cache_verdict(cookie, 0);
	return FILTERED;
}

/* Announce an interface not in this CPU's cache: from the map, or with a
 * new iface record. */
static __noinline void announce_iface_slow(const struct net_device *dev, __u32 netns, __u32 ifindex,
					   __u64 now)
{
	__u64 key = ((__u64)netns << 32) | ifindex;
	struct cpu_state *st = my_state();
	__u32 slot = (netns ^ ifindex) & (IFACE_CACHE_SLOTS - 1);
	struct mg_iface *r;
	__u8 one = 1;
	struct emit e;

	if (bpf_map_lookup_elem(&ifaces_seen, &key)) {
		if (st)
			st->ifaces[slot] = key + 1;
		return;
	}
	r = RESERVE_CONTROL(struct mg_iface, MG_IFACE, now, &e);
	if (!r)
		return;
	bpf_map_update_elem(&ifaces_seen, &key, &one, BPF_ANY);
	if (st)
		st->ifaces[slot] = key + 1;
	fill(&r->hdr, MG_IFACE, now, e.pid_tgid, 0, 0, netns);
	r->ifindex = ifindex;
	r->_pad = 0;
	BPF_CORE_READ_STR_INTO(&r->name, dev, name);
	SUBMIT(r, &e);
}

static __always_inline void announce_iface(struct cpu_state *st, const struct net_device *dev,
					   __u32 netns, __u32 ifindex, __u64 now)
{
	__u64 key = ((__u64)netns << 32) | ifindex;

	/* + 1: a zeroed slot must not match netns 0, ifindex 0. */
	if (st && st->ifaces[(netns ^ ifindex) & (IFACE_CACHE_SLOTS - 1)] == key + 1)
		return;
	announce_iface_slow(dev, netns, ifindex, now);
}

/* Where emit_headers finds a packet and what it knows of it. */
struct headers_at {
	unsigned char *l2;
	__u64 conn;
	__u64 now;
	__u32 netns;
	__u32 ifindex;
	__u8 dir;
};

static __noinline void emit_headers(struct sk_buff *skb, const struct headers_at *at)
{
	struct mg_headers *r;
	unsigned char *data = skb->data, *l2 = at->l2;
	__u32 headlen = skb->len - skb->data_len;
	__u32 cap = headlen + (__u32)(data - l2);
	__u64 now = at->now;
	struct emit e;

	r = RESERVE_EVENT(struct mg_headers, MG_HEADERS, now, &e);
	if (!r)
		return;
	fill(&r->hdr, MG_HEADERS, now, e.pid_tgid, at->conn, skb->len + (__u32)(data - l2), at->netns);
	r->hdr.flags = at->dir;
	if (cap > MG_SNAP_LEN)
		cap = MG_SNAP_LEN;
	r->ifindex = at->ifindex;
	r->caplen = cap;
	r->dir = at->dir;
	r->_pad = 0;
	__builtin_memset(r->data, 0, MG_SNAP_LEN);
	if (cap)
		bpf_probe_read_kernel(r->data, cap, l2);
	SUBMIT(r, &e);
}

static __always_inline void dev_event(struct sk_buff *skb, const struct net_device *dev, __u8 type)
{
	struct mg_dev *r;
	struct skb_shared_info *si;
	unsigned char *head, *l3, *l2;
	struct sock *sk;
	__u32 netns, ifindex;
	__u64 now, conn = 0;
	struct emit e;
	__u16 l3proto, segs;
	int ingress = type == MG_DEV_RECV;
	struct cpu_state *st;

	if (!enabled(MG_G_DEV | MG_G_HEADERS))
		return;
	if (!dev)
		dev = skb->dev;
	netns = dev->nd_net.net->ns.inum;
	ifindex = dev->ifindex;
	l3proto = __builtin_bswap16(skb->protocol);
	head = skb->head;
	l2 = head + skb->mac_header;
	if (ingress)
		l3 = skb->data;
	else
		l3 = head + skb->network_header;
	sk = skb->sk;
	st = my_state();
	if (!ingress && sk && sk_is_full(sk))
		conn = conn_of(st, sk, sk_cookie(sk), 0);
	/* Not a connection's socket: the kernel's TCP control socket, which
	 * sends the ACKs and resets of a TIME_WAIT socket or of none; found by
	 * address like a packet received. */
	if (!conn) {
		/* By its addresses a packet finds only a socket of the device's
		 * netns: under another netns filter it would be filtered out
		 * anyway (the other end of a veth pair, for one). */
		if (filter_netns && netns != filter_netns)
			return;
		conn = conn_from_headers(st, l3, l3proto, netns, ingress);
		if (conn && conn != FILTERED)
			conn = conn_known(st, conn);
	}
	if (conn == FILTERED)
		return;
	if (!conn && !unattributed_ok(netns))
		return;
	now = bpf_ktime_get_ns();
	announce_iface(st, dev, netns, ifindex, now);
	if (enabled(MG_G_HEADERS) && type != MG_DEV_QUEUE) {
		struct headers_at at = {
			.l2 = ingress ? l2 : skb->data,
			.conn = conn,
			.now = now,
			.netns = netns,
			.ifindex = ifindex,
			.dir = ingress,
		};
		emit_headers(skb, &at);
	}
	if (!enabled(MG_G_DEV))
		return;
	si = KERNEL_CAST(struct skb_shared_info, head + skb->end);
	segs = si->gso_segs;
	r = RESERVE_EVENT_IN(st, struct mg_dev, type, now, &e);
	if (!r)
		return;
	fill(&r->hdr, type, now, e.pid_tgid, conn, skb->len, netns);
	r->ifindex = ifindex;
	r->gso_segs = segs ? segs : 1;
	r->_pad = 0;
	SUBMIT(r, &e);
}

/*
 * Whether the tx queue __dev_queue_xmit() is about to use has a qdisc that
 * can hold the packet. Without one (noqueue: veth's and lo's default, most
 * virtual devices; its enqueue is NULL) __dev_queue_xmit() calls
 * dev_hard_start_xmit() right after trace_net_dev_queue, so net_dev_start_xmit
 * follows in the same call with the same skb and dev_queue would tell
 * nothing more. The queue is dev->_tx[skb->queue_mapping]: netdev_core_pick_tx()
 * (or, after a tc egress program chose it, netdev_tx_queue_mapping()) stored
 * its index there before the tracepoint, capped to real_num_tx_queues like
 * netdev_cap_txqueue(), which falls back to queue 0. A few loads, no helper
 * call: this runs for every packet sent.
 */
static __always_inline int qdisc_can_queue(struct sk_buff *skb)
{
	struct net_device *dev = skb->dev;
	struct netdev_queue *txq;
	__u32 i;

	if (!dev)
		return 1;
	i = skb->queue_mapping;
	if (i >= dev->real_num_tx_queues)
		i = 0;
	txq = KERNEL_CAST(struct netdev_queue,
			  (__u64)dev->_tx + (__u64)i * bpf_core_type_size(struct netdev_queue));
	return txq->qdisc && txq->qdisc->enqueue;
}

SEC("tp_btf/net_dev_queue")
int BPF_PROG(net_dev_queue, struct sk_buff *skb)
{
	if (!qdisc_can_queue(skb))
		return 0;
	dev_event(skb, NULL, MG_DEV_QUEUE);
	return 0;
}

SEC("tp_btf/net_dev_start_xmit")
int BPF_PROG(net_dev_start_xmit, struct sk_buff *skb, struct net_device *dev)
{
	dev_event(skb, dev, MG_DEV_XMIT);
	return 0;
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(netif_receive_skb, struct sk_buff *skb)
{
	dev_event(skb, NULL, MG_DEV_RECV);
	return 0;
}

/* ---------------------------------------------------------------- */
/* drops */

SEC("tp_btf/kfree_skb")
int BPF_PROG(kfree_skb, struct sk_buff *skb, void *location, enum skb_drop_reason reason,
	     struct sock *rx_sk)
{
	struct mg_drop *r;
	struct net_device *dev;
	struct sock *sk = rx_sk;
	__u32 netns = 0, ifindex = 0;
	__u64 now, conn = 0;
	struct emit e;

	if (!enabled(MG_G_DROP))
		return 0;
	if (!sk)
		sk = skb->sk;
	dev = skb->dev;
	if (dev) {
		netns = dev->nd_net.net->ns.inum;
		ifindex = dev->ifindex;
	}
	if (sk && sk_is_full(sk)) {
		conn = conn_of(my_state(), sk, sk_cookie(sk), 0);
		if (conn == FILTERED)
			return 0;
		netns = sk_netns(sk);
	}
	if (!conn && !unattributed_ok(netns))
		return 0;
	now = bpf_ktime_get_ns();
	r = RESERVE_EVENT(struct mg_drop, MG_DROP, now, &e);
	if (!r)
		return 0;
	fill(&r->hdr, MG_DROP, now, e.pid_tgid, conn, skb->len, netns);
	r->reason = reason;
	r->ifindex = ifindex;
	r->l3proto = __builtin_bswap16(skb->protocol);
	r->l4proto = sk && sk_is_full(sk) ? sk->sk_protocol : 0;
	__builtin_memset(r->_pad, 0, sizeof(r->_pad));
	SUBMIT(r, &e);
	return 0;
}

/* ---------------------------------------------------------------- */
/* scheduler (opt-in) */

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	struct mg_sched_switch *r;
	__u64 now;
	struct emit e;

	if (!enabled(MG_G_SCHED))
		return 0;
	if ((filter_tgid || filter_cgroup) && !task_selected(prev) && !task_selected(next))
		return 0;
	/* Either side: the header names prev, the body next. */
	if (exclude_cgroup && (task_excluded(prev) || task_excluded(next)))
		return 0;
	now = bpf_ktime_get_ns();
	r = RESERVE_EVENT(struct mg_sched_switch, MG_SCHED_SWITCH, now, &e);
	if (!r)
		return 0;
	fill(&r->hdr, MG_SCHED_SWITCH, now, e.pid_tgid, 0, 0, 0);
	r->next_tid = next->pid;
	r->next_pid = next->tgid;
	r->prev_state = prev_state;
	r->_pad = 0;
	BPF_CORE_READ_STR_INTO(&r->next_comm, next, comm);
	SUBMIT(r, &e);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(sched_wakeup, struct task_struct *p)
{
	struct mg_sched_wakeup *r;
	__u64 now;
	struct emit e;

	if (!enabled(MG_G_SCHED))
		return 0;
	if ((filter_tgid || filter_cgroup) && !task_selected(p))
		return 0;
	/* The header names the waker (current), the body the woken task. */
	if (exclude_cgroup && (task_excluded(p) || task_excluded(bpf_get_current_task_btf())))
		return 0;
	now = bpf_ktime_get_ns();
	r = RESERVE_EVENT(struct mg_sched_wakeup, MG_SCHED_WAKEUP, now, &e);
	if (!r)
		return 0;
	fill(&r->hdr, MG_SCHED_WAKEUP, now, e.pid_tgid, 0, 0, 0);
	r->target_tid = p->pid;
	r->target_cpu = p->wake_cpu;
	BPF_CORE_READ_STR_INTO(&r->target_comm, p, comm);
	SUBMIT(r, &e);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(sched_process_fork, struct task_struct *parent, struct task_struct *child)
{
	struct mg_sched_fork *r;
	__u64 now;
	struct emit e;

	if (!enabled(MG_G_SCHED))
		return 0;
	if ((filter_tgid || filter_cgroup) && !task_selected(parent))
		return 0;
	/* The child too: the service starts the shipper straight into its
	 * cgroup (CLONE_INTO_CGROUP), which the child is in by now. */
	if (exclude_cgroup && (task_excluded(parent) || task_excluded(child)))
		return 0;
	now = bpf_ktime_get_ns();
	r = RESERVE_EVENT(struct mg_sched_fork, MG_SCHED_FORK, now, &e);
	if (!r)
		return 0;
	fill(&r->hdr, MG_SCHED_FORK, now, e.pid_tgid, 0, 0, 0);
	r->child_tid = child->pid;
	r->child_pid = child->tgid;
	BPF_CORE_READ_STR_INTO(&r->child_comm, child, comm);
	SUBMIT(r, &e);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(sched_process_exit, struct task_struct *p, bool group_dead)
{
	struct mg_sched_exit *r;
	__u64 now;
	struct emit e;

	if (!enabled(MG_G_SCHED))
		return 0;
	if ((filter_tgid || filter_cgroup) && !task_selected(p))
		return 0;
	if (exclude_cgroup && task_excluded(p))
		return 0;
	now = bpf_ktime_get_ns();
	r = RESERVE_EVENT(struct mg_sched_exit, MG_SCHED_EXIT, now, &e);
	if (!r)
		return 0;
	fill(&r->hdr, MG_SCHED_EXIT, now, e.pid_tgid, 0, p->exit_code, 0);
	r->exit_code = p->exit_code;
	r->group_dead = group_dead;
	r->_pad[0] = r->_pad[1] = r->_pad[2] = 0;
	SUBMIT(r, &e);
	return 0;
}

/* ---------------------------------------------------------------- */
/* synthetic events (magnet bench) */

/*
 * Never attached, and loaded only on request (probe.Options.Synthetic):
 * `magnet bench` runs synth_event with BPF_PROG_TEST_RUN to put events in
 * the rings through the path every hook takes (clock, counters, this CPU's
 * ring, the task), at a rate it chooses and without any network stack
 * around it, which measures that path's cost alone and the highest rate
 * the recorder keeps up with. synth_empty is the same call doing nothing:
 * the cost of the test run itself. synth_burst makes MG_SYNTH_BURST events
 * per run, so that the test run's own cost (~16 ns, ~60 while any process
 * has run statistics on) is shared: one producer thread, sharing its CPU
 * with a transfer, can then outrun the recorder.
 */
static __always_inline void synth_put(__u32 len)
{
	struct mg_dev *r;
	__u64 now = bpf_ktime_get_ns();
	struct emit e;

	r = RESERVE_EVENT(struct mg_dev, MG_DEV_XMIT, now, &e);
	if (!r)
		return;
	fill(&r->hdr, MG_DEV_XMIT, now, e.pid_tgid, 0, len, 0);
	r->ifindex = 0;
	r->gso_segs = 1;
	r->_pad = 0;
	SUBMIT(r, &e);
}

SEC("tc")
int synth_event(struct __sk_buff *ctx)
{
	synth_put(ctx->len);
	return 0;
}

static long synth_burst_one(__u64 i, void *len)
{
	synth_put(*(__u32 *)len);
	return 0;
}

SEC("tc")
int synth_burst(struct __sk_buff *ctx)
{
	__u32 len = ctx->len;

	bpf_loop(MG_SYNTH_BURST, synth_burst_one, &len, 0);
	return 0;
}

/*
 * synth_nested does, within one run, what an interrupt does to a program
 * between its reservation and its publication: it reserves an event,
 * makes another before publishing the first (which goes to the nested
 * area), and a third while both are held (lost: there is no third level).
 * Their sizes tell them apart: 1, 2 and 3.
 */
SEC("tc")
int synth_nested(struct __sk_buff *ctx)
{
	struct mg_dev *r;
	__u64 now = bpf_ktime_get_ns();
	struct emit e;

	r = RESERVE_EVENT(struct mg_dev, MG_DEV_XMIT, now, &e);
	if (!r)
		return 0;
	fill(&r->hdr, MG_DEV_XMIT, now, e.pid_tgid, 0, 1, 0);
	r->ifindex = 0;
	r->gso_segs = 1;
	r->_pad = 0;
	{
		struct mg_dev *r2;
		__u64 now2 = bpf_ktime_get_ns();
		struct emit e2;

		r2 = RESERVE_EVENT(struct mg_dev, MG_DEV_XMIT, now2, &e2);
		if (r2) {
			fill(&r2->hdr, MG_DEV_XMIT, now2, e2.pid_tgid, 0, 2, 0);
			r2->ifindex = 0;
			r2->gso_segs = 1;
			r2->_pad = 0;
			synth_put(3);
			SUBMIT(r2, &e2);
		}
	}
	SUBMIT(r, &e);
	return 0;
}

SEC("tc")
int synth_empty(struct __sk_buff *ctx)
{
	return 0;
}
