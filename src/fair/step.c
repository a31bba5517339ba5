/* SPDX-License-Identifier: MIT */
/*
 * The fair rule over a fleet's table (step.h; docs/fair.md, "Redis (a
 * fleet)"): the not-waiting rule of decide.c -- virtual service, V, the
 * light flows' room and the catch-up terms of the flows behind, rule.h's
 * arithmetic -- over a flat table in the store, walked
 * whole at each decision (no heaps: the table is small and lives in
 * Redis).  Pure: no I/O, no clock, no allocation.  Its Lua twin is
 * src/fair/fair_rule.lua (with rule.lua); both keep every number below
 * 2^53.
 */
#include <string.h>

#include "step.h"

static const uint8_t MAGIC[8] = {'r', 'f', 'a', 'i', 'r', 2, 0, 0};
static const uint8_t MAGIC1[8] = {'r', 'f', 'a', 'i', 'r', 1, 0, 0};

enum { F_HASH, F_S, F_EPOCH, F_CUR, F_PREV, F_WEIGHT, F_GAVE, F_LSUM,
       F_SINCE };
#define HDR1 32u   /* the first format's header and entry */
#define ENTRY1 48u
#define LIGHT_AT 32u /* the estimator's words in the header */

static uint64_t get(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void put(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++, v >>= 8)
        p[i] = (uint8_t)v;
}

static uint8_t *ent(uint8_t *t, uint64_t i)
{
    return t + RATE__FAIR_HDR + i * RATE__FAIR_ENTRY;
}

static uint64_t fld(const uint8_t *e, int f) { return get(e + 8 * f); }
static void set(uint8_t *e, int f, uint64_t v) { put(e + 8 * f, v); }

static bool used(const uint8_t *e)
{
    static const uint8_t zero[8];
    return memcmp(e, zero, 8) != 0;
}

/* Asked in period ep or the one before (a clock gone back: later). */
static bool active(const uint8_t *e, uint64_t ep)
{
    uint64_t e_ep = fld(e, F_EPOCH);
    return used(e) && e_ep != 0 && e_ep + 1 >= ep;
}

size_t rate__fair_table_len(uint64_t slots)
{
    return RATE__FAIR_HDR + (size_t)slots * RATE__FAIR_ENTRY;
}

void rate__fair_init(uint8_t *t, uint64_t slots)
{
    memset(t, 0, rate__fair_table_len(slots));
    memcpy(t, MAGIC, sizeof MAGIC);
    put(t + 8, slots);
}

/* The first format's checks (v1: its header and entry sizes), or this
 * format's: the header, V and every s at most RATE__FAIR_S_MAX, what a
 * flow asked at most RATE__FAIR_ASKED_MAX, every other number below
 * 2^53, a used entry's weight 1..2^20. */
static bool valid_as(const uint8_t *t, size_t len, bool v1)
{
    const uint64_t top = UINT64_C(1) << 53;
    size_t hdr = v1 ? HDR1 : RATE__FAIR_HDR, esz = v1 ? ENTRY1 : RATE__FAIR_ENTRY;
    if (len < hdr || memcmp(t, v1 ? MAGIC1 : MAGIC, 8) != 0)
        return false;
    uint64_t slots = get(t + 8);
    if (slots < 1 || slots > RATE__FAIR_SLOTS_MAX ||
        len != hdr + (size_t)slots * esz || get(t + 16) > RATE__FAIR_S_MAX ||
        get(t + 24) != 0)
        return false;
    for (size_t k = LIGHT_AT; k < hdr; k += 8)
        if (get(t + k) >= top)
            return false;
    for (uint64_t i = 0; i < slots; i++) {
        const uint8_t *e = t + hdr + i * esz;
        if (fld(e, F_S) > RATE__FAIR_S_MAX || fld(e, F_EPOCH) >= top ||
            fld(e, F_CUR) > RATE__FAIR_ASKED_MAX ||
            fld(e, F_PREV) > RATE__FAIR_ASKED_MAX || fld(e, F_WEIGHT) >= top)
            return false;
        for (int f = F_GAVE; !v1 && f <= F_SINCE; f++)
            if (fld(e, f) > RATE__FAIR_LIGHT_MAX)
                return false;
        uint64_t w = fld(e, F_WEIGHT);
        if (used(e) && (w < 1 || w > RATE__FAIR_WEIGHT_MAX))
            return false;
    }
    return true;
}

bool rate__fair_valid(const uint8_t *t, size_t len)
{
    return valid_as(t, len, false);
}

uint64_t rate__fair_import(const uint8_t *t, size_t len, uint8_t *out,
                           size_t out_len)
{
    if (!valid_as(t, len, true))
        return 0;
    uint64_t slots = get(t + 8);
    if (out_len != rate__fair_table_len(slots))
        return 0;
    rate__fair_init(out, slots);
    memcpy(out + 16, t + 16, 8); /* V */
    for (uint64_t i = 0; i < slots; i++)
        memcpy(ent(out, i), t + HDR1 + i * ENTRY1, ENTRY1);
    return slots;
}

/* The periods since the entry's flow first asked, ep included. */
static uint64_t age(const uint8_t *e, uint64_t ep)
{
    return rate__fair_age(fld(e, F_SINCE), ep);
}

/* The entry's flow as the rule reads it. */
static rate__fair_flow_t flow_of(const uint8_t *e)
{
    return (rate__fair_flow_t){fld(e, F_CUR), fld(e, F_PREV), fld(e, F_LSUM),
                               fld(e, F_SINCE)};
}

/* The table's light estimator, as rule.h's struct (and back). */
static rate__fair_light_t light_of(const uint8_t *t)
{
    const uint8_t *p = t + LIGHT_AT;
    rate__fair_light_t l;
    l.q = get(p), l.t_us = get(p + 8), l.bucket = get(p + 16);
    for (int i = 0; i < 4; i++)
        l.peak[i] = get(p + 24 + 8 * i);
    l.ep = get(p + 56), l.a_cur = get(p + 64), l.a_prev = get(p + 72);
    return l;
}

static void light_put(uint8_t *t, const rate__fair_light_t *l)
{
    uint8_t *p = t + LIGHT_AT;
    put(p, l->q), put(p + 8, l->t_us), put(p + 16, l->bucket);
    for (int i = 0; i < 4; i++)
        put(p + 24 + 8 * i, l->peak[i]);
    put(p + 56, l->ep), put(p + 64, l->a_cur), put(p + 72, l->a_prev);
}

_Static_assert(LIGHT_AT + 8 * RATE__FAIR_LIGHT_WORDS == RATE__FAIR_HDR,
               "the header ends with the estimator");

/* The flow's entry: its own within PROBES of its home, else the first
 * one not active there (taken, at s = V), else its home, shared. */
static uint32_t find(rate__fair_step_t *a, uint8_t *t, uint64_t slots,
                     uint64_t v)
{
    uint64_t home = ((a->hash >> 32) * slots) >> 32;
    uint64_t probes = slots < RATE__FAIR_PROBES ? slots : RATE__FAIR_PROBES;
    uint64_t k = home, free_k = slots;
    for (uint64_t i = 0; i < probes; i++, k = k + 1 == slots ? 0 : k + 1) {
        uint8_t *e = ent(t, k);
        if (fld(e, F_HASH) == a->hash) {
            set(e, F_WEIGHT, a->weight);
            return (uint32_t)k;
        }
        if (free_k == slots && !active(e, a->ep))
            free_k = k;
    }
    if (free_k == slots) {
        a->shared = true;
        return (uint32_t)home;
    }
    uint8_t *e = ent(t, free_k);
    memset(e, 0, RATE__FAIR_ENTRY);
    set(e, F_HASH, a->hash);
    set(e, F_S, v);
    set(e, F_WEIGHT, a->weight);
    return (uint32_t)free_k;
}

void rate__fair_enter(rate__fair_step_t *a, uint8_t *t)
{
    uint64_t slots = get(t + 8), v = get(t + 16);
    a->ep = a->now_us / a->period_us + 1;
    a->shared = false;
    a->me = find(a, t, slots, v);
    uint8_t *me = ent(t, a->me);
    /* What it asked rolls over; back from idle, it restarts at V. */
    uint64_t e_ep = fld(me, F_EPOCH);
    if (e_ep != a->ep) {
        bool was = e_ep != 0 && e_ep + 1 >= a->ep;
        rate__fair_flow_t fl = flow_of(me);
        rate__fair_roll(&fl, e_ep, a->ep);
        set(me, F_PREV, fl.prev);
        set(me, F_CUR, fl.cur);
        if (!was && fld(me, F_S) < v)
            set(me, F_S, v);
        set(me, F_LSUM, fl.lsum);
        set(me, F_SINCE, fl.since);
        set(me, F_EPOCH, a->ep);
    }
    uint64_t cur = fld(me, F_CUR) + a->permits;
    set(me, F_CUR, cur > RATE__FAIR_ASKED_MAX ? RATE__FAIR_ASKED_MAX : cur);
    set(me, F_LSUM, rate__fair_long_add(fld(me, F_LSUM), a->permits));
    /* V: the least service of the active entries, never decreasing. */
    uint64_t least = UINT64_MAX, w = 0;
    for (uint64_t i = 0; i < slots; i++) {
        const uint8_t *e = ent(t, i);
        if (!active(e, a->ep))
            continue;
        w += fld(e, F_WEIGHT);
        if (fld(e, F_S) < least)
            least = fld(e, F_S);
    }
    if (least != UINT64_MAX && least > v)
        v = least;
    put(t + 16, v);
    a->vtime = v;
    a->total_w = w;
    /* The light flows' estimator: the request counted, a light one's
     * permits added to the backlog, a heavy one's earlier ones taken
     * back (rate__fair_light_note, as decide.c's light_count). */
    rate__fair_light_t l = light_of(t);
    rate__fair_flow_t fl = flow_of(me);
    uint64_t gave = fld(me, F_GAVE);
    a->light = rate__fair_light_note(&l, &a->shape, a->now_us, a->permits,
                                     &fl, fl.cur > fl.prev ? fl.cur : fl.prev,
                                     age(me, a->ep), fld(me, F_WEIGHT), w,
                                     a->cap, &gave);
    set(me, F_GAVE, gave);
    light_put(t, &l);
}

uint64_t rate__fair_reserve(const rate__fair_step_t *a, const uint8_t *t)
{
    if (a->light)
        return 0;
    const uint8_t *me = ent((uint8_t *)t, a->me);
    uint64_t my_s = fld(me, F_S), slots = get(t + 8), terms = 0;
    for (uint64_t i = 0; my_s > a->vtime && a->total_w > 0 && i < slots; i++) {
        const uint8_t *e = ent((uint8_t *)t, i);
        uint64_t s = fld(e, F_S), w = fld(e, F_WEIGHT);
        if (i == a->me || !active(e, a->ep) || s >= my_s)
            continue;
        rate__fair_flow_t fl = flow_of(e);
        /* each below 2^50, the sum saturates at 2^52 */
        terms += rate__fair_owed(&a->shape, a->now_us, a->cap, &fl,
                                 fl.cur > fl.prev ? fl.cur : fl.prev,
                                 age(e, a->ep), w, a->total_w, my_s - s);
        if (terms > RATE__FAIR_NEED_MAX)
            terms = RATE__FAIR_NEED_MAX;
    }
    rate__fair_light_t l = light_of(t);
    return rate__fair_need(&l, &a->shape, a->now_us, a->cap, terms);
}

void rate__fair_charge(rate__fair_step_t *a, uint8_t *t)
{
    uint8_t *me = ent(t, a->me);
    uint64_t w = fld(me, F_WEIGHT), slots = get(t + 8);
    unsigned __int128 c =
        (((unsigned __int128)a->permits << RATE__FAIR_FIX) + w - 1) / w;
    uint64_t cost = c > RATE__FAIR_LEAD ? RATE__FAIR_LEAD : (uint64_t)c;
    uint64_t s = fld(me, F_S) + cost, top = a->vtime + RATE__FAIR_LEAD;
    set(me, F_S, s > top ? top : s);
    /* V follows the least active service. */
    uint64_t least = UINT64_MAX, v = a->vtime;
    for (uint64_t i = 0; i < slots; i++) {
        const uint8_t *e = ent(t, i);
        if (active(e, a->ep) && fld(e, F_S) < least)
            least = fld(e, F_S);
    }
    if (least != UINT64_MAX && least > v)
        v = least;
    if (v > RATE__FAIR_REBASE) { /* differences are all the rule reads */
        for (uint64_t i = 0; i < slots; i++) {
            uint8_t *e = ent(t, i);
            uint64_t es = fld(e, F_S);
            set(e, F_S, es > v ? es - v : 0);
        }
        v = 0;
    }
    put(t + 16, v);
    a->vtime = v;
}

uint64_t rate__fair_retry_ns(uint64_t missing, uint64_t period_ns,
                             uint64_t limit)
{
    double x = (double)missing * (double)period_ns /
               (double)(limit ? limit : 1);
    if (x >= 9223372036854775807.0) /* RATE_TIME_MAX */
        return UINT64_C(9223372036854775807);
    uint64_t r = (uint64_t)x; /* then up, as Lua's math.ceil */
    return (double)r < x ? r + 1 : r;
}
