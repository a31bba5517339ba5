/* SPDX-License-Identifier: MIT */
/*
 * A policy change never resets a key, whoever made the state
 * (docs/algorithms.md, "Policy changes" and "Stored state").
 *
 * A state is tagged with the id the store's own records allot to the
 * policy that made it (RATE_SPACE_POLICY), so any limiter, process or host
 * on the store reads it and carries it over.  Here:
 *
 *   - two limiters with different policies alternating on one key, on the
 *     memory store, the test CAS store and Redis, at one instant and over
 *     time: admitted never exceeds the more generous policy's bound, for
 *     every algorithm, a composite, and pairs whose algorithms differ
 *     (whose components are charged what the old ones count, as
 *     documented; their joint bound is test_carry_bound.c's);
 *   - an enforcing and a shadow limiter on one store;
 *   - two processes on one Redis, strictly alternating through pipes;
 *   - a state whose policy record is gone, or with an unknown version
 *     byte: RATE_ECORRUPT, never a cold key;
 *   - first-edition states (format 2) read by a default limiter, and the
 *     version byte each one writes;
 *   - rate_limiter_set_policy on a live limiter.
 *
 * Redis is a private redis-server started on a free loopback port (no
 * persistence) and stopped by its PID, as in test_redis.c.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "lib/redis_fixture.h"
#include "ratelimit_redis.h"

/* ------------------------------------------------------- the server */

/* A raw connection to the test's server, which must answer. */
static redisContext *raw_ok(void)
{
    redisContext *c = raw();
    if (c == NULL || c->err)
        fail_msg("cannot connect to the test's redis-server");
    return c;
}


/* The state bytes of PREFIX{key} into buf (at most cap); their length, or
 * 0 when there is none. */
static size_t redis_state(redisContext *c, const char *prefix,
                          const char *key, unsigned char *buf, size_t cap)
{
    redisReply *r = redisCommand(c, "HGET %s{%s} s", prefix, key);
    size_t n = 0;
    assert_non_null(r);
    if (r->type == REDIS_REPLY_STRING) {
        assert_true((size_t)r->len <= cap);
        memcpy(buf, r->str, r->len);
        n = r->len;
    }
    freeReplyObject(r);
    return n;
}

/* ------------------------------------------------- an open test store */

/* A store whose every key, of every space, the test can read, write and
 * delete: the generic load + compare-and-set pair over a small table. */
#define OPEN_KEYS 64
typedef struct open_entry {
    rate_space_t space;
    size_t key_len, len;
    char key[RATE_KEY_MAX];
    unsigned char val[4096];
    uint64_t version;
    bool used;
} open_entry_t;

typedef struct open_store {
    pthread_mutex_t lock;
    open_entry_t e[OPEN_KEYS];
    uint64_t next_version;
} open_store_t;

static open_entry_t *open_find(open_store_t *s, rate_space_t space,
                               const void *key, size_t len)
{
    for (int i = 0; i < OPEN_KEYS; i++)
        if (s->e[i].used && s->e[i].space == space &&
            s->e[i].key_len == len && memcmp(s->e[i].key, key, len) == 0)
            return &s->e[i];
    return NULL;
}

static int os_load(void *self, const rate_key_t *key, void *buf, size_t cap,
                   size_t *len, uint64_t *version)
{
    open_store_t *s = self;
    int rc = RATE_OK;
    pthread_mutex_lock(&s->lock);
    open_entry_t *e = open_find(s, key->space, key->bytes, key->len);
    *len = 0;
    *version = 0;
    if (e != NULL) {
        *len = e->len;
        if (e->len > cap) {
            rc = RATE_EINVAL;
        } else {
            memcpy(buf, e->val, e->len);
            *version = e->version;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static int os_cas(void *self, const rate_key_t *key, uint64_t version,
                  const void *state, size_t len, uint64_t ttl_ns)
{
    open_store_t *s = self;
    int rc = RATE_OK;
    (void)ttl_ns;
    pthread_mutex_lock(&s->lock);
    open_entry_t *e = open_find(s, key->space, key->bytes, key->len);
    if ((e == NULL && version != 0) || (e != NULL && e->version != version)) {
        rc = RATE_ECONFLICT;
    } else if (len > sizeof e->val || key->len > RATE_KEY_MAX) {
        rc = RATE_EFULL;
    } else {
        for (int i = 0; e == NULL && i < OPEN_KEYS; i++)
            if (!s->e[i].used) {
                e = &s->e[i];
                e->used = true;
                e->space = key->space;
                e->key_len = key->len;
                memcpy(e->key, key->bytes, key->len);
            }
        if (e == NULL) {
            rc = RATE_EFULL;
        } else {
            memcpy(e->val, state, len);
            e->len = len;
            e->version = ++s->next_version;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static int os_remove(void *self, const rate_key_t *key)
{
    open_store_t *s = self;
    pthread_mutex_lock(&s->lock);
    open_entry_t *e = open_find(s, key->space, key->bytes, key->len);
    if (e != NULL)
        e->used = false;
    pthread_mutex_unlock(&s->lock);
    return RATE_OK;
}

static void os_destroy(void *self)
{
    open_store_t *s = self;
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static const rate_store_methods_t open_methods = {
    .version = RATE_STORE_VERSION,
    .name = "test-open",
    .load = os_load,
    .cas = os_cas,
    .remove = os_remove,
    .destroy = os_destroy,
};

static rate_store_t *open_store_new(open_store_t **handle)
{
    open_store_t *s = calloc(1, sizeof *s);
    rate_store_t *out = NULL;
    assert_non_null(s);
    pthread_mutex_init(&s->lock, NULL);
    assert_int_equal(rate_store_new(&open_methods, s, &out), RATE_OK);
    *handle = s;
    return out;
}

/* The bytes of a key of the state space (0: absent). */
static size_t open_get(open_store_t *s, rate_space_t space, const void *key,
                       size_t key_len, unsigned char *buf)
{
    size_t n = 0;
    pthread_mutex_lock(&s->lock);
    open_entry_t *e = open_find(s, space, key, key_len);
    if (e != NULL) {
        memcpy(buf, e->val, e->len);
        n = e->len;
    }
    pthread_mutex_unlock(&s->lock);
    return n;
}

static bool open_del(open_store_t *s, rate_space_t space, const void *key,
                     size_t key_len)
{
    pthread_mutex_lock(&s->lock);
    open_entry_t *e = open_find(s, space, key, key_len);
    if (e != NULL)
        e->used = false;
    pthread_mutex_unlock(&s->lock);
    return e != NULL;
}

/* ----------------------------------------------------------- helpers */

#define RND_SEED 88172645463325252ull
#include "lib/rng.h"

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* One request of permit 1 on "k" at t, by the full call or the bool call
 * (whose fast paths must send a state of another policy on to the general
 * path). */
static bool ask(rate_limiter_t *l, const char *key, uint64_t t, bool full)
{
    if (full) {
        rate_decision_t d = at(l, key, t, 1, 0);
        if (d.reason == RATE_REASON_STORE_ERROR)
            fail_msg("store error %s", rate_err_name(d.error));
        return d.allowed;
    }
    return rate_try_acquire_at(l, key, 1, t);
}

static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* floor(dt * L / P) for the faster of two rates. */
static uint64_t refill(const rate_limit_t *a, const rate_limit_t *b,
                       uint64_t dt)
{
    unsigned __int128 x = (unsigned __int128)dt * a->limit / a->period_ns;
    unsigned __int128 y = (unsigned __int128)dt * b->limit / b->period_ns;
    unsigned __int128 m = x > y ? x : y;
    return m > UINT64_MAX / 2 ? UINT64_MAX / 2 : (uint64_t)m;
}

/* Fails unless the admissions at times t[0..n) (non-decreasing, one permit
 * each) keep, for every limit whose algorithm is the same at the same
 * position in both policies, the more generous of the two limits' bounds
 * (windows: both of the same length):
 *   token bucket   over [t_j, t_k]: max B + floor(dt * max rate);
 *   leaky bucket   (max_wait 0, one permit each) 1 + floor(dt * max rate);
 *   fixed window and sliding window counter: max L per aligned window
 *                  (a counter's current count never passes its L);
 *   sliding log    max L in every window (t - W, t]. */
static void check_bound(const rate_policy_t *pa, const rate_policy_t *pb,
                        const uint64_t *t, size_t n, const char *what)
{
    size_t count = rate_policy_count(pa) < rate_policy_count(pb)
                       ? rate_policy_count(pa)
                       : rate_policy_count(pb);
    for (size_t i = 0; i < count; i++) {
        const rate_limit_t *a = rate_policy_limit(pa, i);
        const rate_limit_t *b = rate_policy_limit(pb, i);
        if (a->algorithm != b->algorithm)
            continue; /* charged: test_carry_bound.c checks the pair */
        switch (a->algorithm) {
        case RATE_TOKEN_BUCKET:
        case RATE_LEAKY_BUCKET: {
            uint64_t base = a->algorithm == RATE_TOKEN_BUCKET
                                ? max_u64(a->burst, b->burst)
                                : 1;
            for (size_t j = 0; j < n; j++)
                for (size_t k = j; k < n; k++) {
                    uint64_t bound = base + refill(a, b, t[k] - t[j]);
                    if (k - j + 1 > bound)
                        fail_msg("%s: limit %zu: %zu admitted in [%llu, "
                                 "%llu] ns, bound %llu",
                                 what, i, k - j + 1,
                                 (unsigned long long)t[j],
                                 (unsigned long long)t[k],
                                 (unsigned long long)bound);
                }
            break;
        }
        case RATE_FIXED_WINDOW:
        case RATE_SLIDING_WINDOW: {
            assert_int_equal(a->period_ns, b->period_ns);
            uint64_t w = a->period_ns, lim = max_u64(a->limit, b->limit);
            for (size_t j = 0; j < n;) {
                size_t k = j;
                while (k < n && t[k] / w == t[j] / w)
                    k++;
                if (k - j > lim)
                    fail_msg("%s: limit %zu: %zu admitted in window %llu, "
                             "bound %llu",
                             what, i, k - j, (unsigned long long)(t[j] / w),
                             (unsigned long long)lim);
                j = k;
            }
            break;
        }
        case RATE_SLIDING_LOG: {
            assert_int_equal(a->period_ns, b->period_ns);
            uint64_t w = a->period_ns, lim = max_u64(a->limit, b->limit);
            size_t j = 0;
            for (size_t k = 0; k < n; k++) {
                while (t[k] - t[j] >= w)
                    j++;
                if (k - j + 1 > lim)
                    fail_msg("%s: limit %zu: %zu admitted in (%llu - W, "
                             "%llu], bound %llu",
                             what, i, k - j + 1, (unsigned long long)t[k],
                             (unsigned long long)t[k],
                             (unsigned long long)lim);
            }
            break;
        }
        }
    }
}

/* ------------------------------------ 1. two policies on one store */

typedef struct pair_case {
    const char *a, *b;
    /* admitted by a alone, and by a and b alternating (a first), in 100
     * requests on one key at one instant (worked out from the documented
     * rule, "Policy changes") */
    int alone, instant;
    uint64_t step; /* largest time step over time */
} pair_case_t;

static const pair_case_t pairs[] = {
    /* a: 10 -> 9; b: min(9, 5) = 5 -> 4; a: 4 -> 3; b 2; a 1; b 0. */
    {"token-bucket 10/s burst=10", "token-bucket 5/s burst=5", 10, 6,
     60 * MS},
    /* the same rates over other periods (u = tokens * P is scaled by
     * each one's own P): the count of tokens carries, not the word */
    {"token-bucket 10/s burst=10", "token-bucket 300/m burst=5", 10, 6,
     60 * MS},
    /* max_wait 0: a request passes only into an empty bucket. */
    {"leaky-bucket 10/s capacity=10", "leaky-bucket 5/s capacity=5", 1, 1,
     80 * MS},
    /* the count carries: b stops at 5, a goes on to 10. */
    {"fixed-window 10/s", "fixed-window 5/s", 10, 10, 40 * MS},
    {"sliding-window 10/s", "sliding-window 5/s", 10, 10, 40 * MS},
    {"sliding-log 10/s", "sliding-log 5/s", 10, 10, 40 * MS},
    /* the bucket carries as above; the counter's 20 and 12 do not bind. */
    {"token-bucket 10/s burst=10; sliding-window 20/5s",
     "token-bucket 5/s burst=5; sliding-window 12/5s", 10, 6, 60 * MS},
    /* the buckets as above; another algorithm at position 1 is charged
     * what the old one holds (the window's count, the counter's current
     * one): their 100 do not bind. */
    {"token-bucket 10/s burst=10; fixed-window 100/m",
     "token-bucket 5/s burst=5; sliding-window 100/m", 10, 6, 60 * MS},
};
#define PAIRS (sizeof pairs / sizeof pairs[0])

enum { ST_MEMORY, ST_CAS, ST_REDIS };

static rate_store_t *store_of(int kind, const char *prefix)
{
    rate_store_t *s = NULL;
    if (kind == ST_MEMORY)
        assert_int_equal(rate_store_memory_new(NULL, &s), RATE_OK);
    else if (kind == ST_CAS)
        assert_int_equal(cas_store_new(&s, NULL), RATE_OK);
    else
        s = redis_store(prefix, true, 0);
    return s;
}

static void free_store(int kind, rate_store_t *s)
{
    if (kind == ST_REDIS)
        drop_store(s);
    else
        rate_store_free(s);
}

static const char *kind_name(int kind)
{
    return kind == ST_MEMORY ? "memory" : kind == ST_CAS ? "cas" : "redis";
}

#define RUN 400
static void pairs_on(int kind)
{
    for (size_t c = 0; c < PAIRS; c++) {
        const pair_case_t *pc = &pairs[c];
        char what[160], prefix[32];
        snprintf(prefix, sizeof prefix, "carry%zu:", c);
        rate_store_t *s = store_of(kind, prefix);
        rate_policy_t *pa = policy_of(pc->a), *pb = policy_of(pc->b);
        rate_limiter_t *la = limiter_of(pc->a, s), *lb = limiter_of(pc->b, s);
        rate_limiter_t *lim[2] = {la, lb};

        /* a alone, then the pair, at one instant (each on its own key) */
        int alone = 0, both = 0, mine[2] = {0, 0};
        for (int i = 0; i < 100; i++)
            alone += ask(la, "alone", 5 * SEC, i % 2);
        for (int i = 0; i < 100; i++) {
            bool ok = ask(lim[i % 2], "instant", 5 * SEC, (i / 2) % 2);
            both += ok;
            mine[i % 2] += ok;
        }
        snprintf(what, sizeof what, "%s: '%s' and '%s' at one instant",
                 kind_name(kind), pc->a, pc->b);
        if (alone != pc->alone || both != pc->instant)
            fail_msg("%s: admitted %d alone (want %d), %d together (%d + "
                     "%d; want %d)",
                     what, alone, pc->alone, both, mine[0], mine[1],
                     pc->instant);

        /* over time: strict alternation, then a random choice, on the
         * caller's time, by both kinds of call */
        uint64_t t = 7 * SEC, times[RUN];
        size_t n = 0;
        for (int i = 0; i < RUN; i++) {
            int who = i < RUN / 2 ? i % 2 : (int)rnd(2);
            if (ask(lim[who], "run", t, rnd(2)))
                times[n++] = t;
            t += rnd(4) == 0 ? 0 : rnd(pc->step);
        }
        snprintf(what, sizeof what, "%s: '%s' and '%s' over time",
                 kind_name(kind), pc->a, pc->b);
        check_bound(pa, pb, times, n, what);
        if (n < 10) /* they did admit: the bound is not met by denying */
            fail_msg("%s: only %zu admitted", what, n);

        rate_limiter_free(la);
        rate_limiter_free(lb);
        rate_policy_free(pa);
        rate_policy_free(pb);
        free_store(kind, s);
    }
}

static void pairs_on_memory(void **state)
{
    (void)state;
    pairs_on(ST_MEMORY);
}

static void pairs_on_cas(void **state)
{
    (void)state;
    pairs_on(ST_CAS);
}

static void pairs_on_redis(void **state)
{
    (void)state;
    pairs_on(ST_REDIS);
}

/* Two policies whose one limit has another algorithm: the documented rule
 * is that such a limit is charged what the old one holds, or can have
 * admitted in the time the new one counts, as admitted at the request.
 * At one instant: a 10 -> 9 (1 held); b's window counts that 1 -> 2;
 * a's bucket counts back one second (its refill of the whole burst): the
 * window's 2 and the limit of the window before, which a window's state
 * does not record (5) -> 10 - 7 = 3 -> 2; b: 8 held, above its 5, denied
 * from then on; a 2 -> 0.  5 in all, fewer than a alone. */
static void other_algorithm_charged_on(int kind)
{
    rate_store_t *s = store_of(kind, "cold:");
    rate_limiter_t *la = limiter_of("token-bucket 10/s burst=10", s);
    rate_limiter_t *lb = limiter_of("fixed-window 5/s", s);
    int admitted = 0;

    for (int i = 0; i < 100; i++)
        admitted += ask(i % 2 ? lb : la, "alt", 3 * SEC, true);
    if (admitted != 5)
        fail_msg("%s: alternating a bucket and a window: %d of 100, the "
                 "documented charge says 5",
                 kind_name(kind), admitted);
    /* runs: each policy in turn, 20 requests each, at one instant */
    int runs[4] = {0, 0, 0, 0};
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < 20; i++)
            runs[r] += ask(r % 2 ? lb : la, "runs", 3 * SEC, i % 2);
    if (runs[0] != 10 || runs[1] != 0 || runs[2] != 0 || runs[3] != 0)
        fail_msg("%s: runs admitted %d %d %d %d, want 10 0 0 0",
                 kind_name(kind), runs[0], runs[1], runs[2], runs[3]);
    rate_limiter_free(la);
    rate_limiter_free(lb);
    free_store(kind, s);
}

static void other_algorithm_memory(void **state)
{
    (void)state;
    other_algorithm_charged_on(ST_MEMORY);
    other_algorithm_charged_on(ST_CAS);
}

static void other_algorithm_redis(void **state)
{
    (void)state;
    other_algorithm_charged_on(ST_REDIS);
}

/* --------------------------------------------- 2. a shadow limiter */

static void shadow_on(int kind)
{
    const char *what = kind_name(kind);
    for (int shares = 0; shares < 2; shares++) {
        rate_store_t *s = store_of(kind, shares ? "shadow1:" : "shadow0:");
        rate_limiter_t *e = limiter_of("token-bucket 10/s burst=10", s);
        rate_limiter_config_t cfg = {0};
        cfg.store = s;
        cfg.shadow = true;
        cfg.shadow_shares_state = shares;
        rate_limiter_t *sh = limiter_cfg("token-bucket 5/s burst=5", cfg);
        int enforced = 0, real = 0, first_shadow = -1;

        for (int i = 0; i < 100; i++) {
            enforced += ask(e, "k", SEC, i % 2);
            rate_decision_t d = at(sh, "k", SEC, 1, 0);
            assert_true(d.allowed);
            assert_int_not_equal(d.reason, RATE_REASON_STORE_ERROR);
            if (!d.shadow) {
                assert_int_equal(d.reason, RATE_REASON_ALLOWED);
                assert_int_equal(first_shadow, -1); /* never again after */
                real++;
            } else {
                assert_int_equal(d.reason, RATE_REASON_LIMITED);
                if (first_shadow < 0)
                    first_shadow = i + 1;
            }
        }
        if (!shares) {
            /* Its own state: the enforced limit is untouched, and the
             * shadow's own bucket of 5 runs dry at its 6th request. */
            if (enforced != 10 || real != 5 || first_shadow != 6)
                fail_msg("%s, own state: enforcing admitted %d (want 10), "
                         "shadow really admitted %d (want 5), first shadow "
                         "decision at request %d (want 6)",
                         what, enforced, real, first_shadow);
        } else {
            /* Shared: the shadow's real admissions are charged to the key
             * and its smaller burst caps the carried bucket (the rule):
             * e 10->9, shadow min(9,5)=5->4, e 3, shadow 2, e 1, shadow 0. */
            if (enforced != 3 || real != 3 || first_shadow != 4)
                fail_msg("%s, shared state: enforcing admitted %d (want 3), "
                         "shadow really admitted %d (want 3), first shadow "
                         "decision at request %d (want 4)",
                         what, enforced, real, first_shadow);
        }
        /* The shadow keeps no state where the enforcing one looks, unless
         * it shares: a fresh key the shadow alone used is cold for e. */
        for (int i = 0; i < 8; i++)
            (void)at(sh, "only-shadow", SEC, 1, 0);
        int after = 0;
        for (int i = 0; i < 20; i++)
            after += ask(e, "only-shadow", SEC, true);
        assert_int_equal(after, shares ? 0 : 10);
        rate_limiter_free(sh);
        rate_limiter_free(e);
        free_store(kind, s);
    }
}

static void shadow_memory(void **state)
{
    (void)state;
    shadow_on(ST_MEMORY);
    shadow_on(ST_CAS);
}

static void shadow_redis(void **state)
{
    (void)state;
    shadow_on(ST_REDIS);
}

/* ------------------------------------------ 3. two processes, Redis */

/* A child: a limiter of its own on the Redis store, deciding one request
 * per time read from `in` (UINT64_MAX: exit), answering one byte on
 * `out`: 1 admitted, 0 denied, 2 a store error. */
static void child_loop(const char *policy, const char *prefix, int in,
                       int out)
{
    rate_redis_options_t o = {0};
    rate_store_t *s = NULL;
    rate_policy_t *p = NULL;
    rate_limiter_t *l = NULL;
    o.prefix = prefix;
    o.no_ttl = true;
    if (rate_store_redis_new(url, &o, &s, NULL, 0) != RATE_OK ||
        rate_policy_parse(policy, &p, NULL, 0) != RATE_OK)
        _exit(3);
    rate_limiter_config_t cfg = {.policy = p, .store = s};
    if (rate_limiter_new(&cfg, &l) != RATE_OK)
        _exit(4);
    uint64_t t;
    int i = 0;
    while (read(in, &t, sizeof t) == sizeof t && t != UINT64_MAX) {
        rate_decision_t d;
        unsigned char v;
        if (i++ % 2 == 0) {
            int rc = rate_limiter_check_at(l, "k", 1, 1, 0, t, &d);
            v = rc != RATE_OK || d.reason == RATE_REASON_STORE_ERROR
                    ? 2
                    : d.allowed;
        } else {
            v = rate_try_acquire_at(l, "k", 1, t);
        }
        if (write(out, &v, 1) != 1)
            _exit(5);
    }
    rate_limiter_free(l);
    rate_policy_free(p);
    rate_store_free(s);
    _exit(0);
}

static void two_processes_with(const char *pa_text, const char *pb_text,
                               int want_instant, uint64_t step)
{
    const char *texts[2] = {pa_text, pb_text};
    int to[2][2], from[2][2];
    pid_t kids[2];
    char prefix[48];

    snprintf(prefix, sizeof prefix, "procs:%llu:",
             (unsigned long long)rate_clock_monotonic_ns());
    for (int c = 0; c < 2; c++) {
        assert_int_equal(pipe(to[c]), 0);
        assert_int_equal(pipe(from[c]), 0);
        kids[c] = fork();
        assert_true(kids[c] >= 0);
        if (kids[c] == 0) {
            close(to[c][1]);
            close(from[c][0]);
            if (c == 1) {
                close(to[0][1]);
                close(from[0][0]);
            }
            child_loop(texts[c], prefix, to[c][0], from[c][1]);
        }
        close(to[c][0]);
        close(from[c][1]);
    }
    /* one instant (the first 100 requests), then over time */
    uint64_t t = 2 * SEC, times[RUN];
    size_t n = 0;
    int instant = 0;
    for (int i = 0; i < 100 + RUN / 2; i++) {
        int who = i % 2;
        unsigned char v = 9;
        if (i == 100)
            t = 10 * SEC;
        assert_int_equal(write(to[who][1], &t, sizeof t), sizeof t);
        assert_int_equal(read(from[who][0], &v, 1), 1);
        if (v == 2)
            fail_msg("child %d: store error at request %d", who, i);
        assert_true(v <= 1);
        if (i < 100) {
            instant += v;
        } else {
            if (v)
                times[n++] = t;
            t += rnd(4) == 0 ? 0 : rnd(step);
        }
    }
    for (int c = 0; c < 2; c++) {
        uint64_t quit = UINT64_MAX;
        int status;
        assert_int_equal(write(to[c][1], &quit, sizeof quit), sizeof quit);
        close(to[c][1]);
        close(from[c][0]);
        assert_int_equal(waitpid(kids[c], &status, 0), kids[c]);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    char what[160];
    snprintf(what, sizeof what, "two processes, '%s' and '%s'", pa_text,
             pb_text);
    if (instant != want_instant)
        fail_msg("%s: %d admitted at one instant, want %d", what, instant,
                 want_instant);
    rate_policy_t *pa = policy_of(pa_text), *pb = policy_of(pb_text);
    check_bound(pa, pb, times, n, what);
    if (n < 10)
        fail_msg("%s: only %zu admitted over time", what, n);
    rate_policy_free(pa);
    rate_policy_free(pb);
    rate_store_t *s = redis_store(prefix, true, 0);
    drop_store(s);
}

static void two_processes(void **state)
{
    (void)state;
    two_processes_with("token-bucket 10/s burst=10",
                       "token-bucket 5/s burst=5", 6, 60 * MS);
    two_processes_with("sliding-log 10/s", "sliding-log 5/s", 10, 40 * MS);
    two_processes_with("token-bucket 10/s burst=10; sliding-window 20/5s",
                       "token-bucket 5/s burst=5; sliding-window 12/5s", 6,
                       60 * MS);
}

/* ------------------------------- 5. a lost record, an unknown version */

/* A state whose policy record is gone cannot be read: RATE_ECORRUPT under
 * the fail mode, for a limiter that never met the policy, and the state is
 * left as it was (never taken for a cold key and written over). */
static void expect_corrupt(rate_limiter_t *l, const char *key, uint64_t t,
                           bool open)
{
    for (int i = 0; i < 3; i++) {
        rate_decision_t d = at(l, key, t, 1, 0);
        if (d.reason != RATE_REASON_STORE_ERROR || d.error != RATE_ECORRUPT ||
            d.allowed != open)
            fail_msg("request %d on '%s': allowed=%d reason=%s error=%s, "
                     "want the fail mode's verdict with RATE_ECORRUPT",
                     i, key, d.allowed, rate_reason_name(d.reason),
                     rate_err_name(d.error));
        assert_int_equal(rate_try_acquire_at(l, key, 1, t), open);
    }
}

static void lost_record_redis(void **state)
{
    (void)state;
    rate_store_t *s = redis_store("lost:", true, 0);
    rate_limiter_t *la = limiter_of("token-bucket 10/s burst=10", s);
    redisContext *c = raw_ok();
    unsigned char st[64], after[64];

    for (int i = 0; i < 10; i++)
        assert_true(at(la, "k", SEC, 1, 0).allowed); /* drained */
    size_t len = redis_state(c, "lost:", "k", st, sizeof st);
    assert_int_equal(len, 22);
    assert_int_equal(st[13], 3);
    char hex[9];
    snprintf(hex, sizeof hex, "%02x%02x%02x%02x", st[8], st[9], st[10],
             st[11]);
    redisReply *r = redisCommand(c, "DEL lost:p{%s}", hex);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    assert_int_equal(r->integer, 1); /* the record was there */
    freeReplyObject(r);

    rate_limiter_t *lb = limiter_of("token-bucket 5/s burst=5", s);
    expect_corrupt(lb, "k", SEC, false);
    rate_limiter_config_t cfg = {0};
    cfg.store = s;
    cfg.on_store_error = RATE_FAIL_OPEN;
    rate_limiter_t *lo = limiter_cfg("token-bucket 20/s burst=20", cfg);
    expect_corrupt(lo, "k", 2 * SEC, true);
    assert_int_equal(redis_state(c, "lost:", "k", after, sizeof after), len);
    assert_memory_equal(after, st, len);

    /* The limiter that wrote it knows its policy and goes on. */
    assert_false(at(la, "k", SEC, 1, 0).allowed);
    assert_true(at(la, "k", SEC + 100 * MS, 1, 0).allowed);
    redisFree(c);
    rate_limiter_free(lo);
    rate_limiter_free(lb);
    rate_limiter_free(la);
    drop_store(s);
}

static void lost_record_generic(void **state)
{
    (void)state;
    open_store_t *os;
    rate_store_t *s = open_store_new(&os);
    rate_limiter_t *la = limiter_of("sliding-log 4/s", s);
    unsigned char st[512], after[512];

    for (int i = 0; i < 4; i++)
        assert_true(at(la, "k", SEC, 1, 0).allowed);
    size_t len = open_get(os, RATE_SPACE_STATE, "k", 1, st);
    assert_true(len > 14);
    assert_int_equal(st[13], 3);
    assert_true(open_del(os, RATE_SPACE_POLICY, st + 8, 4));
    rate_limiter_t *lb = limiter_of("sliding-log 8/s", s);
    expect_corrupt(lb, "k", SEC, false);
    assert_int_equal(open_get(os, RATE_SPACE_STATE, "k", 1, after), len);
    assert_memory_equal(after, st, len);
    rate_limiter_free(lb);
    rate_limiter_free(la);
    rate_store_free(s);
}

/* A version byte other than 2 or 3 is no format of this library's. */
static void unknown_version(void **state)
{
    (void)state;
    static const unsigned char versions[] = {0, 1, 4, 5, 255};
    rate_store_t *s;
    cas_store_t *cs;
    assert_int_equal(cas_store_new(&s, &cs), RATE_OK);
    rate_limiter_t *l = limiter_of("token-bucket 10/s burst=10", s);
    rate_limiter_t *other = limiter_of("token-bucket 5/s burst=5", s);
    rate_store_t *rs = redis_store("version:", true, 0);
    rate_limiter_t *lr = limiter_of("token-bucket 10/s burst=10", rs);
    rate_limiter_t *lro = limiter_of("token-bucket 5/s burst=5", rs);
    redisContext *c = raw_ok();

    assert_true(at(l, "k", SEC, 1, 0).allowed);
    assert_true(at(lr, "k", SEC, 1, 0).allowed);
    unsigned char st[22];
    assert_int_equal(redis_state(c, "version:", "k", st, sizeof st), 22);
    assert_int_equal(st[13], 3);
    for (size_t v = 0; v < sizeof versions; v++) {
        st[13] = versions[v];
        cas_store_poke(cs, "k", st, sizeof st);
        freeReplyObject(redisCommand(c, "HSET version:{k} s %b", st,
                                     sizeof st));
        expect_corrupt(l, "k", 2 * SEC, false);
        expect_corrupt(other, "k", 2 * SEC, false);
        expect_corrupt(lr, "k", 2 * SEC, false);
        expect_corrupt(lro, "k", 2 * SEC, false);
    }
    redisFree(c);
    rate_limiter_free(lro);
    rate_limiter_free(lr);
    drop_store(rs);
    rate_limiter_free(other);
    rate_limiter_free(l);
    rate_store_free(s);
}

/* ---------------------------------------------- 6. the first edition */

static void first_edition_on(rate_store_t *s, redisContext *c,
                             const char *prefix, open_store_t *os)
{
    const char *text = "token-bucket 10/s burst=10";
    rate_policy_t *p = policy_of(text);
    uint32_t fp = rate_policy_fingerprint(p);
    rate_limiter_config_t cfg = {0};
    cfg.store = s;
    cfg.first_edition_format = true;
    rate_limiter_t *old = limiter_cfg(text, cfg);
    rate_limiter_t *cur = limiter_of(text, s);
    unsigned char st[64];
    size_t len;

#define STATE(key)                                                          \
    (c != NULL ? redis_state(c, prefix, key, st, sizeof st)                 \
               : open_get(os, RATE_SPACE_STATE, key, strlen(key), st))

    /* The first edition's bytes: version 2, the fingerprint as the tag. */
    for (int i = 0; i < 10; i++)
        assert_true(ask(old, "k", SEC, i % 2));
    len = STATE("k");
    assert_int_equal(len, 22);
    assert_int_equal(st[12], 1);
    assert_int_equal(st[13], 2);
    assert_int_equal(le32(st + 8), fp);
    assert_int_equal(le64(st), SEC);
    /* read by a default limiter with the same policy: still drained, and
     * refilled at the rate from t_last */
    assert_false(ask(cur, "k", SEC, true));
    assert_false(ask(cur, "k", SEC + 99 * MS, false));
    assert_true(ask(cur, "k", SEC + 100 * MS, true));
    assert_false(ask(cur, "k", SEC + 100 * MS, false));
    /* which wrote the second edition's format */
    len = STATE("k");
    assert_int_equal(len, 22);
    assert_int_equal(st[13], 3);
    assert_int_equal(le64(st), SEC + 100 * MS);
    /* the first edition's limiter reads that too, and writes version 2 */
    assert_false(ask(old, "k", SEC + 150 * MS, true));
    assert_true(ask(old, "k", SEC + 200 * MS, true));
    len = STATE("k");
    assert_int_equal(st[13], 2);
    assert_int_equal(le32(st + 8), fp);

    /* a default limiter's own key: version 3 */
    assert_true(ask(cur, "new", SEC, true));
    len = STATE("new");
    assert_int_equal(len, 22);
    assert_int_equal(st[13], 3);

    /* a first-edition state read by another policy's default limiter:
     * the record of the fingerprint names its policy, so it carries */
    for (int i = 0; i < 10; i++)
        assert_true(ask(old, "tier", SEC, true));
    rate_limiter_t *pro = limiter_of("token-bucket 20/s burst=20", s);
    assert_false(ask(pro, "tier", SEC, true));
    assert_true(ask(pro, "tier", SEC + 50 * MS, true)); /* 20/s from t_last */
    assert_false(ask(pro, "tier", SEC + 50 * MS, false));
#undef STATE
    rate_limiter_free(pro);
    rate_limiter_free(cur);
    rate_limiter_free(old);
    rate_policy_free(p);
}

static void first_edition_generic(void **state)
{
    (void)state;
    open_store_t *os;
    rate_store_t *s = open_store_new(&os);
    first_edition_on(s, NULL, NULL, os);
    rate_store_free(s);
}

static void first_edition_redis(void **state)
{
    (void)state;
    rate_store_t *s = redis_store("first:", true, 0);
    redisContext *c = raw_ok();
    first_edition_on(s, c, "first:", NULL);
    redisFree(c);
    drop_store(s);
}

/* A first-edition state whose policy no record names (a 0.1 binary wrote
 * it) reads, for another policy, as the first edition read it: a cold key
 * (ratelimit.h, first_edition_format), not an error. */
static void first_edition_unknown_policy(void **state)
{
    (void)state;
    open_store_t *os;
    rate_store_t *s = open_store_new(&os);
    rate_limiter_config_t cfg = {0};
    cfg.store = s;
    cfg.first_edition_format = true;
    rate_limiter_t *old = limiter_cfg("token-bucket 10/s burst=10", cfg);
    unsigned char st[64];

    for (int i = 0; i < 10; i++)
        assert_true(ask(old, "k", SEC, true));
    assert_int_equal(open_get(os, RATE_SPACE_STATE, "k", 1, st), 22);
    assert_int_equal(st[13], 2);
    assert_true(open_del(os, RATE_SPACE_POLICY, st + 8, 4));
    rate_limiter_t *pro = limiter_of("token-bucket 20/s burst=20", s);
    rate_decision_t d = at(pro, "k", SEC, 1, 0);
    assert_int_not_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_true(d.allowed);
    assert_int_equal(d.remaining, 19);
    rate_limiter_free(pro);
    rate_limiter_free(old);
    rate_store_free(s);
}

/* A first-edition limiter (tagging its own states with its policy's
 * fingerprint) reading a second-edition state must go by the tag's record,
 * not take a tag equal to its fingerprint for its own policy: ids are
 * allotted from a policy's fingerprint on, so another policy may hold the
 * id equal to this one's fingerprint.  Here the ids fp(Q) and fp(Q)+1 are
 * taken by two other policies' records, so Q, whose fingerprint is 2 below
 * P's, gets the id fp(P).  Read under P two seconds on, when Q's window
 * has rolled (Q's state is back at its cold start), it is a cold key: a
 * full bucket, as for a default limiter of P.  Taken for P's own state it
 * would be a bucket that started at 3 scaled tokens: 20 tokens by then. */
static void seed_record(open_store_t *os, uint32_t id, const char *text)
{
    unsigned char kb[4] = {(unsigned char)id, (unsigned char)(id >> 8),
                           (unsigned char)(id >> 16),
                           (unsigned char)(id >> 24)};
    rate_key_t k = {(const char *)kb, 4, RATE_SPACE_POLICY};
    assert_int_equal(os_cas(os, &k, 0, text, strlen(text), RATE_TTL_FOREVER),
                     RATE_OK);
}

static void first_edition_reads_ids_by_record(void **state)
{
    (void)state;
    const char *q_text = "fixed-window 5215/s";
    const char *p_text = "token-bucket 10/s burst=17094";
    rate_policy_t *q = policy_of(q_text), *p = policy_of(p_text);
    uint32_t fq = rate_policy_fingerprint(q), fpp = rate_policy_fingerprint(p);
    if (fpp - fq != 2)
        fail_msg("the fingerprints changed (%08x, %08x): pick two policies "
                 "whose fingerprints are 1..63 apart",
                 fq, fpp);
    open_store_t *os;
    rate_store_t *s = open_store_new(&os);
    seed_record(os, fq, "sliding-log 1/s");
    seed_record(os, fq + 1, "sliding-log 2/s");
    rate_limiter_t *lq = limiter_of(q_text, s);
    unsigned char st[64];
    for (int i = 0; i < 3; i++)
        assert_true(ask(lq, "k", SEC, true));
    assert_int_equal(open_get(os, RATE_SPACE_STATE, "k", 1, st), 22);
    assert_int_equal(st[13], 3);
    assert_int_equal(le32(st + 8), fpp); /* Q's id is P's fingerprint */

    /* a default limiter of P: Q's state is cold by then */
    rate_limiter_t *lp = limiter_of(p_text, s);
    rate_decision_t d = at(lp, "k", 3 * SEC, 0, 0);
    assert_int_equal(d.reason, RATE_REASON_ALLOWED);
    assert_int_equal(d.remaining, 17094);
    /* a first-edition limiter of P: the same */
    rate_limiter_config_t cfg = {0};
    cfg.store = s;
    cfg.first_edition_format = true;
    rate_limiter_t *l1 = limiter_cfg(p_text, cfg);
    d = at(l1, "k", 3 * SEC, 0, 0);
    if (d.reason != RATE_REASON_ALLOWED || d.remaining != 17094)
        fail_msg("first-edition limiter of '%s' read the state of '%s' "
                 "(tag %08x = its fingerprint) as its own: reason=%s "
                 "error=%s remaining=%llu, want a cold bucket (17094)",
                 p_text, q_text, fpp, rate_reason_name(d.reason),
                 rate_err_name(d.error), (unsigned long long)d.remaining);
    rate_limiter_free(l1);
    rate_limiter_free(lp);
    rate_limiter_free(lq);
    rate_store_free(s);
    rate_policy_free(p);
    rate_policy_free(q);
}

/* ------------------------------------------- 7. set_policy, live */

static void set_policy_on(int kind)
{
    rate_store_t *s = store_of(kind, "setp:");
    rate_limiter_t *l = limiter_of("token-bucket 10/s burst=10", s);
    const rate_policy_t *before = rate_limiter_policy(l);
    char buf[128];

    for (int i = 0; i < 10; i++)
        assert_true(ask(l, "k", SEC, i % 2));
    assert_false(ask(l, "k", SEC, false));
    rate_policy_t *np = policy_of("token-bucket 20/s burst=20");
    assert_int_equal(rate_limiter_set_policy(l, np), RATE_OK);
    rate_policy_free(np); /* copied */
    const rate_policy_t *after = rate_limiter_policy(l);
    assert_ptr_not_equal(after, before);
    rate_policy_format(after, buf, sizeof buf);
    assert_string_equal(buf, "token-bucket 20/s burst=20");
    rate_policy_format(before, buf, sizeof buf);
    assert_string_equal(buf, "token-bucket 10/s burst=10");

    /* drained stays drained, by both calls; then 20/s from t_last */
    assert_false(ask(l, "k", SEC, false));
    assert_false(ask(l, "k", SEC, true));
    assert_false(ask(l, "k", SEC + 49 * MS, false));
    assert_true(ask(l, "k", SEC + 50 * MS, false));
    assert_false(ask(l, "k", SEC + 50 * MS, true));
    /* back to a smaller burst: the bucket is capped, never refilled */
    for (int i = 0; i < 20; i++)
        assert_true(ask(l, "b", SEC, i % 2));
    np = policy_of("token-bucket 10/s burst=10; fixed-window 100/m");
    assert_int_equal(rate_limiter_set_policy(l, np), RATE_OK);
    rate_policy_free(np);
    assert_false(ask(l, "b", SEC, false));
    assert_false(ask(l, "b", SEC, true));
    rate_policy_format(before, buf, sizeof buf);
    assert_string_equal(buf, "token-bucket 10/s burst=10");
    rate_policy_format(after, buf, sizeof buf);
    assert_string_equal(buf, "token-bucket 20/s burst=20");
    rate_limiter_free(l);

    /* A state back at its cold start under the old policy by the time of
     * the request is a cold key under the new one; one that is not yet
     * carries, and the new (slower) rate governs the time since t_last. */
    l = limiter_of("token-bucket 10/s burst=10", s);
    for (int i = 0; i < 10; i++) {
        assert_true(ask(l, "cold", 10 * SEC, true));
        assert_true(ask(l, "warm", 10 * SEC, false));
    }
    np = policy_of("token-bucket 1/s burst=20");
    assert_int_equal(rate_limiter_set_policy(l, np), RATE_OK);
    rate_policy_free(np);
    rate_decision_t d = at(l, "cold", 11 * SEC, 0, 0); /* full at 10/s */
    assert_int_equal(d.remaining, 20);
    d = at(l, "warm", 10 * SEC + 900 * MS, 0, 0); /* 9 at 10/s: carries */
    assert_int_equal(d.remaining, 0);
    assert_false(at(l, "warm", 10 * SEC + 900 * MS, 1, 0).allowed);
    /* at 11 s the old policy's bucket is full again: a cold key */
    d = at(l, "warm", 11 * SEC, 1, 0);
    assert_true(d.allowed);
    assert_int_equal(d.remaining, 19);
    rate_limiter_free(l);
    free_store(kind, s);
}

static void set_policy_live(void **state)
{
    (void)state;
    set_policy_on(ST_MEMORY);
    set_policy_on(ST_CAS);
}

static void set_policy_redis(void **state)
{
    (void)state;
    set_policy_on(ST_REDIS);
}

int main(void)
{
    const struct CMUnitTest local[] = {
        cmocka_unit_test(pairs_on_memory),
        cmocka_unit_test(pairs_on_cas),
        cmocka_unit_test(other_algorithm_memory),
        cmocka_unit_test(shadow_memory),
        cmocka_unit_test(lost_record_generic),
        cmocka_unit_test(first_edition_generic),
        cmocka_unit_test(first_edition_unknown_policy),
        cmocka_unit_test(first_edition_reads_ids_by_record),
        cmocka_unit_test(set_policy_live),
    };
    const struct CMUnitTest redis[] = {
        cmocka_unit_test(pairs_on_redis),
        cmocka_unit_test(other_algorithm_redis),
        cmocka_unit_test(shadow_redis),
        cmocka_unit_test(two_processes),
        cmocka_unit_test(lost_record_redis),
        cmocka_unit_test(unknown_version),
        cmocka_unit_test(first_edition_redis),
        cmocka_unit_test(set_policy_redis),
    };
    int failed = cmocka_run_group_tests_name("carry", local, NULL, NULL);
    failed += cmocka_run_group_tests_name("carry-redis", redis, group_setup,
                                          group_teardown);
    return failed;
}
