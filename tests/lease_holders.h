/* SPDX-License-Identifier: MIT */
/*
 * The holder loop the lease suites share: threads (of one process or of
 * several, the tally then on a shared page) acquire a lease of "hot",
 * count themselves inside while holding it, and release it, so that the
 * test can check the most ever inside against N itself.
 */
#ifndef RATE_TEST_LEASE_HOLDERS_H
#define RATE_TEST_LEASE_HOLDERS_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include <ratelimit_lease.h>

typedef struct lease_tally {
    _Atomic int inside, most; /* holders right now, by their own count */
    _Atomic int ready;        /* for a test's own start signal */
    _Atomic long granted, denied, errors;
} lease_tally_t;

typedef struct lease_holder {
    rate_inflight_t *in;
    lease_tally_t *tally;
    int rounds;
    long hold_ns; /* long enough that the others run meanwhile */
} lease_holder_t;

/* A thread's body (arg: a lease_holder_t): `rounds` acquires of "hot". */
static inline void *lease_holder_loop(void *arg)
{
    const lease_holder_t *w = arg;
    lease_tally_t *t = w->tally;
    for (int i = 0; i < w->rounds; i++) {
        rate_lease_t l;
        rate_decision_t d;
        if (rate_inflight_acquire(w->in, "hot", 3, RATE_LEASE_NORMAL, &l,
                                  &d) != RATE_OK) {
            t->errors++;
            continue;
        }
        if (!d.allowed) {
            t->denied++;
            continue;
        }
        int now = ++t->inside;
        for (int m = t->most; now > m;)
            if (atomic_compare_exchange_weak(&t->most, &m, now))
                break;
        t->granted++;
        struct timespec ts = {0, w->hold_ns};
        nanosleep(&ts, NULL);
        t->inside--; /* before the release: never counted after it */
        if (rate_inflight_release(w->in, "hot", 3, &l) != RATE_OK)
            t->errors++;
    }
    return NULL;
}

/* Runs lease_holder_loop on `threads` threads (at most 16) sharing `w`
 * and waits for them all: 0 when all ran, -1 when one could not start. */
static inline int lease_holders_run(lease_holder_t *w, int threads)
{
    pthread_t th[16];
    int started = 0;
    if (threads > 16)
        return -1;
    while (started < threads &&
           pthread_create(&th[started], NULL, lease_holder_loop, w) == 0)
        started++;
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    return started == threads ? 0 : -1;
}

#endif
