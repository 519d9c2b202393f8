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

/*
 * tcp_xmit (and the tcp_rate a segment carries out) read at IP egress, the
 * default where fentry is refused: bpf/layer/tcp.c says why it is exact.
 * The TCP header is read from the packet (skb->data is the network header
 * here, and TCP's headers are in the linear part), as plain loads.
 */
static __always_inline void tcp_xmit_at_ip(struct __sk_buff *ctx)
{
	/* skb->sk read from the kernel's skb is an RCU pointer, which a
	 * cgroup_skb program may not give socket storage; the context's
	 * socket, as a full TCP socket, it may. */
	struct bpf_sock *bsk = ctx->sk;
	struct sk_buff *skb;
	struct tcp_sock *tp;
	struct tcphdr *th;
	struct sock *sk;
	void *data, *end;
	__u64 conn, now, seq_flags, len_segs;
	__u32 off;

	if (!bsk)
		return;
	tp = bpf_skc_to_tcp_sock(bsk);
	if (!tp)
		return;
	sk = (struct sock *)tp;
	skb = bpf_cast_to_kern_ctx(ctx);
	off = (__u16)(skb->transport_header - skb->network_header);
	/* IPv4's 20-60 bytes, IPv6's 40 and its extension headers. */
	if (off < 20 || off > 256)
		return;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	if (data + sizeof(struct iphdr) > end)
		return;
	th = data + off;
	if ((void *)(th + 1) > end)
		return;
	/* The socket's own segment (not a tunnel's outer header, which has
	 * other ports, nor the kernel's control socket's resets and TIME_WAIT
	 * ACKs, nor a listener's SYN-ACK: neither passes __tcp_transmit_skb). */
	if (__builtin_bswap16(th->source) != sk->__sk_common.skc_num || th->dest != sk->__sk_common.skc_dport)
		return;
	if (ctx->protocol == __builtin_bswap16(ETH_P_IP) && ((struct iphdr *)data)->protocol != IPPROTO_TCP_)
		return;
	/* Read before any call: a call may invalidate packet pointers. */
	seq_flags = (__u64)tcp_flag_byte(th) << 32 | __builtin_bswap32(th->seq);
	len_segs = (__u64)ctx->gso_segs << 32 | (__u32)(ctx->len - off - th->doff * 4);
	conn = conn_of(my_state(), sk, cookie_of(sk, ctx), 0);
	if (conn == FILTERED || !conn)
		return;
	/* TCP is still sending the skb: now is its time. */
	now = bpf_ktime_get_ns();
	/* The sample of the ACK that let this segment go comes first. */
	if (enabled(MG_G_RATE))
		emit_tcp_rate(sk, conn, now);
	if (enabled(MG_G_TCP))
		tcp_xmit_put(sk, conn, now, seq_flags, len_segs);
}

SEC("cgroup_skb/egress")
int ip_egress(struct __sk_buff *ctx)
{
	/* Every skb TCP sends passes here once, inside __tcp_transmit_skb:
	 * where tcp_xmit is read by default, before its ip_send. */
	if (xmit_at_ip && enabled(MG_G_TCP | MG_G_RATE))
		tcp_xmit_at_ip(ctx);
	ip_event(ctx, MG_IP_SEND);
	return 1;
}

SEC("cgroup_skb/ingress")
int ip_ingress(struct __sk_buff *ctx)
{
	ip_event(ctx, MG_IP_RECV);
	return 1;
}
