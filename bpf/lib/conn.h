/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Sockets and connections: addresses, tuples, conn_open, conn_of (the
 * connection id of a socket, announced once, or FILTERED). */
#ifndef MAGNET_LIB_CONN_H
#define MAGNET_LIB_CONN_H


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

/* Fill and submit a conn_open record reserved in the control ring. */
static __always_inline void put_conn_open(struct mg_conn_open *r, const struct sock_addrs *a, __u64 cookie,
					  __u8 flags, __u64 now, struct emit *e)
{
	fill(&r->hdr, MG_CONN_OPEN, now, e->pid_tgid, cookie, 0, a->netns);
	r->hdr.flags = flags;
	r->proto = a->proto;
	r->family = a->family;
	r->state = a->state;
	r->_pad = 0;
	r->lport = a->lport;
	r->rport = a->rport;
	__builtin_memcpy(r->laddr, a->laddr, 16);
	__builtin_memcpy(r->raddr, a->raddr, 16);
	SUBMIT(r, e);
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
	put_conn_open(r, a, cookie, flags, now, &e);
}


#define PROCESS_LISTEN 2 /* process, in listen(): the socket's state is about to be TCP_LISTEN */

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

/* Whether the pcap-filter expression leaves the socket of these addresses
 * out. */
static __always_inline int pcap_rejects(const struct sock_addrs *a)
{
	struct pcap_run r = {};

	if (!pcap_len)
		return 0;
	pcap_fill(&r.t, a->proto, a->family, a->laddr, a->raddr, a->lport, a->rport);
	return !pcap_accepts(&r);
}

/*
 * Whether no listener the expression selects can take the packets of a
 * TCP socket it rejects, were that socket not in the tuples map
 * (pcap_listeners_rejected). The socket can then stay out of the maps, as
 * --port leaves a socket out (stays_filtered): its packets find nothing,
 * or a listener left out too.
 */
static __always_inline int pcap_rejects_listeners(const struct sock_addrs *a)
{
	struct pcap_run r = {};

	pcap_fill(&r.t, a->proto, a->family, a->laddr, a->raddr, a->lport, a->rport);
	return pcap_listeners_rejected(&r);
}

/*
 * The filters' verdict on a socket of addresses a seen for the first time,
 * of what stays_filtered left to the table (the netns and cgroup filters
 * passed): whether it is eligible (the port filter, the expression and the
 * excluded cgroup pass; the pid filter is the caller's), or -1 when it
 * stays out of the maps for good. The expression's verdict is the
 * socket's for good: in each CPU's verdict cache, and in the table (a
 * packet found by its addresses then gets it) unless the socket can stay
 * out of it.
 */
static __always_inline int new_conn_eligible(const struct sock *sk, const struct sock_addrs *a)
{
	int sel = 1;

	if (port_filtered(a->lport, a->rport))
		sel = 0;
	if (pcap_rejects(a)) {
		/* A connected TCP socket whose packets no listener the
		 * expression selects can take stays out of the maps, like one
		 * --port leaves out: under churn, the inserts and deletions
		 * are most of what a socket costs the programs. */
		if (a->proto == IPPROTO_TCP_ && a->lport && a->rport && pcap_rejects_listeners(a))
			return -1;
		sel = 0;
	}
	/* The collect service ships traces from a cgroup of its own: its
	 * sockets, and so every event of them at any layer, are left out. */
	if (exclude_cgroup && cgroup_under(BPF_CORE_READ(sk, sk_cgrp_data.cgroup), exclude_cgroup))
		sel = 0;
	return sel;
}

/* Put a socket seen for the first time in the connection table and the
 * tuples map. */
static __always_inline void table_conn(const struct sock_addrs *a, __u64 cookie, int eligible, int selected)
{
	struct conn_info fresh = {};

	fresh.eligible = eligible;
	fresh.selected = selected;
	fresh.proto = a->proto;
	fresh.lport = a->lport;
	fresh.rport = a->rport;
	bpf_map_update_elem(&conns, &cookie, &fresh, BPF_NOEXIST);
	remember_tuple(a, cookie);
}

/* conn_of past the per-CPU cache: the connection table, and the filters
 * for a socket seen for the first time. */
static __noinline __u64 conn_slow(struct sock *sk, __u64 cookie, int process)
{
	struct conn_info *ci, fresh = {};
	struct sock_addrs a;
	int sel;

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
	sel = new_conn_eligible(sk, &a);
	if (sel < 0) {
		cache_verdict(cookie, 0);
		return FILTERED;
	}
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

/*
 * conn_of returns the connection id (socket cookie) of sk, announcing the
 * connection with conn_open the first time it is seen, or FILTERED when the
 * filters exclude it. process says whether current is the socket's user
 * (socket-layer events), which the pid filter needs. It reads the clock
 * only to announce a connection: callers read it once they know they have
 * something to record, which a filtered-out packet never has.
 */
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
 * a socket met at a socket- or TCP-layer event or at bind() has one. A new
 * socket's first packet can reach the device before any of those: UDP's
 * sock_send fires when sendmsg returns, after its datagram went down, and
 * a socket bound by connect() or its first sendto() (an autobind) runs no
 * post_bind program. conn_first_packet takes that case.
 */
static __always_inline __u64 sk_cookie(const struct sock *sk)
{
	return sk->__sk_common.skc_cookie.counter;
}

/*
 * The connection of a packet's socket that has no cookie yet (sk_cookie
 * 0): give it its cookie and judge it as its first socket-layer event
 * would (conn_slow), so that the packet and the ones after it are the
 * connection's, its conn_open before them. It names no task: the task
 * here need not be the socket's user (a softirq sending a datagram that
 * waited for ARP, a qdisc run of another task's send); the connection's
 * owner is then the task of its first socket-layer event, and under the
 * pid filter the socket waits for it, as an accepted one does. Only
 * packets of sockets without a cookie take this call: the per-packet path
 * of known sockets is unchanged.
 */
static __noinline __u64 conn_first_packet(struct sock *sk)
{
	struct socket *so;
	struct sock *s;

	if (!is_connection(sk))
		return 0;
	/* The helper refuses skb->sk as the verifier types it (an RCU
	 * pointer), and takes the same socket reached through its struct
	 * socket. A socket without one (orphaned, or an accepted one not
	 * accept()ed yet) is found by its addresses, as before. */
	so = sk->sk_socket;
	if (!so)
		return 0;
	s = so->sk;
	if (!s)
		return 0;
	return conn_slow(s, bpf_get_socket_cookie(s), 0);
}

static __always_inline int sk_is_full(const struct sock *sk)
{
	__u8 st = sk->__sk_common.skc_state;
	return st != TCP_TIME_WAIT_ && st != TCP_NEW_SYN_RECV_;
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

#endif
