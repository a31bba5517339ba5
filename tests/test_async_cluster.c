/* SPDX-License-Identifier: MIT */
/*
 * The asynchronous Redis store on a private Redis Cluster
 * (tests/redis_cluster.h: 3 masters, 3 replicas on free loopback ports,
 * stopped by PID), on libuv and libevent loops:
 *
 * - differential traces: every request decided through the asynchronous
 *   cluster store (alternating with a synchronous cluster store on the
 *   same keys) equal, field by field, to the synchronous call on a memory
 *   store; keys over every master, keys with '}' and '{', a policy the
 *   script declines (the C step over HMGET and compare-and-set);
 * - thousands of decisions in flight across the masters, all started
 *   before the loop turns: exactly each key's limit allowed, every
 *   callback once; again after SCRIPT FLUSH on every master (NOSCRIPT:
 *   the script loaded again on each connection);
 * - a store made lazily from one seed (the topology not known yet) learns
 *   the cluster from MOVED and its slot map refresh;
 * - slots migrated under load (SETSLOT IMPORTING / MIGRATING, MIGRATE key
 *   by key, SETSLOT NODE, and back) from another thread: MOVED and ASK
 *   seen and counted, no store error, every key's count exact;
 * - a redirection loop (two masters each naming the other): 5 MOVED
 *   followed, then a store error under the fail mode;
 * - a master stopped (SIGSTOP), then one killed, under load: the other
 *   masters' keys are answered, the dead one's fail under the fail mode,
 *   none later than its timeout plus SLACK_NS plus three times the
 *   scheduler's worst delay (tests/lib/sched_probe.h), each callback
 *   once; after the failover the killed master's slots are answered again
 *   (its replica, found by the map refresh);
 * - freed with decisions in flight on every master: each callback once,
 *   before rate_store_free returns.
 * Nothing may leak (run under ASan by make test).
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <uv.h>

#include <ratelimit_event.h>
#include <ratelimit_loop.h>
#include <ratelimit_uv.h>

#include "../src/store/redis/cluster.h"
#include "lib/helpers.h"
#include "lib/redis_cluster.h"
#include "lib/wait.h"
#include "lib/sched_probe.h"

/* The timeout of the commands of the fault tests, and how much later than
 * it a callback may come on a loaded 2-core machine (a loop turn, the
 * timer's rounding, the scheduler): generous, since it is counted. */
#define TIMEOUT_NS (150 * MS)
#define SLACK_NS (1500 * MS)

static rcluster_t cl;
static char curl[160];

static int group_setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    if (!rcl_start(&cl))
        fail_msg("could not start a Redis Cluster (redis-server and "
                 "redis-cli 7 are needed)");
    rcl_url(&cl, curl, sizeof curl);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    rcl_stop(&cl);
    return 0;
}

#include "lib/async_loop.h"
#include "ratelimit_redis.h"

static int start(rate_limiter_t *l, const char *key, req_t *q)
{
    return start_at(l, key, 1, q, 0);
}

static rate_store_t *astore(tloop_t *t, const char *u, const char *prefix,
                            bool client_time, bool lazy, uint64_t timeout_ns)
{
    rate_redis_options_t o = {0};
    rate_store_t *s = NULL;
    char err[256] = "";
    o.prefix = prefix;
    o.client_time = client_time;
    /* The fake clock's keys must not expire by Redis's (a loaded machine
     * may pause the test longer than a state lives). */
    o.no_ttl = client_time;
    o.command_timeout_ns = timeout_ns;
    o.connect_timeout_ns = timeout_ns;
    o.breaker_cooldown_ns = 100 * MS;
    o.lazy_connect = lazy;
    if (rate_store_redis_async_new(u ? u : curl, &o, &t->loop, &s, err,
                                   sizeof err) != RATE_OK)
        fail_msg("async cluster store: %s", err);
    return s;
}

static rate_store_t *sstore(const char *prefix, bool client_time)
{
    rate_redis_options_t o = {0};
    rate_store_t *s = NULL;
    char err[256] = "";
    o.prefix = prefix;
    o.client_time = client_time;
    o.no_ttl = client_time; /* as astore's */
    o.command_timeout_ns = 2 * SEC;
    o.connect_timeout_ns = 2 * SEC;
    if (rate_store_redis_new(curl, &o, &s, err, sizeof err) != RATE_OK)
        fail_msg("cluster store: %s", err);
    return s;
}

static rate_redis_async_stats_t stats(rate_store_t *as)
{
    rate_redis_async_stats_t st;
    assert_int_equal(rate_store_redis_async_stats(as, &st), RATE_OK);
    return st;
}

static void idle(rate_store_t *as)
{
    rate_redis_async_stats_t st = stats(as);
    if (st.started != st.completed || st.in_flight != 0)
        fail_msg("started %llu completed %llu in flight %llu",
                 (unsigned long long)st.started,
                 (unsigned long long)st.completed,
                 (unsigned long long)st.in_flight);
}

/* Keys under `prefix` on node i (0 when it is not up). */
static unsigned keys_on(int i, const char *prefix)
{
    unsigned n = rcl_keys_on(&cl, i, prefix);
    assert_true(n != UINT_MAX);
    return n;
}

/* Every master holds some of the keys under prefix. */
static void on_every_master(const char *prefix)
{
    int masters = 0;
    for (int i = 0; i < RCL_NODES; i++)
        if (cl.pid[i] > 0 && rcl_is_master(&cl, i)) {
            masters++;
            if (keys_on(i, prefix) == 0)
                fail_msg("no %s key on master %d", prefix, i);
        }
    assert_int_equal(masters, 3);
}

/* The master index (into cl) of the state key `key` under prefix. */
static int master_of_key(const char *prefix, const char *key)
{
    char name[96];
    int n = snprintf(name, sizeof name, "%s{%s}", prefix, key);
    return rcl_master_of(&cl, rc_key_slot(name, (size_t)n));
}

/* ------------------------------------------------------ differential */

static const char *const policies[] = {
    "token-bucket 5/s burst=3", "leaky-bucket 7/3s capacity=4",
    "fixed-window 4/700ms", "sliding-log 5/s", "sliding-window 6/s",
    "token-bucket 10/s burst=5; sliding-log 20/3s; fixed-window 30/m",
    /* a block: the C step over HMGET and the compare-and-set, routed */
    "token-bucket 5/s burst=3 block=700ms",
};

static void differential(bool uv)
{
    tloop_t t;
    const char *prefix = uv ? "cuv:" : "cev:";
    tloop_init(&t, uv);
    rate_store_t *as = astore(&t, NULL, prefix, true, false, 5 * SEC);
    rate_store_t *ss = sstore(prefix, true);
    unsigned seed = 11;
    unsigned long async_pending = 0;
    for (size_t p = 0; p < sizeof policies / sizeof *policies; p++) {
        fclock.now = 5000 * SEC + p * 1000 * SEC;
        rate_limiter_t *ref = lim(policies[p], NULL, true, RATE_FAIL_CLOSED);
        rate_limiter_t *la = lim(policies[p], as, true, RATE_FAIL_CLOSED);
        rate_limiter_t *ls = lim(policies[p], ss, true, RATE_FAIL_CLOSED);
        for (int i = 0; i < 240; i++) {
            seed = seed * 1103515245u + 12345u;
            fclock.now += (seed >> 8) % (150 * MS);
            /* Keys with a '}' (an escaped name) and a '{' among them. */
            char key[16];
            unsigned k = (seed >> 4) % 12;
            snprintf(key, sizeof key,
                     k == 0 ? "p%zu}k%u" : k == 1 ? "{p%zu}k%u" : "p%zu-k%u",
                     p, k);
            uint64_t n = 1 + (seed >> 12) % 2;
            rate_decision_t want, got;
            assert_int_equal(rate_limiter_check_at(ref, key, strlen(key), n,
                                                   0, fclock.now, &want),
                             RATE_OK);
            if (i % 3 != 2) {
                req_t q = {0};
                int rc = rate_limiter_check_start(la, key, strlen(key), n, 0,
                                                  &q.d, on_decided, &q);
                assert_true(rc == RATE_OK || rc == RATE_PENDING);
                if (rc == RATE_PENDING) {
                    pending++;
                    async_pending++;
                    wait_all(&t);
                    assert_int_equal(q.calls, 1);
                    assert_int_equal(q.rc, RATE_OK);
                }
                got = q.d;
            } else {
                assert_int_equal(rate_limiter_check_at(ls, key, strlen(key), n,
                                                       0, fclock.now, &got),
                                 RATE_OK);
            }
            expect_same_decision(&want, &got, policies[p],
                                 i % 3 != 2 ? "async cluster"
                                            : "sync cluster",
                                 i, fclock.now, n, 0);
        }
        rate_limiter_free(ref);
        rate_limiter_free(la);
        rate_limiter_free(ls);
    }
    assert_true(async_pending > 0);
    idle(as);
    on_every_master(prefix);
    rate_redis_async_stats_t st = stats(as);
    assert_int_equal(st.moved + st.asked, 0); /* the map was right */
    assert_true(st.connects >= 3);            /* one per master */
    assert_int_equal(rate_store_redis_drop(ss), RATE_OK);
    rate_store_free(ss);
    rate_store_free(as);
    tloop_fini(&t);
}

static void differential_uv(void **state) { (void)state; differential(true); }
static void differential_event(void **state)
{
    (void)state;
    differential(false);
}

/* ------------------------------------------------------- many in flight */

enum { MANY = 6000, MANY_KEYS = 60, MANY_LIMIT = 40 };

static void many(bool uv)
{
    tloop_t t;
    const char *prefix = uv ? "muv:" : "mev:";
    tloop_init(&t, uv);
    rate_store_t *as = astore(&t, NULL, prefix, true, false, 10 * SEC);
    fclock.now = 100 * SEC;
    rate_limiter_t *l = lim("fixed-window 40/m", as, true, RATE_FAIL_CLOSED);
    static req_t q[MANY];
    int at_once = 0;
    /* The policy's record first (a burst of first decisions would wait on
     * its one job): then every decision is a command in flight. */
    req_t w = {0};
    if (start(l, "warm", &w) == RATE_PENDING)
        wait_all(&t);
    uint64_t t0 = rate_clock_monotonic_ns();
    for (int i = 0; i < MANY; i++) {
        char key[16];
        snprintf(key, sizeof key, "m%d", i % MANY_KEYS);
        q[i].key = i % MANY_KEYS;
        int rc = start(l, key, &q[i]);
        assert_true(rc == RATE_OK || rc == RATE_PENDING);
        at_once += rc == RATE_OK;
    }
    assert_int_equal(at_once, 0);
    assert_int_equal(stats(as).in_flight, MANY);
    wait_all(&t);
    uint64_t took = rate_clock_monotonic_ns() - t0;
    int allowed[MANY_KEYS] = {0};
    for (int i = 0; i < MANY; i++) {
        assert_int_equal(q[i].calls, 1);
        assert_int_equal(q[i].rc, RATE_OK);
        if (q[i].d.reason == RATE_REASON_STORE_ERROR)
            fail_msg("request %d: store error %d", i, q[i].d.error);
        allowed[q[i].key] += q[i].d.allowed;
    }
    for (int k = 0; k < MANY_KEYS; k++)
        assert_int_equal(allowed[k], MANY_LIMIT);
    idle(as);
    on_every_master(prefix);
    rate_redis_async_stats_t st = stats(as);
    /* The same decisions one at a time through the synchronous cluster
     * store, for the figure only (not asserted: a shared machine). */
    char sprefix[8];
    snprintf(sprefix, sizeof sprefix, "%ss:", uv ? "muv" : "mev");
    rate_store_t *ss = sstore(sprefix, true);
    rate_limiter_t *ls = lim("fixed-window 40/m", ss, true,
                             RATE_FAIL_CLOSED);
    uint64_t t1 = rate_clock_monotonic_ns();
    for (int i = 0; i < MANY; i++) {
        char key[16];
        rate_decision_t d;
        snprintf(key, sizeof key, "m%d", i % MANY_KEYS);
        assert_int_equal(rate_limiter_check(ls, key, strlen(key), 1, 0, &d),
                         RATE_OK);
    }
    uint64_t took_sync = rate_clock_monotonic_ns() - t1;
    rate_limiter_free(ls);
    assert_int_equal(rate_store_redis_drop(ss), RATE_OK);
    rate_store_free(ss);
    print_message("%d decisions on %d keys over 3 masters, in flight at once "
                  "on one %s loop: %.1f ms, %llu connections; one by one "
                  "synchronously %.1f ms (%.2fx)\n",
                  MANY, MANY_KEYS, uv ? "libuv" : "libevent",
                  (double)took / 1e6, (unsigned long long)st.connects,
                  (double)took_sync / 1e6, (double)took_sync / (double)took);
    assert_int_equal(st.connects, 3);
    /* The scripts and the Functions flushed from every master: the same
     * again on new keys, each connection loading the lean scripts'
     * library again ("no such function", FUNCTION LOAD: a fixed window is
     * an FCALL; the general script's NOSCRIPT is test_async's). */
    for (int i = 0; i < RCL_NODES; i++) {
        redisContext *c = rcl_connect(cl.port[i]);
        assert_non_null(c);
        freeReplyObject(redisCommand(c, "SCRIPT FLUSH"));
        freeReplyObject(redisCommand(c, "FUNCTION FLUSH"));
        redisFree(c);
    }
    for (int i = 0; i < MANY; i++) {
        char key[16];
        snprintf(key, sizeof key, "n%d", i % MANY_KEYS);
        q[i].key = i % MANY_KEYS;
        assert_int_equal(start(l, key, &q[i]), RATE_PENDING);
    }
    wait_all(&t);
    memset(allowed, 0, sizeof allowed);
    for (int i = 0; i < MANY; i++) {
        assert_int_equal(q[i].calls, 1);
        if (q[i].d.reason == RATE_REASON_STORE_ERROR)
            fail_msg("request %d after the flush: store error %d", i,
                     q[i].d.error);
        allowed[q[i].key] += q[i].d.allowed;
    }
    for (int k = 0; k < MANY_KEYS; k++)
        assert_int_equal(allowed[k], MANY_LIMIT);
    assert_int_equal(stats(as).lean_decisions,
                     st.lean_decisions + (uint64_t)MANY);
    idle(as);
    rate_limiter_free(l);
    /* Dropped through the store's synchronous side (outside the loop). */
    assert_int_equal(rate_store_redis_drop(as), RATE_OK);
    assert_true(rcl_wait_replicas(&cl)); /* the replicas have the UNLINKs */
    for (int i = 0; i < RCL_NODES; i++)
        if (cl.pid[i] > 0 && keys_on(i, prefix) != 0)
            fail_msg("%s keys left on node %d", prefix, i);
    rate_store_free(as);
    tloop_fini(&t);
}

static void many_uv(void **state) { (void)state; many(true); }
static void many_event(void **state) { (void)state; many(false); }

/* ------------------------------------------------------ lazy, one seed */

/* One seed, a replica, down when the store is made with lazy_connect: the
 * synchronous store has not found the topology, so the asynchronous one
 * starts with the seed as its one node; once the seed is back, its MOVED
 * replies tell it is a cluster's, and the map refresh finds the rest. */
static void lazy_learns_the_cluster(void **state)
{
    (void)state;
    tloop_t t;
    char u[64];
    int replica = -1;
    for (int i = 0; i < RCL_NODES && replica < 0; i++)
        if (cl.pid[i] > 0 && !rcl_is_master(&cl, i))
            replica = i;
    assert_true(replica >= 0);
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", cl.port[replica]);
    tloop_init(&t, true);
    rcl_stop_node(&cl, replica);
    rate_store_t *as = astore(&t, u, "lz:", true, true, 5 * SEC);
    assert_true(rcl_start_node(&cl, replica));
    assert_true(rcl_wait_ok(&cl, 3, 20000));
    fclock.now = 100 * SEC;
    rate_limiter_t *l = lim("fixed-window 3/m", as, true, RATE_FAIL_CLOSED);
    rate_limiter_t *ref = lim("fixed-window 3/m", NULL, true,
                              RATE_FAIL_CLOSED);
    for (int i = 0; i < 200; i++) {
        char key[16];
        snprintf(key, sizeof key, "z%d", i % 50);
        req_t q = {0};
        rate_decision_t want;
        assert_int_equal(rate_limiter_check_at(ref, key, strlen(key), 1, 0,
                                               fclock.now, &want),
                         RATE_OK);
        int rc = start(l, key, &q);
        assert_true(rc == RATE_OK || rc == RATE_PENDING);
        wait_all(&t);
        assert_int_equal(q.calls, 1);
        expect_same_decision(&want, &q.d, "lazy", "async cluster", i,
                             fclock.now, 1, 0);
    }
    rate_redis_async_stats_t st = stats(as);
    print_message("lazy store from a replica: %llu MOVED, %llu map "
                  "refreshes, %llu connections\n",
                  (unsigned long long)st.moved,
                  (unsigned long long)st.refreshes,
                  (unsigned long long)st.connects);
    assert_true(st.moved > 0);
    assert_true(st.refreshes > 0);
    /* Once the map is known, no key is redirected any more. */
    uint64_t moved = st.moved;
    for (int i = 0; i < 50; i++) {
        char key[16];
        snprintf(key, sizeof key, "z%d", i);
        req_t q = {0};
        if (start(l, key, &q) == RATE_PENDING)
            wait_all(&t);
        assert_int_equal(q.d.reason, RATE_REASON_LIMITED);
    }
    assert_int_equal(stats(as).moved, moved);
    idle(as);
    rate_limiter_free(ref);
    rate_limiter_free(l);
    rate_store_free(as);
    tloop_fini(&t);
    rate_store_t *ss = sstore("lz:", true);
    assert_int_equal(rate_store_redis_drop(ss), RATE_OK);
    rate_store_free(ss);
}

/* ------------------------------------------------------- slots migrated */

static void node_id(int i, char id[64])
{
    assert_true(rcl_node_id(&cl, i, id));
}

/* From the mover thread: no cmocka assertion there. */
static atomic_int mover_errors;

/* Moves slots [first, last] from node `from` to node `to`, a pause
 * between keys so that callers meet the slot half moved (ASK). */
static void move_slots(int from, int to, unsigned first, unsigned last)
{
    char why[256];
    unsigned errs = rcl_move_slots(&cl, from, to, first, last, 1, 5000, why,
                                   sizeof why);
    atomic_fetch_add(&mover_errors, (int)errs);
}

enum { MIG_FIRST = 0, MIG_LAST = 15, MIG_KEYS = 64, MIG_POOL = 128 };
static int mig_from, mig_to;
static atomic_bool mover_done;
static atomic_uint mig_calls; /* decisions answered so far */

/* Until n more decisions have been answered: the load runs before, between
 * and after the moves by a count, not a time (a loaded machine's loop may
 * turn seldom). */
static void mig_answered(unsigned n)
{
    unsigned target = atomic_load(&mig_calls) + n;
    WAIT_UNTIL(atomic_load(&mig_calls) >= target, TEST_WAIT_S);
}

static void *mover(void *arg)
{
    (void)arg;
    mig_answered(500);
    move_slots(mig_from, mig_to, MIG_FIRST, MIG_LAST);
    mig_answered(500);
    move_slots(mig_to, mig_from, MIG_FIRST, MIG_LAST); /* and back */
    mig_answered(500);
    atomic_store(&mover_done, true);
    return NULL;
}

static void migrated_mid_run(void **state)
{
    (void)state;
    enum { LIMIT = 1000000 };
    static char keys[MIG_KEYS][16];
    static req_t q[MIG_POOL];
    static bool busy[MIG_POOL];
    static unsigned allowed[MIG_KEYS];
    tloop_t t;
    const char *prefix = "mig:";

    mig_from = rcl_master_of(&cl, MIG_FIRST);
    mig_to = rcl_master_of(&cl, 16383);
    assert_true(mig_from >= 0 && mig_to >= 0 && mig_from != mig_to);
    /* Keys in the slots that move, several per slot. */
    for (int n = 0, i = 0; n < MIG_KEYS; i++) {
        char name[48];
        snprintf(keys[n], sizeof keys[n], "g%d", i);
        int len = snprintf(name, sizeof name, "%s{%s}", prefix, keys[n]);
        unsigned s = rc_key_slot(name, (size_t)len);
        if (s <= MIG_LAST) /* MIG_FIRST is 0 */
            n++;
    }
    memset(allowed, 0, sizeof allowed);
    memset(busy, 0, sizeof busy);
    tloop_init(&t, true);
    rate_store_t *as = astore(&t, NULL, prefix, false, false, 5 * SEC);
    rate_limiter_t *l = lim("fixed-window 1000000/h", as, false,
                            RATE_FAIL_CLOSED);
    atomic_store(&mover_errors, 0);
    atomic_store(&mover_done, false);
    atomic_store(&mig_calls, 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, mover, NULL), 0);
    unsigned calls = 0, errors = 0, k = 0;
    for (;;) {
        bool again = !atomic_load(&mover_done);
        for (int i = 0; i < MIG_POOL; i++) {
            if (busy[i] && q[i].calls == 0)
                continue;
            if (busy[i]) {
                busy[i] = false;
                atomic_store(&mig_calls, ++calls);
                if (q[i].d.reason == RATE_REASON_STORE_ERROR) {
                    if (errors++ == 0)
                        print_message("store error %d on key %s\n",
                                      q[i].d.error, keys[q[i].key]);
                } else {
                    allowed[q[i].key] += q[i].d.allowed;
                }
            }
            if (!again)
                continue;
            q[i].key = (int)(k++ % MIG_KEYS);
            int rc = start(l, keys[q[i].key], &q[i]);
            assert_int_equal(rc, RATE_PENDING);
            busy[i] = true;
        }
        if (!again && pending == 0)
            break;
        tloop_turn(&t);
    }
    pthread_join(th, NULL);
    rate_redis_async_stats_t st = stats(as);
    print_message("%u decisions while %d slots moved there and back: %u "
                  "errors, %llu MOVED, %llu ASK, %llu TRYAGAIN, %llu map "
                  "refreshes\n",
                  calls, MIG_LAST - MIG_FIRST + 1, errors,
                  (unsigned long long)st.moved, (unsigned long long)st.asked,
                  (unsigned long long)st.tryagain,
                  (unsigned long long)st.refreshes);
    assert_int_equal(atomic_load(&mover_errors), 0);
    assert_int_equal(errors, 0);
    assert_true(st.moved > 0);
    assert_true(st.asked > 0);
    assert_true(st.refreshes > 0);
    idle(as);
    assert_int_equal(rcl_master_of(&cl, MIG_FIRST), mig_from);
    /* Every key's count is the sum of its admissions, read back through a
     * synchronous store. */
    rate_store_t *ss = sstore(prefix, false);
    rate_limiter_t *ls = lim("fixed-window 1000000/h", ss, false,
                             RATE_FAIL_CLOSED);
    for (int i = 0; i < MIG_KEYS; i++) {
        rate_decision_t d;
        assert_int_equal(rate_limiter_check(ls, keys[i], strlen(keys[i]), 1,
                                            0, &d),
                         RATE_OK);
        assert_int_equal(d.reason, RATE_REASON_ALLOWED);
        if (d.remaining != LIMIT - allowed[i] - 1)
            fail_msg("key %s: %u admitted, then remaining %llu", keys[i],
                     allowed[i], (unsigned long long)d.remaining);
    }
    rate_limiter_free(ls);
    assert_int_equal(rate_store_redis_drop(ss), RATE_OK);
    rate_store_free(ss);
    rate_limiter_free(l);
    rate_store_free(as);
    tloop_fini(&t);
}

/* ------------------------------------------------- a redirection loop */

/* A slot that two masters each say is the other's (SETSLOT NODE on its
 * owner alone, which gives it up without the other learning it): a
 * decision on it follows MOVED 5 times, then fails as a store error;
 * mended, it is answered again. */
static void redirect_loop(void **state)
{
    (void)state;
    tloop_t t;
    char key[16], aid[64], bid[64];
    int a = -1, b = -1;
    for (int i = 0; b < 0 || a < 0; i++) {
        assert_true(i < 1000);
        snprintf(key, sizeof key, "r%d", i);
        b = master_of_key("loop:", key);
        a = -1;
        for (int j = 0; j < RCL_NODES && a < 0; j++)
            if (j != b && cl.pid[j] > 0 && rcl_is_master(&cl, j))
                a = j;
    }
    char name[48];
    int len = snprintf(name, sizeof name, "loop:{%s}", key);
    unsigned slot = rc_key_slot(name, (size_t)len);
    node_id(a, aid);
    node_id(b, bid);
    tloop_init(&t, true);
    rate_store_t *as = astore(&t, NULL, "loop:", true, false, 5 * SEC);
    fclock.now = 100 * SEC;
    rate_limiter_t *l = lim("fixed-window 3/m", as, true, RATE_FAIL_CLOSED);
    redisContext *c = rcl_connect(cl.port[b]);
    assert_non_null(c);
    redisReply *r = redisCommand(c, "CLUSTER SETSLOT %u NODE %s", slot, aid);
    assert_true(r != NULL && r->type != REDIS_REPLY_ERROR);
    freeReplyObject(r);
    uint64_t moved = stats(as).moved;
    req_t q = {0};
    assert_int_equal(start(l, key, &q), RATE_PENDING);
    wait_all(&t);
    assert_int_equal(q.calls, 1);
    assert_int_equal(q.d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(q.d.error, RATE_ESTORE);
    assert_false(q.d.allowed); /* the fail mode: closed */
    assert_int_equal(stats(as).moved - moved, 5);
    /* Mended: the slot its owner's again. */
    r = redisCommand(c, "CLUSTER SETSLOT %u NODE %s", slot, bid);
    assert_true(r != NULL && r->type != REDIS_REPLY_ERROR);
    freeReplyObject(r);
    redisFree(c);
    assert_true(rcl_wait_ok(&cl, 3, 10000));
    usleep(150000); /* past the map refreshes' pace */
    assert_int_equal(start(l, key, &q), RATE_PENDING);
    wait_all(&t);
    assert_int_equal(q.d.reason, RATE_REASON_ALLOWED);
    idle(as);
    rate_limiter_free(l);
    rate_store_free(as);
    tloop_fini(&t);
    rate_store_t *ss = sstore("loop:", true);
    assert_int_equal(rate_store_redis_drop(ss), RATE_OK);
    rate_store_free(ss);
}

/* ----------------------------------------------- a master stopped, killed */

enum { FPOOL = 192, FKEYS = 48 };
static req_t fq[FPOOL];
static char fkeys[FKEYS][16];
static int fmaster[FKEYS]; /* each key's master at the start */
typedef struct tally {
    int answered, victim_ok, victim_err, other_ok, other_err;
    uint64_t worst_ns; /* the longest a decision took to come back */
    uint64_t start_ns; /* the longest rate_limiter_check_start call: this
                          thread held from its loop (it was ASan's free()
                          once, tests/asan_options.c) */
} tally_t;

/* Keeps FPOOL decisions going for ns of wall time (then waits for every
 * callback), counting the answers of the victim's keys and the others'. */
static void fload(tloop_t *t, rate_limiter_t *l, int victim, uint64_t ns,
                  tally_t *ty)
{
    static bool busy[FPOOL];
    uint64_t end = rate_clock_monotonic_ns() + ns;
    unsigned k = 0;
    memset(ty, 0, sizeof *ty);
    memset(busy, 0, sizeof busy);
    for (;;) {
        bool again = rate_clock_monotonic_ns() < end;
        for (int i = 0; i < FPOOL; i++) {
            if (busy[i] && fq[i].calls == 0)
                continue;
            if (busy[i] || (fq[i].calls == 1 && fq[i].started != 0)) {
                req_t *q = &fq[i];
                assert_int_equal(q->calls, 1);
                assert_int_equal(q->rc, RATE_OK);
                bool err = q->d.reason == RATE_REASON_STORE_ERROR;
                if (err)
                    assert_true(q->d.allowed); /* the fail mode: open */
                ty->answered++;
                if (q->ended - q->started > ty->worst_ns)
                    ty->worst_ns = q->ended - q->started;
                if (fmaster[q->key] == victim)
                    err ? ty->victim_err++ : ty->victim_ok++;
                else
                    err ? ty->other_err++ : ty->other_ok++;
                busy[i] = false;
                fq[i].started = 0;
            }
            if (!again)
                continue;
            fq[i].key = (int)(k++ % FKEYS);
            uint64_t t0 = rate_clock_monotonic_ns();
            int rc = start(l, fkeys[fq[i].key], &fq[i]);
            uint64_t took = rate_clock_monotonic_ns() - t0;
            ty->start_ns = took > ty->start_ns ? took : ty->start_ns;
            assert_true(rc == RATE_OK || rc == RATE_PENDING);
            busy[i] = rc == RATE_PENDING;
        }
        if (!again && pending == 0)
            break;
        if (pending > 0)
            tloop_turn(t);
        else
            usleep(1000); /* everything refused at once */
    }
}

/* What the nodes other than `stopped` say of the cluster: whether one says
 * it is failing now, and the sums of their FAIL messages received and of
 * their epochs (both grow when the cluster takes a master for failed and
 * when a replica is promoted). */
typedef struct cluster_view {
    bool failing;
    long long fails, epochs;
} cluster_view_t;

static long long info_field(const char *info, const char *name)
{
    const char *at_ = strstr(info, name);
    return at_ != NULL ? atoll(at_ + strlen(name)) : 0;
}

static cluster_view_t cluster_view(int stopped)
{
    cluster_view_t v = {false, 0, 0};
    for (int i = 0; i < RCL_NODES; i++) {
        if (cl.pid[i] <= 0 || i == stopped)
            continue;
        redisContext *c = rcl_connect(cl.port[i]);
        redisReply *r = c ? redisCommand(c, "CLUSTER INFO") : NULL;
        if (r != NULL && r->type == REDIS_REPLY_STRING) {
            v.failing |= strstr(r->str, "cluster_state:fail") != NULL;
            v.fails += info_field(r->str,
                                  "cluster_stats_messages_fail_received:");
            v.epochs += info_field(r->str, "cluster_current_epoch:");
        }
        freeReplyObject(r);
        if (c)
            redisFree(c);
    }
    return v;
}

/* The healthy masters' own delay, measured beside the stop: a thread
 * PINGs each master but the stopped one every 5 ms on a connection of its
 * own and keeps the longest answer.  A master that took longer than the
 * timeout to answer a PING was held up itself (a loaded machine, a
 * replica's sync): the store's timeouts on it then say nothing of the
 * store. */
typedef struct ping_probe {
    pthread_t th;
    int victim;
    atomic_bool stop;
    _Atomic uint64_t worst_ns;
} ping_probe_t;

static void *ping_probe_run(void *arg)
{
    ping_probe_t *p = arg;
    redisContext *c[RCL_NODES] = {0};
    for (int i = 0; i < RCL_NODES; i++)
        if (i != p->victim && cl.pid[i] > 0 && rcl_is_master(&cl, i))
            c[i] = rcl_connect(cl.port[i]);
    while (!atomic_load(&p->stop)) {
        for (int i = 0; i < RCL_NODES; i++) {
            if (c[i] == NULL)
                continue;
            uint64_t t0 = rate_clock_monotonic_ns();
            freeReplyObject(redisCommand(c[i], "PING"));
            uint64_t took = rate_clock_monotonic_ns() - t0;
            if (took > atomic_load(&p->worst_ns))
                atomic_store(&p->worst_ns, took);
        }
        usleep(5000);
    }
    for (int i = 0; i < RCL_NODES; i++)
        if (c[i] != NULL)
            redisFree(c[i]);
    return NULL;
}

static void faults(bool uv)
{
    tloop_t t;
    const char *prefix = uv ? "fuv:" : "fev:";
    tally_t ty;
    /* A settled cluster first: one map on every node, no slot half-moved
     * (a key sent on by ASK to the master stopped below would count as a
     * healthy master's failure). */
    assert_true(rcl_wait_ok(&cl, 3, 10000));
    tloop_init(&t, uv);
    rate_store_t *as = astore(&t, NULL, prefix, false, false, TIMEOUT_NS);
    rate_limiter_t *l = lim("token-bucket 100000/s burst=100000", as, false,
                            RATE_FAIL_OPEN);
    int victim = rcl_master_of(&cl, 1000);
    assert_true(victim >= 0);
    for (int i = 0; i < FKEYS; i++) {
        snprintf(fkeys[i], sizeof fkeys[i], "f%d", i);
        fmaster[i] = master_of_key(prefix, fkeys[i]);
    }
    uint64_t worst = 0;
    /* The scheduler's worst delay meanwhile: a decision's bound is its
     * timeout plus SLACK_NS plus three times that (tests/lib/sched_probe.h),
     * and a machine that held this process longer than the timeout times
     * out healthy masters' decisions by their own deadlines. */
    static sched_probe_t probe; /* a failed check leaves its thread on */
    sched_probe_start(&probe);

    /* Up: all answered. */
    fload(&t, l, victim, 200 * MS, &ty);
    idle(as);
    worst = ty.worst_ns > worst ? ty.worst_ns : worst;
    assert_true(ty.victim_ok > 0 && ty.other_ok > 0);

    /* Stopped, shorter than the node timeout (no failover): its keys time
     * out or are refused by its breaker, the others are answered. */
    cluster_view_t before = cluster_view(victim);
    static ping_probe_t pp; /* static: a failed check leaves it on */
    pp.victim = victim;
    atomic_init(&pp.stop, false);
    atomic_init(&pp.worst_ns, 0);
    assert_int_equal(pthread_create(&pp.th, NULL, ping_probe_run, &pp), 0);
    kill(cl.pid[victim], SIGSTOP);
    fload(&t, l, victim, 4 * TIMEOUT_NS, &ty);
    atomic_store(&pp.stop, true);
    pthread_join(pp.th, NULL);
    uint64_t server_held = atomic_load(&pp.worst_ns);
    /* A machine so loaded that the stop outlasted the node timeout (1 s):
     * the cluster took the master for failed, and every node refused every
     * slot (CLUSTERDOWN) until the failover was done, which says nothing of
     * the store.  Seen by what the other nodes say now: failing, or FAIL
     * messages and a new epoch since the stop (a failover that was over by
     * now; asking only whether the cluster is failing now missed it). */
    cluster_view_t after = cluster_view(victim);
    bool down = after.failing || after.fails > before.fails ||
                after.epochs > before.epochs;
    kill(cl.pid[victim], SIGCONT);
    idle(as);
    worst = ty.worst_ns > worst ? ty.worst_ns : worst;
    rate_redis_async_stats_t st = stats(as);
    print_message("%s, a master stopped: its keys %d failed, %d answered; "
                  "the others' %d answered, %d failed; %llu timed out, "
                  "%llu refused\n",
                  uv ? "libuv" : "libevent", ty.victim_err, ty.victim_ok,
                  ty.other_ok, ty.other_err, (unsigned long long)st.timed_out,
                  (unsigned long long)st.refused);
    assert_true(ty.victim_err > 0);
    assert_true(st.timed_out > 0);
    assert_true(st.refused > 0); /* its breaker */
    assert_true(ty.other_ok > 0);
    if (down)
        print_message("%s: the cluster took the stopped master for failed "
                      "(failing now %d, FAIL messages %lld, epochs %lld to "
                      "%lld): the healthy masters' %d errors not counted\n",
                      uv ? "libuv" : "libevent", after.failing,
                      after.fails - before.fails, before.epochs,
                      after.epochs, ty.other_err);
    uint64_t held = atomic_load(&probe.worst_ns);
    if (ty.other_err > 0 && !down &&
        (held >= TIMEOUT_NS || server_held >= TIMEOUT_NS))
        print_message("%s: the scheduler held a thread %llu ms, a healthy "
                      "master took %llu ms to answer a PING (the timeout: "
                      "%llu ms): the healthy masters' %d errors are the "
                      "machine's\n",
                      uv ? "libuv" : "libevent",
                      (unsigned long long)(held / MS),
                      (unsigned long long)(server_held / MS),
                      (unsigned long long)(TIMEOUT_NS / MS), ty.other_err);
    else if (ty.other_err > 0 && !down)
        fail_msg("%d decisions on healthy masters failed (the scheduler's "
                 "worst delay %llu ms, the healthy masters' worst PING %llu "
                 "ms, the longest start call %llu ms)", ty.other_err,
                 (unsigned long long)(held / MS),
                 (unsigned long long)(server_held / MS),
                 (unsigned long long)(ty.start_ns / MS));
    assert_true(rcl_wait_ok(&cl, 3, 10000));

    /* Answered again once it is back (the breaker's cooldown). */
    int ok = 0;
    for (int round = 0; round < 50 && ok == 0; round++) {
        fload(&t, l, victim, 100 * MS, &ty);
        worst = ty.worst_ns > worst ? ty.worst_ns : worst;
        ok = ty.victim_ok;
    }
    assert_true(ok > 0);

    /* Killed: its keys fail at once (refused connection, breaker); the
     * others are answered; once its replica is promoted (the node
     * timeout, 1 s), its slots are answered again by the new master,
     * which a map refresh finds. */
    rcl_stop_node(&cl, victim);
    fload(&t, l, victim, 300 * MS, &ty);
    worst = ty.worst_ns > worst ? ty.worst_ns : worst;
    assert_true(ty.victim_err > 0);
    assert_true(ty.other_ok > 0);
    uint64_t refreshes = stats(as).refreshes;
    ok = 0;
    for (int round = 0; round < 100 && ok == 0; round++) {
        fload(&t, l, victim, 100 * MS, &ty);
        worst = ty.worst_ns > worst ? ty.worst_ns : worst;
        ok = ty.victim_ok;
    }
    st = stats(as);
    print_message("%s, a master killed: its slots answered again after the "
                  "failover (%llu map refreshes since)\n",
                  uv ? "libuv" : "libevent",
                  (unsigned long long)(st.refreshes - refreshes));
    assert_true(ok > 0);
    assert_true(st.refreshes > refreshes);
    idle(as);
    uint64_t sched = sched_probe_stop(&probe);
    if (worst > TIMEOUT_NS + SLACK_NS + 3 * sched)
        fail_msg("a decision came back after %llu ms, past the %llu ms "
                 "timeout + %llu ms + 3 x the scheduler's %llu ms",
                 (unsigned long long)(worst / MS),
                 (unsigned long long)(TIMEOUT_NS / MS),
                 (unsigned long long)(SLACK_NS / MS),
                 (unsigned long long)(sched / MS));
    assert_int_equal(pending, 0);
    rate_limiter_free(l);
    rate_store_free(as);
    tloop_fini(&t);

    /* The killed node back, as a replica of its successor. */
    assert_true(rcl_start_node(&cl, victim));
    assert_true(rcl_wait_ok(&cl, 3, 20000));
    rate_store_t *ss = sstore(prefix, false);
    rate_store_redis_drop(ss);
    rate_store_free(ss);
}

static void faults_uv(void **state) { (void)state; faults(true); }
static void faults_event(void **state) { (void)state; faults(false); }

/* --------------------------------------------------- freed in flight */

static void free_in_flight(bool uv)
{
    enum { N = 1500 };
    static req_t q[N];
    tloop_t t;
    tloop_init(&t, uv);
    rate_store_t *as = astore(&t, NULL, "free:", true, false, 5 * SEC);
    fclock.now = 100 * SEC;
    rate_limiter_t *l = lim("fixed-window 10/h", as, true, RATE_FAIL_OPEN);
    /* Connected to every master first, then decisions on all of them, and
     * the free. */
    for (int i = 0; i < 30; i++) {
        char key[16];
        snprintf(key, sizeof key, "w%d", i);
        if (start(l, key, &q[0]) == RATE_PENDING)
            wait_all(&t);
    }
    assert_int_equal(stats(as).connects, 3);
    for (int i = 0; i < N; i++) {
        char key[16];
        snprintf(key, sizeof key, "x%d", i % 90);
        assert_int_equal(start(l, key, &q[i]), RATE_PENDING);
    }
    /* No turn of the loop (three let a fast machine answer them all): the
     * free finds every one in flight, sent or queued. */
    int before = pending;
    assert_true(before > 0);
    rate_store_free(as);
    assert_int_equal(pending, 0);
    int cancelled = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(q[i].calls, 1);
        if (q[i].d.reason == RATE_REASON_STORE_ERROR) {
            assert_int_equal(q[i].d.error, RATE_ECANCELED);
            assert_true(q[i].d.allowed); /* the fail mode: open */
            cancelled++;
        }
    }
    assert_int_equal(cancelled, before);
    print_message("freed with %d of %d in flight over 3 masters: each "
                  "called back once\n", before, N);
    rate_limiter_free(l);
    tloop_fini(&t);
    rate_store_t *ss = sstore("free:", true);
    rate_store_redis_drop(ss);
    rate_store_free(ss);
}

static void free_uv(void **state) { (void)state; free_in_flight(true); }
static void free_event(void **state) { (void)state; free_in_flight(false); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(differential_uv),
        cmocka_unit_test(differential_event),
        cmocka_unit_test(many_uv),
        cmocka_unit_test(many_event),
        cmocka_unit_test(lazy_learns_the_cluster),
        cmocka_unit_test(migrated_mid_run),
        cmocka_unit_test(redirect_loop),
        cmocka_unit_test(free_uv),
        cmocka_unit_test(free_event),
        cmocka_unit_test(faults_uv),
        cmocka_unit_test(faults_event),
    };
    if (getenv("TEST_FILTER") != NULL) /* one test, while working on it */
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
