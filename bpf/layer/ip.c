// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* IP: cgroup_skb on the root cgroup. */

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
	/* Here skb->data is the IP header, in the linear part. */
	ip = KERNEL_CAST(struct iphdr, skb->data);
	if (skip_ack(skb->data, BPF_CORE_READ_BITFIELD(ip, version) == 4 ? ETH_P_IP : ETH_P_IPV6))
		return;
	st = my_state();
	conn = conn_of(st, sk, cookie_of(sk, ctx), 0);
	if (conn == FILTERED || !conn)
		return;
	if (summary_mode) { summarize(conn, type, ctx->len); return; }
	now = bpf_ktime_get_ns();
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
	/* Every skb TCP sends passes here once, inside __tcp_transmit_skb:
	 * where tcp_xmit is read by default (bpf/layer/tcp.c), before its
	 * ip_send. */
	if (xmit_at_ip && enabled(MG_G_TCP | MG_G_RATE)) {
		/* skb->sk read from the kernel's skb is an RCU pointer, which
		 * a cgroup_skb program may not give socket storage; the
		 * context's socket, as a full TCP socket, it may. */
		struct bpf_sock *bsk = ctx->sk;
		struct tcp_sock *tp = bsk ? bpf_skc_to_tcp_sock(bsk) : NULL;

		if (tp)
			tcp_xmit_from(bpf_cast_to_kern_ctx(ctx), (struct sock *)tp, ctx, 0);
	}
	ip_event(ctx, MG_IP_SEND);
	return 1;
}

SEC("cgroup_skb/ingress")
int ip_ingress(struct __sk_buff *ctx)
{
	ip_event(ctx, MG_IP_RECV);
	return 1;
}
