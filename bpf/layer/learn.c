// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Sockets that existed before the probes were attached, learned once at
 * start by iterating the kernel's TCP and UDP tables (iter/tcp, iter/udp),
 * after the hooks are attached: each socket the hooks have not met yet is
 * judged by the filters as a socket met live, put in the connection table
 * and the tuples map (so that a packet found by its addresses, such as the
 * SYN to a listener, finds it) and announced with conn_open, flag
 * MG_CONN_LEARNED, in its owner's name.
 *
 * Nothing met them otherwise: without the ip group, a listener that only
 * ever receives SYNs is reached at no hook that has its socket.
 *
 * An iterator sees the sockets of the network namespace its reader opened
 * it in: the recorder opens it in each namespace.
 */

/* Socket inode -> its owner, as ss -p finds it (the process holding a
 * descriptor of it), filled by the recorder from /proc before it runs the
 * iterators: a task the kernel cannot name from the socket. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct task_id);
} learn_owners SEC(".maps");

/* What the iterators write for each socket they visit (the recorder's
 * tally; the trace has the conn_open). */
struct mg_learned {
	__u64 cookie;
	__u64 inode;
	__u32 netns;
	__u8 proto;
	__u8 state;
	__u8 verdict; /* LEARN_* */
	__u8 owned;   /* the owner was in learn_owners */
};

#define LEARN_KNOWN 1    /* the hooks had met it already */
#define LEARN_SELECTED 2 /* learned and announced */
#define LEARN_ELIGIBLE 3 /* learned; not announced: the pid filter waits for its owner */
#define LEARN_OUT 4      /* the filters leave it out */
#define LEARN_NOT_CONN 5 /* not a connection (a raw or ping socket, a request or TIME_WAIT socket) */

static __always_inline __u64 sock_inode(const struct sock *s)
{
	const struct socket *so = KERNEL_CAST(struct sock, s)->sk_socket;

	if (!so)
		return 0;
	/* struct socket_alloc begins with the socket, followed by its inode. */
	return KERNEL_CAST(struct socket_alloc, so)->vfs_inode.i_ino;
}

/* Summary mode reads a TCP connection's figures from its socket from the
 * moment it is established; no state change will say so for one that was
 * established before the start, so its figures start when it is learned. */
static __always_inline void summary_learned(struct sock *sk, __u64 cookie, __u8 proto, __u8 state)
{
	if (summary_mode && proto == IPPROTO_TCP_ && state == TCP_ESTABLISHED_)
		summary_sock_open(sk, cookie);
}

static __noinline int learn_sock(struct seq_file *seq, struct sock *sk, __u64 cookie)
{
	struct mg_learned out = {};
	struct task_id nobody = {};
	const struct task_id *owner;
	struct mg_conn_open *r;
	struct conn_info *ci;
	struct sock_addrs a;
	int eligible, sel;
	struct emit e;
	__u64 now;

	out.cookie = cookie;
	out.inode = sock_inode(sk);
	out.netns = sk_netns(sk);
	out.state = KERNEL_CAST(struct sock, sk)->__sk_common.skc_state;
	owner = bpf_map_lookup_elem(&learn_owners, &out.inode);
	out.owned = owner != NULL;
	if (!owner)
		owner = &nobody;
	if (!sk_is_full(sk) || !is_connection(sk)) {
		out.verdict = LEARN_NOT_CONN;
		goto write;
	}
	out.proto = KERNEL_CAST(struct sock, sk)->sk_protocol;
	ci = bpf_map_lookup_elem(&conns, &cookie);
	if (ci) {
		out.verdict = LEARN_KNOWN;
		/* Met by a hook since they attached, before this read: in
		 * summary mode its figures still start here. */
		if (ci->selected)
			summary_learned(sk, cookie, out.proto, out.state);
		goto write;
	}
	if (stays_filtered(sk)) {
		out.verdict = LEARN_OUT;
		goto write;
	}
	read_addrs(sk, &a);
	eligible = new_conn_eligible(sk, &a);
	if (eligible < 0) {
		out.verdict = LEARN_OUT;
		goto write;
	}
	/* The pid filter judges the owner, which a live socket's event names
	 * by running in it. */
	sel = eligible && !(filter_tgid && (owner->pid_tgid >> 32) != filter_tgid);
	table_conn(&a, cookie, eligible, sel);
	out.verdict = sel ? LEARN_SELECTED : eligible ? LEARN_ELIGIBLE : LEARN_OUT;
	if (!sel)
		goto write;
	now = bpf_ktime_get_ns();
	r = (struct mg_conn_open *)reserve_control_for(MG_CONN_OPEN, sizeof(*r), now, &e, owner);
	if (r)
		put_conn_open(r, &a, cookie, MG_CONN_LEARNED, now, &e);
	summary_learned(sk, cookie, out.proto, out.state);
write:
	bpf_seq_write(seq, &out, sizeof(out));
	return 0;
}

SEC("iter/tcp")
int learn_tcp(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;

	if (!skc)
		return 0;
	/* A request or TIME_WAIT socket is no full socket: no connection of
	 * its own (its packets are its listener's, or the kernel's control
	 * socket's), and no struct sock to read past its sock_common. */
	if (skc->skc_state == TCP_TIME_WAIT_ || skc->skc_state == TCP_NEW_SYN_RECV_)
		return 0;
	return learn_sock(ctx->meta->seq, (struct sock *)skc, bpf_get_socket_cookie(skc));
}

SEC("iter/udp")
int learn_udp(struct bpf_iter__udp *ctx)
{
	struct udp_sock *us = ctx->udp_sk;

	if (!us)
		return 0;
	return learn_sock(ctx->meta->seq, (struct sock *)us, bpf_get_socket_cookie(us));
}
