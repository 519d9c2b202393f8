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
		if (conn == FILTERED)
			return 0;
		netns = sk_netns(sk);
	}
	if (summary_mode) { summarize_drop(conn, skb, reason); return 0; }
	if (!conn && !unattributed_ok(netns))
		return 0;
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
