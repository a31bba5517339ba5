/* SPDX-License-Identifier: MIT */
/*
 * rate_state_acquire's pass, inline for the library's own stores: the
 * token bucket's plain pass compiled in from its header, every other
 * algorithm's called through its policy.
 */
#ifndef RATE_ACQUIRE_H
#define RATE_ACQUIRE_H

#include "token_bucket.h"

/* Whether req's policy has its pass inlined here (a store may keep a path
 * for it that calls nothing). */
static inline bool rate__acquire_inline(const rate_acquire_t *req)
{
    return req->policy->algo[0] == &rate__token_bucket &&
           req->policy->count == 1;
}

/* The inlined pass alone, for a request rate__acquire_inline() accepts. */
static RATE__ALWAYS_INLINE int rate__state_acquire_inline(
    const rate_acquire_t *req, uint64_t n, uint64_t now, void *state,
    size_t len, uint64_t *ttl_ns)
{
    return tb_plain_inline(req, n, now, state, len, ttl_ns);
}

static RATE__ALWAYS_INLINE int rate__state_acquire(const rate_acquire_t *req,
                                                   uint64_t n, uint64_t now,
                                                   void *state, size_t len,
                                                   uint64_t *ttl_ns)
{
    const rate_policy_t *p = req->policy;

    if (rate__acquire_inline(req))
        return rate__state_acquire_inline(req, n, now, state, len, ttl_ns);
    return p->plain != NULL ? p->plain(req, n, now, state, len, ttl_ns)
                            : RATE_ENOTSUP;
}

#endif /* RATE_ACQUIRE_H */
