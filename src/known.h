/* SPDX-License-Identifier: MIT */
/*
 * known.h -- the policies a limiter has met, as the step reads them: an
 * append-only list that readers walk without a lock (src/registry.c keeps
 * it and writes the store's records).  Never installed.
 */
#ifndef RATE_KNOWN_H
#define RATE_KNOWN_H

#include <stdatomic.h>

#include "kit.h"

/* The policies a limiter has met, each with the id that tags its states in
 * the limiter's store (src/registry.c).  Append-only: an entry, once
 * published, never changes or moves, so readers (the step, under a store's
 * lock) take no lock; only adding one does, and never under a store's lock.
 * A policy's id is allotted by the store's own records (RATE_SPACE_POLICY),
 * so that every limiter on the store agrees on it and no two policies ever
 * share one. */
#define RATE__KNOWN_CHUNK 64u
#define RATE__KNOWN_CHUNKS 1024u

typedef struct rate__known {
    rate_policy_t policy; /* a copy */
    uint32_t id;          /* 0: not yet registered in the store */
    bool legacy;          /* only known by its first-edition fingerprint */
    /* The limiter's time (ns) from which the record is checked again, in
     * case the store lost it (src/registry.c, RATE__RECHECK_NS). */
    _Atomic uint64_t recheck_at;
} rate__known_t;

/* How often a limiter makes sure the store still holds the records of the
 * policies it writes states under (a Redis restarted without its data
 * loses them, and other readers could not read those states). */
#define RATE__RECHECK_NS (10 * RATE_NS_PER_S)

/* When a record checked at `now` is due again. */
static inline uint64_t rate__recheck_next(uint64_t now)
{
    return now > RATE_TIME_MAX - RATE__RECHECK_NS ? RATE_TIME_MAX
                                                  : now + RATE__RECHECK_NS;
}

/* Whether the check kept by *at is due at `now`: claimed by this caller
 * (one of those who find it due), the next set RATE__RECHECK_NS on. */
static inline bool rate__recheck_claim(_Atomic uint64_t *at, uint64_t now)
{
    uint64_t was = atomic_load_explicit(at, memory_order_relaxed);
    return now >= was &&
           atomic_compare_exchange_strong(at, &was, rate__recheck_next(now));
}

typedef struct rate__registry {
    _Atomic size_t count; /* published entries */
    rate__known_t *_Atomic chunk[RATE__KNOWN_CHUNKS];
} rate__registry_t;

/* The published entry i < count. */
static inline const rate__known_t *rate__known_at(const rate__registry_t *r,
                                                  size_t i)
{
    return &atomic_load_explicit(&r->chunk[i / RATE__KNOWN_CHUNK],
                                 memory_order_acquire)[i % RATE__KNOWN_CHUNK];
}

/* The registered policy of id (format 3), or the policy a first-edition
 * state's fingerprint names (format 2); NULL when unknown here. */
const rate_policy_t *rate__known_find(const rate__registry_t *r,
                                      uint8_t format, uint32_t tag);

#endif /* RATE_KNOWN_H */
