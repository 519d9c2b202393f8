/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Summary mode (`magnet record --summary`): a connection's figures are
 * kept here instead of events, and the recorder reads them every interval
 * (struct mg_conn_summary in events.h says what each counts). What TCP
 * keeps per socket (the sock and tcp groups) is read from the socket, so
 * that no program runs per packet for it; the ip, dev and drop programs
 * add what they see per packet (a per-CPU hash lookup per run instead of
 * a record). Connection lifecycle (conn_open, conn_close, iface) still
 * goes to the control ring, so that the records can be named by tuple.
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
 * What the kernel keeps per TCP socket (struct tcp_sock) is read rather than
 * counted per packet: every interval, by an iterator over the sockets that
 * have a sock_last (sock_figures, run by the recorder before it reads the
 * maps), and at close (inet_sock_set_state), so that a connection that
 * lives between two reads is not lost. No program runs per packet for the
 * sock and tcp figures. The figures read go to sock_summaries, one entry a
 * connection (not per CPU: they are totals, not adds), whose record fields
 * only ever grow: the recorder adds them to the per-CPU summaries' and
 * takes differences as for those.
 */

/* A TCP socket's figures at the previous read. The kernel's sequence
 * numbers and 32-bit counters wrap: each read adds what moved since the
 * last one to a 64-bit total. lock orders the reads (the iterator's, the
 * close's and the release's may run at once on two CPUs), so that each
 * adds what moved once, and a read made before another that took the
 * lock first adds nothing. */
struct sock_last {
	struct bpf_spin_lock lock;
	__u32 write_seq;
	__u32 copied_seq;
	__u32 segs_out;
	__u32 segs_in;
	__u32 total_retrans;
	__u8 done;     /* closed and released: its last read was made */
	__u8 released; /* the application closed it (sock_release) */
	__u8 made;     /* its sock_summaries entry was made */
	__u8 fin_sent; /* write_seq counts a FIN */
	__u64 cookie;
	__u64 sent;   /* write_seq moved since established: bytes written, and the FIN */
	__u64 copied; /* copied_seq moved: bytes read, and a FIN read */
	/* The socket's byte counters when its figures started: they count
	 * from its creation, and a socket learned at the recording's start
	 * (learn.c) may have moved data before. */
	__u64 bytes_sent0;
	__u64 bytes_received0;
	__u64 bytes_retrans0;
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sock_last);
} sock_lasts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct mg_conn_summary);
} sock_summaries SEC(".maps");

/* A TCP connection's socket becomes established, or is found established
 * at the recording's start: its figures start here (what the application
 * writes and reads, and TCP sends and receives, from now on). */
static __noinline void summary_sock_open(struct sock *sk, __u64 conn)
{
	struct tcp_sock *tp = KERNEL_CAST(struct tcp_sock, sk);
	struct sock_last *l;
	__u32 write_seq = tp->write_seq, copied_seq = tp->copied_seq;
	__u32 segs_out = tp->segs_out, segs_in = tp->segs_in, retrans = tp->total_retrans;
	__u64 bytes_sent = tp->bytes_sent, bytes_received = tp->bytes_received;
	__u64 bytes_retrans = tp->bytes_retrans;

	l = bpf_sk_storage_get(&sock_lasts, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!l)
		return;
	bpf_spin_lock(&l->lock);
	/* Once: the socket may be met again (learn.c meets it too). */
	if (!l->cookie) {
		l->cookie = conn;
		l->write_seq = write_seq;
		l->copied_seq = copied_seq;
		l->segs_out = segs_out;
		l->segs_in = segs_in;
		l->total_retrans = retrans;
		l->bytes_sent0 = bytes_sent;
		l->bytes_received0 = bytes_received;
		l->bytes_retrans0 = bytes_retrans;
	}
	bpf_spin_unlock(&l->lock);
}

static __always_inline int fin_sent_in(int state)
{
	return state == TCP_FIN_WAIT1_ || state == TCP_FIN_WAIT2_ || state == TCP_CLOSING_ ||
	       state == TCP_LAST_ACK_ || state == TCP_TIME_WAIT_;
}

/* Adds to *total what a 32-bit counter moved from *last to now, if it
 * moved forward (a read older than the last one adds nothing). */
static __always_inline void advance(__u64 *total, __u32 *last, __u32 now)
{
	if ((__s32)(now - *last) > 0) {
		*total += now - *last;
		*last = now;
	}
}

static __always_inline void raise(__u64 *v, __u64 x)
{
	if (x > *v)
		*v = x;
}

/* Why summarize_sock reads a socket. */
enum sock_read {
	SOCK_READ_ITER,    /* the interval's read */
	SOCK_READ_CLOSE,   /* TCP_CLOSE: state is the one it leaves */
	SOCK_READ_RELEASE, /* the application closed it */
};

/*
 * Read socket sk's figures (l its sock_last) into its connection's
 * sock_summaries entry. A socket's last read is the later of its
 * TCP_CLOSE and its release: the application may read what arrived
 * before the FIN after TCP_CLOSE (the FIN moved the connection to
 * TIME_WAIT), and TCP still sends and retransmits after the release.
 *
 * Sequence numbers are read before the state and flags the FIN
 * adjustments depend on, as the kernel changes them in the other order
 * (state, then write_seq; rcv_nxt and SOCK_DONE, then copied_seq when the
 * application reads the FIN): a read between the two then counts the FIN
 * short by one, which a later read corrects, never one too many.
 */
static __noinline void summarize_sock(struct sock *sk, struct sock_last *l, int state, int why)
{
	static const struct mg_conn_summary zero = {};
	struct tcp_sock *tp = KERNEL_CAST(struct tcp_sock, sk);
	struct mg_conn_summary *s;
	struct mg_counters *c;
	__u32 write_seq, copied_seq, segs_out, segs_in, retrans, srtt_us, cwnd, b;
	__u64 bytes_sent, bytes_retrans, bytes_received, key;
	int fin_sent, fin_read, fin_in, last;

	if (!l->cookie || l->done)
		return;
	key = l->cookie;
	s = bpf_map_lookup_elem(&sock_summaries, &key);
	if (!s) {
		/* Made once: gone since, the recorder wrote the closed
		 * connection's last record and forgot it. */
		if (l->made)
			return;
		bpf_map_update_elem(&sock_summaries, &key, &zero, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&sock_summaries, &key);
		if (!s) {
			c = my_counters();
			if (c)
				__sync_fetch_and_add(&c->lost[MG_CONN_SUMMARY], 1);
			return;
		}
	}
	write_seq = tp->write_seq;
	copied_seq = tp->copied_seq;
	bytes_received = tp->bytes_received;
	asm volatile("" ::: "memory");
	if (why != SOCK_READ_CLOSE)
		state = sk->__sk_common.skc_state;
	fin_sent = fin_sent_in(state);
	fin_in = !!(sk->__sk_common.skc_flags & (1UL << SOCK_DONE));
	fin_read = fin_in && copied_seq == tp->rcv_nxt;
	/* bytes_received counts the FIN (it is rcv_nxt's advance), which
	 * the kernel adds before it marks the socket done (SOCK_DONE): a read
	 * of a socket that may be taking its FIN on another CPU (not under
	 * its lock, as the close's is, nor closed) takes one byte off until
	 * the mark, so that no read counts the FIN as data. */
	if (!fin_in && why != SOCK_READ_CLOSE && state != TCP_CLOSE_)
		fin_in = 1;
	segs_out = tp->segs_out;
	segs_in = tp->segs_in;
	retrans = tp->total_retrans;
	bytes_sent = tp->bytes_sent;
	bytes_retrans = tp->bytes_retrans;
	srtt_us = tp->srtt_us >> 3;
	cwnd = tp->snd_cwnd;
	last = why == SOCK_READ_CLOSE && (sk->__sk_common.skc_flags & (1UL << SOCK_DEAD));

	bpf_spin_lock(&l->lock);
	if (l->done) {
		bpf_spin_unlock(&l->lock);
		return;
	}
	if (why == SOCK_READ_CLOSE && l->released)
		last = 1;
	if (why == SOCK_READ_RELEASE) {
		l->released = 1;
		if (state == TCP_CLOSE_)
			last = 1;
	}
	l->done = last;
	l->made = 1;
	if (fin_sent)
		l->fin_sent = 1;
	advance(&l->sent, &l->write_seq, write_seq);
	advance(&l->copied, &l->copied_seq, copied_seq);
	/* Whether the connection exchanged a segment since the last read:
	 * only then is its srtt and cwnd a new sample. */
	b = (__s32)(segs_out - l->segs_out) > 0 || (__s32)(segs_in - l->segs_in) > 0;
	advance(&s->tcp_xmit_segs, &l->segs_out, segs_out);
	advance(&s->tcp_rcv_skbs, &l->segs_in, segs_in);
	advance(&s->retrans_segs, &l->total_retrans, retrans);
	if (l->sent > l->fin_sent)
		raise(&s->sock_send_bytes, l->sent - l->fin_sent);
	if (l->copied > fin_read)
		raise(&s->sock_recv_bytes, l->copied - fin_read);
	if (bytes_sent > l->bytes_sent0)
		raise(&s->tcp_xmit_bytes, bytes_sent - l->bytes_sent0);
	if (bytes_retrans > l->bytes_retrans0)
		raise(&s->retrans_bytes, bytes_retrans - l->bytes_retrans0);
	if (bytes_received > l->bytes_received0 + fin_in)
		raise(&s->tcp_rcv_bytes, bytes_received - l->bytes_received0 - fin_in);
	if (b && srtt_us) {
		s->rtt_samples++;
		s->rtt_sum_us += srtt_us;
		b = log2_bucket(srtt_us, MG_SUM_RTT_BUCKETS);
		if (b < MG_SUM_RTT_BUCKETS)
			s->rtt_hist[b]++;
		b = log2_bucket(cwnd, MG_SUM_CWND_BUCKETS);
		if (b < MG_SUM_CWND_BUCKETS)
			s->cwnd_hist[b]++;
	}
	bpf_spin_unlock(&l->lock);
}

#endif
