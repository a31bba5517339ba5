/* SPDX-License-Identifier: MIT */
/*
 * A small store written only against the public headers, through the
 * generic load / compare-and-set contract: the proof that a user can plug in
 * a back end of their own.  Also injects conflicts and failures for tests.
 */
#ifndef TEST_CAS_STORE_H
#define TEST_CAS_STORE_H

#include <ratelimit_store.h>

typedef struct cas_store cas_store_t;

/* Makes the store; *handle (optional) lets the test inject faults. */
int cas_store_new(rate_store_t **out, cas_store_t **handle);
/* The same store with the contract's asynchronous entry: start() queues a
 * decision's store part, and cas_store_run_jobs completes the queue. */
int cas_store_new_async(rate_store_t **out, cas_store_t **handle);
/* The asynchronous store with a decide() too, which declines every
 * request (as a script out of its range would), queued like the rest:
 * the job then comes back RATE_ENOTSUP, and must be started again with
 * no request (the step). */
int cas_store_new_async_declining(rate_store_t **out, cas_store_t **handle);
/* The asynchronous store with a decide() that records what it is asked
 * (by rate_decide_req_t.op, on the synchronous path and in the jobs
 * start() queues) and declines it, in a table of `version` (3 or 4) that
 * sets decide_changes when `changes` (version 4 only): the limiter must
 * ask no other table for a refund or a penalty. */
int cas_store_new_recording(rate_store_t **out, cas_store_t **handle,
                            int version, bool changes);
/* How many requests of op (RATE_DECIDE_ACQUIRE, _REFUND, _PENALTY) the
 * recording store's decide() was asked, or start() was given. */
unsigned cas_store_asked(cas_store_t *s, int op);
/* Completes every queued job (in order); returns how many. */
size_t cas_store_run_jobs(cas_store_t *s);
/* The next `n` compare-and-sets fail with RATE_ECONFLICT. */
void cas_store_inject_conflicts(cas_store_t *s, unsigned n);
/* While `down`, every call fails with RATE_ESTORE. */
void cas_store_set_down(cas_store_t *s, int down);
/* The TTL last set on `key` (0 if none). */
uint64_t cas_store_ttl(cas_store_t *s, const char *key);
/* Copies a key's bytes (at most cap) into buf; their length (0: none). */
size_t cas_store_peek(cas_store_t *s, const char *key, void *buf,
                      size_t cap);
/* The same for a key of key_len bytes (any bytes, a NUL too). */
size_t cas_store_peek_len(cas_store_t *s, const char *key, size_t key_len,
                          void *buf, size_t cap);
/* Overwrites a key's bytes (to test corrupt state). */
void cas_store_poke(cas_store_t *s, const char *key, const void *bytes,
                    size_t len);
/* The same for a key of key_len bytes (any bytes, a NUL too). */
void cas_store_poke_len(cas_store_t *s, const char *key, size_t key_len,
                        const void *bytes, size_t len);

#endif
