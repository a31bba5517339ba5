/* SPDX-License-Identifier: MIT */
/*
 * The fair rule of one not-waiting decision over a fleet's table (the
 * store contract's fair(), version 6): pure C over the table's bytes,
 * run by the Redis module's RATELIMIT.FAIR, with its Lua twin in
 * src/fair/fair.lua (docs/fair.md, "Redis: the table's bytes").
 *
 * The table: a 32-byte header ("rfair" 1 0 0, slots, V, 0) and `slots`
 * entries of 48 bytes (the flow's hash as 8 bytes, then its virtual
 * service s, the period it last asked in plus 1, what it asked in that
 * period and the one before, its weight), every number a little-endian
 * u64 below 2^53 so that Lua's doubles read it exactly.
 */
#ifndef RATE_FAIR_STEP_H
#define RATE_FAIR_STEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RATE__FAIR_HDR 32u
#define RATE__FAIR_ENTRY 48u
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
    /* out of enter() */
    uint32_t me;        /* the flow's entry */
    bool shared;        /* it shares its home entry with another flow */
    uint64_t ep;        /* this period, plus 1 */
    uint64_t vtime;     /* V after the flow was counted */
    uint64_t total_w;   /* the active entries' weights */
} rate__fair_step_t;

/* One flow's part of a reserve (docs/fair.md, "the rule"), the same in
 * the process's table (fair.c) and the fleet's (step.c): the least of its
 * share of the capacity floor(cap w / total_w), what it asked lately, and
 * what it needs to catch up, ceil(behind w / 2^20) for `behind` the
 * service it is behind by. */
static inline uint64_t rate__fair_fleet_term(uint64_t cap, uint64_t w,
                                       uint64_t total_w, uint64_t behind,
                                       uint64_t asked)
{
    unsigned __int128 share = (unsigned __int128)cap * w / total_w;
    unsigned __int128 catch_up =
        ((unsigned __int128)behind * w + ((UINT64_C(1) << RATE__FAIR_FIX) - 1))
        >> RATE__FAIR_FIX;
    uint64_t term = asked;
    if (share < term)
        term = (uint64_t)share;
    if (catch_up < term)
        term = (uint64_t)catch_up;
    return term;
}

size_t rate__fair_table_len(uint64_t slots);
/* A new, empty table of `slots` entries into t (rate__fair_table_len). */
void rate__fair_init(uint8_t *t, uint64_t slots);
/* Whether t[0..len) is a table the rule could have written: its header,
 * V and every s at most RATE__FAIR_S_MAX, what a flow asked at most
 * RATE__FAIR_ASKED_MAX, every other number below 2^53, a used entry's
 * weight 1..2^20. */
bool rate__fair_valid(const uint8_t *t, size_t len);
/* Counts the request in the flow's entry (found or taken) and brings the
 * table to this period; a flow back from idle restarts at V.  t is a
 * valid table. */
void rate__fair_enter(rate__fair_step_t *a, uint8_t *t);
/* The reserve of the active flows behind the flow (0 when none is
 * behind it: it is the most owed) for a shared limit of capacity cap
 * (cap < 2^50 in the scripts' range; more saturates). */
uint64_t rate__fair_reserve(const rate__fair_step_t *a, const uint8_t *t,
                            uint64_t cap);
/* The admitted permits charged to the flow's service (and V moved down
 * once past REBASE). */
void rate__fair_charge(rate__fair_step_t *a, uint8_t *t);
/* A denial's estimated retry: the time the shared policy's rate (limit
 * per period_ns) takes to refill `missing` permits, in doubles as the Lua
 * twin computes it. */
uint64_t rate__fair_retry_ns(uint64_t missing, uint64_t period_ns,
                             uint64_t limit);

#endif
