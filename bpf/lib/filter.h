/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The recorder's filters (--netns, --port, --pid, --cgroup, the excluded
 * cgroup, the pcap-filter expression and its interpreter) and each CPU's
 * cache of verdicts that cannot change. */
#ifndef MAGNET_LIB_FILTER_H
#define MAGNET_LIB_FILTER_H

/*
 * The pcap-filter expression (magnet record EXPR), compiled by the recorder
 * (internal/pcapfilter Compile) into tests of a socket's tuple, each with
 * the instruction to go to when it holds and when not, every jump forward.
 * A socket is judged once, when first seen (conn_slow), like --port: the
 * expression selects connections, as the readers apply it
 * (docs/FILTERS.md), so it costs a socket its first event, and a received
 * TCP packet looked up by its addresses a test of its tuple the first time
 * the CPU sees it (pcap_packet_out).
 */
#define PCAP_MAX_INSNS 128 /* pcapfilter.MaxInsns */
#define PCAP_OP_PROTO 1    /* the protocol is val */
#define PCAP_OP_FAMILY 2   /* the end's address is of family val (4, 6) */
#define PCAP_OP_NET 3      /* of family val, and addr under mask */
#define PCAP_OP_PORT 4     /* TCP or UDP, and the end's port in lo..hi */
#define PCAP_ACCEPT 0xffff
#define PCAP_REJECT 0xfffe

struct pcap_insn {
	__u8 op;
	__u8 end; /* 0 local, 1 remote */
	__u8 val;
	__u8 _pad;
	__u16 lo, hi;
	__u16 jt, jf;  /* next instruction when the test holds, when not */
	__u32 addr[4]; /* network order; IPv4 in the first word */
	__u32 mask[4];
};

/* Written by the recorder before load; 0 instructions: no expression. */
const volatile __u32 pcap_len = 0;
const volatile struct pcap_insn pcap_prog[PCAP_MAX_INSNS] = {};

/* A socket as the expression sees it: each end's address of family 4 when
 * it is IPv4, also v4-mapped in an IPv6 socket (as on the wire). */
struct pcap_tuple {
	__u8 proto;
	__u8 fam[2];
	__u8 _pad;
	__u16 port[2];
	__u32 laddr[4];
	__u32 raddr[4];
};

struct pcap_run {
	struct pcap_tuple t;
	__u32 pc;
	__u32 accepted;
};

/* One instruction (a bpf_loop callback: verified once, whatever the
 * program's length). */
static long pcap_step(__u64 i, void *ctx)
{
	struct pcap_run *r = ctx;
	const volatile struct pcap_insn *in;
	const __u32 *a;
	__u32 pc = r->pc;
	__u16 port, next;
	__u8 e;
	int ok = 0;

	if (pc >= PCAP_MAX_INSNS)
		return 1;
	in = &pcap_prog[pc];
	e = in->end & 1;
	a = e ? r->t.raddr : r->t.laddr;
	port = e ? r->t.port[1] : r->t.port[0];
	switch (in->op) {
	case PCAP_OP_PROTO:
		ok = r->t.proto == in->val;
		break;
	case PCAP_OP_FAMILY:
		ok = r->t.fam[e] == in->val;
		break;
	case PCAP_OP_NET:
		ok = r->t.fam[e] == in->val && (a[0] & in->mask[0]) == in->addr[0] &&
		     (a[1] & in->mask[1]) == in->addr[1] && (a[2] & in->mask[2]) == in->addr[2] &&
		     (a[3] & in->mask[3]) == in->addr[3];
		break;
	case PCAP_OP_PORT:
		ok = (r->t.proto == IPPROTO_TCP_ || r->t.proto == IPPROTO_UDP_) && port >= in->lo &&
		     port <= in->hi;
		break;
	}
	next = ok ? in->jt : in->jf;
	if (next == PCAP_ACCEPT) {
		r->accepted = 1;
		return 1;
	}
	if (next == PCAP_REJECT || next <= pc)
		return 1;
	r->pc = next;
	return 0;
}

/*
 * Whether the expression accepts the socket t. A global function: the
 * verifier checks it once for each program, on its own, where a static one
 * would be checked again at each of its calls in each state of the caller
 * (loading took 2.4 s of CPU instead of 0.4 s with an expression).
 */
__noinline int pcap_eval(const struct pcap_tuple *t)
{
	struct pcap_run r = {};

	if (!t)
		return 0;
	__builtin_memcpy(&r.t, t, sizeof(r.t));
	bpf_loop(pcap_len, pcap_step, &r, 0);
	return r.accepted;
}

static __always_inline int pcap_accepts(struct pcap_run *r)
{
	return pcap_eval(&r->t);
}

/* One end of a socket for the expression: an address v4-mapped in an IPv6
 * socket is the IPv4 address it stands for, as the readers take it. */
static __always_inline void pcap_end(__u8 *fam, __u32 *dst, __u8 family, const __u8 *src)
{
	const __u32 *w = (const __u32 *)src;

	if (family == 4) {
		*fam = 4;
		dst[0] = w[0];
		return;
	}
	if (w[0] == 0 && w[1] == 0 && w[2] == __builtin_bswap32(0xffff)) {
		*fam = 4;
		dst[0] = w[3];
		return;
	}
	*fam = 6;
	__builtin_memcpy(dst, src, 16);
}

static __always_inline void pcap_fill(struct pcap_tuple *t, __u8 proto, __u8 family, const __u8 *laddr,
				      const __u8 *raddr, __u16 lport, __u16 rport)
{
	t->proto = proto;
	t->port[0] = lport;
	t->port[1] = rport;
	pcap_end(&t->fam[0], t->laddr, family, laddr);
	pcap_end(&t->fam[1], t->raddr, family, raddr);
}

/*
 * Whether the expression rejects every listener that can take the packets
 * of the TCP tuple r->t when the tuples map does not hold that tuple: a
 * packet whose own tuple is not there is looked up by its local address
 * and port, then by its port alone (tuple_cookie), which finds a listener
 * bound to that address or to the wildcard one, of either family. r->t is
 * changed.
 */
static __always_inline int pcap_listeners_rejected(struct pcap_run *r)
{
	r->t.port[1] = 0;
	__builtin_memset(r->t.raddr, 0, sizeof(r->t.raddr));
	r->t.fam[1] = 4;
	if (pcap_accepts(r))
		return 0;
	r->t.fam[1] = 6;
	if (pcap_accepts(r))
		return 0;
	__builtin_memset(r->t.laddr, 0, sizeof(r->t.laddr));
	r->t.fam[0] = 6;
	if (pcap_accepts(r))
		return 0;
	r->t.fam[0] = r->t.fam[1] = 4;
	return !pcap_accepts(r);
}

static __always_inline int tuple_key_is(const struct tuple_slot *ts, const __u32 *w)
{
	return ts->key[0] == w[0] && ts->key[1] == w[1] && ts->key[2] == w[2] && ts->key[3] == w[3] &&
	       ts->key[4] == w[4] && ts->key[5] == w[5] && ts->key[6] == w[6] && ts->key[7] == w[7] &&
	       ts->key[8] == w[8] && ts->key[9] == w[9] && ts->key[10] == w[10];
}

/*
 * Whether a TCP packet of tuple k (family 4 or 6) is left out by the
 * expression without a look-up: it rejects the packet's own tuple, which
 * is its socket's if the table has it (a TCP socket is judged with both
 * ports known, and its tuple does not change after), and every listener
 * the look-up falls back to. The answer depends on k alone: the CPU's tuple
 * cache keeps it as a FILTERED cookie, which tuple_cookie also returns, so
 * the packets after cost a compare. UDP packets are looked up: a UDP
 * socket's tuple in the map may be newer than the one it was judged by.
 */
static __always_inline int pcap_packet_out(struct cpu_state *st, struct tuple *k, __u8 family)
{
	const __u32 *w = (const __u32 *)k;
	struct tuple_slot *ts = NULL;
	struct pcap_run r = {};
	__u32 slot, gen = 0;

	if (!pcap_len || k->proto != IPPROTO_TCP_)
		return 0;
	if (st) {
		slot = tuple_slot_of(w);
		ts = &st->tuples[slot];
		gen = tuple_gens[slot];
		if (ts->gen == gen && ts->cookie == FILTERED && tuple_key_is(ts, w))
			return 1;
	}
	pcap_fill(&r.t, k->proto, family, k->laddr, k->raddr, k->lport, k->rport);
	if (pcap_accepts(&r) || !pcap_listeners_rejected(&r))
		return 0;
	if (ts) {
		__builtin_memcpy(ts->key, k, sizeof(ts->key));
		ts->gen = gen;
		ts->cookie = FILTERED;
	}
	return 1;
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


/* Whether the filters leave the socket of this cookie out whatever it
 * does, right after conn_of judged it FILTERED: a verdict that cannot
 * change (the netns, port or cgroup filter, or the excluded cgroup; not
 * the pid filter's) is the only kind the CPU's verdict cache keeps, and
 * conn_of has just put it there. */
static __always_inline int left_out(struct cpu_state *st, __u64 cookie)
{
	return cached_verdict(st, cookie) == VERDICT_FILTERED;
}

/* An event without a connection passes only when no filter needs one (an
 * expression selects connections: it never matches such an event). */
static __always_inline int unattributed_ok(__u32 netns)
{
	if (filter_netns && netns != filter_netns)
		return 0;
	return !filter_port && !filter_tgid && !filter_cgroup && !pcap_len;
}

#endif
