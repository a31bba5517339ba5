/*
 * The token bucket's arithmetic on its stored word u = tokens * P, shared
 * by the algorithm (token_bucket.c) and the memory store's token bucket
 * lane, which decides in the store's slot with these same functions.
 */
#ifndef RATE_TOKEN_BUCKET_H
#define RATE_TOKEN_BUCKET_H

#include "../internal.h"

#define RATE__TB_FIXED 8 /* bytes of stored state: u */

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

/* The token bucket's plain pass (rate__algo_t.plain): a try-acquire
 * without reservation over a key's whole stored state st[0..len) made
 * under p, decided and rewritten in place.  Inline so that a store's own
 * lane can take it into its hot path (src/store/memory.c). */
static RATE__ALWAYS_INLINE int rate__tb_plain(const rate_policy_t *p,
                                              uint8_t *st, size_t len,
                                              uint64_t now, uint64_t n)
{
    const rate_limit_t *l = &p->limits[0];

    if (!rate__header_is(p, st, len, RATE__TB_FIXED))
        return RATE__PLAIN_NO;
    uint64_t last = rate__get64(st);
    uint64_t t = now > last ? now : last;
    int64_t u = rate__tb_refill(
        l, (int64_t)rate__get64(st + RATE__HEADER_LEN), t - last);
    if (!rate__tb_takes(l, u, n))
        return RATE__PLAIN_DENIED;
    if (n == 0)
        return RATE__PLAIN_READ;
    rate__put64(st, t);
    rate__put64(st + RATE__HEADER_LEN,
                (uint64_t)(u - (int64_t)(n * l->period_ns)));
    return RATE__PLAIN_WROTE;
}

#endif /* RATE_TOKEN_BUCKET_H */
