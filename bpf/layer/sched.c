// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Scheduler (opt-in): switches, wake-ups, forks and exits. */

/* ---------------------------------------------------------------- */
/* scheduler (opt-in) */

/*
 * The time the kernel spends switching, without an event of its own: the
 * bare tracepoints sched_entry_tp and sched_exit_tp (6.16+) bracket
 * __schedule() on a CPU; their times are kept per CPU and carried in the
 * sched_switch records.
 */
struct sched_clock {
	__u64 entry_ns;	      /* last sched_entry_tp; 0 = consumed */
	__u64 switch_ns;      /* sched_switch of that entry; 0 = none yet */
	__u64 last_switch_ns; /* entry to exit of the last switch; 0 = carried */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sched_clock);
} sched_clocks SEC(".maps");

static __always_inline struct sched_clock *sched_clock(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&sched_clocks, &zero);
}

SEC("tp_btf/sched_entry_tp")
int BPF_PROG(sched_entry_tp, bool preempt)
{
	struct sched_clock *c;

	if (!enabled(MG_G_SCHED))
		return 0;
	c = sched_clock();
	if (!c)
		return 0;
	c->entry_ns = bpf_ktime_get_ns();
	c->switch_ns = 0;
	return 0;
}

SEC("tp_btf/sched_exit_tp")
int BPF_PROG(sched_exit_tp, bool is_switch)
{
	struct sched_clock *c;
	__u64 d;

	if (!enabled(MG_G_SCHED))
		return 0;
	c = sched_clock();
	if (!c)
		return 0;
	/* Only a switch that switched is a context switch; the exit of a
	 * __schedule() that kept the task, or whose switch was not seen,
	 * measures nothing. */
	if (is_switch && c->entry_ns && c->switch_ns) {
		d = bpf_ktime_get_ns() - c->entry_ns;
		c->last_switch_ns = d > 0xffffffffULL ? 0xffffffffULL : d;
	}
	c->entry_ns = 0;
	c->switch_ns = 0;
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	struct mg_sched_switch *r;
	struct sched_clock *c;
	__u64 now;
	struct emit e;

	if (!enabled(MG_G_SCHED))
		return 0;
	now = bpf_ktime_get_ns();
	/* Marked before any filter, so that the exit measures every switch
	 * of the CPU, recorded or not. */
	c = sched_clock();
	if (c)
		c->switch_ns = now;
	if ((filter_tgid || filter_cgroup) && !task_selected(prev) && !task_selected(next))
		return 0;
	/* Either side: the header names prev, the body next. */
	if (exclude_cgroup && (task_excluded(prev) || task_excluded(next)))
		return 0;
	r = RESERVE_EVENT(struct mg_sched_switch, MG_SCHED_SWITCH, now, &e);
	if (!r)
		return 0;
	fill(&r->hdr, MG_SCHED_SWITCH, now, e.pid_tgid, 0, 0, 0);
	r->next_tid = next->pid;
	r->next_pid = next->tgid;
	r->prev_state = prev_state;
	r->pick_ns = 0;
	r->last_switch_ns = 0;
	r->_pad = 0;
	if (c) {
		if (c->entry_ns && now > c->entry_ns && now - c->entry_ns <= 0xffffffffULL)
			r->pick_ns = now - c->entry_ns;
		r->last_switch_ns = c->last_switch_ns;
		c->last_switch_ns = 0;
	}
	BPF_CORE_READ_STR_INTO(&r->next_comm, next, comm);
	SUBMIT(r, &e);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(sched_wakeup, struct task_struct *p)
{
	struct mg_sched_wakeup *r;
	__u64 now;
	struct emit e;

	if (!enabled(MG_G_SCHED))
		return 0;
	if ((filter_tgid || filter_cgroup) && !task_selected(p))
		return 0;
	/* The header names the waker (current), the body the woken task. */
	if (exclude_cgroup && (task_excluded(p) || task_excluded(bpf_get_current_task_btf())))
		return 0;
	now = bpf_ktime_get_ns();
	r = RESERVE_EVENT(struct mg_sched_wakeup, MG_SCHED_WAKEUP, now, &e);
	if (!r)
		return 0;
	fill(&r->hdr, MG_SCHED_WAKEUP, now, e.pid_tgid, 0, 0, 0);
	r->target_tid = p->pid;
	r->target_cpu = p->wake_cpu;
	BPF_CORE_READ_STR_INTO(&r->target_comm, p, comm);
	SUBMIT(r, &e);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(sched_process_fork, struct task_struct *parent, struct task_struct *child)
{
	struct mg_sched_fork *r;
	__u64 now;
	struct emit e;

	if (!enabled(MG_G_SCHED))
		return 0;
	if ((filter_tgid || filter_cgroup) && !task_selected(parent))
		return 0;
	/* The child too: the service starts the shipper straight into its
	 * cgroup (CLONE_INTO_CGROUP), which the child is in by now. */
	if (exclude_cgroup && (task_excluded(parent) || task_excluded(child)))
		return 0;
	now = bpf_ktime_get_ns();
	r = RESERVE_EVENT(struct mg_sched_fork, MG_SCHED_FORK, now, &e);
	if (!r)
		return 0;
	fill(&r->hdr, MG_SCHED_FORK, now, e.pid_tgid, 0, 0, 0);
	r->child_tid = child->pid;
	r->child_pid = child->tgid;
	BPF_CORE_READ_STR_INTO(&r->child_comm, child, comm);
	SUBMIT(r, &e);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(sched_process_exit, struct task_struct *p, bool group_dead)
{
	struct mg_sched_exit *r;
	__u64 now;
	struct emit e;

	if (!enabled(MG_G_SCHED))
		return 0;
	if ((filter_tgid || filter_cgroup) && !task_selected(p))
		return 0;
	if (exclude_cgroup && task_excluded(p))
		return 0;
	now = bpf_ktime_get_ns();
	r = RESERVE_EVENT(struct mg_sched_exit, MG_SCHED_EXIT, now, &e);
	if (!r)
		return 0;
	fill(&r->hdr, MG_SCHED_EXIT, now, e.pid_tgid, 0, p->exit_code, 0);
	r->exit_code = p->exit_code;
	r->group_dead = group_dead;
	r->_pad[0] = r->_pad[1] = r->_pad[2] = 0;
	SUBMIT(r, &e);
	return 0;
}
