/* SPDX-License-Identifier: MIT */
/*
 * The asynchronous Redis store decides as the synchronous one does
 * (issue 27): over ratelimit.so's RATELIMIT.STEP when the server has it,
 * else a lean script by FCALL, else the general script by EVALSHA; the
 * module lost (MODULE UNLOAD) and found again as the synchronous store
 * loses and finds it.  Each path is checked by what Redis itself counts
 * (INFO commandstats) and by the store's counters, and every decision
 * against the synchronous store and the memory store, field by field.
 */
#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "lib/async_loop.h"
#include "lib/redis_server.h"

#define RND_SEED 88172645463325252u
#include "lib/rng.h"

#ifndef RATE_MODULE_PATH
#error "RATE_MODULE_PATH: the path of ratelimit.so"
#endif

static const char *const with_module[] = {
    "--loadmodule", RATE_MODULE_PATH, "--enable-module-command", "yes",
    NULL};

REDIS_GROUP_SERVER(with_module)

static redisContext *raw(void)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c == NULL || c->err)
        fail_msg("cannot connect to port %d", port);
    return c;
}

/* Redis's count of calls of one command so far (INFO commandstats). */
static uint64_t calls_of(const char *cmd)
{
    redisContext *c = raw();
    redisReply *r = redisCommand(c, "INFO commandstats");
    char pat[64];
    uint64_t n = 0;
    snprintf(pat, sizeof pat, "cmdstat_%s:calls=", cmd);
    if (r == NULL || r->type != REDIS_REPLY_STRING)
        fail_msg("INFO commandstats failed");
    const char *p = strstr(r->str, pat);
    if (p != NULL)
        n = strtoull(p + strlen(pat), NULL, 10);
    freeReplyObject(r);
    redisFree(c);
    return n;
}

typedef struct counts {
    uint64_t step, fcall, evalsha, eval;
} counts_t;

static counts_t counts(void)
{
    return (counts_t){calls_of("ratelimit.step"), calls_of("fcall"),
                      calls_of("evalsha"), calls_of("eval")};
}

static rate_store_t *async_store(tloop_t *t, const char *prefix,
                                 rate_redis_module_t module)
{
    rate_redis_options_t o = {0};
    rate_store_t *s = NULL;
    char err[256] = "";
    o.prefix = prefix;
    o.module = module;
    if (rate_store_redis_async_new(url, &o, &t->loop, &s, err, sizeof err) !=
        RATE_OK)
        fail_msg("async redis store: %s", err);
    return s;
}

static rate_store_t *sync_store(const char *prefix, rate_redis_module_t module)
{
    rate_redis_options_t o = {0};
    rate_store_t *s = NULL;
    char err[256] = "";
    o.prefix = prefix;
    o.module = module;
    if (rate_store_redis_new(url, &o, &s, err, sizeof err) != RATE_OK)
        fail_msg("redis store: %s", err);
    return s;
}

static rate_redis_async_stats_t astats(rate_store_t *s)
{
    rate_redis_async_stats_t st;
    assert_int_equal(rate_store_redis_async_stats(s, &st), RATE_OK);
    return st;
}


/* One asynchronous decision at time `at`, waited for. */
static rate_decision_t decide_async(tloop_t *t, rate_limiter_t *l,
                                    const char *key, uint64_t n, uint64_t at)
{
    req_t q = {0};
    int rc = start_at(l, key, n, &q, at);
    assert_true(rc == RATE_OK || rc == RATE_PENDING);
    wait_all(t);
    assert_int_equal(q.calls, 1);
    assert_int_equal(q.rc, RATE_OK);
    return q.d;
}

/* `steps` decisions of random keys, times and permits under `pol`: the
 * asynchronous limiter `la` against the synchronous `ls` and a memory
 * store's, field by field; the first decision of la (its policy record
 * written) before *before is read. */
static void trace(tloop_t *t, const char *pol, rate_limiter_t *la,
                  rate_limiter_t *ls, int steps, counts_t *before,
                  counts_t *after)
{
    rate_store_t *ms;
    assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
    rate_limiter_t *lm = lim(pol, ms, false, RATE_FAIL_CLOSED);
    uint64_t at = SEC;
    decide_async(t, la, "warm-up", 1, at);
    *before = counts();
    rate_decision_t *got = calloc((size_t)steps, sizeof *got);
    uint64_t *times = calloc((size_t)steps, sizeof *times);
    uint64_t *perm = calloc((size_t)steps, sizeof *perm);
    int *keys = calloc((size_t)steps, sizeof *keys);
    for (int i = 0; i < steps; i++) {
        char key[8];
        at += rnd(300 * MS);
        times[i] = at;
        perm[i] = 1 + rnd(3);
        keys[i] = (int)rnd(3);
        snprintf(key, sizeof key, "u%d", keys[i]);
        got[i] = decide_async(t, la, key, perm[i], at);
    }
    *after = counts(); /* before the synchronous store's calls */
    for (int i = 0; i < steps; i++) {
        char key[8];
        rate_decision_t m, s;
        snprintf(key, sizeof key, "u%d", keys[i]);
        assert_int_equal(rate_limiter_check_at(lm, key, 2, perm[i], 0,
                                               times[i], &m),
                         RATE_OK);
        assert_int_equal(rate_limiter_check_at(ls, key, 2, perm[i], 0,
                                               times[i], &s),
                         RATE_OK);
        expect_same_decision(&m, &got[i], pol, "async store", i, times[i],
                             perm[i], 0);
        expect_same_decision(&s, &got[i], pol, "sync store", i, times[i],
                             perm[i], 0);
    }
    free(got);
    free(times);
    free(perm);
    free(keys);
    rate_limiter_free(lm);
    rate_store_free(ms);
}

/* With the module on the server, every decision of the asynchronous
 * store is one RATELIMIT.STEP and no script at all, for every algorithm,
 * a composite and a policy past the scripts' exact range. */
static void async_decides_by_the_module(void **state)
{
    (void)state;
    static const char *policies[] = {
        "token-bucket 5/s burst=3",
        "leaky-bucket 7/3s capacity=4",
        "fixed-window 4/700ms",
        "sliding-log 5/s",
        "sliding-window 6/s",
        "token-bucket 10/s burst=5; sliding-log 20/3s; fixed-window 30/m",
        "token-bucket 1000000/s burst=1099511627776",
    };
    tloop_t t;
    tloop_init(&t, false);
    for (size_t p = 0; p < sizeof policies / sizeof policies[0]; p++) {
        char pa[32], ps[32];
        snprintf(pa, sizeof pa, "am%zu:", p);
        snprintf(ps, sizeof ps, "sm%zu:", p);
        rate_store_t *as = async_store(&t, pa, RATE_REDIS_MODULE_AUTO);
        rate_store_t *ss = sync_store(ps, RATE_REDIS_MODULE_ON);
        rate_limiter_t *la = lim(policies[p], as, false, RATE_FAIL_CLOSED);
        rate_limiter_t *ls = lim(policies[p], ss, false, RATE_FAIL_CLOSED);
        counts_t b, a;
        trace(&t, policies[p], la, ls, 40, &b, &a);
        rate_redis_async_stats_t st = astats(as);
        if (a.step - b.step != 40 || a.fcall != b.fcall ||
            a.evalsha != b.evalsha || a.eval != b.eval)
            fail_msg("%s: 40 decisions took %llu RATELIMIT.STEP, %llu "
                     "FCALL, %llu EVALSHA, %llu EVAL (want 40, 0, 0, 0)",
                     policies[p], (unsigned long long)(a.step - b.step),
                     (unsigned long long)(a.fcall - b.fcall),
                     (unsigned long long)(a.evalsha - b.evalsha),
                     (unsigned long long)(a.eval - b.eval));
        assert_int_equal(st.module_decisions, 41); /* with the warm-up */
        assert_int_equal(st.module_fallbacks, 0);
        assert_int_equal(st.lean_decisions + st.general_decisions, 0);
        rate_limiter_free(la);
        rate_limiter_free(ls);
        rate_store_redis_drop(ss);
        rate_store_redis_drop(as);
        rate_store_free(as);
        rate_store_free(ss);
    }
    tloop_fini(&t);
}

/* With the module turned off: a lean script by FCALL for a single
 * bucket or window, the general script by EVALSHA for a composite. */
static void async_scripts_without_the_module(void **state)
{
    (void)state;
    static const struct {
        const char *policy;
        bool lean;
    } cases[] = {
        {"token-bucket 5/s burst=3", true},
        {"leaky-bucket 7/3s capacity=4", true},
        {"fixed-window 4/700ms", true},
        {"token-bucket 10/s burst=5; sliding-window 30/3s", false},
    };
    tloop_t t;
    tloop_init(&t, false);
    for (size_t p = 0; p < sizeof cases / sizeof cases[0]; p++) {
        char pa[32], ps[32];
        snprintf(pa, sizeof pa, "ao%zu:", p);
        snprintf(ps, sizeof ps, "so%zu:", p);
        rate_store_t *as = async_store(&t, pa, RATE_REDIS_MODULE_OFF);
        rate_store_t *ss = sync_store(ps, RATE_REDIS_MODULE_OFF);
        rate_limiter_t *la = lim(cases[p].policy, as, false, RATE_FAIL_CLOSED);
        rate_limiter_t *ls = lim(cases[p].policy, ss, false, RATE_FAIL_CLOSED);
        counts_t b, a;
        trace(&t, cases[p].policy, la, ls, 40, &b, &a);
        uint64_t want_f = cases[p].lean ? 40 : 0, want_e = 40 - want_f;
        if (a.step != b.step || a.fcall - b.fcall != want_f ||
            a.evalsha - b.evalsha != want_e || a.eval != b.eval)
            fail_msg("%s: 40 decisions took %llu RATELIMIT.STEP, %llu "
                     "FCALL, %llu EVALSHA, %llu EVAL (want 0, %llu, %llu, 0)",
                     cases[p].policy, (unsigned long long)(a.step - b.step),
                     (unsigned long long)(a.fcall - b.fcall),
                     (unsigned long long)(a.evalsha - b.evalsha),
                     (unsigned long long)(a.eval - b.eval),
                     (unsigned long long)want_f, (unsigned long long)want_e);
        rate_redis_async_stats_t st = astats(as);
        assert_int_equal(st.module_decisions, 0);
        assert_int_equal(st.lean_decisions, cases[p].lean ? 41 : 0);
        assert_int_equal(st.lean_evalsha, 0); /* every lean one by FCALL */
        assert_int_equal(st.general_decisions, cases[p].lean ? 0 : 41);
        rate_limiter_free(la);
        rate_limiter_free(ls);
        rate_store_redis_drop(ss);
        rate_store_redis_drop(as);
        rate_store_free(as);
        rate_store_free(ss);
    }
    tloop_fini(&t);
}

/* MODULE UNLOAD mid-run: the next decision, answered "unknown command",
 * is made by the scripts at once (no store error), and the scripts make
 * the rest; MODULE LOAD: the module again once the store's 5 s pause is
 * over.  The decisions match the memory store's throughout. */
static void async_module_lost_and_found(void **state)
{
    (void)state;
    const char *pol = "token-bucket 10/s burst=5; sliding-window 30/3s";
    tloop_t t;
    tloop_init(&t, false);
    rate_store_t *as = async_store(&t, "alf:", RATE_REDIS_MODULE_AUTO);
    rate_store_t *ms;
    assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
    rate_limiter_t *la = lim(pol, as, false, RATE_FAIL_CLOSED);
    rate_limiter_t *lm = lim(pol, ms, false, RATE_FAIL_CLOSED);
    redisContext *c = raw();
    uint64_t at = SEC;
    for (int i = 0; i < 300; i++) {
        if (i == 100) {
            redisReply *r = redisCommand(c, "MODULE UNLOAD ratelimit");
            if (r == NULL || r->type != REDIS_REPLY_STATUS)
                fail_msg("MODULE UNLOAD: %s", r ? r->str : "no reply");
            freeReplyObject(r);
        }
        if (i == 200) {
            redisReply *r = redisCommand(c, "MODULE LOAD %s",
                                         RATE_MODULE_PATH);
            if (r == NULL || r->type != REDIS_REPLY_STATUS)
                fail_msg("MODULE LOAD: %s", r ? r->str : "no reply");
            freeReplyObject(r);
            usleep(5100 * 1000); /* the store's retry pause, 5 s */
        }
        at += rnd(150 * MS);
        char key[8];
        snprintf(key, sizeof key, "u%d", (int)rnd(3));
        rate_decision_t a = decide_async(&t, la, key, 1, at), m;
        assert_int_equal(rate_limiter_check_at(lm, key, 2, 1, 0, at, &m),
                         RATE_OK);
        expect_same_decision(&m, &a, pol, "async across MODULE UNLOAD", i,
                             at, 1, 0);
        rate_redis_async_stats_t st = astats(as);
        if (i < 100)
            assert_int_equal(st.module_decisions, (uint64_t)i + 1);
        if (i >= 100 && i < 200) {
            assert_int_equal(st.module_decisions, 100);
            assert_int_equal(st.module_fallbacks, 1);
            assert_int_equal(st.general_decisions, (uint64_t)(i - 99));
        }
        if (i >= 200)
            assert_int_equal(st.module_decisions,
                             100 + (uint64_t)(i - 199));
    }
    redisFree(c);
    rate_limiter_free(la);
    rate_limiter_free(lm);
    rate_store_free(ms);
    rate_store_redis_drop(as);
    rate_store_free(as);
    tloop_fini(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(async_decides_by_the_module),
        cmocka_unit_test(async_scripts_without_the_module),
        cmocka_unit_test(async_module_lost_and_found),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
