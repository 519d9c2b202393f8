// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Synthetic events: programs that are never attached, run with
 * BPF_PROG_TEST_RUN, and put dev_xmit events (conn 0, ifindex 0) in the
 * rings through the path every hook takes (lib/area.h: clock, counters,
 * this CPU's area, the task). They are not in magnet.bpf.c, so the product
 * never carries them: this object is loaded beside a recording's programs,
 * on the same maps and with the same settings (probe.Probe.LoadSharing),
 * by the measurement lab (lab/internal/synthevent) and by internal/probe's
 * tests of the rings.
 *
 * magnet-lab bench runs synth_event at a rate it chooses and without any
 * network stack around it, which measures that path's cost alone and the
 * highest rate the recorder keeps up with. synth_empty is the same call
 * doing nothing: the cost of the test run itself. synth_burst makes
 * SYNTH_BURST events per run, so that the test run's own cost (~16 ns,
 * ~60 while any process has run statistics on) is shared: one producer
 * thread, sharing its CPU with a transfer, can then outrun the recorder.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "events.h"
#include "lib/kernel.h"
#include "lib/settings.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#include "lib/maps.h"
#include "lib/area.h"

/* Events per synth_burst run: synthevent.BurstEvents in Go. */
#define SYNTH_BURST 16

static __always_inline void synth_put(__u32 len)
{
	struct mg_dev *r;
	__u64 now = bpf_ktime_get_ns();
	struct emit e;

	r = RESERVE_EVENT(struct mg_dev, MG_DEV_XMIT, now, &e);
	if (!r)
		return;
	fill(&r->hdr, MG_DEV_XMIT, now, e.pid_tgid, 0, len, 0);
	r->ifindex = 0;
	r->gso_segs = 1;
	r->ip_id = 0;
	r->ttl = r->tos = r->proto = r->family = 0;
	r->seq = 0;
	SUBMIT(r, &e);
}

SEC("tc")
int synth_event(struct __sk_buff *ctx)
{
	synth_put(ctx->len);
	return 0;
}

static long synth_burst_one(__u64 i, void *len)
{
	synth_put(*(__u32 *)len);
	return 0;
}

SEC("tc")
int synth_burst(struct __sk_buff *ctx)
{
	__u32 len = ctx->len;

	bpf_loop(SYNTH_BURST, synth_burst_one, &len, 0);
	return 0;
}

/*
 * synth_nested does, within one run, what an interrupt does to a program
 * between its reservation and its publication: it reserves an event,
 * makes another before publishing the first (which goes to the nested
 * area), and a third while both are held (lost: there is no third level).
 * Their sizes tell them apart: 1, 2 and 3.
 */
SEC("tc")
int synth_nested(struct __sk_buff *ctx)
{
	struct mg_dev *r;
	__u64 now = bpf_ktime_get_ns();
	struct emit e;

	r = RESERVE_EVENT(struct mg_dev, MG_DEV_XMIT, now, &e);
	if (!r)
		return 0;
	fill(&r->hdr, MG_DEV_XMIT, now, e.pid_tgid, 0, 1, 0);
	r->ifindex = 0;
	r->gso_segs = 1;
	r->ip_id = 0;
	r->ttl = r->tos = r->proto = r->family = 0;
	r->seq = 0;
	{
		struct mg_dev *r2;
		__u64 now2 = bpf_ktime_get_ns();
		struct emit e2;

		r2 = RESERVE_EVENT(struct mg_dev, MG_DEV_XMIT, now2, &e2);
		if (r2) {
			fill(&r2->hdr, MG_DEV_XMIT, now2, e2.pid_tgid, 0, 2, 0);
			r2->ifindex = 0;
			r2->gso_segs = 1;
			r2->ip_id = 0;
			r2->ttl = r2->tos = r2->proto = r2->family = 0;
			r2->seq = 0;
			synth_put(3);
			SUBMIT(r2, &e2);
		}
	}
	SUBMIT(r, &e);
	return 0;
}

SEC("tc")
int synth_empty(struct __sk_buff *ctx)
{
	return 0;
}
