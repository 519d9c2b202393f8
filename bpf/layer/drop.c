// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Drops: kfree_skb with its reason. */

/* ---------------------------------------------------------------- */
/* drops */

/*
 * rx_sk, the socket a received packet was for, is the tracepoint's fourth
 * argument from Linux 6.11 on. Where the kernel's record of the tracepoint
 * has no such field, the branch that reads it is dead once CO-RE has
 * resolved the check, so the verifier never sees a read past the three
 * arguments older kernels pass, and the drop is attributed by skb->sk.
 */
SEC("tp_btf/kfree_skb")
int BPF_PROG(kfree_skb, struct sk_buff *skb, void *location, enum skb_drop_reason reason)
{
	struct mg_drop *r;
	struct net_device *dev;
	struct sock *sk, *rx_sk = NULL, *owner;
	__u32 netns = 0, ifindex = 0;
	__u64 now, conn = 0;
	struct emit e;

	if (bpf_core_field_exists(struct trace_event_raw_kfree_skb, rx_sk))
		rx_sk = (struct sock *)ctx[3];
	/* Kept whatever the groups: tcp_xmit needs it. */
	owner = skb->sk;
	if (!rx_sk && owner && sk_is_full(owner))
		note_local_drop(skb, owner);
	if (!enabled(MG_G_DROP))
		return 0;
	sk = rx_sk;
	if (!sk)
		sk = owner;
	dev = skb->dev;
	if (dev) {
		netns = dev->nd_net.net->ns.inum;
		ifindex = dev->ifindex;
	}
	if (sk && sk_is_full(sk)) {
		conn = conn_of(my_state(), sk, sk_cookie(sk), 0);
		if (conn == FILTERED) {
			count_unrecorded(sk_netns(sk), MG_UNREC_DROP_FILTERED);
			return 0;
		}
		if (conn || !dev)
			netns = sk_netns(sk);
	}
	/*
	 * A packet on its way out whose socket is no connection's: the
	 * kernel's TCP control socket, which sends the ACKs and resets of a
	 * TIME_WAIT socket or of none (as the last ACK of a connection that
	 * closed), or a TIME_WAIT or request socket. A full qdisc drops
	 * those too; found by their addresses, as the device finds them, in
	 * the device's netns (the control socket's is whichever netns it
	 * last sent for).
	 */
	if (!conn && !rx_sk && owner && dev && (!filter_netns || netns == filter_netns)) {
		struct cpu_state *st = my_state();

		conn = conn_from_headers(st, skb->head + skb->network_header,
					 __builtin_bswap16(skb->protocol), netns, 0);
		if (conn && conn != FILTERED)
			conn = conn_known(st, conn);
		if (conn == FILTERED) {
			count_unrecorded(netns, MG_UNREC_DROP_FILTERED);
			return 0;
		}
	}
	/* Summary mode keeps figures by connection only. */
	if (!conn && (summary_mode || !unattributed_ok(netns))) {
		count_unrecorded(netns, MG_UNREC_DROP_NO_CONN);
		return 0;
	}
	if (summary_mode) { summarize_drop(conn, skb, reason); return 0; }
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
