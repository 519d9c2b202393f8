// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Device: queue, transmit and receive, attributed by headers when the skb
 * has no socket. */

/* ---------------------------------------------------------------- */
/* device */

/* The cookie of the socket a packet belongs to: connected, else bound to
 * the local address only, else bound to the wildcard address; 0 if none.
 * k is changed. */
static __always_inline __u64 tuple_cookie(struct cpu_state *st, struct tuple *k)
{
	const __u32 *w = (const __u32 *)k;
	__u32 slot = tuple_slot_of(w);
	__u32 gen = tuple_gens[slot]; /* before the lookup: a change after it invalidates */
	struct tuple_slot *ts = NULL;
	__u64 *c;

	if (st) {
		ts = &st->tuples[slot];
		if (ts->gen == gen && ts->cookie && ts->key[0] == w[0] && ts->key[1] == w[1] &&
		    ts->key[2] == w[2] && ts->key[3] == w[3] && ts->key[4] == w[4] &&
		    ts->key[5] == w[5] && ts->key[6] == w[6] && ts->key[7] == w[7] &&
		    ts->key[8] == w[8] && ts->key[9] == w[9] && ts->key[10] == w[10])
			return ts->cookie;
	}
	c = bpf_map_lookup_elem(&tuples, k);
	if (c) {
		__u64 cookie = *c;

		if (ts) {
			__builtin_memcpy(ts->key, k, sizeof(ts->key));
			ts->gen = gen;
			ts->cookie = cookie;
		}
		return cookie;
	}
	__builtin_memset(k->raddr, 0, 16);
	k->rport = 0;
	c = bpf_map_lookup_elem(&tuples, k);
	if (c)
		return *c;
	__builtin_memset(k->laddr, 0, 16);
	c = bpf_map_lookup_elem(&tuples, k);
	return c ? *c : 0;
}

/*
 * Find the connection of a packet from its headers at l3 (IPv4/IPv6).
 * ingress says whether the packet arrives (then the socket's local end is
 * the packet's destination). FILTERED, without a lookup, for a packet
 * whose ports the port filter does not name: no recorded socket has them.
 */
static __always_inline __u64 conn_from_headers(struct cpu_state *st, unsigned char *l3,
					       __u16 l3proto, __u32 netns, int ingress)
{
	struct tuple k = {};
	struct udphdr *ports;
	__u16 sport, dport;
	__u64 *c, cookie;

	k.netns = netns;
	if (l3proto == ETH_P_IP) {
		struct iphdr *ip = KERNEL_CAST(struct iphdr, l3);
		struct frag_key fk = {};
		__u32 saddr, daddr;
		__u16 frag;

		k.proto = ip->protocol;
		if (k.proto != IPPROTO_TCP_ && k.proto != IPPROTO_UDP_)
			return 0;
		frag = __builtin_bswap16(ip->frag_off);
		saddr = ip->saddr;
		daddr = ip->daddr;
		if (frag & (IP_OFFSET | IP_MF)) {
			fk.netns = netns;
			fk.saddr = saddr;
			fk.daddr = daddr;
			fk.id = ip->id;
			fk.proto = k.proto;
		}
		if (frag & IP_OFFSET) {
			c = bpf_map_lookup_elem(&frags, &fk);
			return c ? *c : 0;
		}
		/* TCP and UDP both start with the two ports. */
		ports = KERNEL_CAST(struct udphdr, l3 + BPF_CORE_READ_BITFIELD(ip, ihl) * 4);
		sport = ports->source;
		dport = ports->dest;
		if (ingress) {
			__builtin_memcpy(k.laddr, &daddr, 4);
			__builtin_memcpy(k.raddr, &saddr, 4);
		} else {
			__builtin_memcpy(k.laddr, &saddr, 4);
			__builtin_memcpy(k.raddr, &daddr, 4);
		}
		k.lport = __builtin_bswap16(ingress ? dport : sport);
		k.rport = __builtin_bswap16(ingress ? sport : dport);
		if (port_filtered(k.lport, k.rport) || pcap_packet_out(st, &k, 4))
			return FILTERED;
		cookie = tuple_cookie(st, &k);
		if (cookie && (frag & IP_MF))
			bpf_map_update_elem(&frags, &fk, &cookie, BPF_ANY);
		return cookie;
	}
	if (l3proto == ETH_P_IPV6) {
		struct ipv6hdr *ip6 = KERNEL_CAST(struct ipv6hdr, l3);

		k.proto = ip6->nexthdr;
		if (k.proto != IPPROTO_TCP_ && k.proto != IPPROTO_UDP_)
			return 0;
		ports = KERNEL_CAST(struct udphdr, l3 + sizeof(struct ipv6hdr));
		sport = ports->source;
		dport = ports->dest;
		if (ingress) {
			__builtin_memcpy(k.laddr, &ip6->daddr, 16);
			__builtin_memcpy(k.raddr, &ip6->saddr, 16);
		} else {
			__builtin_memcpy(k.laddr, &ip6->saddr, 16);
			__builtin_memcpy(k.raddr, &ip6->daddr, 16);
		}
		k.lport = __builtin_bswap16(ingress ? dport : sport);
		k.rport = __builtin_bswap16(ingress ? sport : dport);
		if (port_filtered(k.lport, k.rport) || pcap_packet_out(st, &k, 6))
			return FILTERED;
		return tuple_cookie(st, &k);
	}
	return 0;
}

/* The connection of a cookie found from a packet's addresses: itself if
 * selected, FILTERED if not, 0 if the table no longer has it (a stale
 * tuple: not announced, not ours). */
static __always_inline __u64 conn_known(struct cpu_state *st, __u64 cookie)
{
	struct conn_info *ci;

	switch (cached_verdict(st, cookie)) {
	case VERDICT_SELECTED:
		return cookie;
	case VERDICT_FILTERED:
		return FILTERED;
	}
	ci = bpf_map_lookup_elem(&conns, &cookie);
	if (!ci)
		return 0;
	if (ci->selected) {
		cache_verdict(cookie, 1);
		return cookie;
	}
	if (!ci->eligible)
		cache_verdict(cookie, 0);
	return FILTERED;
}

/* Announce an interface not in this CPU's cache: from the map, or with a
 * new iface record. */
static __noinline void announce_iface_slow(const struct net_device *dev, __u32 netns, __u32 ifindex,
					   __u64 now)
{
	__u64 key = ((__u64)netns << 32) | ifindex;
	struct cpu_state *st = my_state();
	__u32 slot = (netns ^ ifindex) & (IFACE_CACHE_SLOTS - 1);
	struct mg_iface *r;
	__u8 one = 1;
	struct emit e;

	if (bpf_map_lookup_elem(&ifaces_seen, &key)) {
		if (st)
			st->ifaces[slot] = key + 1;
		return;
	}
	r = RESERVE_CONTROL(struct mg_iface, MG_IFACE, now, &e);
	if (!r)
		return;
	bpf_map_update_elem(&ifaces_seen, &key, &one, BPF_ANY);
	if (st)
		st->ifaces[slot] = key + 1;
	fill(&r->hdr, MG_IFACE, now, e.pid_tgid, 0, 0, netns);
	r->ifindex = ifindex;
	r->_pad = 0;
	BPF_CORE_READ_STR_INTO(&r->name, dev, name);
	SUBMIT(r, &e);
}

static __always_inline void announce_iface(struct cpu_state *st, const struct net_device *dev,
					   __u32 netns, __u32 ifindex, __u64 now)
{
	__u64 key = ((__u64)netns << 32) | ifindex;

	/* + 1: a zeroed slot must not match netns 0, ifindex 0. */
	if (st && st->ifaces[(netns ^ ifindex) & (IFACE_CACHE_SLOTS - 1)] == key + 1)
		return;
	announce_iface_slow(dev, netns, ifindex, now);
}

/* Where emit_headers finds a packet and what it knows of it. */
struct headers_at {
	unsigned char *l2;
	__u64 conn;
	__u64 now;
	__u32 netns;
	__u32 ifindex;
	__u8 dir;
};

static __noinline void emit_headers(struct sk_buff *skb, const struct headers_at *at)
{
	struct mg_headers *r;
	unsigned char *data = skb->data, *l2 = at->l2;
	__u32 headlen = skb->len - skb->data_len;
	__u32 cap = headlen + (__u32)(data - l2);
	__u64 now = at->now;
	struct emit e;

	r = RESERVE_EVENT(struct mg_headers, MG_HEADERS, now, &e);
	if (!r)
		return;
	fill(&r->hdr, MG_HEADERS, now, e.pid_tgid, at->conn, skb->len + (__u32)(data - l2), at->netns);
	r->hdr.flags = at->dir;
	if (cap > MG_SNAP_LEN)
		cap = MG_SNAP_LEN;
	r->ifindex = at->ifindex;
	r->caplen = cap;
	r->dir = at->dir;
	r->_pad = 0;
	__builtin_memset(r->data, 0, MG_SNAP_LEN);
	if (cap)
		bpf_probe_read_kernel(r->data, cap, l2);
	SUBMIT(r, &e);
}

/* The IP layer's facts (and the TCP sequence number) of the packet whose
 * IP header is at l3, read where the device sees it: the same bytes
 * cgroup_skb reads, so ip_send/ip_recv are needed only for their time. */
static __always_inline void dev_ip_facts(struct mg_dev *r, unsigned char *l3, __u16 l3proto)
{
	unsigned char *th = 0;

	r->seq = 0;
	if (l3proto == ETH_P_IP) {
		struct iphdr *ip = KERNEL_CAST(struct iphdr, l3);

		r->ip_id = __builtin_bswap16(ip->id);
		r->ttl = ip->ttl;
		r->tos = ip->tos;
		r->proto = ip->protocol;
		r->family = 4;
		if (r->proto == IPPROTO_TCP_ && !(__builtin_bswap16(ip->frag_off) & IP_OFFSET))
			th = l3 + BPF_CORE_READ_BITFIELD(ip, ihl) * 4;
	} else if (l3proto == ETH_P_IPV6) {
		struct ipv6hdr *ip6 = KERNEL_CAST(struct ipv6hdr, l3);

		r->ip_id = 0;
		r->ttl = ip6->hop_limit;
		r->tos = (BPF_CORE_READ_BITFIELD(ip6, priority) << 4) | (ip6->flow_lbl[0] >> 4);
		r->proto = ip6->nexthdr;
		r->family = 6;
		if (r->proto == IPPROTO_TCP_)
			th = l3 + sizeof(struct ipv6hdr);
	} else {
		r->ip_id = 0;
		r->ttl = 0;
		r->tos = 0;
		r->proto = 0;
		r->family = 0;
	}
	if (th)
		r->seq = __builtin_bswap32(KERNEL_CAST(struct tcphdr, th)->seq);
}

static __always_inline void dev_event(struct sk_buff *skb, const struct net_device *dev, __u8 type)
{
	struct mg_dev *r;
	struct skb_shared_info *si;
	unsigned char *head, *l3, *l2;
	struct sock *sk;
	__u32 netns, ifindex;
	__u64 now, conn = 0;
	struct emit e;
	__u16 l3proto, segs;
	int ingress = type == MG_DEV_RECV;
	struct cpu_state *st;
	enum mg_unrecorded why;
	int ack_out;

	if (!enabled(MG_G_DEV | MG_G_HEADERS))
		return;
	if (!dev)
		dev = skb->dev;
	netns = dev->nd_net.net->ns.inum;
	ifindex = dev->ifindex;
	l3proto = __builtin_bswap16(skb->protocol);
	head = skb->head;
	l2 = head + skb->mac_header;
	if (ingress)
		l3 = skb->data;
	else
		l3 = head + skb->network_header;
	/* A pure ACK still goes to headers, which pcap export needs whole. */
	ack_out = enabled(MG_G_DEV) && skip_ack(l3, l3proto);
	if (ack_out && !enabled(MG_G_HEADERS))
		return;
	sk = skb->sk;
	st = my_state();
	why = MG_UNREC_DEV_SOCKET_FILTERED;
	if (!ingress && sk && sk_is_full(sk)) {
		__u64 cookie = sk_cookie(sk);

		conn = cookie ? conn_of(st, sk, cookie, 0) : conn_first_packet(sk);
	}
	/* Not a connection's socket: the kernel's TCP control socket, which
	 * sends the ACKs and resets of a TIME_WAIT socket or of none; found by
	 * address like a packet received. */
	if (!conn) {
		/* By its addresses a packet finds only a socket of the device's
		 * netns: under another netns filter it would be filtered out
		 * anyway (the other end of a veth pair, for one). */
		if (filter_netns && netns != filter_netns)
			return;
		why = MG_UNREC_DEV_ADDR_FILTERED;
		conn = conn_from_headers(st, l3, l3proto, netns, ingress);
		if (conn && conn != FILTERED) {
			conn = conn_known(st, conn);
			if (!conn)
				why = MG_UNREC_DEV_STALE;
		} else if (!conn) {
			why = MG_UNREC_DEV_NO_CONN;
		}
	}
	if (conn == FILTERED) {
		count_unrecorded(netns, why);
		return;
	}
	/* Summary mode keeps figures by connection only. */
	if (!conn && (summary_mode || !unattributed_ok(netns))) {
		count_unrecorded(netns, why);
		return;
	}
	if (summary_mode) { summarize_dev(conn, type, skb); return; }
	now = bpf_ktime_get_ns();
	announce_iface(st, dev, netns, ifindex, now);
	if (enabled(MG_G_HEADERS) && type != MG_DEV_QUEUE) {
		struct headers_at at = {
			.l2 = ingress ? l2 : skb->data,
			.conn = conn,
			.now = now,
			.netns = netns,
			.ifindex = ifindex,
			.dir = ingress,
		};
		emit_headers(skb, &at);
	}
	if (!enabled(MG_G_DEV) || ack_out)
		return;
	si = KERNEL_CAST(struct skb_shared_info, head + skb->end);
	segs = si->gso_segs;
	r = RESERVE_EVENT_IN(st, struct mg_dev, type, now, &e);
	if (!r)
		return;
	fill(&r->hdr, type, now, e.pid_tgid, conn, skb->len, netns);
	r->ifindex = ifindex;
	r->gso_segs = segs ? segs : 1;
	dev_ip_facts(r, l3, l3proto);
	SUBMIT(r, &e);
}

/*
 * Whether the tx queue __dev_queue_xmit() is about to use has a qdisc that
 * can hold the packet. Without one (noqueue: veth's and lo's default, most
 * virtual devices; its enqueue is NULL) __dev_queue_xmit() calls
 * dev_hard_start_xmit() right after trace_net_dev_queue, so net_dev_start_xmit
 * follows in the same call with the same skb and dev_queue would tell
 * nothing more. The queue is dev->_tx[skb->queue_mapping]: netdev_core_pick_tx()
 * (or, after a tc egress program chose it, netdev_tx_queue_mapping()) stored
 * its index there before the tracepoint, capped to real_num_tx_queues like
 * netdev_cap_txqueue(), which falls back to queue 0. A few loads, no helper
 * call: this runs for every packet sent.
 */
static __always_inline int qdisc_can_queue(struct sk_buff *skb)
{
	struct net_device *dev = skb->dev;
	struct netdev_queue *txq;
	__u32 i;

	if (!dev)
		return 1;
	i = skb->queue_mapping;
	if (i >= dev->real_num_tx_queues)
		i = 0;
	txq = KERNEL_CAST(struct netdev_queue,
			  (__u64)dev->_tx + (__u64)i * bpf_core_type_size(struct netdev_queue));
	return txq->qdisc && txq->qdisc->enqueue;
}

SEC("tp_btf/net_dev_queue")
int BPF_PROG(net_dev_queue, struct sk_buff *skb)
{
	int direct = !qdisc_can_queue(skb);

	count_dev_run(skb->dev, MG_DEVRUN_QUEUE, direct);
	/* Every skb sent passes here once, before any qdisc: where tcp_xmit
	 * is read (bpf/layer/tcp.c). */
	if (xmit_at_dev && enabled(MG_G_TCP | MG_G_RATE))
		tcp_xmit_at_dev(skb);
	if (direct)
		return 0;
	dev_event(skb, NULL, MG_DEV_QUEUE);
	return 0;
}

SEC("tp_btf/net_dev_start_xmit")
int BPF_PROG(net_dev_start_xmit, struct sk_buff *skb, struct net_device *dev)
{
	count_dev_run(dev ? dev : skb->dev, MG_DEVRUN_XMIT, 0);
	dev_event(skb, dev, MG_DEV_XMIT);
	return 0;
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(netif_receive_skb, struct sk_buff *skb)
{
	count_dev_run(skb->dev, MG_DEVRUN_RECV, 0);
	dev_event(skb, NULL, MG_DEV_RECV);
	return 0;
}
