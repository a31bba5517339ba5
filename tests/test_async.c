/* SPDX-License-Identifier: MIT */
/*
 * Asynchronous decisions (rate_limiter_check_start) on event loops: libuv
 * and libevent, through the adapters ratelimit_uv.h and ratelimit_event.h,
 * on the memory store and the asynchronous Redis store against a private
 * redis-server this test starts and stops.
 *
 * - The start call on stores that answer at once: RATE_OK with the same
 *   decision as the synchronous call, no callback; its errors.
 * - Differential traces: the same requests decided by the synchronous
 *   call on a memory store, and through the asynchronous path (memory;
 *   Redis, alternating request by request with a synchronous Redis store
 *   on the same keys), on each loop: every field of every decision equal.
 * - Thousands of decisions in flight on one loop, on one key: exactly the
 *   limit allowed, every callback once.
 * - Redis killed, stopped (SIGSTOP) and restarted under load: every
 *   callback exactly once, none later than its timeout plus SLACK_NS
 *   plus three times the scheduler's worst delay in the run
 *   (tests/lib/sched_probe.h), decisions allowed again after the restart.
 * - NOSCRIPT (SCRIPT FLUSH) answered with EVAL.
 * - Freeing the store with decisions in flight: each callback runs before
 *   rate_store_free returns, with RATE_ECANCELED under the fail mode.
 * - A burst of decisions in one turn goes out by sixteens, before the
 *   turn's end.
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

#include "lib/wait.h"
#include "lib/redis_fixture.h"
#include "lib/rng.h"
#include "lib/sched_probe.h"

/* The timeout of every Redis command here, and how much later than it a
 * callback may come on a loaded 2-core machine (a loop turn, the timer's
 * rounding, the scheduler): generous, since it is counted, not timed. */
#define TIMEOUT_NS (200 * MS)
#define SLACK_NS (1500 * MS)

#include "lib/async_loop.h"
#include "ratelimit_redis.h"

static int start(rate_limiter_t *l, const char *key, uint64_t n, req_t *q)
{
    return start_at(l, key, n, q, 0);
}

/* Decides one permit of `key` until the store answers (not a store
 * error: after a backoff, a breaker's cooldown), tries 10 ms apart, for
 * TEST_WAIT_S at most; the last answer. */
static req_t decide_until_answered(tloop_t *t, rate_limiter_t *l,
                                   const char *key)
{
    req_t q;
    memset(&q, 0, sizeof q);
    WAIT_UNTIL((start(l, key, 1, &q) == RATE_PENDING ? wait_all(t) : (void)0,
                q.d.reason != RATE_REASON_STORE_ERROR),
               TEST_WAIT_S);
    return q;
}

static rate_store_t *async_store(tloop_t *t, const char *prefix,
                                 bool client_time, uint64_t timeout_ns)
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
    o.lazy_connect = true;
    if (rate_store_redis_async_new(url, &o, &t->loop, &s, err, sizeof err) !=
        RATE_OK)
        fail_msg("async redis store: %s", err);
    return s;
}

static void same(const rate_decision_t *a, const rate_decision_t *b, int i)
{
    if (a->allowed != b->allowed || a->reason != b->reason ||
        a->limit != b->limit || a->remaining != b->remaining ||
        a->delay_ns != b->delay_ns || a->retry_after_ns != b->retry_after_ns ||
        a->reset_after_ns != b->reset_after_ns ||
        a->component != b->component)
        fail_msg("request %d: sync allowed=%d reason=%d rem=%llu retry=%llu "
                 "reset=%llu; async allowed=%d reason=%d rem=%llu retry=%llu "
                 "reset=%llu",
                 i, a->allowed, a->reason, (unsigned long long)a->remaining,
                 (unsigned long long)a->retry_after_ns,
                 (unsigned long long)a->reset_after_ns, b->allowed, b->reason,
                 (unsigned long long)b->remaining,
                 (unsigned long long)b->retry_after_ns,
                 (unsigned long long)b->reset_after_ns);
}

/* ------------------------------------------------------------ tests */

static void idle(rate_store_t *as, int line);

/* Memory store: answered at once, as the synchronous call; errors. */
static void start_at_once(void **state)
{
    (void)state;
    fclock.now = 1000 * SEC;
    rate_limiter_t *a = lim("fixed-window 3/s", NULL, true, RATE_FAIL_CLOSED);
    rate_limiter_t *b = lim("fixed-window 3/s", NULL, true, RATE_FAIL_CLOSED);
    rate_limiter_t *c = lim("fixed-window 3/s", NULL, false, RATE_FAIL_CLOSED);
    for (int i = 0; i < 6; i++) {
        req_t q;
        rate_decision_t d;
        assert_int_equal(start(a, "k", 1, &q), RATE_OK);
        assert_int_equal(rate_limiter_check(b, "k", 1, 1, 0, &d), RATE_OK);
        same(&d, &q.d, i);
        assert_int_equal(q.calls, 1); /* no callback: pending unchanged */
        assert_int_equal(pending, 0);
        /* At the caller's time, on a limiter with the real clock. */
        assert_int_equal(start_at(c, "k", 1, &q, fclock.now), RATE_OK);
        same(&d, &q.d, i);
    }
    rate_decision_t d;
    assert_int_equal(rate_limiter_check_start(a, "k", 1, 1, 0, NULL,
                                              on_decided, NULL),
                     RATE_EINVAL);
    assert_int_equal(rate_limiter_check_start(a, "k", 1, 1, 0, &d, NULL,
                                              NULL),
                     RATE_EINVAL);
    assert_int_equal(rate_limiter_check_start(NULL, "k", 1, 1, 0, &d,
                                              on_decided, NULL),
                     RATE_EINVAL);
    assert_int_equal(rate_limiter_check_start(a, "", 0, 1, 0, &d, on_decided,
                                              NULL),
                     RATE_EKEY);
    assert_int_equal(rate_limiter_check_start(a, "k", 1, RATE_TIME_MAX + 1,
                                              0, &d, on_decided, NULL),
                     RATE_ERANGE);
    assert_int_equal(rate_limiter_check_start_at(a, "k", 1, 1, 0,
                                                 RATE_TIME_MAX + 1, &d,
                                                 on_decided, NULL),
                     RATE_ERANGE);
    assert_int_equal(rate_limiter_check_start_at(a, "k", 1, 1, 0, 1, NULL,
                                                 on_decided, NULL),
                     RATE_EINVAL);
    assert_int_equal(pending, 0);
    rate_limiter_free(a);
    rate_limiter_free(b);
    rate_limiter_free(c);
}

static const char *const policies[] = {
    "token-bucket 5/s burst=3", "leaky-bucket 7/3s capacity=4",
    "fixed-window 4/700ms", "sliding-log 5/s", "sliding-window 6/s",
    "token-bucket 10/s burst=5; sliding-log 20/3s; fixed-window 30/m",
};

/* One trace per policy: the reference is the synchronous call on a memory
 * store; the asynchronous Redis path alternates with a synchronous Redis
 * store on the same keys (one state, two clients). */
static void differential(bool uv)
{
    tloop_t t;
    tloop_init(&t, uv);
    rate_store_t *as = async_store(&t, uv ? "tuv:" : "tev:", true, 5 * SEC);
    rate_store_t *ss = NULL;
    {
        rate_redis_options_t o = {0};
        char err[256] = "";
        o.prefix = uv ? "tuv:" : "tev:";
        o.client_time = true;
        o.no_ttl = true; /* as async_store's */
        assert_int_equal(rate_store_redis_new(url, &o, &ss, err, sizeof err),
                         RATE_OK);
    }
    unsigned seed = 7;
    unsigned long async_pending = 0;
    for (size_t p = 0; p < sizeof policies / sizeof *policies; p++) {
        fclock.now = 5000 * SEC + p * 1000 * SEC;
        rate_limiter_t *ref = lim(policies[p], NULL, true, RATE_FAIL_CLOSED);
        rate_limiter_t *la = lim(policies[p], as, true, RATE_FAIL_CLOSED);
        rate_limiter_t *lr = lim(policies[p], as, false, RATE_FAIL_CLOSED);
        rate_limiter_t *ls = lim(policies[p], ss, true, RATE_FAIL_CLOSED);
        rate_limiter_t *lm = lim(policies[p], NULL, true, RATE_FAIL_CLOSED);
        for (int i = 0; i < 300; i++) {
            seed = seed * 1103515245u + 12345u;
            fclock.now += (seed >> 8) % (150 * MS);
            char key[16];
            snprintf(key, sizeof key, "p%zu-k%u", p, (seed >> 4) % 3);
            uint64_t n = 1 + (seed >> 12) % 2;
            rate_decision_t want, got;
            assert_int_equal(rate_limiter_check_at(ref, key, strlen(key), n,
                                                   0, fclock.now, &want),
                             RATE_OK);
            req_t q;
            if (i % 2 == 0) {
                /* Half at the limiter's (fake) clock, half at the caller's
                 * time on a limiter with the real clock. */
                int rc = i % 4 == 0 ? start(la, key, n, &q)
                                    : start_at(lr, key, n, &q, fclock.now);
                assert_true(rc == RATE_OK || rc == RATE_PENDING);
                async_pending += rc == RATE_PENDING;
                wait_all(&t);
                assert_int_equal(q.calls, 1);
                got = q.d;
            } else {
                assert_int_equal(rate_limiter_check_at(ls, key, strlen(key), n,
                                                       0, fclock.now, &got),
                                 RATE_OK);
            }
            same(&want, &got, i);
            /* The asynchronous path on a memory store, too. */
            assert_int_equal(start(lm, key, n, &q), RATE_OK);
            same(&want, &q.d, i);
        }
        rate_limiter_free(ref);
        rate_limiter_free(la);
        rate_limiter_free(lr);
        rate_limiter_free(ls);
        rate_limiter_free(lm);
    }
    assert_true(async_pending > 0); /* the Redis path really was async */
    rate_redis_async_stats_t st;
    assert_int_equal(rate_store_redis_async_stats(as, &st), RATE_OK);
    assert_int_equal(st.in_flight, 0);
    assert_int_equal(st.started, st.completed);
    rate_store_redis_drop(ss);
    rate_store_free(ss);
    rate_store_free(as);
    tloop_fini(&t);
}

static void differential_uv(void **state) { (void)state; differential(true); }
static void differential_event(void **state) { (void)state; differential(false); }

/* Thousands in flight on one key, all started before the loop turns. */
static void many(bool uv)
{
    enum { N = 5000 };
    tloop_t t;
    tloop_init(&t, uv);
    rate_store_t *as = async_store(&t, uv ? "muv:" : "mev:", true, 10 * SEC);
    fclock.now = 100 * SEC;
    rate_limiter_t *l = lim("fixed-window 1000/m", as, true,
                            RATE_FAIL_CLOSED);
    static req_t q[N];
    int now = 0;
    uint64_t t0 = rate_clock_monotonic_ns();
    for (int i = 0; i < N; i++) {
        int rc = start(l, "many", 1, &q[i]);
        assert_true(rc == RATE_OK || rc == RATE_PENDING);
        now += rc == RATE_OK;
    }
    assert_int_equal(pending, N - now);
    if (pending <= N / 2) {
        rate_redis_async_stats_t st;
        rate_store_redis_async_stats(as, &st);
        print_error("pending %d, at once %d: reason %d error %d, refused %llu connects %llu\n", pending, now, q[0].d.reason, q[0].d.error, (unsigned long long)st.refused, (unsigned long long)st.connects);
    }
    assert_true(pending > N / 2);
    wait_all(&t);
    int allowed = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(q[i].calls, 1);
        assert_int_equal(q[i].rc, RATE_OK);
        if (q[i].d.reason == RATE_REASON_STORE_ERROR)
            fail_msg("request %d: store error %d", i, q[i].d.error);
        allowed += q[i].d.allowed;
    }
    assert_int_equal(allowed, 1000);
    uint64_t t_async = rate_clock_monotonic_ns() - t0;
    /* The same decisions one at a time through the synchronous store, for
     * the figure only (not asserted: a shared machine). */
    rate_store_t *ss = NULL;
    rate_redis_options_t o = {0};
    char err[256] = "";
    o.prefix = uv ? "muvs:" : "mevs:";
    o.client_time = true;
    assert_int_equal(rate_store_redis_new(url, &o, &ss, err, sizeof err),
                     RATE_OK);
    rate_limiter_t *ls = lim("fixed-window 1000/m", ss, true,
                             RATE_FAIL_CLOSED);
    t0 = rate_clock_monotonic_ns();
    for (int i = 0; i < N; i++) {
        rate_decision_t d;
        assert_int_equal(rate_limiter_check(ls, "many", 4, 1, 0, &d), RATE_OK);
    }
    uint64_t t_sync = rate_clock_monotonic_ns() - t0;
    print_message("%d decisions on one %s loop: %.1f ms in flight at once, "
                  "%.1f ms one by one synchronously (%.2fx)\n",
                  N, uv ? "libuv" : "libevent", (double)t_async / 1e6,
                  (double)t_sync / 1e6,
                  (double)t_sync / (double)t_async);
    rate_limiter_free(ls);
    rate_store_redis_drop(ss);
    rate_store_free(ss);
    rate_limiter_free(l);
    rate_store_redis_drop(as); /* the synchronous side: outside the loop */
    rate_store_free(as);
    tloop_fini(&t);
}

static void many_uv(void **state) { (void)state; many(true); }
static void many_event(void **state) { (void)state; many(false); }

/* Keeps `in_flight` decisions going for `ns` of wall time; returns the
 * number of decisions that were allowed (not store errors). */
enum { POOL = 256 };
static req_t pool[POOL];
static int late, answered, store_errors, ok_answers;
static uint64_t worst_ns; /* the longest a decision took */

static void account(req_t *q)
{
    assert_int_equal(q->calls, 1);
    answered++;
    if (q->d.reason == RATE_REASON_STORE_ERROR)
        store_errors++;
    else
        ok_answers++;
    if (q->ended > q->started + TIMEOUT_NS + SLACK_NS)
        late++;
    if (q->ended - q->started > worst_ns)
        worst_ns = q->ended - q->started;
}

static void load_for(tloop_t *t, rate_limiter_t *l, uint64_t ns)
{
    uint64_t end = rate_clock_monotonic_ns() + ns;
    static bool busy[POOL];
    for (;;) {
        bool again = rate_clock_monotonic_ns() < end;
        for (int i = 0; i < POOL; i++) {
            if (busy[i] && pool[i].calls == 0)
                continue;
            if (busy[i]) {
                account(&pool[i]);
                busy[i] = false;
            }
            if (!again)
                continue;
            char key[16];
            snprintf(key, sizeof key, "f%d", i % 16);
            int rc = start(l, key, 1, &pool[i]);
            assert_true(rc == RATE_OK || rc == RATE_PENDING);
            busy[i] = true;
            if (rc == RATE_OK) {
                account(&pool[i]);
                busy[i] = false;
            }
        }
        if (!again && pending == 0)
            break;
        if (getenv("DBG") && !again) {
            static int n;
            if (n++ % 1000 == 0)
                print_message("pending %d\n", pending);
        }
        if (pending > 0)
            tloop_turn(t);
        else
            usleep(1000); /* everything refused at once: backing off */
    }
}

/* Nothing in flight in the store once every callback has run. */
static void idle(rate_store_t *as, int line)
{
    rate_redis_async_stats_t st;
    assert_int_equal(rate_store_redis_async_stats(as, &st), RATE_OK);
    if (st.started != st.completed || st.in_flight != 0)
        fail_msg("line %d: started %llu completed %llu in flight %llu", line,
                 (unsigned long long)st.started,
                 (unsigned long long)st.completed,
                 (unsigned long long)st.in_flight);
}

static void faults(bool uv)
{
    tloop_t t;
    tloop_init(&t, uv);
    signal(SIGPIPE, SIG_IGN);
    rate_store_t *as = async_store(&t, uv ? "fuv:" : "fev:", false, TIMEOUT_NS);
    rate_limiter_t *l = lim("token-bucket 100000/s burst=100000", as, false,
                            RATE_FAIL_OPEN);
    late = answered = store_errors = ok_answers = 0;
    worst_ns = 0;
    /* The scheduler's worst delay meanwhile: a decision's bound is its
     * timeout plus SLACK_NS plus three times that (tests/lib/sched_probe.h). */
    static sched_probe_t probe; /* a failed check leaves its thread on */
    sched_probe_start(&probe);

    /* Up: answered (a loaded machine may time out a few: not asserted). */
    load_for(&t, l, 300 * MS);
    idle(as, __LINE__);
    assert_true(ok_answers > 0);

    /* Killed with decisions in flight: the first callback already knows
     * why (the connection lost), before any reconnect is refused. */
    /* (connected and answering first: a loaded machine may have timed
     * out a few of the load, leaving the store backing off) */
    req_t one = decide_until_answered(&t, l, "w");
    assert_int_not_equal(one.d.reason, RATE_REASON_STORE_ERROR);
    why_of = as;
    first_why[0] = '\0';
    static req_t inflight[8];
    for (int i = 0; i < 8; i++)
        assert_int_equal(start(l, "w", 1, &inflight[i]), RATE_PENDING);
    stop_server();
    wait_all(&t);
    why_of = NULL;
    if (strstr(first_why, "connection lost") == NULL)
        fail_msg("the first store error said \"%s\"", first_why);
    print_message("the first store error after the kill: %s\n", first_why);
    /* Killed: every decision answered (store errors), none late. */
    load_for(&t, l, 400 * MS);
    idle(as, __LINE__);
    assert_true(store_errors > 0);
    /* Restarted on the same port: answered again (after the backoff and
     * the breaker's cooldown). */
    start_server(NULL, NULL);
    int ok_before = ok_answers;
    for (int round = 0; round < 50 && ok_answers == ok_before; round++) {
        load_for(&t, l, 100 * MS);
        idle(as, __LINE__);
    }
    assert_true(ok_answers > ok_before);

    /* Stopped: decisions in flight time out, none later than the slack. */
    int err_before = store_errors;
    kill(server, SIGSTOP);
    load_for(&t, l, 3 * TIMEOUT_NS);
    idle(as, __LINE__);
    kill(server, SIGCONT);
    assert_true(store_errors > err_before);
    rate_redis_async_stats_t st;
    assert_int_equal(rate_store_redis_async_stats(as, &st), RATE_OK);
    assert_true(st.timed_out > 0);
    assert_true(st.refused > 0); /* the backoff and the breaker */
    ok_before = ok_answers;
    for (int round = 0; round < 50 && ok_answers == ok_before; round++) {
        load_for(&t, l, 100 * MS);
        idle(as, __LINE__);
    }
    assert_true(ok_answers > ok_before);

    /* NOSCRIPT: the scripts flushed, decisions go on through EVAL (the
     * general script's, a composite's: a single bucket is a lean script's
     * FCALL, which SCRIPT FLUSH leaves alone), and the lean scripts' FCALL
     * through the library loaded again after FUNCTION FLUSH. */
    rate_limiter_t *lg = lim("token-bucket 100000/s burst=100000; "
                             "sliding-window 1000000/s",
                             as, false, RATE_FAIL_OPEN);
    redisContext *c = raw();
    assert_non_null(c);
    freeReplyObject(redisCommand(c, "SCRIPT FLUSH"));
    freeReplyObject(redisCommand(c, "FUNCTION FLUSH"));
    redisFree(c);
    for (int k = 0; k < 2; k++) {
        ok_before = ok_answers;
        for (int round = 0; round < 50 && ok_answers == ok_before; round++) {
            load_for(&t, k == 0 ? lg : l, 100 * MS);
            idle(as, __LINE__);
        }
        assert_true(ok_answers > ok_before);
    }
    rate_limiter_free(lg);
    assert_int_equal(rate_store_redis_async_stats(as, &st), RATE_OK);
    assert_true(st.noscript > 0);

    uint64_t sched = sched_probe_stop(&probe);
    if (worst_ns > TIMEOUT_NS + SLACK_NS + 3 * sched)
        fail_msg("%d decisions came back late, one after %llu ms, past the "
                 "%llu ms timeout + %llu ms + 3 x the scheduler's %llu ms",
                 late, (unsigned long long)(worst_ns / MS),
                 (unsigned long long)(TIMEOUT_NS / MS),
                 (unsigned long long)(SLACK_NS / MS),
                 (unsigned long long)(sched / MS));
    assert_int_equal(pending, 0);
    assert_int_equal(st.started, st.completed);
    print_message("async faults (%s): %d answered, %d store errors, "
                  "%llu timed out, %llu refused at once, %llu connects, "
                  "%d late\n",
                  uv ? "libuv" : "libevent", answered, store_errors,
                  (unsigned long long)st.timed_out,
                  (unsigned long long)st.refused,
                  (unsigned long long)st.connects, late);
    rate_limiter_free(l);
    rate_store_redis_drop(as);
    rate_store_free(as);
    tloop_fini(&t);
}

/* Commands Redis has processed since it started (INFO's count, which
 * counts each INFO too). */
static long long commands_processed(redisContext *c)
{
    redisReply *r = redisCommand(c, "INFO stats");
    const char *p = r && r->type == REDIS_REPLY_STRING
                        ? strstr(r->str, "total_commands_processed:")
                        : NULL;
    long long n = p ? atoll(p + strlen("total_commands_processed:")) : -1;
    freeReplyObject(r);
    return n;
}

/* A loop that runs late -- a loaded machine did not schedule the process
 * for longer than the command timeout -- while Redis had answered in
 * time: the replies are in the socket, unread.  They are the decisions'
 * answers, not timeouts, whichever the loop runs first on its next turn,
 * its timers (libuv) or its sockets (libevent).  (Under load, a master
 * stopped in a cluster kept the timer due, and the healthy masters'
 * answers were thrown away with their connections: async_cluster's
 * faults_uv, "decisions on healthy masters failed".) */
static void late_loop(bool uv)
{
    enum { N = 200 };
    tloop_t t;
    tloop_init(&t, uv);
    rate_store_t *as = async_store(&t, uv ? "luv:" : "lev:", true, TIMEOUT_NS);
    fclock.now = 100 * SEC;
    rate_limiter_t *l = lim("fixed-window 1000/m", as, true,
                            RATE_FAIL_CLOSED);
    req_t q0 = decide_until_answered(&t, l, "late"); /* connected */
    assert_int_not_equal(q0.d.reason, RATE_REASON_STORE_ERROR);
    redisContext *c = raw();
    assert_non_null(c);
    long long before = commands_processed(c), polls = 1;
    static req_t q[N];
    for (int i = 0; i < N; i++)
        assert_int_equal(start(l, "late", 1, &q[i]), RATE_PENDING);
    uint64_t started = rate_clock_monotonic_ns();
    /* One turn that does not wait: hiredis writes the commands out when
     * the loop finds the socket writable; no deadline has passed yet. */
    tloop_nowait(&t);
    /* Redis has processed them all (its replies are in our socket)... */
    bool seen = WAIT_UNTIL(
        (polls++, commands_processed(c) >= before + polls + N), TEST_WAIT_S);
    redisFree(c);
    /* ...and the loop stays away past every deadline: the late turn. */
    while (rate_clock_monotonic_ns() < started + 2 * TIMEOUT_NS)
        usleep(10000);
    /* Turns that do not wait: the answers may all come within the timer's
     * callback, after which a waiting turn would wait for nothing. */
    assert_true(WAIT_UNTIL((tloop_nowait(&t), pending == 0), TEST_WAIT_S));
    int errors = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(q[i].calls, 1);
        errors += q[i].d.reason == RATE_REASON_STORE_ERROR;
    }
    if (!seen)
        skip(); /* Redis itself never got to them: nothing to judge */
    if (errors > 0)
        fail_msg("%s: %d of %d decisions answered in time by Redis failed "
                 "when the loop ran late", uv ? "libuv" : "libevent", errors,
                 N);
    rate_limiter_free(l);
    rate_store_free(as);
    tloop_fini(&t);
}

static void late_loop_uv(void **state) { (void)state; late_loop(true); }
static void late_loop_event(void **state) { (void)state; late_loop(false); }

/* A loop that runs late before it has even written the commands out:
 * Redis never saw them, so they time out, but the connection answered
 * before and is alive.  Only those decisions fail: the connection is not
 * dropped (no new connect) and the next decision is answered at once,
 * not refused by a backoff.  (Before: the whole connection went, as if
 * Redis hung -- async_cluster's faults_event, "1051 decisions on healthy
 * masters failed", in a fresh root under load.) */
static void late_writes(bool uv)
{
    enum { N = 50 };
    tloop_t t;
    tloop_init(&t, uv);
    rate_store_t *as = async_store(&t, uv ? "lwu:" : "lwe:", true, TIMEOUT_NS);
    fclock.now = 100 * SEC;
    rate_limiter_t *l = lim("fixed-window 1000/m", as, true,
                            RATE_FAIL_CLOSED);
    req_t q0 = decide_until_answered(&t, l, "late"); /* connected */
    assert_int_not_equal(q0.d.reason, RATE_REASON_STORE_ERROR);
    rate_redis_async_stats_t st0, st1;
    assert_int_equal(rate_store_redis_async_stats(as, &st0), RATE_OK);
    static req_t q[N];
    for (int i = 0; i < N; i++)
        assert_int_equal(start(l, "late", 1, &q[i]), RATE_PENDING);
    /* No turn of the loop: only the first 48 are written (by sixteens:
     * bursts_go_out), and every deadline passes. */
    uint64_t started = rate_clock_monotonic_ns();
    while (rate_clock_monotonic_ns() < started + 2 * TIMEOUT_NS)
        usleep(10000);
    assert_true(WAIT_UNTIL((tloop_nowait(&t), pending == 0), TEST_WAIT_S));
    for (int i = 0; i < N; i++)
        assert_int_equal(q[i].calls, 1);
    req_t next;
    memset(&next, 0, sizeof next);
    if (start(l, "late", 1, &next) == RATE_PENDING)
        wait_all(&t);
    assert_int_equal(rate_store_redis_async_stats(as, &st1), RATE_OK);
    if (next.d.reason == RATE_REASON_STORE_ERROR || st1.connects != st0.connects)
        fail_msg("%s: a live connection went when the loop ran late "
                 "(connects %llu -> %llu, refused %llu -> %llu)",
                 uv ? "libuv" : "libevent", (unsigned long long)st0.connects,
                 (unsigned long long)st1.connects,
                 (unsigned long long)st0.refused,
                 (unsigned long long)st1.refused);
    rate_limiter_free(l);
    rate_store_free(as);
    tloop_fini(&t);
}

static void late_writes_uv(void **state) { (void)state; late_writes(true); }
static void late_writes_event(void **state) { (void)state; late_writes(false); }

/* Keys under `pattern` in Redis. */
static size_t keys_like(const char *pattern)
{
    redisContext *c = raw();
    size_t n = 0;
    if (c != NULL && !c->err) {
        redisReply *r = redisCommand(c, "KEYS %s", pattern);
        if (r != NULL && r->type == REDIS_REPLY_ARRAY)
            n = r->elements;
        freeReplyObject(r);
    }
    if (c != NULL)
        redisFree(c);
    return n;
}

/* Many decisions started in one turn (a batch's replies read at once, or
 * a caller's burst) go out by sixteens as they are made, not all at the
 * turn's end: Redis works on the first while the others are made.  Shown
 * with no turn of the loop at all: the bursts' first 32 are written (and
 * Redis decides them) all the same, the last few when the loop runs. */
static void bursts_go_out(bool uv)
{
    enum { N = 40 };
    tloop_t t;
    tloop_init(&t, uv);
    const char *prefix = uv ? "burstu:" : "burste:";
    rate_store_t *as = async_store(&t, prefix, true, 30 * SEC);
    fclock.now = 100 * SEC;
    rate_limiter_t *l = lim("fixed-window 1000/m", as, true,
                            RATE_FAIL_CLOSED);
    req_t q0 = decide_until_answered(&t, l, "warm"); /* connected */
    assert_int_not_equal(q0.d.reason, RATE_REASON_STORE_ERROR);
    char pattern[32], key[32];
    snprintf(pattern, sizeof pattern, "%s*", prefix);
    size_t k0 = keys_like(pattern); /* the warm key, the policy's record */
    assert_true(k0 >= 1);
    static req_t q[N];
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "b%d", i);
        assert_int_equal(start(l, key, 1, &q[i]), RATE_PENDING);
    }
    if (!WAIT_UNTIL(keys_like(pattern) >= k0 + 32, TEST_WAIT_S))
        fail_msg("%s: %zu of %d decisions reached Redis with no turn of "
                 "the loop (32 expected)", uv ? "libuv" : "libevent",
                 keys_like(pattern) - k0, N);
    wait_all(&t);
    for (int i = 0; i < N; i++) {
        assert_int_equal(q[i].calls, 1);
        assert_true(q[i].d.allowed);
    }
    assert_int_equal(keys_like(pattern), k0 + N);
    rate_limiter_free(l);
    rate_store_free(as);
    tloop_fini(&t);
}

static void bursts_go_out_uv(void **state) { (void)state; bursts_go_out(true); }
static void bursts_go_out_event(void **state)
{
    (void)state;
    bursts_go_out(false);
}

static void faults_uv(void **state) { (void)state; faults(true); }
static void faults_event(void **state) { (void)state; faults(false); }

/* Freed with decisions in flight: every callback before free returns. */
static void free_in_flight(bool uv, bool on_wire)
{
    enum { N = 1000 };
    tloop_t t;
    tloop_init(&t, uv);
    rate_store_t *as = async_store(&t, "free:", true, 5 * SEC);
    fclock.now = 100 * SEC;
    rate_limiter_t *l = lim("fixed-window 10/h", as, true, RATE_FAIL_OPEN);
    static req_t q[N];
    int at_once = 0;
    if (on_wire) {
        /* Connected first, then Redis stopped: the commands go out on the
         * wire and stay unanswered. */
        req_t w;
        if (start(l, "warm", 1, &w) == RATE_PENDING)
            wait_all(&t);
        assert_int_equal(w.d.reason == RATE_REASON_STORE_ERROR, false);
        kill(server, SIGSTOP);
    }
    for (int i = 0; i < N; i++) {
        int rc = start(l, "gone", 1, &q[i]);
        assert_true(rc == RATE_OK || rc == RATE_PENDING);
        at_once += rc == RATE_OK;
    }
    assert_int_equal(at_once, 0);
    assert_int_equal(pending, N);
    if (on_wire) {
        for (int i = 0; i < 5; i++) /* a few turns: the writes go out */
            tloop_nowait(&t);
    }
    rate_store_free(as); /* none was answered */
    if (on_wire)
        kill(server, SIGCONT);
    assert_int_equal(pending, 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(q[i].calls, 1);
        assert_int_equal(q[i].d.reason, RATE_REASON_STORE_ERROR);
        assert_int_equal(q[i].d.error, RATE_ECANCELED);
        assert_true(q[i].d.allowed); /* the fail mode: open */
    }
    rate_limiter_free(l);
    tloop_fini(&t);
    if (on_wire) /* sent: Redis may still run them; nothing to look at */
        return;
    /* Nothing was sent, so nothing written: a synchronous look finds no
     * key. */
    redisContext *c = raw();
    redisReply *r = redisCommand(c, "EXISTS free:{gone}");
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
    redisFree(c);
}

static void free_uv(void **state) { (void)state; free_in_flight(true, false); }
static void free_event(void **state) { (void)state; free_in_flight(false, false); }
static void free_wire_uv(void **state) { (void)state; free_in_flight(true, true); }
static void free_wire_event(void **state)
{
    (void)state;
    free_in_flight(false, true);
}

/* Redis stopped before the first decision: neither the store's creation
 * (lazy_connect), rate_limiter_new nor the first decisions wait for it (the policy's record is written through
 * the loop too, once for the burst); they fail under the fail mode at
 * their deadline; once Redis is back, the record and the decisions go
 * through. */
static void stopped_first(void **state)
{
    (void)state;
    enum { N = 4 };
    tloop_t t;
    tloop_init(&t, true);
    kill(server, SIGSTOP);
    uint64_t t0 = rate_clock_monotonic_ns();
    rate_store_t *as = async_store(&t, "first:", true, 5 * SEC); /* lazy */
    rate_limiter_t *l = lim("token-bucket 9/s burst=9", as, false,
                            RATE_FAIL_OPEN);
    req_t q[N];
    for (int i = 0; i < N; i++)
        assert_int_equal(start(l, "k", 1, &q[i]), RATE_PENDING);
    /* Waiting for Redis would take the connect or command timeout, 5 s,
     * at least once: the calls took less than half of it. */
    assert_true(rate_clock_monotonic_ns() - t0 < 5 * SEC / 2);
    wait_all(&t);
    for (int i = 0; i < N; i++) {
        assert_int_equal(q[i].calls, 1);
        assert_int_equal(q[i].d.reason, RATE_REASON_STORE_ERROR);
        assert_int_equal(q[i].d.error, RATE_ETIMEDOUT);
        assert_true(q[i].d.allowed); /* open */
    }
    char why[512] = "";
    assert_int_equal(rate_store_redis_last_error(as, why, sizeof why),
                     RATE_OK);
    assert_non_null(strstr(why, "no reply within the command timeout"));
    kill(server, SIGCONT);
    req_t back = decide_until_answered(&t, l, "k");
    assert_int_not_equal(back.d.reason, RATE_REASON_STORE_ERROR);
    redisContext *c = raw();
    redisReply *r = redisCommand(c, "KEYS first:p{*");
    assert_int_equal(r->elements, 1); /* the policy's one record */
    freeReplyObject(r);
    redisFree(c);
    assert_int_equal(rate_store_redis_last_error(as, why, sizeof why),
                     RATE_OK);
    assert_string_equal(why, ""); /* connected since */
    rate_store_free(as);
    rate_limiter_free(l);
    /* Nothing listening: the store says so, with the address. */
    char nowhere[64];
    int free_port = redis_test_free_port();
    snprintf(nowhere, sizeof nowhere, "redis://127.0.0.1:%d", free_port);
    rate_redis_options_t o = {0};
    o.lazy_connect = true;
    char err[256];
    assert_int_equal(rate_store_redis_async_new(nowhere, &o, &t.loop, &as,
                                                err, sizeof err),
                     RATE_OK);
    l = lim("token-bucket 9/s burst=9", as, false, RATE_FAIL_CLOSED);
    req_t q0;
    if (start(l, "k", 1, &q0) == RATE_PENDING)
        wait_all(&t);
    assert_int_equal(q0.d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(rate_store_redis_last_error(as, why, sizeof why),
                     RATE_OK);
    char where[64];
    snprintf(where, sizeof where, "127.0.0.1:%d: cannot connect", free_port);
    if (strstr(why, where) == NULL)
        fail_msg("last error '%s'", why);
    rate_store_free(as);
    rate_limiter_free(l);
    tloop_fini(&t);
}

/* An error reply is a store error that says why: a user whose ACL does
 * not cover the store's keys (NOPERM), as a managed Redis may give, is
 * named by rate_store_redis_last_error with the server's words; once the
 * user may, decisions go through and the reason is gone. */
static void error_replies_say_why(void **state)
{
    (void)state;
    tloop_t t;
    tloop_init(&t, true);
    redisContext *c = raw();
    freeReplyObject(redisCommand(c, "ACL SETUSER keyless on >pw ~other:* "
                                    "+@all"));
    char u[96], err[256] = "", why[512] = "";
    snprintf(u, sizeof u, "redis://keyless:pw@127.0.0.1:%d", port);
    rate_redis_options_t o = {0};
    o.prefix = "acl:";
    o.lazy_connect = true;
    o.command_timeout_ns = TIMEOUT_NS;
    rate_store_t *as = NULL;
    if (rate_store_redis_async_new(u, &o, &t.loop, &as, err, sizeof err) !=
        RATE_OK)
        fail_msg("async redis store: %s", err);
    rate_limiter_t *l = lim("token-bucket 9/s burst=9", as, false,
                            RATE_FAIL_CLOSED);
    req_t q;
    if (start(l, "k", 1, &q) == RATE_PENDING)
        wait_all(&t);
    assert_int_equal(q.d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(rate_store_redis_last_error(as, why, sizeof why),
                     RATE_OK);
    char where[64];
    snprintf(where, sizeof where, "127.0.0.1:%d: ", port);
    if (strstr(why, where) == NULL || strstr(why, "NOPERM") == NULL)
        fail_msg("last error '%s'", why);
    freeReplyObject(redisCommand(c, "ACL SETUSER keyless ~*"));
    req_t back = decide_until_answered(&t, l, "k");
    assert_true(back.d.allowed);
    assert_int_equal(rate_store_redis_last_error(as, why, sizeof why),
                     RATE_OK);
    assert_string_equal(why, "");
    /* A key of another type: the script's answer, not an error reply,
     * named with the key as the blocking store names it. */
    freeReplyObject(redisCommand(c, "SET acl:{w} x"));
    req_t wrong;
    if (start(l, "w", 1, &wrong) == RATE_PENDING)
        wait_all(&t);
    assert_false(wrong.d.allowed);
    assert_int_equal(rate_store_redis_last_error(as, why, sizeof why),
                     RATE_OK);
    if (strstr(why, "WRONGTYPE: 'acl:{w}' is not a hash") == NULL)
        fail_msg("last error '%s'", why);
    freeReplyObject(redisCommand(c, "DEL acl:{w}"));
    freeReplyObject(redisCommand(c, "ACL DELUSER keyless"));
    redisFree(c);
    rate_limiter_free(l);
    rate_store_free(as);
    tloop_fini(&t);
}

/* A refund and a penalty through the asynchronous Redis store: their
 * result in the callback, their effect on the next decisions; freed with
 * one in flight, it hears RATE_ECANCELED before rate_store_free returns. */
static int adj_rc, adj_calls;
static void on_adjusted(void *ud, int rc)
{
    (void)ud;
    adj_rc = rc;
    adj_calls++;
    pending--;
}

static void adjust_redis(void **state)
{
    (void)state;
    tloop_t t;
    tloop_init(&t, false);
    rate_store_t *as = async_store(&t, "adj:", true, 5 * SEC);
    fclock.now = 300 * SEC;
    rate_limiter_t *l = lim("fixed-window 3/h", as, true, RATE_FAIL_CLOSED);
    req_t q;
    for (int i = 0; i < 4; i++) {
        if (start(l, "k", 1, &q) == RATE_PENDING)
            wait_all(&t);
        assert_int_equal(q.d.allowed, i < 3);
    }
    assert_int_equal(rate_limiter_refund_start(l, "k", 1, 2, on_adjusted,
                                               NULL),
                     RATE_PENDING);
    pending++;
    wait_all(&t);
    assert_int_equal(adj_calls, 1);
    assert_int_equal(adj_rc, RATE_OK);
    for (int i = 0; i < 3; i++) {
        if (start(l, "k", 1, &q) == RATE_PENDING)
            wait_all(&t);
        assert_int_equal(q.d.allowed, i < 2); /* the two refunded */
    }
    assert_int_equal(rate_limiter_penalize_start(l, "p", 1, 3, on_adjusted,
                                                 NULL),
                     RATE_PENDING);
    pending++;
    wait_all(&t);
    assert_int_equal(adj_calls, 2);
    assert_int_equal(adj_rc, RATE_OK);
    if (start(l, "p", 1, &q) == RATE_PENDING)
        wait_all(&t);
    assert_false(q.d.allowed);
    /* A lazy store, made before any connection, names its scripts right
     * (their SHA-1, computed): a NOSCRIPT at most once per connection (a
     * Redis that never had them), never one per decision. */
    rate_redis_async_stats_t st;
    assert_int_equal(rate_store_redis_async_stats(as, &st), RATE_OK);
    assert_true(st.completed >= 9);
    assert_true(st.noscript <= st.connects);
    /* In flight when the store goes. */
    kill(server, SIGSTOP);
    assert_int_equal(rate_limiter_refund_start(l, "k", 1, 1, on_adjusted,
                                               NULL),
                     RATE_PENDING);
    pending++;
    for (int i = 0; i < 5; i++) /* the command goes out */
        tloop_nowait(&t);
    rate_store_free(as);
    kill(server, SIGCONT);
    assert_int_equal(adj_calls, 3);
    assert_int_equal(adj_rc, RATE_ECANCELED);
    assert_int_equal(pending, 0);
    rate_limiter_free(l);
    tloop_fini(&t);
}

/* The C step's jobs on one key take turns: hundreds started at once on a
 * hot key, for a policy the scripts decline (the window too long for
 * their exact range) and then as refunds (a load and a compare-and-set
 * each), all land, none loses its compare-and-set to another of this
 * store's (before the turns: RATE_ECONFLICT for most, after 16 retries
 * each); exactly the quota is admitted, exactly the refunds given back;
 * the store's table of turns is empty at the end (ASan: nothing leaks). */
static int refunds_ok, refunds_other;
static void on_refunded(void *ud, int rc)
{
    (void)ud;
    if (rc == RATE_OK)
        refunds_ok++;
    else
        refunds_other++;
    pending--;
}

static void hot_key_steps_take_turns(void **state)
{
    (void)state;
    enum { N = 400, QUOTA = 100, REFUNDS = 60 };
    tloop_t t;
    tloop_init(&t, false);
    rate_store_t *as = async_store(&t, "turn:", true, 30 * SEC);
    fclock.now = 400 * SEC;
    rate_limiter_t *l = lim("fixed-window 100/3650d", as, true,
                            RATE_FAIL_CLOSED);
    static req_t q[N];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++)
            assert_int_equal(start(l, "hot", 1, &q[i]), RATE_PENDING);
        wait_all(&t);
        int allowed = 0;
        for (int i = 0; i < N; i++) {
            assert_int_equal(q[i].calls, 1);
            if (q[i].d.reason == RATE_REASON_STORE_ERROR)
                fail_msg("round %d, decision %d: store error %s", round, i,
                         rate_err_name(q[i].d.error));
            allowed += q[i].d.allowed;
        }
        /* the quota, then the refunds' worth */
        assert_int_equal(allowed, round == 0 ? QUOTA : REFUNDS);
        if (round == 1)
            break;
        refunds_ok = refunds_other = 0;
        for (int i = 0; i < REFUNDS; i++) {
            assert_int_equal(rate_limiter_refund_start(l, "hot", 3, 1,
                                                       on_refunded, NULL),
                             RATE_PENDING);
            pending++;
        }
        wait_all(&t);
        assert_int_equal(refunds_other, 0);
        assert_int_equal(refunds_ok, REFUNDS);
    }
    rate_redis_async_stats_t st;
    assert_int_equal(rate_store_redis_async_stats(as, &st), RATE_OK);
    assert_int_equal(st.in_flight, 0);
    /* Freed while some wait their turn: every callback once, before
     * rate_store_free returns (decided, or RATE_ECANCELED). */
    for (int i = 0; i < N; i++)
        assert_int_equal(start(l, "hot2", 1, &q[i]), RATE_PENDING);
    for (int turn = 0; turn < 5000 && pending > N - 50; turn++)
        tloop_turn(&t); /* first tries lost: the rest wait their turn */
    rate_store_redis_drop(as);
    rate_store_free(as);
    assert_int_equal(pending, 0);
    int cancelled = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(q[i].calls, 1);
        cancelled += q[i].d.error == RATE_ECANCELED;
    }
    print_message("freed with %d of %d cancelled\n", cancelled, N);
    rate_limiter_free(l);
    tloop_fini(&t);
}

/* Refunds and penalties through the asynchronous Redis store are the lean
 * scripts' (one EVALSHA each, counted in lean_adjustments), and write the
 * C step's bytes: random traces of decisions, refunds and penalties at
 * the fake clock's times, through the loop, against the same calls on the
 * compare-and-set test store (the C step), decision by decision and byte
 * by byte after every call.  Permits stay below what any script declines,
 * so that every change must be the script's. */
static const char *const adj_policies[] = {
    "token-bucket 5/s burst=3",
    "token-bucket 7/3s burst=5",
    "token-bucket 1000000000/1d burst=1000000000",
    "leaky-bucket 7/3s capacity=4",
    "leaky-bucket 1000000000/1d capacity=1000000000",
    "fixed-window 4/700ms",
    "fixed-window 1000/1h",
    "sliding-window 4/700ms",
    "sliding-window 1000/1h",
    "sliding-log 4/700ms",
    "sliding-log 100/1h",
};

static void adjust_scripted(void **state)
{
    (void)state;
    tloop_t t;
    tloop_init(&t, true);
    /* No expiry: Redis's clock would end keys written at the fake one's
     * times with a short reset before they are read back. */
    rate_redis_options_t o = {0};
    rate_store_t *as = NULL;
    char err[256] = "";
    o.prefix = "aadj:";
    o.client_time = true;
    o.no_ttl = true;
    o.command_timeout_ns = 5 * SEC;
    if (rate_store_redis_async_new(url, &o, &t.loop, &as, err, sizeof err) !=
        RATE_OK)
        fail_msg("async redis store: %s", err);
    redisContext *c = raw();
    uint64_t adjusts = 0;
    rnd_seed(99);
    for (size_t p = 0; p < sizeof adj_policies / sizeof adj_policies[0];
         p++) {
        rate_store_t *cs;
        cas_store_t *h;
        assert_int_equal(cas_store_new(&cs, &h), RATE_OK);
        rate_limiter_t *la = lim(adj_policies[p], as, true, RATE_FAIL_CLOSED);
        rate_limiter_t *lc = lim(adj_policies[p], cs, true, RATE_FAIL_CLOSED);
        rate_policy_t *pol = policy_of(adj_policies[p]);
        const rate_limit_t *l = rate_policy_limit(pol, 0);
        uint64_t cap = l->burst == 0 ? l->limit : l->burst; /* window */
        char key[16], name[32];
        snprintf(key, sizeof key, "k%zu", p);
        snprintf(name, sizeof name, "aadj:{%s}", key);
        fclock.now = UINT64_C(1764590000) * SEC + rnd(SEC);
        for (int i = 0; i < 60; i++) {
            if (rnd(10) == 0)
                fclock.now -= rnd(SEC); /* back: t_eff is t_last */
            else
                fclock.now += rnd(l->period_ns / (1 + rnd(8)) + 1);
            int op = (int)rnd(3);
            uint64_t n = rnd(3) == 0 ? rnd(3 * cap + 2) : rnd(3);
            /* (a token bucket's debt stops at 2^62 scaled tokens, 53k
             * tokens for the wide one: a penalty reaching it declines) */
            if (op == 2 && l->algorithm == RATE_TOKEN_BUCKET)
                n = rnd(4);
            if (op == 0) {
                req_t q;
                rate_decision_t d;
                if (start(la, key, n, &q) == RATE_PENDING)
                    wait_all(&t);
                assert_int_equal(rate_limiter_check(lc, key, strlen(key), n,
                                                    0, &d), RATE_OK);
                same(&d, &q.d, i);
            } else {
                adj_calls = 0;
                int rc = op == 1 ? rate_limiter_refund_start(la, key,
                                                             strlen(key), n,
                                                             on_adjusted, NULL)
                                 : rate_limiter_penalize_start(
                                       la, key, strlen(key), n, on_adjusted,
                                       NULL);
                assert_int_equal(rc, RATE_PENDING);
                pending++;
                wait_all(&t);
                assert_int_equal(adj_calls, 1);
                assert_int_equal(adj_rc, RATE_OK);
                assert_int_equal(op == 1 ? rate_limiter_refund(lc, key,
                                                               strlen(key), n)
                                         : rate_limiter_penalize(
                                               lc, key, strlen(key), n),
                                 RATE_OK);
                adjusts++;
            }
            unsigned char a[4096], b[4096]; /* a sliding log's entries */
            size_t la_ = cas_store_peek(h, key, a, sizeof a), lb = 0;
            redisReply *r = redisCommand(c, "HGET %s s", name);
            if (r->type == REDIS_REPLY_STRING) {
                lb = r->len;
                memcpy(b, r->str, lb < sizeof b ? lb : sizeof b);
            }
            freeReplyObject(r);
            if (la_ != lb || memcmp(a, b, la_) != 0)
                fail_msg("%s, step %d (op %d, %llu permits): %zu bytes in C, "
                         "%zu on Redis, or others", adj_policies[p], i, op,
                         (unsigned long long)n, la_, lb);
        }
        rate_policy_free(pol);
        rate_limiter_free(la);
        rate_limiter_free(lc);
        rate_store_free(cs);
    }
    rate_redis_async_stats_t st;
    assert_int_equal(rate_store_redis_async_stats(as, &st), RATE_OK);
    print_message("%llu refunds and penalties, %llu by a lean script\n",
                  (unsigned long long)adjusts,
                  (unsigned long long)st.lean_adjustments);
    assert_int_equal(st.lean_adjustments, adjusts);
    /* A penalty the script declines (past 2^51 in units of g): the job
     * comes back declined and is made by the C step, with its bytes. */
    rate_store_t *cs;
    cas_store_t *h;
    assert_int_equal(cas_store_new(&cs, &h), RATE_OK);
    rate_limiter_t *la = lim(adj_policies[0], as, true, RATE_FAIL_CLOSED);
    rate_limiter_t *lc = lim(adj_policies[0], cs, true, RATE_FAIL_CLOSED);
    for (int i = 0; i < 2; i++) {
        uint64_t n = i == 0 ? 1 : UINT64_C(1) << 40;
        adj_calls = 0;
        assert_int_equal(rate_limiter_penalize_start(la, "big", 3, n,
                                                     on_adjusted, NULL),
                         RATE_PENDING);
        pending++;
        wait_all(&t);
        assert_int_equal(adj_calls, 1);
        assert_int_equal(adj_rc, RATE_OK);
        assert_int_equal(rate_limiter_penalize(lc, "big", 3, n), RATE_OK);
        unsigned char a[64];
        size_t la_ = cas_store_peek(h, "big", a, sizeof a);
        redisReply *r = redisCommand(c, "HGET aadj:{big} s");
        assert_int_equal(r->type, REDIS_REPLY_STRING);
        assert_int_equal(r->len, la_);
        assert_memory_equal(r->str, a, la_);
        freeReplyObject(r);
    }
    assert_int_equal(rate_store_redis_async_stats(as, &st), RATE_OK);
    assert_int_equal(st.lean_adjustments, adjusts + 1); /* the first only */
    assert_int_equal(st.declined_adjustments, 1);       /* the second */
    rate_limiter_free(la);
    rate_limiter_free(lc);
    rate_store_free(cs);
    redisFree(c);
    rate_store_redis_drop(as);
    rate_store_free(as);
    tloop_fini(&t);
}

/* The nginx case (docs/async.md): a hot key that another process's
 * scripted decisions change all the time (a thread on a synchronous store:
 * another connection), while this loop refunds and penalizes it: every
 * change lands (none RATE_ECONFLICT), each one script (hot_hammer:
 * redis_fixture.h). */
static void refunds_do_not_lose_on_a_hot_key(void **state)
{
    (void)state;
    enum { CHANGES = 300, IN_FLIGHT = 30 };
    const char *text = "token-bucket 1000000/s burst=1000000";
    tloop_t t;
    tloop_init(&t, false);
    rate_store_t *as = async_store(&t, "ahot:", false, 5 * SEC);
    rate_store_t *hs = redis_store("ahot:", false, 0);
    rate_limiter_t *la = lim(text, as, false, RATE_FAIL_CLOSED);
    hot_t h;
    h.l = limiter_of(text, hs);
    atomic_init(&h.stop, false);
    atomic_init(&h.admitted, 0);
    pthread_t th;
    pthread_create(&th, NULL, hot_hammer, &h);
    /* the hammer at work first */
    WAIT_UNTIL(atomic_load(&h.admitted) >= 20, TEST_WAIT_S);
    uint64_t admitted0 = atomic_load(&h.admitted);
    refunds_ok = refunds_other = 0;
    int conflicts = 0, changes = 0;
    /* CHANGES at least, and on until the hammer has admitted 20 more
     * meanwhile (a loaded machine may hold its thread back a while) */
    for (int round = 0;
         round < 1000 &&
         (changes < CHANGES || atomic_load(&h.admitted) < admitted0 + 20);
         round++) {
        int before = refunds_other;
        changes += IN_FLIGHT;
        for (int i = 0; i < IN_FLIGHT; i++) {
            int rc = i % 3 == 2
                         ? rate_limiter_penalize_start(la, "hot", 3, 1,
                                                       on_refunded, NULL)
                         : rate_limiter_refund_start(la, "hot", 3, 1,
                                                     on_refunded, NULL);
            assert_int_equal(rc, RATE_PENDING);
            pending++;
        }
        wait_all(&t);
        conflicts += refunds_other - before;
    }
    atomic_store(&h.stop, true);
    pthread_join(th, NULL);
    rate_redis_async_stats_t st;
    assert_int_equal(rate_store_redis_async_stats(as, &st), RATE_OK);
    uint64_t meanwhile = atomic_load(&h.admitted) - admitted0;
    print_message("%d changes: %d made, %d failed; %llu scripted; %llu "
                  "decisions admitted meanwhile\n", changes, refunds_ok,
                  refunds_other, (unsigned long long)st.lean_adjustments,
                  (unsigned long long)meanwhile);
    assert_true(admitted0 >= 20);
    assert_true(meanwhile >= 20); /* the key changed under them */
    assert_int_equal(conflicts, 0);
    assert_int_equal(refunds_ok, changes);
    assert_int_equal(st.lean_adjustments, changes);
    rate_limiter_free(h.l);
    rate_limiter_free(la);
    rate_store_free(hs);
    rate_store_redis_drop(as);
    rate_store_free(as);
    tloop_fini(&t);
}

/* A loop that refuses to watch: every decision still answered once. */
static rate_loop_t inner;
static bool refuse;
static int refuse_io_set(void *ud, void *io, unsigned events)
{
    if (refuse && events != 0)
        return -1;
    return inner.io_set(ud, io, events);
}

static void loop_refuses(void **state)
{
    (void)state;
    tloop_t t;
    tloop_init(&t, false);
    inner = t.loop;
    t.loop.io_set = refuse_io_set;
    rate_store_t *as = async_store(&t, "ref:", true, 5 * SEC);
    fclock.now = 100 * SEC;
    rate_limiter_t *l = lim("fixed-window 10/m", as, true, RATE_FAIL_CLOSED);
    enum { N = 50 };
    static req_t q[N];
    refuse = true;
    for (int i = 0; i < N; i++)
        assert_true(start(l, "r", 1, &q[i]) >= RATE_OK);
    wait_all(&t);
    refuse = false;
    for (int i = 0; i < N; i++) {
        assert_int_equal(q[i].calls, 1);
        assert_int_equal(q[i].d.reason, RATE_REASON_STORE_ERROR);
        assert_false(q[i].d.allowed);
    }
    idle(as, __LINE__);
    /* The loop watches again: after the backoff, decisions are made. */
    req_t w = decide_until_answered(&t, l, "r");
    assert_true(w.d.allowed);
    rate_limiter_free(l);
    rate_store_redis_drop(as);
    rate_store_free(as);
    tloop_fini(&t);
}

static void bad_args(void **state)
{
    (void)state;
    rate_store_t *s = NULL;
    rate_loop_t none = {0};
    char err[128] = "";
    assert_int_equal(rate_store_redis_async_new(url, NULL, NULL, &s, err,
                                                sizeof err),
                     RATE_EINVAL);
    assert_int_equal(rate_store_redis_async_new(url, NULL, &none, &s, err,
                                                sizeof err),
                     RATE_EINVAL);
    assert_non_null(strstr(err, "loop"));
    err[0] = '\0';
    assert_int_equal(rate_store_redis_async_new(url, NULL, &none, NULL, err,
                                                sizeof err),
                     RATE_EINVAL);
    assert_string_equal(err, "out is NULL");
    err[0] = '\0';
    assert_int_equal(rate_store_redis_new(url, NULL, NULL, err, sizeof err),
                     RATE_EINVAL);
    assert_string_equal(err, "out is NULL");
    rate_redis_async_stats_t st;
    assert_int_equal(rate_store_redis_async_stats(NULL, &st), RATE_EINVAL);
    /* a duration above RATE_TIME_MAX wrapped when added to the clock: the
     * decisions of a store with command_timeout_ns UINT64_MAX all timed
     * out at once; refused now, with the option named */
    rate_loop_t lp;
    rate_loop_uv(&lp, uv_default_loop());
    rate_redis_options_t o = {.command_timeout_ns = UINT64_MAX};
    assert_int_equal(rate_store_redis_async_new(url, &o, &lp, &s, err,
                                                sizeof err),
                     RATE_EINVAL);
    assert_null(s);
    assert_non_null(strstr(err, "command_timeout_ns"));
    o = (rate_redis_options_t){.breaker_cooldown_ns = RATE_TIME_MAX + 1};
    assert_int_equal(rate_store_redis_async_new(url, &o, &lp, &s, err,
                                                sizeof err),
                     RATE_EINVAL);
    assert_non_null(strstr(err, "breaker_cooldown_ns"));
    /* a loop table whose reserve is not NULL (a later adapter's function
     * this library does not know): refused, not ignored */
    lp.reserved[3] = &lp;
    assert_int_equal(rate_store_redis_async_new(url, NULL, &lp, &s, err,
                                                sizeof err),
                     RATE_EINVAL);
    assert_non_null(strstr(err, "reserved functions are not NULL"));
    lp.reserved[3] = NULL;
    o = (rate_redis_options_t){.connect_timeout_ns = UINT64_MAX};
    assert_int_equal(rate_store_redis_new(url, &o, &s, err, sizeof err),
                     RATE_EINVAL);
    assert_non_null(strstr(err, "connect_timeout_ns"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(start_at_once),
        cmocka_unit_test(bad_args),
        cmocka_unit_test(loop_refuses),
        cmocka_unit_test(differential_uv),
        cmocka_unit_test(differential_event),
        cmocka_unit_test(many_uv),
        cmocka_unit_test(many_event),
        cmocka_unit_test(free_uv),
        cmocka_unit_test(free_event),
        cmocka_unit_test(free_wire_uv),
        cmocka_unit_test(free_wire_event),
        cmocka_unit_test(stopped_first),
        cmocka_unit_test(error_replies_say_why),
        cmocka_unit_test(adjust_redis),
        cmocka_unit_test(hot_key_steps_take_turns),
        cmocka_unit_test(adjust_scripted),
        cmocka_unit_test(refunds_do_not_lose_on_a_hot_key),
        cmocka_unit_test(late_loop_uv),
        cmocka_unit_test(late_loop_event),
        cmocka_unit_test(late_writes_uv),
        cmocka_unit_test(late_writes_event),
        cmocka_unit_test(bursts_go_out_uv),
        cmocka_unit_test(bursts_go_out_event),
        cmocka_unit_test(faults_uv),
        cmocka_unit_test(faults_event),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
