/* SPDX-License-Identifier: MIT */
/*
 * The holder loop the lease suites share: threads (of one process or of
 * several, the tally then on a shared page) acquire a lease of "hot",
 * count themselves inside while holding it, and release it, so that the
 * test can check the most ever inside against N itself.  A storm of
 * releases: many holders of "hot" released at once.  And one clock per
 * store: objects of the library's default clock and of the wall clock on
 * one key of a store hosts share.
 */
#ifndef RATE_TEST_LEASE_HOLDERS_H
#define RATE_TEST_LEASE_HOLDERS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
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

/* A storm of releases: `threads` leases of "hot" taken one after
 * another, then released each by its own thread, all at once (a
 * barrier), so that the releases meet each other in the store.  More
 * threads than a compare-and-set is retried (64): a release may then meet
 * more conflicts than that. */
#define LEASE_STORM_MAX 256

typedef struct lease_storm {
    rate_inflight_t *in;
    pthread_barrier_t go;
    rate_lease_t leases[LEASE_STORM_MAX];
    _Atomic int next;
    _Atomic int granted; /* leases taken */
    _Atomic int lost;    /* releases that failed */
    _Atomic int last_rc; /* the last failed release's code */
} lease_storm_t;

static inline void *lease_storm_thread(void *arg)
{
    lease_storm_t *st = arg;
    rate_lease_t *l = &st->leases[st->next++];
    pthread_barrier_wait(&st->go);
    if (l->id == 0)
        return NULL;
    int rc = rate_inflight_release(st->in, "hot", 3, l);
    if (rc != RATE_OK) {
        st->lost++;
        st->last_rc = rc;
    }
    return NULL;
}

/* Runs the storm of `threads` (at most LEASE_STORM_MAX) on `in` (its N
 * at least that): 0 when every thread ran, -1 when one could not start. */
static inline int lease_storm_run(rate_inflight_t *in, lease_storm_t *st,
                                  int threads)
{
    pthread_t th[LEASE_STORM_MAX];
    int started = 0;
    if (threads > LEASE_STORM_MAX)
        return -1;
    st->in = in;
    for (int i = 0; i < threads; i++) {
        rate_decision_t d;
        if (rate_inflight_acquire(in, "hot", 3, RATE_LEASE_NORMAL,
                                  &st->leases[i], &d) == RATE_OK &&
            d.allowed)
            st->granted++;
    }
    if (pthread_barrier_init(&st->go, NULL, (unsigned)threads) != 0)
        return -1;
    while (started < threads &&
           pthread_create(&th[started], NULL, lease_storm_thread, st) == 0)
        started++;
    if (started < threads) /* the barrier would wait forever */
        return -1;
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    pthread_barrier_destroy(&st->go);
    return 0;
}

/* The wall clock, as a host sharing a store with others reads it. */
static inline uint64_t lease_wall_ns(void *ud)
{
    struct timespec ts;
    (void)ud;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void lease_wall_sleep(void *ud, uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000u),
                          (long)(ns % 1000000000u)};
    (void)ud;
    nanosleep(&ts, NULL);
}

/* One clock per store: on `store` (one hosts share: Redis, DynamoDB), an
 * object of the library's default clock and one given the wall clock (as
 * a program on another host may be, or nginx's Redis zone) bound the key
 * `key` together at N = 1, whichever holds it, and a denial's retry time
 * is within the TTL.  NULL when so, else what went wrong (in `why`). */
static inline const char *lease_one_clock(rate_store_t *store,
                                          const char *key, char *why,
                                          size_t len)
{
    static const rate_clock_t wall = {lease_wall_ns, lease_wall_sleep, NULL};
    rate_inflight_policy_t *p = NULL;
    rate_inflight_t *in[2] = {NULL, NULL};
    const char *fail = NULL;
    size_t klen = strlen(key);
    if (rate_inflight_policy_parse("concurrency 1 ttl=1m", &p, NULL, 0) !=
        RATE_OK)
        return "policy";
    for (int i = 0; i < 2; i++) {
        rate_inflight_config_t cfg = {.policy = p, .store = store,
                                      .clock = i == 0 ? NULL : &wall};
        if (rate_inflight_new(&cfg, &in[i]) != RATE_OK)
            fail = "rate_inflight_new";
    }
    for (int holder = 0; holder < 2 && fail == NULL; holder++) {
        rate_inflight_t *h = in[holder], *o = in[1 - holder];
        rate_lease_t a, b;
        rate_decision_t d;
        uint64_t n = 0;
        if (rate_inflight_acquire(h, key, klen, RATE_LEASE_NORMAL, &a, &d) !=
                RATE_OK ||
            !d.allowed) {
            snprintf(why, len, "the %s clock's object: not granted",
                     holder == 0 ? "default" : "wall");
            fail = why;
        } else if (rate_inflight_acquire(o, key, klen, RATE_LEASE_NORMAL, &b,
                                         &d) != RATE_OK ||
                   d.allowed ||
                   rate_inflight_held(o, key, klen, &n) != RATE_OK ||
                   n != 1 || d.retry_after_ns > 60000000000u) {
            snprintf(why, len,
                     "held by the %s clock's object, the other's acquire: "
                     "allowed %d, retry_after %llu ns, held %llu",
                     holder == 0 ? "default" : "wall", d.allowed,
                     (unsigned long long)d.retry_after_ns,
                     (unsigned long long)n);
            fail = why;
            if (d.allowed)
                rate_inflight_release(o, key, klen, &b);
        }
        if (a.id != 0 && rate_inflight_release(h, key, klen, &a) != RATE_OK &&
            fail == NULL)
            fail = "release";
    }
    rate_inflight_free(in[0]);
    rate_inflight_free(in[1]);
    rate_inflight_policy_free(p);
    return fail;
}

#endif
