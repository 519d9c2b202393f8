// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * magnet's BPF side: one program per kernel hook, each turning what it sees
 * into a fixed-size record (events.h) in one of two ring buffers:
 *   events  - the data path (socket, TCP, IP, device, drops, sched, headers)
 *   control - connection lifecycle and interface names, small and separate
 *             so that a flood of data events cannot crowd them out.
 * When a ring is full the event is counted per CPU and type; the next event
 * that fits on that CPU is preceded by a `lost` record, so the gap is marked
 * in place in the stream.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "events.h"
#include "magnet.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/* Settings, written by the recorder before load. */
const volatile __u32 filter_netns = 0;   /* 0 = any */
const volatile __u16 filter_port = 0;    /* 0 = any */
const volatile __u32 filter_tgid = 0;    /* 0 = any */
const volatile __u64 filter_cgroup = 0;  /* cgroup2 id; 0 = any */
const volatile __u32 self_tgid = 0;      /* the recorder: never traced */
const volatile __u64 exclude_cgroup = 0; /* cgroup2 id whose sockets are never traced (collect's shipper); 0 = none */
const volatile __u64 events_wakeup = 1;  /* wake the reader at this fill */
const volatile __u64 control_wakeup = 1;

/* Event groups enabled (enum mg_group). Not const: it may change while the
 * programs run, without losing the groups that stay enabled. */
volatile __u32 events_mask = 0;

/* Set when fentry/__tcp_transmit_skb is attached: it then reports tcp_xmit
 * instead of sockops. */
volatile __u8 xmit_by_fentry = 0;

/* Never read by BPF: these keep the types in BTF so bpf2go emits them. */
struct mg_hdr _t0 = {};
struct mg_tcp_xmit _t2 = {};
struct mg_tcp_rcv _t3 = {};
struct mg_tcp_state _t4 = {};
struct mg_tcp_retrans _t5 = {};
struct mg_ip _t6 = {};
struct mg_dev _t7 = {};
struct mg_drop _t8 = {};
struct mg_conn_open _t9 = {};
struct mg_conn_close _t10 = {};
struct mg_sched_switch _t11 = {};
struct mg_sched_wakeup _t12 = {};
struct mg_sched_fork _t13 = {};
struct mg_sched_exit _t14 = {};
struct mg_lost _t15 = {};
struct mg_headers _t16 = {};
struct mg_task_rec _t17 = {};
struct mg_iface _t18 = {};
struct mg_task _t19 = {};
struct mg_counters _t20 = {};
enum mg_type _t21 = MG_NONE;
enum mg_group _t22 = MG_G_SOCK;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 << 10);
} control SEC(".maps");

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
	__u64 last_state_ns;
	__u32 last_ssthresh;
	__u32 last_retrans;
	__u8 selected;
	__u8 proto;
	__u8 closed;   /* conn_close written: late packets stay attributed */
	__u8 eligible; /* passes the netns, port and cgroup filters */
	__u16 lport;   /* as first seen: the kernel zeroes it before TCP_CLOSE */
	__u16 _pad;
};

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

static __always_inline struct mg_counters *my_counters(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&counters, &zero);
}

static __always_inline void note_lost(__u32 ringidx, __u8 type, __u64 now)
{
	struct lost_state *ls = bpf_map_lookup_elem(&lost_states, &ringidx);
	struct mg_counters *c = my_counters();

	if (c && type < MG_NTYPES)
		__sync_fetch_and_add(&c->lost[type], 1);
	if (!ls || type >= MG_NTYPES)
		return;
	if (__sync_fetch_and_add(&ls->pending, 1) == 0)
		ls->first_ns = now;
	ls->last_ns = now;
	__sync_fetch_and_add(&ls->counts[type], 1);
}

struct rec_lost {
	struct mg_task task;
	struct mg_lost ev;
};

/* Write the pending `lost` record of this CPU into ring, if it fits now. */
static __always_inline void flush_lost(void *ring, __u32 ringidx, __u64 now)
{
	struct lost_state *ls = bpf_map_lookup_elem(&lost_states, &ringidx);
	struct rec_lost *r;
	__u32 total = 0;

	if (!ls || !ls->pending)
		return;
	r = bpf_ringbuf_reserve(ring, sizeof(*r), 0);
	if (!r)
		return;
	__builtin_memset(r, 0, sizeof(*r));
	__sync_lock_test_and_set(&ls->pending, 0);
	r->ev.first_ns = ls->first_ns;
	r->ev.last_ns = ls->last_ns;
	for (int i = 0; i < MG_NTYPES; i++) {
		__u32 n = __sync_lock_test_and_set(&ls->counts[i], 0);
		r->ev.counts[i] = n;
		total += n;
	}
	if (!total) {
		bpf_ringbuf_discard(r, BPF_RB_NO_WAKEUP);
		return;
	}
	r->ev.total = total;
	r->ev.ring = ringidx;
	r->ev.hdr.time_ns = now;
	r->ev.hdr.cpu = bpf_get_smp_processor_id();
	r->ev.hdr.type = MG_LOST;
	r->ev.hdr.size = total;
	bpf_ringbuf_submit(r, BPF_RB_FORCE_WAKEUP);
}

/*
 * Reserve a record of sz bytes (struct mg_task + event) of the given type.
 * Counts the attempt as produced; on failure counts it as lost.
 */
static __always_inline void *reserve(void *ring, __u32 ringidx, __u8 type, __u64 sz, __u64 now)
{
	struct mg_counters *c = my_counters();
	void *r;

	if (c && type < MG_NTYPES)
		__sync_fetch_and_add(&c->produced[type], 1);
	flush_lost(ring, ringidx, now);
	r = bpf_ringbuf_reserve(ring, sz, 0);
	if (!r)
		note_lost(ringidx, type, now);
	return r;
}

static __always_inline void submit(void *r, void *ring, __u64 threshold)
{
	__u64 avail = bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA);

	bpf_ringbuf_submit(r, avail >= threshold ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

/* Each ring record is struct mg_task followed by the event T. */
#define RESERVE_EVENT(T, typ, now) \
	reserve(&events, 0, typ, sizeof(struct mg_task) + sizeof(T), now)
#define RESERVE_CONTROL(T, typ, now) \
	reserve(&control, 1, typ, sizeof(struct mg_task) + sizeof(T), now)
#define SUBMIT_EVENT(r) submit(r, &events, events_wakeup)
#define SUBMIT_CONTROL(r) submit(r, &control, control_wakeup)

static __always_inline void fill(struct mg_task *t, struct mg_hdr *h, __u8 type, __u64 now,
				 __u64 conn, __s32 size, __u32 netns)
{
	__u64 id = bpf_get_current_pid_tgid();

	h->time_ns = now;
	h->conn = conn;
	h->tid = (__u32)id;
	h->size = size;
	h->netns = netns;
	h->cpu = bpf_get_smp_processor_id();
	h->type = type;
	h->flags = 0;
	t->pid = id >> 32;
	t->uid = (__u32)bpf_get_current_uid_gid();
	bpf_get_current_comm(t->comm, sizeof(t->comm));
}

static __always_inline int enabled(__u32 group)
{
	return events_mask & group;
}

/* ---------------------------------------------------------------- */
/* sockets and connections */

static __always_inline __u32 sk_netns(const struct sock *sk)
{
	return BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
}

/* Whether cg is the cgroup with this id or below it (16 levels at most). */
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

static __always_inline int cgroup_matches(struct cgroup *cg)
{
	return cgroup_under(cg, filter_cgroup);
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

static __always_inline void read_addrs(const struct sock *sk, struct sock_addrs *a)
{
	__builtin_memset(a, 0, sizeof(*a));
	__u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);
	a->family = family == AF_INET6 ? 6 : 4;
	a->proto = BPF_CORE_READ(sk, sk_protocol);
	a->state = BPF_CORE_READ(sk, __sk_common.skc_state);
	a->lport = BPF_CORE_READ(sk, __sk_common.skc_num);
	a->rport = __builtin_bswap16(BPF_CORE_READ(sk, __sk_common.skc_dport));
	a->netns = sk_netns(sk);
	if (family == AF_INET6) {
		BPF_CORE_READ_INTO(&a->laddr, sk, __sk_common.skc_v6_rcv_saddr);
		BPF_CORE_READ_INTO(&a->raddr, sk, __sk_common.skc_v6_daddr);
	} else {
		BPF_CORE_READ_INTO((__u32 *)a->laddr, sk, __sk_common.skc_rcv_saddr);
		BPF_CORE_READ_INTO((__u32 *)a->raddr, sk, __sk_common.skc_daddr);
	}
}

static __always_inline void remember_tuple(const struct sock_addrs *a, __u64 cookie)
{
	struct tuple k = {};

	if (!a->lport)
		return;
	k.netns = a->netns;
	k.lport = a->lport;
	k.rport = a->rport;
	__builtin_memcpy(k.laddr, a->laddr, 16);
	__builtin_memcpy(k.raddr, a->raddr, 16);
	k.proto = a->proto;
	bpf_map_update_elem(&tuples, &k, &cookie, BPF_ANY);
}

static __always_inline void forget_tuple(const struct sock_addrs *a)
{
	struct tuple k = {};

	k.netns = a->netns;
	k.lport = a->lport;
	k.rport = a->rport;
	__builtin_memcpy(k.laddr, a->laddr, 16);
	__builtin_memcpy(k.raddr, a->raddr, 16);
	k.proto = a->proto;
	bpf_map_delete_elem(&tuples, &k);
}

/* Forget a closing socket's tuple, under the local port it had when first
 * seen (TCP has already released it when the socket reaches TCP_CLOSE). */
static __always_inline void forget_conn_tuple(struct sock_addrs *a, __u64 cookie)
{
	struct conn_info *ci = bpf_map_lookup_elem(&conns, &cookie);

	if (ci && ci->lport)
		a->lport = ci->lport;
	forget_tuple(a);
}

static __always_inline void emit_conn_open(const struct sock_addrs *a, __u64 cookie, __u64 now)
{
	struct { struct mg_task task; struct mg_conn_open ev; } *r;

	r = RESERVE_CONTROL(struct mg_conn_open, MG_CONN_OPEN, now);
	if (!r)
		return;
	fill(&r->task, &r->ev.hdr, MG_CONN_OPEN, now, cookie, 0, a->netns);
	r->ev.proto = a->proto;
	r->ev.family = a->family;
	r->ev.state = a->state;
	r->ev._pad = 0;
	r->ev.lport = a->lport;
	r->ev.rport = a->rport;
	__builtin_memcpy(r->ev.laddr, a->laddr, 16);
	__builtin_memcpy(r->ev.raddr, a->raddr, 16);
	SUBMIT_CONTROL(r);
}

/*
 * conn_of returns the connection id (socket cookie) of sk, announcing the
 * connection with conn_open the first time it is seen, or FILTERED when the
 * filters exclude it. process says whether current is the socket's user
 * (socket-layer events), which the pid filter needs.
 */
static __always_inline __u64 conn_of(struct sock *sk, __u64 cookie, int process, __u64 now)
{
	struct conn_info *ci, fresh = {};
	struct sock_addrs a;
	int sel = 1;

	if (!cookie)
		return 0;
	ci = bpf_map_lookup_elem(&conns, &cookie);
	if (ci) {
		if (ci->selected)
			return cookie;
		if (ci->closed || !ci->eligible)
			return FILTERED;
		/* The pid filter can only be judged in the owner's context. */
		if (!(process && filter_tgid && (bpf_get_current_pid_tgid() >> 32) == filter_tgid))
			return FILTERED;
		ci->selected = 1;
		read_addrs(sk, &a);
		emit_conn_open(&a, cookie, now);
		return cookie;
	}
	read_addrs(sk, &a);
	/* Other sockets (ping, raw) are not connections: their packets pass
	 * as unattributed. */
	if (a.proto != IPPROTO_TCP_ && a.proto != IPPROTO_UDP_)
		return 0;
	if (filter_netns && a.netns != filter_netns)
		sel = 0;
	if (filter_port && a.lport != filter_port && a.rport != filter_port)
		sel = 0;
	if (filter_cgroup && !cgroup_matches(BPF_CORE_READ(sk, sk_cgrp_data.cgroup)))
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
	bpf_map_update_elem(&conns, &cookie, &fresh, BPF_NOEXIST);
	remember_tuple(&a, cookie);
	if (sel)
		emit_conn_open(&a, cookie, now);
	return sel ? cookie : FILTERED;
}

/*
 * The cookie the socket already has. Where the helper cannot be called (an
 * skb's socket is an RCU pointer to the verifier), the cookie is read as
 * stored: every socket magnet attributes got one at its first socket- or
 * TCP-layer event, before any of its packets reached a device.
 */
static __always_inline __u64 sk_cookie(const struct sock *sk)
{
	return BPF_CORE_READ(sk, __sk_common.skc_cookie.counter);
}

static __always_inline int sk_is_full(const struct sock *sk)
{
	__u8 st = BPF_CORE_READ(sk, __sk_common.skc_state);
	return st != TCP_TIME_WAIT_ && st != TCP_NEW_SYN_RECV_;
}

/* An event without a connection passes only when no filter needs one. */
static __always_inline int unattributed_ok(__u32 netns)
{
	if (filter_netns && netns != filter_netns)
		return 0;
	return !filter_port && !filter_tgid && !filter_cgroup;
}

/* ---------------------------------------------------------------- */
/* socket layer */

static __always_inline int sock_event(struct sock *sk, int ret, __u8 type)
{
	__u64 now, conn;
	__u16 family;

	if (!enabled(MG_G_SOCK) || !sk)
		return 0;
	family = BPF_CORE_READ(sk, __sk_common.skc_family);
	if (family != AF_INET && family != AF_INET6)
		return 0;
	if (self_tgid && (bpf_get_current_pid_tgid() >> 32) == self_tgid)
		return 0;
	now = bpf_ktime_get_ns();
	conn = conn_of(sk, bpf_get_socket_cookie(sk), 1, now);
	if (conn == FILTERED || !conn)
		return 0;
	struct { struct mg_task task; struct mg_hdr ev; } *r;
	r = RESERVE_EVENT(struct mg_hdr, type, now);
	if (!r)
		return 0;
	fill(&r->task, &r->ev, type, now, conn, ret, sk_netns(sk));
	SUBMIT_EVENT(r);
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
	struct { struct mg_task task; struct mg_hdr ev; } *r;
	__u64 now, conn;
	__u32 left, room;

	if (!enabled(MG_G_TCP))
		return 0;
	now = bpf_ktime_get_ns();
	conn = conn_of(sk, bpf_get_socket_cookie(sk), 1, now);
	if (conn == FILTERED || !conn)
		return 0;
	left = BPF_CORE_READ(msg, msg_iter.count);
	room = size_goal;
	if (skb)
		room = size_goal - BPF_CORE_READ(skb, len);
	if ((__s32)room <= 0)
		room = size_goal;
	r = RESERVE_EVENT(struct mg_hdr, MG_TCP_SEND, now);
	if (!r)
		return 0;
	/* What this step of tcp_sendmsg_locked can take: the room left in the
	 * tail skb (or a new one), bounded by what the call has left. */
	fill(&r->task, &r->ev, MG_TCP_SEND, now, conn, left < room ? left : room, sk_netns(sk));
	SUBMIT_EVENT(r);
	return 0;
}

static __always_inline void emit_tcp_state(struct sock *sk, __u64 conn, __u64 now, int force)
{
	struct { struct mg_task task; struct mg_tcp_state ev; } *r;
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct conn_info *ci;
	__u32 srtt_us, ssthresh, retrans;
	__u64 gap;

	if (!enabled(MG_G_TCPSTATE))
		return;
	ci = bpf_map_lookup_elem(&conns, &conn);
	if (!ci)
		return;
	srtt_us = BPF_CORE_READ(tp, srtt_us) >> 3;
	ssthresh = BPF_CORE_READ(tp, snd_ssthresh);
	retrans = BPF_CORE_READ(tp, retrans_out);
	/* A snapshot per smoothed RTT (at most one per 4 ms), and whenever loss
	 * recovery changes something, keeps the series faithful at a fraction
	 * of the cost of one per ACK: on a LAN, srtt is tens of microseconds. */
	gap = (__u64)srtt_us * 1000;
	if (gap < 4000000)
		gap = 4000000;
	if (!force && ci->last_state_ns && now - ci->last_state_ns < gap &&
	    ssthresh == ci->last_ssthresh && retrans == ci->last_retrans)
		return;
	ci->last_state_ns = now;
	ci->last_ssthresh = ssthresh;
	ci->last_retrans = retrans;
	r = RESERVE_EVENT(struct mg_tcp_state, MG_TCP_STATE, now);
	if (!r)
		return;
	fill(&r->task, &r->ev.hdr, MG_TCP_STATE, now, conn, 0, sk_netns(sk));
	r->ev.cwnd = BPF_CORE_READ(tp, snd_cwnd);
	r->ev.ssthresh = ssthresh;
	r->ev.srtt_us = srtt_us;
	r->ev.snd_wnd = BPF_CORE_READ(tp, snd_wnd);
	r->ev.rcv_wnd = BPF_CORE_READ(tp, rcv_wnd);
	r->ev.snd_una = BPF_CORE_READ(tp, snd_una);
	r->ev.snd_nxt = BPF_CORE_READ(tp, snd_nxt);
	r->ev.packets_out = BPF_CORE_READ(tp, packets_out);
	r->ev.retrans_out = retrans;
	r->ev.total_retrans = BPF_CORE_READ(tp, total_retrans);
	r->ev.state = BPF_CORE_READ(sk, __sk_common.skc_state);
	r->ev.ca_state = BPF_CORE_READ_BITFIELD_PROBED(&tp->inet_conn, icsk_ca_state);
	r->ev.rate_app_limited = BPF_CORE_READ_BITFIELD_PROBED(tp, rate_app_limited);
	r->ev._pad = 0;
	r->ev.mss = BPF_CORE_READ(tp, mss_cache);
	r->ev.delivered = BPF_CORE_READ(tp, delivered);
	r->ev.rate_delivered = BPF_CORE_READ(tp, rate_delivered);
	r->ev.rate_interval_us = BPF_CORE_READ(tp, rate_interval_us);
	r->ev.lost = BPF_CORE_READ(tp, lost);
	SUBMIT_EVENT(r);
}

/* tcp_probe fires for every segment tcp_rcv_established handles. */
SEC("tp_btf/tcp_probe")
int BPF_PROG(tcp_probe, struct sock *sk, struct sk_buff *skb)
{
	struct { struct mg_task task; struct mg_tcp_rcv ev; } *r;
	struct tcp_skb_cb *cb;
	__u32 seq, end_seq;
	__u16 tflags;
	__u64 now, conn;
	__s32 len;

	if (!enabled(MG_G_TCP | MG_G_TCPSTATE))
		return 0;
	now = bpf_ktime_get_ns();
	conn = conn_of(sk, bpf_get_socket_cookie(sk), 0, now);
	if (conn == FILTERED || !conn)
		return 0;
	if (enabled(MG_G_TCP)) {
		cb = (struct tcp_skb_cb *)&skb->cb[0];
		seq = BPF_CORE_READ(cb, seq);
		end_seq = BPF_CORE_READ(cb, end_seq);
		tflags = BPF_CORE_READ(cb, tcp_flags);
		len = end_seq - seq - !!(tflags & TCPHDR_SYN) - !!(tflags & TCPHDR_FIN);
		r = RESERVE_EVENT(struct mg_tcp_rcv, MG_TCP_RCV, now);
		if (r) {
			fill(&r->task, &r->ev.hdr, MG_TCP_RCV, now, conn, len, sk_netns(sk));
			r->ev.hdr.flags = tflags;
			r->ev.seq = seq;
			r->ev.ack = BPF_CORE_READ(cb, ack_seq);
			SUBMIT_EVENT(r);
		}
	}
	emit_tcp_state(sk, conn, now, 0);
	return 0;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(tcp_retransmit_skb, struct sock *sk, struct sk_buff *skb, int err)
{
	struct { struct mg_task task; struct mg_tcp_retrans ev; } *r;
	struct tcp_skb_cb *cb;
	__u32 seq, end_seq;
	__u16 tflags;
	__u64 now, conn;
	__s32 len;

	if (!enabled(MG_G_TCP))
		return 0;
	now = bpf_ktime_get_ns();
	conn = conn_of(sk, bpf_get_socket_cookie(sk), 0, now);
	if (conn == FILTERED || !conn)
		return 0;
	cb = (struct tcp_skb_cb *)&skb->cb[0];
	seq = BPF_CORE_READ(cb, seq);
	end_seq = BPF_CORE_READ(cb, end_seq);
	tflags = BPF_CORE_READ(cb, tcp_flags);
	len = end_seq - seq - !!(tflags & TCPHDR_SYN) - !!(tflags & TCPHDR_FIN);
	r = RESERVE_EVENT(struct mg_tcp_retrans, MG_TCP_RETRANS, now);
	if (!r)
		return 0;
	fill(&r->task, &r->ev.hdr, MG_TCP_RETRANS, now, conn, err < 0 ? err : len, sk_netns(sk));
	r->ev.hdr.flags = tflags;
	r->ev.seq = seq;
	r->ev.state = BPF_CORE_READ(sk, __sk_common.skc_state);
	SUBMIT_EVENT(r);
	emit_tcp_state(sk, conn, now, 1);
	return 0;
}

static __always_inline void emit_conn_close(struct sock *sk, __u64 cookie, __u64 now)
{
	struct { struct mg_task task; struct mg_conn_close ev; } *r;
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct sock_addrs a;

	read_addrs(sk, &a);
	forget_conn_tuple(&a, cookie);
	r = RESERVE_CONTROL(struct mg_conn_close, MG_CONN_CLOSE, now);
	if (r) {
		fill(&r->task, &r->ev.hdr, MG_CONN_CLOSE, now, cookie, 0, a.netns);
		if (a.proto == IPPROTO_TCP_) {
			r->ev.bytes_acked = BPF_CORE_READ(tp, bytes_acked);
			r->ev.bytes_received = BPF_CORE_READ(tp, bytes_received);
			r->ev.total_retrans = BPF_CORE_READ(tp, total_retrans);
		} else {
			r->ev.bytes_acked = 0;
			r->ev.bytes_received = 0;
			r->ev.total_retrans = 0;
		}
		r->ev.state = a.state;
		r->ev._pad[0] = r->ev._pad[1] = r->ev._pad[2] = 0;
		SUBMIT_CONTROL(r);
	}
	/* Kept (the LRU map ages it out) so that the last ACKs and a reused
	 * cookie lookup do not announce the connection again. */
	struct conn_info *ci = bpf_map_lookup_elem(&conns, &cookie);
	if (ci)
		ci->closed = 1;
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(inet_sock_set_state, struct sock *sk, int oldstate, int newstate)
{
	__u64 now, cookie, conn;

	if (BPF_CORE_READ(sk, sk_protocol) != IPPROTO_TCP_)
		return 0;
	if (newstate != TCP_CLOSE_ && newstate != TCP_ESTABLISHED_)
		return 0;
	now = bpf_ktime_get_ns();
	cookie = bpf_get_socket_cookie(sk);
	if (newstate == TCP_ESTABLISHED_) {
		/* Learn the tuple now that both ends are known. */
		conn_of(sk, cookie, 0, now);
		return 0;
	}
	struct conn_info *ci = bpf_map_lookup_elem(&conns, &cookie);
	if (!ci || ci->closed)
		return 0;
	conn = ci->selected ? cookie : 0;
	if (conn && enabled(MG_G_TCPSTATE))
		emit_tcp_state(sk, conn, now, 1);
	if (conn) {
		emit_conn_close(sk, cookie, now);
	} else {
		struct sock_addrs a;

		read_addrs(sk, &a);
		forget_conn_tuple(&a, cookie);
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
		forget_conn_tuple(&a, cookie);
		bpf_map_delete_elem(&conns, &cookie);
		return 1;
	}
	emit_conn_close(sk, cookie, now);
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
	conn_of((struct sock *)bpf_cast_to_kern_ctx(ctx), bpf_get_socket_cookie(ctx), 1,
		bpf_ktime_get_ns());
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

static __always_inline void emit_tcp_xmit(struct sock *sk, struct sk_buff *skb, __u64 conn,
					 __u32 snd_nxt, __u64 now)
{
	struct { struct mg_task task; struct mg_tcp_xmit ev; } *r;
	struct tcp_skb_cb *cb = (struct tcp_skb_cb *)&skb->cb[0];
	__u32 seq = BPF_CORE_READ(cb, seq);
	__u32 end_seq = BPF_CORE_READ(cb, end_seq);
	__u16 tflags = BPF_CORE_READ(cb, tcp_flags);
	__s32 len = end_seq - seq - !!(tflags & TCPHDR_SYN) - !!(tflags & TCPHDR_FIN);
	__u16 segs = BPF_CORE_READ(cb, tcp_gso_segs);

	r = RESERVE_EVENT(struct mg_tcp_xmit, MG_TCP_XMIT, now);
	if (!r)
		return;
	fill(&r->task, &r->ev.hdr, MG_TCP_XMIT, now, conn, len, sk_netns(sk));
	r->ev.hdr.flags = tflags;
	r->ev.seq = seq;
	r->ev.gso_segs = segs ? segs : 1;
	r->ev.retrans = len > 0 && seq_before(seq, snd_nxt);
	r->ev._pad = 0;
	SUBMIT_EVENT(r);
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
	struct sock *sk;
	struct sk_buff *skb;
	__u64 now, conn;

	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		if (!xmit_by_fentry)
			bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags |
								 BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
		k = bpf_cast_to_kern_ctx(skops);
		sk = k->sk;
		if (sk)
			conn_of(sk, bpf_get_socket_cookie(skops),
				skops->op == BPF_SOCK_OPS_TCP_CONNECT_CB, bpf_ktime_get_ns());
		return 1;
	case BPF_SOCK_OPS_HDR_OPT_LEN_CB:
		break;
	default:
		return 1;
	}
	if (!enabled(MG_G_TCP) || xmit_by_fentry)
		return 1;
	k = bpf_cast_to_kern_ctx(skops);
	skb = k->skb;
	sk = k->sk;
	/* tcp_current_mss() asks for the option length with no skb. */
	if (!skb || !sk)
		return 1;
	now = bpf_ktime_get_ns();
	conn = conn_of(sk, bpf_get_socket_cookie(skops), 0, now);
	if (conn == FILTERED || !conn)
		return 1;

	emit_tcp_xmit(sk, skb, conn, skops->snd_nxt, now);
	return 1;
}

/*
 * Where the kernel allows fentry, tcp_xmit comes from __tcp_transmit_skb
 * itself: it needs no per-socket flag, so it also sees connections that
 * existed before recording started. The recorder then sets xmit_by_fentry
 * and sockops stops reporting segments.
 */
SEC("fentry/__tcp_transmit_skb")
int BPF_PROG(tcp_xmit_fentry, struct sock *sk, struct sk_buff *skb)
{
	__u64 now, conn;

	if (!enabled(MG_G_TCP) || !xmit_by_fentry)
		return 0;
	now = bpf_ktime_get_ns();
	conn = conn_of(sk, bpf_get_socket_cookie(sk), 0, now);
	if (conn == FILTERED || !conn)
		return 0;
	emit_tcp_xmit(sk, skb, conn, BPF_CORE_READ((struct tcp_sock *)sk, snd_nxt), now);
	return 0;
}

/* ---------------------------------------------------------------- */
/* IP: cgroup_skb sees each packet as it leaves / reaches a socket. */

static __always_inline void ip_event(struct __sk_buff *ctx, __u8 type)
{
	struct { struct mg_task task; struct mg_ip ev; } *r;
	struct sk_buff *skb;
	struct sock *sk;
	__u64 now, conn;
	__u8 buf[8];
	__u8 ver;

	if (!enabled(MG_G_IP))
		return;
	skb = bpf_cast_to_kern_ctx(ctx);
	sk = BPF_CORE_READ(skb, sk);
	if (!sk)
		return;
	if (bpf_skb_load_bytes(ctx, 0, buf, sizeof(buf)) < 0)
		return;
	now = bpf_ktime_get_ns();
	conn = conn_of(sk, bpf_get_socket_cookie(ctx), 0, now);
	if (conn == FILTERED || !conn)
		return;
	r = RESERVE_EVENT(struct mg_ip, type, now);
	if (!r)
		return;
	fill(&r->task, &r->ev.hdr, type, now, conn, ctx->len, sk_netns(sk));
	ver = buf[0] >> 4;
	if (ver == 4) {
		struct iphdr ip = {};
		bpf_skb_load_bytes(ctx, 0, &ip, sizeof(ip));
		r->ev.ip_id = __builtin_bswap16(ip.id);
		r->ev.ttl = ip.ttl;
		r->ev.tos = ip.tos;
		r->ev.proto = ip.protocol;
		r->ev.family = 4;
	} else {
		struct ipv6hdr ip6 = {};
		bpf_skb_load_bytes(ctx, 0, &ip6, sizeof(ip6));
		r->ev.ip_id = 0;
		r->ev.ttl = ip6.hop_limit;
		r->ev.tos = (ip6.priority << 4) | (ip6.flow_lbl[0] >> 4);
		r->ev.proto = ip6.nexthdr;
		r->ev.family = 6;
	}
	r->ev._pad = 0;
	SUBMIT_EVENT(r);
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

/* The socket a packet belongs to: connected, else bound to the local
 * address only, else bound to the wildcard address. */
static __always_inline __u64 *lookup_tuple(struct tuple *k)
{
	__u64 *c = bpf_map_lookup_elem(&tuples, k);

	if (c)
		return c;
	__builtin_memset(k->raddr, 0, 16);
	k->rport = 0;
	c = bpf_map_lookup_elem(&tuples, k);
	if (c)
		return c;
	__builtin_memset(k->laddr, 0, 16);
	return bpf_map_lookup_elem(&tuples, k);
}

/*
 * Find the connection of a packet from its headers at l3 (IPv4/IPv6).
 * ingress says whether the packet arrives (then the socket's local end is
 * the packet's destination).
 */
static __always_inline __u64 conn_from_headers(unsigned char *l3, __u16 l3proto, __u32 netns,
					       int ingress)
{
	struct tuple k = {};
	__u16 ports[2];
	__u64 *c;

	k.netns = netns;
	if (l3proto == ETH_P_IP) {
		struct iphdr ip;
		struct frag_key fk = {};
		__u16 frag;

		if (bpf_probe_read_kernel(&ip, sizeof(ip), l3))
			return 0;
		k.proto = ip.protocol;
		if (k.proto != IPPROTO_TCP_ && k.proto != IPPROTO_UDP_)
			return 0;
		frag = __builtin_bswap16(ip.frag_off);
		fk.netns = netns;
		fk.saddr = ip.saddr;
		fk.daddr = ip.daddr;
		fk.id = ip.id;
		fk.proto = ip.protocol;
		if (frag & IP_OFFSET) {
			c = bpf_map_lookup_elem(&frags, &fk);
			return c ? *c : 0;
		}
		if (bpf_probe_read_kernel(ports, sizeof(ports), l3 + (ip.ihl & 0xf) * 4))
			return 0;
		if (ingress) {
			__builtin_memcpy(k.laddr, &ip.daddr, 4);
			__builtin_memcpy(k.raddr, &ip.saddr, 4);
		} else {
			__builtin_memcpy(k.laddr, &ip.saddr, 4);
			__builtin_memcpy(k.raddr, &ip.daddr, 4);
		}
		k.lport = __builtin_bswap16(ingress ? ports[1] : ports[0]);
		k.rport = __builtin_bswap16(ingress ? ports[0] : ports[1]);
		c = lookup_tuple(&k);
		if (c && (frag & IP_MF))
			bpf_map_update_elem(&frags, &fk, c, BPF_ANY);
		return c ? *c : 0;
	}
	if (l3proto == ETH_P_IPV6) {
		struct ipv6hdr ip6;

		if (bpf_probe_read_kernel(&ip6, sizeof(ip6), l3))
			return 0;
		k.proto = ip6.nexthdr;
		if (k.proto != IPPROTO_TCP_ && k.proto != IPPROTO_UDP_)
			return 0;
		if (bpf_probe_read_kernel(ports, sizeof(ports), l3 + sizeof(ip6)))
			return 0;
		if (ingress) {
			__builtin_memcpy(k.laddr, &ip6.daddr, 16);
			__builtin_memcpy(k.raddr, &ip6.saddr, 16);
		} else {
			__builtin_memcpy(k.laddr, &ip6.saddr, 16);
			__builtin_memcpy(k.raddr, &ip6.daddr, 16);
		}
		k.lport = __builtin_bswap16(ingress ? ports[1] : ports[0]);
		k.rport = __builtin_bswap16(ingress ? ports[0] : ports[1]);
		c = lookup_tuple(&k);
		return c ? *c : 0;
	}
	return 0;
}

static __always_inline void announce_iface(const struct net_device *dev, __u32 netns, __u32 ifindex,
					   __u64 now)
{
	struct { struct mg_task task; struct mg_iface ev; } *r;
	__u64 key = ((__u64)netns << 32) | ifindex;
	__u8 one = 1;

	if (bpf_map_lookup_elem(&ifaces_seen, &key))
		return;
	r = RESERVE_CONTROL(struct mg_iface, MG_IFACE, now);
	if (!r)
		return;
	bpf_map_update_elem(&ifaces_seen, &key, &one, BPF_ANY);
	fill(&r->task, &r->ev.hdr, MG_IFACE, now, 0, 0, netns);
	r->ev.ifindex = ifindex;
	r->ev._pad = 0;
	BPF_CORE_READ_STR_INTO(&r->ev.name, dev, name);
	SUBMIT_CONTROL(r);
}

static __always_inline void emit_headers(struct sk_buff *skb, unsigned char *l2, __u32 netns,
					 __u32 ifindex, __u64 conn, __u8 dir, __u64 now)
{
	struct { struct mg_task task; struct mg_headers ev; } *r;
	unsigned char *data = BPF_CORE_READ(skb, data);
	__u32 headlen = BPF_CORE_READ(skb, len) - BPF_CORE_READ(skb, data_len);
	__u32 cap = headlen + (__u32)(data - l2);

	r = RESERVE_EVENT(struct mg_headers, MG_HEADERS, now);
	if (!r)
		return;
	fill(&r->task, &r->ev.hdr, MG_HEADERS, now, conn, BPF_CORE_READ(skb, len) + (__u32)(data - l2),
	     netns);
	r->ev.hdr.flags = dir;
	if (cap > MG_SNAP_LEN)
		cap = MG_SNAP_LEN;
	r->ev.ifindex = ifindex;
	r->ev.caplen = cap;
	r->ev.dir = dir;
	r->ev._pad = 0;
	__builtin_memset(r->ev.data, 0, MG_SNAP_LEN);
	if (cap)
		bpf_probe_read_kernel(r->ev.data, cap, l2);
	SUBMIT_EVENT(r);
}

static __always_inline void dev_event(struct sk_buff *skb, const struct net_device *dev, __u8 type)
{
	struct { struct mg_task task; struct mg_dev ev; } *r;
	unsigned char *head, *l3, *l2;
	struct sock *sk;
	__u32 netns, ifindex;
	__u64 now, conn = 0;
	__u16 l3proto;
	int ingress = type == MG_DEV_RECV;

	if (!enabled(MG_G_DEV | MG_G_HEADERS))
		return;
	if (!dev)
		dev = BPF_CORE_READ(skb, dev);
	netns = BPF_CORE_READ(dev, nd_net.net, ns.inum);
	ifindex = BPF_CORE_READ(dev, ifindex);
	l3proto = __builtin_bswap16(BPF_CORE_READ(skb, protocol));
	head = BPF_CORE_READ(skb, head);
	l2 = head + BPF_CORE_READ(skb, mac_header);
	if (ingress)
		l3 = BPF_CORE_READ(skb, data);
	else
		l3 = head + BPF_CORE_READ(skb, network_header);
	now = bpf_ktime_get_ns();
	sk = BPF_CORE_READ(skb, sk);
	if (!ingress && sk && sk_is_full(sk)) {
		conn = conn_of(sk, sk_cookie(sk), 0, now);
	} else {
		conn = conn_from_headers(l3, l3proto, netns, ingress);
		if (conn) {
			struct conn_info *ci = bpf_map_lookup_elem(&conns, &conn);
			if (!ci)
				conn = 0; /* a stale tuple: not announced, not ours */
			else if (!ci->selected)
				conn = FILTERED;
		}
	}
	if (conn == FILTERED)
		return;
	if (!conn && !unattributed_ok(netns))
		return;
	announce_iface(dev, netns, ifindex, now);
	if (enabled(MG_G_HEADERS) && type != MG_DEV_QUEUE)
		emit_headers(skb, ingress ? l2 : BPF_CORE_READ(skb, data), netns, ifindex, conn,
			     ingress, now);
	if (!enabled(MG_G_DEV))
		return;
	r = RESERVE_EVENT(struct mg_dev, type, now);
	if (!r)
		return;
	fill(&r->task, &r->ev.hdr, type, now, conn, BPF_CORE_READ(skb, len), netns);
	r->ev.ifindex = ifindex;
	{
		struct skb_shared_info *si = (void *)(head + BPF_CORE_READ(skb, end));
		__u16 segs = BPF_CORE_READ(si, gso_segs);
		r->ev.gso_segs = segs ? segs : 1;
	}
	r->ev._pad = 0;
	SUBMIT_EVENT(r);
}

SEC("tp_btf/net_dev_queue")
int BPF_PROG(net_dev_queue, struct sk_buff *skb)
{
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
	struct { struct mg_task task; struct mg_drop ev; } *r;
	struct net_device *dev;
	struct sock *sk = rx_sk;
	__u32 netns = 0, ifindex = 0;
	__u64 now, conn = 0;

	if (!enabled(MG_G_DROP))
		return 0;
	now = bpf_ktime_get_ns();
	if (!sk)
		sk = BPF_CORE_READ(skb, sk);
	dev = BPF_CORE_READ(skb, dev);
	if (dev) {
		netns = BPF_CORE_READ(dev, nd_net.net, ns.inum);
		ifindex = BPF_CORE_READ(dev, ifindex);
	}
	if (sk && sk_is_full(sk)) {
		conn = conn_of(sk, sk_cookie(sk), 0, now);
		if (conn == FILTERED)
			return 0;
		netns = sk_netns(sk);
	}
	if (!conn && !unattributed_ok(netns))
		return 0;
	r = RESERVE_EVENT(struct mg_drop, MG_DROP, now);
	if (!r)
		return 0;
	fill(&r->task, &r->ev.hdr, MG_DROP, now, conn, BPF_CORE_READ(skb, len), netns);
	r->ev.reason = reason;
	r->ev.ifindex = ifindex;
	r->ev.l3proto = __builtin_bswap16(BPF_CORE_READ(skb, protocol));
	r->ev.l4proto = sk && sk_is_full(sk) ? BPF_CORE_READ(sk, sk_protocol) : 0;
	__builtin_memset(r->ev._pad, 0, sizeof(r->ev._pad));
	SUBMIT_EVENT(r);
	return 0;
}

/* ---------------------------------------------------------------- */
/* scheduler (opt-in) */

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	struct { struct mg_task task; struct mg_sched_switch ev; } *r;
	__u64 now;

	if (!enabled(MG_G_SCHED))
		return 0;
	if ((filter_tgid || filter_cgroup) && !task_selected(prev) && !task_selected(next))
		return 0;
	now = bpf_ktime_get_ns();
	r = RESERVE_EVENT(struct mg_sched_switch, MG_SCHED_SWITCH, now);
	if (!r)
		return 0;
	fill(&r->task, &r->ev.hdr, MG_SCHED_SWITCH, now, 0, 0, 0);
	r->ev.next_tid = BPF_CORE_READ(next, pid);
	r->ev.next_pid = BPF_CORE_READ(next, tgid);
	r->ev.prev_state = prev_state;
	r->ev._pad = 0;
	BPF_CORE_READ_STR_INTO(&r->ev.next_comm, next, comm);
	SUBMIT_EVENT(r);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(sched_wakeup, struct task_struct *p)
{
	struct { struct mg_task task; struct mg_sched_wakeup ev; } *r;
	__u64 now;

	if (!enabled(MG_G_SCHED))
		return 0;
	if ((filter_tgid || filter_cgroup) && !task_selected(p))
		return 0;
	now = bpf_ktime_get_ns();
	r = RESERVE_EVENT(struct mg_sched_wakeup, MG_SCHED_WAKEUP, now);
	if (!r)
		return 0;
	fill(&r->task, &r->ev.hdr, MG_SCHED_WAKEUP, now, 0, 0, 0);
	r->ev.target_tid = BPF_CORE_READ(p, pid);
	r->ev.target_cpu = BPF_CORE_READ(p, wake_cpu);
	BPF_CORE_READ_STR_INTO(&r->ev.target_comm, p, comm);
	SUBMIT_EVENT(r);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(sched_process_fork, struct task_struct *parent, struct task_struct *child)
{
	struct { struct mg_task task; struct mg_sched_fork ev; } *r;
	__u64 now;

	if (!enabled(MG_G_SCHED))
		return 0;
	if ((filter_tgid || filter_cgroup) && !task_selected(parent))
		return 0;
	now = bpf_ktime_get_ns();
	r = RESERVE_EVENT(struct mg_sched_fork, MG_SCHED_FORK, now);
	if (!r)
		return 0;
	fill(&r->task, &r->ev.hdr, MG_SCHED_FORK, now, 0, 0, 0);
	r->ev.child_tid = BPF_CORE_READ(child, pid);
	r->ev.child_pid = BPF_CORE_READ(child, tgid);
	BPF_CORE_READ_STR_INTO(&r->ev.child_comm, child, comm);
	SUBMIT_EVENT(r);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(sched_process_exit, struct task_struct *p, bool group_dead)
{
	struct { struct mg_task task; struct mg_sched_exit ev; } *r;
	__u64 now;

	if (!enabled(MG_G_SCHED))
		return 0;
	if ((filter_tgid || filter_cgroup) && !task_selected(p))
		return 0;
	now = bpf_ktime_get_ns();
	r = RESERVE_EVENT(struct mg_sched_exit, MG_SCHED_EXIT, now);
	if (!r)
		return 0;
	fill(&r->task, &r->ev.hdr, MG_SCHED_EXIT, now, 0, BPF_CORE_READ(p, exit_code), 0);
	r->ev.exit_code = BPF_CORE_READ(p, exit_code);
	r->ev.group_dead = group_dead;
	r->ev._pad[0] = r->ev._pad[1] = r->ev._pad[2] = 0;
	SUBMIT_EVENT(r);
	return 0;
}
