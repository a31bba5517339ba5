/*
 * The token bucket's arithmetic on its stored word u = tokens * P: the
 * refill and the admission test, which the refill-and-decide passes of
 * token_bucket.c share.
 */
#ifndef RATE_TOKEN_BUCKET_H
#define RATE_TOKEN_BUCKET_H

#include "../internal.h"

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

#endif /* RATE_TOKEN_BUCKET_H */
