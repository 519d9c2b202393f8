/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The maps every layer shares: the per-CPU event areas and their positions,
 * loss counts, the connection table, tuples, fragments, interfaces. */
#ifndef MAGNET_LIB_MAPS_H
#define MAGNET_LIB_MAPS_H

/*
 * Events go to an area of their CPU: MAGNeT's design, a ring of records in
 * memory the reader maps, written without a lock. A CPU's programs then
 * never wait for another CPU's on a ring's lock, never pull its positions'
 * cache line from another CPU, and pay for a record a few stores instead of
 * bpf_ringbuf_reserve() and bpf_ringbuf_submit() (a spin lock taken with
 * interrupts off, and an atomic exchange: 25-31 ns against 6 by magnet
 * bench primitives). The recorder maps each area twice in a row, as the kernel
 * maps a BPF ring buffer, and reads it with the same code: records carry
 * the ring buffer's 8-byte header, and the space left at the end of an area
 * when a record does not fit there is a discarded record.
 *
 * A program writes its record between reserving and publishing it. A
 * program that interrupts it on the same CPU (a softirq over a system
 * call's event, a hard interrupt over a softirq's) must not use the same
 * area: it takes its CPU's nested area, smaller; a third level is lost,
 * counted. Nesting is strictly last-in first-out on a CPU, so a per-CPU
 * depth counter is enough, and the interrupted program finds the position
 * as the nested one left it.
 *
 * The areas of all CPUs are the elements of one array (areas; nested_areas
 * for the second level), and their positions those of area_pos (element
 * 2 × slot + level, a cache line for the producer's position and one for
 * the reader's). A CPU that came online after the load has no slot and
 * loses its events, counted as such. The reader is woken through doorbell,
 * a small BPF ring buffer: an area cannot wake anyone.
 */
struct area_pos {
	__u64 prod; /* written by this CPU's programs only */
	__u64 _pad0[7];
	__u64 cons; /* written by the reader only */
	__u64 _pad1[7];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, 4096); /* the loader sets the area size */
	__uint(max_entries, 1);   /* and the number of CPUs with a slot */
} areas SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, 4096);
	__uint(max_entries, 1);
} nested_areas SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct area_pos);
	__uint(max_entries, 2);
} area_pos SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 << 10);
} doorbell SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 << 10);
} control SEC(".maps");

/*
 * Per-CPU production and loss counts of what any context may count at once
 * (losses, control records, an event that got no area level), with atomic
 * adds. The events themselves are counted in cpu_state (produced).
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mg_counters);
} counters SEC(".maps");

/* Losses not yet reported in the stream, per CPU, for each ring. */
struct lost_state {
	__u64 first_ns;
	__u64 last_ns;
	__u32 pending;
	__u32 counts[MG_NTYPES];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct lost_state);
} lost_states SEC(".maps");

/* Per-socket state, keyed by socket cookie. */
struct conn_info {
	__u8 selected;
	__u8 proto;
	__u8 closed;   /* conn_close written: late packets stay attributed */
	__u8 eligible; /* passes the netns, port and cgroup filters */
	__u16 lport;   /* as first seen: the kernel zeroes it before TCP_CLOSE */
	__u16 rport;   /* as last announced (conn_open): a UDP socket's changes when it connects */
};

/* The last tcp_state snapshot of a TCP socket. */
struct tcp_state_sent {
	__u64 time_ns;
	__u32 ssthresh;
	__u32 retrans;
};

/* What the last tcp_rate of a TCP socket carried: a new one is written
 * only when tp->delivered has moved since. */
struct tcp_rate_sent {
	__u32 delivered;
	__u32 rate_delivered;
	__u32 rate_interval_us;
	__u8 app_limited;
	__u8 _pad[3];
};

/* Both, kept in the socket: consulted at every segment received (tcp_probe
 * checks both), and a socket's own storage is found without hashing; one
 * storage, so that tcp_probe looks once. */
struct tcp_sent {
	struct tcp_state_sent state;
	struct tcp_rate_sent rate;
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct tcp_sent);
} tcp_sents SEC(".maps");

/*
 * A CPU's copy of a socket's tcp_sents.state, valid while its slot's count
 * in state_gens is gen: tcp_probe decides from it that no tcp_state is due
 * without looking in the socket's storage (tcp_state_throttled). Every
 * write of a tcp_sents.state counts in state_gens, so an unchanged count
 * means the storage still holds the copy.
 */
#define STATE_MEMO_SLOTS 8

struct state_memo {
	__u64 cookie;
	struct tcp_state_sent state;
	__u32 gen;
	__u32 _pad;
};

volatile __u32 state_gens[STATE_MEMO_SLOTS];

/* The peer a connected UDP socket's tuple was last learned for. */
struct udp_peer {
	__u32 daddr;    /* skc_daddr (IPv4, v4-mapped too) */
	__u32 daddr6_3; /* the last word of skc_v6_daddr */
	__u16 dport;
	__u16 _pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct udp_peer);
} udp_peers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct conn_info);
} conns SEC(".maps");

/* Address tuple -> cookie, seen from the socket's side (local, remote), so
 * a packet without a socket (ingress at the device) finds its connection. */
struct tuple {
	__u32 netns;
	__u16 lport;
	__u16 rport;
	__u8 laddr[16];
	__u8 raddr[16];
	__u8 proto;
	__u8 _pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct tuple);
	__type(value, __u64);
} tuples SEC(".maps");

/* IPv4 fragments after the first carry no ports: remember the first's. */
struct frag_key {
	__u32 netns;
	__u32 saddr;
	__u32 daddr;
	__u16 id;
	__u8 proto;
	__u8 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct frag_key);
	__type(value, __u64);
} frags SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u8);
} ifaces_seen SEC(".maps");

#endif
