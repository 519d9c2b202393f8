/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Packets the device and drop programs saw and made no record of, by why.
 * A filter leaving a packet out is not a loss, so the loss counts never
 * had them; these counts say what the programs gave up on, so that "lost
 * 0" with a frame missing against tcpdump has an answer in the summary.
 *
 * Only packets of the recorded network namespace count (all, without a
 * netns filter): the other namespaces' devices are left out before any
 * lookup, and their count would only measure the rest of the host.
 */
#ifndef MAGNET_LIB_UNRECORDED_H
#define MAGNET_LIB_UNRECORDED_H

enum mg_unrecorded {
	/* The packet's socket (skb->sk, a full socket) is one the filters
	 * leave out. */
	MG_UNREC_DEV_SOCKET_FILTERED,
	/* Found by its addresses: the port filter or the expression leaves
	 * its ports out, or the socket of its addresses is left out. */
	MG_UNREC_DEV_ADDR_FILTERED,
	/* No socket of its addresses is known (or it is not TCP or UDP: ARP,
	 * ICMP), and a filter needs one. */
	MG_UNREC_DEV_NO_CONN,
	/* Its addresses name a socket the connection table no longer has,
	 * and a filter needs one. */
	MG_UNREC_DEV_STALE,
	/* kfree_skb: the socket is one the filters leave out. */
	MG_UNREC_DROP_FILTERED,
	/* kfree_skb: no socket (or not a full one), and a filter needs one. */
	MG_UNREC_DROP_NO_CONN,
	MG_UNREC_N,
};

struct mg_unrecorded_counts {
	__u64 n[MG_UNREC_N];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mg_unrecorded_counts);
} unrecorded SEC(".maps");

/* Count a packet left out for reason why. Per CPU, and only ever added to
 * by the program that runs on it; a nested program (an interrupt over it)
 * may add at the same time, hence the atomic add. */
static __always_inline void count_unrecorded(__u32 netns, enum mg_unrecorded why)
{
	struct mg_unrecorded_counts *c;
	__u32 zero = 0;

	if (filter_netns && netns != filter_netns)
		return;
	c = bpf_map_lookup_elem(&unrecorded, &zero);
	if (c && why < MG_UNREC_N)
		__sync_fetch_and_add(&c->n[why], 1);
}

#endif
