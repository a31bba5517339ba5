/* SPDX-License-Identifier: MIT */
/*
 * The Redis store on a private Redis Cluster (tests/redis_cluster.h: 3
 * masters, 3 replicas on free loopback ports, stopped by PID):
 *
 * - found to be a cluster from any node (a seed list whose first seed is
 *   dead too); a database other than 0 refused;
 * - keys over every master, rate_store_redis_touch reaching every key,
 *   and rate_store_redis_drop clearing every master (that a cluster's
 *   decisions are the memory store's is the store matrix's);
 * - `ratelimit replay --store redis://<a node>` printing the memory
 *   store's output byte for byte, and leaving no key on any master;
 * - slots moved under callers (SETSLOT IMPORTING / MIGRATING, MIGRATE,
 *   SETSLOT NODE, as redis-cli --cluster reshard does), and back with
 *   redis-cli --cluster reshard itself: no caller error,
 *   and every key's count is the sum of its admissions (no key decided
 *   from two states);
 * - a master killed under callers: decisions resume by themselves once
 *   its replica is promoted;
 * - a master stopped (SIGSTOP) with traffic to it alone: its breaker opens
 *   after exactly breaker_failures timed-out calls, and no other master's
 *   breaker opens (a key of another master is answered);
 * - rate_store_redis_drop with a master stopped: the healthy masters' keys
 *   are deleted all the same, and the error is returned at the end.
 *
 * Usage: test_redis_cluster RATELIMIT_BINARY
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

#include "../src/store/redis/cluster.h"
#include "lib/helpers.h"
#include "lib/redis_cluster.h"
#include "lib/wait.h"
#include "ratelimit_redis.h"

static rcluster_t cl;
static char curl[160];
static const char *binary;

static int group_setup(void **state)
{
    (void)state;
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

static rate_store_t *cstore(const char *u, const char *prefix)
{
    rate_redis_options_t o = {.prefix = prefix, .no_ttl = true};
    rate_store_t *s = NULL;
    char err[256] = "";
    o.command_timeout_ns = 500 * MS;
    o.connect_timeout_ns = 500 * MS;
    o.breaker_cooldown_ns = 200 * MS;
    if (rate_store_redis_new(u ? u : curl, &o, &s, err, sizeof err) != RATE_OK)
        fail_msg("cluster store: %s", err);
    return s;
}

/* Keys under `prefix` on node i (0 when it is not up). */
static unsigned keys_on(int i, const char *prefix)
{
    unsigned n = rcl_keys_on(&cl, i, prefix);
    assert_true(n != UINT_MAX);
    return n;
}

/* The clock of the node on `port` (TIME) in milliseconds. */
static long long node_ms(int port)
{
    redisContext *c = rcl_connect(port);
    redisReply *r = redisCommand(c, "TIME");
    assert_true(r != NULL && r->type == REDIS_REPLY_ARRAY &&
                r->elements == 2);
    long long ms = atoll(r->element[0]->str) * 1000 +
                   atoll(r->element[1]->str) / 1000;
    freeReplyObject(r);
    redisFree(c);
    return ms;
}

#define RND_SEED 4242
#include "lib/rng.h"

/* --------------------------------------------------------- detection */

static void found_from_any_node(void **state)
{
    (void)state;
    char u[128], err[256] = "";
    /* A replica, and a seed list whose first seed is dead. */
    for (int i = 0; i < RCL_NODES; i += 5) {
        snprintf(u, sizeof u, "redis://127.0.0.1:1,127.0.0.1:%d", cl.port[i]);
        rate_store_t *s = cstore(u, "det:");
        rate_redis_status_t st;
        assert_int_equal(rate_store_redis_status(s, &st), RATE_OK);
        assert_true(st.ready);
        assert_true(st.cluster);
        assert_int_equal(st.masters, 3);
        rate_store_free(s);
    }
    rate_store_t *s = NULL;
    snprintf(u, sizeof u, "redis://127.0.0.1:%d/2", cl.port[1]);
    assert_int_equal(rate_store_redis_new(u, NULL, &s, err, sizeof err),
                     RATE_EINVAL);
    if (strstr(err, "database 0") == NULL)
        fail_msg("'%s'", err);
    snprintf(u, sizeof u, "redis://127.0.0.1:%d/0", cl.port[1]);
    assert_int_equal(rate_store_redis_new(u, NULL, &s, err, sizeof err),
                     RATE_OK);
    rate_store_free(s);
}

/* ------------------------------------------------------ differential */

/* Keys of every policy spread over every master; touch reaches every
 * key and drop clears every master.  (That the cluster's decisions are
 * the memory store's is the store matrix's, tests/test_stores.c.) */
static void keys_over_every_master(void **state)
{
    (void)state;
    static const char *policies[] = {
        "token-bucket 5/s burst=3", "fixed-window 4/700ms",
        "sliding-log 5/s", "sliding-window 6/s", "leaky-bucket 7/3s",
        "token-bucket 5/s burst=3 block=700ms", /* the C step, by CAS */
    };
    rate_store_t *rs = cstore(NULL, "cdiff:");
    unsigned answered = 0;
    for (size_t p = 0; p < sizeof policies / sizeof policies[0]; p++) {
        rate_limiter_t *lr = limiter_of(policies[p], rs);
        uint64_t t = SEC;
        for (int i = 0; i < 120; i++) {
            char key[32];
            snprintf(key, sizeof key, i % 7 ? "p%zu:k%d" : "p%zu}b{%d", p,
                     i % 60);
            t += rnd(150) * MS;
            rate_decision_t b = at(lr, key, t, 1 + rnd(2), 0);
            if (b.reason == RATE_REASON_STORE_ERROR)
                fail_msg("%s, request %d key %s: %s", policies[p], i, key,
                         rate_err_name(b.error));
            answered++;
        }
        rate_limiter_free(lr);
    }
    assert_int_equal(answered, 720);
    unsigned masters = 0, total = 0;
    for (int i = 0; i < RCL_NODES; i++)
        if (rcl_is_master(&cl, i)) {
            unsigned n = keys_on(i, "cdiff:");
            masters++;
            total += n;
            if (n < 20)
                fail_msg("only %u keys on master %d", n, i);
        }
    assert_int_equal(masters, 3);
    assert_true(total > 300);
    /* touch: every key on every master gets the expiry. */
    /* Each expiry, as an instant (the nodes share this host's clock), is
     * 5 s after a moment of the touch, however long the reading takes. */
    long long before = node_ms(cl.port[0]);
    assert_int_equal(rate_store_redis_touch(rs, 5 * SEC), RATE_OK);
    long long after = node_ms(cl.port[0]);
    unsigned touched = 0;
    for (int i = 0; i < RCL_NODES; i++) {
        if (!rcl_is_master(&cl, i))
            continue;
        redisContext *c = rcl_connect(cl.port[i]);
        redisReply *k = redisCommand(c, "KEYS cdiff:*");
        assert_true(k != NULL && k->type == REDIS_REPLY_ARRAY);
        for (size_t j = 0; j < k->elements; j++) {
            redisReply *t = redisCommand(c, "PEXPIRETIME %b",
                                         k->element[j]->str,
                                         k->element[j]->len);
            if (t == NULL || t->integer < before + 5000 ||
                t->integer > after + 5002)
                fail_msg("%s on node %d: expires at %lld, touched for 5 s "
                         "within [%lld, %lld]", k->element[j]->str, i,
                         t ? t->integer : -9, before, after);
            freeReplyObject(t);
            touched++;
        }
        freeReplyObject(k);
        redisFree(c);
    }
    assert_int_equal(touched, total);
    assert_int_equal(rate_store_redis_drop(rs), RATE_OK);
    for (int i = 0; i < RCL_NODES; i++)
        if (rcl_is_master(&cl, i) && keys_on(i, "cdiff:") != 0)
            fail_msg("keys left on master %d after the drop", i);
    rate_store_free(rs);
}

/* -------------------------------------------------------------- CLI */

static void replay_byte_for_byte(void **state)
{
    (void)state;
    char dir[] = "/tmp/ratelimit-creplay.XXXXXX", cmdline[4096];
    assert_non_null(mkdtemp(dir));
    char trace[128];
    snprintf(trace, sizeof trace, "%s/t.trace", dir);
    FILE *f = fopen(trace, "w");
    assert_non_null(f);
    uint64_t t = 0;
    for (int i = 0; i < 400; i++) {
        t += rnd(80);
        fprintf(f, "%llu.%03llu u%d%s\n", (unsigned long long)(t / 1000),
                (unsigned long long)(t % 1000), (int)rnd(40),
                i % 3 ? "" : " 2");
    }
    fclose(f);
    static const char *args[] = {
        "--algorithm token-bucket --rate 5/s --burst 3",
        "--algorithm sliding-window --limit 4 --window 1s",
    };
    for (int a = 0; a < 2; a++) {
        snprintf(cmdline, sizeof cmdline,
                 "'%s' replay %s --store memory '%s' > '%s/mem' 2>/dev/null && "
                 "'%s' replay %s --store redis://127.0.0.1:%d '%s' > '%s/red' 2>/dev/null"
                 " && cmp -s '%s/mem' '%s/red'",
                 binary, args[a], trace, dir, binary, args[a], cl.port[2],
                 trace, dir, dir, dir);
        if (system(cmdline) != 0)
            fail_msg("replay %s: the cluster's output differs (%s)", args[a],
                     dir);
    }
    /* on the masters, as the other tests count (a replica applies the
     * drop's deletes a moment later: a loaded run saw one still hold keys) */
    for (int i = 0; i < RCL_NODES; i++)
        if (rcl_is_master(&cl, i) && keys_on(i, "ratelimit:replay:") != 0)
            fail_msg("replay left keys on master %d", i);
    snprintf(cmdline, sizeof cmdline, "rm -rf '%s'", dir);
    assert_int_equal(system(cmdline), 0);
}

/* ----------------------------------------------------------- callers */

#define CALLERS 8
#define NKEYS 64
#define LIMIT 100000

typedef struct run {
    rate_limiter_t *lim;
    char keys[NKEYS][32];
    atomic_uint allowed[NKEYS];
    atomic_uint errors, calls;
    atomic_bool stop;
    _Atomic uint64_t mark_ns; /* answers after it are counted per key */
    atomic_bool answered_after[NKEYS];
} run_t;

typedef struct worker {
    run_t *run;
    unsigned seed;
} worker_t;

static void *work(void *arg)
{
    worker_t *w = arg;
    run_t *r = w->run;
    unsigned s = w->seed;
    while (!atomic_load(&r->stop)) {
        s = s * 1103515245u + 12345u;
        unsigned k = (s >> 8) % NKEYS;
        rate_decision_t d;
        uint64_t t0 = rate_clock_monotonic_ns();
        /* A fixed time: no refill, no reset; a key's count is the sum of
         * its admissions. */
        assert_int_equal(rate_limiter_check_at(r->lim, r->keys[k],
                                               strlen(r->keys[k]), 1, 0, SEC,
                                               &d),
                         RATE_OK);
        atomic_fetch_add(&r->calls, 1);
        if (d.reason == RATE_REASON_STORE_ERROR) {
            atomic_fetch_add(&r->errors, 1);
            usleep(2000); /* a caller backing off: a pace, not a wait */
            continue;
        }
        if (d.allowed)
            atomic_fetch_add(&r->allowed[k], 1);
        uint64_t mark = atomic_load(&r->mark_ns);
        if (mark != 0 && t0 > mark)
            atomic_store(&r->answered_after[k], true);
    }
    return NULL;
}

static void start_callers(run_t *r, pthread_t *th, worker_t *w)
{
    for (int i = 0; i < CALLERS; i++) {
        w[i] = (worker_t){r, 77u + (unsigned)i * 1000u};
        pthread_create(&th[i], NULL, work, &w[i]);
    }
}

/* Until the callers have made n more calls (answers or errors): a count,
 * not a time, so that a loaded machine's callers meet the next step too. */
static void calls_made(run_t *r, unsigned n)
{
    unsigned target = atomic_load(&r->calls) + n;
    if (!WAIT_UNTIL(atomic_load(&r->calls) >= target, TEST_WAIT_S))
        fail_msg("the callers made %u calls of %u in %d s",
                 atomic_load(&r->calls), target, TEST_WAIT_S);
}

static void stop_callers(run_t *r, pthread_t *th)
{
    atomic_store(&r->stop, true);
    for (int i = 0; i < CALLERS; i++)
        pthread_join(th[i], NULL);
}

static void node_id(int i, char id[64])
{
    assert_true(rcl_node_id(&cl, i, id));
}

/* Moves slots [first, last] from node `from` to node `to` as redis-cli
 * --cluster reshard does, 2 ms before each key (callers meet the slot
 * half moved). */
static void move_slots(int from, int to, unsigned first, unsigned last)
{
    char why[256];
    if (rcl_move_slots(&cl, from, to, first, last, 10, 2000, why,
                       sizeof why) != 0)
        fail_msg("moving slots %u-%u from %d to %d: %s", first, last, from, to,
                 why);
}

static void slots_moved_mid_run(void **state)
{
    (void)state;
    const unsigned first = 0, last = 99;
    int from = rcl_master_of(&cl, first), to = rcl_master_of(&cl, 16383);
    assert_true(from >= 0 && to >= 0 && from != to);
    rate_store_t *rs = cstore(NULL, "resh:");
    static run_t r;
    memset(&r, 0, sizeof r);
    r.lim = limiter_of("fixed-window 100000/s", rs);
    /* Keys in the slots that move. */
    for (int n = 0, i = 0; n < NKEYS; i++) {
        char name[48];
        snprintf(r.keys[n], sizeof r.keys[n], "m%d", i);
        int len = snprintf(name, sizeof name, "resh:{%s}", r.keys[n]);
        unsigned s = rc_key_slot(name, (size_t)len);
        if (s >= first && s <= last)
            n++;
    }
    pthread_t th[CALLERS];
    worker_t w[CALLERS];
    start_callers(&r, th, w);
    calls_made(&r, 1000);
    move_slots(from, to, first, last);
    calls_made(&r, 1000);
    /* And back with redis-cli itself: it takes the source's first slots,
     * these. */
    char fid[64], tid[64], seed[32], nslots[16];
    node_id(to, fid);
    node_id(from, tid);
    snprintf(seed, sizeof seed, "127.0.0.1:%d", cl.port[to]);
    snprintf(nslots, sizeof nslots, "%u", last - first + 1);
    char *reshard[] = {"redis-cli", "--cluster", "reshard", seed,
                       "--cluster-from", fid, "--cluster-to", tid,
                       "--cluster-slots", nslots, "--cluster-yes", NULL};
    assert_int_equal(rcl_run(reshard), 0);
    calls_made(&r, 1000);
    stop_callers(&r, th);
    rate_redis_status_t st;
    assert_int_equal(rate_store_redis_status(rs, &st), RATE_OK);
    print_message("%u calls while 100 slots moved there and back: %u "
                  "errors, %llu redirections followed\n",
                  atomic_load(&r.calls), atomic_load(&r.errors),
                  (unsigned long long)st.redirections);
    assert_int_equal(atomic_load(&r.errors), 0);
    assert_true(st.redirections > 0);
    assert_int_equal(rcl_master_of(&cl, first), from);
    assert_int_equal(rcl_master_of(&cl, last), from);
    for (int k = 0; k < NKEYS; k++) {
        unsigned a = atomic_load(&r.allowed[k]);
        rate_decision_t d = at(r.lim, r.keys[k], SEC, 1, 0);
        assert_int_equal(d.reason, RATE_REASON_ALLOWED);
        if (d.remaining != LIMIT - a - 1)
            fail_msg("key %s: %u admitted, then remaining %llu, not %u",
                     r.keys[k], a, (unsigned long long)d.remaining,
                     LIMIT - a - 1);
    }
    rate_limiter_free(r.lim);
    assert_int_equal(rate_store_redis_drop(rs), RATE_OK);
    for (int i = 0; i < RCL_NODES; i++)
        if (rcl_is_master(&cl, i) && keys_on(i, "resh:") != 0)
            fail_msg("keys left on master %d", i);
    rate_store_free(rs);
}

/* ------------------------------------------------------------ failover */

static bool all_answered_after(run_t *r)
{
    for (int k = 0; k < NKEYS; k++)
        if (!atomic_load(&r->answered_after[k]))
            return false;
    return true;
}

static void master_killed_mid_run(void **state)
{
    (void)state;
    rate_store_t *rs = cstore(NULL, "fo:");
    static run_t r;
    memset(&r, 0, sizeof r);
    r.lim = limiter_of("fixed-window 100000/s", rs);
    for (int k = 0; k < NKEYS; k++)
        snprintf(r.keys[k], sizeof r.keys[k], "f%d", k);
    int victim = rcl_master_of(&cl, 1000);
    assert_true(victim >= 0);
    pthread_t th[CALLERS];
    worker_t w[CALLERS];
    start_callers(&r, th, w);
    calls_made(&r, 1000);
    uint64_t t_kill = rate_clock_monotonic_ns();
    rcl_stop_node(&cl, victim);
    /* The replica is promoted by the cluster (node timeout 1 s). */
    int now = -1;
    WAIT_UNTIL((now = rcl_master_of(&cl, 1000)) >= 0 && now != victim,
               TEST_WAIT_S);
    if (now < 0 || now == victim) {
        for (int i = 0; i < RCL_NODES; i++) {
            redisContext *c = cl.pid[i] > 0 ? rcl_connect(cl.port[i]) : NULL;
            redisReply *n = c ? redisCommand(c, "CLUSTER NODES") : NULL;
            if (n != NULL && n->type == REDIS_REPLY_STRING)
                print_message("node %d (port %d):\n%s", i, cl.port[i], n->str);
            freeReplyObject(n);
            if (c)
                redisFree(c);
        }
        fail_msg("no replica was promoted (victim %d, now %d)", victim, now);
    }
    assert_true(rcl_wait_ok(&cl, 3, 10000));
    atomic_store(&r.mark_ns, rate_clock_monotonic_ns());
    /* Every key answered again, with no restart of the store. */
    bool all = WAIT_UNTIL(all_answered_after(&r), TEST_WAIT_S);
    uint64_t t_all = rate_clock_monotonic_ns();
    stop_callers(&r, th);
    rate_redis_status_t st;
    assert_int_equal(rate_store_redis_status(rs, &st), RATE_OK);
    print_message("master killed: %u calls, %u errors; cluster ok again "
                  "%.1f s after the kill, every key answered by %.1f s; "
                  "%llu map refreshes, breaker opened %llu\n",
                  atomic_load(&r.calls), atomic_load(&r.errors),
                  (double)(atomic_load(&r.mark_ns) - t_kill) / 1e9,
                  (double)(t_all - t_kill) / 1e9,
                  (unsigned long long)st.map_refreshes,
                  (unsigned long long)st.breaker_opened);
    if (!all)
        fail_msg("some keys got no answer after the failover");
    assert_true(atomic_load(&r.errors) > 0); /* the outage was seen */
    assert_int_equal(st.masters, 3);
    rate_limiter_free(r.lim);
    assert_int_equal(rate_store_redis_drop(rs), RATE_OK);
    for (int i = 0; i < RCL_NODES; i++)
        if (cl.pid[i] > 0 && rcl_is_master(&cl, i) && keys_on(i, "fo:") != 0)
            fail_msg("keys left on master %d", i);
    rate_store_free(rs);
}

/* ----------------------------------------------------- a master stopped */

/* A key (k<N>, in buf) whose slot is on node i (want) or not (!want). */
static const char *key_of(int i, bool want, char buf[32])
{
    for (int n = 0; n < 100000; n++) {
        snprintf(buf, 32, "k%d", n);
        int m = rcl_master_of(&cl, rc_key_slot(buf, strlen(buf)));
        if ((m == i) == want)
            return buf;
    }
    fail_msg("no key found for node %d", i);
    return NULL;
}

static rate_decision_t decide(rate_limiter_t *lim, const char *key)
{
    rate_decision_t d;
    assert_int_equal(rate_limiter_check(lim, key, strlen(key), 1, 0, &d),
                     RATE_OK);
    return d;
}

/* Waits (10 s at most) until node i answers again after SIGCONT, and the
 * cluster is whole. */
static void resume_node(int i)
{
    kill(cl.pid[i], SIGCONT);
    assert_true(rcl_wait_ok(&cl, 3, 10000));
}

/* Traffic to one master only, then that master stopped: its breaker opens
 * after exactly breaker_failures (3) timed-out calls, and the breaker of
 * no other node opens; a key of another master is then answered.  Before
 * the fix, each failed call's map refresh (with the call's spent
 * deadline) charged a failure to every node it asked, the seeds again: the
 * dead master's breaker opened after 2 calls, and healthy ones with it.
 * The node timeout is 1 s: with 150 ms calls the stop lasts about 0.5 s,
 * well short of a failover. */
static void stopped_master_opens_its_breaker_only(void **state)
{
    (void)state;
    rate_redis_options_t o = {.prefix = "brk:", .no_ttl = true};
    rate_store_t *rs = NULL;
    char err[256] = "", kd[32], kh[32];
    o.command_timeout_ns = 150 * MS;
    o.connect_timeout_ns = 150 * MS;
    o.breaker_failures = 3;
    o.breaker_cooldown_ns = 10 * SEC; /* stays open for the test */
    if (rate_store_redis_new(curl, &o, &rs, err, sizeof err) != RATE_OK)
        fail_msg("cluster store: %s", err);
    rate_limiter_t *lim = limiter_of("fixed-window 100000/s", rs);
    int victim = rcl_master_of(&cl, 1000);
    assert_true(victim >= 0);
    key_of(victim, true, kd);
    key_of(victim, false, kh);
    assert_int_equal(decide(lim, kd).reason != RATE_REASON_STORE_ERROR, 1);
    assert_int_equal(keys_on(victim, "brk:"), 1); /* the key's master */

    kill(cl.pid[victim], SIGSTOP);
    unsigned calls = 0;
    rate_redis_status_t st;
    while (calls < 10) {
        rate_decision_t d = decide(lim, kd);
        calls++;
        assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
        assert_int_equal(rate_store_redis_status(rs, &st), RATE_OK);
        if (st.breaker_opened > 0)
            break;
    }
    /* More calls on it, failed at once by its breaker: each one's map
     * refresh (with a deadline still running) must not cost another node
     * either. */
    for (int i = 0; i < 5; i++)
        decide(lim, kd);
    uint64_t t0 = rate_clock_monotonic_ns();
    rate_decision_t dh = decide(lim, kh); /* another master's key */
    uint64_t took = rate_clock_monotonic_ns() - t0;
    rate_redis_status_t after;
    assert_int_equal(rate_store_redis_status(rs, &after), RATE_OK);
    /* A machine so loaded that the stop outlasted the node timeout: the
     * cluster refuses every slot (CLUSTERDOWN) until the failover is
     * done, which says nothing of the breakers. */
    bool down = false;
    if (dh.reason == RATE_REASON_STORE_ERROR) {
        int h = rcl_master_of(&cl, rc_key_slot(kh, strlen(kh)));
        redisContext *c = h >= 0 ? rcl_connect(cl.port[h]) : NULL;
        redisReply *ci = c ? redisCommand(c, "CLUSTER INFO") : NULL;
        down = ci != NULL && ci->type == REDIS_REPLY_STRING &&
               strstr(ci->str, "cluster_state:fail") != NULL;
        freeReplyObject(ci);
        if (c)
            redisFree(c);
    }
    resume_node(victim);
    print_message("breaker opened after %u calls (breaker_failures 3); "
                  "opened %llu, open %u; the healthy key: %s in %llu ms\n",
                  calls, (unsigned long long)st.breaker_opened,
                  st.breakers_open,
                  dh.reason == RATE_REASON_STORE_ERROR ? "store error"
                                                       : "answered",
                  (unsigned long long)(took / MS));
    assert_int_equal(calls, 3);
    assert_int_equal(st.breaker_opened, 1);
    assert_int_equal(st.breakers_open, 1);
    if (dh.reason == RATE_REASON_STORE_ERROR && !down)
        fail_msg("a healthy master's key failed");
    if (down)
        print_message("(the cluster was failing over: the healthy key's "
                      "answer not checked)\n");
    assert_int_equal(after.breaker_opened, 1); /* no other opened since */
    assert_true(after.breakers_open <= 1);
    rate_limiter_free(lim);
    rate_store_free(rs);
    rs = cstore(NULL, "brk:"); /* the breaker above stays open 10 s */
    assert_int_equal(rate_store_redis_drop(rs), RATE_OK);
    rate_store_free(rs);
}

/* rate_store_redis_drop with one master stopped: an error, but the keys of
 * the healthy masters are gone; the stopped one's stay, and a drop once it
 * is back removes them.  Before the fix the drop stopped at the first
 * master that failed. */
static void drop_goes_on_past_a_stopped_master(void **state)
{
    (void)state;
    rate_redis_options_t o = {.prefix = "dd:", .no_ttl = true};
    rate_store_t *rs = NULL;
    char err[256] = "", k[32];
    o.command_timeout_ns = 150 * MS;
    o.connect_timeout_ns = 150 * MS;
    if (rate_store_redis_new(curl, &o, &rs, err, sizeof err) != RATE_OK)
        fail_msg("cluster store: %s", err);
    rate_limiter_t *lim = limiter_of("fixed-window 100000/s", rs);
    for (int n = 0; n < 60; n++) {
        snprintf(k, sizeof k, "d%d", n);
        assert_true(decide(lim, k).reason != RATE_REASON_STORE_ERROR);
    }
    rate_limiter_free(lim);
    int m[3], nm = 0;
    for (int i = 0; i < RCL_NODES; i++)
        if (cl.pid[i] > 0 && rcl_is_master(&cl, i) && nm < 3)
            m[nm++] = i;
    assert_int_equal(nm, 3);
    for (int j = 0; j < 3; j++)
        assert_true(keys_on(m[j], "dd:") > 0);
    /* The stopped master: slot 0's, the first the drop visits (masters in
     * slot order), so that before the fix nothing at all was deleted. */
    int victim = rcl_master_of(&cl, 0), vj = -1;
    for (int j = 0; j < 3; j++)
        if (m[j] == victim)
            vj = j;
    assert_true(vj >= 0);
    kill(cl.pid[victim], SIGSTOP);
    int rc = rate_store_redis_drop(rs);
    resume_node(victim);
    unsigned left[3];
    for (int j = 0; j < 3; j++)
        left[j] = keys_on(m[j], "dd:");
    print_message("drop with a master stopped: %s; keys left %u %u %u "
                  "(stopped: #%d)\n",
                  rate_strerror(rc), left[0], left[1], left[2], vj + 1);
    assert_true(rc == RATE_ETIMEDOUT || rc == RATE_ESTORE);
    for (int j = 0; j < 3; j++)
        if (m[j] != victim && left[j] != 0)
            fail_msg("%u keys left on healthy master %d", left[j], m[j]);
    assert_true(left[vj] > 0);
    assert_int_equal(rate_store_redis_drop(rs), RATE_OK);
    for (int j = 0; j < 3; j++)
        assert_int_equal(keys_on(m[j], "dd:"), 0);
    rate_store_free(rs);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_redis_cluster RATELIMIT_BINARY\n");
        return 2;
    }
    binary = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(found_from_any_node),
        cmocka_unit_test(keys_over_every_master),
        cmocka_unit_test(replay_byte_for_byte),
        cmocka_unit_test(stopped_master_opens_its_breaker_only),
        cmocka_unit_test(drop_goes_on_past_a_stopped_master),
        cmocka_unit_test(master_killed_mid_run),
        cmocka_unit_test(slots_moved_mid_run),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
