/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * kevent.h: the C <-> Go ABI of magnet's generic kernel events (tracepoints
 * chosen at run time, uprobes). Such a record is struct mg_hdr (events.h)
 * followed by a payload whose layout is not known when magnet is built: the
 * recorder writes it into the trace's dictionary from the tracepoint's
 * tracefs format. In the ring a record is always followed by struct mg_task.
 */
#ifndef MAGNET_KEVENT_H
#define MAGNET_KEVENT_H

#define KEV_MAX 64        /* kernel events in one recording */
#define KEV_MAX_STRS 4    /* __data_loc fields copied per event */
#define KEV_MAX_ZERO 8    /* pointer fields blanked per event */
#define KEV_MAX_PREDS 8   /* filter predicates per event */
#define KEV_MAX_COPY 256  /* bytes of a tracepoint's fixed record copied */
#define KEV_STR_LEN 64    /* bytes kept of a __data_loc field */
#define KEV_UPROBE_ARGS 6 /* argument registers a uprobe records */

/* Filter operators (struct kev_pred.op). */
enum kev_op {
	KEV_OP_EQ = 1,
	KEV_OP_NE = 2,
	KEV_OP_LT = 3,
	KEV_OP_LE = 4,
	KEV_OP_GT = 5,
	KEV_OP_GE = 6,
	KEV_OP_AND = 7, /* (field & value) != 0 */
};

/* One test "field OP value" on the raw tracepoint record. The predicates
 * form a disjunction of conjunctions: new_term starts another conjunction. */
struct kev_pred {
	__u64 value;
	__u16 off; /* in the raw record */
	__u8 size; /* 1, 2, 4, 8 */
	__u8 op;   /* enum kev_op */
	__u8 is_signed;
	__u8 new_term;
	__u8 _pad[2];
};

/* A __data_loc field copied, bounded, into the record. */
struct kev_str {
	__u16 src;     /* offset of the __data_loc word in the raw record */
	__u16 dst;     /* offset of the copy in the record */
	__u8 rel;      /* __rel_loc: relative to the end of the word */
	__u8 text;     /* a string: copied up to its NUL */
	__u8 _pad[2];
};

/* Per-CPU counters, one slot per kernel event, so that recorded + lost ==
 * produced can be checked exactly for each. */
struct kev_counters {
	__u64 produced[KEV_MAX];
	__u64 lost[KEV_MAX];
};

/* kevent_lost: written in place when the ring was full, as struct mg_lost
 * is for the built-in events; counts by kernel event slot. */
struct kev_lost {
	struct mg_hdr hdr;
	__u64 first_ns;
	__u64 last_ns;
	__u32 total;
	__u32 _pad;
	__u32 counts[KEV_MAX];
};

/* How a USDT probe's argument is found (struct kev_arg.kind). */
enum kev_arg_kind {
	KEV_ARG_NONE = 0,
	KEV_ARG_REG = 1,   /* a register */
	KEV_ARG_MEM = 2,   /* memory at a register + disp */
	KEV_ARG_CONST = 3, /* the constant disp */
};

/* A USDT argument, from the probe's note ("-4@8(%rbp)"). */
struct kev_arg {
	__s64 disp;  /* displacement or constant */
	__u16 reg;   /* offset of the register in struct pt_regs */
	__u8 kind;   /* enum kev_arg_kind */
	__s8 size;   /* bytes, negative when signed */
	__u8 _pad[4];
};

/* uprobe: the first argument registers of the probed function; a USDT
 * probe: its arguments. */
struct kev_uprobe {
	struct mg_hdr hdr;
	__u64 args[KEV_UPROBE_ARGS];
};

#endif
