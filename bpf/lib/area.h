/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The ring buffer protocol: per-CPU state, reserving and publishing a
 * record in its CPU's area, loss records in place, waking the reader. */
#ifndef MAGNET_LIB_AREA_H
#define MAGNET_LIB_AREA_H


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
	/* tcp_probe's copies of its sockets' last tcp_state (by cookie). */
	struct state_memo state_memos[STATE_MEMO_SLOTS];
	/* Where an event goes under no_emit: written, never read. */
	__u8 scratch[256];
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
	 * ring, 2 for a scratch record (no_emit). A whole word, so that the verifier knows it on each path and
	 * never takes an area record for a ring buffer's or the reverse. */
	__u64 area;
	__u64 next;   /* an area's producer position once the record is published */
	/* For an area record, what publishing it touches, kept from the
	 * reservation rather than looked up again (two map lookups fewer;
	 * measured no faster, docs/BENCH.md at d71bc17 "One state lookup per run", but
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

	if (no_emit) {
		/* The event is filled, so that every read it needs is made;
		 * area, count, task and wake-up are what it skips. */
		if (!st || sz > sizeof(st->scratch))
			return NULL;
		e->area = 2;
		e->st = st;
		e->pid_tgid = 0;
		return st->scratch;
	}
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
	if (no_emit && e->area == 2)
		return;
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
 * never depends on the order in which it reads the rings. This one names
 * task who (a socket's owner the recorder found, for a socket learned at
 * start). */
static __always_inline void *reserve_control_for(__u8 type, __u64 sz, __u64 now, struct emit *e,
						 const struct task_id *who)
{
	struct cpu_state *st = my_state();
	void *r;

	count_produced(type);
	if (st && st->lost_pending[1] && !flush_control_lost(st, now)) {
		note_lost(1, type, now);
		return NULL;
	}
	e->pid_tgid = who->pid_tgid;
	e->area = 0;
	e->wakeup = wakeup_flag(&control, control_wakeup);
	r = bpf_ringbuf_reserve(&control, sz + sizeof(struct mg_task), 0);
	if (!r) {
		note_lost(1, type, now);
		return NULL;
	}
	put_task(r + sz, who);
	return r;
}

/* A control record naming the current task. anon: name no task (tid 0),
 * for a record whose current task is not the one it is about (a softirq's
 * interrupted task). */
static __always_inline void *reserve_control_as(__u8 type, __u64 sz, __u64 now, struct emit *e, int anon)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct task_id cur;

	current_task_id(task, &cur);
	if (anon || (exclude_cgroup && current_excluded(task)))
		__builtin_memset(&cur, 0, sizeof(cur));
	return reserve_control_for(type, sz, now, e, &cur);
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

#endif
