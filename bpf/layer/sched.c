// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Scheduler (opt-in): switches, wake-ups, forks and exits. */

/* ---------------------------------------------------------------- */
/* scheduler (opt-in) */

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	struct mg_sched_switch *r;
	__u64 now;
	struct emit e;

	if (!enabled(MG_G_SCHED))
		return 0;
	if ((filter_tgid || filter_cgroup) && !task_selected(prev) && !task_selected(next))
		return 0;
	/* Either side: the header names prev, the body next. */
	if (exclude_cgroup && (task_excluded(prev) || task_excluded(next)))
		return 0;
	now = bpf_ktime_get_ns();
	r = RESERVE_EVENT(struct mg_sched_switch, MG_SCHED_SWITCH, now, &e);
	if (!r)
		return 0;
	fill(&r->hdr, MG_SCHED_SWITCH, now, e.pid_tgid, 0, 0, 0);
	r->next_tid = next->pid;
	r->next_pid = next->tgid;
	r->prev_state = prev_state;
	r->_pad = 0;
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
