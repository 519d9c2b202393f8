// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* TCP: sendmsg, state, rate, retransmissions, connection lifecycle, and
 * each segment transmitted (sockops or fentry). */

/* ---------------------------------------------------------------- */
/* TCP */

SEC("tp_btf/tcp_sendmsg_locked")
int BPF_PROG(tcp_sendmsg_locked, struct sock *sk, struct msghdr *msg, struct sk_buff *skb,
	     int size_goal)
{
	struct mg_hdr *r;
	__u64 now, conn;
	struct emit e;
	__u32 left, room;

	if (!enabled(MG_G_TCPSEND))
		return 0;
	conn = conn_of(my_state(), sk, cookie_of(sk, sk), 1);
	if (conn == FILTERED || !conn)
		return 0;
	now = bpf_ktime_get_ns();
	left = msg->msg_iter.count;
	room = size_goal;
	if (skb)
		room = size_goal - skb->len;
	if ((__s32)room <= 0)
		room = size_goal;
	r = RESERVE_EVENT(struct mg_hdr, MG_TCP_SEND, now, &e);
	if (!r)
		return 0;
	/* What this step of tcp_sendmsg_locked can take: the room left in the
	 * tail skb (or a new one), bounded by what the call has left. */
	fill(r, MG_TCP_SEND, now, e.pid_tgid, conn, left < room ? left : room, sk_netns(sk));
	SUBMIT(r, &e);
	return 0;
}

/* Write a tcp_state snapshot of sk. */
static __noinline void emit_tcp_state_rec(struct sock *sk, __u64 conn, __u64 now)
{
	struct tcp_sock *tp = KERNEL_CAST(struct tcp_sock, sk);
	struct mg_tcp_state *r;
	struct emit e;

	r = RESERVE_EVENT(struct mg_tcp_state, MG_TCP_STATE, now, &e);
	if (!r)
		return;
	fill(&r->hdr, MG_TCP_STATE, now, e.pid_tgid, conn, 0, sk_netns(sk));
	r->cwnd = tp->snd_cwnd;
	r->ssthresh = tp->snd_ssthresh;
	r->srtt_us = tp->srtt_us >> 3;
	r->snd_wnd = tp->snd_wnd;
	r->rcv_wnd = tp->rcv_wnd;
	r->snd_una = tp->snd_una;
	r->snd_nxt = tp->snd_nxt;
	r->packets_out = tp->packets_out;
	r->retrans_out = tp->retrans_out;
	r->total_retrans = tp->total_retrans;
	r->state = sk->__sk_common.skc_state;
	r->ca_state = BPF_CORE_READ_BITFIELD(&tp->inet_conn, icsk_ca_state);
	r->rate_app_limited = BPF_CORE_READ_BITFIELD(tp, rate_app_limited);
	r->_pad = 0;
	r->mss = tp->mss_cache;
	r->delivered = tp->delivered;
	r->rate_delivered = tp->rate_delivered;
	r->rate_interval_us = tp->rate_interval_us;
	r->lost = tp->lost;
	SUBMIT(r, &e);
}

static __always_inline struct tcp_sent *tcp_sent_of(struct sock *sk)
{
	return bpf_sk_storage_get(&tcp_sents, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
}

/* A tcp_state snapshot of sk if it is due; ts is the socket's last. */
static __always_inline void emit_tcp_state_in(struct sock *sk, __u64 conn, __u64 now, int force,
					      struct tcp_state_sent *ts)
{
	struct tcp_sock *tp = KERNEL_CAST(struct tcp_sock, sk);
	__u32 srtt_us, ssthresh, retrans;
	__u64 gap;

	srtt_us = tp->srtt_us >> 3;
	ssthresh = tp->snd_ssthresh;
	retrans = tp->retrans_out;
	/* A snapshot per smoothed RTT (at most one per 4 ms), and whenever loss
	 * recovery changes something, keeps the series faithful at a fraction
	 * of the cost of one per ACK: on a LAN, srtt is tens of microseconds. */
	gap = (__u64)srtt_us * 1000;
	if (gap < 4000000)
		gap = 4000000;
	if (!force && ts->time_ns && now - ts->time_ns < gap && ssthresh == ts->ssthresh &&
	    retrans == ts->retrans)
		return;
	ts->time_ns = now;
	ts->ssthresh = ssthresh;
	ts->retrans = retrans;
	/* After the writes: a CPU that sees the count unchanged may trust
	 * its copy of them (struct state_memo). */
	__sync_fetch_and_add(&state_gens[conn & (STATE_MEMO_SLOTS - 1)], 1);
	emit_tcp_state_rec(sk, conn, now);
}

static __always_inline void emit_tcp_state(struct sock *sk, __u64 conn, __u64 now, int force)
{
	struct tcp_sent *s;

	if (!enabled(MG_G_TCPSTATE))
		return;
	s = tcp_sent_of(sk);
	if (s)
		emit_tcp_state_in(sk, conn, now, force, &s->state);
}

/*
 * Write a tcp_rate if tp->delivered moved since the socket's last one. The
 * kernel makes its delivery-rate sample in tcp_ack -> tcp_rate_gen, and no
 * hook this kernel offers runs after it on the ACK path (tcp_probe fires
 * before, at the top of tcp_rcv_established; sockops' RTT callback fires in
 * tcp_clean_rtx_queue, also before): the sample is read at the next hook that
 * sees the socket. On a busy sender that is the segment the ACK releases, in
 * the same softirq; otherwise the next segment received or the next state
 * change. docs/EVENTS.md says what this misses.
 */
static __noinline void emit_tcp_rate_in(struct sock *sk, __u64 conn, __u64 now, struct tcp_rate_sent *rs)
{
	struct tcp_sock *tp = KERNEL_CAST(struct tcp_sock, sk);
	struct mg_tcp_rate *r;
	__u32 delivered, rate_delivered, interval;
	__u8 app_limited;
	struct emit e;

	delivered = tp->delivered;
	if (rs->delivered == delivered)
		return;
	rate_delivered = tp->rate_delivered;
	interval = tp->rate_interval_us;
	app_limited = BPF_CORE_READ_BITFIELD(tp, rate_app_limited);
	r = RESERVE_EVENT(struct mg_tcp_rate, MG_TCP_RATE, now, &e);
	if (!r)
		return;
	fill(&r->hdr, MG_TCP_RATE, now, e.pid_tgid, conn, delivered - rs->delivered, sk_netns(sk));
	if (rs->delivered && rate_delivered == rs->rate_delivered && interval == rs->rate_interval_us &&
	    app_limited == rs->app_limited)
		r->hdr.flags = MG_RATE_SAME;
	r->ack_ns = tp->delivered_mstamp * 1000;
	r->delivered = delivered;
	r->lost = tp->lost;
	r->rate_delivered = rate_delivered;
	r->rate_interval_us = interval;
	r->mss = tp->mss_cache;
	r->app_limited = app_limited;
	r->ca_state = BPF_CORE_READ_BITFIELD(&tp->inet_conn, icsk_ca_state);
	r->_pad = 0;
	SUBMIT(r, &e);
	rs->delivered = delivered;
	rs->rate_delivered = rate_delivered;
	rs->rate_interval_us = interval;
	rs->app_limited = app_limited;
}

static __noinline void emit_tcp_rate(struct sock *sk, __u64 conn, __u64 now)
{
	struct tcp_sent *s = tcp_sent_of(sk);

	if (s)
		emit_tcp_rate_in(sk, conn, now, &s->rate);
}

/* The window a received segment advertises, scaled as tcp_ack will scale
 * it (an established connection's segments never carry SYN, whose window is
 * not scaled). The TCP header is at skb->head + transport_header. */
static __always_inline __u32 seg_wnd(struct sock *sk, struct sk_buff *skb)
{
	struct tcp_sock *tp = KERNEL_CAST(struct tcp_sock, sk);
	struct tcp_options_received *rx = &tp->rx_opt;
	struct tcphdr *th = KERNEL_CAST(struct tcphdr, skb->head + skb->transport_header);

	/* Without the barrier, clang folds &tp->rx_opt into the bitfield's
	 * access chain and the relocated offset counts rx_opt twice. */
	barrier_var(rx);
	/* A plain load through a kernel-typed pointer, not a probe-read
	 * helper call: the verifier guards it as it does a helper's. */
	return (__u32)__builtin_bswap16(th->window) << BPF_CORE_READ_BITFIELD(rx, snd_wscale);
}

/* The tcp_rcv of a segment TCP takes in: tcp_probe's in ESTABLISHED,
 * sockops' header-parsing callback's after it (tcp_rcv_closing). */
static __always_inline void put_tcp_rcv(struct cpu_state *st, struct sock *sk, struct sk_buff *skb, __u64 conn,
					__u64 now)
{
	struct tcp_skb_cb *cb = tcp_cb(skb);
	struct mg_tcp_rcv *r;
	struct emit e;

	r = RESERVE_EVENT_IN(st, struct mg_tcp_rcv, MG_TCP_RCV, now, &e);
	if (!r)
		return;
	fill(&r->hdr, MG_TCP_RCV, now, e.pid_tgid, conn, seg_len(cb), sk_netns(sk));
	r->hdr.flags = cb->tcp_flags;
	r->seq = cb->seq;
	r->ack = cb->ack_seq;
	r->wnd = seg_wnd(sk, skb);
	r->_pad = 0;
	SUBMIT(r, &e);
}

/*
 * tcp_probe's tcp_state: most segments find none due, and finding that in
 * the socket's storage (bpf_sk_storage_get) took half of tcp_probe's body
 * (~60 ns a run of ~130, bench/HOOKS.md). This CPU's copy of the storage's
 * last snapshot decides it instead while no tcp_state has been written for
 * a socket of its slot since the copy (state_gens): then the copy is what
 * the storage holds, and the decision the same. Otherwise the storage
 * decides, as emit_tcp_state_in always did, and the copy is taken again.
 * sent: the storage if the caller has it already.
 */
static __always_inline void tcp_state_throttled(struct cpu_state *st, struct sock *sk, __u64 conn, __u64 now,
						struct tcp_sent *sent)
{
	struct tcp_sock *tp = KERNEL_CAST(struct tcp_sock, sk);
	__u32 slot = conn & (STATE_MEMO_SLOTS - 1);
	struct state_memo *m = st ? &st->state_memos[slot] : NULL;
	__u32 gen = state_gens[slot];
	__u64 gap;

	if (m && m->cookie == conn && m->gen == gen && m->state.time_ns) {
		gap = (__u64)(tp->srtt_us >> 3) * 1000;
		if (gap < 4000000)
			gap = 4000000;
		if (now - m->state.time_ns < gap && tp->snd_ssthresh == m->state.ssthresh &&
		    tp->retrans_out == m->state.retrans)
			return;
	}
	if (!sent)
		sent = tcp_sent_of(sk);
	barrier_var(sent);
	if (!sent)
		return;
	emit_tcp_state_in(sk, conn, now, 0, &sent->state);
	if (!m)
		return;
	/* This run's own write counted one (its time is now). Any other
	 * count since the first look: the copy may be stale already. */
	if (sent->state.time_ns == now)
		gen++;
	m->cookie = state_gens[slot] == gen ? conn : 0;
	m->state = sent->state;
	m->gen = gen;
}

/* tcp_probe fires for every segment tcp_rcv_established handles. */
SEC("tp_btf/tcp_probe")
int BPF_PROG(tcp_probe, struct sock *sk, struct sk_buff *skb)
{
	struct cpu_state *st = my_state();
	struct tcp_sent *sent;
	__u64 now, conn;

	if (!enabled(MG_G_TCP | MG_G_TCPSTATE | MG_G_RATE))
		return 0;
	conn = conn_of(st, sk, cookie_of(sk, sk), 0);
	if (conn == FILTERED || !conn)
		return 0;
	now = bpf_ktime_get_ns();
	/* The socket's storage holds the last tcp_rate, which every segment
	 * compares with; the last tcp_state, tcp_state_throttled mostly
	 * finds without it. One look for both. */
	sent = enabled(MG_G_RATE) ? tcp_sent_of(sk) : NULL;
	/* The previous ACK's sample, if no segment sent since carried it. */
	if (sent)
		emit_tcp_rate_in(sk, conn, now, &sent->rate);
	if (enabled(MG_G_TCP))
		put_tcp_rcv(st, sk, skb, conn, now);
	if (enabled(MG_G_TCPSTATE))
		tcp_state_throttled(st, sk, conn, now, sent);
	return 0;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(tcp_retransmit_skb, struct sock *sk, struct sk_buff *skb, int err)
{
	struct mg_tcp_retrans *r;
	struct tcp_skb_cb *cb;
	__u64 now, conn;
	struct emit e;

	if (!enabled(MG_G_TCP))
		return 0;
	conn = conn_of(my_state(), sk, cookie_of(sk, sk), 0);
	if (conn == FILTERED || !conn)
		return 0;
	now = bpf_ktime_get_ns();
	cb = tcp_cb(skb);
	r = RESERVE_EVENT(struct mg_tcp_retrans, MG_TCP_RETRANS, now, &e);
	if (!r)
		return 0;
	fill(&r->hdr, MG_TCP_RETRANS, now, e.pid_tgid, conn, err < 0 ? err : seg_len(cb), sk_netns(sk));
	r->hdr.flags = cb->tcp_flags;
	r->seq = cb->seq;
	r->state = sk->__sk_common.skc_state;
	r->_pad[0] = r->_pad[1] = r->_pad[2] = 0;
	SUBMIT(r, &e);
	emit_tcp_state(sk, conn, now, 1);
	return 0;
}

static __always_inline void emit_conn_close(struct sock *sk, struct conn_info *ci, __u64 cookie, __u64 now)
{
	struct mg_conn_close *r;
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct sock_addrs a;
	struct emit e;

	read_addrs(sk, &a);
	/*
	 * A TCP connection's packets do not end at TCP_CLOSE: a socket that
	 * closes on its way to TIME_WAIT (or into the FIN_WAIT2 mini socket
	 * an orphan moves to) still gets the peer's FIN and sends the last
	 * ACK, and after a reset, what was in flight still arrives and is
	 * answered with resets. The kernel's own TIME_WAIT socket answers
	 * for it, and nothing tells a program when that one goes. So its
	 * tuple stays, like its conns entry (closed): those packets stay
	 * attributed to it until a new socket of the same addresses takes
	 * the tuple over, or the LRU map ages it out. A listener's, and a
	 * UDP socket's (which others may share), go.
	 */
	if (a.proto != IPPROTO_TCP_ || !a.rport)
		forget_conn_tuple(&a, ci, cookie);
	r = RESERVE_CONTROL(struct mg_conn_close, MG_CONN_CLOSE, now, &e);
	if (r) {
		fill(&r->hdr, MG_CONN_CLOSE, now, e.pid_tgid, cookie, 0, a.netns);
		if (a.proto == IPPROTO_TCP_) {
			r->bytes_acked = BPF_CORE_READ(tp, bytes_acked);
			r->bytes_received = BPF_CORE_READ(tp, bytes_received);
			r->total_retrans = BPF_CORE_READ(tp, total_retrans);
		} else {
			r->bytes_acked = 0;
			r->bytes_received = 0;
			r->total_retrans = 0;
		}
		r->state = a.state;
		r->_pad[0] = r->_pad[1] = r->_pad[2] = 0;
		SUBMIT(r, &e);
	}
	/* Kept (the LRU map ages it out) so that the last ACKs and a reused
	 * cookie lookup do not announce the connection again. */
	ci->closed = 1;
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(inet_sock_set_state, struct sock *sk, int oldstate, int newstate)
{
	__u64 now, cookie, conn;

	if (sk->sk_protocol != IPPROTO_TCP_)
		return 0;
	/* ACKs that reach a closing connection go through
	 * tcp_rcv_state_process, where tcp_probe does not fire: their sample
	 * is caught at the state change they cause (FIN acknowledged). */
	if (enabled(MG_G_RATE) && newstate >= TCP_FIN_WAIT1_ && newstate <= TCP_CLOSING_ &&
	    newstate != TCP_CLOSE_ && newstate != TCP_LISTEN_) {
		conn = conn_of(my_state(), sk, cookie_of(sk, sk), 0);
		if (conn != FILTERED && conn)
			emit_tcp_rate(sk, conn, bpf_ktime_get_ns());
	}
	if (newstate == TCP_LISTEN_) {
		/* Announced by its owner, in listen(): the first SYN then finds
		 * it by address, and the table names the process that listens
		 * rather than the one a SYN's softirq interrupted. */
		conn_of(my_state(), sk, cookie_of(sk, sk), PROCESS_LISTEN);
		return 0;
	}
	if (newstate != TCP_CLOSE_ && newstate != TCP_ESTABLISHED_)
		return 0;
	cookie = cookie_of(sk, sk);
	if (newstate == TCP_ESTABLISHED_) {
		/* Learn the tuple now that both ends are known. */
		conn = conn_of(my_state(), sk, cookie, 0);
		if (summary_mode && conn && conn != FILTERED && enabled(MG_G_SOCK | MG_G_TCP))
			summary_sock_open(sk, conn);
		return 0;
	}
	forget_local_drop(sk);
	now = bpf_ktime_get_ns();
	struct conn_info *ci = bpf_map_lookup_elem(&conns, &cookie);
	if (!ci || ci->closed)
		return 0;
	conn = ci->selected ? cookie : 0;
	if (conn && enabled(MG_G_RATE))
		emit_tcp_rate(sk, conn, now);
	if (conn && enabled(MG_G_TCPSTATE))
		emit_tcp_state(sk, conn, now, 1);
	if (conn && summary_mode) {
		struct sock_last *l = bpf_sk_storage_get(&sock_lasts, sk, 0, 0);

		if (l)
			summarize_sock(sk, l, oldstate, SOCK_READ_CLOSE);
	}
	if (conn) {
		emit_conn_close(sk, ci, cookie, now);
	} else if (!ci->eligible && ci->rport) {
		/* Left out for good (--port, an expression): its late packets
		 * stay its, as a recorded connection's do (emit_conn_close),
		 * rather than fall to its listener, which the filters may
		 * select. */
		ci->closed = 1;
	} else {
		struct sock_addrs a;

		read_addrs(sk, &a);
		forget_conn_tuple(&a, ci, cookie);
		bpf_map_delete_elem(&conns, &cookie);
	}
	return 0;
}

/* Summary mode: each interval, the recorder runs this over every TCP
 * socket it reads (those with a sock_last) before it reads the figures. */
SEC("iter/bpf_sk_storage_map")
int sock_figures(struct bpf_iter__bpf_sk_storage_map *ctx)
{
	struct sock *sk = ctx->sk;
	struct sock_last *l;

	if (!sk)
		return 0;
	l = bpf_sk_storage_get(&sock_lasts, sk, 0, 0);
	if (l)
		summarize_sock(sk, l, 0, SOCK_READ_ITER);
	return 0;
}

/* UDP sockets have no state changes: they end when released. In summary
 * mode, a TCP socket's figures are read when it is released. */
SEC("cgroup/sock_release")
int udp_release(struct bpf_sock *ctx)
{
	__u64 cookie, now;
	struct conn_info *ci;
	struct sock *sk;

	if (ctx->protocol == IPPROTO_TCP_ && summary_mode) {
		/* What the application wrote and read ends here; what TCP
		 * sends and receives, at TCP_CLOSE (the later is the last
		 * read). */
		struct sock_last *l = bpf_sk_storage_get(&sock_lasts, ctx, 0, 0);

		if (l)
			summarize_sock((struct sock *)bpf_cast_to_kern_ctx(ctx), l, 0, SOCK_READ_RELEASE);
		return 1;
	}
	if (ctx->protocol != IPPROTO_UDP_)
		return 1;
	cookie = bpf_get_socket_cookie(ctx);
	ci = bpf_map_lookup_elem(&conns, &cookie);
	if (!ci || ci->closed)
		return 1;
	now = bpf_ktime_get_ns();
	sk = (struct sock *)bpf_cast_to_kern_ctx(ctx);
	if (!ci->selected) {
		struct sock_addrs a;

		read_addrs(sk, &a);
		forget_conn_tuple(&a, ci, cookie);
		bpf_map_delete_elem(&conns, &cookie);
		return 1;
	}
	emit_conn_close(sk, ci, cookie, now);
	return 1;
}

/*
 * A UDP socket bound to a port is announced at bind time, so that the
 * first datagram it receives is attributed at the device layer already.
 */
static __always_inline int udp_bound(struct bpf_sock *ctx)
{
	if (ctx->protocol != IPPROTO_UDP_)
		return 1;
	conn_of(my_state(), (struct sock *)bpf_cast_to_kern_ctx(ctx), bpf_get_socket_cookie(ctx), 1);
	return 1;
}

SEC("cgroup/post_bind4")
int udp_bind4(struct bpf_sock *ctx)
{
	return udp_bound(ctx);
}

SEC("cgroup/post_bind6")
int udp_bind6(struct bpf_sock *ctx)
{
	return udp_bound(ctx);
}

/* One tcp_xmit record, whichever hook read the segment: the retransmission
 * mark compares seq with snd_nxt as TCP had it before sending. */
static __always_inline void put_tcp_xmit(struct cpu_state *st, struct sock *sk, __u64 conn, __u64 t, __s32 len,
					 __u8 tflags, __u32 seq, __u16 segs, __u32 snd_nxt)
{
	struct mg_tcp_xmit *r;
	struct emit e;

	r = RESERVE_EVENT_IN(st, struct mg_tcp_xmit, MG_TCP_XMIT, t, &e);
	if (!r)
		return;
	fill(&r->hdr, MG_TCP_XMIT, t, e.pid_tgid, conn, len, sk_netns(sk));
	r->hdr.flags = tflags;
	r->seq = seq;
	r->gso_segs = segs ? segs : 1;
	r->retrans = 0;
	if (len > 0 && seq_before(seq, snd_nxt))
		r->retrans = MG_RETRANS_NETWORK;
	else if (len > 0 && local_drop_marks && resent_after_drop(sk, seq, len))
		r->retrans = MG_RETRANS_LOCAL;
	r->_pad = 0;
	SUBMIT(r, &e);
}

static __always_inline void emit_tcp_xmit(struct cpu_state *st, struct sock *sk, struct sk_buff *skb,
					 __u64 conn, __u32 snd_nxt, __u64 now)
{
	struct tcp_skb_cb *cb = tcp_cb(skb);

	put_tcp_xmit(st, sk, conn, now, seg_len(cb), cb->tcp_flags, cb->seq, cb->tcp_gso_segs, snd_nxt);
}

/*
 * Segments a connection takes once it has left ESTABLISHED (after close()
 * or shutdown() in FIN_WAIT1, FIN_WAIT2 and CLOSING; after the peer's FIN
 * in CLOSE_WAIT and LAST_ACK) go through tcp_rcv_state_process, where
 * tcp_probe does not fire: a sender that closes right after its last write
 * takes all its ACKs there. sockops' header-parsing callback runs for each
 * of them (tcp_validate_incoming, before tcp_ack, as tcp_probe runs before
 * its segment): it writes the tcp_rcv (and the throttled tcp_state)
 * tcp_probe would have. The callback is switched on per socket as it
 * leaves ESTABLISHED (its STATE callback), so that the segments of an
 * established connection, which tcp_probe sees, cost no program run.
 */
static __noinline void tcp_rcv_closing(struct sock *sk, struct sk_buff *skb, __u64 conn)
{
	struct cpu_state *st = my_state();
	__u64 now;

	if (!st)
		return;
	now = bpf_ktime_get_ns();
	put_tcp_rcv(st, sk, skb, conn, now);
	emit_tcp_state(sk, conn, now, 0);
}

/*
 * sockops: where neither fentry nor IP egress serves tcp_xmit, enable the
 * per-segment header callbacks on every TCP socket as it connects or is
 * accepted; BPF_SOCK_OPS_HDR_OPT_LEN_CB then runs for each segment TCP
 * builds, before it goes to IP. We reserve no option space, so
 * the wire is untouched.
 */
SEC("sockops")
int tcp_segments(struct bpf_sock_ops *skops)
{
	struct bpf_sock_ops_kern *k;
	struct cpu_state *st;
	struct sock *sk;
	struct sk_buff *skb;
	__u64 now, conn;

	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB: {
		__u64 cookie = bpf_get_socket_cookie(skops);

		k = bpf_cast_to_kern_ctx(skops);
		sk = k->sk;
		st = my_state();
		conn = sk ? conn_of(st, sk, cookie, skops->op == BPF_SOCK_OPS_TCP_CONNECT_CB) : 0;
		/* The flag makes TCP run this program for every segment it
		 * sends and every time it works out its MSS (2.3 runs per
		 * packet of a bulk transfer, ~70 ns each when they find
		 * nothing to do, bench/hooks.sh): only while sockops serves
		 * tcp_xmit (neither fentry, IP egress nor the device can) and
		 * it or tcp_rate is recorded, and a socket the filters leave out
		 * for good (another netns, port or cgroup; not one the pid
		 * filter may still select) goes without. A socket that
		 * connects while neither is recorded gets no tcp_xmit if they
		 * are switched on later (SetGroups). Silenced (no group: the
		 * bench's hooks-alone figure) still asks, as when recording. */
		if (!xmit_by_fentry && !xmit_at_dev && !xmit_at_ip && !summary_mode &&
		    (enabled(MG_G_TCP | MG_G_RATE) || !events_mask) &&
		    !(conn == FILTERED && left_out(st, cookie)))
			bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags |
								 BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
		/* State changes are few: see tcp_rcv_closing. */
		if (!summary_mode && enabled(MG_G_TCP) && !(conn == FILTERED && left_out(st, cookie)))
			bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
		return 1;
	}
	case BPF_SOCK_OPS_STATE_CB:
		/* args[1]: the new state. See tcp_rcv_closing. */
		if (enabled(MG_G_TCP) && !summary_mode &&
		    (skops->args[1] == TCP_FIN_WAIT1_ || skops->args[1] == TCP_CLOSE_WAIT_))
			bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags |
								 BPF_SOCK_OPS_PARSE_ALL_HDR_OPT_CB_FLAG);
		return 1;
	case BPF_SOCK_OPS_PARSE_HDR_OPT_CB:
		k = bpf_cast_to_kern_ctx(skops);
		sk = k->sk;
		skb = k->skb;
		/* Summary mode reads the socket instead; another recorder
		 * on the host may have flagged it. */
		if (!sk || !skb || !enabled(MG_G_TCP) || summary_mode || sk->__sk_common.skc_state == TCP_ESTABLISHED_)
			return 1;
		conn = conn_of(my_state(), sk, cookie_of(sk, skops), 0);
		if (conn != FILTERED && conn)
			tcp_rcv_closing(sk, skb, conn);
		return 1;
	case BPF_SOCK_OPS_HDR_OPT_LEN_CB:
		break;
	default:
		return 1;
	}
	k = bpf_cast_to_kern_ctx(skops);
	skb = k->skb;
	/* tcp_current_mss() asks for the option length with no skb, once or
	 * more per send call: a third of this program's runs return here,
	 * before anything outside the context is read. */
	if (!skb)
		return 1;
	/* In summary mode the socket's figures are read from it, but
	 * another recorder on the host may have flagged the socket. */
	if (!enabled(MG_G_TCP | MG_G_RATE) || xmit_by_fentry || xmit_at_dev || xmit_at_ip || summary_mode)
		return 1;
	sk = k->sk;
	if (!sk)
		return 1;
	st = my_state();
	conn = conn_of(st, sk, cookie_of(sk, skops), 0);
	if (conn == FILTERED || !conn)
		return 1;
	now = bpf_ktime_get_ns();
	/* The sample of the ACK that let this segment go comes first. */
	if (enabled(MG_G_RATE))
		emit_tcp_rate(sk, conn, now);
	if (enabled(MG_G_TCP))
		emit_tcp_xmit(st, sk, skb, conn, skops->snd_nxt, now);
	return 1;
}

/* How far TCP's clock may lag the device for a tcp_xmit to take its time:
 * beyond it, the path that sent the segment did not read the clock (or the
 * segment waited, for an address to resolve), and the device time is the
 * better one. */
#define XMIT_CLOCK_MAX_NS 1000000

/*
 * tcp_xmit read below TCP, from an skb TCP sent: at IP egress (cgroup_skb,
 * the default where fentry is refused: tcp_xmit_at_ip in bpf/layer/ip.c) or
 * where it reaches the device the route chose (net_dev_queue,
 * --xmit-at-device). skb->sk is the sending socket, and the headers TCP
 * wrote say what the control block, cleared by __tcp_transmit_skb before
 * IP, said. Both see the skb before GSO splits it: one tcp_xmit per skb TCP
 * sent, as at __tcp_transmit_skb. IP egress runs synchronously inside
 * __tcp_transmit_skb (ip_finish_output, after netfilter, before any
 * neighbour or qdisc), once per skb, as a program run the kernel never
 * skips; the device runs later, and a segment that never reaches a device
 * has none there. docs/EVENTS.md.
 *
 * tcp_xmit_below_ok says whether the skb at the device is a segment its
 * socket's TCP built.
 */
static __always_inline int tcp_xmit_below_ok(struct sk_buff *skb, struct sock *sk)
{
	unsigned char *head = skb->head;
	struct dst_entry *dst;
	struct tcphdr *th;
	__u16 th_off;

	if (!sk || sk->sk_protocol != IPPROTO_TCP_ || !sk_is_full(sk))
		return 0;
	/* A stacked device (VLAN, bond) hands the same skb to the one below
	 * it: only the device the route chose reports it. */
	dst = KERNEL_CAST(struct dst_entry, skb->_skb_refdst & ~1UL);
	if (dst && dst->dev != skb->dev)
		return 0;
	th_off = skb->transport_header;
	if (!th_off || th_off == 0xffff)
		return 0;
	th = KERNEL_CAST(struct tcphdr, head + th_off);
	/* The socket's own segment (not a tunnel's outer header, which has
	 * other ports, nor the kernel's control socket's resets and TIME_WAIT
	 * ACKs, nor a listener's SYN-ACK: neither passes __tcp_transmit_skb). */
	if (__builtin_bswap16(th->source) != sk->__sk_common.skc_num ||
	    th->dest != sk->__sk_common.skc_dport)
		return 0;
	if (skb->protocol == __builtin_bswap16(ETH_P_IP) &&
	    KERNEL_CAST(struct iphdr, head + skb->network_header)->protocol != IPPROTO_TCP_)
		return 0;
	return 1;
}

/* The tcp_xmit of a segment a hook below TCP read, of connection conn, at
 * time t: seq and the TCP flags byte packed as seq | flags << 32, the
 * payload and gso_segs as len | segs << 32. A call of its own, apart from
 * conn_of's and emit_tcp_rate's: each chain's stack then stays within the
 * verifier's 512 bytes. */
static __noinline void tcp_xmit_put(struct sock *sk, __u64 conn, __u64 t, __u64 seq_flags, __u64 len_segs)
{
	/* TCP advances snd_nxt past new data once the skb is handed over
	 * (tcp_event_new_data_sent): below it, snd_nxt is still as TCP had
	 * it before sending. */
	put_tcp_xmit(my_state(), sk, conn, t, (__s32)(__u32)len_segs, seq_flags >> 32, (__u32)seq_flags,
		     len_segs >> 32, KERNEL_CAST(struct tcp_sock, sk)->snd_nxt);
}

/* The TCP flags as tcp_xmit's flags carry them: TCP's own byte 13 (CWR,
 * ECE, URG, ACK, PSH, RST, SYN, FIN from its high bit down), one load.
 * Assembled from the eight bitfields instead, it took ip_egress 35
 * instructions and eight stack slots. */
static __always_inline __u8 tcp_flag_byte(const struct tcphdr *th)
{
	return ((const __u8 *)th)[13];
}

/* tcp_xmit and the tcp_rate a segment carries out, read at the device
 * (--xmit-at-device). */
static __always_inline void tcp_xmit_from(struct sk_buff *skb, struct sock *sk)
{
	struct skb_shared_info *si;
	unsigned char *th_p;
	struct tcphdr *th;
	__u64 conn, now, t;
	__s32 len;

	if (!tcp_xmit_below_ok(skb, sk))
		return;
	conn = conn_of(my_state(), sk, sk_cookie(sk), 0);
	if (conn == FILTERED || !conn)
		return;
	now = bpf_ktime_get_ns();
	/* TCP's clock, read as the pass that sent this skb began
	 * (tcp_mstamp_refresh): before IP saw it, so that tcp_xmit comes
	 * before ip_send; the device's time comes after. */
	t = KERNEL_CAST(struct tcp_sock, sk)->tcp_clock_cache;
	if (!t || t > now || now - t > XMIT_CLOCK_MAX_NS)
		t = now;
	/* The sample of the ACK that let this segment go comes first. */
	if (enabled(MG_G_RATE))
		emit_tcp_rate(sk, conn, t);
	if (!enabled(MG_G_TCP))
		return;
	th_p = skb->head + skb->transport_header;
	th = KERNEL_CAST(struct tcphdr, th_p);
	len = (__s32)skb->len - (__s32)(th_p - skb->data) - (__s32)th->doff * 4;
	si = KERNEL_CAST(struct skb_shared_info, skb->head + skb->end);
	tcp_xmit_put(sk, conn, t, (__u64)tcp_flag_byte(th) << 32 | __builtin_bswap32(th->seq),
		     (__u64)si->gso_segs << 32 | (__u32)len);
}

static __noinline void tcp_xmit_at_dev(struct sk_buff *skb)
{
	tcp_xmit_from(skb, skb->sk);
}

/*
 * Where the kernel allows fentry, tcp_xmit (and the tcp_rate a segment
 * carries out) comes from __tcp_transmit_skb itself: it needs no per-socket
 * flag, so it also sees connections that existed before recording started.
 * The recorder then sets xmit_by_fentry and sockops stops reporting segments.
 */
SEC("fentry/__tcp_transmit_skb")
int BPF_PROG(tcp_xmit_fentry, struct sock *sk, struct sk_buff *skb)
{
	struct cpu_state *st;
	__u64 now, conn;

	if (!enabled(MG_G_TCP | MG_G_RATE) || !xmit_by_fentry || xmit_at_dev || xmit_at_ip)
		return 0;
	st = my_state();
	conn = conn_of(st, sk, cookie_of(sk, sk), 0);
	if (conn == FILTERED || !conn)
		return 0;
	now = bpf_ktime_get_ns();
	if (enabled(MG_G_RATE))
		emit_tcp_rate(sk, conn, now);
	if (enabled(MG_G_TCP))
		emit_tcp_xmit(st, sk, skb, conn, KERNEL_CAST(struct tcp_sock, sk)->snd_nxt, now);
	return 0;
}
