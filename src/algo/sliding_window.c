/* SPDX-License-Identifier: MIT */
/*
 * Sliding window counter: two fixed windows, the previous one weighted by
 * how much of it still overlaps the sliding window.
 *
 * State: prev and curr (8 bytes each), the counts of windows k-1 and k where
 * k = t_last / W.  At e = t - k*W the estimate is prev*(W-e)/W + curr; it is
 * never formed: every comparison is scaled by W and done in 128 bits.
 */
#include "../kit.h"

#define SW_FIXED 16 /* bytes of stored state */

static void sw_load(const rate_limit_t *l, const uint8_t *st, rate__view_t *v)
{
    (void)l;
    *v = (rate__view_t){0};
    if (st != NULL) {
        v->x = rate__get64(st);
        v->y = rate__get64(st + 8);
    }
}

static void sw_advance(const rate_limit_t *l, rate__view_t *v, uint64_t last,
                       uint64_t t)
{
    uint64_t k = t / l->period_ns, ks = last / l->period_ns;

    if (k == ks + 1) {
        v->x = v->y;
        v->y = 0;
    } else if (k != ks) {
        v->x = 0;
        v->y = 0;
    }
}

/* prev * (W - e) + curr * W: the estimate scaled by W. */
static rate_u128_t sw_scaled(const rate_limit_t *l, uint64_t prev,
                             uint64_t curr, uint64_t e)
{
    return (rate_u128_t)prev * (l->period_ns - e) +
           (rate_u128_t)curr * l->period_ns;
}

static uint64_t sw_remaining(const rate_limit_t *l, uint64_t prev,
                             uint64_t curr, uint64_t e)
{
    rate_u128_t cap = (rate_u128_t)l->limit * l->period_ns;
    rate_u128_t used = sw_scaled(l, prev, curr, e);

    return used < cap ? rate__div64(cap - used, l->period_ns) : 0;
}

static uint64_t sw_reset(const rate_limit_t *l, uint64_t prev, uint64_t curr,
                         uint64_t e)
{
    if (curr > 0)
        return 2 * l->period_ns - e;
    return prev > 0 ? l->period_ns - e : 0;
}

/* Smallest d such that n passes at e + d.  Within this window the weight of
 * prev falls as e grows: prev*(W-e') <= (L-curr-n)*W holds from
 * e' = W - floor((L-curr-n)*W / prev).  Otherwise, in the next window prev
 * becomes curr and curr becomes 0, and the same reasoning gives e''. */
static uint64_t sw_retry(const rate_limit_t *l, uint64_t prev, uint64_t curr,
                         uint64_t e, uint64_t n)
{
    uint64_t w = l->period_ns;

    if (curr + n <= l->limit && prev > 0) {
        rate_u128_t room = (rate_u128_t)(l->limit - curr - n) * w;
        rate_u128_t q = room / prev;
        if (q > 0 && q <= w) {
            uint64_t e1 = w - (uint64_t)q;
            if (e1 > e)
                return e1 - e;
        } else if (q > w) {
            return 0; /* cannot happen for a denied request */
        }
    }
    uint64_t e2 = 0;
    if (curr > 0) {
        rate_u128_t q = (rate_u128_t)(l->limit - n) * w / curr;
        e2 = q >= w ? 0 : w - (uint64_t)q;
    }
    return (w - e) + e2;
}

static void sw_decide(const rate_limit_t *l, const rate__view_t *v, uint64_t t,
                      uint64_t n, uint64_t max_wait, bool detail,
                      rate__verdict_t *out)
{
    uint64_t prev = (uint64_t)v->x, curr = v->y;
    uint64_t e = t % l->period_ns;

    (void)max_wait;
    *out = (rate__verdict_t){0};
    if (n > l->limit) {
        out->reason = RATE_REASON_NEVER;
        out->retry_after_ns = RATE_NEVER;
    } else if (n == 0 || sw_scaled(l, prev, curr + n, e) <=
               (rate_u128_t)l->limit * l->period_ns) {
        out->allowed = true;
    } else {
        out->reason = RATE_REASON_LIMITED;
        out->retry_after_ns = sw_retry(l, prev, curr, e, n);
    }
    if (!detail)
        return;
    out->remaining_now = sw_remaining(l, prev, curr, e);
    out->reset_now_ns = sw_reset(l, prev, curr, e);
    if (out->allowed) {
        out->remaining_after = sw_remaining(l, prev, curr + n, e);
        out->reset_after_ns = sw_reset(l, prev, curr + n, e);
    }
}

static size_t sw_commit(const rate_limit_t *l, const rate__view_t *v,
                        uint64_t t, uint64_t n, uint8_t *out)
{
    (void)l;
    (void)t;
    rate__put64(out, (uint64_t)v->x);
    rate__put64(out + 8, v->y + n);
    return SW_FIXED;
}

static bool sw_is_cold(const rate_limit_t *l, const rate__view_t *v)
{
    (void)l;
    return v->x == 0 && v->y == 0;
}

/* Both counts carry over (windows of one length), each capped at the new
 * limit: a count at it denies as any count above it would, and an
 * admission may then write the previous count back, which a state is
 * checked to keep within the limit. */
static void sw_convert(const rate_limit_t *from, const rate_limit_t *to,
                       uint64_t t, rate__view_t *v)
{
    (void)from;
    (void)t;
    if ((uint64_t)v->x > to->limit)
        v->x = to->limit;
    if (v->y > to->limit)
        v->y = to->limit;
}

static uint64_t sw_max_reset(const rate_limit_t *l)
{
    return 2 * l->period_ns;
}

/* Written states count at most L in each window: an admission needs its
 * estimate, which is at least curr (and prev, on its window's first
 * nanosecond), plus n within L; prev was curr before. */
static bool sw_valid(const rate_limit_t *l, const uint8_t *st, uint64_t last)
{
    (void)last;
    return rate__get64(st) <= l->limit && rate__get64(st + 8) <= l->limit;
}

RATE__DEFINE_PLAIN(sw, SW_FIXED)

/* A refund uncounts its permits from the current window, then from the
 * previous one; a penalty counts them in the current one, up to the
 * limit. */
static uint64_t sw_adjust(const rate_limit_t *l, rate__view_t *v,
                          rate__op_t op, uint64_t n, uint64_t t)
{
    (void)t;
    if (op == RATE__OP_REFUND) {
        uint64_t from_curr = n < v->y ? n : v->y;
        v->y -= from_curr;
        n -= from_curr;
        v->x = v->x > n ? v->x - n : 0;
    } else {
        v->y = n > l->limit - v->y ? l->limit : v->y + n;
    }
    return 0;
}

/* Held: the weighted estimate at t, rounded up. */
static uint64_t sw_held(const rate_limit_t *l, const rate__view_t *v,
                        uint64_t t)
{
    return rate__ceil_div_sat(
        sw_scaled(l, (uint64_t)v->x, v->y, t % l->period_ns), l->period_ns);
}

/* Admitted since a, at most: curr, prev if a reaches its window, and
 * the limit of each window before that. */
static uint64_t sw_since(const rate_limit_t *l, const rate__view_t *v,
                         uint64_t last, uint64_t a)
{
    uint64_t before = last / l->period_ns - a / l->period_ns;
    rate_u128_t u = v->y;
    if (before > 0)
        u += (uint64_t)v->x + (rate_u128_t)(before - 1) * l->limit;
    return u > UINT64_MAX ? UINT64_MAX : (uint64_t)u;
}

/* Charged u permits: the window of t counts u, the one before nothing. */
static void sw_charge(const rate_limit_t *l, rate__view_t *v, uint64_t t,
                      uint64_t u)
{
    (void)l;
    (void)t;
    v->x = 0;
    v->y = u;
}

const rate__algo_t rate__sliding_window = {
    .name = "sliding-window",
    .fixed = SW_FIXED,
    .grow = 0,
    RATE__LUA_RANGE(50, 52),
    .load = sw_load,
    .advance = sw_advance,
    .decide = sw_decide,
    .commit = sw_commit,
    .is_cold = sw_is_cold,
    .convert = sw_convert,
    .max_reset = sw_max_reset,
    .valid = sw_valid,
    .adjust = sw_adjust,
    .held = sw_held,
    .since = sw_since,
    .charge = sw_charge,
    .plain = sw_plain,
};
