// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * magnet's generic kernel events: one program for any tracepoint (classic,
 * its context the raw tracefs record) and one for uprobes (the registers).
 * The recorder loads this object once per event asked for, with that
 * event's layout in the read-only globals below, so the verifier sees every
 * size and offset as a constant and each event's own program counts its own
 * runs the kernel skipped (recursion_misses). The ring and counters are
 * shared by all of them (the recorder passes the first load's maps to the
 * others). Nothing here runs unless such an event is asked for.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "events.h"
#include "kevent.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* This event. */
const volatile __u8 kev_type = 0;    /* its type id in the trace */
const volatile __u8 kev_lost_type = 0; /* kevent_lost's type id */
const volatile __u32 kev_slot = 0;   /* its counters' slot, < KEV_MAX */
const volatile __u32 kev_size = 40;  /* record size, struct mg_task not included */
const volatile __u32 kev_copy = 0;   /* bytes of the raw record copied from offset 8 */
const volatile __u32 kev_nstrs = 0;
const volatile struct kev_str kev_strs[KEV_MAX_STRS] = {};
const volatile __u32 kev_nzero = 0;
const volatile __u16 kev_zero[KEV_MAX_ZERO] = {}; /* record offsets of 8-byte kernel addresses */
const volatile __u32 kev_npreds = 0;
const volatile struct kev_pred kev_preds[KEV_MAX_PREDS] = {};
const volatile __u32 kev_nargs = 0; /* a USDT probe's arguments; 0: a uprobe's registers */
const volatile struct kev_arg kev_args[KEV_UPROBE_ARGS] = {};
const volatile __u8 kev_task_filter = 0; /* the event belongs to the current task: filters apply */

/* The recording's filters (magnet record --pid, --cgroup, --netns). */
const volatile __u32 filter_tgid = 0;
const volatile __u64 filter_cgroup = 0;
const volatile __u32 filter_netns = 0;
const volatile __u32 self_tgid = 0;
const volatile __u64 wakeup_bytes = 0; /* wake the reader past this fill */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} kev_ring SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kev_counters);
} kev_counters SEC(".maps");

/* Losses not yet written as a kevent_lost record, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kev_lost);
} kev_pending SEC(".maps");

/* Never read: keeps the types in BTF for bpf2go. */
struct kev_lost _k0 = {};
struct kev_uprobe _k1 = {};
struct kev_counters _k2 = {};
struct kev_pred _k3 = {};
struct kev_str _k4 = {};
struct mg_task _k5 = {};
struct kev_arg _k6 = {};

static __always_inline int cgroup_selected(void)
{
	if (!filter_cgroup)
		return 1;
	if (bpf_get_current_cgroup_id() == filter_cgroup)
		return 1;
	for (int l = 1; l < 16; l++) {
		__u64 id = bpf_get_current_ancestor_cgroup_id(l);
		if (id == filter_cgroup)
			return 1;
		if (!id)
			break;
	}
	return 0;
}

static __always_inline __u32 current_netns(struct task_struct *t)
{
	return BPF_CORE_READ(t, nsproxy, net_ns, ns.inum);
}

/* Whether the event passes the recording's filters. */
static __always_inline int selected(__u64 pid_tgid, __u32 netns)
{
	__u32 tgid = pid_tgid >> 32;
	/* A system-wide event (an interrupt) is not the current task's: not
	 * even the recorder's own. */
	if (!kev_task_filter)
		return 1;
	if (tgid == self_tgid)
		return 0;
	if (filter_tgid && tgid != filter_tgid)
		return 0;
	if (filter_netns && netns != filter_netns)
		return 0;
	return cgroup_selected();
}

static __always_inline void fill_hdr(struct mg_hdr *h, __u64 now, __u64 pid_tgid, __u32 netns)
{
	h->time_ns = now;
	h->conn = 0;
	h->tid = (__u32)pid_tgid;
	h->size = 0;
	h->netns = netns;
	h->cpu = bpf_get_smp_processor_id();
	h->type = kev_type;
	h->flags = 0;
}

static __always_inline void fill_task(struct mg_task *tk, __u64 pid_tgid)
{
	tk->pid = pid_tgid >> 32;
	tk->uid = (__u32)bpf_get_current_uid_gid();
	bpf_get_current_comm(tk->comm, sizeof(tk->comm));
}

static __always_inline __u64 wake_flags(void)
{
	if (bpf_ringbuf_query(&kev_ring, BPF_RB_AVAIL_DATA) > wakeup_bytes)
		return BPF_RB_FORCE_WAKEUP;
	return BPF_RB_NO_WAKEUP;
}

/* Writes the losses this CPU still owes the stream, before its next event:
 * the gap is marked where it happened. Returns 0 if they still cannot be
 * written (the event that follows is then lost too). */
static __always_inline int flush_lost(struct kev_lost *p, __u64 now)
{
	if (!p->total)
		return 1;
	struct kev_lost *l = bpf_ringbuf_reserve(&kev_ring, sizeof(*l), 0);
	if (!l)
		return 0;
	__builtin_memcpy(l, p, sizeof(*l));
	l->hdr.time_ns = now;
	l->hdr.conn = 0;
	l->hdr.tid = 0;
	l->hdr.size = p->total;
	l->hdr.netns = 0;
	l->hdr.cpu = bpf_get_smp_processor_id();
	l->hdr.type = kev_lost_type;
	l->hdr.flags = 0;
	bpf_ringbuf_submit(l, BPF_RB_FORCE_WAKEUP);
	__builtin_memset(p, 0, sizeof(*p));
	return 1;
}

/* Reserves an event's record (+ struct mg_task), counting it as produced,
 * or as lost when the ring is full. */
static __always_inline void *reserve(__u64 now)
{
	__u32 zero = 0;
	__u32 slot = kev_slot & (KEV_MAX - 1);
	struct kev_counters *c = bpf_map_lookup_elem(&kev_counters, &zero);
	struct kev_lost *p = bpf_map_lookup_elem(&kev_pending, &zero);
	if (!c || !p)
		return 0;
	c->produced[slot]++;
	void *rec = 0;
	if (flush_lost(p, now))
		rec = bpf_ringbuf_reserve(&kev_ring, kev_size + sizeof(struct mg_task), 0);
	if (!rec) {
		c->lost[slot]++;
		if (!p->total)
			p->first_ns = now;
		p->last_ns = now;
		p->total++;
		p->counts[slot]++;
	}
	return rec;
}

static __always_inline __u64 load_field(void *ctx, __u16 off, __u8 size, __u8 is_signed)
{
	__u64 v = 0;
	switch (size) {
	case 1: {
		__u8 x = 0;
		bpf_probe_read_kernel(&x, 1, ctx + off);
		v = is_signed ? (__u64)(__s64)(__s8)x : x;
		break;
	}
	case 2: {
		__u16 x = 0;
		bpf_probe_read_kernel(&x, 2, ctx + off);
		v = is_signed ? (__u64)(__s64)(__s16)x : x;
		break;
	}
	case 4: {
		__u32 x = 0;
		bpf_probe_read_kernel(&x, 4, ctx + off);
		v = is_signed ? (__u64)(__s64)(__s32)x : x;
		break;
	}
	default:
		bpf_probe_read_kernel(&v, 8, ctx + off);
	}
	return v;
}

static __always_inline int test(__u64 v, __u8 op, __u64 c, __u8 is_signed)
{
	__s64 sv = v, sc = c;
	switch (op) {
	case KEV_OP_EQ:
		return v == c;
	case KEV_OP_NE:
		return v != c;
	case KEV_OP_LT:
		return is_signed ? sv < sc : v < c;
	case KEV_OP_LE:
		return is_signed ? sv <= sc : v <= c;
	case KEV_OP_GT:
		return is_signed ? sv > sc : v > c;
	case KEV_OP_GE:
		return is_signed ? sv >= sc : v >= c;
	case KEV_OP_AND:
		return (v & c) != 0;
	}
	return 0;
}

/* The user's filter on the tracepoint's fields, in the kernel: an event it
 * rejects is neither recorded nor counted. */
static __always_inline int filter_passes(void *ctx)
{
	if (!kev_npreds)
		return 1;
	int any = 0, term = 1;
	for (int i = 0; i < KEV_MAX_PREDS; i++) {
		if (i >= kev_npreds)
			break;
		if (kev_preds[i].new_term && i > 0) {
			any |= term;
			term = 1;
		}
		__u64 v = load_field(ctx, kev_preds[i].off, kev_preds[i].size, kev_preds[i].is_signed);
		term &= test(v, kev_preds[i].op, kev_preds[i].value, kev_preds[i].is_signed);
	}
	return any | term;
}

SEC("tracepoint")
int kevent_tp(void *ctx)
{
	if (!filter_passes(ctx))
		return 0;
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();
	__u32 netns = current_netns(t);
	if (!selected(pid_tgid, netns))
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u8 *rec = reserve(now);
	if (!rec)
		return 0;
	__u32 size = kev_size;
	if (size > 32 + KEV_MAX_COPY + KEV_MAX_STRS * KEV_STR_LEN)
		size = 32;
	fill_hdr((struct mg_hdr *)rec, now, pid_tgid, netns);
	/* Bytes no field covers stay zero, so no kernel memory leaks into the
	 * trace through padding. */
	for (__u32 o = 32; o + 8 <= size && o < 32 + KEV_MAX_COPY + KEV_MAX_STRS * KEV_STR_LEN; o += 8)
		*(__u64 *)(rec + o) = 0;
	__u32 n = kev_copy;
	if (n > KEV_MAX_COPY)
		n = KEV_MAX_COPY;
	if (n && 32 + n <= size)
		bpf_probe_read_kernel(rec + 32, n, ctx + 8);
	for (int i = 0; i < KEV_MAX_ZERO; i++) {
		if (i >= kev_nzero)
			break;
		__u32 o = kev_zero[i];
		if (o + 8 <= size)
			*(__u64 *)(rec + o) = 0;
	}
	for (int i = 0; i < KEV_MAX_STRS; i++) {
		if (i >= kev_nstrs)
			break;
		__u32 loc = 0;
		bpf_probe_read_kernel(&loc, 4, ctx + kev_strs[i].src);
		__u32 off = loc & 0xffff, len = loc >> 16;
		if (kev_strs[i].rel)
			off += kev_strs[i].src + 4;
		if (len > KEV_STR_LEN)
			len = KEV_STR_LEN;
		__u32 dst = kev_strs[i].dst;
		if (dst + KEV_STR_LEN > size)
			continue;
		if (kev_strs[i].text)
			bpf_probe_read_kernel_str(rec + dst, KEV_STR_LEN, ctx + off);
		else if (len)
			bpf_probe_read_kernel(rec + dst, len, ctx + off);
	}
	fill_task((struct mg_task *)(rec + size), pid_tgid);
	bpf_ringbuf_submit(rec, wake_flags());
	return 0;
}

/* A USDT probe's argument i, as its note describes it. */
static __always_inline __u64 usdt_arg(struct pt_regs *ctx, int i)
{
	__u64 v = 0;
	__u8 kind = kev_args[i].kind;
	__s8 size = kev_args[i].size;
	if (kind == KEV_ARG_CONST)
		return kev_args[i].disp;
	if (kind != KEV_ARG_REG && kind != KEV_ARG_MEM)
		return 0;
	bpf_probe_read_kernel(&v, 8, (void *)ctx + (kev_args[i].reg & 0xff));
	if (kind == KEV_ARG_MEM) {
		__u64 addr = v + kev_args[i].disp;
		__u32 n = size < 0 ? -size : size;
		if (n == 0 || n > 8)
			n = 8;
		v = 0;
		bpf_probe_read_user(&v, n, (void *)addr);
	}
	switch (size) {
	case 1:
		return (__u8)v;
	case -1:
		return (__s64)(__s8)v;
	case 2:
		return (__u16)v;
	case -2:
		return (__s64)(__s16)v;
	case 4:
		return (__u32)v;
	case -4:
		return (__s64)(__s32)v;
	}
	return v;
}

SEC("uprobe")
int kevent_uprobe(struct pt_regs *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();
	__u32 netns = current_netns(t);
	if (!selected(pid_tgid, netns))
		return 0;
	__u64 now = bpf_ktime_get_ns();
	struct kev_uprobe *rec = reserve(now);
	if (!rec)
		return 0;
	fill_hdr(&rec->hdr, now, pid_tgid, netns);
	if (!kev_nargs) {
		/* x86-64's calling convention (gen.go builds for it). */
		rec->args[0] = ctx->di;
		rec->args[1] = ctx->si;
		rec->args[2] = ctx->dx;
		rec->args[3] = ctx->cx;
		rec->args[4] = ctx->r8;
		rec->args[5] = ctx->r9;
	} else {
		for (int i = 0; i < KEV_UPROBE_ARGS; i++) {
			if (i >= kev_nargs)
				break;
			rec->args[i] = usdt_arg(ctx, i);
		}
	}
	fill_task((struct mg_task *)(rec + 1), pid_tgid);
	bpf_ringbuf_submit(rec, wake_flags());
	return 0;
}
