/* SPDX-License-Identifier: MIT */
/*
 * The fleet's path (docs/fair.md, "Redis (a fleet)"): when the limiter's
 * store makes fair decisions itself (its fair(), version 6: a fleet's
 * table on Redis, decided by step.c in the Redis module or its Lua twin),
 * the not-waiting calls go there, with the flow's hash and weight; what
 * it declines is decided on this process's table.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "ratelimit_store.h"

#include "fleet.h"
#include "table.h"

bool rate__ft_fleet_of(rate_limiter_t *limiter)
{
    return rate_limiter_check_fair_at(limiter, NULL, NULL, 0, NULL, 0, 0,
                                      NULL) == RATE_OK;
}

/* A not-waiting decision by the store's fair() (docs/fair.md, "Redis (a
 * fleet)"), at now (clock_time: the limiter's clock, e.g. Redis TIME, so
 * that every host goes by one); RATE_ENOTSUP when there is none or it
 * declines (then this table decides). */
int rate__ft_fleet_check(rate_fair_t *f, const char *flow, size_t len,
                         uint32_t weight, uint64_t permits, uint64_t now,
                         bool clock_time, rate_decision_t *out)
{
    if (!f->fleet)
        return RATE_ENOTSUP;
    uint64_t h = XXH3_64bits(flow, len);
    rate_fair_req_t q = {.flow_hash = h ? h : 1, .weight = weight ? weight : 1,
                         .slots = f->slots};
    int rc = clock_time
                 ? rate_limiter_check_fair(f->limiter, f->policy, f->key,
                                           f->key_len, &q, permits, out)
                 : rate_limiter_check_fair_at(f->limiter, f->policy, f->key,
                                              f->key_len, &q, permits, now,
                                              out);
    if (rc == RATE_OK && q.fair_denied)
        atomic_fetch_add_explicit(&f->fleet_denied, 1, memory_order_relaxed);
    if (rc == RATE_OK && q.shared)
        atomic_fetch_add_explicit(&f->fleet_shared, 1, memory_order_relaxed);
    return rc;
}
