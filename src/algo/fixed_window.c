/* SPDX-License-Identifier: MIT */
/*
 * Fixed window: windows aligned to the clock's zero, k = floor(t / W).
 *
 * State: the count admitted in the window of t_last (8 bytes); the window's
 * index is t_last / W, so it is not stored.  A later request in another
 * window starts from zero.
 */
#include "../kit.h"

#define FW_FIXED 8 /* bytes of stored state */

static void fw_load(const rate_limit_t *l, const uint8_t *st, rate__view_t *v)
{
    (void)l;
    *v = (rate__view_t){0};
    if (st != NULL)
        v->x = rate__get64(st);
}

static void fw_advance(const rate_limit_t *l, rate__view_t *v, uint64_t last,
                       uint64_t t)
{
    if (last / l->period_ns != t / l->period_ns)
        v->x = 0;
}

/* Nanoseconds from t to the start of the next window. */
static uint64_t fw_to_next(const rate_limit_t *l, uint64_t t)
{
    return l->period_ns - t % l->period_ns;
}

static void fw_decide(const rate_limit_t *l, const rate__view_t *v, uint64_t t,
                      uint64_t n, uint64_t max_wait, bool detail,
                      rate__verdict_t *out)
{
    uint64_t count = (uint64_t)v->x;

    (void)max_wait;
    *out = (rate__verdict_t){0};
    if (n > l->limit) {
        out->reason = RATE_REASON_NEVER;
        out->retry_after_ns = RATE_NEVER;
    } else if (n == 0 || count + n <= l->limit) {
        out->allowed = true;
    } else {
        out->reason = RATE_REASON_LIMITED;
        out->retry_after_ns = fw_to_next(l, t);
    }
    if (!detail)
        return;
    out->remaining_now = count < l->limit ? l->limit - count : 0;
    out->reset_now_ns = count > 0 ? fw_to_next(l, t) : 0;
    if (out->allowed) {
        out->remaining_after = count + n < l->limit ? l->limit - count - n : 0;
        out->reset_after_ns = count + n > 0 ? fw_to_next(l, t) : 0;
    }
}

static size_t fw_commit(const rate_limit_t *l, const rate__view_t *v,
                        uint64_t t, uint64_t n, uint8_t *out)
{
    (void)l;
    (void)t;
    rate__put64(out, (uint64_t)v->x + n);
    return FW_FIXED;
}

static bool fw_is_cold(const rate_limit_t *l, const rate__view_t *v)
{
    (void)l;
    return v->x == 0;
}

/* The count admitted in t_last's window carries over as it is, into the
 * new window that holds t_last (a lower limit simply leaves less room). */
static void fw_convert(const rate_limit_t *from, const rate_limit_t *to,
                       uint64_t t, rate__view_t *v)
{
    (void)from;
    (void)to;
    (void)t;
    (void)v;
}

static uint64_t fw_max_reset(const rate_limit_t *l)
{
    return l->period_ns;
}

/* Written states count at most L: an admission needs count + n <= L. */
static bool fw_valid(const rate_limit_t *l, const uint8_t *st, uint64_t last)
{
    (void)last;
    return rate__get64(st) <= l->limit;
}

RATE__DEFINE_PLAIN(fw, FW_FIXED)

/* A refund uncounts its permits from the current window (none once it has
 * rolled: they were counted in a window that no longer matters); a
 * penalty counts them, up to the limit. */
static uint64_t fw_adjust(const rate_limit_t *l, rate__view_t *v,
                          rate__op_t op, uint64_t n, uint64_t t)
{
    (void)t;
    if (op == RATE__OP_REFUND)
        v->x = v->x > n ? v->x - n : 0;
    else
        v->x = v->x + n > l->limit ? l->limit : v->x + n;
    return 0;
}

/* Held: the count, if t is in its window (advance has zeroed it else). */
static uint64_t fw_held(const rate_limit_t *l, const rate__view_t *v,
                        uint64_t t)
{
    (void)l;
    (void)t;
    return (uint64_t)v->x;
}

/* Admitted since a, at most: the count of last's window plus the limit
 * of each window before it that a reaches. */
static uint64_t fw_since(const rate_limit_t *l, const rate__view_t *v,
                         uint64_t last, uint64_t a)
{
    uint64_t before = last / l->period_ns - a / l->period_ns;
    rate_u128_t u = (rate_u128_t)before * l->limit + (uint64_t)v->x;
    return u > UINT64_MAX ? UINT64_MAX : (uint64_t)u;
}

/* Charged u permits: the window of t counts u. */
static void fw_charge(const rate_limit_t *l, rate__view_t *v, uint64_t t,
                      uint64_t u)
{
    (void)l;
    (void)t;
    v->x = u;
}

const rate__algo_t rate__fixed_window = {
    .name = "fixed-window",
    .fixed = FW_FIXED,
    .grow = 0,
    RATE__LUA_RANGE(50, 52),
    .load = fw_load,
    .advance = fw_advance,
    .decide = fw_decide,
    .commit = fw_commit,
    .is_cold = fw_is_cold,
    .convert = fw_convert,
    .max_reset = fw_max_reset,
    .valid = fw_valid,
    .adjust = fw_adjust,
    .held = fw_held,
    .since = fw_since,
    .charge = fw_charge,
    .plain = fw_plain,
};
