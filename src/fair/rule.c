/* SPDX-License-Identifier: MIT */
/*
 * The fair rule's arithmetic (rule.h; docs/fair.md, "The rule"), for the
 * process's table and the fleet's.  Products that could pass 2^64 are
 * taken in 128 bits; what the fleet's table stores saturates below 2^53,
 * and fair_rule.lua computes each number the same way over doubles.
 */
#include "rule.h"

#include "ratelimit.h"

typedef unsigned __int128 u128;

static uint64_t sat(u128 x)
{
    return x > RATE__FAIR_LIGHT_MAX ? RATE__FAIR_LIGHT_MAX : (uint64_t)x;
}

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return a / b + (a % b != 0);
}

rate__fair_shape_t rate__fair_shape_of(int algorithm, uint64_t limit,
                                       uint64_t period_ns)
{
    rate__fair_shape_t sh = {.limit = limit ? limit : 1,
                             .period_us = ceil_div(period_ns, 1000),
                             .kind = RATE__FAIR_BUCKET};
    if (sh.period_us == 0)
        sh.period_us = 1;
    if (algorithm == RATE_FIXED_WINDOW)
        sh.kind = RATE__FAIR_FIXED;
    else if (algorithm == RATE_SLIDING_WINDOW)
        sh.kind = RATE__FAIR_COUNTER;
    else if (algorithm == RATE_SLIDING_LOG)
        sh.kind = RATE__FAIR_LOG;
    else if (algorithm == RATE_LEAKY_BUCKET)
        sh.kind = RATE__FAIR_PACER;
    return sh;
}

uint64_t rate__fair_long_add(uint64_t sum, uint64_t permits)
{
    return sat((u128)sum + permits);
}

uint64_t rate__fair_long_decay(uint64_t sum, uint64_t periods)
{
    for (uint64_t i = 0; i < periods && sum > 0; i++) {
        if (i == 64)
            return 0; /* (7/8)^64 of anything kept is below a permit */
        sum -= sum / 8 + (sum < 8);
    }
    return sum;
}

/* What k periods of the same demand sum to in a long demand, in 2^20ths
 * of 8 periods' worth: 2^20 - r_k, r_0 = 2^20, r_k+1 = r_k - r_k / 8
 * (about 1 - (7/8)^k; the Lua twin holds the same table). */
static const uint32_t long_part[65] = {
    0, 131072, 245760, 346112, 433920, 510752, 577980, 636804,
    688275, 733312, 772720, 807202, 837373, 863773, 886873, 907085,
    924771, 940246, 953787, 965635, 976002, 985073, 993010, 999955,
    1006032, 1011350, 1016003, 1020074, 1023636, 1026753, 1029480, 1031867,
    1033955, 1035782, 1037381, 1038780, 1040004, 1041075, 1042012, 1042832,
    1043550, 1044178, 1044727, 1045208, 1045629, 1045997, 1046319, 1046601,
    1046847, 1047063, 1047252, 1047417, 1047561, 1047687, 1047798, 1047895,
    1047980, 1048054, 1048119, 1048176, 1048226, 1048269, 1048307, 1048340,
    1048369,
};

bool rate__fair_is_light(const rate__fair_shape_t *sh, uint64_t asked,
                         uint64_t long_sum, uint64_t age, uint64_t w,
                         uint64_t total_w, uint64_t cap)
{
    if (total_w == 0)
        return true;
    u128 share = (u128)sh->limit * w / total_w;
    if (asked <= share + 1)
        return true;
    if (age < 3 || asked > (cap ? cap : sh->limit) / 2)
        return false;
    /* long_sum <= 8 (share + 1) x part(age) / 2^20, the product split as
     * the Lua twin splits it */
    uint64_t a = (uint64_t)(8 * (share + 1)), b = long_part[age > 64 ? 64 : age];
    uint64_t q = a >> 20, r = a & ((UINT64_C(1) << 20) - 1);
    return long_sum <= q * b + ((r * b) >> 20);
}

/* The backlog drained to now (the shared rate: L permits a period, so
 * dt x L in the scaled units); a fixed window's restarts each window. */
static void drain(rate__fair_light_t *l, const rate__fair_shape_t *sh,
                  uint64_t now_us)
{
    if (now_us <= l->t_us)
        return; /* the same instant, or a clock gone back: as it was */
    if (sh->kind == RATE__FAIR_FIXED) {
        if (now_us / sh->period_us != l->t_us / sh->period_us)
            l->q = 0;
    } else {
        u128 d = (u128)(now_us - l->t_us) * sh->limit;
        l->q = d >= l->q ? 0 : l->q - (uint64_t)d;
    }
    l->t_us = now_us;
}

void rate__fair_light_count(rate__fair_light_t *l,
                            const rate__fair_shape_t *sh, uint64_t now_us,
                            uint64_t permits)
{
    drain(l, sh, now_us);
    uint64_t ep = l->t_us / sh->period_us + 1;
    uint64_t b = (ep - 1) / RATE__FAIR_LIGHT_SPAN + 1;
    if (b > l->bucket) { /* the buckets passed since are empty */
        for (uint64_t k = l->bucket + 1; k <= b && k <= l->bucket + 4; k++)
            l->peak[k % 4] = 0;
        l->bucket = b;
    }
    if (ep > l->ep) {
        l->a_prev = ep == l->ep + 1 ? l->a_cur : 0;
        l->a_cur = 0;
        l->ep = ep;
    }
    l->a_cur = sat((u128)l->a_cur + permits);
}

void rate__fair_light_add(rate__fair_light_t *l, const rate__fair_shape_t *sh,
                          uint64_t permits)
{
    l->q = sat((u128)l->q + (u128)permits * sh->period_us);
    uint64_t *pk = &l->peak[l->bucket % 4];
    if (l->q > *pk)
        *pk = l->q;
}

void rate__fair_light_take_back(rate__fair_light_t *l,
                                const rate__fair_shape_t *sh,
                                uint64_t permits)
{
    uint64_t x = sat((u128)permits * sh->period_us);
    uint64_t *pk = &l->peak[l->bucket % 4];
    l->q = l->q > x ? l->q - x : 0;
    *pk = *pk > x ? *pk - x : 0;
    if (*pk < l->q)
        *pk = l->q;
}

uint64_t rate__fair_age(uint64_t since, uint64_t ep)
{
    return since != 0 && ep >= since ? ep - since + 1 : 0;
}

uint64_t rate__fair_light_request(rate__fair_light_t *l,
                                  const rate__fair_shape_t *sh, bool light,
                                  uint64_t permits, uint64_t gave,
                                  uint64_t asked)
{
    if (light) {
        rate__fair_light_add(l, sh, permits);
        return sat((u128)gave + permits);
    }
    if (gave > 0)
        rate__fair_light_take_back(l, sh, gave < asked ? gave : asked);
    return 0;
}

void rate__fair_roll(rate__fair_flow_t *fl, uint64_t last, uint64_t ep)
{
    fl->prev = last + 1 == ep ? fl->cur : 0;
    fl->cur = 0;
    fl->lsum = last == 0 || ep < last ? 0
                                      : rate__fair_long_decay(fl->lsum,
                                                              ep - last);
    if (fl->since == 0 || ep < fl->since)
        fl->since = ep;
}

bool rate__fair_light_note(rate__fair_light_t *l, const rate__fair_shape_t *sh,
                           uint64_t now_us, uint64_t permits,
                           const rate__fair_flow_t *fl, uint64_t asked,
                           uint64_t age, uint64_t w, uint64_t total_w,
                           uint64_t cap, uint64_t *gave)
{
    rate__fair_light_count(l, sh, now_us, permits);
    bool light = rate__fair_is_light(sh, asked, fl->lsum, age, w, total_w,
                                     cap);
    *gave = rate__fair_light_request(l, sh, light, permits, *gave,
                                     fl->cur + fl->prev);
    return light;
}

uint64_t rate__fair_owed(const rate__fair_shape_t *sh, uint64_t now_us,
                         uint64_t cap, const rate__fair_flow_t *fl,
                         uint64_t asked, uint64_t age, uint64_t w,
                         uint64_t total_w, uint64_t behind)
{
    if (rate__fair_is_light(sh, asked, fl->lsum, age, w, total_w, cap))
        return 0;
    return rate__fair_term(sh, now_us, cap, w, total_w, behind, asked);
}

uint64_t rate__fair_term(const rate__fair_shape_t *sh, uint64_t now_us,
                         uint64_t cap, uint64_t w, uint64_t total_w,
                         uint64_t behind, uint64_t asked)
{
    u128 share = (u128)cap * w / total_w;
    u128 catch_up = ((u128)behind * w + ((UINT64_C(1) << 20) - 1)) >> 20;
    uint64_t term = asked;
    if (share < term)
        term = (uint64_t)share;
    if (catch_up < term)
        term = (uint64_t)catch_up;
    if (sh->kind == RATE__FAIR_FIXED) {
        /* At most what it asks in the rest of the window, at the pace it
         * asked lately, the rest in 64ths: room held for a flow that will
         * not come before the window ends is lost with it. */
        uint64_t sixty4th = sh->period_us / 64 ? sh->period_us / 64 : 1;
        uint64_t f = (sh->period_us - now_us % sh->period_us) / sixty4th;
        f = f > 63 ? 64 : f + 1;
        uint64_t most = asked / 64 * f + ceil_div(asked % 64 * f, 64);
        return term < most ? term : most;
    }
    if (sh->kind == RATE__FAIR_BUCKET || sh->kind == RATE__FAIR_PACER)
        return term;
    /* In 1/L permits: at most what it asks in one permit's time. */
    u128 scaled = (u128)term * sh->limit;
    return scaled < asked ? (uint64_t)scaled : asked;
}

/* The light reserve before shaping: the peak backlog plus an eighth of
 * the capacity, less the backlog now (what the light flows hold of the
 * room already), in permits, rounded up. */
static uint64_t light_part(const rate__fair_light_t *l,
                           const rate__fair_shape_t *sh, uint64_t cap)
{
    uint64_t pk = 0, r;
    if (sh->kind == RATE__FAIR_PACER)
        return 0;
    /* A log's room held costs its rate: none kept for strangers. */
    uint64_t eighth = sh->kind == RATE__FAIR_LOG ? 0 : cap / 8;
    for (int i = 0; i < 4; i++)
        if (l->peak[i] > pk)
            pk = l->peak[i];
    if (pk >= l->q) {
        r = eighth + ceil_div(pk - l->q, sh->period_us);
    } else {
        uint64_t held = (l->q - pk) / sh->period_us;
        r = eighth > held ? eighth - held : 0;
    }
    if (sh->kind == RATE__FAIR_LOG && r > sh->limit / 50)
        r = sh->limit / 50;
    return r > cap ? cap : r;
}

uint64_t rate__fair_light_bound(const rate__fair_light_t *l,
                                const rate__fair_shape_t *sh, uint64_t cap)
{
    rate__fair_light_t z = *l;
    z.q = 0;
    return light_part(&z, sh, cap);
}

/* Whether now_us is in the last slice of a window, where a window's
 * light room is given back: a slice long enough for the table's asks
 * (its last period's) to take that room four times over,
 * P / (A / 4 light), from P/256 to P/2. */
static bool window_end(const rate__fair_light_t *l,
                       const rate__fair_shape_t *sh, uint64_t now_us,
                       uint64_t light)
{
    uint64_t asks = l->a_prev > l->a_cur ? l->a_prev : l->a_cur;
    uint64_t k = asks / (4 * light);
    uint64_t slice = sh->period_us / (k ? k : 1);
    if (slice < sh->period_us / 256)
        slice = sh->period_us / 256;
    if (slice > sh->period_us / 2)
        slice = sh->period_us / 2;
    return sh->period_us - now_us % sh->period_us <= slice;
}

uint64_t rate__fair_need(const rate__fair_light_t *l,
                         const rate__fair_shape_t *sh, uint64_t now_us,
                         uint64_t cap, uint64_t terms)
{
    if (cap == 0)
        return 0;
    uint64_t light = light_part(l, sh, cap);
    if ((sh->kind == RATE__FAIR_FIXED || sh->kind == RATE__FAIR_COUNTER) &&
        light > 0 && window_end(l, sh, now_us, light))
        light = 0;
    if (sh->kind == RATE__FAIR_LOG || sh->kind == RATE__FAIR_COUNTER)
        terms = ceil_div(terms, sh->limit);
    u128 need = (u128)light + terms;
    return need > cap - 1 ? cap - 1 : (uint64_t)need;
}
