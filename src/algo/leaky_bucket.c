/* SPDX-License-Identifier: MIT */
/*
 * Leaky bucket: a queue that drains at exactly L per P.
 *
 * State: v = level * P (0 <= v <= C * P), plus t_last in the state header.
 * Over dt the level drains dt * L scaled units, never below zero.  With
 * max_wait 0 a request passes only into an empty bucket (strict spacing);
 * with max_wait > 0 up to C permits queue and each learns its departure
 * delay, level * P / L.
 *
 * Two layouts of the component, chosen by the limit alone:
 *
 *   narrow  C * P <= 2^62: v in one unsigned 64-bit word (8 bytes), with
 *           the plain pass (rate__leaky_bucket);
 *   wide    C * P > 2^62 (C up to 2^63-1, P up to 2^61, so C * P < 2^124):
 *           v as a signed 128-bit word, two little-endian u64 words, the
 *           low one first (16 bytes), no plain pass
 *           (rate__leaky_bucket_wide).
 *
 * Every function but load, commit and valid is shared: the view is 128
 * bits wide, so the layout never changes a decision.  A drain time beyond
 * 2^63-1 ns (a wide bucket at 1 per ns) is reported as RATE_TIME_MAX.
 */
#include "../kit.h"

#define LB_FIXED 8   /* bytes of stored state, narrow */
#define LBW_FIXED 16 /* wide */

static rate_i128_t lb_cap(const rate_limit_t *l)
{
    return (rate_i128_t)l->burst * l->period_ns;
}

/* The narrow layout's load (the plain pass's). */
static void lb_load(const rate_limit_t *l, const uint8_t *st, rate__view_t *v)
{
    (void)l;
    *v = (rate__view_t){0};
    if (st != NULL)
        v->x = rate__get64(st);
}

/* Either layout, by the limit's (a carried-over state is loaded with the
 * limit it was written under). */
static void lb_load_any(const rate_limit_t *l, const uint8_t *st,
                        rate__view_t *v)
{
    *v = (rate__view_t){0};
    if (st != NULL)
        v->x = rate__bucket_wide(l) ? rate__get128(st)
                                    : (rate_i128_t)rate__get64(st);
}

/* dt * L < 2^126 and v < 2^124: the difference fits. */
static void lb_advance(const rate_limit_t *l, rate__view_t *v, uint64_t last,
                       uint64_t t)
{
    v->x -= (rate_i128_t)(t - last) * l->limit;
    if (v->x < 0)
        v->x = 0;
}

static uint64_t lb_remaining(const rate_limit_t *l, rate_i128_t level)
{
    rate_i128_t room = lb_cap(l) - level;

    return room > 0 ? rate__div64((rate_u128_t)room, l->period_ns) : 0;
}

static uint64_t lb_drain_time(const rate_limit_t *l, rate_i128_t level)
{
    return rate__ceil_div_sat((rate_u128_t)level, l->limit);
}

static void lb_decide(const rate_limit_t *l, const rate__view_t *v, uint64_t t,
                      uint64_t n, uint64_t max_wait, bool detail,
                      rate__verdict_t *out)
{
    rate_i128_t level = v->x;
    rate_i128_t need = (rate_i128_t)n * l->period_ns; /* < 2^126 */
    rate_i128_t cap = lb_cap(l);

    (void)t;
    *out = (rate__verdict_t){0};
    if (n > l->burst) {
        out->reason = RATE_REASON_NEVER;
        out->retry_after_ns = RATE_NEVER;
    } else if (n == 0) {
        out->allowed = true;
    } else if (level + need <= cap &&
               (rate_u128_t)level <= (rate_u128_t)max_wait * l->limit) {
        out->allowed = true;
        out->delay_ns = lb_drain_time(l, level);
    } else {
        /* With max_wait 0 it passes once the bucket is empty (n <= C). */
        out->reason = RATE_REASON_LIMITED;
        out->retry_after_ns = lb_drain_time(l, level);
    }
    if (!detail)
        return;
    out->remaining_now = lb_remaining(l, level);
    out->reset_now_ns = lb_drain_time(l, level);
    if (out->allowed) {
        out->remaining_after = lb_remaining(l, level + need);
        out->reset_after_ns = lb_drain_time(l, level + need);
    }
}

static size_t lb_commit(const rate_limit_t *l, const rate__view_t *v,
                        uint64_t t, uint64_t n, uint8_t *out)
{
    (void)t;
    rate__put64(out, (uint64_t)(v->x + (rate_i128_t)n * l->period_ns));
    return LB_FIXED;
}

static size_t lbw_commit(const rate_limit_t *l, const rate__view_t *v,
                         uint64_t t, uint64_t n, uint8_t *out)
{
    (void)t;
    rate__put128(out, v->x + (rate_i128_t)n * l->period_ns);
    return LBW_FIXED;
}

static bool lb_is_cold(const rate_limit_t *l, const rate__view_t *v)
{
    (void)l;
    return v->x == 0;
}

/* The level keeps its number of permits across a policy change: v * P'/P,
 * rounded up, capped at the new capacity.  Formed as q * P' +
 * ceil(r * P' / P) with v = q * P + r, so that no product passes 2^126. */
static void lb_convert(const rate_limit_t *from, const rate_limit_t *to,
                       uint64_t t, rate__view_t *v)
{
    rate_u128_t x = (rate_u128_t)v->x, p = from->period_ns;
    rate_u128_t q = x / p, r = x % p;
    rate_i128_t cap = lb_cap(to);

    (void)t;
    if (q >= to->burst) {
        v->x = cap;
        return;
    }
    v->x = (rate_i128_t)(q * to->period_ns +
                         rate__ceil_div(r * to->period_ns, from->period_ns));
    if (v->x > cap)
        v->x = cap;
}

static uint64_t lb_max_reset(const rate_limit_t *l)
{
    return rate__ceil_div_sat((rate_u128_t)l->burst * l->period_ns, l->limit);
}

/* Written states hold at most C * P: an admission needs level + n <= C. */
static bool lb_valid(const rate_limit_t *l, const uint8_t *st, uint64_t last)
{
    (void)last;
    return (rate_u128_t)rate__get64(st) <= (rate_u128_t)l->burst * l->period_ns;
}

static bool lbw_valid(const rate_limit_t *l, const uint8_t *st, uint64_t last)
{
    rate_i128_t v = rate__get128(st);

    (void)last;
    return v >= 0 && v <= lb_cap(l);
}

RATE__DEFINE_PLAIN(lb, LB_FIXED)

/* A refund drains its permits from the bucket; a penalty pours them in, up
 * to the capacity. */
static uint64_t lb_adjust(const rate_limit_t *l, rate__view_t *v,
                          rate__op_t op, uint64_t n, uint64_t t)
{
    rate_i128_t amount = (rate_i128_t)n * l->period_ns;
    rate_i128_t full = (rate_i128_t)l->burst * l->period_ns;

    (void)t;
    if (op == RATE__OP_REFUND)
        v->x = v->x > amount ? v->x - amount : 0;
    else
        v->x = v->x + amount > full ? full : v->x + amount;
    return 0;
}

/* Held: the level, rounded up. */
static uint64_t lb_held(const rate_limit_t *l, const rate__view_t *v,
                        uint64_t t)
{
    (void)t;
    return rate__ceil_div_sat((rate_u128_t)v->x, l->period_ns);
}

/* Admitted since a, at most: the level at last plus the drain since a
 * (the bucket was at least empty at a). */
static uint64_t lb_since(const rate_limit_t *l, const rate__view_t *v,
                         uint64_t last, uint64_t a)
{
    return rate__sat_add(lb_held(l, v, last),
                         rate__ceil_div_sat((rate_u128_t)(last - a) * l->limit,
                                            l->period_ns));
}

/* Charged u permits: a level of u (u * P < 2^125), above the capacity if
 * u is: it then drains before anything passes. */
static void lb_charge(const rate_limit_t *l, rate__view_t *v, uint64_t t,
                      uint64_t u)
{
    (void)t;
    v->x = (rate_i128_t)u * l->period_ns;
}

const rate__algo_t rate__leaky_bucket = {
    .name = "leaky-bucket",
    .fixed = LB_FIXED,
    .grow = 0,
    RATE__LUA_RANGE(50, 51),
    .load = lb_load_any,
    .advance = lb_advance,
    .decide = lb_decide,
    .commit = lb_commit,
    .is_cold = lb_is_cold,
    .convert = lb_convert,
    .max_reset = lb_max_reset,
    .valid = lb_valid,
    .adjust = lb_adjust,
    .held = lb_held,
    .since = lb_since,
    .charge = lb_charge,
    .plain = lb_plain,
};

const rate__algo_t rate__leaky_bucket_wide = {
    .name = "leaky-bucket",
    .fixed = LBW_FIXED,
    .grow = 0,
    RATE__LUA_RANGE(50, 51),
    .load = lb_load_any,
    .advance = lb_advance,
    .decide = lb_decide,
    .commit = lbw_commit,
    .is_cold = lb_is_cold,
    .convert = lb_convert,
    .max_reset = lb_max_reset,
    .valid = lbw_valid,
    .adjust = lb_adjust,
    .held = lb_held,
    .since = lb_since,
    .charge = lb_charge,
    .plain = NULL,
};
