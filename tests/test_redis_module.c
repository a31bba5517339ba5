/* SPDX-License-Identifier: MIT */
/*
 * ratelimit.so, the Redis module, in a private redis-server started with
 * --loadmodule: the store over the module against the memory store and
 * the store over the scripts, field by field (the module and the scripts
 * also taking turns on the same keys; the module at the boundaries of
 * small random policies is the store matrix's, tests/test_stores.c); the expiry against the server's
 * TIME; a replica and an AOF reload ending with the same bytes and
 * expiries; the store falling back to the scripts when the module is
 * absent or unloaded mid-run; CL.THROTTLE against hand-worked vectors of
 * redis-cell's documented semantics.
 */
#include <pthread.h>
#include <stdbool.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "lib/helpers.h"
#include "lib/redis_server.h"

#include <ratelimit_store.h>
#include <ratelimit_redis.h>

#include "internal.h"
#include "store/redis/fair.h"

#ifndef RATE_MODULE_PATH
#error "RATE_MODULE_PATH: the path of ratelimit.so"
#endif


static redisContext *raw_at(int p)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", p, tv);
    if (c == NULL || c->err)
        fail_msg("cannot connect to port %d", p);
    return c;
}

static pid_t start_with(int p, const char *const *extra)
{
    pid_t pid = redis_test_start_args(p, extra);
    if (pid == 0)
        fail_msg("redis-server did not start on port %d", p);
    return pid;
}

static const char *const with_module[] = {
    "--loadmodule", RATE_MODULE_PATH, "--enable-module-command", "yes",
    "--enable-debug-command", "yes", NULL};

REDIS_GROUP_SERVER(with_module)

static rate_store_t *store_on(const char *u, const char *prefix, bool no_ttl,
                              rate_redis_module_t module)
{
    rate_redis_options_t o = {0};
    rate_store_t *s = NULL;
    char err[256] = "";
    o.prefix = prefix;
    o.no_ttl = no_ttl;
    o.module = module;
    if (rate_store_redis_new(u, &o, &s, err, sizeof err) != RATE_OK)
        fail_msg("redis store: %s", err);
    return s;
}

static rate_redis_status_t status_of(rate_store_t *s)
{
    rate_redis_status_t st;
    assert_int_equal(rate_store_redis_status(s, &st), RATE_OK);
    return st;
}

#define RND_SEED 88172645463325252u
#include "lib/rng.h"
#include "lib/wait.h"

/* Redis's TIME in milliseconds. */
static long long redis_time_ms(redisContext *c)
{
    redisReply *r = redisCommand(c, "TIME");
    assert_true(r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2);
    long long ms = atoll(r->element[0]->str) * 1000 +
                   atoll(r->element[1]->str) / 1000;
    freeReplyObject(r);
    return ms;
}

/* Whether INFO `section` has `text`. */
static bool info_has(redisContext *c, const char *section, const char *text)
{
    redisReply *r = redisCommand(c, "INFO %s", section);
    bool has = r != NULL && r->type == REDIS_REPLY_STRING &&
               strstr(r->str, text) != NULL;
    freeReplyObject(r);
    return has;
}

/* ------------------------------------------------------ differential */

/* Random traces of every algorithm and composites, and policies past the
 * scripts' 2^50 bound: memory, the store over the module and the store
 * over the scripts, field by field.  A third limiter takes turns between
 * the module and the scripts on the same keys, so a key written by one is
 * decided by the other. */
static void three_ways_same(void **state)
{
    (void)state;
    static const char *policies[] = {
        "token-bucket 5/s burst=3",
        "leaky-bucket 7/3s capacity=4",
        "fixed-window 4/700ms",
        "sliding-log 5/s",
        "sliding-window 6/s",
        "token-bucket 10/s burst=5; sliding-log 20/3s; fixed-window 30/m",
        "leaky-bucket 3/s capacity=2; sliding-window 8/2s",
        /* past the scripts' exact range: compare-and-set for them, one
         * round trip in the module */
        "token-bucket 100/s burst=1000000",
        "fixed-window 1000/1h",
        "token-bucket 1000000/s burst=1099511627776",
        /* a block: compare-and-set in both */
        "token-bucket 5/s burst=3 block=700ms",
    };
    static const char *keys[] = {"a", "user 42", "{braces}", "new\nline",
                                 "k:1"};
    rate_store_t *rm = store_on(url, "dm:", true, RATE_REDIS_MODULE_ON);
    rate_store_t *rl = store_on(url, "dl:", true, RATE_REDIS_MODULE_OFF);
    /* the two of them on one namespace */
    rate_store_t *tm = store_on(url, "dt:", true, RATE_REDIS_MODULE_ON);
    rate_store_t *tl = store_on(url, "dt:", true, RATE_REDIS_MODULE_OFF);
    unsigned checked = 0;
    for (size_t p = 0; p < sizeof policies / sizeof policies[0]; p++) {
        rate_store_t *ms, *ms2;
        assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
        assert_int_equal(rate_store_memory_new(NULL, &ms2), RATE_OK);
        rate_limiter_t *lmem = limiter_of(policies[p], ms);
        rate_limiter_t *lmod = limiter_of(policies[p], rm);
        rate_limiter_t *llua = limiter_of(policies[p], rl);
        rate_limiter_t *lmem2 = limiter_of(policies[p], ms2);
        rate_limiter_t *ltm = limiter_of(policies[p], tm);
        rate_limiter_t *ltl = limiter_of(policies[p], tl);
        uint64_t t = rnd(5 * SEC);
        for (int i = 0; i < 200; i++) {
            char key[16];
            snprintf(key, sizeof key, "%zu%s", p, keys[rnd(5)]);
            size_t kl = strlen(key);
            if (rnd(8) == 0 && t > 100 * MS)
                t -= rnd(100 * MS);
            else
                t += rnd(400 * MS);
            uint64_t n = rnd(6), mw = rnd(3) == 0 ? rnd(SEC) : 0;
            if (p == 9 && rnd(3) == 0)
                n = rnd(UINT64_C(400000000000));
            rate_decision_t a, b, c, a2, b2;
            assert_int_equal(rate_limiter_check_at(lmem, key, kl, n, mw, t, &a),
                             RATE_OK);
            assert_int_equal(rate_limiter_check_at(lmod, key, kl, n, mw, t, &b),
                             RATE_OK);
            assert_int_equal(rate_limiter_check_at(llua, key, kl, n, mw, t, &c),
                             RATE_OK);
            expect_same_decision(&a, &b, policies[p], "module", i, t, n, mw);
            expect_same_decision(&a, &c, policies[p], "scripts", i, t, n, mw);
            assert_int_equal(
                rate_limiter_check_at(lmem2, key, kl, n, mw, t, &a2), RATE_OK);
            assert_int_equal(rate_limiter_check_at(rnd(2) ? ltm : ltl, key, kl,
                                                   n, mw, t, &b2),
                             RATE_OK);
            expect_same_decision(&a2, &b2, policies[p], "module and scripts by turns",
                        i, t, n, mw);
            checked++;
        }
        rate_limiter_free(lmem);
        rate_limiter_free(lmod);
        rate_limiter_free(llua);
        rate_limiter_free(lmem2);
        rate_limiter_free(ltm);
        rate_limiter_free(ltl);
        rate_store_free(ms);
        rate_store_free(ms2);
    }
    assert_int_equal(checked, 200 * (sizeof policies / sizeof policies[0]));
    /* The module made the decisions of its stores (all but the block's,
     * which are compare-and-set's); the scripts' store never used it. */
    rate_redis_status_t sm = status_of(rm), sl = status_of(rl);
    assert_true(sm.module);
    assert_true(sm.module_decisions >= 200 * 10);
    assert_false(sl.module);
    assert_int_equal(sl.module_decisions, 0);
    assert_int_equal(sm.module_fallbacks, 0);
    rate_store_redis_drop(rm);
    rate_store_redis_drop(rl);
    rate_store_redis_drop(tm);
    rate_store_free(rm);
    rate_store_free(rl);
    rate_store_free(tm);
    rate_store_free(tl);
}

/* ------------------------------------------------------------ expiry */

static uint64_t redis_time_ns(redisContext *c)
{
    redisReply *r = redisCommand(c, "TIME");
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    uint64_t t = strtoull(r->element[0]->str, NULL, 10) * SEC +
                 strtoull(r->element[1]->str, NULL, 10) * 1000;
    freeReplyObject(r);
    return t;
}

static long long redis_int(redisContext *c, const char *fmt, const char *arg)
{
    redisReply *r = redisCommand(c, fmt, arg);
    assert_non_null(r);
    if (r->type != REDIS_REPLY_INTEGER)
        fail_msg("%s %s: not an integer (%s)", fmt, arg,
                 r->type == REDIS_REPLY_ERROR ? r->str : "?");
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

/* The key's expiry is never before its reset_after by the server's own
 * clock (PEXPIRETIME against TIME read before the decision), on the
 * server's time and on a caller's (a replay's virtual time long ago). */
static void expiry_never_early(void **state)
{
    (void)state;
    rate_store_t *rs = store_on(url, "ex:", false, RATE_REDIS_MODULE_ON);
    static const char *policies[] = {"leaky-bucket 1000/s capacity=1",
                                     "token-bucket 1000000/s burst=3",
                                     "fixed-window 5/1ms",
                                     "sliding-log 2/3ms"};
    redisContext *c = raw_at(port);
    unsigned kept = 0, gone = 0;
    for (size_t p = 0; p < 4; p++) {
        rate_limiter_t *lim = limiter_of(policies[p], rs);
        for (int i = 0; i < 50; i++) {
            char key[16], name[32];
            snprintf(key, sizeof key, "e%zu-%d", p, i % 5);
            snprintf(name, sizeof name, "ex:{%s}", key);
            uint64_t before = redis_time_ns(c);
            rate_decision_t d;
            if (i % 2 == 0)
                assert_int_equal(
                    rate_limiter_check(lim, key, strlen(key), 1, 0, &d),
                    RATE_OK);
            else /* a caller's time, far from the server's */
                assert_int_equal(rate_limiter_check_at(lim, key, strlen(key),
                                                       1, 0, 1000 + (uint64_t)i * MS, &d),
                                 RATE_OK);
            if (!d.allowed)
                continue;
            long long at = redis_int(c, "PEXPIRETIME %s", name);
            if (at == -2) { /* gone already: only after its reset_after */
                uint64_t now = redis_time_ns(c);
                if (now < before + d.reset_after_ns)
                    fail_msg("%s gone at %llu ns, before TIME %llu ns + "
                             "reset_after %llu ns", name,
                             (unsigned long long)now,
                             (unsigned long long)before,
                             (unsigned long long)d.reset_after_ns);
                gone++;
                continue;
            }
            if (at < 0)
                fail_msg("%s has no expiry (%lld)", name, at);
            kept++;
            if ((uint64_t)at * MS < before + d.reset_after_ns)
                fail_msg("%s expires at %lld ms, before TIME %llu ns + "
                         "reset_after %llu ns",
                         name, at, (unsigned long long)before,
                         (unsigned long long)d.reset_after_ns);
            /* and not much later: the ms rounding and a margin of one */
            uint64_t after = redis_time_ns(c);
            assert_true((uint64_t)at * MS <= after + d.reset_after_ns + 2 * MS);
        }
        rate_limiter_free(lim);
    }
    redisFree(c);
    assert_true(kept > 20); /* the long ones at least */
    (void)gone;
    assert_true(status_of(rs).module_decisions > 0);
    rate_store_redis_drop(rs);
    rate_store_free(rs);
}

/* ----------------------------------------------- replication and AOF */

typedef struct snap {
    char v[32];
    unsigned char s[512];
    size_t slen;
    long long at;
} snap_t;

static void snap_of(redisContext *c, const char *name, snap_t *out)
{
    memset(out, 0, sizeof *out);
    redisReply *r = redisCommand(c, "HMGET %s v s", name);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    if (r->element[0]->type == REDIS_REPLY_STRING)
        snprintf(out->v, sizeof out->v, "%s", r->element[0]->str);
    if (r->element[1]->type == REDIS_REPLY_STRING) {
        assert_true(r->element[1]->len <= sizeof out->s);
        memcpy(out->s, r->element[1]->str, r->element[1]->len);
        out->slen = r->element[1]->len;
    }
    freeReplyObject(r);
    out->at = redis_int(c, "PEXPIRETIME %s", name);
}

static void expect_snap(const snap_t *a, const snap_t *b, const char *name,
                        const char *where)
{
    if (strcmp(a->v, b->v) != 0 || a->slen != b->slen ||
        memcmp(a->s, b->s, a->slen) != 0 || a->at != b->at)
        fail_msg("%s differs %s: v %s/%s, %zu/%zu bytes, expiry %lld/%lld",
                 name, where, a->v, b->v, a->slen, b->slen, a->at, b->at);
}

/* Decisions on several policies, on the server's clock, with expiries;
 * the names of the keys written into names. */
static int write_some(rate_store_t *rs, const char *prefix,
                      char names[][48], int cap)
{
    static const char *policies[] = {
        "token-bucket 5/10s burst=3", "leaky-bucket 7/30s capacity=4",
        "fixed-window 4/10s", "sliding-log 5/10s", "sliding-window 6/10s",
        "token-bucket 10/10s burst=5; sliding-log 20/30s"};
    int n = 0;
    for (size_t p = 0; p < 6; p++) {
        rate_limiter_t *lim = limiter_of(policies[p], rs);
        for (int k = 0; k < 3 && n < cap; k++) {
            char key[16];
            snprintf(key, sizeof key, "r%zu-%d", p, k);
            for (int i = 0; i < 4; i++) {
                rate_decision_t d;
                assert_int_equal(rate_limiter_check(lim, key, strlen(key),
                                                (uint64_t)(1 + i % 2), 0, &d),
                                 RATE_OK);
                assert_int_not_equal(d.reason, RATE_REASON_STORE_ERROR);
            }
            snprintf(names[n++], 48, "%s{%s}", prefix, key);
        }
        rate_limiter_free(lim);
    }
    return n;
}

/* A replica the test starts follows the module's writes: after WAIT, every
 * key's bytes, version and absolute expiry are the master's. */
static void replica_same_state(void **state)
{
    (void)state;
    int rport = redis_test_free_port();
    pid_t replica = start_with(rport, NULL); /* no module needed there */
    redisContext *rc = raw_at(rport), *mc = raw_at(port);
    redisReply *r = redisCommand(rc, "REPLICAOF 127.0.0.1 %d", port);
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
    /* until the link is up */
    assert_true(WAIT_UNTIL(info_has(rc, "replication",
                                    "master_link_status:up"),
                           TEST_WAIT_S));
    rate_store_t *rs = store_on(url, "rep:", false, RATE_REDIS_MODULE_ON);
    char names[32][48];
    int n = write_some(rs, "rep:", names, 32);
    /* Each key's expiry as written: a fixed window's key ends with its
     * window (10 s, on the wall clock), which may come before the checks
     * below on a loaded machine; such a key is then gone, in its time. */
    long long written_at[32];
    int nw = n;
    for (int i = 0; i < nw; i++)
        written_at[i] = redis_int(mc, "PEXPIRETIME %s", names[i]);
    /* CL.THROTTLE too */
    r = redisCommand(mc, "CL.THROTTLE rep:cell 3 1 10 2");
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    freeReplyObject(r);
    snprintf(names[n++], 48, "rep:cell");
    r = redisCommand(mc, "WAIT 1 5000");
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    assert_int_equal(r->integer, 1);
    freeReplyObject(r);
    for (int i = 0; i < n; i++) {
        snap_t a, b;
        snap_of(mc, names[i], &a);
        snap_of(rc, names[i], &b);
        if (a.slen == 0 && i < nw && written_at[i] > 0 &&
            redis_time_ms(mc) >= written_at[i])
            continue; /* gone by its own expiry */
        if (a.slen == 0 || a.at <= 0)
            fail_msg("%s: %zu bytes, expiry %lld on the master", names[i],
                     a.slen, a.at);
        expect_snap(&a, &b, names[i], "on the replica");
    }
    assert_true(status_of(rs).module_decisions > 0);
    rate_store_redis_drop(rs);
    rate_store_free(rs);
    redisFree(rc);
    redisFree(mc);
    redis_test_stop(&replica);
}

static void wait_no_rewrite(redisContext *c)
{
    if (!WAIT_UNTIL(!info_has(c, "persistence", "aof_rewrite_in_progress:1") &&
                        !info_has(c, "persistence", "aof_rewrite_scheduled:1"),
                    TEST_WAIT_S))
        fail_msg("the AOF rewrite did not end in %d s", TEST_WAIT_S);
}

/* Written with appendonly on, the state read back from the AOF (DEBUG
 * LOADAOF) is the same bytes, versions and expiries. */
static void aof_reload_same_state(void **state)
{
    (void)state;
    char dir[] = "/tmp/rate-aof-XXXXXX";
    assert_non_null(mkdtemp(dir));
    int aport = redis_test_free_port();
    const char *extra[] = {"--loadmodule", RATE_MODULE_PATH,
                           "--enable-debug-command", "yes", "--dir", dir,
                           "--appendonly", "yes", NULL};
    pid_t pid = start_with(aport, extra);
    redisContext *c = raw_at(aport);
    wait_no_rewrite(c);
    char u[64];
    snprintf(u, sizeof u, "redis://127.0.0.1:%d/0", aport);
    rate_store_t *rs = store_on(u, "aof:", false, RATE_REDIS_MODULE_ON);
    char names[32][48];
    int n = write_some(rs, "aof:", names, 31);
    redisReply *r = redisCommand(c, "CL.THROTTLE aof:cell 3 1 10 2");
    freeReplyObject(r);
    snprintf(names[n++], 48, "aof:cell");
    snap_t before[32];
    for (int i = 0; i < n; i++)
        snap_of(c, names[i], &before[i]);
    r = redisCommand(c, "DEBUG LOADAOF");
    if (r->type != REDIS_REPLY_STATUS)
        fail_msg("DEBUG LOADAOF: %s", r->str);
    freeReplyObject(r);
    for (int i = 0; i < n; i++) {
        snap_t after;
        snap_of(c, names[i], &after);
        assert_true(before[i].slen > 0);
        expect_snap(&before[i], &after, names[i], "after the AOF reload");
    }
    rate_store_free(rs);
    redisFree(c);
    redis_test_stop(&pid);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* ----------------------------------------------------------- fallback */

/* A server without the module: AUTO decides through the scripts (the same
 * answers as memory), ON refuses at creation. */
static void fallback_when_absent(void **state)
{
    (void)state;
    int p2 = redis_test_free_port();
    pid_t pid = start_with(p2, NULL);
    char u[64];
    snprintf(u, sizeof u, "redis://127.0.0.1:%d/0", p2);
    rate_redis_options_t o = {0};
    rate_store_t *s = NULL;
    char err[256] = "";
    o.module = RATE_REDIS_MODULE_ON;
    assert_int_equal(rate_store_redis_new(u, &o, &s, err, sizeof err),
                     RATE_ESTORE);
    assert_null(s);
    assert_non_null(strstr(err, "ratelimit.so"));
    rate_store_t *rs = store_on(u, "fb:", true, RATE_REDIS_MODULE_AUTO);
    rate_store_t *ms;
    assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
    rate_limiter_t *lr = limiter_of("token-bucket 5/s burst=3", rs);
    rate_limiter_t *lm = limiter_of("token-bucket 5/s burst=3", ms);
    for (int i = 0; i < 50; i++) {
        uint64_t t = SEC + (uint64_t)i * 50 * MS;
        rate_decision_t a, b;
        assert_int_equal(rate_limiter_check_at(lm, "k", 1, 1, 0, t, &a), RATE_OK);
        assert_int_equal(rate_limiter_check_at(lr, "k", 1, 1, 0, t, &b), RATE_OK);
        expect_same_decision(&a, &b, "no module", "scripts", i, t, 1, 0);
    }
    rate_redis_status_t st = status_of(rs);
    assert_false(st.module);
    assert_int_equal(st.module_decisions, 0);
    assert_int_equal(st.module_fallbacks, 0); /* asked once, never tried */
    rate_limiter_free(lr);
    rate_limiter_free(lm);
    rate_store_free(ms);
    rate_store_redis_drop(rs);
    rate_store_free(rs);
    redis_test_stop(&pid);
}

/* MODULE UNLOAD mid-run: every decision still succeeds, the same as
 * memory's; exactly one call met "unknown command" (and was made by the
 * scripts at once); the module is back in use after MODULE LOAD once the
 * retry pause is over. */
static void unload_mid_run(void **state)
{
    (void)state;
    rate_store_t *rs = store_on(url, "un:", true, RATE_REDIS_MODULE_AUTO);
    rate_store_t *ms;
    assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
    const char *pol = "token-bucket 10/s burst=5; sliding-window 30/3s";
    rate_limiter_t *lr = limiter_of(pol, rs);
    rate_limiter_t *lm = limiter_of(pol, ms);
    redisContext *c = raw_at(port);
    uint64_t t = SEC;
    for (int i = 0; i < 300; i++) {
        if (i == 100) {
            redisReply *r = redisCommand(c, "MODULE UNLOAD ratelimit");
            if (r->type != REDIS_REPLY_STATUS)
                fail_msg("MODULE UNLOAD: %s", r->str);
            freeReplyObject(r);
        }
        if (i == 200) {
            redisReply *r = redisCommand(c, "MODULE LOAD %s", RATE_MODULE_PATH);
            if (r->type != REDIS_REPLY_STATUS)
                fail_msg("MODULE LOAD: %s", r->str);
            freeReplyObject(r);
            usleep(5100 * 1000); /* the store's retry pause, 5 s */
        }
        t += rnd(150 * MS);
        char key[8];
        snprintf(key, sizeof key, "u%d", (int)rnd(3));
        rate_decision_t a, b;
        assert_int_equal(rate_limiter_check_at(lm, key, 2, 1, 0, t, &a), RATE_OK);
        assert_int_equal(rate_limiter_check_at(lr, key, 2, 1, 0, t, &b), RATE_OK);
        expect_same_decision(&a, &b, pol, "redis across MODULE UNLOAD", i, t, 1, 0);
        rate_redis_status_t st = status_of(rs);
        if (i < 100)
            assert_int_equal(st.module_decisions, (uint64_t)i + 1);
        if (i >= 100 && i < 200) {
            assert_false(st.module);
            assert_int_equal(st.module_decisions, 100);
            assert_int_equal(st.module_fallbacks, 1);
        }
        if (i >= 200) {
            assert_true(st.module);
            assert_int_equal(st.module_decisions, 100 + (uint64_t)(i - 199));
        }
    }
    redisFree(c);
    rate_limiter_free(lr);
    rate_limiter_free(lm);
    rate_store_free(ms);
    rate_store_redis_drop(rs);
    rate_store_free(rs);
}

/* -------------------------------------------------------- CL.THROTTLE */

/* CL.THROTTLE with the words of args (split at spaces). */
static redisReply *throttle_cmd(redisContext *c, const char *args)
{
    char buf[128];
    const char *argv[8] = {"CL.THROTTLE"};
    int argc = 1;
    snprintf(buf, sizeof buf, "%s", args);
    for (char *save = NULL, *w = strtok_r(buf, " ", &save); w && argc < 8;
         w = strtok_r(NULL, " ", &save))
        argv[argc++] = w;
    redisReply *r = redisCommandArgv(c, argc, argv, NULL);
    assert_non_null(r);
    return r;
}

static void throttle(redisContext *c, const char *args, long long e0,
                     long long e1, long long e2, long long e3, long long e4)
{
    redisReply *r = throttle_cmd(c, args);
    assert_non_null(r);
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 5)
        fail_msg("CL.THROTTLE %s: %s", args,
                 r->type == REDIS_REPLY_ERROR ? r->str : "not 5 integers");
    long long got[5], want[5] = {e0, e1, e2, e3, e4};
    for (int i = 0; i < 5; i++)
        got[i] = r->element[i]->integer;
    freeReplyObject(r);
    if (memcmp(got, want, sizeof got) != 0)
        fail_msg("CL.THROTTLE %s: %lld %lld %lld %lld %lld, not %lld %lld "
                 "%lld %lld %lld",
                 args, got[0], got[1], got[2], got[3], got[4], want[0],
                 want[1], want[2], want[3], want[4]);
}

static void throttle_error(redisContext *c, const char *args, const char *part)
{
    redisReply *r = throttle_cmd(c, args);
    if (r->type != REDIS_REPLY_ERROR || strstr(r->str, part) == NULL)
        fail_msg("CL.THROTTLE %s: not an error naming '%s'", args, part);
    freeReplyObject(r);
}

/* Hand-worked from redis-cell's documented semantics (its README):
 * capacity max_burst + 1, one emission every period / count, reply
 * [limited, limit, remaining, retry_after (-1 when allowed), reset_after]
 * in seconds.  The vectors run within well under a second of each other,
 * and every expected duration is a whole number of seconds minus that
 * time: rounded up, they are the whole numbers below. */
static void cl_throttle_vectors(void **state)
{
    (void)state;
    redisContext *c = raw_at(port);
    /* The README's example: 15 burst, 30 per 60 s, one at a time. */
    throttle(c, "user123 15 30 60 1", 0, 16, 15, -1, 2);
    throttle(c, "user123 15 30 60", 0, 16, 14, -1, 4); /* quantity 1 */
    /* 2 burst, 1 per 10 s: three at once, then 10 s to the next, 30 s to
     * full. */
    throttle(c, "v2 2 1 10", 0, 3, 2, -1, 10);
    throttle(c, "v2 2 1 10", 0, 3, 1, -1, 20);
    throttle(c, "v2 2 1 10", 0, 3, 0, -1, 30);
    throttle(c, "v2 2 1 10", 1, 3, 0, 10, 30); /* a denial changes nothing */
    throttle(c, "v2 2 1 10", 1, 3, 0, 10, 30);
    /* quantity: 5 of 6 at once, then 2 more are 1 too many (10 s) */
    throttle(c, "v3 5 1 10 5", 0, 6, 1, -1, 50);
    throttle(c, "v3 5 1 10 2", 1, 6, 1, 10, 50);
    throttle(c, "v3 5 1 10 1", 0, 6, 0, -1, 60);
    /* quantity 0: a look, nothing taken */
    throttle(c, "v4 4 2 1 0", 0, 5, 5, -1, 0);
    /* more than the capacity can ever hold: limited, no retry time */
    throttle(c, "v5 2 1 1 4", 1, 3, 3, -1, 0);
    /* other arguments on the same key start it cold */
    throttle(c, "v2 9 1 10", 0, 10, 9, -1, 10);
    /* the key's expiry is its reset_after, from the server's clock */
    long long at = redis_int(c, "PEXPIRETIME %s", "v2");
    uint64_t now = redis_time_ns(c);
    assert_true((uint64_t)at * MS >= now + 9 * SEC);
    assert_true((uint64_t)at * MS <= now + 10 * SEC + 2 * MS);
    /* errors name the argument */
    throttle_error(c, "e x 1 1", "max_burst");
    throttle_error(c, "e 1 0 1", "count_per_period");
    throttle_error(c, "e 1 1 0", "period");
    throttle_error(c, "e 1 1 1 -2", "quantity");
    redisReply *r = redisCommand(c, "SET wrong x");
    freeReplyObject(r);
    throttle_error(c, "wrong 1 1 1", "WRONGTYPE");
    r = redisCommand(c, "CL.THROTTLE only 1 1");
    assert_int_equal(r->type, REDIS_REPLY_ERROR);
    freeReplyObject(r);
    r = redisCommand(c, "DEL user123 v2 v3 v4 v5 wrong");
    freeReplyObject(r);
    redisFree(c);
}

/* RATELIMIT.STEP's own checks: bad arguments are errors naming them; a
 * key that is not a hash is {2}, a format it does not know {0}. */
static void step_arguments(void **state)
{
    (void)state;
    redisContext *c = raw_at(port);
    redisReply *r = redisCommand(c, "RATELIMIT.STEP k x 0 1 0 -1 1 3 1 1 1 1");
    assert_int_equal(r->type, REDIS_REPLY_ERROR);
    assert_non_null(strstr(r->str, "now"));
    freeReplyObject(r);
    r = redisCommand(c, "RATELIMIT.STEP k 1 0 1 0 -5 1 3 1 1 1 1");
    assert_int_equal(r->type, REDIS_REPLY_ERROR);
    assert_non_null(strstr(r->str, "ttl"));
    freeReplyObject(r);
    r = redisCommand(c, "RATELIMIT.STEP k 1 0 1 0 -1 1 3 1 1");
    assert_int_equal(r->type, REDIS_REPLY_ERROR); /* arity */
    freeReplyObject(r);
    r = redisCommand(c, "SET notahash x");
    freeReplyObject(r);
    r = redisCommand(c, "RATELIMIT.STEP notahash 1 0 1 0 -1 1 3 1 1 1 1");
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, 1);
    assert_int_equal(r->element[0]->integer, 2);
    freeReplyObject(r);
    r = redisCommand(c, "RATELIMIT.STEP k2 1 0 1 0 -1 1 9 1 1 1 1");
    assert_int_equal(r->elements, 1);
    assert_int_equal(r->element[0]->integer, 0);
    freeReplyObject(r);
    /* a policy the library refuses (a window with a burst) is declined */
    r = redisCommand(c, "RATELIMIT.STEP k2 1 0 1 0 -1 1 3 3 1 1 5");
    assert_int_equal(r->elements, 1);
    assert_int_equal(r->element[0]->integer, 0);
    freeReplyObject(r);
    r = redisCommand(c, "EXISTS k2");
    assert_int_equal(r->integer, 0); /* nothing written */
    freeReplyObject(r);
    r = redisCommand(c, "DEL notahash");
    freeReplyObject(r);
    redisFree(c);
}

/* A key's version tampered with (docs/redis.md, "Versions"): 0 reads as a
 * new key on every path; 2^63 - 1 or more, where Redis's HINCRBY stops,
 * starts again from TIME with the state kept, whether the module, a lean
 * script, the general script or the compare-and-set path writes next; a
 * version of 20 digits or with a leading zero is refused by all (a store
 * error, RATE_ECORRUPT), and left as it was.
 * Each path's decisions are the memory store's over the same requests. */
static void tampered_versions(void **state)
{
    (void)state;
    static const char *tampered[] = {"0", "9223372036854775806",
                                     "9223372036854775807",
                                     "9223372036854775808",
                                     "9999999999999999999"};
    static const struct {
        const char *name;
        rate_redis_module_t module;
        bool general;
        const char *policy;
    } paths[] = {
        {"module", RATE_REDIS_MODULE_ON, false, "token-bucket 5/s burst=3"},
        {"lean script", RATE_REDIS_MODULE_OFF, false,
         "token-bucket 5/s burst=3"},
        {"general script", RATE_REDIS_MODULE_OFF, true,
         "token-bucket 5/s burst=3"},
        {"compare-and-set", RATE_REDIS_MODULE_OFF, false,
         "token-bucket 5/s burst=3 block=700ms"},
    };
    redisContext *c = raw_at(port);
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        char prefix[16], err[256] = "";
        snprintf(prefix, sizeof prefix, "tv%zu:", p);
        rate_redis_options_t o = {0};
        rate_store_t *rs = NULL, *ms = NULL;
        o.prefix = prefix;
        o.module = paths[p].module;
        o.general_script = paths[p].general;
        if (rate_store_redis_new(url, &o, &rs, err, sizeof err) != RATE_OK)
            fail_msg("redis store: %s", err);
        assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
        rate_limiter_t *lr = limiter_of(paths[p].policy, rs);
        rate_limiter_t *lm = limiter_of(paths[p].policy, ms);
        for (size_t i = 0; i < sizeof tampered / sizeof tampered[0]; i++) {
            char k[8], fresh[8];
            snprintf(k, sizeof k, "k%zu", i);
            snprintf(fresh, sizeof fresh, "f%zu", i);
            uint64_t t = SEC;
            rate_decision_t a = at(lm, k, t, 1, 0), b = at(lr, k, t, 1, 0);
            expect_same_decision(&a, &b, paths[p].name, "before", (int)i, t,
                                 1, 0);
            redisReply *r = redisCommand(c, "HSET %s{%s} v %s", prefix, k,
                                         tampered[i]);
            freeReplyObject(r);
            for (int j = 1; j <= 4; j++) {
                t += 100 * MS;
                /* version 0: a new key, as memory's fresh one */
                a = at(lm, i == 0 ? fresh : k, t, 1, 0);
                b = at(lr, k, t, 1, 0);
                expect_same_decision(&a, &b, paths[p].name, tampered[i], j,
                                     t, 1, 0);
            }
            r = redisCommand(c, "HGET %s{%s} v", prefix, k);
            assert_int_equal(r->type, REDIS_REPLY_STRING);
            unsigned long long v = strtoull(r->str, NULL, 10);
            if (strspn(r->str, "0123456789") != r->len || r->len > 19 ||
                v == 0 || v >= UINT64_C(9223372036854775807))
                fail_msg("%s, v %s: written back as %s", paths[p].name,
                         tampered[i], r->str);
            freeReplyObject(r);
        }
        /* 20 digits, a leading zero: no version of ours, on any path,
         * with a state or without; nothing written (a leading zero was
         * once read as a number by some paths and compared as text by
         * the compare-and-set script, which then never matched) */
        static const char *not_ours[] = {"18446744073709551614", "05",
                                         "00", "007",
                                         "01234567890123456789"};
        rate_decision_t d = at(lr, "big", SEC, 1, 0);
        for (size_t v = 0; v < sizeof not_ours / sizeof not_ours[0]; v++) {
            redisReply *r = redisCommand(c, "HSET %s{big} v %s", prefix,
                                         not_ours[v]);
            freeReplyObject(r);
            r = redisCommand(c, "HSET %s{bare} v %s", prefix, not_ours[v]);
            freeReplyObject(r);
            for (int j = 0; j < 4; j++) {
                const char *key = j % 2 ? "bare" : "big";
                int rc = rate_limiter_check_at(lr, key, strlen(key), 1, 0,
                                               SEC + (uint64_t)j * MS, &d);
                if (rc != RATE_OK || d.reason != RATE_REASON_STORE_ERROR ||
                    d.error != RATE_ECORRUPT)
                    fail_msg("%s: version %s: %s, reason %d, error %s; not "
                             "a store error RATE_ECORRUPT", paths[p].name,
                             not_ours[v], rate_err_name(rc), (int)d.reason,
                             rate_err_name(d.error));
                assert_false(d.allowed); /* failing closed */
            }
            r = redisCommand(c, "HGET %s{big} v", prefix);
            assert_string_equal(r->str, not_ours[v]);
            freeReplyObject(r);
            r = redisCommand(c, "HLEN %s{big}", prefix);
            assert_int_equal(r->integer, 2);
            freeReplyObject(r);
            r = redisCommand(c, "HLEN %s{bare}", prefix);
            assert_int_equal(r->integer, 1);
            freeReplyObject(r);
            r = redisCommand(c, "DEL %s{bare}", prefix);
            freeReplyObject(r);
        }
        rate_limiter_free(lr);
        rate_limiter_free(lm);
        rate_store_free(ms);
        rate_store_redis_drop(rs);
        rate_store_free(rs);
    }
    redisFree(c);
}

/* ------------------------------------------------------ one key twice */

/* r is an error reply naming the same key; its text into out. */
static void expect_same_key_error(redisReply *r, const char *what, char *out,
                                  size_t cap)
{
    if (r == NULL)
        fail_msg("%s: no reply (the server is gone?)", what);
    if (r->type != REDIS_REPLY_ERROR || strstr(r->str, "same key") == NULL)
        fail_msg("%s: not an error naming the same key (type %d: %s)", what,
                 r->type, r->type == REDIS_REPLY_ERROR ? r->str : "");
    snprintf(out, cap, "%s", r->str);
    freeReplyObject(r);
}

static void expect_pong(redisContext *c, const char *after)
{
    redisReply *r = redisCommand(c, "PING");
    if (r == NULL || r->type != REDIS_REPLY_STATUS ||
        strcmp(r->str, "PONG") != 0)
        fail_msg("no PONG after %s: the server is gone", after);
    freeReplyObject(r);
}

/* A fair decision's command (RATELIMIT.FAIR, or the EVAL of the fair
 * script) as the store sends it for key "k" under prefix: an admission
 * of one permit at 1000 s under a token bucket, on an absent key. */
static void fair_words(rate__redis_proto_t *p, bool module,
                       rate_policy_t *pol, rate__redis_fair_cmd_t *cmd)
{
    rate_decide_req_t q = {.policy = pol, .policy_id = 1,
                           .format = RATE__FORMAT, .now_ns = 1000 * SEC,
                           .permits = 1, .detail = true,
                           .op = RATE_DECIDE_ACQUIRE};
    rate_fair_req_t f = {.flow_hash = UINT64_C(0x1234567890abcdef),
                         .weight = 1, .slots = 4};
    rate_key_t key = {"k", 1, RATE_SPACE_STATE};
    assert_int_equal(rate__redis_fair_cmd(p, module, &key, &q, &f, cmd),
                     RATE_OK);
    rate__redis_fair_eval(cmd); /* the script's text: EVAL, not EVALSHA */
}

/* RATELIMIT.LEASESTEP's words after its keys: an acquire of one lease of
 * three, then one permit of a token bucket, at 1000 s. */
static int leasestep_words(const char **av, size_t *al)
{
    static const char now[8] = {0, 0x10, (char)0xa5, (char)0xd4,
                                (char)0xe8, 0, 0, 0};
    static const char id[8] = {1}, expires[8] = {0, 0, 0, 0, 0, 0, 0, 1};
    static const char pid[4] = {42};
    static const char *const text[] = {
        "a", NULL, "3", "0", "0", NULL, NULL, NULL, "-1", "1000", "0", "1",
        "0", "-1", "1", "3", "1", "10", "1000000000", "10"};
    int n = (int)(sizeof text / sizeof text[0]);
    for (int i = 0; i < n; i++) {
        av[i] = text[i];
        al[i] = text[i] != NULL ? strlen(text[i]) : 0;
    }
    av[1] = now, al[1] = 8;
    av[5] = id, al[5] = 8;
    av[6] = expires, al[6] = 8;
    av[7] = pid, al[7] = 4;
    return n;
}

/* A command of two keys given one key twice (the library never names
 * them alike; any client that may run the store's commands can):
 * RATELIMIT.FAIR and RATELIMIT.LEASESTEP refuse it with an error naming
 * it, their scripts (fair.lua, lease_rate.lua) with the same error, and
 * the server still answers, with nothing written.  RATELIMIT.FAIR once
 * stopped redis-server here on an assertion (db.c, 'de != NULL'), for an
 * admitted request over an absent key.  A server of its own, so that a
 * crash stops no other test. */
static void one_key_twice(void **state)
{
    (void)state;
    int p2 = redis_test_free_port();
    pid_t pid = start_with(p2, with_module);
    redisContext *c = raw_at(p2);
    char module_err[256], script_err[256];

    /* RATELIMIT.FAIR key key ..., then the script's EVAL of the same */
    rate__redis_proto_t p;
    assert_int_equal(rate__redis_proto_init(&p, "one:", true, 0, false, false),
                     RATE_OK);
    rate_policy_t *pol = policy_of("token-bucket 10/s burst=10");
    rate__redis_fair_cmd_t cmd;
    fair_words(&p, true, pol, &cmd);
    cmd.av[2] = cmd.av[1], cmd.al[2] = cmd.al[1];
    expect_same_key_error(redisCommandArgv(c, cmd.argc, cmd.av, cmd.al),
                          "RATELIMIT.FAIR", module_err, sizeof module_err);
    expect_pong(c, "RATELIMIT.FAIR with one key twice");
    rate__redis_fair_free(&cmd);
    fair_words(&p, false, pol, &cmd);
    assert_string_equal(cmd.av[0], "EVAL");
    cmd.av[4] = cmd.av[3], cmd.al[4] = cmd.al[3];
    expect_same_key_error(redisCommandArgv(c, cmd.argc, cmd.av, cmd.al),
                          "the fair script", script_err, sizeof script_err);
    assert_string_equal(module_err, script_err);
    rate__redis_fair_free(&cmd);

    /* RATELIMIT.LEASESTEP key key ..., then lease_rate.lua's EVAL */
    const char *av[32];
    size_t al[32], len;
    av[0] = "RATELIMIT.LEASESTEP", av[1] = av[2] = "one:l{k}";
    al[0] = strlen(av[0]), al[1] = al[2] = strlen(av[1]);
    int n = 3 + leasestep_words(av + 3, al + 3);
    expect_same_key_error(redisCommandArgv(c, n, av, al),
                          "RATELIMIT.LEASESTEP", module_err,
                          sizeof module_err);
    expect_pong(c, "RATELIMIT.LEASESTEP with one key twice");
    av[0] = "EVAL", av[1] = rate__redis_lease_rate_script(&len), av[2] = "2";
    av[3] = av[4] = "one:l{k}";
    al[0] = 4, al[1] = len, al[2] = 1, al[3] = al[4] = strlen(av[3]);
    n = 5 + leasestep_words(av + 5, al + 5);
    expect_same_key_error(redisCommandArgv(c, n, av, al),
                          "the lease-rate script", script_err,
                          sizeof script_err);
    assert_string_equal(module_err, script_err);

    redisReply *r = redisCommand(c, "DBSIZE");
    assert_int_equal(r->integer, 0); /* nothing written */
    freeReplyObject(r);
    rate_policy_free(pol);
    rate__redis_proto_free(&p);
    redisFree(c);
    redis_test_stop(&pid);
}

/* The commands' flags say what they cost: RATELIMIT.STEP may walk a
 * sliding log of thousands of entries, so it is not "fast"; CL.THROTTLE
 * is one token bucket, constant time, and is. */
static bool has_flag(redisContext *c, const char *cmd, const char *flag)
{
    redisReply *r = redisCommand(c, "COMMAND INFO %s", cmd);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, 1);
    const redisReply *info = r->element[0];
    assert_int_equal(info->type, REDIS_REPLY_ARRAY);
    const redisReply *flags = info->element[2];
    bool found = false;
    for (size_t i = 0; i < flags->elements; i++)
        found |= strcmp(flags->element[i]->str, flag) == 0;
    freeReplyObject(r);
    return found;
}

static void honest_flags(void **state)
{
    (void)state;
    redisContext *c = raw_at(port);
    assert_false(has_flag(c, "ratelimit.step", "fast"));
    assert_true(has_flag(c, "ratelimit.step", "write"));
    assert_true(has_flag(c, "cl.throttle", "fast"));
    redisFree(c);
}

/* A key of the state's name that is no hash, met by the module (its {2}
 * answer): named as the store's last error, with the key, as the scripts'
 * is, so that the command does not call a list damaged bytes. */
static void another_type_is_named(void **state)
{
    (void)state;
    redisContext *c = raw_at(port);
    rate_redis_options_t o = {0};
    rate_store_t *rs = NULL;
    char err[256] = "", last[512] = "";
    o.prefix = "wt:";
    o.module = RATE_REDIS_MODULE_ON;
    if (rate_store_redis_new(url, &o, &rs, err, sizeof err) != RATE_OK)
        fail_msg("redis store: %s", err);
    rate_limiter_t *l = limiter_of("token-bucket 5/s burst=3", rs);
    freeReplyObject(redisCommand(c, "RPUSH wt:{w} x"));
    rate_decision_t d = at(l, "w", SEC, 1, 0);
    assert_int_equal(d.error, RATE_ECORRUPT);
    assert_int_equal(rate_store_redis_last_error(rs, last, sizeof last),
                     RATE_OK);
    if (strstr(last, "WRONGTYPE: 'wt:{w}' is not a hash") == NULL)
        fail_msg("last error '%s'", last);
    redisReply *r = redisCommand(c, "TYPE wt:{w}");
    assert_string_equal(r->str, "list"); /* left as it is */
    freeReplyObject(r);
    rate_redis_status_t st;
    assert_int_equal(rate_store_redis_status(rs, &st), RATE_OK);
    assert_true(st.module);
    freeReplyObject(redisCommand(c, "DEL wt:{w}"));
    rate_limiter_free(l);
    rate_store_redis_drop(rs); /* the policy's records too */
    rate_store_free(rs);
    redisFree(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(another_type_is_named),
        cmocka_unit_test(three_ways_same),
        cmocka_unit_test(expiry_never_early),
        cmocka_unit_test(replica_same_state),
        cmocka_unit_test(aof_reload_same_state),
        cmocka_unit_test(fallback_when_absent),
        cmocka_unit_test(cl_throttle_vectors),
        cmocka_unit_test(step_arguments),
        cmocka_unit_test(tampered_versions),
        cmocka_unit_test(one_key_twice),
        cmocka_unit_test(honest_flags),
        cmocka_unit_test(unload_mid_run),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
