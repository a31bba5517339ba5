/* SPDX-License-Identifier: MIT */
/*
 * The fair rule of one not-waiting decision over a fleet's table (the
 * store contract's fair(), version 6): pure C over the table's bytes,
 * run by the Redis module's RATELIMIT.FAIR, with its Lua twin in
 * src/store/redis/fair.lua (docs/fair.md, "Redis: the table's bytes").
 *
 * The table: a 112-byte header ("rfair" 2 0 0, slots, V, 0, then the
 * light flows' estimator: rule.h's rate__fair_light_t, 10 words) and
 * `slots` entries of 72 bytes (the flow's hash as 8 bytes, then its
 * virtual service s, the period it last asked in plus 1, what it asked
 * in that period and the one before, its weight, what it added to the
 * light backlog while light, its long demand, the period it first asked
 * in plus 1), every number a little-endian u64 below 2^53 so that Lua's
 * doubles read it exactly.  A table of the first format ("rfair" 1 0 0,
 * 32-byte header, 48-byte entries) is read as one of these with the
 * added numbers 0 (rate__fair_import).
 */
#ifndef RATE_FAIR_STEP_H
#define RATE_FAIR_STEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rule.h"

#define RATE__FAIR_HDR 112u
#define RATE__FAIR_ENTRY 72u
#define RATE__FAIR_FIX 20 /* 2^20 of service per permit at weight 1 */
#define RATE__FAIR_PROBES 8u
#define RATE__FAIR_SLOTS_MAX 4096u
#define RATE__FAIR_WEIGHT_MAX (UINT64_C(1) << 20)
/* Every number of the table stays below 2^53 (Lua's exact integers):
 * a flow at most LEAD ahead of V, V moved down to 0 past REBASE, what a
 * flow asked and the reserve saturating. */
#define RATE__FAIR_LEAD (UINT64_C(1) << 44)
#define RATE__FAIR_REBASE (UINT64_C(1) << 40)
#define RATE__FAIR_ASKED_MAX (UINT64_C(1) << 50)
/* The most V or a flow's s can be in a table the rule wrote (V at most
 * REBASE after a charge, a flow at most LEAD past it); a table past it
 * is refused, since the Lua twin's doubles would then round where C
 * does not. */
#define RATE__FAIR_S_MAX (RATE__FAIR_REBASE + RATE__FAIR_LEAD)
#define RATE__FAIR_NEED_MAX (UINT64_C(1) << 52)

/* One decision's walk over the table: the inputs, then what enter()
 * found, read by keeps() and charge(). */
typedef struct rate__fair_step {
    uint64_t hash;      /* the flow's (never 0) */
    uint64_t weight;    /* 1..2^20 */
    uint64_t slots;     /* a new table's entries, 1..4096 */
    uint64_t now_us;    /* the request's time in microseconds, < 2^53 */
    uint64_t period_us; /* the fair period (>= 1) */
    uint64_t permits;   /* < 2^50 (the scripts' range) */
    rate__fair_shape_t shape; /* the shared policy's first limit */
    uint64_t cap;       /* the decision's capacity (its limit) */
    /* out of enter() */
    bool light;         /* the request is light (rule.h) */
    uint32_t me;        /* the flow's entry */
    bool shared;        /* it shares its home entry with another flow */
    uint64_t ep;        /* this period, plus 1 */
    uint64_t vtime;     /* V after the flow was counted */
    uint64_t total_w;   /* the active entries' weights */
} rate__fair_step_t;

size_t rate__fair_table_len(uint64_t slots);
/* A new, empty table of `slots` entries into t (rate__fair_table_len). */
void rate__fair_init(uint8_t *t, uint64_t slots);
/* Whether t[0..len) is a table the rule could have written: its header,
 * V and every s at most RATE__FAIR_S_MAX, what a flow asked at most
 * RATE__FAIR_ASKED_MAX, every other number below 2^53, a used entry's
 * weight 1..2^20. */
bool rate__fair_valid(const uint8_t *t, size_t len);
/* A table of the first format (32-byte header, 48-byte entries) that is
 * valid as that format, into out (rate__fair_table_len of its slots) as
 * this format's with the added numbers 0: its slots, or 0 when t is no
 * such table. */
uint64_t rate__fair_import(const uint8_t *t, size_t len, uint8_t *out,
                           size_t out_len);
/* Counts the request in the flow's entry (found or taken) and brings the
 * table to this period; a flow back from idle restarts at V.  t is a
 * valid table. */
void rate__fair_enter(rate__fair_step_t *a, uint8_t *t);
/* The room the request must leave in the shared limit (rule.h's
 * rate__fair_need; 0 for a light request): the light flows' reserve and
 * the catch-up terms of the heavy flows behind it. */
uint64_t rate__fair_reserve(const rate__fair_step_t *a, const uint8_t *t);
/* The admitted permits charged to the flow's service (and V moved down
 * once past REBASE). */
void rate__fair_charge(rate__fair_step_t *a, uint8_t *t);
/* A denial's estimated retry: the time the shared policy's rate (limit
 * per period_ns) takes to refill `missing` permits, in doubles as the Lua
 * twin computes it. */
uint64_t rate__fair_retry_ns(uint64_t missing, uint64_t period_ns,
                             uint64_t limit);

#endif
