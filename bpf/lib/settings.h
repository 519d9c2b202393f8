/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Kernel functions magnet calls, and the settings the recorder writes before
 * load (and events_mask, which it may change while the programs run). */
#ifndef MAGNET_LIB_SETTINGS_H
#define MAGNET_LIB_SETTINGS_H

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/*
 * Kernel structures are read in place wherever the verifier knows the
 * pointer's BTF type (tracepoint arguments, the kernel context of cgroup and
 * sockops programs, and what is reached from them): a direct load costs a
 * nanosecond, a bpf_probe_read_kernel() call ten or more. Packet bytes, which
 * are behind a plain address, are typed with bpf_rdonly_cast() for the same.
 * Rare paths (filters, connection open and close) keep BPF_CORE_READ.
 *
 * A pointer field read through a trusted pointer (a tracepoint argument,
 * the current task) costs the verifier, at every visit of the load, up to
 * four searches of the kernel's BTF by name (is the field marked trusted
 * or RCU?), each a linear scan of some hundred thousand types on 6.18.
 * Inlined in every event's path, task->cred and sk->...net made 36 % of
 * `magnet record`'s start (1.2 s of CPU on the CI VM): those two are read
 * through KERNEL_CAST, whose untrusted pointer the verifier does not ask
 * about. The load gains a bounds check, too small to measure (bench
 * --compare-with: 1.00 ± 0.04 of the kernel time).
 */
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;

#define KERNEL_CAST(T, p) ((T *)bpf_rdonly_cast((void *)(p), bpf_core_type_id_kernel(T)))

/* Settings, written by the recorder before load. */
const volatile __u32 filter_netns = 0;   /* 0 = any */
const volatile __u16 filter_port = 0;    /* 0 = any */
const volatile __u32 filter_tgid = 0;    /* 0 = any */
const volatile __u64 filter_cgroup = 0;  /* cgroup2 id; 0 = any */
const volatile __u32 self_tgid = 0;      /* the recorder: never traced */
const volatile __u64 exclude_cgroup = 0; /* cgroup2 id whose sockets and tasks are never traced (collect's shipper); 0 = none */
const volatile __u64 events_wakeup = 1;  /* wake the reader at this fill */
const volatile __u64 area_size = 4096;   /* bytes of each CPU's area (a power of two) */
const volatile __u64 nested_size = 4096; /* and of its nested area */
const volatile __u64 nested_wakeup = 1;
const volatile __u32 publish_ordered = 0; /* not x86: publish with a full barrier */
#define AREA_MAX_CPUS 1024
/* The slot of each CPU's areas, + 1; 0: the CPU has none. */
const volatile __u32 area_slot_of[AREA_MAX_CPUS] = {};
const volatile __u64 control_wakeup = 1;
/* Benchmark only (record --no-emit): every program does all its work, and
 * writes its event into a per-CPU scratch record that nobody reads, so that
 * what the records themselves cost (the area, its wake-ups, the reader) can
 * be told from what finding and reading the facts costs. Constant: a normal
 * load carries none of it. */
const volatile __u8 no_emit = 0;

/* Event groups enabled (enum mg_group). Not const: it may change while the
 * programs run, without losing the groups that stay enabled. */
volatile __u32 events_mask = 0;

/* Set when fentry/__tcp_transmit_skb is attached: it then reports tcp_xmit
 * instead of sockops. */
volatile __u8 xmit_by_fentry = 0;

/* Set when net_dev_queue is attached outside summary mode: tcp_xmit (and the
 * tcp_rate a segment carries out) is then read where each skb TCP sent
 * reaches its device, and neither sockops nor fentry reports segments. */
volatile __u8 xmit_at_dev = 0;

/* Set when cgroup_skb/egress serves tcp_xmit (and the tcp_rate a segment
 * carries out), the default where fentry is refused: neither sockops nor
 * fentry reports segments then. */
volatile __u8 xmit_at_ip = 0;

#endif
