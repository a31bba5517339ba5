/* SPDX-License-Identifier: MIT */
/*
 * Leases on an event loop (docs/leases.md, "On an event loop"):
 * rate_inflight_acquire_start, _release_start and _extend_start on libuv,
 * over the asynchronous Redis store (the lease script, the module, and the
 * general path), against a private redis-server.
 *
 * - Stores that answer at once (memory): the synchronous call's answers,
 *   no callback; the input errors.
 * - A differential trace on a fake clock: each operation made by the
 *   synchronous calls on a memory store and through the loop on Redis,
 *   every answer equal; one command per operation on the server
 *   (commandstats: FCALL or RATELIMIT.LEASE, as many as operations);
 *   with rate limits in the policy too (denials by a rate limit seen):
 *   an acquire is still one command (RATELIMIT.LEASESTEP, or the
 *   lease-and-rate script), the rate limits never decided on their own.
 * - Many acquires in flight on one key: exactly N granted.
 * - Redis stopped (SIGSTOP past the command timeout) and killed: each
 *   callback once, with the store's error; after a restart, exact.
 * - Freeing the store with calls in flight: each callback runs first,
 *   with RATE_ECANCELED.
 */
#include <signal.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <unistd.h>

#include <uv.h>

#include <ratelimit_lease.h>
#include <ratelimit_loop.h>
#include <ratelimit_uv.h>

#include "lib/rng.h"
#include "lib/redis_fixture.h"

#ifndef RATE_MODULE_PATH
#error "RATE_MODULE_PATH: the path of ratelimit.so"
#endif

#define TIMEOUT_NS (300 * MS)

enum { BY_SCRIPT, BY_MODULE, BY_GENERIC };

typedef struct call {
    int calls;
    int rc;
    rate_lease_t lease;
    rate_decision_t d;
    bool has_d;
} call_t;

static int pending;

static void on_lease(void *ud, int rc, const rate_lease_t *lease,
                     const rate_decision_t *d)
{
    call_t *c = ud;
    c->calls++;
    c->rc = rc;
    c->lease = *lease;
    c->has_d = d != NULL;
    if (d != NULL)
        c->d = *d;
    pending--;
}

static void wait_all(uv_loop_t *l)
{
    while (pending > 0)
        uv_run(l, UV_RUN_ONCE);
}

static rate_inflight_t *inflight_of(const char *text, rate_store_t *s,
                                    const rate_clock_t *clock)
{
    rate_inflight_policy_t *p = NULL;
    char err[256] = "";
    if (rate_inflight_policy_parse(text, &p, err, sizeof err) != RATE_OK)
        fail_msg("policy '%s': %s", text, err);
    rate_inflight_config_t cfg = {.policy = p, .store = s, .clock = clock};
    rate_inflight_t *in = NULL;
    assert_int_equal(rate_inflight_new(&cfg, &in), RATE_OK);
    rate_inflight_policy_free(p);
    return in;
}

static rate_store_t *async_store(rate_loop_t *loop, const char *prefix,
                                 int path, bool no_ttl)
{
    rate_redis_options_t o = {.prefix = prefix,
                              .no_ttl = no_ttl,
                              .command_timeout_ns = TIMEOUT_NS,
                              .connect_timeout_ns = TIMEOUT_NS,
                              .breaker_cooldown_ns = 100 * MS,
                              .lazy_connect = true,
                              .generic_leases = path == BY_GENERIC};
    o.module = path == BY_MODULE ? RATE_REDIS_MODULE_AUTO
                                 : RATE_REDIS_MODULE_OFF;
    rate_store_t *s = NULL;
    char err[256] = "";
    if (rate_store_redis_async_new(url, &o, loop, &s, err, sizeof err) !=
        RATE_OK)
        fail_msg("async redis store: %s", err);
    return s;
}

/* The calls of one command since the last CONFIG RESETSTAT. */
static long long calls_of(const char *cmd)
{
    redisContext *c = raw();
    redisReply *r = redisCommand(c, "INFO commandstats");
    char want[64];
    snprintf(want, sizeof want, "cmdstat_%s:calls=", cmd);
    const char *p = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, want)
                                                       : NULL;
    long long n = p ? atoll(p + strlen(want)) : 0;
    freeReplyObject(r);
    redisFree(c);
    return n;
}

static void reset_stats(void)
{
    redisContext *c = raw();
    freeReplyObject(redisCommand(c, "CONFIG RESETSTAT"));
    redisFree(c);
}

/* The server for a path: with the module loaded, or without. */
static void server_for(int path)
{
    stop_server();
    if (path == BY_MODULE)
        start_server("--loadmodule", RATE_MODULE_PATH);
    else
        start_server(NULL, NULL);
}

/* A test's loop: libuv's, adapted. */
static void loop_open(uv_loop_t *uvl, rate_loop_t *loop)
{
    assert_int_equal(uv_loop_init(uvl), 0);
    rate_loop_uv(loop, uvl);
}

/* A test's end: its inflight objects freed (NULL ones skipped), then its
 * store's keys dropped and the store freed (unless already freed: NULL),
 * then the loop run out and closed (nothing may be left on it). */
static void loop_close(uv_loop_t *uvl, rate_store_t *as, rate_inflight_t *a,
                       rate_inflight_t *b)
{
    rate_inflight_free(a);
    rate_inflight_free(b);
    if (as != NULL) {
        rate_store_redis_drop(as);
        rate_store_free(as);
    }
    uv_run(uvl, UV_RUN_NOWAIT);
    assert_int_equal(uv_loop_close(uvl), 0);
}

/* ------------------------------------------------------------ at once */

static void at_once(void **state)
{
    (void)state;
    rate_inflight_t *in = inflight_of("concurrency 1 ttl=1h", NULL, NULL);
    call_t c = {0};
    rate_lease_t l, m;
    rate_decision_t d;
    assert_int_equal(rate_inflight_acquire_start(in, "k", 1,
                                                 RATE_LEASE_NORMAL, &l, &d,
                                                 on_lease, &c),
                     RATE_OK);
    assert_true(d.allowed);
    assert_true(l.id != 0);
    assert_int_equal(rate_inflight_acquire_start(in, "k", 1,
                                                 RATE_LEASE_NORMAL, &m, &d,
                                                 on_lease, &c),
                     RATE_OK);
    assert_false(d.allowed);
    assert_int_equal(m.id, 0);
    assert_int_equal(rate_inflight_extend_start(in, "k", 1, &l, 0, on_lease,
                                                &c),
                     RATE_OK);
    assert_int_equal(rate_inflight_release_start(in, "k", 1, &l, on_lease,
                                                 &c),
                     RATE_OK);
    assert_int_equal(rate_inflight_release_start(in, "k", 1, &l, on_lease,
                                                 &c),
                     RATE_ELEASE);
    assert_int_equal(c.calls, 0); /* never called back */
    /* Input errors. */
    assert_int_equal(rate_inflight_acquire_start(in, "k", 1,
                                                 RATE_LEASE_NORMAL, &l, &d,
                                                 NULL, &c),
                     RATE_EINVAL);
    assert_int_equal(rate_inflight_acquire_start(in, "k", 1,
                                                 (rate_lease_class_t)7, &l,
                                                 &d, on_lease, &c),
                     RATE_EINVAL);
    assert_int_equal(rate_inflight_release_start(in, "k", 1, &l, NULL, &c),
                     RATE_EINVAL);
    assert_int_equal(rate_inflight_extend_start(NULL, "k", 1, &l, 0,
                                                on_lease, &c),
                     RATE_EINVAL);
    rate_inflight_free(in);
}

/* ------------------------------------------------------ differential */

static void differential(int path, const char *policy)
{
    server_for(path);
    uv_loop_t uvl;
    rate_loop_t loop;
    loop_open(&uvl, &loop);
    /* no_ttl: the keys must not expire by Redis's clock under the fake
     * one */
    rate_store_t *as = async_store(&loop, "la:", path, true);
    static fake_clock_t fc;
    fc.now = UINT64_C(1) << 40;
    const rate_clock_t clock = {fake_now, fake_sleep, &fc};
    rate_inflight_t *mem = inflight_of(policy, NULL, &clock);
    rate_inflight_t *red = inflight_of(policy, as, &clock);
    /* warm up: the connection made and the scripts loaded */
    call_t w = {0};
    rate_lease_t wl;
    rate_decision_t wd;
    WAIT_UNTIL((w.calls = 0,
                rate_inflight_acquire_start(red, "warm", 4, RATE_LEASE_NORMAL,
                                            &wl, &wd, on_lease,
                                            &w) == RATE_PENDING
                    ? (pending++, wait_all(&uvl))
                    : (void)0,
                w.rc == RATE_OK),
               TEST_WAIT_S);
    assert_int_equal(w.rc, RATE_OK);
    /* Under a policy with rate limits the first acquire goes in two steps
     * (the policy's record is written through the loop, never waited
     * for); a second one, with its rate limits, has its script loaded on
     * the connection (NOSCRIPT once).  Their decisions are kept apart. */
    if (strchr(policy, ';') != NULL) {
        w.calls = 0;
        assert_int_equal(rate_inflight_acquire_start(red, "warm", 4,
                                                     RATE_LEASE_NORMAL, &wl,
                                                     &wd, on_lease, &w),
                         RATE_PENDING);
        pending++;
        wait_all(&uvl);
        assert_int_equal(w.rc, RATE_OK);
    }
    rate_redis_async_stats_t st0;
    assert_int_equal(rate_store_redis_async_stats(as, &st0), RATE_OK);
    reset_stats();
    rate_lease_t hm[32], hr[32];
    int keyof[32], nh = 0, ops = 0, denied_by_rate = 0;
    rnd_seed(77);
    for (int step = 0; step < 400; step++) {
        fc.now += rnd(16) == 0 ? rnd(200 * MS) : rnd(2 * MS);
        int op = (int)rnd(10), k = (int)rnd(3);
        char key[4] = {'k', (char)('0' + k), 0};
        call_t c = {0};
        int rc;
        if (op < 5 || nh == 0) {
            rate_lease_class_t cls = rnd(4) == 0 ? RATE_LEASE_CRITICAL
                                                 : RATE_LEASE_NORMAL;
            rate_lease_t lm, lr;
            rate_decision_t dm, dr;
            int rcm = rate_inflight_acquire(mem, key, 2, cls, &lm, &dm);
            rc = rate_inflight_acquire_start(red, key, 2, cls, &lr, &dr,
                                             on_lease, &c);
            assert_int_equal(rc, RATE_PENDING);
            assert_int_equal(lr.id, 0); /* zeroed, not written again */
            pending++;
            wait_all(&uvl);
            ops++;
            assert_int_equal(c.calls, 1);
            assert_true(c.has_d);
            assert_int_equal(c.rc, rcm);
            assert_int_equal(c.d.allowed, dm.allowed);
            assert_int_equal(c.d.reason, dm.reason);
            assert_int_equal(c.d.limit, dm.limit);
            assert_int_equal(c.d.remaining, dm.remaining);
            assert_int_equal(c.d.retry_after_ns, dm.retry_after_ns);
            assert_int_equal(c.d.reset_after_ns, dm.reset_after_ns);
            assert_int_equal(c.d.component, dm.component);
            assert_int_equal(c.lease.id != 0, dm.allowed);
            denied_by_rate += !dm.allowed && dm.component > 0;
            if (dm.allowed) {
                assert_int_equal(c.lease.expires_ns, lm.expires_ns);
                int at = nh < 32 ? nh++ : (int)rnd(32);
                hm[at] = lm, hr[at] = c.lease, keyof[at] = k;
            }
            continue;
        }
        int h = (int)rnd((uint64_t)nh);
        key[1] = (char)('0' + keyof[h]);
        if (op < 8) {
            int rcm = rate_inflight_release(mem, key, 2, &hm[h]);
            rc = rate_inflight_release_start(red, key, 2, &hr[h], on_lease,
                                             &c);
            if (rc == RATE_PENDING) {
                pending++;
                wait_all(&uvl);
                ops++;
                assert_int_equal(c.calls, 1);
                assert_false(c.has_d);
                rc = c.rc;
            }
            assert_int_equal(rc, rcm);
        } else {
            uint64_t ttl = rnd(2) ? 0 : rnd(150 * MS) + 1;
            int rcm = rate_inflight_extend(mem, key, 2, &hm[h], ttl);
            rc = rate_inflight_extend_start(red, key, 2, &hr[h], ttl,
                                            on_lease, &c);
            if (rc == RATE_PENDING) {
                pending++;
                wait_all(&uvl);
                ops++;
                rc = c.rc;
                if (rc == RATE_OK)
                    hr[h] = c.lease;
            }
            assert_int_equal(rc, rcm);
            assert_int_equal(hr[h].expires_ns, hm[h].expires_ns);
        }
    }
    /* One command per operation that went to the server. */
    long long ev = calls_of("evalsha"), fcalls = calls_of("fcall"),
              md = calls_of("ratelimit.lease"),
              ms = calls_of("ratelimit.leasestep"), hm_ = calls_of("hmget");
    print_message("path %d, %s: %d operations, EVALSHA %lld, FCALL %lld, "
                  "RATELIMIT.LEASE %lld, RATELIMIT.LEASESTEP %lld, HMGET "
                  "%lld\n", path, policy, ops, ev, fcalls, md, ms, hm_);
    assert_int_equal(calls_of("eval"), 0);
    rate_redis_async_stats_t st;
    assert_int_equal(rate_store_redis_async_stats(as, &st), RATE_OK);
    /* every operation, the warm-up's too, by the path's own route */
    assert_true(path == BY_MODULE ? st.module_leases > (uint64_t)ops
                                  : st.module_leases == 0);
    assert_true(path == BY_SCRIPT ? st.script_leases > (uint64_t)ops
                                  : st.script_leases == 0);
    if (strchr(policy, ';') != NULL) {
        /* An acquire's rate limits decided with its lease, one command:
         * never a decision of their own. */
        assert_true(denied_by_rate > 0);
        if (path != BY_GENERIC)
            assert_int_equal(st.module_decisions + st.lean_decisions +
                                 st.general_decisions,
                             st0.module_decisions + st0.lean_decisions +
                                 st0.general_decisions);
        assert_true(path != BY_MODULE || ms > 0);
    }
    if (path == BY_SCRIPT)
        assert_true(fcalls == ops && ev == 0); /* by FCALL: Functions here */
    else if (path == BY_MODULE)
        assert_true(md + ms == ops && ev == 0 && fcalls == 0);
    else
        assert_true(hm_ >= ops); /* the general path: a load each, at least */
    loop_close(&uvl, as, mem, red);
}

static void differential_script(void **state)
{
    (void)state;
    differential(BY_SCRIPT, "concurrency 3 ttl=100ms reserve=1");
}

static void differential_module(void **state)
{
    (void)state;
    differential(BY_MODULE, "concurrency 3 ttl=100ms reserve=1");
}

static void differential_generic(void **state)
{
    (void)state;
    differential(BY_GENERIC, "concurrency 3 ttl=100ms reserve=1");
}

/* With rate limits: the lease, then the rate part through the limiter's
 * asynchronous call; a denial gives the lease back first. */
static void differential_rated(void **state)
{
    (void)state;
    differential(BY_SCRIPT, "concurrency 3 ttl=100ms; token-bucket 20/s "
                            "burst=4");
    differential(BY_MODULE, "concurrency 3 ttl=100ms; fixed-window 2/100ms");
}

/* ---------------------------------------------------- many in flight */

#define MANY 200

static void many(void **state)
{
    (void)state;
    server_for(BY_SCRIPT);
    uv_loop_t uvl;
    rate_loop_t loop;
    loop_open(&uvl, &loop);
    rate_store_t *as = async_store(&loop, "lm:", BY_SCRIPT, false);
    rate_inflight_t *in = inflight_of("concurrency 7 ttl=1h", as, NULL);
    static call_t c[MANY];
    memset(c, 0, sizeof c);
    int granted = 0, denied = 0, errors = 0;
    /* Started at once, answered later (after a first connection). */
    {
        rate_lease_t l;
        rate_decision_t d;
        call_t w;
        assert_true(WAIT_UNTIL(
            (memset(&w, 0, sizeof w),
             rate_inflight_acquire_start(in, "w", 1, RATE_LEASE_NORMAL, &l,
                                         &d, on_lease, &w) == RATE_PENDING &&
                 (pending++, wait_all(&uvl), w.rc == RATE_OK)),
            TEST_WAIT_S));
    }
    for (int i = 0; i < MANY; i++) {
        rate_lease_t l;
        rate_decision_t d;
        assert_int_equal(rate_inflight_acquire_start(in, "hot", 3,
                                                     RATE_LEASE_NORMAL, &l,
                                                     &d, on_lease, &c[i]),
                         RATE_PENDING);
        pending++;
    }
    wait_all(&uvl);
    for (int i = 0; i < MANY; i++) {
        assert_int_equal(c[i].calls, 1);
        if (c[i].rc != RATE_OK)
            errors++;
        else if (c[i].d.allowed)
            granted++;
        else
            denied++;
    }
    assert_int_equal(errors, 0);
    assert_int_equal(granted, 7);
    assert_int_equal(denied, MANY - 7);
    uint64_t held = 0;
    assert_int_equal(rate_inflight_held(in, "hot", 3, &held), RATE_OK);
    assert_int_equal(held, 7);
    /* Released through the loop; twice: RATE_ELEASE. */
    for (int round = 0; round < 2; round++) {
        static call_t r[MANY];
        memset(r, 0, sizeof r);
        for (int i = 0; i < MANY; i++)
            if (c[i].d.allowed) {
                assert_int_equal(rate_inflight_release_start(
                                     in, "hot", 3, &c[i].lease, on_lease,
                                     &r[i]),
                                 RATE_PENDING);
                pending++;
            }
        wait_all(&uvl);
        for (int i = 0; i < MANY; i++)
            if (c[i].d.allowed)
                assert_int_equal(r[i].rc, round == 0 ? RATE_OK : RATE_ELEASE);
    }
    assert_int_equal(rate_inflight_held(in, "hot", 3, &held), RATE_OK);
    assert_int_equal(held, 0);
    loop_close(&uvl, as, in, NULL);
}

/* -------------------------------------------------------------- faults */

static call_t *acquire_now(rate_inflight_t *in, uv_loop_t *uvl, call_t *c)
{
    rate_lease_t l;
    rate_decision_t d;
    memset(c, 0, sizeof *c);
    int rc = rate_inflight_acquire_start(in, "f", 1, RATE_LEASE_NORMAL, &l,
                                         &d, on_lease, c);
    if (rc == RATE_PENDING) {
        pending++;
        wait_all(uvl);
    } else { /* refused at once (a breaker open, a reconnect's backoff) */
        c->calls = 1;
        c->rc = rc;
        c->d = d;
        c->has_d = true;
    }
    return c;
}

static void faults(int path)
{
    server_for(path);
    uv_loop_t uvl;
    rate_loop_t loop;
    loop_open(&uvl, &loop);
    rate_store_t *as = async_store(&loop, "lf:", path, false);
    rate_inflight_t *in = inflight_of("concurrency 2 ttl=1h", as, NULL);
    call_t a, b;
    WAIT_UNTIL(acquire_now(in, &uvl, &a)->rc == RATE_OK, TEST_WAIT_S);
    assert_int_equal(a.rc, RATE_OK);
    assert_true(a.d.allowed);
    /* Stopped: each call's store error, once. */
    kill(server, SIGSTOP);
    acquire_now(in, &uvl, &b);
    assert_int_equal(b.calls, 1);
    assert_true(b.rc == RATE_ETIMEDOUT || b.rc == RATE_ESTORE);
    assert_false(b.d.allowed);
    assert_int_equal(b.d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(b.d.error, b.rc);
    assert_int_equal(b.lease.id, 0);
    kill(server, SIGCONT);
    /* Killed: the store's error; a restarted empty server holds none. */
    kill(server, SIGKILL);
    waitpid(server, NULL, 0);
    server = 0;
    acquire_now(in, &uvl, &b);
    assert_true(b.rc == RATE_ESTORE || b.rc == RATE_ETIMEDOUT);
    assert_false(b.d.allowed);
    if (path == BY_MODULE)
        start_server("--loadmodule", RATE_MODULE_PATH);
    else
        start_server(NULL, NULL);
    call_t r = {0};
    int rc = RATE_ESTORE;
    WAIT_UNTIL((r.calls = 0,
                rc = rate_inflight_release_start(in, "f", 1, &a.lease,
                                                 on_lease, &r),
                rc == RATE_PENDING ? (pending++, wait_all(&uvl), rc = r.rc)
                                   : rc,
                rc == RATE_OK || rc == RATE_ELEASE),
               TEST_WAIT_S);
    assert_int_equal(rc, RATE_ELEASE); /* lost with the server's data */
    /* Exact: two granted, the third denied. */
    for (int i = 0; i < 3; i++) {
        acquire_now(in, &uvl, &b);
        assert_int_equal(b.rc, RATE_OK);
        assert_int_equal(b.d.allowed, i < 2);
    }
    loop_close(&uvl, as, in, NULL);
}

static void faults_script(void **state)
{
    (void)state;
    faults(BY_SCRIPT);
}

static void faults_module(void **state)
{
    (void)state;
    faults(BY_MODULE);
}

/* ------------------------------------------------- FUNCTION FLUSH */

/* The lease scripts go by FCALL; a node that lost the library (FUNCTION
 * FLUSH) has it loaded again on the connection, and each operation is
 * made once, plain or with rate limits. */
static void function_flush(void **state)
{
    (void)state;
    server_for(BY_SCRIPT);
    uv_loop_t uvl;
    rate_loop_t loop;
    loop_open(&uvl, &loop);
    rate_store_t *as = async_store(&loop, "lfn:", BY_SCRIPT, false);
    rate_inflight_t *in =
        inflight_of("concurrency 5 ttl=1h; fixed-window 3/h", as, NULL);
    call_t a;
    /* the first: connected, the policy's record */
    WAIT_UNTIL(acquire_now(in, &uvl, &a)->rc == RATE_OK, TEST_WAIT_S);
    assert_true(a.d.allowed);
    for (int i = 0; i < 3; i++) {
        redisContext *c = raw();
        freeReplyObject(redisCommand(c, "FUNCTION FLUSH"));
        redisFree(c);
        acquire_now(in, &uvl, &a);
        assert_int_equal(a.calls, 1);
        assert_int_equal(a.rc, RATE_OK);
        assert_int_equal(a.d.allowed, i < 2); /* the fourth: the rate */
        assert_int_equal(a.d.component, 1);   /* (the tighter, admitted) */
    }
    uint64_t held = 0;
    assert_int_equal(rate_inflight_held(in, "f", 1, &held), RATE_OK);
    assert_int_equal(held, 3);
    loop_close(&uvl, as, in, NULL);
}

/* ---------------------------------------------------------- freeing */

static void free_in_flight(void **state)
{
    (void)state;
    server_for(BY_SCRIPT);
    uv_loop_t uvl;
    rate_loop_t loop;
    loop_open(&uvl, &loop);
    rate_store_t *as = async_store(&loop, "lx:", BY_SCRIPT, false);
    rate_inflight_t *in = inflight_of("concurrency 2 ttl=1h", as, NULL);
    call_t w;
    WAIT_UNTIL(acquire_now(in, &uvl, &w)->rc == RATE_OK, TEST_WAIT_S);
    call_t c[5];
    memset(c, 0, sizeof c);
    for (int i = 0; i < 5; i++) {
        rate_lease_t l;
        rate_decision_t d;
        assert_int_equal(rate_inflight_acquire_start(in, "x", 1,
                                                     RATE_LEASE_NORMAL, &l,
                                                     &d, on_lease, &c[i]),
                         RATE_PENDING);
        pending++;
    }
    rate_store_free(as); /* before the loop ran: every callback first */
    assert_int_equal(pending, 0);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(c[i].calls, 1);
        assert_int_equal(c[i].rc, RATE_ECANCELED);
        assert_int_equal(c[i].d.reason, RATE_REASON_STORE_ERROR);
        assert_int_equal(c[i].lease.id, 0);
    }
    loop_close(&uvl, NULL, in, NULL); /* the store was freed above */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(at_once),
        cmocka_unit_test(differential_script),
        cmocka_unit_test(differential_module),
        cmocka_unit_test(differential_generic),
        cmocka_unit_test(differential_rated),
        cmocka_unit_test(many),
        cmocka_unit_test(faults_script),
        cmocka_unit_test(faults_module),
        cmocka_unit_test(function_flush),
        cmocka_unit_test(free_in_flight),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
