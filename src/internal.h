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

/* The library's clock (src/clock.c). */
uint64_t rate__clock_exact(void *ud);
uint64_t rate__clock_coarse(void *ud);
void rate__clock_sleep(void *ud, uint64_t ns);

#endif /* RATE_INTERNAL_H */
