// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * magnet's BPF side: one program per kernel hook, each turning what it sees
 * into a fixed-size record (events.h) in one of two ring buffers:
 *   events  - the data path (socket, TCP, IP, device, drops, sched, headers)
 *   control - connection lifecycle and interface names, small and separate
 *             so that a flood of data events cannot crowd them out.
 * When a ring is full the event is counted per CPU and type; no event of that
 * CPU goes in that ring again before a `lost` record with the counts, so the
 * gap is marked in place in the stream.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "events.h"
#include "lib/kernel.h"
#include "lib/settings.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";


/* A global of each type of events.h, for bpf2go (tools/genevents). */
#include "events_btf.h"

/*
 * One object: the layers share the maps and helpers of lib/, and each
 * layer's programs live in its own file.
 */
#include "lib/maps.h"
#include "lib/area.h"
#include "lib/filter.h"
#include "lib/conn.h"
#include "lib/summary.h"
#include "lib/acks.h"
#include "lib/localdrop.h"
#include "lib/unrecorded.h"
#include "lib/devruns.h"

#include "layer/sock.c"
#include "layer/tcp.c"
#include "layer/ip.c"
#include "layer/dev.c"
#include "layer/drop.c"
#include "layer/sched.c"
#include "layer/learn.c"
