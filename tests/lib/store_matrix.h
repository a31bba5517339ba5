/* SPDX-License-Identifier: MIT */
/*
 * The store matrix (header-only, static): what every store must do,
 * written once and run over a list of store kinds (docs/store-writers.md,
 * "Testing a store").  For each kind it runs
 *
 *   - conformance: keys independent and binary safe, states far past any
 *     inline buffer, composite states, denials and queries writing nothing;
 *   - differential traces: random decisions, bool calls, refunds,
 *     penalties and resets over the five algorithms, composites, a block
 *     and the buckets' wide layout, on enforcing and shadow limiters, and
 *     random small policies at nanosecond steps (refills completing
 *     exactly now, window edges, log expiries), random composite policies
 *     changed under their keys, every field of every decision the same as
 *     the memory store's at the same times.
 *
 * A kind is a factory (a fresh store in a namespace of its own per test),
 * with optional start/stop for the server it needs, and, for an
 * asynchronous store, its loop: decisions then go through
 * rate_limiter_check_start_at and the loop turns until they complete.
 * store_matrix_main() runs the kinds named in $RATE_STORES (a comma list;
 * every kind when unset); a kind whose server cannot start is skipped with
 * the reason, or fails under CI=true (every kind named skipped: the
 * program is, exit 77).
 */
#ifndef TEST_LIB_STORE_MATRIX_H
#define TEST_LIB_STORE_MATRIX_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "rng.h"
#include "wait.h"

typedef struct store_kind store_kind_t;
struct store_kind {
    const char *name;
    /* Starts what the kind needs (a server, a loop): 0; else non-zero
     * with the reason in why (the kind is skipped).  NULL: nothing. */
    int (*start)(store_kind_t *k, char *why, size_t len);
    void (*stop)(store_kind_t *k); /* NULL: nothing */
    /* A fresh store in a namespace of its own: RATE_OK. */
    int (*make)(store_kind_t *k, rate_store_t **out);
    /* Removes the store's namespace and frees it (NULL: rate_store_free). */
    void (*drop)(store_kind_t *k, rate_store_t *s);
    /* An asynchronous store: decisions are started and `turn` runs one
     * turn of its loop (waiting for an event) until they complete. */
    void (*turn)(store_kind_t *k);
    void *ud; /* the kind's own */
};

/* What a kind's factory returns: rc, with the store's message on stderr
 * when it failed. */
static inline int sm_made(const store_kind_t *k, int rc, const char *err)
{
    if (rc != RATE_OK)
        fprintf(stderr, "%s: %s\n", k->name, err);
    return rc;
}

typedef struct sm_case {
    store_kind_t *kind;
    rate_store_t *store;
} sm_case_t;

static int sm_setup(void **state)
{
    sm_case_t *c = calloc(1, sizeof *c);
    assert_non_null(c);
    c->kind = *state;
    int rc = c->kind->make(c->kind, &c->store);
    if (rc != RATE_OK || c->store == NULL) {
        free(c);
        fail_msg("%s: the factory failed: %s", ((store_kind_t *)*state)->name,
                 rate_err_name(rc));
    }
    *state = c;
    return 0;
}

static int sm_teardown(void **state)
{
    sm_case_t *c = *state;
    if (c->kind->drop != NULL)
        c->kind->drop(c->kind, c->store);
    else
        rate_store_free(c->store);
    free(c);
    return 0;
}

typedef struct sm_wait {
    bool done;
    int rc;
    rate_decision_t *d;
} sm_wait_t;

static void sm_decided(void *ud, int rc, const rate_decision_t *d)
{
    sm_wait_t *w = ud;
    w->rc = rc;
    *w->d = *d;
    w->done = true;
}

/* One decision on the case's kind: synchronous, or started and completed
 * on the kind's loop (the store's own timeout bounds each turn; the test
 * gives up after TEST_WAIT_S). */
static inline int sm_check(sm_case_t *c, rate_limiter_t *l, const char *key,
                           size_t len, uint64_t n, uint64_t mw, uint64_t t,
                           rate_decision_t *d)
{
    if (c->kind->turn == NULL)
        return rate_limiter_check_at(l, key, len, n, mw, t, d);
    sm_wait_t w = {false, RATE_OK, d};
    int rc = rate_limiter_check_start_at(l, key, len, n, mw, t, d,
                                         sm_decided, &w);
    if (rc != RATE_PENDING)
        return rc;
    uint64_t deadline = test_now_ns() + TEST_WAIT_S * SEC;
    while (!w.done && test_now_ns() < deadline)
        c->kind->turn(c->kind);
    if (!w.done)
        fail_msg("%s: a decision did not complete in %d s", c->kind->name,
                 TEST_WAIT_S);
    return w.rc;
}

static inline rate_decision_t sm_at(sm_case_t *c, rate_limiter_t *l,
                                    const char *key, size_t len, uint64_t t,
                                    uint64_t n)
{
    rate_decision_t d;
    int rc = sm_check(c, l, key, len, n, 0, t, &d);
    if (rc != RATE_OK)
        fail_msg("%s: check: %s", c->kind->name, rate_err_name(rc));
    if (d.reason == RATE_REASON_STORE_ERROR)
        fail_msg("%s: a store error (%d)", c->kind->name, d.error);
    return d;
}

/* ------------------------------------------------------- conformance */

static void sm_keys_are_independent_and_binary_safe(void **state)
{
    sm_case_t *c = *state;
    rate_limiter_t *l = limiter_of("fixed-window 2/s", c->store);
    static const char *keys[] = {"a", "b", "a b", "{x}", "line\nbreak",
                                 "tab\there", "\xff\xfe", "user:42"};
    char nul[5] = {'n', 0, 'u', 0, 'l'};
    char longkey[RATE_KEY_MAX];
    memset(longkey, 'z', sizeof longkey);
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            assert_int_equal(
                sm_at(c, l, keys[i], strlen(keys[i]), 0, 1).allowed,
                round < 2);
        assert_int_equal(sm_at(c, l, nul, 5, 0, 1).allowed, round < 2);
        assert_int_equal(sm_at(c, l, nul, 3, 0, 1).allowed, round < 2);
        assert_int_equal(sm_at(c, l, longkey, sizeof longkey, 0, 1).allowed,
                         round < 2);
        assert_int_equal(
            sm_at(c, l, longkey, sizeof longkey - 1, 0, 1).allowed,
            round < 2);
    }
    rate_limiter_free(l);
}

static void sm_large_state_round_trips(void **state)
{
    sm_case_t *c = *state;
    /* A sliding log of 3000 entries: far past every inline buffer. */
    rate_limiter_t *l = limiter_of("sliding-log 3000/1h", c->store);
    for (uint64_t i = 0; i < 3000; i++)
        assert_true(sm_at(c, l, "log", 3, i * MS, 1).allowed);
    rate_decision_t d = sm_at(c, l, "log", 3, 3000 * MS, 1);
    assert_false(d.allowed);
    assert_int_equal(d.retry_after_ns, 3600 * SEC - 3000 * MS);
    d = sm_at(c, l, "log", 3, 3600 * SEC, 1); /* the first entry leaves */
    assert_true(d.allowed);
    assert_int_equal(d.remaining, 0);
    rate_limiter_free(l);
}

static void sm_composite_state_round_trips(void **state)
{
    sm_case_t *c = *state;
    rate_limiter_t *l = limiter_of(
        "token-bucket 5/s burst=5; sliding-log 8/10s; sliding-window 9/m",
        c->store);
    int ok = 0;
    for (uint64_t t = 0; t < 10 * SEC; t += 100 * MS)
        ok += sm_at(c, l, "c", 1, t, 1).allowed;
    assert_int_equal(ok, 8); /* the log's limit binds */
    rate_limiter_free(l);
}

static void sm_denials_and_queries_write_nothing(void **state)
{
    sm_case_t *c = *state;
    rate_stats_t before, after;
    memset(&before, 0, sizeof before); /* a store without stats leaves them */
    memset(&after, 0, sizeof after);
    rate_limiter_t *l = limiter_of("token-bucket 1/s burst=1", c->store);
    rate_store_stats(c->store, &before);
    sm_at(c, l, "q", 1, 0, 0); /* query on an absent key */
    sm_at(c, l, "q", 1, 0, 2); /* never */
    rate_store_stats(c->store, &after);
    assert_int_equal(after.keys, before.keys);
    /* and the key is still fresh: a full burst is there */
    assert_true(sm_at(c, l, "q", 1, 0, 1).allowed);
    rate_limiter_free(l);
}

/* ------------------------------------------------------ differential */

/* The policies every store's traces run over: the five algorithms,
 * composites, a block after a breach, a window that does not divide a
 * second (the Redis scripts decline it), the buckets' wide layout (B * P
 * past 2^62) and a burst past the Redis scripts' exact range. */
static const char *const sm_policies[] = {
    "token-bucket 5/s burst=3",
    "leaky-bucket 7/3s capacity=4",
    "fixed-window 4/700ms",
    "sliding-log 5/s",
    "sliding-window 6/s",
    "token-bucket 10/s burst=5; sliding-log 20/3s; fixed-window 30/m",
    "leaky-bucket 3/s capacity=2; sliding-window 8/2s",
    "token-bucket 5/s burst=3 block=700ms",
    "fixed-window 3/1300ms",
    "token-bucket 1/h burst=400000",
    "token-bucket 1/h burst=400000000000",
    "token-bucket 100000/1d burst=100000",
    "leaky-bucket 100000/1d capacity=100000",
};
#define SM_POLICIES (sizeof sm_policies / sizeof sm_policies[0])

/* How many permits a trace's step asks for: mostly a few, now and then a
 * good part of a wide bucket (a burst of 100000 and more). */
static inline uint64_t sm_permits(uint64_t burst)
{
    return burst >= 100000 && rnd(4) == 0 ? rnd(burst / 3) : rnd(6);
}

/* Decisions, bool calls, refunds, penalties and resets on a few keys, at
 * the caller's times, now and then back in time, on memory and on the
 * case's store, through enforcing and shadow limiters: every field of
 * every decision the same. */
static void sm_same_decisions_as_memory(void **state)
{
    sm_case_t *c = *state;
    static const char *keys[] = {"a", "user 42", "{braces}", "new\nline",
                                 "\xff\x00\x01", "}{", "k:1"};
    static const size_t key_lens[] = {1, 7, 8, 8, 3, 2, 3};
    unsigned ops[5] = {0};
    rnd_seed(0x5EED0F57);
    for (size_t run = 0; run < 2 * SM_POLICIES; run++) {
        size_t p = run % SM_POLICIES;
        rate_limiter_config_t cfg = {0};
        cfg.shadow = run >= SM_POLICIES;
        rate_store_t *ms;
        assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
        cfg.store = ms;
        rate_limiter_t *lm = limiter_cfg(sm_policies[p], cfg);
        cfg.store = c->store;
        rate_limiter_t *ls = limiter_cfg(sm_policies[p], cfg);
        const rate_limit_t *lim =
            rate_policy_limit(rate_limiter_policy(lm), 0);
        /* One policy at times past 2^51 ns: the Redis scripts decline
         * them (the C step decides), the others take them as any. */
        uint64_t t = SEC + rnd(5 * SEC) + (p == 2 ? UINT64_C(1) << 51 : 0);
        for (int i = 0; i < 150; i++) {
            size_t k = rnd(7);
            char key[16];
            key[0] = (char)('a' + run); /* keys per run */
            memcpy(key + 1, keys[k], key_lens[k]);
            size_t kl = key_lens[k] + 1;
            if (rnd(8) == 0 && t > 100 * MS)
                t -= rnd(100 * MS);
            else
                t += rnd(400 * MS);
            uint64_t n = sm_permits(lim->burst);
            int op = (int)rnd(12), x, y;
            const char *name;
            if (op < 6) {
                uint64_t mw = rnd(3) == 0 ? rnd(SEC) : 0;
                rate_decision_t a, b;
                assert_int_equal(
                    rate_limiter_check_at(lm, key, kl, n, mw, t, &a),
                    RATE_OK);
                assert_int_equal(sm_check(c, ls, key, kl, n, mw, t, &b),
                                 RATE_OK);
                expect_same_decision(&a, &b, sm_policies[p], c->kind->name,
                                     i, t, n, mw);
                if (b.reason == RATE_REASON_STORE_ERROR)
                    fail_msg("%s: a store error (%d)", c->kind->name,
                             b.error);
                ops[0]++;
                continue;
            } else if (op < 8) {
                bool bx = rate_try_acquire_len_at(lm, key, kl, n, t);
                bool by = rate_try_acquire_len_at(ls, key, kl, n, t);
                if (bx != by)
                    fail_msg("%s, step %d: bool call %d on memory, %d on %s",
                             sm_policies[p], i, bx, by, c->kind->name);
                ops[1]++;
                continue;
            } else if (op < 10) {
                name = "refund";
                x = rate_limiter_refund_at(lm, key, kl, n, t);
                y = rate_limiter_refund_at(ls, key, kl, n, t);
                ops[2]++;
            } else if (op < 11) {
                name = "penalize";
                x = rate_limiter_penalize_at(lm, key, kl, n, t);
                y = rate_limiter_penalize_at(ls, key, kl, n, t);
                ops[3]++;
            } else {
                name = "reset";
                x = rate_limiter_reset(lm, key, kl);
                y = rate_limiter_reset(ls, key, kl);
                ops[4]++;
            }
            if (x != RATE_OK || y != RATE_OK)
                fail_msg("%s, step %d: %s gives %s on memory, %s on %s",
                         sm_policies[p], i, name, rate_err_name(x),
                         rate_err_name(y), c->kind->name);
        }
        rate_limiter_free(lm);
        rate_limiter_free(ls);
        rate_store_free(ms);
    }
    for (int i = 0; i < 5; i++)
        assert_true(ops[i] > 20); /* every kind of step was taken */
}

/* Windows that divide a second, whose edges the Redis scripts compute
 * (others they decline, and the client decides). */
static const uint64_t sm_divisors[] = {1,   2,   4,   5,   8,   10,  16,
                                       20,  25,  32,  40,  50,  64,  80,
                                       100, 125, 128, 160, 200, 250, 256,
                                       320, 400, 500, 512, 625, 640, 800};

/* Small random policies and nanosecond steps, so that refills completing
 * exactly now, window edges and log expiries happen all the time, now
 * and then an idle of weeks (past 2^50 ns): every field of every decision
 * the same as the memory store's. */
static void sm_same_decisions_at_the_boundaries(void **state)
{
    sm_case_t *c = *state;
    unsigned checked = 0;
    rnd_seed(0xB0DA1E5);
    for (int algo = 1; algo <= 5; algo++) {
        for (int trace = 0; trace < 12; trace++) {
            uint64_t period =
                algo <= 2 || trace % 4 == 3
                    ? 1 + rnd(997)
                    : sm_divisors[rnd(sizeof sm_divisors /
                                      sizeof sm_divisors[0])];
            rate_limit_t lim = {(rate_algorithm_t)algo, 1 + rnd(5), period,
                                algo <= 2 ? 1 + rnd(4) : 0, 0, {0}};
            rate_policy_t *p;
            assert_int_equal(rate_policy_new(&lim, 1, &p, NULL, 0), RATE_OK);
            rate_store_t *ms;
            assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
            rate_limiter_config_t cfg = {0};
            rate_limiter_t *lm, *ls;
            cfg.policy = p;
            cfg.store = ms;
            assert_int_equal(rate_limiter_new(&cfg, &lm), RATE_OK);
            cfg.store = c->store;
            assert_int_equal(rate_limiter_new(&cfg, &ls), RATE_OK);
            char key[32], what[64];
            snprintf(key, sizeof key, "%d-%d", algo, trace);
            snprintf(what, sizeof what, "algorithm %d %llu/%lluns b=%llu",
                     algo, (unsigned long long)lim.limit,
                     (unsigned long long)lim.period_ns,
                     (unsigned long long)lim.burst);
            uint64_t t = rnd(3000);
            for (int i = 0; i < 80; i++) {
                if (rnd(10) == 0 && t > 50)
                    t -= rnd(50);
                else if (rnd(40) == 0) /* idle for weeks: past 2^50 ns */
                    t += (UINT64_C(1) << 51) + rnd(SEC);
                else
                    t += rnd(4) == 0 ? 0 : rnd(lim.period_ns * 2);
                uint64_t cap = algo <= 2 ? lim.burst : lim.limit;
                uint64_t n = rnd(cap + 2);
                uint64_t mw = algo <= 2 && rnd(3) == 0 ? rnd(3000) : 0;
                rate_decision_t a, b;
                assert_int_equal(rate_limiter_check_at(lm, key, strlen(key),
                                                       n, mw, t, &a),
                                 RATE_OK);
                assert_int_equal(
                    sm_check(c, ls, key, strlen(key), n, mw, t, &b),
                    RATE_OK);
                expect_same_decision(&a, &b, what, c->kind->name, i, t, n,
                                     mw);
                checked++;
            }
            rate_limiter_free(lm);
            rate_limiter_free(ls);
            rate_store_free(ms);
            rate_policy_free(p);
        }
    }
    assert_int_equal(checked, 5 * 12 * 80);
}

/* One limit of a random policy: any algorithm, small numbers, times in
 * nanoseconds, now and then a block. */
static inline void sm_limit_text(char *buf, size_t len)
{
    static const char *names[] = {"token-bucket", "leaky-bucket",
                                  "fixed-window", "sliding-log",
                                  "sliding-window"};
    unsigned a = (unsigned)rnd(5);
    int n = snprintf(buf, len, "%s %llu/%lluns", names[a],
                     (unsigned long long)(1 + rnd(a == 3 ? 6 : 9)),
                     (unsigned long long)(1 + rnd(2000)));
    if (a == 0)
        n += snprintf(buf + n, len - (size_t)n, " burst=%llu",
                      (unsigned long long)(1 + rnd(6)));
    if (a == 1)
        n += snprintf(buf + n, len - (size_t)n, " capacity=%llu",
                      (unsigned long long)(1 + rnd(6)));
    if (rnd(6) == 0)
        snprintf(buf + n, len - (size_t)n, " block=%lluns",
                 (unsigned long long)(1 + rnd(3000)));
}

/* A random policy: one to three limits. */
static inline rate_policy_t *sm_random_policy(void)
{
    char text[512] = "", one[128];
    unsigned n = 1 + (unsigned)(rnd(3) == 0 ? 1 + rnd(2) : 0);
    for (unsigned i = 0; i < n; i++) {
        if (i > 0)
            strcat(text, "; ");
        sm_limit_text(one, sizeof one);
        strcat(text, one);
    }
    return policy_of(text);
}

/* Random policies of one to three limits, enforcing or shadow, in the
 * first edition's format or not, changed under the keys now and then (a
 * tier change: the states carry over through the policy records), with
 * decisions, bool calls, refunds, penalties and resets: every call's
 * code and decision the same as on the memory store. */
static void sm_random_policies_same_as_memory(void **state)
{
    sm_case_t *c = *state;
    unsigned compared = 0;
    rnd_seed(0x2545F4914F6CDD1D);
    for (int trace = 0; trace < 60; trace++) {
        rate_store_t *mem = NULL;
        assert_int_equal(rate_store_memory_new(NULL, &mem), RATE_OK);
        rate_policy_t *p = sm_random_policy(), *p2 = sm_random_policy();
        rate_limiter_config_t cfg = {0};
        cfg.policy = p;
        cfg.shadow = rnd(8) == 0;
        cfg.first_edition_format = rnd(10) == 0;
        rate_limiter_t *lm = NULL, *lo = NULL;
        cfg.store = mem;
        assert_int_equal(rate_limiter_new(&cfg, &lm), RATE_OK);
        cfg.store = c->store;
        assert_int_equal(rate_limiter_new(&cfg, &lo), RATE_OK);
        char text[512];
        rate_policy_format(p, text, sizeof text);
        uint64_t t = rnd(5000);
        for (int i = 0; i < 150; i++) {
            char key[48];
            snprintf(key, sizeof key, "r-%d-%u", trace, (unsigned)rnd(3));
            size_t kl = strlen(key);
            if (rnd(8) == 0 && t > 100)
                t -= rnd(100);
            else
                t += rnd(4) == 0 ? 0 : rnd(1500);
            uint64_t n = rnd(5), mw = rnd(4) == 0 ? rnd(3000) : 0;
            int op = (int)rnd(20);
            rate_decision_t dm, dq;
            int rm, ro;
            memset(&dm, 0, sizeof dm);
            memset(&dq, 0, sizeof dq);
            if (op < 12) {
                rm = rate_limiter_check_at(lm, key, kl, n, mw, t, &dm);
                ro = sm_check(c, lo, key, kl, n, mw, t, &dq);
            } else if (op < 16) {
                rm = rate_try_acquire_len_at(lm, key, kl, n, t);
                ro = rate_try_acquire_len_at(lo, key, kl, n, t);
            } else if (op == 16) {
                rm = rate_limiter_refund_at(lm, key, kl, n, t);
                ro = rate_limiter_refund_at(lo, key, kl, n, t);
            } else if (op == 17) {
                rm = rate_limiter_penalize_at(lm, key, kl, n, t);
                ro = rate_limiter_penalize_at(lo, key, kl, n, t);
            } else if (op == 18) {
                rm = rate_limiter_reset(lm, key, kl);
                ro = rate_limiter_reset(lo, key, kl);
            } else {
                rate_policy_t *q = p2;
                p2 = p;
                p = q;
                rm = rate_limiter_set_policy(lm, p);
                ro = rate_limiter_set_policy(lo, p);
            }
            if (rm != ro)
                fail_msg("%s: trace %d (%s) call %d op %d key %s t=%llu: "
                         "code %d on memory, %d", c->kind->name, trace, text,
                         i, op, key, (unsigned long long)t, rm, ro);
            expect_same_decision(&dm, &dq, text, c->kind->name, i, t, n, mw);
            compared++;
        }
        rate_limiter_free(lm);
        rate_limiter_free(lo);
        rate_policy_free(p);
        rate_policy_free(p2);
        rate_store_free(mem);
    }
    assert_int_equal(compared, 60 * 150);
}

/* ------------------------------------------------------------- runner */

/* A case of a matrix: its name and its test, which reads its sm_case_t
 * from *state. */
typedef struct sm_case_def {
    const char *name;
    CMUnitTestFunction fn;
} sm_case_def_t;

static const sm_case_def_t sm_cases[] = {
    {"keys_are_independent_and_binary_safe",
     sm_keys_are_independent_and_binary_safe},
    {"large_state_round_trips", sm_large_state_round_trips},
    {"composite_state_round_trips", sm_composite_state_round_trips},
    {"denials_and_queries_write_nothing",
     sm_denials_and_queries_write_nothing},
    {"same_decisions_as_memory", sm_same_decisions_as_memory},
    {"same_decisions_at_the_boundaries", sm_same_decisions_at_the_boundaries},
    {"random_policies_same_as_memory", sm_random_policies_same_as_memory},
};
#define SM_CASES (sizeof sm_cases / sizeof sm_cases[0])

/* Whether `name` is in the comma list `list` (NULL: every name is).  A
 * list of names each after a '-' names every kind but those
 * (RATE_STORES=-dynamodb: all the others). */
static inline bool sm_selected(const char *list, const char *name)
{
    if (list == NULL || *list == '\0')
        return true;
    bool but = *list == '-';
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        const char *word = p;
        if (but && len > 0 && *word == '-')
            word++, len--;
        if (len == n && strncmp(word, name, n) == 0)
            return !but;
        p = word + len + (e != NULL);
    }
    return but;
}

#define SM_MAX_CASES 16

/* Runs `cases` over `kinds` (those $RATE_STORES names), each case on a
 * fresh store of its kind: 0 when every case of every kind run passed; 1
 * when one failed, when $RATE_STORES names no kind here, or when a kind
 * could not start under CI=true; 77 (ctest's skip) when every kind named
 * could not start (no dynalite).  (Another matrix over store kinds, such
 * as the synced mode's remotes, runs its own cases with it.) */
static inline int store_matrix_run(store_kind_t *kinds, size_t nkinds,
                                   const sm_case_def_t *cases, size_t ncases)
{
    const char *only = getenv("RATE_STORES");
    const char *ci = getenv("CI");
    bool strict = ci != NULL && strcmp(ci, "true") == 0;
    int failed = 0;
    size_t ran = 0, skipped = 0;
    for (size_t k = 0; k < nkinds; k++) {
        store_kind_t *kind = &kinds[k];
        if (!sm_selected(only, kind->name))
            continue;
        char why[256] = "";
        if (kind->start != NULL && kind->start(kind, why, sizeof why) != 0) {
            fprintf(stderr, "store matrix: %s %s: %s\n", kind->name,
                    strict ? "FAILED (CI=true)" : "SKIPPED", why);
            failed |= strict;
            skipped++;
            continue;
        }
        struct CMUnitTest tests[SM_MAX_CASES];
        char names[SM_MAX_CASES][96];
        assert_true(ncases <= SM_MAX_CASES);
        for (size_t i = 0; i < ncases; i++) {
            snprintf(names[i], sizeof names[i], "%s: %s", kind->name,
                     cases[i].name);
            tests[i] = (struct CMUnitTest){names[i], cases[i].fn, sm_setup,
                                           sm_teardown, kind};
        }
        char group[64];
        snprintf(group, sizeof group, "store %s", kind->name);
        failed |= _cmocka_run_group_tests(group, tests, ncases, NULL,
                                          NULL) != 0;
        if (kind->stop != NULL)
            kind->stop(kind);
        ran++;
    }
    if (ran == 0 && skipped > 0)
        return failed ? 1 : 77;
    if (ran == 0 && only != NULL) {
        fprintf(stderr, "store matrix: RATE_STORES=%s names no store kind "
                        "this build has\n", only);
        return 1;
    }
    return failed;
}

/* The store matrix's own cases over `kinds`. */
static inline int store_matrix_main(store_kind_t *kinds, size_t nkinds)
{
    return store_matrix_run(kinds, nkinds, sm_cases, SM_CASES);
}

#endif
