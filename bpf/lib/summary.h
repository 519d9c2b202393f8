/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Summary mode (`magnet record --summary`): the layer programs add what
 * they see to their connection's figures here instead of writing an event
 * each, and the recorder reads the figures every interval (struct
 * mg_conn_summary in events.h says what each counts). What this saves is
 * the record (its fill and publish), the recorder's drain and the trace's
 * bytes; what it costs is a per-CPU hash lookup per program run.
 * Connection lifecycle (conn_open, conn_close, iface) still goes to the
 * control ring, so that the records can be named by tuple.
 *
 * Not summarized: delays between layers (they need each packet matched
 * from layer to layer, the per-packet state summary mode is there to
 * avoid), drop reasons (a count of the connection's drops only), tcp_send,
 * tcp_rate, headers and sched events.
 */
#ifndef MAGNET_LIB_SUMMARY_H
#define MAGNET_LIB_SUMMARY_H

/* Set by the recorder before load: summarize instead of writing events. */
const volatile __u8 summary_mode = 0;

/*
 * Per CPU, so that the sender's CPU and the one taking its ACKs never add
 * to the same cache line, and plain adds (no locked instruction) are
 * exact: a program adding to a connection's field is not interrupted, on
 * its CPU, by one adding to the same field of the same connection. A
 * socket's sends, its segments transmitted (dev_queue_xmit() runs with
 * bottom halves off) and the segments it takes in process context (its
 * backlog) are under its lock, which a softirq finding it owned does not
 * enter (it queues to the backlog); segments received and dev_recv run in
 * softirq only, which does not nest in itself. Drops can nest, and are
 * added atomically (summarize_drop). Allocated as connections
 * appear (no preallocation of 65,536 × CPUs entries); the recorder deletes
 * those of closed connections once their figures stop moving. An entry
 * that cannot be made (the map is full) is counted in counters.lost of
 * MG_CONN_SUMMARY, and the recorder reports it.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct mg_conn_summary);
} summaries SEC(".maps");

/* The figures of connection conn on this CPU, made if new. */
static __noinline struct mg_conn_summary *summary_of(__u64 conn)
{
	static const struct mg_conn_summary zero = {};
	struct mg_conn_summary *s;
	struct mg_counters *c;

	s = bpf_map_lookup_elem(&summaries, &conn);
	if (s)
		return s;
	/* BPF_NOEXIST: another CPU's program may have made it meanwhile. */
	bpf_map_update_elem(&summaries, &conn, &zero, BPF_NOEXIST);
	s = bpf_map_lookup_elem(&summaries, &conn);
	if (!s) {
		c = my_counters();
		if (c)
			__sync_fetch_and_add(&c->lost[MG_CONN_SUMMARY], 1);
	}
	return s;
}

static __always_inline __u32 log2_bucket(__u64 v, __u32 buckets)
{
	__u32 b = 0;

	if (v >> 16) { v >>= 16; b += 16; }
	if (v >> 8) { v >>= 8; b += 8; }
	if (v >> 4) { v >>= 4; b += 4; }
	if (v >> 2) { v >>= 2; b += 2; }
	if (v >> 1) b += 1;
	return b < buckets ? b : buckets - 1;
}

/* One event's bytes at the layer of event type: what the event would have
 * said, counted. */
static __always_inline void summarize(__u64 conn, __u8 type, __s64 bytes)
{
	struct mg_conn_summary *s;

	if (!conn)
		return;
	s = summary_of(conn);
	if (!s)
		return;
	if (bytes < 0)
		bytes = 0; /* an error code, as the events' readers take it */
	switch (type) {
	case MG_SOCK_SEND:
		s->sock_send_bytes += bytes;
		s->sock_send_calls++;
		break;
	case MG_SOCK_RECV:
		s->sock_recv_bytes += bytes;
		s->sock_recv_calls++;
		break;
	case MG_IP_SEND:
		s->ip_send_bytes += bytes;
		s->ip_send_packets++;
		break;
	case MG_IP_RECV:
		s->ip_recv_bytes += bytes;
		s->ip_recv_packets++;
		break;
	case MG_DEV_QUEUE:
		s->dev_queue_bytes += bytes;
		s->dev_queue_skbs++;
		break;
	case MG_DEV_XMIT:
		s->dev_xmit_bytes += bytes;
		s->dev_xmit_skbs++;
		break;
	case MG_DEV_RECV:
		s->dev_recv_bytes += bytes;
		s->dev_recv_skbs++;
		break;
	}
}

/* Whether drop reason r is the kernel's SKB_DROP_REASON_NAME, on a kernel
 * that has it. */
#define DROP_REASON_IS(r, NAME)                                                                    \
	(bpf_core_enum_value_exists(enum skb_drop_reason, SKB_DROP_REASON_##NAME) &&               \
	 (r) == bpf_core_enum_value(enum skb_drop_reason, SKB_DROP_REASON_##NAME))

/* Whether a drop of reason r loses data, as the readers class it
 * (analyze.DropLosesData): not a teardown's, not a duplicate's. */
static __noinline int drop_loses_data(__u32 r)
{
	return !(DROP_REASON_IS(r, NOT_SPECIFIED) || DROP_REASON_IS(r, QUEUE_PURGE) ||
		 DROP_REASON_IS(r, SOCKET_CLOSE) || DROP_REASON_IS(r, TCP_CLOSE) ||
		 DROP_REASON_IS(r, NO_SOCKET) || DROP_REASON_IS(r, TCP_RESET) ||
		 DROP_REASON_IS(r, TCP_OLD_DATA) || DROP_REASON_IS(r, TCP_OLD_SEQUENCE) ||
		 DROP_REASON_IS(r, TCP_OLD_ACK) || DROP_REASON_IS(r, TCP_OFOMERGE) ||
		 DROP_REASON_IS(r, TCP_RFC7323_PAWS) || DROP_REASON_IS(r, DUP_FRAG));
}

/* A packet of the connection freed as dropped. Drops can nest (a softirq
 * freeing one over a process-context purge of the queues at close), and
 * are rare: they are added atomically. */
static __noinline void summarize_drop(__u64 conn, struct sk_buff *skb, __u32 reason)
{
	struct mg_conn_summary *s;

	if (!conn)
		return;
	s = summary_of(conn);
	if (!s)
		return;
	__sync_fetch_and_add(&s->drop_bytes, skb->len);
	__sync_fetch_and_add(&s->drop_packets, 1);
	if (drop_loses_data(reason))
		__sync_fetch_and_add(&s->drop_lost_packets, 1);
	if (skb->dev)
		__sync_fetch_and_add(&s->drop_dev_packets, 1);
}

/* A packet at the device. */
static __always_inline void summarize_dev(__u64 conn, __u8 type, struct sk_buff *skb)
{
	summarize(conn, type, skb->len);
}

/*
 * A segment TCP hands to IP; snd_nxt as tcp_xmit's retrans flag reads it.
 * Not inlined: its locals, inlined, grew tcp_segments' own frame, and with
 * a pcap-filter expression (tcp_segments -> conn_slow -> pcap_eval) the
 * three frames then passed the verifier's 512 bytes, so sockops (tcp_xmit)
 * was refused whenever an expression was given, summary mode or not.
 */
static __noinline void summarize_xmit(__u64 conn, struct sk_buff *skb, __u32 snd_nxt)
{
	struct tcp_skb_cb *cb = tcp_cb(skb);
	struct mg_conn_summary *s;
	__s32 len = seg_len(cb);
	__u16 segs = cb->tcp_gso_segs;

	s = conn ? summary_of(conn) : NULL;
	if (!s)
		return;
	if (!segs)
		segs = 1;
	s->tcp_xmit_skbs++;
	s->tcp_xmit_segs += segs;
	if (len <= 0)
		return;
	s->tcp_xmit_bytes += len;
	if (seq_before(cb->seq, snd_nxt)) {
		s->retrans_bytes += len;
		s->retrans_segs += segs;
	}
}

/* A segment reaching an established socket (tcp_probe), with the
 * socket's srtt and cwnd at that moment. */
static __always_inline void summarize_rcv(__u64 conn, struct sock *sk, struct sk_buff *skb)
{
	struct tcp_sock *tp = KERNEL_CAST(struct tcp_sock, sk);
	struct mg_conn_summary *s;
	__s32 len = seg_len(tcp_cb(skb));
	__u32 srtt_us, b;

	s = conn ? summary_of(conn) : NULL;
	if (!s)
		return;
	s->tcp_rcv_bytes += len > 0 ? len : 0;
	s->tcp_rcv_skbs++;
	srtt_us = tp->srtt_us >> 3;
	if (!srtt_us)
		return;
	s->rtt_samples++;
	s->rtt_sum_us += srtt_us;
	b = log2_bucket(srtt_us, MG_SUM_RTT_BUCKETS);
	if (b < MG_SUM_RTT_BUCKETS)
		s->rtt_hist[b]++;
	b = log2_bucket(tp->snd_cwnd, MG_SUM_CWND_BUCKETS);
	if (b < MG_SUM_CWND_BUCKETS)
		s->cwnd_hist[b]++;
}

#endif
