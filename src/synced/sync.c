/* SPDX-License-Identifier: MIT */
/*
 * The synced mode: local decisions over leases borrowed from a remote
 * store (docs/sync.md has the design, the bound and its proof sketch).
 *
 * Built only on the public limiter calls: a limiter over the remote store
 * makes every borrow (an ordinary decision for the lease's permits, so the
 * remote stays exact for its own algorithm) and every give-back (a
 * refund); a limiter over a private memory store is the fail mode's
 * fallback.  What is local is a table of leases: shards by the key's
 * hash, each a chained hash table behind a mutex, with a list of its
 * entries in the order they last borrowed (for max_keys and flush).
 *
 * A decision that the key's lease covers takes the shard's mutex, takes
 * the permits and leaves: no round trip.  One that needs the remote marks
 * the entry as borrowing and makes the round trip without the mutex;
 * other threads wanting that key wait on the shard's condition variable
 * (so at most one borrow per key and process is in flight, which the
 * bound P x L counts on).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "ratelimit.h"
#include "ratelimit_synced.h"

#define SHARDS_MAX 64u
#define LEASE_DEFAULT 16u
#define TTL_DEFAULT RATE_NS_PER_S
#define RETRY_DEFAULT (RATE_NS_PER_S / 10)

typedef struct entry {
    struct entry *next;          /* hash chain */
    struct entry *older, *newer; /* the shard's list, by last borrow */
    uint64_t hash;
    uint64_t held;               /* permits held, unspent */
    uint64_t lease_t;            /* time of the last borrow */
    uint64_t last_t;             /* latest time of a decision on it */
    uint64_t denied_until;       /* cached denial: until then (0: none) */
    uint64_t denied_need;        /* ... of requests needing this many more */
    rate_reason_t denied_reason;
    bool borrowing;              /* a round trip for it is in flight */
    struct entry *qnext;         /* the refiller's queue */
    uint64_t q_now, q_want;      /* a queued top-up's time and permits */
    bool clock;                  /* its times are CLOCK_MONOTONIC's */
    size_t len;
    char key[];
} entry_t;

typedef struct shard {
    _Alignas(64) pthread_mutex_t mu;
    pthread_cond_t cv;
    entry_t **buckets;
    size_t nbuckets; /* a power of two */
    size_t count;
    entry_t *oldest, *newest;
    uint64_t decisions, local, allowed, denied, borrowed, held, evictions;
} shard_t;

struct rate_synced {
    rate_limiter_t *remote;   /* over the caller's store */
    rate_limiter_t *fallback; /* RATE_FAIL_FALLBACK's, else NULL */
    const rate_policy_t *policy;
    uint64_t lease, ttl_ns, retry_ns, sweep_ns, limit0, denial_ttl_ns;
    rate_fail_mode_t fail;
    bool refundable;
    size_t shard_cap; /* entries per shard; 0: unbounded */
    unsigned nshards;
    shard_t *shards;
    XXH64_hash_t seed;
    /* time (of the calls' kind) before which the remote is not asked */
    _Atomic uint64_t down_until;
    _Atomic uint64_t decisions, allowed, denied; /* outside the shards */
    _Atomic uint64_t round_trips, remote_errors, fail_mode, returned, lost;
    /* the sweeper */
    pthread_t sweeper;
    bool sweeping;
    pthread_mutex_t sweep_mu;
    pthread_cond_t sweep_cv;
    bool stopping;
    /* the refiller (prefetch): a queue of entries to top up */
    bool prefetch, refilling;
    pthread_t refiller;
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;
    entry_t *q_head, *q_tail;
    bool q_stop;
};

static void set_err(char *err, size_t errlen, const char *msg)
{
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, "%s", msg);
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* ------------------------------------------------------------ the table */

static entry_t *find(shard_t *sh, uint64_t h, const char *key, size_t len)
{
    for (entry_t *e = sh->buckets[(h >> 8) & (sh->nbuckets - 1)]; e != NULL;
         e = e->next)
        if (e->hash == h && e->len == len && memcmp(e->key, key, len) == 0)
            return e;
    return NULL;
}

static void list_unlink(shard_t *sh, entry_t *e)
{
    if (e->older != NULL)
        e->older->newer = e->newer;
    else
        sh->oldest = e->newer;
    if (e->newer != NULL)
        e->newer->older = e->older;
    else
        sh->newest = e->older;
    e->older = e->newer = NULL;
}

static void list_push(shard_t *sh, entry_t *e)
{
    e->older = sh->newest;
    e->newer = NULL;
    if (sh->newest != NULL)
        sh->newest->newer = e;
    else
        sh->oldest = e;
    sh->newest = e;
}

/* Takes e out of the shard (its chain and list); the caller frees it. */
static void detach(shard_t *sh, entry_t *e)
{
    entry_t **p = &sh->buckets[(e->hash >> 8) & (sh->nbuckets - 1)];
    while (*p != e)
        p = &(*p)->next;
    *p = e->next;
    list_unlink(sh, e);
    sh->count--;
    sh->held -= e->held;
}

static void grow(shard_t *sh)
{
    size_t n = sh->nbuckets * 2;
    entry_t **b = calloc(n, sizeof *b);
    if (b == NULL)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < sh->nbuckets; i++) {
        entry_t *e = sh->buckets[i];
        while (e != NULL) {
            entry_t *next = e->next;
            size_t j = (e->hash >> 8) & (n - 1);
            e->next = b[j];
            b[j] = e;
            e = next;
        }
    }
    free(sh->buckets);
    sh->buckets = b;
    sh->nbuckets = n;
}

/* ------------------------------------------------------- remote calls */

static int remote_check(rate_synced_t *s, const char *key, size_t len,
                        uint64_t n, bool clock, uint64_t now,
                        rate_decision_t *d)
{
    atomic_fetch_add_explicit(&s->round_trips, 1, memory_order_relaxed);
    int rc = clock ? rate_limiter_check(s->remote, key, len, n, 0, d)
                   : rate_limiter_check_at(s->remote, key, len, n, 0, now, d);
    if (rc == RATE_OK && d->reason == RATE_REASON_STORE_ERROR)
        rc = d->error != RATE_OK ? d->error : RATE_ESTORE;
    if (rc != RATE_OK && rc != RATE_EKEY) /* EKEY: the caller's key */
        atomic_fetch_add_explicit(&s->remote_errors, 1, memory_order_relaxed);
    return rc;
}

/* Gives n permits of key back to the remote; RATE_OK or the error (the
 * permits are then counted lost). */
static int give_back(rate_synced_t *s, const char *key, size_t len,
                     uint64_t n, bool clock, uint64_t t)
{
    if (n == 0)
        return RATE_OK;
    if (!s->refundable) {
        atomic_fetch_add_explicit(&s->lost, n, memory_order_relaxed);
        return RATE_OK;
    }
    atomic_fetch_add_explicit(&s->round_trips, 1, memory_order_relaxed);
    int rc = clock ? rate_limiter_refund(s->remote, key, len, n)
                   : rate_limiter_refund_at(s->remote, key, len, n, t);
    if (rc == RATE_OK) {
        atomic_fetch_add_explicit(&s->returned, n, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&s->remote_errors, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->lost, n, memory_order_relaxed);
    }
    return rc;
}

/* The fail mode's verdict on a request the leases do not cover. */
static void fail_decide(rate_synced_t *s, const char *key, size_t len,
                        uint64_t n, bool clock, uint64_t now, int err,
                        rate_decision_t *out)
{
    atomic_fetch_add_explicit(&s->fail_mode, 1, memory_order_relaxed);
    if (s->fail == RATE_FAIL_FALLBACK && s->fallback != NULL) {
        int rc = clock
                     ? rate_limiter_check(s->fallback, key, len, n, 0, out)
                     : rate_limiter_check_at(s->fallback, key, len, n, 0, now,
                                             out);
        if (rc != RATE_OK) {
            memset(out, 0, sizeof *out);
            out->allowed = false;
        }
    } else {
        uint64_t limit = out->limit;
        memset(out, 0, sizeof *out);
        out->limit = limit;
        out->allowed = s->fail == RATE_FAIL_OPEN;
    }
    out->reason = RATE_REASON_STORE_ERROR;
    out->error = err;
}

/* ------------------------------------------------------------ decisions */

static void count(rate_synced_t *s, bool allowed)
{
    atomic_fetch_add_explicit(&s->decisions, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(allowed ? &s->allowed : &s->denied, 1,
                              memory_order_relaxed);
}

/* A request above the lease: to the remote as it is. */
static int direct(rate_synced_t *s, const char *key, size_t len, uint64_t n,
                  bool clock, uint64_t now, rate_decision_t *out)
{
    int rc = RATE_ESTORE;
    if (now >= atomic_load_explicit(&s->down_until, memory_order_relaxed)) {
        rc = remote_check(s, key, len, n, clock, now, out);
        if (rc == RATE_EKEY) { /* the caller's key: the remote is fine */
            memset(out, 0, sizeof *out);
            return RATE_EKEY;
        }
        if (rc != RATE_OK)
            atomic_store_explicit(&s->down_until, add_sat(now, s->retry_ns),
                                  memory_order_relaxed);
    }
    if (rc != RATE_OK)
        fail_decide(s, key, len, n, clock, now, rc, out);
    count(s, out->allowed);
    return RATE_OK;
}

static bool expired(const rate_synced_t *s, const entry_t *e, uint64_t now)
{
    return now >= e->lease_t && now - e->lease_t >= s->ttl_ns;
}

static void local_allow(shard_t *sh, entry_t *e, uint64_t n, uint64_t now,
                        rate_decision_t *out)
{
    e->held -= n;
    sh->held -= n;
    if (now > e->last_t)
        e->last_t = now;
    out->allowed = true;
    out->reason = RATE_REASON_ALLOWED;
    out->remaining = e->held;
}

/* With prefetch: a lease fallen below half of L is queued for a top-up to
 * L by the refiller, the entry marked borrowing meanwhile (so that the
 * held and in-flight permits stay at most L).  Called with the shard's
 * mutex held. */
static void maybe_prefetch(rate_synced_t *s, entry_t *e, bool clock,
                           uint64_t now)
{
    if (!s->prefetch || e->borrowing || e->held >= s->lease / 2)
        return;
    e->borrowing = true;
    e->clock = clock;
    e->q_now = now;
    e->q_want = s->lease - e->held;
    e->qnext = NULL;
    pthread_mutex_lock(&s->q_mu);
    if (s->q_tail != NULL)
        s->q_tail->qnext = e;
    else
        s->q_head = e;
    s->q_tail = e;
    pthread_cond_signal(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
}

/* The refiller: tops up the queued leases, one round trip each (two when
 * the remote has less than asked: then what it has). */
static void *refill_main(void *arg)
{
    rate_synced_t *s = arg;
    pthread_mutex_lock(&s->q_mu);
    for (;;) {
        while (s->q_head == NULL && !s->q_stop)
            pthread_cond_wait(&s->q_cv, &s->q_mu);
        if (s->q_stop)
            break;
        entry_t *e = s->q_head;
        s->q_head = e->qnext;
        if (s->q_head == NULL)
            s->q_tail = NULL;
        pthread_mutex_unlock(&s->q_mu);

        /* borrowing: no one frees or changes e's key or q_* meanwhile */
        uint64_t now = e->q_now, want = e->q_want, got = 0;
        bool clock = e->clock;
        rate_decision_t d;
        int rc = RATE_ESTORE;
        bool asked = now >= atomic_load_explicit(&s->down_until,
                                                 memory_order_relaxed);
        uint64_t scope = rate_deadline_begin(); /* one deadline per top-up */
        if (asked)
            rc = remote_check(s, e->key, e->len, want, clock, now, &d);
        if (rc == RATE_OK && d.allowed) {
            got = want;
        } else if (rc == RATE_OK && d.reason == RATE_REASON_LIMITED &&
                   d.remaining > 0 && d.remaining < want) {
            uint64_t x = d.remaining;
            rc = remote_check(s, e->key, e->len, x, clock, now, &d);
            if (rc == RATE_OK && d.allowed)
                got = x;
        }
        rate_deadline_end(scope);
        if (asked && rc != RATE_OK)
            atomic_store_explicit(&s->down_until, add_sat(now, s->retry_ns),
                                  memory_order_relaxed);
        shard_t *sh = &s->shards[e->hash & (s->nshards - 1)];
        pthread_mutex_lock(&sh->mu);
        e->borrowing = false;
        if (got > 0) {
            e->held += got;
            sh->held += got;
            sh->borrowed += got;
            e->lease_t = now > e->lease_t ? now : e->lease_t;
            e->denied_until = 0;
            list_unlink(sh, e);
            list_push(sh, e);
        }
        pthread_cond_broadcast(&sh->cv);
        pthread_mutex_unlock(&sh->mu);
        pthread_mutex_lock(&s->q_mu);
    }
    pthread_mutex_unlock(&s->q_mu);
    return NULL;
}

/* A decision made by the fail mode (the remote down, or its round trip
 * failed), counted in the shard; called without the shard's mutex. */
static void decide_failed(rate_synced_t *s, shard_t *sh, const char *key,
                          size_t len, uint64_t n, bool clock, uint64_t now,
                          int rc, rate_decision_t *out)
{
    fail_decide(s, key, len, n, clock, now, rc, out);
    pthread_mutex_lock(&sh->mu);
    if (out->allowed)
        sh->allowed++;
    else
        sh->denied++;
    pthread_mutex_unlock(&sh->mu);
}

/* What the shard answers without a round trip, called with its mutex
 * held: a query, a lease that holds n, a cached denial, or the fail mode
 * while the remote is down.  True once answered (the mutex released);
 * false when the key needs a borrow (the mutex still held). */
static bool decide_local(rate_synced_t *s, shard_t *sh, entry_t *e,
                         const char *key, size_t len, uint64_t n, bool clock,
                         uint64_t now, rate_decision_t *out)
{
    if (n == 0) { /* a query: what this process holds */
        out->allowed = true;
        out->remaining = e != NULL ? e->held : 0;
        sh->local++;
        sh->allowed++;
        pthread_mutex_unlock(&sh->mu);
        return true;
    }
    bool down =
        now < atomic_load_explicit(&s->down_until, memory_order_relaxed);
    if (e != NULL && e->held >= n &&
        (down || e->borrowing || !expired(s, e, now))) {
        local_allow(sh, e, n, now, out);
        sh->local++;
        sh->allowed++;
        if (!down)
            maybe_prefetch(s, e, clock, now);
        pthread_mutex_unlock(&sh->mu);
        return true;
    }
    uint64_t have = e != NULL && !expired(s, e, now) ? e->held : 0;
    if (e != NULL && e->denied_until != 0 && now < e->denied_until &&
        n - have >= e->denied_need) {
        out->reason = e->denied_reason;
        out->retry_after_ns = e->denied_until == UINT64_MAX
                                  ? RATE_NEVER
                                  : e->denied_until - now;
        out->remaining = e->held;
        sh->local++;
        sh->denied++;
        pthread_mutex_unlock(&sh->mu);
        return true;
    }
    if (down) {
        pthread_mutex_unlock(&sh->mu);
        decide_failed(s, sh, key, len, n, clock, now, RATE_ESTORE, out);
        return true;
    }
    return false;
}

/* A new entry for the key, called with the shard's mutex held: in a full
 * shard the least recently used entry not borrowing is detached first
 * (*victim, for the caller to give back and free).  NULL when every
 * entry is borrowing or memory is short (the mutex still held). */
static entry_t *entry_new(shard_t *sh, uint64_t h, const char *key,
                          size_t len, uint64_t now, size_t shard_cap,
                          entry_t **victim)
{
    *victim = NULL;
    if (shard_cap != 0 && sh->count >= shard_cap) {
        for (entry_t *v = sh->oldest; v != NULL; v = v->newer)
            if (!v->borrowing) {
                *victim = v;
                break;
            }
        if (*victim == NULL)
            return NULL;
        detach(sh, *victim);
        sh->evictions++;
    }
    entry_t *e = calloc(1, sizeof *e + len);
    if (e == NULL)
        return NULL;
    e->hash = h;
    e->len = len;
    memcpy(e->key, key, len);
    e->lease_t = now;
    e->last_t = now;
    size_t b = (h >> 8) & (sh->nbuckets - 1);
    e->next = sh->buckets[b];
    sh->buckets[b] = e;
    list_push(sh, e);
    if (++sh->count > sh->nbuckets)
        grow(sh);
    return e;
}

/* The round trips of a borrow: a whole lease (want), else what the remote
 * has, or exactly this request's need, whose denial's retry_after is then
 * exact for it (*cache).  *got: the permits borrowed; *d the remote's
 * last decision. */
static int borrow(rate_synced_t *s, const char *key, size_t len,
                  uint64_t want, uint64_t need, bool clock, uint64_t now,
                  rate_decision_t *d, uint64_t *got, bool *cache)
{
    *got = 0;
    *cache = false;
    int rc = remote_check(s, key, len, want, clock, now, d);
    if (rc == RATE_OK && d->allowed) {
        *got = want;
    } else if (rc == RATE_OK && d->reason == RATE_REASON_LIMITED &&
               want > need) {
        uint64_t x = d->remaining >= need
                         ? (d->remaining < want ? d->remaining : want - 1)
                         : need;
        rc = remote_check(s, key, len, x, clock, now, d);
        if (rc == RATE_OK && d->allowed)
            *got = x;
        else if (rc == RATE_OK)
            *cache = x == need;
    } else if (rc == RATE_OK) {
        *cache = true; /* want == need: exact */
    }
    return rc;
}

/* A borrow's outcome in the entry and the decision, called with the
 * shard's mutex held (released on return): the permits added and n
 * taken from them, or the remote's denial, cached for the key when exact
 * (denial_ttl_ns at most). */
static void borrow_settle(rate_synced_t *s, shard_t *sh, entry_t *e,
                          uint64_t n, bool clock, uint64_t now, uint64_t got,
                          uint64_t need, bool cache, const rate_decision_t *d,
                          rate_decision_t *out)
{
    if (got > 0) {
        e->held += got;
        sh->held += got;
        sh->borrowed += got;
        e->lease_t = now;
        e->denied_until = 0;
        list_unlink(sh, e);
        list_push(sh, e);
        local_allow(sh, e, n, now, out);
        sh->allowed++;
        maybe_prefetch(s, e, clock, now);
    } else {
        out->allowed = false;
        out->reason = d->reason;
        out->retry_after_ns = d->retry_after_ns;
        out->reset_after_ns = d->reset_after_ns;
        out->component = d->component;
        out->limit = d->limit;
        out->remaining = e->held;
        uint64_t wait = d->retry_after_ns;
        if (s->denial_ttl_ns != 0 && wait > s->denial_ttl_ns)
            wait = s->denial_ttl_ns;
        if (cache && wait > 0) {
            e->denied_until = add_sat(now, wait);
            e->denied_need = need;
            e->denied_reason = d->reason;
        }
        sh->denied++;
    }
    pthread_mutex_unlock(&sh->mu);
}

/* One synced decision: locally when the shard can answer, else a borrow
 * for the key (its entry made or taken and marked borrowing, the rest of
 * an expired lease and an evicted key's lease given back first). */
static int decide_in(rate_synced_t *s, const char *key, size_t len,
                     uint64_t n, bool clock, uint64_t now,
                     rate_decision_t *out)
{
    if (out != NULL)
        memset(out, 0, sizeof *out);
    if (s == NULL || out == NULL)
        return RATE_EINVAL;
    if (key == NULL || len == 0 || len > RATE_KEY_MAX ||
        (len >= RATE_KEY_RESERVED_LEN &&
         memcmp(key, RATE_KEY_RESERVED, RATE_KEY_RESERVED_LEN) == 0))
        return RATE_EKEY;
    if (n > RATE_TIME_MAX || now > RATE_TIME_MAX)
        return RATE_ERANGE;
    out->limit = s->limit0;
    if (n > s->lease)
        return direct(s, key, len, n, clock, now, out);

    uint64_t h = XXH3_64bits_withSeed(key, len, s->seed);
    shard_t *sh = &s->shards[h & (s->nshards - 1)];
    pthread_mutex_lock(&sh->mu);
    entry_t *e;
    for (;;) {
        e = find(sh, h, key, len);
        /* a round trip in flight: wait for it only if this needs it */
        if (e == NULL || !e->borrowing || e->held >= n)
            break;
        rate_deadline_start(); /* the wait counts in the deadline */
        pthread_cond_wait(&sh->cv, &sh->mu);
    }
    sh->decisions++;
    if (decide_local(s, sh, e, key, len, n, clock, now, out))
        return RATE_OK;

    uint64_t have = e != NULL && !expired(s, e, now) ? e->held : 0;
    entry_t *victim = NULL;
    if (e == NULL &&
        (e = entry_new(sh, h, key, len, now, s->shard_cap, &victim)) == NULL) {
        sh->decisions--;
        pthread_mutex_unlock(&sh->mu);
        if (victim != NULL) {
            give_back(s, victim->key, victim->len, victim->held,
                      victim->clock, victim->last_t);
            free(victim);
        }
        return RATE_ENOMEM; /* every entry borrowing, or no memory */
    }
    e->clock = clock;
    uint64_t back = e->held - have; /* an expired lease's rest */
    e->held = have;
    sh->held -= back;
    uint64_t back_t = e->last_t;
    uint64_t want = s->lease - have, need = n - have;
    e->borrowing = true;
    pthread_mutex_unlock(&sh->mu);

    if (victim != NULL) {
        give_back(s, victim->key, victim->len, victim->held, victim->clock,
                  victim->last_t);
        free(victim);
    }
    give_back(s, key, len, back, clock, back_t);

    rate_decision_t d;
    uint64_t got;
    bool cache;
    int rc = borrow(s, key, len, want, need, clock, now, &d, &got, &cache);

    pthread_mutex_lock(&sh->mu);
    e->borrowing = false;
    pthread_cond_broadcast(&sh->cv);
    if (rc == RATE_EKEY) { /* longer than the remote keeps: no failure */
        sh->decisions--;
        if (e->held == 0) { /* the entry made for it: none is kept */
            detach(sh, e);
            free(e);
        }
        pthread_mutex_unlock(&sh->mu);
        memset(out, 0, sizeof *out);
        return RATE_EKEY;
    }
    if (rc != RATE_OK) {
        pthread_mutex_unlock(&sh->mu);
        atomic_store_explicit(&s->down_until, add_sat(now, s->retry_ns),
                              memory_order_relaxed);
        decide_failed(s, sh, key, len, n, clock, now, rc, out);
        return RATE_OK;
    }
    borrow_settle(s, sh, e, n, clock, now, got, need, cache, &d, out);
    return RATE_OK;
}

/* A synced decision: its remote calls (the refunds of an expired lease
 * and of an evicted key, one or two borrows) share one deadline, the
 * remote store's timeout from the decision's first remote call or its
 * wait for another thread's borrow of the key (call.h,
 * rate_deadline_begin); a decision made locally reads no clock for it. */
static int decide(rate_synced_t *s, const char *key, size_t len,
                  uint64_t n, bool clock, uint64_t now, rate_decision_t *out)
{
    uint64_t scope = rate_deadline_begin();
    int rc = decide_in(s, key, len, n, clock, now, out);
    rate_deadline_end(scope);
    return rc;
}

int rate_synced_check(rate_synced_t *s, const char *key, size_t key_len,
                      uint64_t permits, rate_decision_t *out)
{
    return decide(s, key, key_len, permits, true, rate_clock_monotonic_ns(),
                  out);
}

int rate_synced_check_at(rate_synced_t *s, const char *key, size_t key_len,
                         uint64_t permits, uint64_t now_ns,
                         rate_decision_t *out)
{
    return decide(s, key, key_len, permits, false, now_ns, out);
}

bool rate_synced_try_acquire(rate_synced_t *s, const char *key,
                             size_t key_len, uint64_t permits)
{
    rate_decision_t d;
    return rate_synced_check(s, key, key_len, permits, &d) == RATE_OK &&
           d.allowed;
}

/* ---------------------------------------------------------- giving back */

/* Flushes the shards first, first + step, ... */
static int flush_shards(rate_synced_t *s, bool clock, uint64_t now, bool all,
                        unsigned first_shard, unsigned step)
{
    int first = RATE_OK;
    for (unsigned i = first_shard; i < s->nshards; i += step) {
        shard_t *sh = &s->shards[i];
        entry_t *gone = NULL;
        pthread_mutex_lock(&sh->mu);
        entry_t *e = sh->oldest;
        while (e != NULL) {
            entry_t *newer = e->newer;
            bool due = all || (e->clock == clock && expired(s, e, now));
            bool denial = !all && e->denied_until != 0 &&
                          (e->clock == clock && now < e->denied_until);
            if (due && !e->borrowing && !denial) {
                detach(sh, e);
                e->next = gone;
                gone = e;
            }
            e = newer;
        }
        pthread_mutex_unlock(&sh->mu);
        while (gone != NULL) {
            entry_t *next = gone->next;
            int rc = give_back(s, gone->key, gone->len, gone->held,
                               gone->clock, gone->last_t);
            if (rc != RATE_OK && first == RATE_OK)
                first = rc;
            free(gone);
            gone = next;
        }
    }
    return first;
}

static int flush(rate_synced_t *s, bool clock, uint64_t now, bool all)
{
    if (s == NULL)
        return RATE_EINVAL;
    return flush_shards(s, clock, now, all, 0, 1);
}

/* The clean exit's give-back, from GIVERS threads at once (a store that
 * pipelines its callers, as the Redis store does, then hands back many
 * keys in a fraction of the time of one caller). */
#define GIVERS 8u
typedef struct giver {
    rate_synced_t *s;
    unsigned first;
} giver_t;

static void *giver_main(void *arg)
{
    giver_t *g = arg;
    flush_shards(g->s, true, 0, true, g->first, GIVERS);
    return NULL;
}

static void give_all_back(rate_synced_t *s)
{
    pthread_t th[GIVERS];
    giver_t g[GIVERS];
    bool started[GIVERS] = {false};
    for (unsigned i = 1; i < GIVERS && i < s->nshards; i++) {
        g[i] = (giver_t){s, i};
        started[i] = pthread_create(&th[i], NULL, giver_main, &g[i]) == 0;
    }
    for (unsigned i = 0; i < GIVERS && i < s->nshards; i++)
        if (!started[i]) /* this thread's share, and any not started */
            flush_shards(s, true, 0, true, i, GIVERS);
    for (unsigned i = 1; i < GIVERS; i++)
        if (started[i])
            pthread_join(th[i], NULL);
}

int rate_synced_flush(rate_synced_t *s, bool all)
{
    return flush(s, true, rate_clock_monotonic_ns(), all);
}

int rate_synced_flush_at(rate_synced_t *s, uint64_t now_ns, bool all)
{
    if (s != NULL && now_ns > RATE_TIME_MAX)
        return RATE_ERANGE;
    return flush(s, false, now_ns, all);
}

static void *sweep_main(void *arg)
{
    rate_synced_t *s = arg;
    pthread_mutex_lock(&s->sweep_mu);
    while (!s->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t t = (uint64_t)ts.tv_sec * RATE_NS_PER_S +
                     (uint64_t)ts.tv_nsec + s->sweep_ns;
        ts.tv_sec = (time_t)(t / RATE_NS_PER_S);
        ts.tv_nsec = (long)(t % RATE_NS_PER_S);
        pthread_cond_timedwait(&s->sweep_cv, &s->sweep_mu, &ts);
        if (s->stopping)
            break;
        pthread_mutex_unlock(&s->sweep_mu);
        flush(s, true, rate_clock_monotonic_ns(), false);
        pthread_mutex_lock(&s->sweep_mu);
    }
    pthread_mutex_unlock(&s->sweep_mu);
    return NULL;
}

/* ------------------------------------------------------- make and free */

static uint64_t capacity_of(const rate_limit_t *l)
{
    if (l->algorithm == RATE_TOKEN_BUCKET || l->algorithm == RATE_LEAKY_BUCKET)
        return l->burst != 0 ? l->burst : l->limit;
    return l->limit;
}

void rate_synced_free(rate_synced_t *s)
{
    if (s == NULL)
        return;
    if (s->sweeping) {
        pthread_mutex_lock(&s->sweep_mu);
        s->stopping = true;
        pthread_cond_signal(&s->sweep_cv);
        pthread_mutex_unlock(&s->sweep_mu);
        pthread_join(s->sweeper, NULL);
    }
    if (s->refilling) {
        pthread_mutex_lock(&s->q_mu);
        s->q_stop = true;
        pthread_cond_signal(&s->q_cv);
        pthread_mutex_unlock(&s->q_mu);
        pthread_join(s->refiller, NULL);
        for (entry_t *e = s->q_head; e != NULL; e = e->qnext)
            e->borrowing = false; /* never sent: nothing in flight */
        s->q_head = s->q_tail = NULL;
    }
    if (s->shards != NULL) {
        if (s->remote != NULL)
            give_all_back(s);
        for (unsigned i = 0; i < s->nshards; i++) {
            pthread_mutex_destroy(&s->shards[i].mu);
            pthread_cond_destroy(&s->shards[i].cv);
            free(s->shards[i].buckets);
        }
        free(s->shards);
    }
    pthread_mutex_destroy(&s->sweep_mu);
    pthread_cond_destroy(&s->sweep_cv);
    pthread_mutex_destroy(&s->q_mu);
    pthread_cond_destroy(&s->q_cv);
    rate_limiter_free(s->fallback);
    rate_limiter_free(s->remote);
    free(s);
}

/* The config checked, as rate_synced_new's errors say; with RATE_OK the
 * lease (c->lease, or the default within the policy's capacity) and
 * whether the policy's limits take refunds (no window counts them). */
static int check_config(const rate_synced_config_t *c, uint64_t *lease_out,
                        bool *refundable, char *err, size_t errlen)
{
    for (size_t i = 0; i < sizeof c->reserved / sizeof c->reserved[0]; i++)
        if (c->reserved[i] != 0) {
            set_err(err, errlen, "the config's reserved words are not zero "
                                 "(a field of a later version?)");
            return RATE_EINVAL;
        }
    if (c->policy == NULL || c->remote == NULL) {
        set_err(err, errlen, c->policy == NULL ? "no policy (NULL)"
                                               : "no remote store (NULL)");
        return RATE_EINVAL;
    }
    if (rate_policy_is_unlimited(c->policy)) {
        set_err(err, errlen, "the unlimited policy needs no synced limiter");
        return RATE_EPOLICY;
    }
    if (c->on_store_error != RATE_FAIL_CLOSED &&
        c->on_store_error != RATE_FAIL_OPEN &&
        c->on_store_error != RATE_FAIL_FALLBACK) {
        set_err(err, errlen, "on_store_error is not a fail mode");
        return RATE_EINVAL;
    }
    uint64_t cap = UINT64_MAX;
    *refundable = true;
    for (size_t i = 0; i < rate_policy_count(c->policy); i++) {
        const rate_limit_t *l = rate_policy_limit(c->policy, i);
        if (l->block_ns != 0) {
            set_err(err, errlen,
                    "a block= limit cannot be synced: a lease's denial "
                    "would block the key");
            return RATE_EPOLICY;
        }
        if (capacity_of(l) < cap)
            cap = capacity_of(l);
        if (l->algorithm == RATE_SLIDING_LOG ||
            l->algorithm == RATE_SLIDING_WINDOW)
            *refundable = false;
    }
    uint64_t lease = c->lease != 0 ? c->lease
                                   : (cap < LEASE_DEFAULT ? cap : LEASE_DEFAULT);
    if (lease > cap) {
        if (err != NULL && errlen > 0)
            snprintf(err, errlen,
                     "lease %llu is above the policy's capacity %llu (the "
                     "smallest burst, capacity or window limit)",
                     (unsigned long long)lease, (unsigned long long)cap);
        return RATE_EINVAL;
    }
    if (c->lease_ttl_ns > RATE_TIME_MAX || c->retry_ns > RATE_TIME_MAX ||
        c->sweep_ns > RATE_TIME_MAX || c->denial_ttl_ns > RATE_TIME_MAX) {
        set_err(err, errlen, "a duration above 2^63-1 ns");
        return RATE_ERANGE;
    }
    *lease_out = lease;
    return RATE_OK;
}

/* The limiter on the remote store (fail closed: the synced limiter
 * applies its own fail mode) and, for RATE_FAIL_FALLBACK, the local
 * one. */
static int make_limiters(rate_synced_t *s, const rate_synced_config_t *c,
                         char *err, size_t errlen)
{
    rate_limiter_config_t rc = {0};
    rc.policy = c->policy;
    rc.store = c->remote;
    rc.on_store_error = RATE_FAIL_CLOSED;
    int r = rate_limiter_new(&rc, &s->remote);
    if (r != RATE_OK) {
        set_err(err, errlen, r == RATE_EPOLICY
                                 ? "the remote store cannot keep the policy"
                                 : rate_strerror(r));
        return r;
    }
    if (c->on_store_error == RATE_FAIL_FALLBACK) {
        rate_limiter_config_t fc = {0};
        fc.policy = c->policy;
        r = rate_limiter_new(&fc, &s->fallback);
        if (r != RATE_OK) {
            set_err(err, errlen, rate_strerror(r));
            return r;
        }
    }
    return RATE_OK;
}

/* The shards: as many as SHARDS_MAX, fewer for a small max_keys, each
 * keeping max_keys / shards keys (0: no bound). */
static int make_shards(rate_synced_t *s, size_t max_keys, char *err,
                       size_t errlen)
{
    unsigned n = SHARDS_MAX;
    if (max_keys != 0)
        while (n > 1 && n > max_keys)
            n /= 2;
    s->nshards = n;
    s->shard_cap = max_keys != 0 ? max_keys / n : 0;
    s->shards = calloc(n, sizeof *s->shards);
    if (s->shards == NULL) {
        set_err(err, errlen, "out of memory");
        return RATE_ENOMEM;
    }
    for (unsigned i = 0; i < n; i++) {
        shard_t *sh = &s->shards[i];
        pthread_mutex_init(&sh->mu, NULL);
        pthread_cond_init(&sh->cv, NULL);
        sh->nbuckets = 16;
        sh->buckets = calloc(sh->nbuckets, sizeof *sh->buckets);
        if (sh->buckets == NULL) {
            s->nshards = i + 1;
            set_err(err, errlen, "out of memory");
            return RATE_ENOMEM;
        }
    }
    return RATE_OK;
}

/* The refiller (with prefetch, a lease of 2 or more) and the sweeper
 * (with sweep_ns). */
static int start_threads(rate_synced_t *s, bool prefetch, char *err,
                         size_t errlen)
{
    if (prefetch && s->lease >= 2) {
        if (pthread_create(&s->refiller, NULL, refill_main, s) != 0) {
            set_err(err, errlen, "cannot start the refiller thread");
            return RATE_ENOMEM;
        }
        s->refilling = true;
        s->prefetch = true;
    }
    if (s->sweep_ns != 0) {
        if (pthread_create(&s->sweeper, NULL, sweep_main, s) != 0) {
            set_err(err, errlen, "cannot start the sweeper thread");
            return RATE_ENOMEM;
        }
        s->sweeping = true;
    }
    return RATE_OK;
}

int rate_synced_new(const rate_synced_config_t *c, rate_synced_t **out,
                    char *err, size_t errlen)
{
    if (out != NULL)
        *out = NULL;
    if (c == NULL || out == NULL) {
        set_err(err, errlen, "no config or out (NULL)");
        return RATE_EINVAL;
    }
    uint64_t lease;
    bool refundable;
    int r = check_config(c, &lease, &refundable, err, errlen);
    if (r != RATE_OK)
        return r;

    rate_synced_t *s = calloc(1, sizeof *s);
    if (s == NULL) {
        set_err(err, errlen, "out of memory");
        return RATE_ENOMEM;
    }
    pthread_mutex_init(&s->sweep_mu, NULL);
    pthread_cond_init(&s->sweep_cv, NULL);
    pthread_mutex_init(&s->q_mu, NULL);
    pthread_cond_init(&s->q_cv, NULL);
    if ((r = make_limiters(s, c, err, errlen)) != RATE_OK) {
        rate_synced_free(s);
        return r;
    }
    s->policy = rate_limiter_policy(s->remote);
    s->lease = lease;
    s->ttl_ns = c->lease_ttl_ns != 0 ? c->lease_ttl_ns : TTL_DEFAULT;
    s->retry_ns = c->retry_ns != 0 ? c->retry_ns : RETRY_DEFAULT;
    s->sweep_ns = c->sweep_ns;
    s->denial_ttl_ns = c->denial_ttl_ns;
    s->fail = c->on_store_error;
    s->refundable = refundable;
    s->limit0 = capacity_of(rate_policy_limit(s->policy, 0));
    s->seed = (XXH64_hash_t)(uintptr_t)s ^ rate_clock_monotonic_ns();
    if ((r = make_shards(s, c->max_keys, err, errlen)) != RATE_OK ||
        (r = start_threads(s, c->prefetch, err, errlen)) != RATE_OK) {
        rate_synced_free(s);
        return r;
    }
    *out = s;
    return RATE_OK;
}

/* ----------------------------------------------------------- figures */

int rate_synced_stats(rate_synced_t *s, rate_synced_stats_t *out)
{
    if (s == NULL || out == NULL)
        return RATE_EINVAL;
    memset(out, 0, sizeof *out);
    for (unsigned i = 0; i < s->nshards; i++) {
        shard_t *sh = &s->shards[i];
        pthread_mutex_lock(&sh->mu);
        out->decisions += sh->decisions;
        out->local += sh->local;
        out->allowed += sh->allowed;
        out->denied += sh->denied;
        out->borrowed += sh->borrowed;
        out->held += sh->held;
        out->keys += sh->count;
        out->evictions += sh->evictions;
        pthread_mutex_unlock(&sh->mu);
    }
#define LOAD_(f) atomic_load_explicit(&s->f, memory_order_relaxed)
    out->decisions += LOAD_(decisions);
    out->allowed += LOAD_(allowed);
    out->denied += LOAD_(denied);
    out->round_trips = LOAD_(round_trips);
    out->remote_errors = LOAD_(remote_errors);
    out->fail_mode = LOAD_(fail_mode);
    out->returned = LOAD_(returned);
    out->lost = LOAD_(lost);
#undef LOAD_
    return RATE_OK;
}

uint64_t rate_synced_lease(const rate_synced_t *s)
{
    return s != NULL ? s->lease : 0;
}
