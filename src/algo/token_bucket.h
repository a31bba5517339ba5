/* SPDX-License-Identifier: MIT */
/*
 * The token bucket's hot functions: one body over a 128-bit view, for
 * both layouts (token_bucket.c has the rest of the algorithm, its two
 * tables and the wide layout's load, commit and check).  They are here,
 * inline, so that rate_state_acquire (src/step.c) can take the narrow
 * layout's plain pass into the stores' hot path: one source.
 */
#ifndef RATE_TOKEN_BUCKET_H
#define RATE_TOKEN_BUCKET_H

#include "../kit.h"

#define TB_FIXED 8 /* bytes of stored state, narrow: u */

/* The full bucket, B * P (< 2^124). */
static inline rate_i128_t tb_full(const rate_limit_t *l)
{
    return (rate_i128_t)l->burst * l->period_ns;
}

/* ceil(a / b), saturated at RATE_TIME_MAX, in one 64-bit division when a
 * fits 64 bits (a narrow bucket's durations always do). */
static inline uint64_t tb_time(rate_u128_t a, uint64_t b)
{
    if (a >> 64 == 0) {
        uint64_t x = (uint64_t)a, q = x / b + (x % b != 0);
        return q > RATE_TIME_MAX ? RATE_TIME_MAX : q;
    }
    return rate__ceil_div_sat(a, b);
}

/* The narrow layout's load (the plain pass's). */
static RATE__ALWAYS_INLINE void tb_load(const rate_limit_t *l, const uint8_t *st,
                           rate__view_t *v)
{
    *v = (rate__view_t){0};
    v->x = st != NULL ? (rate_i128_t)(int64_t)rate__get64(st) : tb_full(l);
}

/* u after a refill over dt ns: u + dt * L (< 2^127), capped at B * P.  A
 * full or over-full bucket (a corrupt store's) stays as it is. */
static RATE__ALWAYS_INLINE void tb_advance(const rate_limit_t *l,
                                           rate__view_t *v, uint64_t last,
                                           uint64_t t)
{
    rate_i128_t room = tb_full(l) - v->x;

    if (room > 0) {
        rate_u128_t add = (rate_u128_t)(t - last) * l->limit;
        v->x += add < (rate_u128_t)room ? (rate_i128_t)add : room;
    }
}

static inline uint64_t tb_remaining(const rate_limit_t *l, rate_i128_t u)
{
    return u > 0 ? rate__div64((rate_u128_t)u, l->period_ns) : 0; /* <= B */
}

static inline uint64_t tb_reset(const rate_limit_t *l, rate_i128_t u)
{
    rate_i128_t missing = tb_full(l) - u;

    return missing > 0 ? tb_time((rate_u128_t)missing, l->limit) : 0;
}

/* The decision, for either layout: u in [-2^62, B * P], n * P <= B * P
 * once n <= B.  The layout never changes it.  Always inlined (as load,
 * advance, commit and valid are), so that the plain pass's constants
 * prune it wherever it is taken. */
static RATE__ALWAYS_INLINE void tb_decide(const rate_limit_t *l, const rate__view_t *v,
                             uint64_t t, uint64_t n, uint64_t max_wait,
                             bool detail, rate__verdict_t *out)
{
    rate_i128_t u = v->x, need = 0;

    (void)t;
    *out = (rate__verdict_t){0};
    if (n > l->burst) {
        out->reason = RATE_REASON_NEVER;
        out->retry_after_ns = RATE_NEVER;
    } else {
        need = (rate_i128_t)n * l->period_ns;
        if (n == 0 || need <= u) {
            out->allowed = true;
        } else if (max_wait > 0 && u - need >= -RATE__DEBT_MAX &&
                   (rate_u128_t)(need - u) <=
                       (rate_u128_t)max_wait * l->limit) {
            out->allowed = true;
            out->delay_ns = tb_time((rate_u128_t)(need - u), l->limit);
        } else {
            out->reason = RATE_REASON_LIMITED;
            out->retry_after_ns = tb_time((rate_u128_t)(need - u), l->limit);
        }
    }
    if (!detail)
        return;
    out->remaining_now = tb_remaining(l, u);
    out->reset_now_ns = tb_reset(l, u);
    if (out->allowed) {
        out->remaining_after = tb_remaining(l, u - need);
        out->reset_after_ns = tb_reset(l, u - need);
    }
}

/* Admitted: n <= B, and a reservation stays above -2^62. */
static RATE__ALWAYS_INLINE size_t tb_commit(const rate_limit_t *l, const rate__view_t *v,
                               uint64_t t, uint64_t n, uint8_t *out)
{
    (void)t;
    rate__put64(out, (uint64_t)(int64_t)(v->x - (rate_i128_t)n * l->period_ns));
    return TB_FIXED;
}

/* Written states hold at most B * P, and a debt of at most 2^62. */
static RATE__ALWAYS_INLINE bool tb_valid(const rate_limit_t *l,
                                         const uint8_t *st, uint64_t last)
{
    int64_t u = (int64_t)rate__get64(st);

    (void)last;
    return u <= (int64_t)(l->burst * l->period_ns) && u >= -RATE__DEBT_MAX;
}

RATE__DEFINE_PLAIN_INLINE(tb, TB_FIXED)

#endif /* RATE_TOKEN_BUCKET_H */
