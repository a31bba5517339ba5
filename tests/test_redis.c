/* SPDX-License-Identifier: MIT */
/*
 * The Redis store against a private redis-server that this test starts on a
 * free loopback port (no persistence) and stops by its PID: never a fixed
 * port, never someone else's server.
 *
 * What only the Redis store does (that its decisions are the memory
 * store's is the store matrix's, tests/test_stores.c): the lean scripts at
 * their exact arithmetic's edges, a namespace dropped, the wide layout, a
 * limit shared by several processes, Redis killed and restarted under
 * each fail mode and under many callers, SCRIPT FLUSH, key TTLs, a unix
 * socket, and bad URLs, hosts, passwords and keys.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "lib/sched_probe.h"

#include "lib/redis_fixture.h"
#include "ratelimit_redis.h"

/* ------------------------------------------------------------- traces */

/* Fails, naming the case, unless the two decisions agree field by field. */
/* The memory store's decision against this store's. */
#define expect_same(a, b, what, i, t, n, mw) \
    expect_same_decision(a, b, what, "redis", i, t, n, mw)

#define RND_SEED 12345
#include "lib/rng.h"
#include "lib/wait.h"

/* Decisions over the scripts' policies, a block, a composite and a shadow
 * limiter write states, shadow states and policy records; dropping the
 * store removes every one of them.  (That decisions on Redis are the
 * memory store's is the store matrix's, tests/test_stores.c.) */
static void drop_removes_the_namespace(void **state)
{
    (void)state;
    static const char *policies[] = {
        "token-bucket 5/s burst=3", "sliding-log 5/s",
        "token-bucket 10/s burst=5; sliding-log 20/3s; fixed-window 30/m",
        "token-bucket 5/s burst=3 block=700ms",
        "token-bucket 1/h burst=400000",
    };
    rate_store_t *rs = redis_store("diff:", true, 0);
    for (size_t p = 0; p < sizeof policies / sizeof policies[0]; p++) {
        for (int shadow = 0; shadow < 2; shadow++) {
            rate_limiter_config_t cfg = {0};
            cfg.store = rs;
            cfg.shadow = shadow;
            rate_limiter_t *l = limiter_cfg(policies[p], cfg);
            char key[16];
            snprintf(key, sizeof key, "k%zu-%d", p, shadow);
            for (uint64_t i = 0; i < 8; i++) {
                rate_decision_t d = at(l, key, SEC + i * MS, 1, 0);
                assert_int_not_equal(d.reason, RATE_REASON_STORE_ERROR);
            }
            rate_limiter_free(l);
        }
    }
    redisContext *c = raw();
    redisReply *r = redisCommand(c, "KEYS diff:*");
    assert_true(r->elements >= 15); /* states, shadow states, records */
    freeReplyObject(r);
    assert_int_equal(rate_store_redis_drop(rs), RATE_OK);
    r = redisCommand(c, "KEYS diff:*");
    assert_int_equal(r->elements, 0); /* the namespace is gone */
    freeReplyObject(r);
    redisFree(c);
    rate_store_free(rs);
}

/* Policies of the buckets' wide layout (B * P > 2^62), beyond the Lua
 * step's bound: decided through compare-and-set by the C step, their
 * state kept in the wide layout, a 14-byte header and 16 bytes.  (That
 * their decisions are the memory store's is the store matrix's.) */
static void wide_policies_keep_the_wide_state(void **state)
{
    (void)state;
    static const char *policies[] = {
        "token-bucket 100000/1d burst=100000",
        "token-bucket 1000000/s burst=1099511627776", /* 2^40 */
        "leaky-bucket 100000/1d capacity=100000",
    };
    static const uint64_t big[] = {30000, UINT64_C(400000000000), 30000};
    rate_store_t *rs = redis_store("wide:", true, 0);
    redisContext *c = raw();
    for (size_t p = 0; p < sizeof policies / sizeof policies[0]; p++) {
        rate_limiter_t *l = limiter_of(policies[p], rs);
        char key[8];
        snprintf(key, sizeof key, "w%zu", p);
        rate_decision_t d = at(l, key, SEC, big[p], 0);
        assert_int_not_equal(d.reason, RATE_REASON_STORE_ERROR);
        assert_true(d.allowed);
        redisReply *r = redisCommand(c, "HSTRLEN wide:{%s} s", key);
        assert_int_equal(r->type, REDIS_REPLY_INTEGER);
        assert_int_equal(r->integer, 30);
        freeReplyObject(r);
        rate_limiter_free(l);
    }
    redisFree(c);
    drop_store(rs);
}

/* Calls of a command since the last CONFIG RESETSTAT (0: none). */
static long long calls_of(redisContext *c, const char *cmd)
{
    redisReply *r = redisCommand(c, "INFO commandstats");
    char pat[64];
    snprintf(pat, sizeof pat, "cmdstat_%s:calls=", cmd);
    const char *at_ = strstr(r->str, pat);
    long long n = at_ != NULL ? atoll(at_ + strlen(pat)) : 0;
    freeReplyObject(r);
    return n;
}

/* A store whose decisions go to the lean scripts, or with general, to
 * the general script. */
static rate_store_t *script_store(const char *prefix, bool general)
{
    rate_redis_options_t o = {0};
    rate_store_t *rs;
    char err[200];
    o.prefix = prefix;
    o.no_ttl = true;
    o.general_script = general;
    if (rate_store_redis_new(url, &o, &rs, err, sizeof err) != RATE_OK)
        fail_msg("redis store: %s", err);
    return rs;
}

static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
    while (b != 0) {
        uint64_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

/* The policies users write, at the lean scripts' exactness boundaries:
 * every decision the memory store's field by field, each in one round
 * trip (one EVALSHA whose HMGET runs inside it: no HMGET or
 * compare-and-set script of the client's own), on times of today's clock
 * (2^60 ns and more) and near zero, with idle gaps past 2^52 ns and times
 * going back. */
static void lean_scripts_at_the_boundaries(void **state)
{
    (void)state;
    static const char *policies[] = {
        "token-bucket 1000/s burst=1000",
        "token-bucket 100/s burst=1000000",
        "token-bucket 1000000/s",
        "token-bucket 10000000/s burst=10000000",
        "token-bucket 1000/1h burst=1000",
        "token-bucket 5000/1d burst=100000",
        "token-bucket 7/3s burst=5",
        "token-bucket 3/7ms burst=2000000",
        "token-bucket 1/26d burst=1",
        "token-bucket 1000000000/1d burst=1000000000",
        "leaky-bucket 1000/1h capacity=1000",
        "leaky-bucket 1000000/s capacity=1000000",
        "leaky-bucket 7/3s capacity=4",
        "leaky-bucket 100000/1d capacity=100000",
        "leaky-bucket 3/7ms capacity=2000000",
        "leaky-bucket 1000000000/1d capacity=1000000000",
        "fixed-window 1000/1h",
        "fixed-window 100000/1d",
        "fixed-window 5/7ms",
        "fixed-window 3/52d",
        "fixed-window 4503599627370000/1d",
        "fixed-window 4503599627370496/1h",
        "fixed-window 10/333333333ns",
        "sliding-window 1000/1h",
        "sliding-window 10000/1m",
        "sliding-window 5/7ms",
        "sliding-window 7/3s",
        "sliding-window 1/26d",
        "sliding-window 1048576/4294967296ns", /* L * W = 2^52 */
        "sliding-window 3/333333333ns",
        "sliding-log 1000/1h",
        "sliding-log 10000/1m",
        "sliding-log 5/7ms",
        "sliding-log 7/3s",
        "sliding-log 3/6d",
        "sliding-log 2/2251799813685248ns", /* W = 2^51 */
        "sliding-log 3/333333333ns",
    };
    const size_t np = sizeof policies / sizeof policies[0];
    /* The same traces whatever ran before (a filter), another sequence
     * with TEST_SEED=n: every one must pass (seed 1 met 25 declines of
     * 180 with waits of up to 4 periods whatever the policy). */
    const char *seed = getenv("TEST_SEED");
    rnd_seed(seed != NULL ? strtoull(seed, NULL, 0) : 1);
    rate_store_t *rs = redis_store("lean:", true, 0);
    redisContext *c = raw();
    unsigned checked = 0, admitted = 0, delayed = 0;
    /* The lean Functions loaded before the counts start (run alone, the
     * first decision loads them: one FCALL more than decisions). */
    {
        rate_policy_t *wp = policy_of(policies[0]);
        rate_limiter_config_t wc = {0};
        rate_limiter_t *wl;
        rate_decision_t wd;
        wc.policy = wp;
        wc.store = rs;
        assert_int_equal(rate_limiter_new(&wc, &wl), RATE_OK);
        assert_int_equal(rate_limiter_check_at(wl, "warm", 4, 1, 0, SEC, &wd),
                         RATE_OK);
        rate_limiter_free(wl);
        rate_policy_free(wp);
    }
    rate_redis_status_t rst0;
    assert_int_equal(rate_store_redis_status(rs, &rst0), RATE_OK);
    assert_int_equal(rst0.declined, 0);
    uint64_t lean_before = rst0.lean_decisions;
    for (size_t p = 0; p < np; p++) {
        rate_policy_t *pol = policy_of(policies[p]);
        const rate_limit_t *lim = rate_policy_limit(pol, 0);
        uint64_t cap = lim->burst == 0 ? lim->limit : lim->burst; /* window */
        /* How long a reservation may wait: up to 4 periods, but no deeper
         * than a lean script's word holds (docs/redis.md, "The lean
         * range"): a debt of max_wait * L ns-tokens is 2^51 or less in
         * units of g = gcd(L, P, 10^10).  A deeper state is past exact
         * doubles and declined, rightly, to the C step (with 1/26d,
         * where g is 1, a wait of a few periods is: the declines that
         * another random sequence met). */
        uint64_t g = gcd_u64(gcd_u64(lim->limit, lim->period_ns),
                             UINT64_C(10000000000));
        unsigned __int128 deep = ((unsigned __int128)1 << 51) * g / lim->limit;
        uint64_t mw_cap = lim->period_ns * 4 < deep ? lim->period_ns * 4
                                                     : (uint64_t)deep;
        rate_store_t *ms;
        assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
        rate_limiter_config_t cfg = {0};
        rate_limiter_t *lm, *lr;
        cfg.policy = pol;
        cfg.store = ms;
        assert_int_equal(rate_limiter_new(&cfg, &lm), RATE_OK);
        cfg.store = rs;
        assert_int_equal(rate_limiter_new(&cfg, &lr), RATE_OK);
        freeReplyObject(redisCommand(c, "CONFIG RESETSTAT"));
        long long decisions = 0;
        /* Once 10 s of the trace's time have passed since the last, the
         * limiter checks its policy's record again (one HMGET): counted
         * here as the limiter does. */
        long long leaps = 0;
        uint64_t next_check = 0;
        for (int trace = 0; trace < 3; trace++) {
            char key[16];
            snprintf(key, sizeof key, "%zu-%d", p, trace);
            /* today (about 2^60.6 ns), near zero, near 2^62 */
            uint64_t t = trace == 0   ? UINT64_C(1764590000) * SEC + rnd(SEC)
                         : trace == 1 ? rnd(SEC)
                                      : (UINT64_C(1) << 62) + rnd(SEC);
            for (int i = 0; i < 60; i++) {
                uint64_t step = lim->period_ns / (1 + rnd(cap < 50 ? 8 : 4000));
                if (rnd(12) == 0 && t > SEC)
                    t -= rnd(SEC);
                else if (rnd(30) == 0) /* idle past 2^52 ns */
                    t += (UINT64_C(1) << 52) + rnd(SEC);
                else if (rnd(4) != 0)
                    t += rnd(step + 1);
                uint64_t n;
                switch (rnd(5)) {
                case 0: n = rnd(cap + 2); break;
                case 1: n = cap - rnd(cap < 3 ? cap + 1 : 3); break;
                case 2: n = cap + rnd(2); break;
                default: n = rnd(4); break;
                }
                uint64_t mw = lim->algorithm != RATE_FIXED_WINDOW && rnd(3) == 0
                                  ? rnd(mw_cap + 1)
                                  : 0;
                rate_decision_t a, b;
                if (t >= next_check) {
                    leaps++;
                    next_check = t + 10 * SEC;
                }
                assert_int_equal(rate_limiter_check_at(lm, key, strlen(key), n,
                                                       mw, t, &a), RATE_OK);
                assert_int_equal(rate_limiter_check_at(lr, key, strlen(key), n,
                                                       mw, t, &b), RATE_OK);
                expect_same(&a, &b, policies[p], i, t, n, mw);
                decisions++;
                checked++;
                admitted += a.allowed && n > 0;
                delayed += a.allowed && a.delay_ns > 0;
            }
        }
        rate_redis_status_t rst;
        assert_int_equal(rate_store_redis_status(rs, &rst), RATE_OK);
        if (rst.declined != 0 || rst.general_decisions != 0 ||
            rst.lean_decisions != lean_before + (uint64_t)decisions)
            fail_msg("%s: %lld decisions, %llu lean, %llu general, %llu "
                     "declined", policies[p], decisions,
                     (unsigned long long)(rst.lean_decisions - lean_before),
                     (unsigned long long)rst.general_decisions,
                     (unsigned long long)rst.declined);
        lean_before = rst.lean_decisions;
        /* FCALL of the lean Functions (EVALSHA where they are absent) */
        long long ev = calls_of(c, "evalsha") + calls_of(c, "fcall"),
                  hm = calls_of(c, "hmget");
        if (ev != decisions || hm != decisions + leaps ||
            calls_of(c, "eval") != 0)
            fail_msg("%s: %lld decisions took %lld EVALSHA/FCALL, %lld HMGET "
                     "(%lld leaps), %lld EVAL", policies[p], decisions, ev,
                     hm, leaps, calls_of(c, "eval"));
        rate_limiter_free(lm);
        rate_limiter_free(lr);
        rate_store_free(ms);
        rate_policy_free(pol);
    }
    assert_int_equal(checked, np * 180);
    /* the traces write (admissions, reservations), not only deny */
    if (admitted < checked / 5 || admitted > checked * 4 / 5)
        fail_msg("%u admitted of %u", admitted, checked);
    assert_true(delayed > 20);
    redisFree(c);
    drop_store(rs);
}

/* One state layout: the same keys decided in turn by a lean script, by
 * the general script (general_script) and, for a policy past its range,
 * by the C step over compare-and-set, give the memory store's decisions
 * field by field: a state written by one is read by the others. */
static void lean_general_and_c_share_keys(void **state)
{
    (void)state;
    static const char *policies[] = {
        "token-bucket 1000/s burst=1000", "token-bucket 1000/1h burst=1000",
        "token-bucket 5000/1d burst=100000", "leaky-bucket 7/3s capacity=4",
        "leaky-bucket 100000/1d capacity=100000", "fixed-window 1000/1h",
        "fixed-window 5/7ms", "sliding-window 30/s",
        "sliding-window 100/1m", "sliding-window 10000/1m",
        "sliding-log 30/s", "sliding-log 1000/1h"};
    rate_store_t *lean = script_store("share:", false),
                 *gen = script_store("share:", true);
    for (size_t p = 0; p < sizeof policies / sizeof policies[0]; p++) {
        rate_policy_t *pol = policy_of(policies[p]);
        const rate_limit_t *lim = rate_policy_limit(pol, 0);
        uint64_t cap = lim->burst == 0 ? lim->limit : lim->burst; /* window */
        rate_store_t *ms;
        assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
        rate_limiter_config_t cfg = {0};
        rate_limiter_t *lm, *l[2];
        cfg.policy = pol;
        cfg.store = ms;
        assert_int_equal(rate_limiter_new(&cfg, &lm), RATE_OK);
        cfg.store = lean;
        assert_int_equal(rate_limiter_new(&cfg, &l[0]), RATE_OK);
        cfg.store = gen;
        assert_int_equal(rate_limiter_new(&cfg, &l[1]), RATE_OK);
        char key[16];
        snprintf(key, sizeof key, "s%zu", p);
        uint64_t t = UINT64_C(1764590000) * SEC + rnd(SEC);
        for (int i = 0; i < 120; i++) {
            t += rnd(lim->period_ns / (1 + rnd(cap < 50 ? 8 : 2000)) + 1);
            uint64_t n = rnd(3) == 0 ? rnd(cap + 2) : rnd(3);
            uint64_t mw = lim->algorithm != RATE_FIXED_WINDOW && rnd(3) == 0
                              ? rnd(lim->period_ns)
                              : 0;
            rate_decision_t a, b;
            assert_int_equal(rate_limiter_check_at(lm, key, strlen(key), n,
                                                   mw, t, &a), RATE_OK);
            assert_int_equal(rate_limiter_check_at(l[rnd(2)], key,
                                                   strlen(key), n, mw, t, &b),
                             RATE_OK);
            expect_same(&a, &b, policies[p], i, t, n, mw);
        }
        rate_limiter_free(lm);
        rate_limiter_free(l[0]);
        rate_limiter_free(l[1]);
        rate_store_free(ms);
        rate_policy_free(pol);
    }
    rate_redis_status_t st;
    assert_int_equal(rate_store_redis_status(gen, &st), RATE_OK);
    /* the general store's share: its script, and C for what it declines */
    assert_true(st.general_decisions > 0 && st.declined > 0);
    rate_store_free(gen);
    drop_store(lean);
}

/* Sliding logs whose L * W passes the general script's 2^49 (10000/1m
 * and more) within its range all the same (general_script: the lean
 * script takes them otherwise): the log's rule forms no
 * product of its limit and its window, so each decision is one EVALSHA
 * of the general script, never declined, the memory store's field by
 * field.  Its window stays below 2^49 ns (6.5 days; 3/6d): the script's
 * time differences stop at 2^20 s (12 days), where a 13-day log's oldest
 * entries would decline. */
static void sliding_logs_in_the_general_script(void **state)
{
    (void)state;
    static const char *policies[] = {"sliding-log 10000/1m",
                                     "sliding-log 10000/1d",
                                     "sliding-log 3/6d"};
    rnd_seed(7);
    rate_store_t *rs = script_store("slog:", true);
    for (size_t p = 0; p < sizeof policies / sizeof policies[0]; p++) {
        rate_policy_t *pol = policy_of(policies[p]);
        const rate_limit_t *lim = rate_policy_limit(pol, 0);
        rate_store_t *ms;
        assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
        rate_limiter_t *lm = limiter_of(policies[p], ms),
                       *lr = limiter_of(policies[p], rs);
        rate_redis_status_t s0, s1;
        assert_int_equal(rate_store_redis_status(rs, &s0), RATE_OK);
        uint64_t t = UINT64_C(1764590000) * SEC + rnd(SEC);
        for (int i = 0; i < 120; i++) {
            t += rnd(lim->period_ns / (1 + rnd(40)) + 1);
            uint64_t n = rnd(3) == 0 ? rnd(lim->limit + 2) : rnd(3);
            rate_decision_t a, b;
            char key[2] = {(char)('a' + p), '\0'};
            assert_int_equal(rate_limiter_check_at(lm, key, 1, n, 0, t, &a),
                             RATE_OK);
            assert_int_equal(rate_limiter_check_at(lr, key, 1, n, 0, t, &b),
                             RATE_OK);
            expect_same(&a, &b, policies[p], i, t, n, (uint64_t)0);
        }
        assert_int_equal(rate_store_redis_status(rs, &s1), RATE_OK);
        if (s1.general_decisions - s0.general_decisions != 120 ||
            s1.declined != s0.declined)
            fail_msg("%s: %llu of 120 by the general script, %llu declined",
                     policies[p],
                     (unsigned long long)(s1.general_decisions -
                                          s0.general_decisions),
                     (unsigned long long)(s1.declined - s0.declined));
        rate_limiter_free(lm);
        rate_limiter_free(lr);
        rate_store_free(ms);
        rate_policy_free(pol);
    }
    drop_store(rs);
}

/* Clients whose clocks disagree share one limit: by default a decision
 * goes by Redis's TIME, also when the client decides itself (a window the
 * Lua step declines).  client_time makes each go by its own clock. */
static uint64_t early_now(void *ud) { (void)ud; return 5 * SEC; }
static uint64_t late_now(void *ud) { (void)ud; return 5000 * SEC; }
static void no_sleep(void *ud, uint64_t ns) { (void)ud; (void)ns; }

static void fleet_clock(void **state)
{
    (void)state;
    static const char *policies[] = {"token-bucket 1/h burst=1",
                                     "sliding-window 1/1500ms"};
    rate_clock_t early = {early_now, no_sleep, NULL};
    rate_clock_t late = {late_now, no_sleep, NULL};
    for (int p = 0; p < 2; p++) {
        for (int own = 0; own < 2; own++) {
            rate_redis_options_t o = {0};
            rate_store_t *rs;
            char err[200];
            o.prefix = "fleet:";
            o.client_time = own;
            assert_int_equal(rate_store_redis_new(url, &o, &rs, err,
                                                  sizeof err), RATE_OK);
            rate_limiter_config_t cfg = {0};
            cfg.store = rs;
            cfg.clock = &early;
            rate_limiter_t *a = limiter_cfg(policies[p], cfg);
            cfg.clock = &late;
            rate_limiter_t *b = limiter_cfg(policies[p], cfg);
            char key[40];
            snprintf(key, sizeof key, "k%d%d", p, own);
            assert_true(rate_try_acquire(a, key, 1));
            /* Redis's clock: b is right behind a and finds nothing left.
             * Its own clock, 4995 s later, has refilled or rolled. */
            assert_int_equal(rate_try_acquire(b, key, 1), own);
            rate_limiter_free(a);
            rate_limiter_free(b);
            drop_store(rs);
        }
    }
}

/* A Redis that lost its data (restarted without it) lost the policies'
 * records too, while a limiter still writes states tagged with its id:
 * another limiter cannot read them (a store error) until the first checks
 * its record again, at most 10 s of its time later, and writes it back. */
static void lost_records_come_back(void **state)
{
    (void)state;
    rate_store_t *rs = redis_store("lost:", true, 0);
    rate_limiter_t *a = limiter_of("fixed-window 30/h", rs);
    rate_limiter_t *b = limiter_of("fixed-window 20/h", rs);
    /* t to t + 12 s in one hour's window, so that the counts carry (from
     * the monotonic clock + 100 s, one run in 300 crossed an hour) */
    uint64_t hour = 3600 * SEC;
    uint64_t t = (rate_clock_monotonic_ns() / hour + 1) * hour + 100 * SEC;
    rate_decision_t d;
    assert_int_equal(rate_limiter_check_at(a, "k", 1, 1, 0, t, &d), RATE_OK);
    assert_true(d.allowed);
    redisContext *c = raw();
    freeReplyObject(redisCommand(c, "FLUSHALL"));
    /* a writes the key again, tagged with its id, whose record is gone */
    assert_int_equal(rate_limiter_check_at(a, "k", 1, 1, 0, t + SEC, &d),
                     RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(rate_limiter_check_at(b, "k", 1, 1, 0, t + 2 * SEC, &d),
                     RATE_OK);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(d.error, RATE_ECORRUPT);
    /* 10 s on: a finds its record missing and writes it back */
    assert_int_equal(rate_limiter_check_at(a, "k", 1, 1, 0, t + 11 * SEC, &d),
                     RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(rate_limiter_check_at(b, "k", 1, 1, 0, t + 12 * SEC, &d),
                     RATE_OK);
    assert_int_not_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_true(d.allowed);
    assert_int_equal(d.remaining, 20 - 2 - 1); /* a's 2 since, b's 1 */
    redisFree(c);
    rate_limiter_free(a);
    rate_limiter_free(b);
    assert_int_equal(rate_store_redis_drop(rs), RATE_OK);
    rate_store_free(rs);
}

/* One caller, one round trip per decision: every decision is one FCALL
 * of the lean script (its HMGET runs inside it), the general script's
 * EVALSHA for a composite. */
static void one_round_trip(void **state)
{
    (void)state;
    rate_store_t *rs = redis_store("rtt:", false, 0);
    static const char *policies[] = {"sliding-window 30/s",
                                     "sliding-window 30/s; fixed-window "
                                     "100/1m"};
    redisContext *c = raw();
    for (int p = 0; p < 2; p++) {
        rate_limiter_t *l = limiter_of(policies[p], rs);
        at(l, "warm", SEC, 1, 0); /* the Functions loaded first */
        freeReplyObject(redisCommand(c, "CONFIG RESETSTAT"));
        for (int i = 0; i < 50; i++)
            at(l, "k", SEC + (uint64_t)i * MS, 1, 0);
        assert_int_equal(calls_of(c, p == 0 ? "fcall" : "evalsha"), 50);
        assert_int_equal(calls_of(c, p == 0 ? "evalsha" : "fcall"), 0);
        if (p == 0) /* (the composite's script reads more) */
            assert_int_equal(calls_of(c, "hmget"), 50);
        assert_int_equal(calls_of(c, "eval"), 0);
        rate_limiter_free(l);
    }
    redisFree(c);
    drop_store(rs);
}

static long long redis_int(redisContext *c, const char *cmd, const char *arg)
{
    redisReply *r = redisCommand(c, "%s %s", cmd, arg);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

/* Redis's TIME in microseconds. */
static uint64_t redis_time_us(redisContext *c)
{
    redisReply *r = redisCommand(c, "TIME");
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    uint64_t us = strtoull(r->element[0]->str, NULL, 10) * 1000000 +
                  strtoull(r->element[1]->str, NULL, 10);
    freeReplyObject(r);
    return us;
}

/* How long KEY lives, in ms, counted from `since_us` on Redis's clock (a
 * TIME read before the write that set its expiry).  A lower bound on it
 * holds however long the test took since, as an upper bound on PTTL does.
 * A key already gone (a loaded machine came late) counts as living until
 * now: a lower bound then holds only if it would have been gone anyway. */
static long long ttl_since(redisContext *c, const char *key, uint64_t since_us)
{
    long long end = redis_int(c, "PEXPIRETIME", key);
    if (end == -2)
        end = (long long)(redis_time_us(c) / 1000);
    return end - (long long)(since_us / 1000);
}

static void ttl_is_reset_after(void **state)
{
    (void)state;
    rate_store_t *rs = redis_store("ttl:", false, 0);
    rate_limiter_t *l = limiter_of("token-bucket 3/s burst=3", rs);
    rate_decision_t d;
    redisContext *c = raw();
    uint64_t t0 = redis_time_us(c);
    assert_int_equal(rate_limiter_check(l, "k", 1, 2, 0, &d), RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(d.reset_after_ns, 666666667);
    /* 667 ms (rounded up), plus the 1 ms margin of Redis's millisecond
     * expiry and PTTL's own rounding. */
    assert_true(redis_int(c, "PTTL", "ttl:{k}") <= 669);
    assert_true(ttl_since(c, "ttl:{k}", t0) >= 668);
    /* A try-acquire keeps the key for the policy's longest reset. */
    t0 = redis_time_us(c);
    assert_true(rate_try_acquire(l, "q", 1));
    assert_true(redis_int(c, "PTTL", "ttl:{q}") <= 1002);
    assert_true(ttl_since(c, "ttl:{q}", t0) >= 1001);
    redisFree(c);
    rate_limiter_free(l);
    drop_store(rs);
}


/* A key never expires before its reset_after by Redis's own clock: the
 * scripts set its end from Redis's TIME (PEXPIREAT), the end rounded up
 * to whole milliseconds plus one, whatever clock the decision went by
 * (Redis's, or a caller's virtual time).  Checked against PEXPIRETIME and
 * TIME read around each decision: the decision's own TIME is between the
 * two, so the end is at least the first plus reset_after plus 1 ms, and at
 * most the second plus reset_after plus 2 ms.  Before the fix (PEXPIRE of
 * the reset rounded up to ms, counted from Redis's ms clock), the end fell
 * short of the first bound by up to a millisecond.  The decide script, the
 * compare-and-set path (a fixed window of 7 ms, which the script declines)
 * and rate_store_redis_touch() alike. */
static void expiry_by_redis_clock(void **state)
{
    (void)state;
    static const char *policies[] = {"leaky-bucket 2000/s capacity=4",
                                     "token-bucket 3000/s burst=3",
                                     "sliding-log 2/1500us",
                                     "fixed-window 2/7ms"};
    redisContext *c = raw();
    for (int own = 0; own < 2; own++) {
        rate_redis_options_t o = {0};
        rate_store_t *rs;
        char err[200];
        o.prefix = "exp:";
        o.client_time = own; /* a replay's virtual time: 5 s, 6 s, ... */
        assert_int_equal(rate_store_redis_new(url, &o, &rs, err, sizeof err),
                         RATE_OK);
        for (int p = 0; p < 4; p++) {
            rate_limiter_t *l = limiter_of(policies[p], rs);
            for (int i = 0; i < 12; i++) {
                char key[40], name[64];
                snprintf(key, sizeof key, "k%d%d%d", own, p, i);
                snprintf(name, sizeof name, "exp:{%s}", key);
                uint64_t t0 = redis_time_us(c);
                rate_decision_t d;
                if (own)
                    assert_int_equal(rate_limiter_check_at(
                                         l, key, strlen(key), 1 + (uint64_t)(i % 2), 0,
                                         (5 + (uint64_t)i) * SEC, &d),
                                     RATE_OK);
                else
                    assert_int_equal(rate_limiter_check(l, key, strlen(key),
                                                        1 + (uint64_t)(i % 2),
                                                        0, &d),
                                     RATE_OK);
                assert_true(d.allowed);
                redisReply *r = redisCommand(c, "PEXPIRETIME %s", name);
                uint64_t t1 = redis_time_us(c);
                assert_int_equal(r->type, REDIS_REPLY_INTEGER);
                uint64_t reset = (d.reset_after_ns + 999) / 1000;
                if (r->integer == -2 && t1 >= t0 + reset + 1000) {
                    freeReplyObject(r); /* gone, but in its time */
                    continue;
                }
                if (r->integer <= 0)
                    fail_msg("%s: PEXPIRETIME %lld, reset_after %llu us",
                             policies[p], r->integer,
                             (unsigned long long)reset);
                uint64_t end = (uint64_t)r->integer * 1000;
                freeReplyObject(r);
                if (end < t0 + reset + 1000 || end > t1 + reset + 2000)
                    fail_msg("%s, %s: expiry at %llu us, reset_after %llu us, "
                             "Redis's TIME %llu..%llu us",
                             policies[p], own ? "caller's time" : "Redis's",
                             (unsigned long long)end,
                             (unsigned long long)reset,
                             (unsigned long long)t0, (unsigned long long)t1);
            }
            rate_limiter_free(l);
        }
        /* touch: every key of the namespace, from Redis's clock too.  The
         * new expiry (a minute and half a millisecond, down from an hour)
         * is long enough that a loaded machine cannot see the key go. */
        rate_limiter_t *h = limiter_of("fixed-window 1/h", rs);
        assert_true(rate_try_acquire(h, "hour", 1));
        rate_limiter_free(h);
        const uint64_t ttl = 60 * 1000 * 1000 + 500;
        uint64_t t0 = redis_time_us(c);
        assert_int_equal(rate_store_redis_touch(rs, ttl * 1000), RATE_OK);
        uint64_t t1 = redis_time_us(c);
        redisReply *r = redisCommand(c, "PEXPIRETIME exp:{hour}");
        assert_int_equal(r->type, REDIS_REPLY_INTEGER);
        assert_true(r->integer > 0);
        uint64_t end = (uint64_t)r->integer * 1000;
        freeReplyObject(r);
        if (end < t0 + ttl + 1000 || end > t1 + ttl + 2000)
            fail_msg("touch: expiry at %llu us, Redis's TIME %llu..%llu us",
                     (unsigned long long)end, (unsigned long long)t0,
                     (unsigned long long)t1);
        drop_store(rs);
    }
    redisFree(c);
}

static void script_flush_changes_nothing(void **state)
{
    (void)state;
    rate_store_t *rs = redis_store("flush:", true, 0);
    rate_limiter_t *l = limiter_of("fixed-window 5/h", rs);
    redisContext *c = raw();
    int ok = 0;
    for (int i = 0; i < 10; i++) {
        if (i == 3 || i == 6)
            freeReplyObject(redisCommand(c, "SCRIPT FLUSH"));
        if (i == 4 || i == 8) /* the lean scripts' library */
            freeReplyObject(redisCommand(c, "FUNCTION FLUSH"));
        rate_decision_t d = at(l, "k", SEC, 1, 0);
        assert_int_not_equal(d.reason, RATE_REASON_STORE_ERROR);
        ok += d.allowed;
    }
    assert_int_equal(ok, 5);
    redisFree(c);
    rate_limiter_free(l);
    drop_store(rs);
}

/* A state that makes no sense is RATE_ECORRUPT, never admitted and never
 * written over: a token bucket holding more than its burst (the Lua step
 * declines it, the C step reports it), the same state truncated, and a
 * key of another Redis type (WRONGTYPE). */
static void tampered_state_is_corrupt(void **state)
{
    (void)state;
    rate_store_t *rs = redis_store("bad:", true, 0);
    rate_limiter_t *l = limiter_of("token-bucket 5/s burst=5", rs);
    redisContext *c = raw();
    assert_true(at(l, "k", SEC, 1, 0).allowed); /* a state, tagged */
    redisReply *r = redisCommand(c, "HGET bad:{k} s");
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    assert_int_equal(r->len, 22);
    unsigned char st[22];
    memcpy(st, r->str, sizeof st);
    freeReplyObject(r);
    uint64_t u = 2000 * SEC; /* 2000 tokens (times P) in a burst of 5 */
    for (int i = 0; i < 8; i++)
        st[14 + i] = (unsigned char)(u >> (8 * i));
    for (size_t len = 22; len >= 21; len--) {
        freeReplyObject(redisCommand(c, "HSET bad:{k} s %b", st, len));
        for (int i = 0; i < 20; i++) {
            rate_decision_t d = at(l, "k", SEC, 1, 0);
            assert_false(d.allowed);
            assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
            assert_int_equal(d.error, RATE_ECORRUPT);
            assert_false(rate_try_acquire(l, "k", 1));
        }
        r = redisCommand(c, "HGET bad:{k} s");
        assert_int_equal(r->type, REDIS_REPLY_STRING);
        assert_int_equal(r->len, len);
        assert_memory_equal(r->str, st, len);
        freeReplyObject(r);
    }
    freeReplyObject(redisCommand(c, "SET bad:{w} hello"));
    rate_decision_t d = at(l, "w", SEC, 1, 0);
    assert_false(d.allowed);
    assert_int_equal(d.error, RATE_ECORRUPT);
    assert_false(rate_try_acquire(l, "w", 1));
    r = redisCommand(c, "GET bad:{w}");
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    assert_string_equal(r->str, "hello");
    freeReplyObject(r);
    redisFree(c);
    rate_limiter_free(l);
    drop_store(rs);
}

/* On the library's clock the changes go by Redis's TIME, as decisions do
 * (one clock for the fleet), and a key is kept as long as its change
 * takes to wear off: a penalty's debt, a refund's shorter reset. */
static void adjustments_on_redis_time(void **state)
{
    (void)state;
    rate_store_t *rs = redis_store("adjt:", false, 0);
    static const char *policies[] = {"token-bucket 1/s burst=2",
                                     "sliding-window 2/1500ms"};
    redisContext *c = raw();
    for (int p = 0; p < 2; p++) {
        rate_limiter_t *l = limiter_of(policies[p], rs);
        rate_decision_t d;
        uint64_t t0 = redis_time_us(c);
        assert_int_equal(rate_limiter_check(l, "k", 1, 1, 0, &d), RATE_OK);
        assert_true(d.allowed);
        assert_int_equal(rate_limiter_penalize(l, "k", 1, 10), RATE_OK);
        assert_false(rate_try_acquire(l, "k", 1));
        if (p == 0) { /* 11 tokens owed at 1/s: kept 11 s */
            assert_true(redis_int(c, "PTTL", "adjt:{k}") <= 11002);
            assert_true(ttl_since(c, "adjt:{k}", t0) >= 11000);
        }
        assert_int_equal(rate_limiter_refund(l, "k", 1, 20), RATE_OK);
        assert_true(rate_try_acquire(l, "k", 1));
        assert_int_equal(rate_limiter_reset(l, "k", 1), RATE_OK);
        assert_int_equal(redis_int(c, "EXISTS", "adjt:{k}"), 0);
        rate_limiter_free(l);
    }
    redisFree(c);
    drop_store(rs);
}

/* ------------------------------------------- refunds and penalties, scripted */

/* The state bytes at Redis key `name` into buf (at most cap): their length,
 * 0 when the key holds none. */
static size_t redis_state(redisContext *c, const char *name,
                          unsigned char *buf, size_t cap)
{
    redisReply *r = redisCommand(c, "HGET %s s", name);
    size_t len = 0;
    if (r->type == REDIS_REPLY_STRING) {
        len = r->len;
        memcpy(buf, r->str, len < cap ? len : cap);
    }
    freeReplyObject(r);
    return len;
}

/* Fails unless Redis holds at `name` what the compare-and-set test store
 * (the C step's bytes) holds at `key`, byte for byte. */
static void expect_same_state(redisContext *c, const char *name,
                              cas_store_t *h, const char *key,
                              const char *what, const char *op, int i)
{
    unsigned char a[4096], b[4096]; /* a sliding log's entries */
    size_t la = cas_store_peek(h, key, a, sizeof a);
    size_t lb = redis_state(c, name, b, sizeof b);
    if (la == lb && la <= sizeof a && memcmp(a, b, la) == 0)
        return;
    char ha[129] = "", hb[129] = "";
    for (size_t k = 0; k < la && k < 64; k++)
        snprintf(ha + 2 * k, 3, "%02x", a[k]);
    for (size_t k = 0; k < lb && k < 64; k++)
        snprintf(hb + 2 * k, 3, "%02x", b[k]);
    fail_msg("%s, step %d (%s): the C step wrote %zu bytes %s, Redis holds "
             "%zu bytes %s", what, i, op, la, ha, lb, hb);
}

/* Single-limit policies the lean scripts decide, at the edges of their
 * exact arithmetic: g = 1 (7/3s), bursts of 10^6, the wide layout (B * P
 * > 2^62, 16-byte words), g = 10^10 (the debt bound of 2^62 scaled tokens
 * within a penalty's reach: 4.6 * 10^8 tokens), a window's count of 2^52, a
 * sliding window's L * W of 2^52, sliding logs (a refund cuts their newest
 * entries) up to a window of 2^51 ns. */
static const char *const adj_policies[] = {
    "token-bucket 5/s burst=3",
    "token-bucket 7/3s burst=5",
    "token-bucket 1000/1h burst=1000",
    "token-bucket 100/s burst=1000000",
    "token-bucket 1000000000/1d burst=1000000000",
    "token-bucket 10000000000/10s burst=1000",
    "leaky-bucket 7/3s capacity=4",
    "leaky-bucket 3/7ms capacity=2000000",
    "leaky-bucket 1000000000/1d capacity=1000000000",
    "fixed-window 4/700ms",
    "fixed-window 1000/1h",
    "fixed-window 4503599627370496/1h",
    "fixed-window 5/7ms",
    "sliding-window 4/700ms",
    "sliding-window 1000/1h",
    "sliding-window 1048576/4294967296ns",
    "sliding-window 5/7ms",
    "sliding-log 4/700ms",
    "sliding-log 100/1h",
    "sliding-log 2/2251799813685248ns",
    "sliding-log 5/7ms",
};
#define ADJ_POLICIES (sizeof adj_policies / sizeof adj_policies[0])

/* The permits of a refund or a penalty: small, the whole burst, past it,
 * huge (up to 2^62), and, for the policy with g = 10^10, near its debt
 * bound.  (A token bucket's penalty past 2^51 in units of g declines, and
 * the debt it leaves keeps the key on the C step for years after: rare,
 * so that the traces stay mostly the scripts'.) */
static uint64_t adj_permits(uint64_t cap, bool refund, bool debt)
{
    switch (rnd(24)) {
    case 0: case 8: case 9: case 10: return rnd(cap + 2);
    case 1: case 11: case 12: return cap;
    case 2: return 0;
    case 3: return 1 + rnd(3 * cap + 1);
    case 4:
        if (refund || rnd(2) == 0)
            return rnd(UINT64_C(1) << (20 + rnd(43)));
        return rnd(4);
    case 5: case 6: case 7:
        return debt ? 100000000 + rnd(400000000) : rnd(cap + 2);
    default: return rnd(4);
    }
}

/* Random traces of decisions, refunds and penalties on a Redis store (the
 * lean scripts) and at the same times on the memory store (decisions,
 * field by field) and the compare-and-set test store (the C step's bytes):
 * after every call Redis holds the C step's bytes exactly.  Returns how
 * many refunds and penalties it made; *lean and *declined how the store
 * counted them. */
static unsigned adj_traces(rate_store_t *rs, const char *prefix,
                           const char *what, uint64_t *lean,
                           uint64_t *declined)
{
    redisContext *c = raw();
    rate_redis_status_t st0, st1;
    rnd_seed(12345); /* the same traces whatever ran before (a filter) */
    assert_int_equal(rate_store_redis_status(rs, &st0), RATE_OK);
    unsigned adjusts = 0;
    for (size_t p = 0; p < ADJ_POLICIES; p++) {
        rate_policy_t *pol = policy_of(adj_policies[p]);
        const rate_limit_t *lim = rate_policy_limit(pol, 0);
        uint64_t cap = lim->burst == 0 ? lim->limit : lim->burst; /* window */
        rate_store_t *ms, *cs;
        cas_store_t *h;
        assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
        assert_int_equal(cas_store_new(&cs, &h), RATE_OK);
        rate_limiter_config_t cfg = {0};
        rate_limiter_t *lm, *lc, *lr;
        cfg.policy = pol;
        cfg.store = ms;
        assert_int_equal(rate_limiter_new(&cfg, &lm), RATE_OK);
        cfg.store = cs;
        assert_int_equal(rate_limiter_new(&cfg, &lc), RATE_OK);
        cfg.store = rs;
        assert_int_equal(rate_limiter_new(&cfg, &lr), RATE_OK);
        char label[160];
        snprintf(label, sizeof label, "%s: %s", what, adj_policies[p]);
        rate_redis_status_t pst0, pst1;
        assert_int_equal(rate_store_redis_status(rs, &pst0), RATE_OK);
        for (int trace = 0; trace < 3; trace++) {
            char key[16], name[48];
            snprintf(key, sizeof key, "a%zu-%d", p, trace);
            snprintf(name, sizeof name, "%s{%s}", prefix, key);
            uint64_t t = trace == 0   ? UINT64_C(1764590000) * SEC + rnd(SEC)
                         : trace == 1 ? rnd(SEC)
                                      : (UINT64_C(1) << 62) + rnd(SEC);
            for (int i = 0; i < 70; i++) {
                uint64_t step = lim->period_ns / (1 + rnd(cap < 50 ? 8 : 4000));
                if (rnd(10) == 0 && t > SEC)
                    t -= rnd(SEC); /* back in time: t_eff is t_last */
                else if (rnd(40) == 0)
                    t += (UINT64_C(1) << 52) + rnd(SEC);
                else if (rnd(4) != 0)
                    t += rnd(step + 1);
                int op = (int)rnd(10), x = 0, y = 0, z = 0;
                const char *name_of_op = "check";
                if (op < 4) {
                    uint64_t n = rnd(3) == 0 ? rnd(cap + 2) : rnd(3);
                    uint64_t mw = lim->algorithm != RATE_FIXED_WINDOW &&
                                          rnd(3) == 0
                                      ? rnd(lim->period_ns * 4 + 1)
                                      : 0;
                    rate_decision_t a, b, d;
                    assert_int_equal(rate_limiter_check_at(lm, key, strlen(key),
                                                           n, mw, t, &a),
                                     RATE_OK);
                    assert_int_equal(rate_limiter_check_at(lc, key, strlen(key),
                                                           n, mw, t, &d),
                                     RATE_OK);
                    assert_int_equal(rate_limiter_check_at(lr, key, strlen(key),
                                                           n, mw, t, &b),
                                     RATE_OK);
                    expect_same(&a, &d, label, i, t, n, mw);
                    expect_same(&a, &b, label, i, t, n, mw);
                } else {
                    bool refund = op < 7;
                    uint64_t n = adj_permits(
                        cap, refund,
                        strstr(adj_policies[p], "10000000000/") != NULL);
                    name_of_op = refund ? "refund" : "penalty";
                    if (refund) {
                        x = rate_limiter_refund_at(lm, key, strlen(key), n, t);
                        y = rate_limiter_refund_at(lc, key, strlen(key), n, t);
                        z = rate_limiter_refund_at(lr, key, strlen(key), n, t);
                    } else {
                        x = rate_limiter_penalize_at(lm, key, strlen(key), n,
                                                     t);
                        y = rate_limiter_penalize_at(lc, key, strlen(key), n,
                                                     t);
                        z = rate_limiter_penalize_at(lr, key, strlen(key), n,
                                                     t);
                    }
                    if (x != RATE_OK || y != RATE_OK || z != RATE_OK)
                        fail_msg("%s, step %d: %s of %llu gives %s on memory, "
                                 "%s in C, %s on Redis", label, i, name_of_op,
                                 (unsigned long long)n, rate_err_name(x),
                                 rate_err_name(y), rate_err_name(z));
                    adjusts++;
                }
                expect_same_state(c, name, h, key, label, name_of_op, i);
            }
        }
        /* Only a token bucket's penalty declines (past 2^51 in units of
         * g, or reaching the debt bound), and what follows it on the key
         * while its debt is past the scripts' exact range. */
        assert_int_equal(rate_store_redis_status(rs, &pst1), RATE_OK);
        uint64_t pd = pst1.declined_adjustments - pst0.declined_adjustments;
        print_message("%s: %llu declined\n", label, (unsigned long long)pd);
        if (lim->algorithm != RATE_TOKEN_BUCKET && pd != 0)
            fail_msg("%s: %llu refunds or penalties declined", label,
                     (unsigned long long)pd);
        rate_limiter_free(lm);
        rate_limiter_free(lc);
        rate_limiter_free(lr);
        rate_store_free(ms);
        rate_store_free(cs);
        rate_policy_free(pol);
    }
    assert_int_equal(rate_store_redis_status(rs, &st1), RATE_OK);
    *lean = st1.lean_adjustments - st0.lean_adjustments;
    *declined = st1.declined_adjustments - st0.declined_adjustments;
    redisFree(c);
    return adjusts;
}

/* The traces on the lean scripts called with FCALL (the Functions
 * library), then with EVALSHA (a user who may not load Functions, after
 * FUNCTION FLUSH): the same bytes as the C step either way.  Nearly every
 * change is the script's; those it declines (a penalty that would reach
 * the debt bound, or a state past its exact range after one) are the C
 * step's, with the same bytes too. */
static void adjustments_scripted_as_the_c_step(void **state)
{
    (void)state;
    redisContext *c = raw();
    freeReplyObject(redisCommand(c, "ACL SETUSER nofn on >pw ~* +@all "
                                    "-function"));
    for (int evalsha = 0; evalsha < 2; evalsha++) {
        rate_store_t *rs;
        const char *prefix = evalsha ? "adjs:" : "adjf:";
        if (evalsha) {
            char u[128], err[256] = "";
            rate_redis_options_t o = {0};
            o.prefix = prefix;
            o.no_ttl = true;
            snprintf(u, sizeof u, "redis://nofn:pw@127.0.0.1:%d/0", port);
            freeReplyObject(redisCommand(c, "FUNCTION FLUSH"));
            if (rate_store_redis_new(u, &o, &rs, err, sizeof err) != RATE_OK)
                fail_msg("store as nofn: %s", err);
        } else {
            rs = redis_store(prefix, true, 0);
        }
        freeReplyObject(redisCommand(c, "CONFIG RESETSTAT"));
        uint64_t lean, declined;
        const char *what = evalsha ? "EVALSHA" : "FCALL";
        unsigned n = adj_traces(rs, prefix, what, &lean, &declined);
        long long fc = calls_of(c, "fcall"), ev = calls_of(c, "evalsha");
        print_message("%s: %u refunds and penalties, %llu scripted, %llu "
                      "declined; %lld FCALL, %lld EVALSHA\n", what, n,
                      (unsigned long long)lean, (unsigned long long)declined,
                      fc, ev);
        if (lean + declined != n || lean < n * 3 / 4 || declined == 0)
            fail_msg("%s: %u refunds and penalties, %llu by a lean script, "
                     "%llu declined", what, n, (unsigned long long)lean,
                     (unsigned long long)declined);
        /* the path: FCALL (one that failed first at most), else EVALSHA */
        if (evalsha ? fc > 1 || ev < (long long)lean : fc < (long long)lean)
            fail_msg("%s: %lld FCALL, %lld EVALSHA for %llu scripted", what,
                     fc, ev, (unsigned long long)lean);
        drop_store(rs);
    }
    freeReplyObject(redisCommand(c, "ACL DELUSER nofn"));
    redisFree(c);
}

/* The expiry a scripted refund or penalty gives the key is the C step's:
 * the changed state's reset (a penalty's debt, a refund's shorter reset; 1
 * us when the refund leaves it cold), counted from Redis's TIME and set
 * as the compare-and-set script sets it (the end rounded up to whole
 * milliseconds, plus one): PEXPIRETIME between TIME before plus the
 * step's ttl plus 1 ms and TIME after plus 2 ms.  Also with a safety TTL
 * under no_ttl, and none at all under no_ttl alone. */
static void adjustments_expire_as_the_c_step(void **state)
{
    (void)state;
    /* Each take's expiry is 2 s or more of Redis's real time (a permit
     * of a bucket; the window's 10 s, its first ms), so that no stall
     * between a take and its change lets the take's key expire first (at
     * 200 ms, one could: the script then refunds a key that is gone). */
    static const char *policies[] = {"token-bucket 5/10s burst=3",
                                     "leaky-bucket 7/30s capacity=4",
                                     "fixed-window 4/10s",
                                     "token-bucket 1000000000/1d "
                                     "burst=1000000000"};
    redisContext *c = raw();
    for (int mode = 0; mode < 3; mode++) { /* ttl, safety ttl, none */
        rate_redis_options_t o = {0};
        rate_store_t *rs;
        char err[200];
        o.prefix = "adje:";
        o.no_ttl = mode != 0;
        o.safety_ttl_ns = mode == 1 ? 7 * SEC : 0;
        assert_int_equal(rate_store_redis_new(url, &o, &rs, err, sizeof err),
                         RATE_OK);
        rate_redis_status_t st0, st1;
        assert_int_equal(rate_store_redis_status(rs, &st0), RATE_OK);
        unsigned adjusts = 0;
        for (size_t p = 0; p < 4; p++) {
            rate_store_t *cs;
            cas_store_t *h;
            assert_int_equal(cas_store_new(&cs, &h), RATE_OK);
            rate_limiter_t *lc = limiter_of(policies[p], cs);
            rate_limiter_t *lr = limiter_of(policies[p], rs);
            /* key, permits admitted first, then the change */
            static const struct {
                uint64_t take;
                bool refund;
                uint64_t n;
            } cases[] = {{0, false, 2},  {1, true, 1},  {3, true, 1},
                         {3, true, 2},   {0, false, 10}, {2, false, 1},
                         {0, true, 1},   {4, true, 100}};
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
                char key[16], name[32];
                snprintf(key, sizeof key, "e%d%zu%zu", mode, p, i);
                snprintf(name, sizeof name, "adje:{%s}", key);
                uint64_t t = UINT64_C(1764590000) * SEC + i * 3 * MS;
                /* The take's own expiry (its reset, a few hundred us for
                 * the large buckets) runs on Redis's clock: on a loaded
                 * machine the key may be gone before the change comes,
                 * which then finds no state and writes none. */
                uint64_t t_take = redis_time_us(c), us_take = 0;
                if (cases[i].take > 0) {
                    at(lc, key, t, cases[i].take, 0);
                    at(lr, key, t, cases[i].take, 0);
                    uint64_t nt = cas_store_ttl(h, key);
                    us_take = nt / 1000 + (nt % 1000 != 0);
                    if (us_take == 0)
                        us_take = 1;
                }
                t += 100 * MS;
                uint64_t t0 = redis_time_us(c);
                int x = cases[i].refund
                            ? rate_limiter_refund_at(lc, key, strlen(key),
                                                     cases[i].n, t)
                            : rate_limiter_penalize_at(lc, key, strlen(key),
                                                       cases[i].n, t);
                int y = cases[i].refund
                            ? rate_limiter_refund_at(lr, key, strlen(key),
                                                     cases[i].n, t)
                            : rate_limiter_penalize_at(lr, key, strlen(key),
                                                       cases[i].n, t);
                adjusts++;
                /* the bytes and the expiry at one instant (a script's) */
                redisReply *r = redisCommand(
                    c, "EVAL %s 1 %s",
                    "return {redis.call('HGET', KEYS[1], 's'), "
                    "redis.call('PEXPIRETIME', KEYS[1])}", name);
                uint64_t t1 = redis_time_us(c);
                assert_int_equal(x, RATE_OK);
                assert_int_equal(y, RATE_OK);
                assert_int_equal(r->type, REDIS_REPLY_ARRAY);
                assert_int_equal(r->elements, 2);
                long long end = r->element[1]->integer;
                unsigned char a[64], b[64];
                size_t la = cas_store_peek(h, key, a, sizeof a), lb = 0;
                if (r->element[0]->type == REDIS_REPLY_STRING) {
                    lb = r->element[0]->len;
                    memcpy(b, r->element[0]->str, lb < 64 ? lb : 64);
                }
                freeReplyObject(r);
                if (la == 0) {
                    /* a refund of a key with no state: nothing, anywhere */
                    assert_int_equal(end, -2);
                    assert_int_equal(lb, 0);
                    continue;
                }
                uint64_t ns = cas_store_ttl(h, key);
                uint64_t us = mode == 1 ? 7 * 1000000
                                        : ns / 1000 + (ns % 1000 != 0);
                if (us == 0)
                    us = 1;
                if (mode == 2) { /* no expiry, as the C step's PERSIST */
                    if (end != -1)
                        fail_msg("%s, case %zu: PEXPIRETIME %lld under "
                                 "no_ttl", policies[p], i, end);
                } else if (end == -2 &&
                           (t1 >= t0 + us + 1000 ||
                            (mode == 0 && cases[i].take > 0 &&
                             t1 >= t_take + us_take + 1000))) {
                    continue; /* gone, but in its time (or the take's) */
                } else if (end <= 0 || (uint64_t)end * 1000 < t0 + us + 1000 ||
                           (uint64_t)end * 1000 > t1 + us + 2000) {
                    fail_msg("%s, case %zu, mode %d: expiry at %lld ms, the "
                             "C step's ttl %llu ns, Redis's TIME %llu..%llu "
                             "us", policies[p], i, mode, end,
                             (unsigned long long)ns, (unsigned long long)t0,
                             (unsigned long long)t1);
                }
                if (la != lb || memcmp(a, b, la) != 0)
                    fail_msg("%s, case %zu, mode %d: %zu bytes in C, %zu on "
                             "Redis, or others", policies[p], i, mode, la, lb);
            }
            rate_limiter_free(lc);
            rate_limiter_free(lr);
            rate_store_free(cs);
        }
        assert_int_equal(rate_store_redis_status(rs, &st1), RATE_OK);
        assert_int_equal(st1.lean_adjustments - st0.lean_adjustments,
                         adjusts);
        assert_int_equal(st1.declined_adjustments, st0.declined_adjustments);
        drop_store(rs);
    }
    redisFree(c);
}

/* Refunds and penalties of the policies the lean scripts decide are one
 * script call each: counted by the store as the scripts', and Redis ran no
 * compare-and-set script (its HGET) and no HMGET of the client's own
 * (commandstats: the scripts' HMGET counts once per call).  Composites and
 * sliding windows still take the C step (declined, counted so). */
static void adjustments_take_one_round_trip(void **state)
{
    (void)state;
    static const char *lean[] = {"token-bucket 10/s burst=5",
                                 "leaky-bucket 10/s capacity=5",
                                 "fixed-window 5/s"};
    rate_store_t *rs = redis_store("adj1:", true, 0);
    redisContext *c = raw();
    for (size_t p = 0; p < 4; p++) {
        const char *text = p < 3 ? lean[p]
                                 : "token-bucket 10/s burst=5; "
                                   "fixed-window 30/m";
        rate_limiter_t *l = limiter_of(text, rs);
        char warm[8];
        snprintf(warm, sizeof warm, "w%zu", p);
        assert_true(at(l, warm, SEC, 1, 0).allowed); /* the record */
        rate_redis_status_t st0, st1;
        assert_int_equal(rate_store_redis_status(rs, &st0), RATE_OK);
        freeReplyObject(redisCommand(c, "CONFIG RESETSTAT"));
        uint64_t t = 2 * SEC;
        for (int i = 0; i < 20; i++) {
            char key[8];
            snprintf(key, sizeof key, "k%zu-%d", p, i % 3);
            t += 10 * MS;
            assert_int_equal(rate_limiter_penalize_at(l, key, strlen(key),
                                                      1 + (uint64_t)(i % 3), t),
                             RATE_OK);
            assert_int_equal(rate_limiter_refund_at(l, key, strlen(key),
                                                    (uint64_t)(i % 4), t),
                             RATE_OK);
        }
        assert_int_equal(rate_store_redis_status(rs, &st1), RATE_OK);
        uint64_t scripted = st1.lean_adjustments - st0.lean_adjustments,
                 declined = st1.declined_adjustments - st0.declined_adjustments;
        long long hget = calls_of(c, "hget"), hmget = calls_of(c, "hmget"),
                  calls = calls_of(c, "fcall") + calls_of(c, "evalsha");
        if (p < 3 ? scripted != 40 || declined != 0 || hget != 0 ||
                        hmget != 40 || calls != 40
                  : scripted != 0 || declined != 40 || hget < 40)
            fail_msg("%s: 40 changes, %llu scripted, %llu declined; %lld "
                     "FCALL/EVALSHA, %lld HMGET, %lld HGET", text,
                     (unsigned long long)scripted,
                     (unsigned long long)declined, calls, hmget, hget);
        rate_limiter_free(l);
    }
    redisFree(c);
    drop_store(rs);
}

/* What n hammers have admitted so far. */
static uint64_t hammers_admitted(hot_t *h, int n)
{
    uint64_t sum = 0;
    for (int i = 0; i < n; i++)
        sum += atomic_load(&h[i].admitted);
    return sum;
}

/* A hot key that other clients' scripted decisions change all the time
 * (threads on a store of their own: another connection, as another nginx
 * worker would be), while refunds and penalties run on it: none comes
 * back RATE_ECONFLICT, even with a single retry allowed, since each is one
 * script that cannot lose.  (Through the C step, load and compare-and-set,
 * most lost: see docs/async.md.)  hot_hammer: redis_fixture.h. */
static void refunds_do_not_lose_to_scripted_decisions(void **state)
{
    (void)state;
    enum { HAMMERS = 3, CHANGES = 400 };
    const char *text = "token-bucket 1000000/s burst=1000000";
    rate_store_t *hs = redis_store("hot:", false, 0);
    rate_store_t *rs = redis_store("hot:", false, 0);
    rate_limiter_config_t cfg = {0};
    cfg.store = rs;
    cfg.max_retries = 1;
    rate_limiter_t *l = limiter_cfg(text, cfg);
    hot_t h[HAMMERS];
    pthread_t th[HAMMERS];
    for (int i = 0; i < HAMMERS; i++) {
        h[i].l = limiter_of(text, hs);
        atomic_init(&h[i].stop, false);
        atomic_init(&h[i].admitted, 0);
        pthread_create(&th[i], NULL, hot_hammer, &h[i]);
    }
    /* the hammers at work first */
    uint64_t before = 0;
    WAIT_UNTIL((before = hammers_admitted(h, HAMMERS)) >= 20 * HAMMERS,
               TEST_WAIT_S);
    rate_redis_status_t st0, st1;
    assert_int_equal(rate_store_redis_status(rs, &st0), RATE_OK);
    int conflicts = 0, others = 0, changes = 0;
    /* CHANGES at least, and on until the hammers have admitted 20 more
     * meanwhile (a loaded machine may hold their threads back a while) */
    for (uint64_t now = before; changes < 100 * CHANGES &&
                                (changes < CHANGES || now < before + 20);
         changes++) {
        int rc = changes % 4 == 3 ? rate_limiter_penalize(l, "hot", 3, 1)
                                  : rate_limiter_refund(l, "hot", 3, 1);
        conflicts += rc == RATE_ECONFLICT;
        others += rc != RATE_OK && rc != RATE_ECONFLICT;
        now = 0;
        for (int i = 0; i < HAMMERS; i++)
            now += atomic_load(&h[i].admitted);
    }
    assert_int_equal(rate_store_redis_status(rs, &st1), RATE_OK);
    uint64_t decisions = 0;
    for (int i = 0; i < HAMMERS; i++) {
        atomic_store(&h[i].stop, true);
        pthread_join(th[i], NULL);
        decisions += h[i].admitted;
        rate_limiter_free(h[i].l);
    }
    print_message("%d changes, %d conflicts, %d other errors, %llu scripted "
                  "decisions admitted meanwhile\n", changes, conflicts, others,
                  (unsigned long long)(decisions - before));
    assert_true(before >= 20 * HAMMERS);
    assert_true(decisions >= before + 20); /* the key changed under them */
    assert_int_equal(others, 0);
    assert_int_equal(conflicts, 0);
    assert_int_equal(st1.lean_adjustments - st0.lean_adjustments,
                     (uint64_t)changes);
    rate_limiter_free(l);
    rate_store_free(hs);
    drop_store(rs);
}

/* A shadow limiter on Redis keeps its own state (PREFIX s{KEY}) and never
 * touches the enforced one (PREFIX {KEY}): its decisions, refunds,
 * penalties and resets alike.  The policy records are PREFIX p{HEX}, kept
 * with no expiry while states expire. */
static void shadow_state_and_policy_records(void **state)
{
    (void)state;
    rate_store_t *rs = redis_store("sh:", false, 0);
    rate_limiter_config_t cfg = {0};
    cfg.store = rs;
    rate_limiter_t *enforced = limiter_cfg("fixed-window 2/h", cfg);
    cfg.shadow = true;
    rate_limiter_t *shadow = limiter_cfg("sliding-log 3/h", cfg);
    redisContext *c = raw();
    rate_decision_t d;
    for (int i = 0; i < 5; i++) { /* shadowed: all let through */
        d = at(shadow, "k", SEC, 1, 0);
        assert_true(d.allowed);
        assert_int_equal(d.shadow, i >= 3);
    }
    assert_int_equal(redis_int(c, "EXISTS", "sh:s{k}"), 1);
    assert_int_equal(redis_int(c, "EXISTS", "sh:{k}"), 0);
    /* The enforced limit is untouched: its two permits are all there. */
    assert_true(at(enforced, "k", SEC, 1, 0).allowed);
    assert_true(at(enforced, "k", SEC, 1, 0).allowed);
    assert_false(at(enforced, "k", SEC, 1, 0).allowed);
    redisReply *before = redisCommand(c, "HGET sh:{k} s");
    assert_int_equal(before->type, REDIS_REPLY_STRING);
    /* The shadow's changes are its own too. */
    assert_int_equal(rate_limiter_refund_at(shadow, "k", 1, 3, SEC), RATE_OK);
    d = at(shadow, "k", SEC, 3, 0);
    assert_true(d.allowed);
    assert_false(d.shadow); /* room again: the refund was made */
    assert_int_equal(rate_limiter_penalize_at(shadow, "k", 1, 3, SEC),
                     RATE_OK);
    assert_int_equal(rate_limiter_reset(shadow, "k", 1), RATE_OK);
    assert_int_equal(redis_int(c, "EXISTS", "sh:s{k}"), 0);
    redisReply *after = redisCommand(c, "HGET sh:{k} s");
    assert_int_equal(after->type, REDIS_REPLY_STRING);
    assert_int_equal(after->len, before->len);
    assert_memory_equal(after->str, before->str, before->len);
    freeReplyObject(before);
    freeReplyObject(after);
    assert_false(at(enforced, "k", SEC, 1, 0).allowed);
    /* And the enforced limiter's reset leaves the shadow's state. */
    assert_true(at(shadow, "k", SEC, 1, 0).allowed);
    assert_int_equal(rate_limiter_reset(enforced, "k", 1), RATE_OK);
    assert_int_equal(redis_int(c, "EXISTS", "sh:{k}"), 0);
    assert_int_equal(redis_int(c, "EXISTS", "sh:s{k}"), 1);
    assert_true(redis_int(c, "PTTL", "sh:s{k}") > 0);

    /* Two policies, two records: p{8 lowercase hex digits}, no expiry. */
    redisReply *r = redisCommand(c, "KEYS sh:p{*");
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, 2);
    for (size_t i = 0; i < r->elements; i++) {
        const char *name = r->element[i]->str;
        assert_int_equal(r->element[i]->len, 14);
        assert_int_equal(name[13], '}');
        for (int j = 5; j < 13; j++)
            assert_non_null(strchr("0123456789abcdef", name[j]));
        assert_int_equal(redis_int(c, "PTTL", name), -1);
        redisReply *h = redisCommand(c, "HGET %s s", name);
        assert_int_equal(h->type, REDIS_REPLY_STRING);
        assert_true(h->len > 0);
        freeReplyObject(h);
    }
    freeReplyObject(r);
    redisFree(c);
    rate_limiter_free(enforced);
    rate_limiter_free(shadow);
    drop_store(rs);
}

/* ------------------------------------------------ sliding logs in Lua */

/* A sliding log's state, made here byte by byte: header (t_last, tag, one
 * component, format 3), then count, sum and the entries (time, permits). */
typedef struct entry {
    uint64_t t, n;
} entry_t;

static size_t log_bytes(unsigned char *out, uint32_t tag, uint64_t last,
                        uint32_t count, uint32_t sum, const entry_t *e,
                        size_t ne)
{
    size_t off = 0;
    for (int i = 0; i < 8; i++)
        out[off++] = (unsigned char)(last >> (8 * i));
    for (int i = 0; i < 4; i++)
        out[off++] = (unsigned char)(tag >> (8 * i));
    out[off++] = 1;
    out[off++] = 3;
    for (int i = 0; i < 4; i++)
        out[off++] = (unsigned char)(count >> (8 * i));
    for (int i = 0; i < 4; i++)
        out[off++] = (unsigned char)(sum >> (8 * i));
    for (size_t k = 0; k < ne; k++) {
        for (int i = 0; i < 8; i++)
            out[off++] = (unsigned char)(e[k].t >> (8 * i));
        for (int i = 0; i < 8; i++)
            out[off++] = (unsigned char)(e[k].n >> (8 * i));
    }
    return off;
}

/* The tag of the state at Redis key `name` (HGET name s). */
static uint32_t redis_tag(redisContext *c, const char *name)
{
    redisReply *r = redisCommand(c, "HGET %s s", name);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    assert_true(r->len >= 14);
    const unsigned char *b = (const unsigned char *)r->str;
    uint32_t tag = (uint32_t)b[8] | (uint32_t)b[9] << 8 |
                   (uint32_t)b[10] << 16 | (uint32_t)b[11] << 24;
    freeReplyObject(r);
    return tag;
}

static void redis_put(redisContext *c, const char *name,
                      const unsigned char *st, size_t len)
{
    freeReplyObject(redisCommand(c, "HSET %s v 7 s %b", name, st, len));
}

static bool redis_holds(redisContext *c, const char *name,
                        const unsigned char *st, size_t len)
{
    redisReply *r = redisCommand(c, "HGET %s s", name);
    bool same = r->type == REDIS_REPLY_STRING && r->len == len &&
                memcmp(r->str, st, len) == 0;
    freeReplyObject(r);
    return same;
}

/* The script calls that ran (INFO commandstats: calls less failed_calls,
 * so that a NOSCRIPT or a function not loaded yet, answered by loading it
 * again, which the store does on its own, is not counted as a second
 * round trip): cmd "evalsha" or "fcall". */
static int script_ran(const char *info, const char *cmd)
{
    char pat[64];
    snprintf(pat, sizeof pat, "cmdstat_%s:calls=", cmd);
    const char *ev = strstr(info, pat);
    if (ev == NULL)
        return 0;
    const char *fc = strstr(ev, "failed_calls=");
    const char *eol = strchr(ev, '\n');
    int failed = fc != NULL && (eol == NULL || fc < eol) ? atoi(fc + 13) : 0;
    if (failed != 0)
        print_message("%.*s\n", eol ? (int)(eol - ev) : 80, ev);
    return atoi(ev + strlen(pat)) - failed;
}

/* The lean sliding log at its edges, on today's clock, near zero (t < W:
 * nothing to prune) and near 2^62: a log filled to its limit, entries
 * merged at one time, an entry leaving exactly at t - W (and not 1 ns
 * before), times going back (t_eff is t_last), permits of 0, L and L + 1,
 * a refund cutting the newest entries, a penalty up to the limit; every
 * decision the memory store's field by field, every state the C step's
 * byte for byte (the compare-and-set test store), each one FCALL. */
static void lean_sliding_log_edges(void **state)
{
    (void)state;
    const char *text = "sliding-log 3/1s";
    rate_store_t *rs = script_store("slx:", false), *ms, *cs;
    cas_store_t *h;
    assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
    assert_int_equal(cas_store_new(&cs, &h), RATE_OK);
    rate_limiter_t *lm = limiter_of(text, ms), *lc = limiter_of(text, cs),
                   *lr = limiter_of(text, rs);
    redisContext *c = raw();
    /* op: 0 a decision, 1 a refund, 2 a penalty; at base + dt */
    static const struct {
        int64_t dt;
        uint64_t n;
        int op;
    } steps[] = {
        {0, 1, 0},       {0, 1, 0},   {1, 1, 0},   {1, 1, 0},   /* full */
        {5, 0, 0},       {-3, 1, 0},  {SEC - 1, 1, 0}, /* 1 ns short */
        {SEC, 1, 0},     {SEC, 2, 0}, {SEC, 4, 0}, {SEC, 3, 0},
        {SEC + 1, 1, 0}, {SEC + 1, 1, 1}, {SEC + 2, 2, 0},
        {SEC + 2, 3, 1}, {SEC + 3, 5, 2}, {SEC + 3, 1, 0},
        {2 * SEC + 1, 2, 1}, {2 * SEC + 1, 1, 2}, {2 * SEC + 2, 0, 0},
        {3 * SEC + 3, 3, 0}, {4 * SEC + 3, 3, 0}, {9 * SEC, 0, 1},
    };
    const uint64_t bases[] = {UINT64_C(1764590000) * SEC + 123456789, 7,
                              (UINT64_C(1) << 62) + 999};
    rate_redis_status_t s0, s1;
    at(lr, "warm", SEC, 1, 0); /* the lean scripts' library loaded */
    assert_int_equal(rate_store_redis_status(rs, &s0), RATE_OK);
    freeReplyObject(redisCommand(c, "CONFIG RESETSTAT"));
    unsigned decisions = 0, changes = 0, allowed = 0;
    for (size_t b = 0; b < sizeof bases / sizeof bases[0]; b++) {
        char key[8], name[32];
        snprintf(key, sizeof key, "e%zu", b);
        snprintf(name, sizeof name, "slx:{%s}", key);
        for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
            uint64_t t = bases[b] + (uint64_t)steps[i].dt, n = steps[i].n;
            if (steps[i].dt < 0 && bases[b] < (uint64_t)-steps[i].dt)
                t = 0;
            if (steps[i].op == 0) {
                rate_decision_t x, y, z;
                assert_int_equal(rate_limiter_check_at(lm, key, strlen(key),
                                                       n, 0, t, &x), RATE_OK);
                assert_int_equal(rate_limiter_check_at(lc, key, strlen(key),
                                                       n, 0, t, &y), RATE_OK);
                assert_int_equal(rate_limiter_check_at(lr, key, strlen(key),
                                                       n, 0, t, &z), RATE_OK);
                expect_same(&x, &y, text, (int)i, t, n, (uint64_t)0);
                expect_same(&x, &z, text, (int)i, t, n, (uint64_t)0);
                decisions++;
                allowed += z.allowed;
            } else {
                int (*f)(rate_limiter_t *, const char *, size_t, uint64_t,
                         uint64_t) = steps[i].op == 1 ? rate_limiter_refund_at
                                                      : rate_limiter_penalize_at;
                assert_int_equal(f(lm, key, strlen(key), n, t), RATE_OK);
                assert_int_equal(f(lc, key, strlen(key), n, t), RATE_OK);
                assert_int_equal(f(lr, key, strlen(key), n, t), RATE_OK);
                changes++;
            }
            expect_same_state(c, name, h, key, text,
                              steps[i].op == 0   ? "check"
                              : steps[i].op == 1 ? "refund"
                                                 : "penalty",
                              (int)i);
        }
    }
    assert_int_equal(rate_store_redis_status(rs, &s1), RATE_OK);
    assert_int_equal(s1.lean_decisions - s0.lean_decisions, decisions);
    assert_int_equal(s1.lean_evalsha, s0.lean_evalsha); /* all by FCALL */
    assert_int_equal(s1.lean_adjustments - s0.lean_adjustments, changes);
    assert_int_equal(s1.declined + s1.declined_adjustments,
                     s0.declined + s0.declined_adjustments);
    assert_int_equal(calls_of(c, "fcall"), decisions + changes);
    assert_int_equal(calls_of(c, "evalsha"), 0);
    assert_true(allowed > decisions / 3 && allowed < decisions);
    redisFree(c);
    rate_limiter_free(lm);
    rate_limiter_free(lc);
    rate_limiter_free(lr);
    rate_store_free(ms);
    rate_store_free(cs);
    drop_store(rs);
}

/* A sliding log's entries are checked as the C step checks them: only
 * the constant-time checks (count <= sum <= L, the length) on every read,
 * all the entries in the window before an admission writes them back.
 * Over tampered logs the lean script and the general one answer exactly
 * as the C step (here the compare-and-set test store, given the same
 * bytes) or decline: every state the C step reports RATE_ECORRUPT is
 * never admitted and never written, on Redis as in C. */
static void tampered_logs_on(bool general)
{
    const char *text = "sliding-log 5/s";
    rate_store_t *rs = script_store("tlog:", general), *cs;
    cas_store_t *ch;
    assert_int_equal(cas_store_new(&cs, &ch), RATE_OK);
    rate_limiter_t *lr = limiter_of(text, rs), *lc = limiter_of(text, cs);
    redisContext *c = raw();
    /* Honest states on both first: the key exists, and both tag alike. */
    assert_true(at(lr, "k", SEC, 1, 0).allowed);
    assert_true(at(lc, "k", SEC, 1, 0).allowed);
    uint32_t tag = redis_tag(c, "tlog:{k}");
    const uint64_t L = 5, big = UINT64_C(1) << 63;
    const uint64_t last = 3200 * MS;
    struct {
        const char *what;
        uint64_t last;
        uint32_t count, sum;
        entry_t e[4];
        size_t ne;
    } cases[] = {
        {"honest", last, 3, 4, {{3000 * MS, 1}, {3100 * MS, 2}, {last, 1}}, 3},
        {"permits 0", last, 3, 3, {{3000 * MS, 2}, {3100 * MS, 0}, {last, 1}},
         3},
        {"out of order", last, 3, 4,
         {{3100 * MS, 1}, {3000 * MS, 2}, {last, 1}}, 3},
        {"after t_last", last, 3, 4,
         {{3000 * MS, 1}, {3100 * MS, 2}, {3500 * MS, 1}}, 3},
        {"sum too big", last, 3, 5, {{3000 * MS, 1}, {3100 * MS, 2}, {last, 1}},
         3},
        {"sum too small", last, 3, 3,
         {{3000 * MS, 1}, {3100 * MS, 2}, {last, 1}}, 3},
        {"count above sum", last, 3, 2,
         {{3000 * MS, 1}, {3100 * MS, 2}, {last, 1}}, 3},
        {"sum above L", last, 3, 6,
         {{3000 * MS, 1}, {3100 * MS, 2}, {last, 3}}, 3},
        {"permits past 2^32", last, 3, 3,
         {{3000 * MS, (UINT64_C(1) << 32) + 1}, {3100 * MS, 1}, {last, 1}}, 3},
        {"permits past 2^50", last, 3, 3,
         {{3000 * MS, (UINT64_C(1) << 52) + 1}, {3100 * MS, 1}, {last, 1}}, 3},
        {"an entry short", last, 4, 4,
         {{3000 * MS, 1}, {3100 * MS, 2}, {last, 1}}, 3},
        {"an entry over", last, 2, 4,
         {{3000 * MS, 1}, {3100 * MS, 2}, {last, 1}}, 3},
        {"time past 2^63", last, 3, 4,
         {{3000 * MS, 1}, {big + 5, 2}, {last, 1}}, 3},
        {"pruned past the sum", last, 3, 4,
         {{2000 * MS, 9}, {3100 * MS, 1}, {last, 1}}, 3},
        {"pruned in disorder", last, 3, 4,
         {{3100 * MS, 1}, {1000 * MS, 2}, {last, 1}}, 3},
        {"live below the window", last, 3, 4,
         {{1000 * MS, 1}, {3100 * MS, 2}, {500 * MS, 1}}, 3},
        {"newest at 0", last, 2, 2, {{0, 1}, {0, 1}}, 2},
    };
    const uint64_t times[] = {last, 3250 * MS, 4050 * MS, 4150 * MS,
                              4250 * MS, 9 * SEC, 1000 * MS};
    const uint64_t permits[] = {0, 1, 2, 5, 6};
    unsigned char st[128];
    unsigned corrupt = 0, checked = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = log_bytes(st, tag, cases[i].last, cases[i].count,
                               cases[i].sum, cases[i].e, cases[i].ne);
        for (size_t ti = 0; ti < sizeof times / sizeof times[0]; ti++) {
            for (size_t ni = 0; ni < sizeof permits / sizeof permits[0];
                 ni++) {
                uint64_t t = times[ti], n = permits[ni];
                for (int bool_call = 0; bool_call < 2; bool_call++) {
                    redis_put(c, "tlog:{k}", st, len);
                    cas_store_poke(ch, "k", st, len);
                    rate_decision_t a, b;
                    if (bool_call) {
                        bool x = rate_try_acquire_at(lc, "k", n, t);
                        bool y = rate_try_acquire_at(lr, "k", n, t);
                        if (x != y)
                            fail_msg("%s, t=%llu n=%llu: bool call %d in C, "
                                     "%d on Redis", cases[i].what,
                                     (unsigned long long)t,
                                     (unsigned long long)n, x, y);
                        continue;
                    }
                    assert_int_equal(
                        rate_limiter_check_at(lc, "k", 1, n, 0, t, &a),
                        RATE_OK);
                    assert_int_equal(
                        rate_limiter_check_at(lr, "k", 1, n, 0, t, &b),
                        RATE_OK);
                    expect_same(&a, &b, cases[i].what, (int)(ti * 10 + ni),
                                t, n, 0);
                    checked++;
                    if (a.error == RATE_ECORRUPT) {
                        corrupt++;
                        if (!redis_holds(c, "tlog:{k}", st, len))
                            fail_msg("%s, t=%llu n=%llu: written over",
                                     cases[i].what, (unsigned long long)t,
                                     (unsigned long long)n);
                    }
                    if (i == 0)
                        assert_int_not_equal(a.reason,
                                             RATE_REASON_STORE_ERROR);
                }
            }
        }
    }
    assert_int_equal(checked, 17 * 7 * 5);
    assert_true(corrupt > 50); /* seen: the cases meant to be */
    (void)L;

    /* A tampered sum only makes a denial stricter: it is answered in
     * Redis, in one round trip (no load of the client's after a decline),
     * as C answers it. */
    size_t len = log_bytes(st, tag, last, 3, 5, cases[0].e, 3);
    redis_put(c, "tlog:{k}", st, len);
    cas_store_poke(ch, "k", st, len);
    freeReplyObject(redisCommand(c, "CONFIG RESETSTAT"));
    for (int i = 0; i < 20; i++) {
        rate_decision_t a = at(lc, "k", last, 1, 0), b = at(lr, "k", last, 1, 0);
        expect_same(&a, &b, "sum too big, denied in Lua", i, last, 1, 0);
        assert_false(b.allowed);
        assert_int_equal(b.reason, RATE_REASON_LIMITED);
    }
    redisReply *r = redisCommand(c, "INFO commandstats");
    const char *hm = strstr(r->str, "cmdstat_hmget:calls=");
    assert_non_null(hm);
    assert_int_equal(script_ran(r->str, general ? "evalsha" : "fcall"), 20);
    assert_int_equal(atoi(hm + 20), 20);
    freeReplyObject(r);
    redisFree(c);
    rate_limiter_free(lr);
    rate_limiter_free(lc);
    rate_store_free(cs);
    drop_store(rs);
}

static void tampered_logs_are_never_admitted(void **state)
{
    (void)state;
    for (int general = 0; general < 2; general++)
        tampered_logs_on(general);
}

/* A full log of RATE_SLIDING_LOG_MAX entries: a denial is answered in Lua
 * (one FCALL of the lean script, or one EVALSHA of the general one, its
 * own HMGET) without reading the entries it does not prune; an admission
 * that prunes the oldest checks and rewrites the rest; both as C answers
 * them. */
static void full_log_on(bool general)
{
    const char *text = "sliding-log 10000/10s";
    const char *cmd = general ? "evalsha" : "fcall";
    rate_store_t *rs = script_store("flog:", general), *cs;
    cas_store_t *ch;
    assert_int_equal(cas_store_new(&cs, &ch), RATE_OK);
    rate_limiter_t *lr = limiter_of(text, rs), *lc = limiter_of(text, cs);
    redisContext *c = raw();
    assert_true(at(lr, "k", SEC, 1, 0).allowed);
    assert_true(at(lc, "k", SEC, 1, 0).allowed);
    uint32_t tag = redis_tag(c, "flog:{k}");
    const size_t N = RATE_SLIDING_LOG_MAX;
    entry_t *e = malloc(N * sizeof *e);
    unsigned char *st = malloc(32 + N * 16);
    for (size_t i = 0; i < N; i++)
        e[i] = (entry_t){1000 * SEC + i * MS, 1};
    uint64_t last = e[N - 1].t;
    size_t len = log_bytes(st, tag, last, (uint32_t)N, (uint32_t)N, e, N);
    redis_put(c, "flog:{k}", st, len);
    cas_store_poke(ch, "k", st, len);
    freeReplyObject(redisCommand(c, "CONFIG RESETSTAT"));
    for (int i = 0; i < 10; i++) {
        rate_decision_t a = at(lc, "k", last, 1, 0), b = at(lr, "k", last, 1, 0);
        expect_same(&a, &b, "full log", i, last, 1, 0);
        assert_false(b.allowed);
        assert_int_equal(b.retry_after_ns, 10 * SEC - (N - 1) * MS);
    }
    redisReply *r = redisCommand(c, "INFO commandstats");
    assert_int_equal(script_ran(r->str, cmd), 10);
    assert_int_equal(atoi(strstr(r->str, "cmdstat_hmget:calls=") + 20), 10);
    freeReplyObject(r);
    /* Each a millisecond on: the oldest entry leaves, one comes. */
    for (uint64_t k = 0; k < 5; k++) {
        uint64_t t = 1010 * SEC + k * MS;
        rate_decision_t a = at(lc, "k", t, 1, 0), b = at(lr, "k", t, 1, 0);
        expect_same(&a, &b, "full log, admitted", (int)k, t, 1, 0);
        assert_true(b.allowed);
    }
    r = redisCommand(c, "INFO commandstats");
    assert_int_equal(script_ran(r->str, cmd), 15);
    assert_int_equal(atoi(strstr(r->str, "cmdstat_hmget:calls=") + 20), 15);
    freeReplyObject(r);
    r = redisCommand(c, "HGET flog:{k} s");
    assert_int_equal(r->len, len);
    freeReplyObject(r);
    free(e);
    free(st);
    redisFree(c);
    rate_limiter_free(lr);
    rate_limiter_free(lc);
    rate_store_free(cs);
    drop_store(rs);
}

static void full_log_in_lua(void **state)
{
    (void)state;
    for (int general = 0; general < 2; general++)
        full_log_on(general);
}

/* ------------------------------------------------------- a shared limit */

#define PROCS 3
#define THREADS 3

static void *hammer(void *arg)
{
    rate_limiter_t *l = arg;
    uint64_t ok = 0, end = rate_clock_monotonic_ns() + 300 * MS;
    while (rate_clock_monotonic_ns() < end)
        ok += rate_try_acquire(l, "shared", 1);
    return (void *)(uintptr_t)ok;
}

static void shared_limit_across_processes(void **state)
{
    (void)state;
    int fds[PROCS][2];
    uint64_t t0 = rate_clock_monotonic_ns();
    for (int p = 0; p < PROCS; p++) {
        assert_int_equal(pipe(fds[p]), 0);
        if (fork() == 0) {
            rate_store_t *rs = redis_store("shared:", false, 0);
            rate_limiter_t *l = limiter_of("token-bucket 200/s burst=20", rs);
            pthread_t th[THREADS];
            uint64_t total = 0;
            for (int i = 0; i < THREADS; i++)
                pthread_create(&th[i], NULL, hammer, l);
            for (int i = 0; i < THREADS; i++) {
                void *r;
                pthread_join(th[i], &r);
                total += (uint64_t)(uintptr_t)r;
            }
            rate_stats_t st;
            rate_limiter_stats(l, &st);
            if (write(fds[p][1], &total, sizeof total) != sizeof total)
                _exit(1);
            _exit(st.store_errors == 0 ? 0 : 2);
        }
        close(fds[p][1]);
    }
    uint64_t total = 0;
    for (int p = 0; p < PROCS; p++) {
        uint64_t n = 0;
        int status;
        assert_int_equal(read(fds[p][0], &n, sizeof n), sizeof n);
        close(fds[p][0]);
        wait(&status);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        total += n;
    }
    uint64_t elapsed = rate_clock_monotonic_ns() - t0;
    uint64_t bound = 20 + elapsed * 200 / SEC + 1;
    if (total > bound || total < 20)
        fail_msg("admitted %llu, bound %llu", (unsigned long long)total,
                 (unsigned long long)bound);
    redisContext *c = raw();
    freeReplyObject(redisCommand(c, "DEL shared:{shared}"));
    redisFree(c);
}

/* Many threads on shared connections: each must get its own replies.
 * Thread i asks 60 times at one instant on its own key under its own
 * policy (limit 10 + i % 40), so it must see exactly that many admitted.
 * The threads start together (go), to crowd the connections. */
#define MANY 16
#define CROWD 160 /* more callers on one connection than its bells' bits */
typedef struct own {
    rate_store_t *store;
    pthread_barrier_t *go;
    int i, admitted, errors;
} own_t;

static void *own_key(void *arg)
{
    own_t *o = arg;
    char text[48], key[16];
    snprintf(text, sizeof text, "fixed-window %d/h", 10 + o->i % 40);
    snprintf(key, sizeof key, "own%d", o->i);
    rate_policy_t *p = NULL;
    rate_policy_parse(text, &p, NULL, 0);
    rate_limiter_config_t cfg = {0};
    rate_limiter_t *l = NULL;
    cfg.policy = p;
    cfg.store = o->store;
    rate_limiter_new(&cfg, &l);
    pthread_barrier_wait(o->go);
    for (int k = 0; k < 60; k++) {
        rate_decision_t d;
        rate_limiter_check_at(l, key, strlen(key), 1, 0, 7 * SEC, &d);
        o->admitted += d.allowed;
        o->errors += d.reason == RATE_REASON_STORE_ERROR;
    }
    rate_limiter_free(l);
    rate_policy_free(p);
    return NULL;
}

/* n threads on one store, each on its own key and limit: each must get
 * exactly its own answers back through the shared connections. */
static void own_keys_on(rate_store_t *rs, int n)
{
    pthread_t th[CROWD];
    own_t o[CROWD];
    pthread_barrier_t go;
    assert_true(n <= CROWD);
    pthread_barrier_init(&go, NULL, (unsigned)n);
    for (int i = 0; i < n; i++) {
        o[i] = (own_t){rs, &go, i, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, own_key, &o[i]), 0);
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
    for (int i = 0; i < n; i++) {
        assert_int_equal(o[i].errors, 0);
        assert_int_equal(o[i].admitted, 10 + i % 40);
    }
}

static void replies_reach_their_callers(void **state)
{
    (void)state;
    rate_store_t *rs = redis_store("own:", true, 0);
    own_keys_on(rs, MANY);
    drop_store(rs);
}

/* More callers on one connection than it has ways to wake them apart
 * (sync.c's bells: 128 bits): callers woken for another's bit must sleep
 * again and still get their own replies, and none may sleep through its
 * own. */
static void crowd_on_one_connection(void **state)
{
    (void)state;
    /* 30 s a command: no loaded machine's slack can fail a call */
    rate_redis_options_t o = {.prefix = "crowd:", .no_ttl = true,
                              .pool_size = 1,
                              .command_timeout_ns = 30 * SEC};
    rate_store_t *rs = NULL;
    char err[256] = "";
    if (rate_store_redis_new(url, &o, &rs, err, sizeof err) != RATE_OK)
        fail_msg("redis store: %s", err);
    own_keys_on(rs, CROWD);
    drop_store(rs);
}

/* --------------------------------------------------------------- faults */

static void redis_down_and_back(void **state)
{
    (void)state;
    const uint64_t timeout = 200 * MS;
    rate_store_t *rs = redis_store("fault:", true, timeout);
    rate_limiter_config_t cfg = {0};
    cfg.store = rs;
    rate_limiter_t *closed = limiter_cfg("fixed-window 2/h", cfg);
    cfg.on_store_error = RATE_FAIL_OPEN;
    rate_limiter_t *open = limiter_cfg("fixed-window 2/h", cfg);
    cfg.on_store_error = RATE_FAIL_FALLBACK;
    rate_limiter_t *fallback = limiter_cfg("fixed-window 2/h", cfg);
    assert_true(at(closed, "k", SEC, 1, 0).allowed);

    stop_server();
    for (int i = 0; i < 3; i++) {
        uint64_t t0 = rate_clock_monotonic_ns();
        rate_decision_t d = at(closed, "k", SEC, 1, 0);
        uint64_t took = rate_clock_monotonic_ns() - t0;
        assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
        assert_false(d.allowed);
        /* Never longer than the timeout (plus 1 s of scheduling slack). */
        if (took > timeout + SEC)
            fail_msg("a call took %llu ms", (unsigned long long)(took / MS));
        d = at(open, "k", SEC, 1, 0);
        assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
        assert_true(d.allowed);
    }
    int ok = 0;
    for (int i = 0; i < 3; i++) {
        rate_decision_t d = at(fallback, "k", SEC, 1, 0);
        assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
        ok += d.allowed;
    }
    assert_int_equal(ok, 2); /* the insurance limiter enforces 2/h */

    start_server(NULL, NULL); /* same port, empty: recovers by itself */
    rate_decision_t d;
    WAIT_UNTIL((d = at(closed, "k", SEC, 1, 0)).reason !=
                   RATE_REASON_STORE_ERROR,
               TEST_WAIT_S);
    assert_int_not_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_true(d.allowed);
    rate_limiter_free(closed);
    rate_limiter_free(open);
    rate_limiter_free(fallback);
    rate_store_free(rs);
}

/* Many callers on one shared connection while Redis dies and comes back:
 * every call returns (a decision or a store error) within the timeout's
 * reach, none hangs or crashes, and all of them get answers again after. */
typedef struct storm {
    rate_limiter_t *lim;
    int i;
    atomic_bool *stop;
    uint64_t longest_ns;
    int answered, errors;
    atomic_int answered_after; /* read by the main thread while it runs */
    atomic_bool *restarted;
} storm_t;

/* Every caller's answers and store errors so far (the main thread waits
 * on them). */
static atomic_uint storm_answers, storm_errors;

static void *storm_caller(void *arg)
{
    storm_t *s = arg;
    char key[16];
    snprintf(key, sizeof key, "storm%d", s->i);
    while (!atomic_load(s->stop)) {
        bool after = atomic_load(s->restarted);
        rate_decision_t d;
        uint64_t t0 = rate_clock_monotonic_ns();
        assert_int_equal(rate_limiter_check(s->lim, key, strlen(key), 1, 0,
                                            &d),
                         RATE_OK);
        uint64_t took = rate_clock_monotonic_ns() - t0;
        if (took > s->longest_ns)
            s->longest_ns = took;
        if (d.reason == RATE_REASON_STORE_ERROR) {
            s->errors++;
            atomic_fetch_add(&storm_errors, 1);
        } else {
            s->answered++;
            atomic_fetch_add(&storm_answers, 1);
            if (after)
                atomic_fetch_add(&s->answered_after, 1);
        }
    }
    return NULL;
}

static bool storm_all_answered_after(storm_t *s)
{
    for (int i = 0; i < MANY; i++)
        if (atomic_load(&s[i].answered_after) == 0)
            return false;
    return true;
}

static void callers_ride_out_a_restart(void **state)
{
    (void)state;
    const uint64_t timeout = 200 * MS;
    rate_store_t *rs = redis_store("storm:", true, timeout);
    rate_limiter_config_t cfg = {0};
    cfg.store = rs;
    rate_limiter_t *lim = limiter_cfg("token-bucket 1000000/s burst=1000", cfg);
    atomic_bool stop = false, restarted = false;
    pthread_t th[MANY];
    storm_t s[MANY];
    static sched_probe_t probe; /* a failed check leaves its thread on */
    sched_probe_start(&probe);
    atomic_store(&storm_answers, 0);
    atomic_store(&storm_errors, 0);
    for (int i = 0; i < MANY; i++) {
        s[i] = (storm_t){lim, i, &stop, 0, 0, 0, 0, &restarted};
        atomic_init(&s[i].answered_after, 0);
        pthread_create(&th[i], NULL, storm_caller, &s[i]);
    }
    /* The callers at work (20 answers each on average), then the server
     * stopped until they have met the outage (one store error each on
     * average): counts, not times, so that a loaded machine's callers are
     * mid-run in both. */
    assert_true(WAIT_UNTIL(atomic_load(&storm_answers) >= 20 * MANY,
                           TEST_WAIT_S));
    stop_server(); /* mid-run: requests are in flight */
    assert_true(WAIT_UNTIL(atomic_load(&storm_errors) >= MANY, TEST_WAIT_S));
    start_server(NULL, NULL);
    atomic_store(&restarted, true);
    /* Until every caller has been answered again (past the reconnect
     * backoff and the breaker's cool-down): a loaded machine may take a
     * while to run all of them. */
    WAIT_UNTIL(storm_all_answered_after(s), TEST_WAIT_S);
    atomic_store(&stop, true);
    for (int i = 0; i < MANY; i++)
        pthread_join(th[i], NULL);
    uint64_t sched = sched_probe_stop(&probe);
    /* Every call within its timeout (a reconnection made on its behalf
     * included), plus 500 ms, plus three times the worst delay the
     * scheduler gave a sleeping thread meanwhile (a call wakes up a few
     * times; a loaded 2-core machine left one off its core for 1.4 s). */
    uint64_t bound = timeout + 500 * MS + 3 * sched;
    int errors = 0;
    for (int i = 0; i < MANY; i++) {
        errors += s[i].errors;
        if (atomic_load(&s[i].answered_after) == 0)
            fail_msg("caller %d got no answer in %d s after the restart", i,
                     TEST_WAIT_S);
        if (s[i].longest_ns > bound)
            fail_msg("caller %d waited %llu ms, past %llu ms (the "
                     "scheduler's worst delay: %llu ms)", i,
                     (unsigned long long)(s[i].longest_ns / MS),
                     (unsigned long long)(bound / MS),
                     (unsigned long long)(sched / MS));
    }
    assert_true(errors > 0); /* the outage was seen */
    rate_limiter_free(lim);
    drop_store(rs);
}

/* ------------------------------------------------------------ bad input */

static void bad_urls_hosts_and_passwords(void **state)
{
    (void)state;
    struct {
        const char *url;
        int rc;
        const char *needle;
    } cases[] = {
        {"http://127.0.0.1:6379", RATE_EINVAL, "is not redis://"},
        {"redis://", RATE_EINVAL, "missing or too long host"},
        {"redis://127.0.0.1:0", RATE_EINVAL, "port"},
        {"redis://127.0.0.1:70000", RATE_EINVAL, "port"},
        {"redis://127.0.0.1:65536", RATE_EINVAL, "port"},
        {"redis://127.0.0.1:63x9", RATE_EINVAL, "port"},
        {"redis://127.0.0.1:6379/db1", RATE_EINVAL, "database"},
        {"redis://pass@127.0.0.1", RATE_EINVAL, "credentials"},
        {"redis://[::1", RATE_EINVAL, "unclosed"},
        {"unix://relative/path", RATE_EINVAL, "absolute"},
        {"unix:///nonexistent/redis.sock", RATE_ESTORE, "cannot connect"},
    };
    rate_store_t *s = (rate_store_t *)1;
    char err[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = '\0';
        int rc = rate_store_redis_new(cases[i].url, NULL, &s, err, sizeof err);
        if (rc != cases[i].rc || s != NULL ||
            strstr(err, cases[i].needle) == NULL)
            fail_msg("'%s': rc=%d err='%s'", cases[i].url, rc, err);
    }
    /* Nothing listens on a port we just found free. */
    char unreachable[64];
    snprintf(unreachable, sizeof unreachable, "redis://127.0.0.1:%d",
             redis_test_free_port());
    rate_redis_options_t o = {0};
    o.connect_timeout_ns = 200 * MS;
    assert_int_equal(rate_store_redis_new(unreachable, &o, &s, err, sizeof err),
                     RATE_ESTORE);
    assert_non_null(strstr(err, "cannot connect"));
    assert_int_equal(rate_store_redis_new(NULL, NULL, &s, err, sizeof err),
                     RATE_EINVAL);
    assert_int_equal(rate_store_redis_drop(NULL), RATE_EINVAL);
    /* A prefix with a brace would be the keys' hash tag: refused. */
    for (int i = 0; i < 2; i++) {
        rate_redis_options_t bp = {0};
        bp.prefix = i == 0 ? "app{x}:" : "app}";
        err[0] = '\0';
        assert_int_equal(rate_store_redis_new(unreachable, &bp, &s, err,
                                              sizeof err),
                         RATE_EINVAL);
        assert_null(s);
        assert_non_null(strstr(err, "holds a brace"));
    }
    /* A module mode that is none of the three. */
    rate_redis_options_t bm = {0};
    bm.module = (rate_redis_module_t)7;
    bm.lazy_connect = true;
    assert_int_equal(rate_store_redis_new(unreachable, &bm, &s, err,
                                          sizeof err),
                     RATE_EINVAL);
    assert_null(s);
    assert_non_null(strstr(err, "module 7"));

    /* A server with a password: a wrong one is refused, the right works. */
    stop_server();
    start_server("--requirepass", "s3cret");
    char with[96];
    snprintf(with, sizeof with, "redis://:wrong@127.0.0.1:%d/0", port);
    assert_int_equal(rate_store_redis_new(with, NULL, &s, err, sizeof err),
                     RATE_ESTORE);
    assert_non_null(strstr(err, "authentication failed"));
    snprintf(with, sizeof with, "redis://default:s3cret@127.0.0.1:%d/3", port);
    assert_int_equal(rate_store_redis_new(with, NULL, &s, err, sizeof err),
                     RATE_OK);
    rate_limiter_t *l = limiter_of("fixed-window 1/h", s);
    assert_true(rate_try_acquire(l, "p", 1));
    assert_false(rate_try_acquire(l, "p", 1));
    rate_limiter_free(l);
    rate_store_free(s);
    stop_server();
    start_server(NULL, NULL);
}

/* The same server over a unix socket: several threads share the pipelined
 * connection there too, and each gets its own answers. */
static void unix_socket(void **state)
{
    (void)state;
    char path[64], sock_url[96], err[256];
    snprintf(path, sizeof path, "/tmp/ratelimit-test-%d.sock", (int)getpid());
    stop_server();
    start_server("--unixsocket", path);
    snprintf(sock_url, sizeof sock_url, "unix://%s", path);
    rate_store_t *s = NULL;
    rate_redis_options_t o = {0};
    o.prefix = "unix:";
    assert_int_equal(rate_store_redis_new(sock_url, &o, &s, err, sizeof err),
                     RATE_OK);
    own_keys_on(s, MANY);
    rate_store_redis_drop(s);
    rate_store_free(s);
    stop_server();
    unlink(path);
    start_server(NULL, NULL);
}

/* Every key under the prefix (KEYS: the tests' namespaces are small). */
static redisReply *keys_of(redisContext *c, const char *prefix)
{
    redisReply *r = redisCommand(c, "KEYS %s*", prefix);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    return r;
}

/* With no_ttl and safety_ttl_ns, each state and shadow state written gets
 * the safety expiry (rounded up to ms) instead of none, through the Lua
 * step (decide), the C step's compare-and-set (a blocking policy, a
 * refund) alike; the policy records get none.  Without safety_ttl_ns,
 * no_ttl keeps none; without no_ttl, safety_ttl_ns changes nothing. */
static void safety_ttl_with_no_ttl(void **state)
{
    (void)state;
    rate_redis_options_t o = {0};
    rate_store_t *rs = NULL;
    char err[256] = "";
    o.prefix = "safe:";
    o.no_ttl = true;
    o.safety_ttl_ns = 60 * SEC - 1; /* rounded up: 60000 ms */
    assert_int_equal(rate_store_redis_new(url, &o, &rs, err, sizeof err),
                     RATE_OK);
    rate_limiter_config_t cfg = {0};
    cfg.store = rs;
    rate_limiter_t *lua = limiter_cfg("token-bucket 3/s burst=3", cfg);
    rate_limiter_t *blk = limiter_cfg("fixed-window 2/h block=1m", cfg);
    cfg.shadow = true;
    rate_limiter_t *sh = limiter_cfg("sliding-log 3/h", cfg);
    redisContext *c = raw();
    uint64_t t0 = redis_time_us(c);
    assert_true(at(lua, "a", SEC, 1, 0).allowed);
    assert_true(at(blk, "b", SEC, 1, 0).allowed);
    assert_true(at(sh, "c", SEC, 1, 0).allowed);
    assert_int_equal(rate_limiter_refund_at(lua, "r", 1, 1, SEC), RATE_OK);
    assert_true(at(lua, "r", SEC, 1, 0).allowed);
    assert_int_equal(rate_limiter_refund_at(lua, "r", 1, 1, SEC), RATE_OK);
    const char *states[] = {"safe:{a}", "safe:{b}", "safe:s{c}", "safe:{r}"};
    for (size_t i = 0; i < 4; i++) {
        long long ms = redis_int(c, "PTTL", states[i]);
        long long since = ttl_since(c, states[i], t0);
        if (ms > 60002 || since < 60000)
            fail_msg("%s: PTTL %lld, %lld ms from before the decisions, "
                     "not 60000", states[i], ms, since);
    }
    redisReply *r = redisCommand(c, "KEYS safe:p{*");
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, 3); /* one record per policy */
    for (size_t i = 0; i < r->elements; i++)
        assert_int_equal(redis_int(c, "PTTL", r->element[i]->str), -1);
    freeReplyObject(r);
    rate_limiter_free(lua);
    rate_limiter_free(blk);
    rate_limiter_free(sh);
    drop_store(rs);

    /* no_ttl alone: no expiry; safety_ttl_ns alone: the reset_after. */
    for (int with_ttl = 0; with_ttl < 2; with_ttl++) {
        o.no_ttl = !with_ttl;
        o.safety_ttl_ns = with_ttl ? 60 * SEC : 0;
        assert_int_equal(rate_store_redis_new(url, &o, &rs, err, sizeof err),
                         RATE_OK);
        rate_limiter_t *l = limiter_of("token-bucket 3/s burst=3", rs);
        rate_limiter_t *b = limiter_of("fixed-window 2/h block=1m", rs);
        t0 = redis_time_us(c);
        assert_true(rate_try_acquire(l, "a", 1));
        assert_true(rate_try_acquire(b, "b", 1));
        long long ma = redis_int(c, "PTTL", "safe:{a}");
        long long mb = redis_int(c, "PTTL", "safe:{b}");
        if (with_ttl ? ma > 1002 || ttl_since(c, "safe:{a}", t0) < 1000 ||
                           mb > 3600002 || ttl_since(c, "safe:{b}", t0) < 60000
                     : ma != -1 || mb != -1)
            fail_msg("no_ttl=%d safety=%d: PTTL %lld and %lld", !with_ttl,
                     with_ttl, ma, mb);
        rate_limiter_free(l);
        rate_limiter_free(b);
        drop_store(rs);
    }
    redisFree(c);
}

/* The name of the first function of the reply r (FUNCTION LIST) that
 * starts with prefix, or NULL. */
static const char *function_named(const redisReply *r, const char *prefix)
{
    if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
        return strncmp(r->str, prefix, strlen(prefix)) == 0 ? r->str : NULL;
    if (r->type != REDIS_REPLY_ARRAY)
        return NULL;
    for (size_t i = 0; i < r->elements; i++) {
        const char *n = function_named(r->element[i], prefix);
        if (n != NULL)
            return n;
    }
    return NULL;
}

/* A lean script keeps the numbers it read from a policy's argument for
 * the next call with the same argument (lean_lib.lua): two policies
 * whose ids collide but whose numbers differ are each decided by their
 * own numbers.  Called by FCALL directly, with one made-up id: a fixed
 * window of 5, then of 1, on fresh keys: 4 then 0 remaining. */
static void lean_numbers_by_policy_not_id(void **state)
{
    (void)state;
    /* Only this store's libraries on the server: an earlier test's,
     * made from other text, would take other arguments. */
    redisContext *c = raw();
    freeReplyObject(redisCommand(c, "FUNCTION FLUSH"));
    rate_store_t *rs = redis_store("ids:", true, 0);
    rate_limiter_t *l = limiter_of("fixed-window 5/1000s", rs);
    at(l, "load", SEC, 1, 0); /* loads the lean scripts' library */
    redisReply *list = redisCommand(c, "FUNCTION LIST");
    const char *fn = function_named(list, "ratelimit_fw_");
    assert_non_null(fn);
    /* the policy's numbers: expiry, id, format, width, limit, window */
    static const struct {
        const char *key, *policy;
        long long remaining;
    } calls[] = {{"ids:{a}", "-1 7 3 8 5 1000000000000", 4},
                 {"ids:{b}", "-1 7 3 8 1 1000000000000", 0},
                 {"ids:{c}", "-1 7 3 8 5 1000000000000", 4},
                 {"ids:{d}", "0 7 3 8 5 1000000000000", 4},
                 {"ids:{d}", "0 7 3 8 1 1000000000000", 0}};
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        redisReply *r = redisCommand(
            c, "FCALL %s 1 %s 1000 0 1 0 0 %s", fn, calls[i].key,
            calls[i].policy);
        assert_int_equal(r->type, REDIS_REPLY_ARRAY);
        if (r->elements != 9)
            fail_msg("call %zu (%s): %zu elements, the first %lld", i, fn,
                     r->elements,
                     r->elements ? r->element[0]->integer : -1LL);
        if (r->element[5]->integer != calls[i].remaining)
            fail_msg("call %zu: %lld remaining, not %lld", i,
                     r->element[5]->integer, calls[i].remaining);
        freeReplyObject(r);
    }
    freeReplyObject(list);
    redisFree(c);
    rate_limiter_free(l);
    drop_store(rs);
}

/* rate_store_redis_touch sets the expiry of every key under the prefix,
 * records too, over several SCAN batches, and of nothing outside it (a
 * glob character in the prefix is taken as itself); later writes set the
 * safety expiry again.  RATE_EINVAL for another store, NULL, or 0. */
static void touch_sets_every_expiry(void **state)
{
    (void)state;
    rate_redis_options_t o = {0};
    rate_store_t *rs = NULL;
    char err[256] = "";
    o.prefix = "to*:";
    o.no_ttl = true;
    o.safety_ttl_ns = 60 * SEC;
    assert_int_equal(rate_store_redis_new(url, &o, &rs, err, sizeof err),
                     RATE_OK);
    rate_limiter_t *l = limiter_of("fixed-window 5/h", rs);
    assert_true(at(l, "k", SEC, 1, 0).allowed);
    redisContext *c = raw();
    /* 2500 more keys in the namespace (no expiry), and two outside it */
    for (int i = 0; i < 2500; i++)
        redisAppendCommand(c, "HSET to*:{x%d} v 1", i);
    redisAppendCommand(c, "SET tox:{k} 1");
    redisAppendCommand(c, "SET other 1");
    for (int i = 0; i < 2502; i++) {
        redisReply *r = NULL;
        assert_int_equal(redisGetReply(c, (void **)&r), REDIS_OK);
        freeReplyObject(r);
    }
    /* Each key's expiry, as an instant on Redis's clock, is 5 s after
     * some moment of the touch: no bound on how long the checks take. */
    long long before = (long long)(redis_time_us(c) / 1000);
    assert_int_equal(rate_store_redis_touch(rs, 5 * SEC - 1), RATE_OK);
    long long after = (long long)(redis_time_us(c) / 1000);
    redisReply *r = keys_of(c, "to\\*:");
    assert_int_equal(r->elements, 2502); /* 2500, the state, the record */
    int records = 0;
    for (size_t i = 0; i < r->elements; i++) {
        long long at = redis_int(c, "PEXPIRETIME", r->element[i]->str);
        if (at < before + 5000 || at > after + 5002)
            fail_msg("%s: expires at %lld ms, touched for 5 s within "
                     "[%lld, %lld]", r->element[i]->str, at, before, after);
        records += strncmp(r->element[i]->str, "to*:p{", 6) == 0;
    }
    assert_int_equal(records, 1);
    freeReplyObject(r);
    assert_int_equal(redis_int(c, "PTTL", "tox:{k}"), -1);
    assert_int_equal(redis_int(c, "PTTL", "other"), -1);
    assert_true(at(l, "k", SEC, 1, 0).allowed);
    assert_true(redis_int(c, "PTTL", "to*:{k}") > 59000);
    /* And a namespace with nothing in it. */
    rate_limiter_free(l);
    assert_int_equal(rate_store_redis_drop(rs), RATE_OK);
    assert_int_equal(rate_store_redis_touch(rs, SEC), RATE_OK);
    assert_int_equal(rate_store_redis_touch(rs, 0), RATE_EINVAL);
    assert_int_equal(rate_store_redis_touch(NULL, SEC), RATE_EINVAL);
    rate_store_t *mem = NULL;
    assert_int_equal(rate_store_memory_new(NULL, &mem), RATE_OK);
    assert_int_equal(rate_store_redis_touch(mem, SEC), RATE_EINVAL);
    rate_store_free(mem);
    rate_store_free(rs);
    freeReplyObject(redisCommand(c, "DEL tox:{k} other"));
    redisFree(c);
}

/* A unix socket that cannot be reached is named by its path alone, with
 * no port after it ("/path0: ..." once). */
static void unix_socket_message(void **state)
{
    (void)state;
    rate_store_t *s = (rate_store_t *)1;
    char err[256] = "";
    assert_int_equal(rate_store_redis_new("unix:///nonexistent/redis.sock",
                                          NULL, &s, err, sizeof err),
                     RATE_ESTORE);
    assert_null(s);
    if (strncmp(err, "cannot connect to /nonexistent/redis.sock: ", 43) != 0)
        fail_msg("message: '%s'", err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(drop_removes_the_namespace),
        cmocka_unit_test(lean_scripts_at_the_boundaries),
        cmocka_unit_test(lean_general_and_c_share_keys),
        cmocka_unit_test(lean_sliding_log_edges),
        cmocka_unit_test(sliding_logs_in_the_general_script),
        cmocka_unit_test(wide_policies_keep_the_wide_state),
        cmocka_unit_test(one_round_trip),
        cmocka_unit_test(lost_records_come_back),
        cmocka_unit_test(fleet_clock),
        cmocka_unit_test(ttl_is_reset_after),
        cmocka_unit_test(expiry_by_redis_clock),
        cmocka_unit_test(script_flush_changes_nothing),
        cmocka_unit_test(tampered_state_is_corrupt),
        cmocka_unit_test(tampered_logs_are_never_admitted),
        cmocka_unit_test(shadow_state_and_policy_records),
        cmocka_unit_test(adjustments_on_redis_time),
        cmocka_unit_test(adjustments_scripted_as_the_c_step),
        cmocka_unit_test(adjustments_expire_as_the_c_step),
        cmocka_unit_test(adjustments_take_one_round_trip),
        cmocka_unit_test(refunds_do_not_lose_to_scripted_decisions),
        cmocka_unit_test(full_log_in_lua),
        cmocka_unit_test(shared_limit_across_processes),
        cmocka_unit_test(replies_reach_their_callers),
        cmocka_unit_test(crowd_on_one_connection),
        cmocka_unit_test(redis_down_and_back),
        cmocka_unit_test(callers_ride_out_a_restart),
        cmocka_unit_test(bad_urls_hosts_and_passwords),
        cmocka_unit_test(unix_socket),
        cmocka_unit_test(safety_ttl_with_no_ttl),
        cmocka_unit_test(touch_sets_every_expiry),
        cmocka_unit_test(lean_numbers_by_policy_not_id),
        cmocka_unit_test(unix_socket_message),
    };
    if (getenv("TEST_FILTER") != NULL) /* one test, while working on it */
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
