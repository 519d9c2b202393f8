/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Runs of the device programs, by interface, before anything else they do.
 * The kernel sometimes runs no program at a device tracepoint for a frame
 * the interface handled, and counts that nowhere (recursion_misses stays 0,
 * bpftrace misses the same frames). The recorder compares these counts with
 * the interface's own packet counters over the recording: what the
 * interface handled and no program ran for is what the kernel skipped.
 *
 * Only the recorded network namespace's interfaces are counted (all, with
 * no netns filter), as the unrecorded counts are.
 */
#ifndef MAGNET_LIB_DEVRUNS_H
#define MAGNET_LIB_DEVRUNS_H

enum mg_devrun {
	/* net_dev_queue, every run. */
	MG_DEVRUN_QUEUE,
	/* net_dev_queue runs on a tx queue without a qdisc that holds
	 * packets (noqueue): then every frame queued goes straight to the
	 * driver, and the interface's counters count each queue run too. */
	MG_DEVRUN_QUEUE_DIRECT,
	/* net_dev_start_xmit, every run. */
	MG_DEVRUN_XMIT,
	/* netif_receive_skb, every run. */
	MG_DEVRUN_RECV,
	MG_DEVRUN_N,
};

struct mg_dev_runs {
	__u64 n[MG_DEVRUN_N];
};

/* Key: netns inode << 32 | ifindex. Interfaces whose slot below is taken
 * by another on this CPU are counted here. Entries are never deleted: a
 * full table leaves the interfaces it has no room for uncounted, and the
 * recorder reports those as not checked (it finds no entry). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct mg_dev_runs);
} dev_runs SEC(".maps");

/* Each CPU's slots, an interface in the slot its key hashes to: a lookup
 * the verifier inlines, where a hash lookup on every device program run
 * cost ~70 ns (net_dev_queue, bench/hooks.sh). key is the interface's key
 * + 1, 0 while the slot is free. The recorder sums slots and table by key
 * over the CPUs. */
#define DEVRUN_SLOTS 64

struct mg_dev_run_slot {
	__u64 key;
	struct mg_dev_runs runs;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DEVRUN_SLOTS);
	__type(key, __u32);
	__type(value, struct mg_dev_run_slot);
} dev_run_slots SEC(".maps");

static __noinline struct mg_dev_runs *dev_runs_slow(__u64 key)
{
	struct mg_dev_runs *c = bpf_map_lookup_elem(&dev_runs, &key);

	if (!c) {
		struct mg_dev_runs zero = {};

		/* BPF_NOEXIST: another CPU may have added it meanwhile. */
		bpf_map_update_elem(&dev_runs, &key, &zero, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&dev_runs, &key);
	}
	return c;
}

/* Count one run of a device program on dev (and, if direct, a queue run
 * without a qdisc: one lookup for both). A plain add: each counter is
 * added to only by one program, on its own CPU, and the kernel never runs
 * a program nested in itself on one CPU. A free slot is taken with a
 * compare-and-swap: another device program nested over this one (an
 * interrupt) may take it in between. */
static __always_inline void count_dev_run(const struct net_device *dev, enum mg_devrun which, int direct)
{
	struct mg_dev_run_slot *s;
	struct mg_dev_runs *c;
	__u64 key;
	__u32 netns, i;

	if (!dev)
		return;
	netns = dev->nd_net.net->ns.inum;
	if (filter_netns && netns != filter_netns)
		return;
	key = ((__u64)netns << 32) | (__u32)dev->ifindex;
	i = (__u32)((key * 0x9E3779B97F4A7C15ULL) >> 58) & (DEVRUN_SLOTS - 1);
	s = bpf_map_lookup_elem(&dev_run_slots, &i);
	if (!s)
		return;
	if (s->key == key + 1 ||
	    (s->key == 0 && __sync_val_compare_and_swap(&s->key, 0, key + 1) == 0))
		c = &s->runs;
	else
		c = dev_runs_slow(key);
	if (!c)
		return;
	if (which < MG_DEVRUN_N)
		c->n[which]++;
	if (direct)
		c->n[MG_DEVRUN_QUEUE_DIRECT]++;
}

#endif
