/* SPDX-License-Identifier: MIT */
/*
 * registry.h -- the policies a limiter knows, per store (src/registry.c).
 */
#ifndef RATE_REGISTRY_H
#define RATE_REGISTRY_H

#include <pthread.h>

#include "internal.h"

/* A store's book: the policies known for it, with their ids there. */
typedef struct rate__book {
    rate_store_t *store;
    unsigned max_retries;
    pthread_mutex_t lock; /* adding to `known` */
    rate__registry_t known;
} rate__book_t;

int rate__book_init(rate__book_t *b, rate_store_t *store, unsigned retries);
void rate__book_free(rate__book_t *b);

/* The id of p's states in the book's store: known, else found or made in
 * the store's records (its I/O; never call it under a store's lock). */
int rate__book_id(rate__book_t *b, const rate_policy_t *p, uint32_t *id);

/* Makes the policy a state's (format, tag) names known, from the store's
 * records: what the limiter does when the step asks (RATE__NEED_POLICY).
 * RATE_ECORRUPT when the store has lost the record. */
int rate__book_learn(rate__book_t *b, uint8_t format, uint32_t tag);

#endif /* RATE_REGISTRY_H */
