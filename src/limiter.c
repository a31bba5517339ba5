/* SPDX-License-Identifier: MIT */
/*
 * The limiter: the strategy front over a store.
 *
 * A decision has three parts.  Before the store: check the input, pick the
 * key's policy (the resolver or the default) and its tag in the store
 * (src/registry.c), read the clock once (unless the caller gave the time).
 * The store's part, through the public contract (ratelimit_store.h): the
 * bool calls try the store's acquire() first; then decide(), if the store
 * has it; then the pure step of src/step.c, run by the store's update() or
 * between its load() and cas().  After the store: a state of a policy the
 * limiter does not know yet is learnt from the store's records and the
 * store's part run again; a failure takes the fail mode; shadow mode lets
 * the request through; the verdict is counted.
 *
 * No lock is taken on the decision path but the store's own; the book of
 * known policies takes its mutex only when it learns one, and never while
 * a store holds a lock.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>

#include "registry.h"
#include "step.h"

#define DEFAULT_RETRIES 64u
#define LEARN_ROUNDS 4u /* policies learnt for one decision, at most */
#define TALLY_CACHE 4u  /* limiters a thread counts for without a lookup */

/* One thread's count of one limiter's verdicts: written by that thread
 * alone (plain relaxed stores, no read-modify-write on a shared line),
 * summed by rate_limiter_stats.  A limiter keeps its threads' tallies in a
 * list until it is freed; a thread finds its own through a small cache. */
typedef struct tally {
    atomic_uint_fast64_t allowed, denied;
    struct tally *next;
    pthread_t thread;
} tally_t;

static atomic_uint_fast64_t next_limiter_id = 1;

#if defined(__GNUC__)
#define TLS_FAST __attribute__((tls_model("initial-exec")))
#else
#define TLS_FAST
#endif
static _Thread_local struct {
    uint64_t id[TALLY_CACHE];
    tally_t *tally[TALLY_CACHE];
} tls_tallies TLS_FAST;

/* A default policy and its tag in the store (0 until it is known).
 * Replaced plans are kept until the limiter is freed: a decision may still
 * be using one. */
typedef struct plan {
    rate_policy_t policy;
    _Atomic uint32_t tag;
    /* What the bool calls ask of the store's acquire(), without and with a
     * horizon; set once the tag is known when the bool calls may try
     * acquire() (fast says so), then published by `fast`. */
    rate_acquire_t acq[2];
    _Atomic bool fast;
    /* The limiter's time from which the tag's record is checked again
     * (RATE__RECHECK_NS: a store may lose it); the bool calls' fast path,
     * on stores that keep their records, does not look. */
    _Atomic uint64_t recheck_at;
    struct plan *older;
} plan_t;

struct rate_limiter {
    /* The decision path's fields first, in the order that keeps them in
     * the first cache line (low_water starts the second). */
    const rate_store_methods_t *m; /* the store's, for the hot path */
    void *self;
    rate_listen_fn listen; /* NULL: none */
    bool fast;      /* the bool calls may try m->acquire */
    bool check_policy; /* the store has check_policy: a resolver's
                          policies are checked at each decision */
    uint8_t format; /* written: RATE__FORMAT, or the first edition's */
    bool shadow;
    rate_space_t space;
    rate_clock_t clock;
    _Atomic(plan_t *) plan;
    _Atomic uint64_t low_water; /* 0: none given */

    rate_store_t *store;
    bool own_store;
    rate__book_t book;
    rate_store_t *fallback; /* RATE_FAIL_FALLBACK: the insurance store */
    rate__book_t fb_book;
    rate_resolve_fn resolve;
    void *resolve_ud;
    void *listen_ud;
    rate_fail_mode_t fail_mode;
    unsigned max_retries;
    pthread_mutex_t plan_lock; /* replacing the plan; adding a tally */
    uint64_t id;               /* never reused, unlike the address */
    tally_t *_Atomic tallies;

    atomic_uint_fast64_t retries, store_errors;
};
_Static_assert(offsetof(struct rate_limiter, plan) + sizeof(void *) <= 64,
               "the decision path's fields fit one cache line");

uint64_t rate_limiter_id(const rate_limiter_t *lim)
{
    return lim == NULL ? 0 : lim->id;
}

const rate_clock_t *rate_limiter_clock(const rate_limiter_t *lim)
{
    return lim == NULL ? NULL : &lim->clock;
}

rate_store_t *rate_limiter_store(const rate_limiter_t *lim)
{
    return lim == NULL ? NULL : lim->store;
}

/* Here, not in store.c: the step's objects (the Redis module's) have no
 * memory or shared-memory store. */
bool rate_store_is_host_local(const rate_store_t *store)
{
    return store != NULL && rate__store_is_host_local(store);
}

/* The limiter's clock; the library's own read without the indirect call. */
static inline uint64_t clock_now(const rate_limiter_t *lim)
{
    if (lim->clock.now_ns == rate__clock_exact)
        return rate_clock_monotonic_ns();
    return lim->clock.now_ns(lim->clock.ud);
}

/* The calling thread's tally for lim: found in the list, or added. */
static __attribute__((noinline)) tally_t *tally_find(rate_limiter_t *lim)
{
    pthread_t me = pthread_self();
    tally_t *t;

    for (t = atomic_load_explicit(&lim->tallies, memory_order_acquire);
         t != NULL && !pthread_equal(t->thread, me); t = t->next)
        ;
    if (t == NULL && (t = calloc(1, sizeof *t)) != NULL) {
        t->thread = me;
        pthread_mutex_lock(&lim->plan_lock);
        t->next = atomic_load_explicit(&lim->tallies, memory_order_relaxed);
        atomic_store_explicit(&lim->tallies, t, memory_order_release);
        pthread_mutex_unlock(&lim->plan_lock);
    }
    if (t != NULL) { /* first in the cache; the last entry goes */
        memmove(&tls_tallies.id[1], &tls_tallies.id[0],
                (TALLY_CACHE - 1) * sizeof tls_tallies.id[0]);
        memmove(&tls_tallies.tally[1], &tls_tallies.tally[0],
                (TALLY_CACHE - 1) * sizeof tls_tallies.tally[0]);
        tls_tallies.id[0] = lim->id;
        tls_tallies.tally[0] = t;
    }
    return t;
}

static inline void bump(atomic_uint_fast64_t *c)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

/* The thread's tally for lim: the cache's first entry is the last one
 * used, so a thread that keeps to one limiter reads one entry. */
static inline tally_t *tally_of(rate_limiter_t *lim)
{
    if (__builtin_expect(tls_tallies.id[0] == lim->id, 1))
        return tls_tallies.tally[0];
    for (unsigned i = 1; i < TALLY_CACHE; i++)
        if (tls_tallies.id[i] == lim->id) {
            tally_t *t = tls_tallies.tally[i];
            tls_tallies.id[i] = tls_tallies.id[0];
            tls_tallies.tally[i] = tls_tallies.tally[0];
            tls_tallies.id[0] = lim->id;
            tls_tallies.tally[0] = t;
            return t;
        }
    return tally_find(lim);
}

static inline void count_verdict(rate_limiter_t *lim, bool allowed)
{
    tally_t *t = tally_of(lim);

    if (t != NULL) /* NULL: out of memory, this verdict goes uncounted */
        bump(allowed ? &t->allowed : &t->denied);
}

/* Tells the listener of a decision (its caller has checked that there is
 * one): kept out of line, so that a limiter without one pays a load and a
 * branch on the decision path and nothing else. */
static __attribute__((noinline)) void tell(rate_limiter_t *lim,
                                           const rate_policy_t *p,
                                           const char *key, size_t key_len,
                                           bool allowed,
                                           const rate_decision_t *d)
{
    /* Without a record (the bool calls' fast path) `allowed` is the
     * store's verdict, before shadow mode. */
    bool shadow = d != NULL ? d->shadow : !allowed && lim->shadow;
    rate_event_t ev = {key,
                       key_len,
                       p,
                       p->name,
                       allowed || shadow,
                       shadow,
                       d != NULL ? d->reason
                                 : allowed ? RATE_REASON_ALLOWED
                                           : RATE_REASON_LIMITED,
                       d != NULL && d->reason == RATE_REASON_STORE_ERROR
                           ? d->error
                           : 0,
                       d};
    lim->listen(lim->listen_ud, &ev);
}

/* ------------------------------------------------------------ lifecycle */

static plan_t *plan_new(const rate_policy_t *p)
{
    plan_t *pl = calloc(1, sizeof *pl);

    if (pl != NULL) {
        memcpy(&pl->policy, p, sizeof *p);
        atomic_init(&pl->tag, 0);
        atomic_init(&pl->fast, false);
        atomic_init(&pl->recheck_at, 0);
    }
    return pl;
}

/* A policy whose record the store must be asked for first, by a caller
 * that does not wait (the asynchronous calls): not a RATE_E* code. */
#define NEED_RECORD 2

/* The tag of states made under p in `book`'s store, in the limiter's
 * format: the policy's id there (found or made; with !wait, NEED_RECORD
 * when that takes the store's I/O), or its fingerprint in the first
 * edition's format. */
static int tag_of(rate_limiter_t *lim, rate__book_t *book,
                  const rate_policy_t *p, uint32_t *tag, bool wait,
                  uint64_t now)
{
    int rc = !wait && !rate__book_known_id(book, p, tag, now)
                 ? NEED_RECORD
                 : rate__book_id(book, p, tag, now);

    if (rc == RATE_OK && lim->format == RATE__FORMAT_V1 && book == &lim->book)
        *tag = p->fingerprint;
    return rc;
}

/* The default plan's tag, known once and then read without a lock. */
static int plan_tag(rate_limiter_t *lim, plan_t *pl, uint32_t *tag,
                    bool wait, uint64_t now)
{
    *tag = atomic_load_explicit(&pl->tag, memory_order_acquire);
    if (*tag != 0) {
        /* Due: one caller has the book check the record again (the tag
         * stays: the record is found, or written again where lost). */
        if (!rate__recheck_claim(&pl->recheck_at, now))
            return RATE_OK;
        if (!wait)
            return NEED_RECORD; /* through the store, before the decision */
        (void)rate__book_rewrite(&lim->book, &pl->policy);
        return RATE_OK;
    }
    int rc = tag_of(lim, &lim->book, &pl->policy, tag, wait, now);
    if (rc != RATE_OK)
        return rc;
    /* Published once, by the first thread to get here (others that looked
     * the tag up meanwhile found the same one), under the lock, so that
     * acq is written once, before `fast` says it may be read. */
    pthread_mutex_lock(&lim->plan_lock);
    if (atomic_load_explicit(&pl->tag, memory_order_relaxed) == 0) {
        /* acquire() only for a policy rate_state_acquire can decide (one
         * limit of a fixed size): for any other it would be asked, only to
         * decline every key, before the general path asks again. */
        if (lim->fast && pl->policy.plain != NULL) {
            for (int h = 0; h < 2; h++)
                pl->acq[h] = (rate_acquire_t){&pl->policy, *tag, lim->format,
                                              lim->space, h == 1};
            atomic_store_explicit(&pl->fast, true, memory_order_release);
        }
        atomic_store_explicit(&pl->recheck_at, rate__recheck_next(now),
                              memory_order_relaxed);
        atomic_store_explicit(&pl->tag, *tag, memory_order_release);
    }
    pthread_mutex_unlock(&lim->plan_lock);
    return RATE_OK;
}

int rate_limiter_new(const rate_limiter_config_t *cfg, rate_limiter_t **out)
{
    rate_limiter_t *lim;
    int rc;

    if (out == NULL)
        return RATE_EINVAL;
    *out = NULL;
    if (cfg == NULL || cfg->policy == NULL || !RATE__RESERVED_ZERO(cfg))
        return RATE_EINVAL;
    if (cfg->on_store_error != RATE_FAIL_CLOSED &&
        cfg->on_store_error != RATE_FAIL_OPEN &&
        cfg->on_store_error != RATE_FAIL_FALLBACK)
        return RATE_EINVAL;
    if (cfg->clock != NULL &&
        (cfg->clock->now_ns == NULL || cfg->clock->sleep_ns == NULL))
        return RATE_EINVAL;
    lim = calloc(1, sizeof *lim);
    if (lim == NULL)
        return RATE_ENOMEM;
    pthread_mutex_init(&lim->plan_lock, NULL);
    lim->id = atomic_fetch_add_explicit(&next_limiter_id, 1,
                                        memory_order_relaxed);
    atomic_init(&lim->tallies, NULL);
    plan_t *pl = plan_new(cfg->policy);
    atomic_init(&lim->plan, pl);
    atomic_init(&lim->low_water, 0);
    lim->resolve = cfg->resolve;
    lim->resolve_ud = cfg->resolve_ud;
    lim->listen = cfg->listener;
    lim->listen_ud = cfg->listener_ud;
    lim->clock = cfg->clock != NULL
                     ? *cfg->clock
                     : (rate_clock_t){rate__clock_exact, rate__clock_sleep,
                                      NULL};
    lim->shadow = cfg->shadow;
    lim->space = cfg->shadow && !cfg->shadow_shares_state ? RATE_SPACE_SHADOW
                                                          : RATE_SPACE_STATE;
    lim->format = cfg->first_edition_format ? RATE__FORMAT_V1 : RATE__FORMAT;
    lim->fail_mode = cfg->on_store_error;
    lim->max_retries = cfg->max_retries ? cfg->max_retries : DEFAULT_RETRIES;
    lim->store = cfg->store;
    rc = pl == NULL ? RATE_ENOMEM : RATE_OK;
    if (rc == RATE_OK && lim->store == NULL) {
        lim->own_store = true;
        rc = rate_store_memory_new(NULL, &lim->store);
    }
    /* A store whose values have a bound refuses a policy whose states
     * could pass it, now rather than at the request that would. */
    if (rc == RATE_OK)
        rc = rate_store_check_policy(lim->store, cfg->policy, NULL, 0);
    if (rc == RATE_OK)
        rc = rate__book_init(&lim->book, lim->store, lim->max_retries);
    if (rc == RATE_OK && lim->fail_mode == RATE_FAIL_FALLBACK &&
        (rc = rate_store_memory_new(NULL, &lim->fallback)) == RATE_OK)
        rc = rate__book_init(&lim->fb_book, lim->fallback, lim->max_retries);
    if (rc != RATE_OK) {
        rate_limiter_free(lim);
        return rc;
    }
    lim->m = lim->store->m;
    lim->self = lim->store->self;
    lim->fast = lim->m->acquire != NULL && lim->resolve == NULL;
    lim->check_policy = lim->m->version >= 3 && lim->m->check_policy != NULL;
    /* Learn the default policy's tag now if the store answers; else the
     * first decision does (a store that is down now is the fail mode's).
     * Not with a store that completes later (an event loop's): its first
     * decision registers it, through the store, without waiting. */
    uint32_t tag;
    if (lim->m->start == NULL)
        (void)plan_tag(lim, pl, &tag, true, clock_now(lim));
    *out = lim;
    return RATE_OK;
}

void rate_limiter_free(rate_limiter_t *lim)
{
    if (lim == NULL)
        return;
    if (lim->book.store != NULL) /* set by rate__book_init */
        rate__book_free(&lim->book);
    if (lim->fb_book.store != NULL)
        rate__book_free(&lim->fb_book);
    if (lim->own_store)
        rate_store_free(lim->store);
    rate_store_free(lim->fallback);
    for (tally_t *t = atomic_load(&lim->tallies); t != NULL;) {
        tally_t *next = t->next;
        free(t);
        t = next;
    }
    for (plan_t *pl = atomic_load(&lim->plan); pl != NULL;) {
        plan_t *older = pl->older;
        free(pl);
        pl = older;
    }
    pthread_mutex_destroy(&lim->plan_lock);
    free(lim);
}

const rate_policy_t *rate_limiter_policy(const rate_limiter_t *lim)
{
    if (lim == NULL)
        return NULL;
    return &atomic_load_explicit(&((rate_limiter_t *)lim)->plan,
                                 memory_order_acquire)
                ->policy;
}

int rate_limiter_set_policy(rate_limiter_t *lim, const rate_policy_t *policy)
{
    if (lim == NULL || policy == NULL)
        return RATE_EINVAL;
    int rc = rate_store_check_policy(lim->store, policy, NULL, 0);
    if (rc != RATE_OK)
        return rc;
    plan_t *pl = plan_new(policy);
    if (pl == NULL)
        return RATE_ENOMEM;
    pthread_mutex_lock(&lim->plan_lock);
    pl->older = atomic_load_explicit(&lim->plan, memory_order_relaxed);
    atomic_store_explicit(&lim->plan, pl, memory_order_release);
    pthread_mutex_unlock(&lim->plan_lock);
    uint32_t tag;
    if (lim->m->start == NULL) /* as at creation: now if it can */
        (void)plan_tag(lim, pl, &tag, true, clock_now(lim));
    return RATE_OK;
}

int rate_limiter_set_low_water(rate_limiter_t *lim, uint64_t t_ns)
{
    if (lim == NULL)
        return RATE_EINVAL;
    if (t_ns > RATE_TIME_MAX)
        return RATE_ERANGE;
    uint64_t cur = atomic_load_explicit(&lim->low_water, memory_order_relaxed);
    while (t_ns > cur &&
           !atomic_compare_exchange_weak_explicit(&lim->low_water, &cur, t_ns,
                                                  memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
    return RATE_OK;
}

/* ------------------------------------------------------------ decisions */

/* The horizon a request gives the store (rate_step_t.horizon_ns). */
static inline uint64_t horizon(const rate_limiter_t *lim, uint64_t now,
                               bool clock_time)
{
    return clock_time ? now
                      : atomic_load_explicit(&((rate_limiter_t *)lim)->low_water,
                                             memory_order_relaxed);
}

/* Whether a store's decide() is asked for op: a decision whenever it has
 * one; a refund or a penalty only when its table says it makes them
 * (decide_changes, version 4: any other decide() knows no op). */
static inline bool asks_decide(const rate_store_methods_t *m, rate__op_t op)
{
    return m->decide != NULL &&
           (op == RATE__OP_DECIDE || (m->version >= 4 && m->decide_changes));
}

/* The store's part of a decision on `store` (the limiter's, or the
 * fallback), with the policies of its `book`: decide() if the store has it,
 * else the step; a state of an unknown policy is learnt and the step run
 * again. */
static RATE__ALWAYS_INLINE int store_part(rate_limiter_t *lim, rate_store_t *store,
                      rate__book_t *book, const rate_key_t *key,
                      rate__step_arg_t *arg, uint64_t now, bool clock_time)
{
    const rate_policy_t *p = arg->policy;
    int rc = RATE_ENOTSUP;

    if (asks_decide(store->m, arg->op)) {
        rate_decide_req_t req = {p,
                                 arg->policy_id,
                                 arg->format,
                                 now,
                                 clock_time,
                                 arg->permits,
                                 arg->max_wait_ns,
                                 arg->detail,
                                 p->max_reset_ns,
                                 horizon(lim, now, clock_time),
                                 (rate_decide_op_t)arg->op};
        rc = store->m->decide(store->self, key, &req, arg->decision);
        if (rc != RATE_ENOTSUP)
            return rc;
    }
    /* Decided here (decide() declined, or the store has none, or this is
     * no decision): by the store's clock if it keeps one. */
    uint64_t t;
    if (clock_time && store->m->now != NULL &&
        store->m->now(store->self, &t) == RATE_OK && t <= RATE_TIME_MAX)
        arg->now_ns = now = t;
    rate_step_t st = {rate__step, arg, p->grow, now,
                      horizon(lim, now, clock_time), rate__is_cold};
    for (unsigned round = 0;; round++) {
        unsigned retries = 0;
        rc = rate__store_step(store, key, &st, lim->max_retries, &retries);
        if (retries != 0)
            atomic_fetch_add_explicit(&lim->retries, retries,
                                      memory_order_relaxed);
        if (rc != RATE__NEED_POLICY)
            return rc;
        if (round == LEARN_ROUNDS)
            return RATE_ECORRUPT;
        if ((rc = rate__book_learn(book, arg->need_format, arg->need_tag)) !=
            RATE_OK)
            return rc == RATE_EKEY ? RATE_ESTORE : rc; /* a record's key */
    }
}

/* The key's policy (the resolver's, else the default) and its tag in the
 * store; a store error when the tag had to be looked up and could not
 * (with !wait: NEED_RECORD when it has to be). */
static int policy_for(rate_limiter_t *lim, const rate_policy_t *force,
                      const char *key, size_t key_len,
                      const rate_policy_t **p, uint32_t *tag, bool wait,
                      uint64_t now)
{
    *p = NULL;
    *tag = 0;
    /* The rules' policy (rate__limiter_decide_policy), else a resolver's:
     * each checked against the store as it comes. */
    if ((*p = force) != NULL ||
        (lim->resolve != NULL &&
         (*p = lim->resolve(lim->resolve_ud, key, key_len)) != NULL)) {
        if ((*p)->unlimited)
            return RATE_OK;
        int rc;
        if (lim->check_policy &&
            (rc = rate_store_check_policy(lim->store, *p, NULL, 0)) != RATE_OK)
            return rc;
        return tag_of(lim, &lim->book, *p, tag, wait, now);
    }
    plan_t *pl = atomic_load_explicit(&lim->plan, memory_order_acquire);
    *p = &pl->policy;
    return pl->policy.unlimited ? RATE_OK
                                : plan_tag(lim, pl, tag, wait, now);
}

/* Before the store: the input checked (RATE_E* for bad input), the step's
 * argument made; *store_rc is the store's error if the policy's tag could
 * not be had (the fail mode's then). */
static RATE__ALWAYS_INLINE int prepare(rate_limiter_t *lim,
                   const rate_policy_t *force, const char *key, size_t key_len,
                   uint64_t permits, uint64_t max_wait, uint64_t now,
                   bool detail, rate__op_t op, rate_decision_t *d,
                   rate__step_arg_t *arg, int *store_rc, bool wait)
{
    const rate_policy_t *p;
    uint32_t tag;

    if (key == NULL || key_len == 0 || key_len > RATE_KEY_MAX ||
        rate__key_reserved(key, key_len))
        return RATE_EKEY;
    if (permits > RATE_TIME_MAX || max_wait > RATE_TIME_MAX ||
        now > RATE_TIME_MAX)
        return RATE_ERANGE;
    *store_rc = policy_for(lim, force, key, key_len, &p, &tag, wait, now);
    if (*store_rc == RATE_EKEY) /* the library's record key, not the call's */
        *store_rc = RATE_ESTORE;
    *arg = (rate__step_arg_t){p,   tag,     lim->format, &lim->book.known,
                              now, permits, max_wait,    detail,
                              op,  d,       0,           0};
    return RATE_OK;
}

/* After the store: a failure takes the fail mode (the fallback store
 * decides, at the limiter's own time), the verdict is counted, shadow
 * mode lets it through. */
static RATE__ALWAYS_INLINE void finish(rate_limiter_t *lim, rate__step_arg_t *arg,
                   const rate_key_t *k, uint64_t now, bool clock_time, int rc)
{
    rate_decision_t *d = arg->decision;

    if (rc != RATE_OK) {
        atomic_fetch_add_explicit(&lim->store_errors, 1, memory_order_relaxed);
        memset(d, 0, sizeof *d); /* the failed store may have filled part */
        int fb = RATE_ESTORE;
        if (lim->fallback != NULL) {
            /* The fallback keeps the limiter's own clock and its own
             * policy ids. */
            arg->known = &lim->fb_book.known;
            arg->format = RATE__FORMAT;
            arg->now_ns = now;
            fb = rate__book_id(&lim->fb_book, arg->policy, &arg->policy_id,
                               now);
            if (fb == RATE_OK)
                fb = store_part(lim, lim->fallback, &lim->fb_book, k, arg,
                                now, clock_time);
        }
        if (fb != RATE_OK) {
            memset(d, 0, sizeof *d);
            d->allowed = lim->fail_mode == RATE_FAIL_OPEN;
            d->component = -1;
        }
        d->reason = RATE_REASON_STORE_ERROR; /* the verdict is the fallback's */
        d->error = rc;
    }
    count_verdict(lim, d->allowed);
    if (!d->allowed && lim->shadow) {
        d->allowed = true;
        d->shadow = true;
        d->retry_after_ns = d->reason == RATE_REASON_NEVER ? RATE_NEVER : 0;
    }
    if (lim->listen != NULL)
        tell(lim, arg->policy, k->bytes, k->len, d->allowed, d);
}

static RATE__ALWAYS_INLINE int decide_in(rate_limiter_t *lim,
                                         const rate_policy_t *force,
                                         const char *key,
                                         size_t key_len, uint64_t permits,
                                         uint64_t max_wait, uint64_t now,
                                         bool clock_time, bool detail,
                                         rate_decision_t *d)
{
    rate__step_arg_t arg;
    int rc, store_rc = RATE_OK;

    if (d != NULL)
        memset(d, 0, sizeof *d);
    if (lim == NULL || d == NULL)
        return RATE_EINVAL;
    rc = prepare(lim, force, key, key_len, permits, max_wait, now, detail,
                 RATE__OP_DECIDE, d, &arg, &store_rc, true);
    if (rc != RATE_OK)
        return rc;
    if (arg.policy->unlimited) { /* no store, no record: always allowed */
        rate__unlimited_decision(d);
        count_verdict(lim, true);
        if (lim->listen != NULL)
            tell(lim, arg.policy, key, key_len, true, d);
        return RATE_OK;
    }
    rate_key_t k = {key, key_len, lim->space};
    if (store_rc == RATE_OK)
        store_rc = store_part(lim, lim->store, &lim->book, &k, &arg, now,
                              clock_time);
    if (store_rc == RATE_EKEY) { /* the caller's key, too long for it */
        memset(d, 0, sizeof *d);
        return RATE_EKEY;
    }
    finish(lim, &arg, &k, now, clock_time, store_rc);
    return RATE_OK;
}

/* A decision: every store request in it (the policy's record, the
 * decision or its load and compare-and-set retried, the store's clock)
 * shares one deadline, counted from its first request (call.h,
 * rate__call_begin). */
static RATE__ALWAYS_INLINE int decide(rate_limiter_t *lim,
                                      const rate_policy_t *force,
                                      const char *key,
                                      size_t key_len, uint64_t permits,
                                      uint64_t max_wait, uint64_t now,
                                      bool clock_time, bool detail,
                                      rate_decision_t *d)
{
    uint64_t scope = rate__call_begin();
    int rc = decide_in(lim, force, key, key_len, permits, max_wait, now,
                       clock_time, detail, d);
    rate__call_end(scope);
    return rc;
}

/* rate_limiter_decide_req (ratelimit_store.h): what store_part() would ask
 * the store's decide() for one permit, without asking it. */
int rate_limiter_decide_req(rate_limiter_t *lim, const char *key, size_t len,
                            uint64_t now, bool clock_time, bool wait,
                            rate_decide_req_t *req)
{
    rate__step_arg_t arg;
    rate_decision_t d;
    int store_rc = RATE_OK;

    if (req == NULL)
        return RATE_EINVAL;
    if (lim == NULL || lim->space != RATE_SPACE_STATE)
        return RATE_ENOTSUP;
    if (!wait) {
        /* Not even claiming a due recheck of the record: the limiter's
         * own call, which the caller falls back to, makes it through the
         * loop. */
        plan_t *pl = atomic_load_explicit(&lim->plan, memory_order_acquire);
        if (lim->resolve == NULL &&
            atomic_load_explicit(&pl->tag, memory_order_acquire) != 0 &&
            now >= atomic_load_explicit(&pl->recheck_at,
                                        memory_order_relaxed))
            return RATE_ENOTSUP;
    }
    if (prepare(lim, NULL, key, len, 1, 0, now, true, RATE__OP_DECIDE, &d,
                &arg, &store_rc, wait) != RATE_OK ||
        store_rc != RATE_OK || arg.policy->unlimited)
        return RATE_ENOTSUP;
    *req = (rate_decide_req_t){arg.policy,
                               arg.policy_id,
                               arg.format,
                               now,
                               clock_time,
                               1,
                               0,
                               true,
                               arg.policy->max_reset_ns,
                               horizon(lim, now, clock_time),
                               RATE_DECIDE_ACQUIRE};
    return RATE_OK;
}

/* The bool calls' general path: the full decision, for any request. */
static __attribute__((noinline)) bool try_general(rate_limiter_t *lim,
                                                  const char *key, size_t len,
                                                  uint64_t permits,
                                                  uint64_t now,
                                                  bool clock_time)
{
    rate_decision_t d;

    return decide(lim, NULL, key, len, permits, 0, now, clock_time, false, &d) ==
               RATE_OK &&
           d.allowed;
}

/* The bool calls: the store's acquire() first, when it has one and every
 * key has the default policy (the plan says so); anything it declines,
 * and bad input, takes the general path (which reports bad input as
 * false). */
static RATE__ALWAYS_INLINE bool try_acquire(rate_limiter_t *lim,
                                            const char *key, size_t len,
                                            uint64_t permits, uint64_t now,
                                            bool clock_time)
{
    if (lim == NULL)
        return false;
    if (clock_time)
        now = clock_now(lim);
    plan_t *pl = atomic_load_explicit(&lim->plan, memory_order_acquire);
    if (!atomic_load_explicit(&pl->fast, memory_order_acquire) ||
        key == NULL || len - 1 >= RATE_KEY_MAX ||
        (unsigned char)key[0] == 0xff || /* perhaps reserved */
        (permits | now) > RATE_TIME_MAX)
        return try_general(lim, key, len, permits, now, clock_time);
    const rate_acquire_t *req = &pl->acq[horizon(lim, now, clock_time) != 0];
    int v = lim->m->acquire(lim->self, req, key, len, permits, now);
    if (v < 0)
        return try_general(lim, key, len, permits, now, clock_time);
    count_verdict(lim, v);
    if (lim->listen != NULL)
        tell(lim, &pl->policy, key, len, v, NULL);
    return v | lim->shadow;
}

/* A C string's length, measured no further than one byte past the
 * longest key (0 for NULL, which the checks then refuse). */
static inline size_t cstr_len(const char *key)
{
    return key != NULL ? strnlen(key, RATE_KEY_MAX + 1) : 0;
}

bool rate_try_acquire(rate_limiter_t *lim, const char *key, uint64_t permits)
{
    return try_acquire(lim, key, cstr_len(key), permits, 0, true);
}

bool rate_try_acquire_at(rate_limiter_t *lim, const char *key,
                         uint64_t permits, uint64_t now_ns)
{
    return try_acquire(lim, key, cstr_len(key), permits, now_ns, false);
}

bool rate_try_acquire_len(rate_limiter_t *lim, const char *key,
                          size_t key_len, uint64_t permits)
{
    return try_acquire(lim, key, key_len, permits, 0, true);
}

bool rate_try_acquire_len_at(rate_limiter_t *lim, const char *key,
                             size_t key_len, uint64_t permits,
                             uint64_t now_ns)
{
    return try_acquire(lim, key, key_len, permits, now_ns, false);
}

int rate_limiter_check(rate_limiter_t *lim, const char *key, size_t key_len,
                       uint64_t permits, uint64_t max_wait_ns,
                       rate_decision_t *out)
{
    if (lim == NULL)
        return decide(NULL, NULL, key, key_len, permits, max_wait_ns, 0, true,
                      true, out);
    return decide(lim, NULL, key, key_len, permits, max_wait_ns, clock_now(lim),
                  true, true, out);
}

int rate_limiter_check_at(rate_limiter_t *lim, const char *key,
                          size_t key_len, uint64_t permits,
                          uint64_t max_wait_ns, uint64_t now_ns,
                          rate_decision_t *out)
{
    return decide(lim, NULL, key, key_len, permits, max_wait_ns, now_ns, false, true,
                  out);
}

int rate_limiter_acquire(rate_limiter_t *lim, const char *key, size_t key_len,
                         uint64_t permits, uint64_t timeout_ns,
                         rate_decision_t *out)
{
    uint64_t deadline;
    int rc;

    if (lim == NULL)
        return decide(NULL, NULL, key, key_len, permits, 0, 0, true, true,
                      out);
    if (timeout_ns > RATE_TIME_MAX)
        timeout_ns = RATE_TIME_MAX;
    deadline = rate__sat_add(clock_now(lim), timeout_ns);
    for (;;) {
        uint64_t now = clock_now(lim);
        uint64_t left = deadline > now ? deadline - now : 0;
        /* Buckets reserve up to the deadline; windows ignore max_wait. */
        rc = decide(lim, NULL, key, key_len, permits, left, now, true, true,
                    out);
        if (rc != RATE_OK)
            return rc;
        if (out->allowed) {
            if (out->delay_ns > 0)
                lim->clock.sleep_ns(lim->clock.ud, out->delay_ns);
            return RATE_OK;
        }
        if (out->reason != RATE_REASON_LIMITED || out->retry_after_ns > left)
            return RATE_OK; /* never, a store error, or past the deadline */
        lim->clock.sleep_ns(lim->clock.ud, out->retry_after_ns);
    }
}

/* ---------------------------------------------------------- asynchronous */

/* One asynchronous decision, alive until its callback has run. */
typedef struct async_check {
    rate_job_t job; /* first: the store's done() hands it back */
    rate_limiter_t *lim;
    rate__step_arg_t arg;
    rate_step_t step;
    rate_decide_req_t req;
    rate_decision_t d;
    rate_check_fn cb;
    rate_done_fn adjusted; /* a refund's or a penalty's (cb: NULL) */
    void *ud;
    uint64_t now;
    bool clock_time; /* now is the limiter's clock's (not the caller's) */
    unsigned rounds;
    /* While the starting call runs: where a decision made at once goes
     * (rate_limiter_check_start), instead of the callback; NULL after. */
    rate_decision_t *now_out;
    char key[RATE_KEY_MAX];
} async_check_t;

static void async_done(rate_job_t *job, int rc);

/* Starts the store's part; false when the store did not take it (rc then
 * says what the store's part came to). */
static bool async_start(async_check_t *a, int *rc, bool whole)
{
    rate_store_t *s = a->lim->store;

    a->step = (rate_step_t){rate__step, &a->arg, a->arg.policy->grow, a->now,
                            horizon(a->lim, a->now, a->clock_time),
                            rate__is_cold};
    bool adjust = a->arg.op != RATE__OP_DECIDE;
    a->req = (rate_decide_req_t){a->arg.policy,    a->arg.policy_id,
                                 a->arg.format,    a->now,
                                 a->clock_time,    a->arg.permits,
                                 a->arg.max_wait_ns, !adjust,
                                 a->arg.policy->max_reset_ns,
                                 a->step.horizon_ns,
                                 (rate_decide_op_t)a->arg.op};
    a->job = (rate_job_t){{a->key, a->job.key.len, a->lim->space},
                          &a->step,
                          whole && asks_decide(s->m, a->arg.op) ? &a->req
                                                                : NULL,
                          &a->d,
                          async_done,
                          a,
                          NULL,   /* not a lease */
                          false};
    *rc = s->m->start(s->self, &a->job);
    return *rc == RATE_OK;
}

static void async_end(async_check_t *a, int rc)
{
    if (a->adjusted != NULL) { /* a refund or a penalty: no fail mode */
        a->adjusted(a->ud, rc);
    } else if (rc == RATE_EKEY) { /* the store refused the caller's key */
        memset(&a->d, 0, sizeof a->d);
        a->cb(a->ud, RATE_EKEY, &a->d);
    } else {
        finish(a->lim, &a->arg, &a->job.key, a->now, a->clock_time, rc);
        if (a->now_out != NULL)
            *a->now_out = a->d;
        else
            a->cb(a->ud, RATE_OK, &a->d);
    }
    free(a);
}

/* A policy's record registered (the call's) or learnt (a state's), through
 * the store: the store's part of the decision, then. */
static void async_recorded(void *ud, int rc)
{
    async_check_t *a = ud;

    if (rc == RATE_OK && a->arg.policy_id == 0)
        rc = tag_of(a->lim, &a->lim->book, a->arg.policy, &a->arg.policy_id,
                    false, a->now); /* known now */
    if (rc == RATE_OK) {
        memset(&a->d, 0, sizeof a->d);
        if (async_start(a, &rc, true))
            return;
    }
    async_end(a, rc == RATE_EKEY ? RATE_ESTORE : rc); /* a record's key */
}

static void async_done(rate_job_t *job, int rc)
{
    async_check_t *a = (async_check_t *)job; /* job is its first member */

    /* A state of a policy not known yet: learnt (through the store: its
     * records are read once per policy), then the store's part again. */
    if (rc == RATE__NEED_POLICY && a->rounds++ < LEARN_ROUNDS &&
        (rc = rate__book_learn_start(&a->lim->book, a->arg.need_format,
                                     a->arg.need_tag, async_recorded, a)) ==
            RATE_OK) {
        return;
    } else if (rc == RATE__NEED_POLICY) {
        rc = RATE_ECORRUPT;
    } else if (rc == RATE_ENOTSUP && a->job.req != NULL) {
        /* The store declined the whole decision: the step, then. */
        memset(&a->d, 0, sizeof a->d);
        if (async_start(a, &rc, false))
            return;
    }
    async_end(a, rc);
}

/* The asynchronous call: a decision made at once is written to *now_out
 * and RATE_OK returned; RATE_PENDING means the callback will run later
 * (a->now_out is then NULL: the answer goes to the callback). */
static int check_async(rate_limiter_t *lim, const char *key, size_t key_len,
                       uint64_t permits, uint64_t max_wait_ns, bool clock_time,
                       uint64_t now_ns, rate_decision_t *now_out,
                       rate_check_fn cb, void *ud)
{
    int rc, store_rc = RATE_OK;

    if (lim == NULL || cb == NULL)
        return RATE_EINVAL;
    async_check_t *a = calloc(1, sizeof *a);
    if (a == NULL)
        return RATE_ENOMEM;
    a->lim = lim;
    a->cb = cb;
    a->ud = ud;
    a->now_out = now_out;
    a->clock_time = clock_time;
    a->now = clock_time ? clock_now(lim) : now_ns;
    /* A store that completes later is not waited for, not even for a
     * policy's record (registered first, through the store too). */
    bool later = lim->store->m->start != NULL;
    rc = prepare(lim, NULL, key, key_len, permits, max_wait_ns, a->now, true,
                 RATE__OP_DECIDE, &a->d, &a->arg, &store_rc, !later);
    if (rc != RATE_OK) {
        free(a);
        return rc;
    }
    if (a->arg.policy->unlimited) { /* answered at once, as decide() does */
        rate__unlimited_decision(&a->d);
        count_verdict(lim, true);
        if (lim->listen != NULL)
            tell(lim, a->arg.policy, key, key_len, true, &a->d);
        *now_out = a->d;
        free(a);
        return RATE_OK;
    }
    memcpy(a->key, key, key_len);
    a->job.key.len = key_len;
    a->job.key.bytes = a->key;
    a->job.key.space = lim->space;
    if (store_rc == NEED_RECORD) { /* the policy's record first */
        a->now_out = NULL;
        store_rc = rate__book_id_start(&lim->book, a->arg.policy, a->now,
                                       async_recorded, a);
        if (store_rc == RATE_OK)
            return RATE_PENDING;
        a->now_out = now_out;
        if (store_rc == RATE_EKEY) /* the record's key, not the call's */
            store_rc = RATE_ESTORE;
    } else if (store_rc == RATE_OK) {
        if (!later) { /* a store that answers at once: one deadline */
            uint64_t scope = rate__call_begin();
            store_rc = store_part(lim, lim->store, &lim->book, &a->job.key,
                                  &a->arg, a->now, clock_time);
            rate__call_end(scope);
        } else {
            /* A later answer goes to the callback; the store calls
             * async_done later, never from start(). */
            a->now_out = NULL;
            if (async_start(a, &store_rc, true))
                return RATE_PENDING;
            a->now_out = now_out;
        }
        if (store_rc == RATE_EKEY) { /* as for bad input: no callback */
            free(a);
            return RATE_EKEY;
        }
    }
    async_end(a, store_rc); /* the callback runs (or *now_out is filled) */
    return RATE_OK;
}

int rate_limiter_check_start(rate_limiter_t *lim, const char *key,
                             size_t key_len, uint64_t permits,
                             uint64_t max_wait_ns, rate_decision_t *out,
                             rate_check_fn cb, void *ud)
{
    if (out == NULL)
        return RATE_EINVAL;
    memset(out, 0, sizeof *out);
    return check_async(lim, key, key_len, permits, max_wait_ns, true, 0, out,
                       cb, ud);
}

int rate_limiter_check_start_at(rate_limiter_t *lim, const char *key,
                                size_t key_len, uint64_t permits,
                                uint64_t max_wait_ns, uint64_t now_ns,
                                rate_decision_t *out, rate_check_fn cb,
                                void *ud)
{
    if (out == NULL)
        return RATE_EINVAL;
    memset(out, 0, sizeof *out);
    return check_async(lim, key, key_len, permits, max_wait_ns, false, now_ns,
                       out, cb, ud);
}

/* ------------------------------------------------- outside admissions */

/* A refund or a penalty on key at now, under the key's policy: the
 * store's decide() when its table offers it for changes (decide_changes), else
 * (or when it declines) the step's adjust pass through the store, as a
 * decision goes (no fail mode: the store's error is the call's). */
static int adjust_key_in(rate_limiter_t *lim, const rate_policy_t *force,
                         const char *key, size_t key_len,
                         uint64_t permits, uint64_t now, bool clock_time,
                         rate__op_t op)
{
    rate__step_arg_t arg;
    rate_decision_t d;
    int rc, store_rc = RATE_OK;

    if (lim == NULL)
        return RATE_EINVAL;
    rc = prepare(lim, force, key, key_len, permits, 0, now, false, op, &d, &arg,
                 &store_rc, true);
    if (rc != RATE_OK || store_rc != RATE_OK)
        return rc != RATE_OK ? rc : store_rc;
    if (arg.policy->unlimited)
        return RATE_OK; /* an unlimited key has no state to change */
    rate_key_t k = {key, key_len, lim->space};
    return store_part(lim, lim->store, &lim->book, &k, &arg, now, clock_time);
}

/* A refund or a penalty: one deadline for its store requests, as a
 * decision's. */
static int adjust_key(rate_limiter_t *lim, const rate_policy_t *force,
                      const char *key, size_t key_len,
                      uint64_t permits, uint64_t now, bool clock_time,
                      rate__op_t op)
{
    uint64_t scope = rate__call_begin();
    int rc = adjust_key_in(lim, force, key, key_len, permits, now, clock_time,
                           op);
    rate__call_end(scope);
    return rc;
}

/* A refund or a penalty through a store's start(): RATE_PENDING (done
 * runs later), else the result at once, as adjust_key's. */
static int adjust_start(rate_limiter_t *lim, const char *key, size_t key_len,
                        uint64_t permits, rate__op_t op, rate_done_fn done,
                        void *ud)
{
    if (lim == NULL || done == NULL)
        return RATE_EINVAL;
    uint64_t now = clock_now(lim);
    if (lim->store->m->start == NULL) /* a store that answers at once */
        return adjust_key(lim, NULL, key, key_len, permits, now, true, op);
    async_check_t *a = calloc(1, sizeof *a);
    if (a == NULL)
        return RATE_ENOMEM;
    int store_rc = RATE_OK;
    int rc = prepare(lim, NULL, key, key_len, permits, 0, now, false, op,
                     &a->d, &a->arg, &store_rc, false);
    if (rc == RATE_OK && store_rc == RATE_OK && a->arg.policy->unlimited)
        rc = RATE_OK; /* an unlimited key has no state to change */
    else if (rc == RATE_OK && (store_rc == RATE_OK || store_rc == NEED_RECORD)) {
        a->lim = lim;
        a->adjusted = done;
        a->ud = ud;
        a->now = now;
        a->clock_time = true;
        memcpy(a->key, key, key_len);
        a->job.key.len = key_len;
        a->job.key.bytes = a->key;
        a->job.key.space = lim->space;
        if (store_rc == NEED_RECORD) /* the policy's record first */
            rc = rate__book_id_start(&lim->book, a->arg.policy, now,
                                     async_recorded, a);
        else /* the store's decide() first, as for a decision */
            (void)async_start(a, &rc, true);
        if (rc == RATE_OK)
            return RATE_PENDING;
    } else if (rc == RATE_OK) {
        rc = store_rc;
    }
    free(a);
    return rc == RATE_EKEY && store_rc != RATE_OK ? RATE_ESTORE : rc;
}

int rate_limiter_refund_start(rate_limiter_t *lim, const char *key,
                              size_t key_len, uint64_t permits,
                              rate_done_fn done, void *ud)
{
    return adjust_start(lim, key, key_len, permits, RATE__OP_REFUND, done,
                        ud);
}

int rate_limiter_penalize_start(rate_limiter_t *lim, const char *key,
                                size_t key_len, uint64_t permits,
                                rate_done_fn done, void *ud)
{
    return adjust_start(lim, key, key_len, permits, RATE__OP_PENALTY, done,
                        ud);
}

int rate_limiter_refund(rate_limiter_t *lim, const char *key, size_t key_len,
                        uint64_t permits)
{
    return adjust_key(lim, NULL, key, key_len, permits,
                      lim != NULL ? clock_now(lim) : 0, true,
                      RATE__OP_REFUND);
}

int rate_limiter_refund_at(rate_limiter_t *lim, const char *key,
                           size_t key_len, uint64_t permits, uint64_t now_ns)
{
    return adjust_key(lim, NULL, key, key_len, permits, now_ns, false,
                      RATE__OP_REFUND);
}

int rate_limiter_penalize(rate_limiter_t *lim, const char *key,
                          size_t key_len, uint64_t permits)
{
    return adjust_key(lim, NULL, key, key_len, permits,
                      lim != NULL ? clock_now(lim) : 0, true,
                      RATE__OP_PENALTY);
}

int rate_limiter_penalize_at(rate_limiter_t *lim, const char *key,
                             size_t key_len, uint64_t permits, uint64_t now_ns)
{
    return adjust_key(lim, NULL, key, key_len, permits, now_ns, false,
                      RATE__OP_PENALTY);
}

int rate_limiter_reset(rate_limiter_t *lim, const char *key, size_t key_len)
{
    if (lim == NULL)
        return RATE_EINVAL;
    if (key == NULL || key_len == 0 || key_len > RATE_KEY_MAX ||
        rate__key_reserved(key, key_len))
        return RATE_EKEY;
    rate_key_t k = {key, key_len, lim->space};
    int rc = lim->store->m->remove(lim->store->self, &k);
    if (lim->fallback != NULL) { /* the insurance store forgets it too */
        int fb = lim->fallback->m->remove(lim->fallback->self, &k);
        if (rc == RATE_OK)
            rc = fb;
    }
    return rc;
}

int rate_limiter_stats(rate_limiter_t *lim, rate_stats_t *out)
{
    int rc;

    if (lim == NULL || out == NULL)
        return RATE_EINVAL;
    if ((rc = rate_store_stats(lim->store, out)) != RATE_OK)
        return rc;
    for (tally_t *t = atomic_load_explicit(&lim->tallies, memory_order_acquire);
         t != NULL; t = t->next) {
        out->allowed += atomic_load_explicit(&t->allowed, memory_order_relaxed);
        out->denied += atomic_load_explicit(&t->denied, memory_order_relaxed);
    }
    out->retries += atomic_load_explicit(&lim->retries, memory_order_relaxed);
    out->store_errors +=
        atomic_load_explicit(&lim->store_errors, memory_order_relaxed);
    return RATE_OK;
}

/* ---------------------------------------- under a policy the caller gives */

int rate_limiter_check_policy(rate_limiter_t *lim, const rate_policy_t *policy,
                              const char *key, size_t key_len,
                              uint64_t permits, uint64_t max_wait_ns,
                              rate_decision_t *out)
{
    if (policy == NULL) {
        if (out != NULL)
            memset(out, 0, sizeof *out);
        return RATE_EINVAL;
    }
    return decide(lim, policy, key, key_len, permits, max_wait_ns,
                  lim != NULL ? clock_now(lim) : 0, true, true, out);
}

int rate_limiter_check_policy_at(rate_limiter_t *lim,
                                 const rate_policy_t *policy, const char *key,
                                 size_t key_len, uint64_t permits,
                                 uint64_t max_wait_ns, uint64_t now_ns,
                                 rate_decision_t *out)
{
    if (policy == NULL) {
        if (out != NULL)
            memset(out, 0, sizeof *out);
        return RATE_EINVAL;
    }
    return decide(lim, policy, key, key_len, permits, max_wait_ns, now_ns,
                  false, true, out);
}

int rate_limiter_refund_policy(rate_limiter_t *lim, const rate_policy_t *policy,
                               const char *key, size_t key_len,
                               uint64_t permits)
{
    if (policy == NULL)
        return RATE_EINVAL;
    return adjust_key(lim, policy, key, key_len, permits,
                      lim != NULL ? clock_now(lim) : 0, true, RATE__OP_REFUND);
}

int rate_limiter_refund_policy_at(rate_limiter_t *lim,
                                  const rate_policy_t *policy, const char *key,
                                  size_t key_len, uint64_t permits,
                                  uint64_t now_ns)
{
    if (policy == NULL)
        return RATE_EINVAL;
    return adjust_key(lim, policy, key, key_len, permits, now_ns, false,
                      RATE__OP_REFUND);
}

/* ------------------------------------ fair shares in the store (version 6) */

/* A fair decision through the store's fair() (ratelimit_store.h): the
 * input checked and the policy's tag had as for a decision, then the
 * store's whole answer, with the fail mode, shadow mode and counters
 * after it; RATE_ENOTSUP, nothing counted, when the store has none or
 * declines (the fair layer then decides on its own table). */
static int fair_in(rate_limiter_t *lim, const rate_policy_t *force,
                   const char *key, size_t key_len, rate_fair_req_t *fq,
                   uint64_t permits, uint64_t now, bool clock_time,
                   rate_decision_t *d)
{
    rate__step_arg_t arg;
    int rc, store_rc = RATE_OK;

    if (key == NULL && fq == NULL && d == NULL) /* the probe */
        return lim != NULL && lim->m->version >= 6 && lim->m->fair != NULL
                   ? RATE_OK
                   : RATE_ENOTSUP;
    if (d != NULL)
        memset(d, 0, sizeof *d);
    if (lim == NULL || d == NULL || fq == NULL || fq->flow_hash == 0 ||
        fq->weight == 0 || fq->weight > (UINT32_C(1) << 20) ||
        fq->slots == 0 || fq->slots > 4096 || !RATE__RESERVED_ZERO(fq))
        return RATE_EINVAL;
    if (lim->m->version < 6 || lim->m->fair == NULL)
        return RATE_ENOTSUP;
    rc = prepare(lim, force, key, key_len, permits, 0, now, true,
                 RATE__OP_DECIDE, d, &arg, &store_rc, true);
    if (rc != RATE_OK)
        return rc;
    if (arg.policy->unlimited)
        return RATE_ENOTSUP; /* nothing to share: the fair layer's own */
    fq->fair_denied = fq->shared = false;
    rate_key_t k = {key, key_len, lim->space};
    if (store_rc == RATE_OK) {
        const rate_policy_t *p = arg.policy;
        rate_decide_req_t req = {p,           arg.policy_id, arg.format,
                                 now,         clock_time,    permits,
                                 0,           true,          p->max_reset_ns,
                                 horizon(lim, now, clock_time),
                                 RATE_DECIDE_ACQUIRE};
        store_rc = lim->m->fair(lim->self, &k, &req, fq, d);
        if (store_rc == RATE_ENOTSUP) {
            memset(d, 0, sizeof *d);
            return RATE_ENOTSUP;
        }
    }
    if (store_rc == RATE_EKEY) {
        memset(d, 0, sizeof *d);
        return RATE_EKEY;
    }
    finish(lim, &arg, &k, now, clock_time, store_rc);
    return RATE_OK;
}

int rate_limiter_check_fair(rate_limiter_t *lim, const rate_policy_t *policy,
                            const char *key, size_t key_len,
                            rate_fair_req_t *fair, uint64_t permits,
                            rate_decision_t *out)
{
    uint64_t scope = rate__call_begin();
    int rc = fair_in(lim, policy, key, key_len, fair, permits,
                     lim != NULL ? clock_now(lim) : 0, true, out);
    rate__call_end(scope);
    return rc;
}

int rate_limiter_check_fair_at(rate_limiter_t *lim,
                               const rate_policy_t *policy, const char *key,
                               size_t key_len, rate_fair_req_t *fair,
                               uint64_t permits, uint64_t now_ns,
                               rate_decision_t *out)
{
    uint64_t scope = rate__call_begin();
    int rc = fair_in(lim, policy, key, key_len, fair, permits, now_ns, false,
                     out);
    rate__call_end(scope);
    return rc;
}
