/* SPDX-License-Identifier: MIT */
/*
 * The token bucket's step functions over its stored word u = tokens * P
 * (token_bucket.c has the rest of the algorithm and its table).  They are
 * here, inline, so that rate_state_acquire (src/step.c) can take the
 * token bucket's plain pass into the stores' hot path: one source.
 */
#ifndef RATE_TOKEN_BUCKET_H
#define RATE_TOKEN_BUCKET_H

#include "../kit.h"

/* u after a refill over dt ns: u + dt * L, capped at B * P.  A full or
 * over-full bucket (a corrupt store's) stays as it is.  The difference is
 * taken unsigned, where it fits whatever u is (-2^62 <= u <= 2^62). */
static inline int64_t rate__tb_refill(const rate_limit_t *l, int64_t u,
                                      uint64_t dt)
{
    int64_t full = (int64_t)(l->burst * l->period_ns);
    uint64_t add;

    if (u >= full)
        return u;
    if (__builtin_mul_overflow(dt, l->limit, &add) ||
        add >= (uint64_t)full - (uint64_t)u)
        return full;
    return u + (int64_t)add;
}

/* Whether n permits are admitted now, without a reservation: n <= B, and
 * zero permits or the tokens for them (n * P <= B * P fits). */
static inline bool rate__tb_takes(const rate_limit_t *l, int64_t u,
                                  uint64_t n)
{
    return n <= l->burst &&
           (n == 0 || (int64_t)(n * l->period_ns) <= u);
}

#define TB_FIXED 8 /* bytes of stored state: u */

static inline void tb_load(const rate_limit_t *l, const uint8_t *st, rate__view_t *v)
{
    *v = (rate__view_t){0};
    v->x = st != NULL ? (int64_t)rate__get64(st)
                      : (rate_i128_t)(l->burst * l->period_ns);
}

/* The view of a token bucket always fits 64 bits (-2^62 <= u <= B * P <=
 * 2^62, or whatever a corrupt store gave), so the hot functions work in
 * 64-bit words (token_bucket.h); differences are taken unsigned, where
 * they fit whatever u is.  Only a reservation's bound needs 128 bits. */
static inline void tb_advance(const rate_limit_t *l, rate__view_t *v, uint64_t last,
                       uint64_t t)
{
    v->x = rate__tb_refill(l, (int64_t)v->x, t - last);
}

static inline uint64_t tb_remaining(const rate_limit_t *l, rate_i128_t u)
{
    return u > 0 ? rate__div64((rate_u128_t)u, l->period_ns) : 0;
}

static inline uint64_t tb_reset(const rate_limit_t *l, rate_i128_t u)
{
    rate_i128_t missing = (rate_i128_t)(l->burst * l->period_ns) - u;

    return missing > 0 ? rate__ceil_div64((rate_u128_t)missing, l->limit) : 0;
}

static inline void tb_decide(const rate_limit_t *l, const rate__view_t *v, uint64_t t,
                      uint64_t n, uint64_t max_wait, bool detail,
                      rate__verdict_t *out)
{
    int64_t u = (int64_t)v->x;
    int64_t need = 0;

    (void)t;
    *out = (rate__verdict_t){0};
    if (n > l->burst) {
        out->reason = RATE_REASON_NEVER;
        out->retry_after_ns = RATE_NEVER;
    } else {
        need = (int64_t)(n * l->period_ns); /* <= B * P */
        uint64_t missing = (uint64_t)need - (uint64_t)u; /* if u < need */
        if (rate__tb_takes(l, u, n)) {
            out->allowed = true;
        } else if (max_wait > 0 &&
                   (rate_i128_t)u - need >= -RATE__DEBT_MAX &&
                   missing <= (rate_u128_t)max_wait * l->limit) {
            out->allowed = true;
            out->delay_ns = rate__ceil_div64(missing, l->limit);
        } else {
            out->reason = RATE_REASON_LIMITED;
            out->retry_after_ns = rate__ceil_div64(missing, l->limit);
        }
    }
    if (!detail)
        return;
    out->remaining_now = tb_remaining(l, u);
    out->reset_now_ns = tb_reset(l, u);
    if (out->allowed) {
        out->remaining_after = tb_remaining(l, (rate_i128_t)u - need);
        out->reset_after_ns = tb_reset(l, (rate_i128_t)u - need);
    }
}

static inline size_t tb_commit(const rate_limit_t *l, const rate__view_t *v,
                        uint64_t t, uint64_t n, uint8_t *out)
{
    (void)t;
    /* Admitted: n <= B, and a reservation stays above -2^62. */
    rate__put64(out, (uint64_t)((int64_t)v->x - (int64_t)(n * l->period_ns)));
    return TB_FIXED;
}

/* Written states hold at most B * P, and a debt of at most 2^62. */
static inline bool tb_valid(const rate_limit_t *l, const uint8_t *st, uint64_t last)
{
    int64_t u = (int64_t)rate__get64(st);

    (void)last;
    return u <= (int64_t)(l->burst * l->period_ns) && u >= -RATE__DEBT_MAX;
}

RATE__DEFINE_PLAIN_INLINE(tb, TB_FIXED)

#endif /* RATE_TOKEN_BUCKET_H */
