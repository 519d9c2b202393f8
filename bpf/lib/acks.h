/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Pure ACKs: TCP segments with no payload and no SYN, FIN or RST, which
 * carry no byte of the stream. They are a third to a half of a bulk
 * transfer's packets; the IP and device layers skip them unless the acks
 * group asks for them (the TCP layer still has each: tcp_xmit, tcp_rcv).
 * Measured (bench/hooks.sh, iperf3 over veth at 4 Gbit/s): 4 of the 7
 * records of an ACK's path, a quarter of the default groups' records.
 */
#ifndef MAGNET_LIB_ACKS_H
#define MAGNET_LIB_ACKS_H

#define TCPHDR_RST_ 0x04
#define TCPHDR_ACK_ 0x10

/* The TCP flags and payload length of the segment whose IP header is at
 * l3 (a packet's bytes, read in place), from its headers alone, so that
 * every layer gives the same answer for the same packet. */
static __always_inline int pure_ack(unsigned char *l3, __u16 l3proto)
{
	unsigned char *th;
	__s32 payload;
	__u8 flags;

	if (l3proto == ETH_P_IP) {
		struct iphdr *ip = KERNEL_CAST(struct iphdr, l3);
		__u32 ihl;

		/* A fragment's "TCP header" may be payload. */
		if (ip->protocol != IPPROTO_TCP_ || (__builtin_bswap16(ip->frag_off) & (IP_MF | IP_OFFSET)))
			return 0;
		ihl = BPF_CORE_READ_BITFIELD(ip, ihl) * 4;
		th = l3 + ihl;
		/* tot_len 0 (a BIG TCP packet) makes it negative: not an ACK. */
		payload = (__s32)__builtin_bswap16(ip->tot_len) - (__s32)ihl;
	} else if (l3proto == ETH_P_IPV6) {
		struct ipv6hdr *ip6 = KERNEL_CAST(struct ipv6hdr, l3);

		if (ip6->nexthdr != IPPROTO_TCP_)
			return 0;
		th = l3 + sizeof(struct ipv6hdr);
		payload = __builtin_bswap16(ip6->payload_len);
	} else {
		return 0;
	}
	/* Byte 12: the data offset (header length in words) in its high
	 * nibble; byte 13: the flags. */
	payload -= (KERNEL_CAST(struct tcphdr, th)->doff) * 4;
	flags = ((__u8 *)KERNEL_CAST(struct tcphdr, th))[13];
	return payload == 0 && (flags & (TCPHDR_SYN | TCPHDR_FIN | TCPHDR_RST_)) == 0 &&
	       (flags & TCPHDR_ACK_);
}

/* Whether the IP and device layers leave out this packet: a pure ACK,
 * unless the acks group asks for them. */
static __always_inline int skip_ack(unsigned char *l3, __u16 l3proto)
{
	/* Summary mode counts every packet: a count costs no record. */
	return !summary_mode && !(events_mask & MG_G_ACKS) && pure_ack(l3, l3proto);
}

#endif
