/* SPDX-License-Identifier: MIT */
/*
 * internal.h -- the core's own: a store's handle and the calls the limiter,
 * the stores' common code and the clock share (src/limiter.c, src/store.c,
 * src/clock.c), over the kit (kit.h) and the call scope (call.h).  Never
 * installed; a part above the core reads the public headers instead
 * (docs/design.md, "Layers").
 */
#ifndef RATE_INTERNAL_H
#define RATE_INTERNAL_H

#include "call.h"
#include "kit.h"

/* A store: its back end's table and pointer. */
struct rate_store {
    const rate_store_methods_t *m;
    void *self;
};

/* The store's part of a step over one key, by whatever the store offers:
 * update(), or load() and cas() retried on a conflict up to max_retries
 * times (RATE_ECONFLICT then); *retries counts the retries. */
int rate__store_step(const rate_store_t *s, const rate_key_t *key,
                     const rate_step_t *st, unsigned max_retries,
                     unsigned *retries);
/* Whether the store is the library's memory store (this process's own)
 * or its shared-memory store (this host's): the stores whose holders'
 * PIDs can be judged by kill() (an inflight object's reap_dead_holders). */
bool rate__store_is_memory(const rate_store_t *s); /* src/store/memory.c */
bool rate__store_is_shm(const rate_store_t *s);    /* src/store/shm.c */
static inline bool rate__store_is_host_local(const rate_store_t *s)
{
    return rate__store_is_memory(s) || rate__store_is_shm(s);
}
/* The store's lease() (version 5), or RATE_ENOTSUP without one. */
int rate__store_lease(const rate_store_t *s, const rate_key_t *key,
                      rate_lease_req_t *req);
/* Whether the store's lease() takes an acquire's rate limits (version 6,
 * lease_rate); a request with rate limits goes to no other lease(). */
bool rate__store_lease_rate(const rate_store_t *s);
/* For a layer that has the store decide a limiter's rate limits within
 * another operation (an acquire with its lease): the decide() request of
 * one permit on key at now, as the limiter would ask it (its policy for
 * the key, the policy's tag in the store; with wait, writing the
 * policy's record first if need be, else RATE_ENOTSUP until the limiter
 * has).  RATE_OK with *req; RATE_ENOTSUP for an unlimited policy, a bad
 * key or time, or any trouble (the caller then asks the limiter). */
int rate__limiter_decide_req(rate_limiter_t *lim, const char *key,
                             size_t len, uint64_t now, bool clock_time,
                             bool wait, rate_decide_req_t *req);

/* The library's clock (src/clock.c). */
uint64_t rate__clock_exact(void *ud);
uint64_t rate__clock_coarse(void *ud);
uint64_t rate__clock_wall(void *ud);
void rate__clock_sleep(void *ud, uint64_t ns);

#endif /* RATE_INTERNAL_H */
