// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Socket layer: what the application asked (send and receive calls). */

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
