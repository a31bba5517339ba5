/* SPDX-License-Identifier: MIT */
/*
 * registry.h -- the policies a limiter knows, per store (src/registry.c).
 */
#ifndef RATE_REGISTRY_H
#define RATE_REGISTRY_H

#include <pthread.h>

#include "internal.h"
#include "known.h"

typedef struct rate__book_op rate__book_op_t;

/* A store's book: the policies known for it, with their ids there. */
typedef struct rate__book {
    rate_store_t *store;
    unsigned max_retries;
    pthread_mutex_t lock; /* adding to `known`; `ops` */
    rate__registry_t known;
    struct rate__book_op *ops; /* records being written or read through
                                  the store's start() */
} rate__book_t;

int rate__book_init(rate__book_t *b, rate_store_t *store, unsigned retries);
void rate__book_free(rate__book_t *b);

/* The id of p's states in the book's store: known, else found or made in
 * the store's records (its I/O; never call it under a store's lock). */
int rate__book_id(rate__book_t *b, const rate_policy_t *p, uint32_t *id,
                  uint64_t now);

/* Finds p's record in the store again, or writes it again where the store
 * lost it (a Redis restarted without its data): RATE_OK or the store's
 * error. */
int rate__book_rewrite(rate__book_t *b, const rate_policy_t *p);

/* Makes the policy a state's (format, tag) names known, from the store's
 * records: what the limiter does when the step asks (RATE__NEED_POLICY).
 * RATE_ECORRUPT when the store has lost the record. */
int rate__book_learn(rate__book_t *b, uint8_t format, uint32_t tag);

/* Whether p's id is known (no I/O), *id then, and its record not due to
 * be checked again at `now` (when it is, false, with *id set: this caller
 * registers it again, and finds it, or writes it where the store lost
 * it).  rate__book_id checks so itself. */
bool rate__book_known_id(rate__book_t *b, const rate_policy_t *p,
                         uint32_t *id, uint64_t now);

/* rate__book_id and rate__book_learn through the book's store's start()
 * (the store must have one), for a caller that must not wait: RATE_OK once
 * started, and done(ud, rc) runs exactly once, later, on the store's
 * thread, with what the synchronous call would have returned (p then known
 * in the book: rate__book_known_id); else the error at once, with no
 * callback.  p must stay alive until done. */
int rate__book_id_start(rate__book_t *b, const rate_policy_t *p,
                        uint64_t now, void (*done)(void *ud, int rc),
                        void *ud);
int rate__book_learn_start(rate__book_t *b, uint8_t format, uint32_t tag,
                           void (*done)(void *ud, int rc), void *ud);

#endif /* RATE_REGISTRY_H */
