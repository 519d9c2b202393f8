/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Segments TCP sends again after a local drop. When the qdisc (or anything
 * else on the way down) drops a first transmission, __tcp_transmit_skb()
 * returns the error, tcp_write_xmit() stops, and snd_nxt does not move: TCP
 * later sends the same bytes as if for the first time. Nothing in the
 * segment or the socket says so at that point, so the drop leaves a mark in
 * the socket: the end of the dropped bytes. A tcp_xmit of new data (at
 * snd_nxt) wholly below that end is such a re-send: retrans 2. The first
 * one past it clears the mark.
 *
 * Drops are rare and tcp_xmit is not: local_drop_marks counts the sockets
 * that hold a mark, and while it is 0, as it nearly always is, a tcp_xmit
 * costs one load of it and nothing more.
 */
#ifndef MAGNET_LIB_LOCALDROP_H
#define MAGNET_LIB_LOCALDROP_H

#define MG_RETRANS_NETWORK 1 /* starts below snd_nxt: TCP retransmits it */
#define MG_RETRANS_LOCAL 2   /* new data sent again after a local drop */

struct local_drop {
	__u32 end;    /* sequence number past the dropped bytes */
	__u32 marked; /* counted in local_drop_marks */
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct local_drop);
} local_drops SEC(".maps");

volatile __u32 local_drop_marks = 0;

/*
 * A dropped skb: if it is a TCP segment with payload on its way out of sk
 * (its source port is the socket's own; a segment received, which early
 * demux may also have given a socket, has the peer's), mark the socket.
 */
static __always_inline void note_local_drop(struct sk_buff *skb, struct sock *sk)
{
	unsigned char *head = skb->head, *th_p;
	struct tcphdr *th;
	struct local_drop *ld;
	__s32 payload;
	__u32 end;

	if (sk->sk_protocol != IPPROTO_TCP_ || !skb->transport_header || skb->transport_header == 0xffff)
		return;
	th_p = head + skb->transport_header;
	th = KERNEL_CAST(struct tcphdr, th_p);
	if (__builtin_bswap16(th->source) != sk->__sk_common.skc_num)
		return;
	payload = (__s32)skb->len - (__s32)(th_p - skb->data) - (__s32)th->doff * 4;
	if (payload <= 0)
		return;
	end = __builtin_bswap32(th->seq) + (__u32)payload;
	ld = bpf_sk_storage_get(&local_drops, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!ld)
		return;
	if (!ld->marked) {
		ld->marked = 1;
		ld->end = end;
		__sync_fetch_and_add(&local_drop_marks, 1);
	} else if (seq_before(ld->end, end)) {
		ld->end = end;
	}
}

static __always_inline void clear_local_drop(struct local_drop *ld)
{
	ld->marked = 0;
	__sync_fetch_and_sub(&local_drop_marks, 1);
}

/* Whether a segment of new data [seq, seq + len) is a re-send after a
 * local drop. */
static __noinline int resent_after_drop(struct sock *sk, __u32 seq, __u32 len)
{
	struct local_drop *ld = bpf_sk_storage_get(&local_drops, sk, 0, 0);

	if (!ld || !ld->marked)
		return 0;
	if (!seq_before(ld->end, seq + len))
		return 1;
	/* Past the dropped bytes (or across their end, which is new data
	 * too: the reader splits it by the highest sequence sent). */
	if (!seq_before(seq, ld->end))
		clear_local_drop(ld);
	return 0;
}

/* A socket that closes keeps no mark. */
static __always_inline void forget_local_drop(struct sock *sk)
{
	struct local_drop *ld;

	if (!local_drop_marks)
		return;
	ld = bpf_sk_storage_get(&local_drops, sk, 0, 0);
	if (ld && ld->marked)
		clear_local_drop(ld);
}

#endif
