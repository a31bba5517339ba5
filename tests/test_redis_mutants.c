/* SPDX-License-Identifier: MIT */
/*
 * The Redis store's paths that the rest of the suite let mutations through
 * (test_mutants.c has the others), against a private redis-server started
 * on a free loopback port and stopped by its PID, as in test_redis.c:
 *
 * - which policies the Lua step may decide (lua_can's bound of 2^50 on
 *   every product and count): a request just past it never reaches the
 *   script, one just inside does, seen in SLOWLOG (every command logged,
 *   with its arguments), and the C step's answers match memory's;
 * - the compare-and-set script re-sent with EVAL after SCRIPT FLUSH.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "lib/redis_fixture.h"
#include "ratelimit_redis.h"

/* ------------------------------------------------------ commands seen */

/* From now on every command is logged (SLOWLOG, with its arguments). */
static void log_all(redisContext *c)
{
    freeReplyObject(redisCommand(c, "CONFIG SET slowlog-max-len 100000"));
    freeReplyObject(redisCommand(c, "CONFIG SET slowlog-log-slower-than 0"));
    freeReplyObject(redisCommand(c, "SLOWLOG RESET"));
}

static void log_none(redisContext *c)
{
    freeReplyObject(redisCommand(c, "CONFIG SET slowlog-log-slower-than -1"));
    freeReplyObject(redisCommand(c, "SLOWLOG RESET"));
}

/* How many logged commands were `name` with `argc` arguments (the
 * command's name included; 0: any number). */
static unsigned logged(redisContext *c, const char *name, size_t argc)
{
    redisReply *r = redisCommand(c, "SLOWLOG GET -1");
    unsigned n = 0;
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *e = r->element[i];
        assert_true(e->type == REDIS_REPLY_ARRAY && e->elements >= 4);
        redisReply *args = e->element[3];
        if (args->type != REDIS_REPLY_ARRAY || args->elements == 0)
            continue;
        if (strcasecmp(args->element[0]->str, name) == 0 &&
            (argc == 0 || args->elements == argc))
            n++;
    }
    freeReplyObject(r);
    return n;
}

/* The Lua step's call for a policy of one limit: EVALSHA sha 1 key, its
 * seven arguments, and four per limit. */
#define STEP_ARGS 15

/* ------------------------------------------ the Lua step's exact range */

/* A store whose decisions all go to the general script (general_script):
 * its bound is what these tests are about (single limits within the lean
 * scripts' range go to those by default: test_redis.c). */
static rate_store_t *general_store(const char *prefix)
{
    rate_redis_options_t o = {0};
    rate_store_t *s = NULL;
    char err[256] = "";
    o.prefix = prefix;
    o.no_ttl = true;
    o.general_script = true;
    if (rate_store_redis_new(url, &o, &s, err, sizeof err) != RATE_OK)
        fail_msg("redis store: %s", err);
    return s;
}

/* Trace of decisions, each on Redis and on memory, field by field; the
 * number of them that were the Lua step's (EVALSHA with its arguments). */
static unsigned trace(rate_store_t *rs, const char *policy, const char *key,
                      uint64_t permits_top, uint64_t mw_top, int steps)
{
    rate_store_t *ms;
    assert_int_equal(rate_store_memory_new(NULL, &ms), RATE_OK);
    rate_limiter_t *lm = limiter_of(policy, ms);
    rate_limiter_t *lr = limiter_of(policy, rs);
    redisContext *c = raw();
    log_all(c);
    uint64_t t = 5 * SEC, seed = 99;
    for (int i = 0; i < steps; i++) {
        seed = seed * 6364136223846793005u + 1442695040888963407u;
        uint64_t n = (seed >> 33) % permits_top;
        uint64_t mw = mw_top ? (seed >> 13) % mw_top : 0;
        t += (seed >> 40) % (300 * MS);
        rate_decision_t a, b;
        assert_int_equal(
            rate_limiter_check_at(lm, key, strlen(key), n, mw, t, &a),
            RATE_OK);
        assert_int_equal(
            rate_limiter_check_at(lr, key, strlen(key), n, mw, t, &b),
            RATE_OK);
        if (memcmp(&a, &b, sizeof a) != 0)
            fail_msg("%s, request %d (n=%llu mw=%llu): memory allowed=%d "
                     "rem=%llu delay=%llu retry=%llu reset=%llu; redis "
                     "allowed=%d reason=%d err=%d rem=%llu delay=%llu "
                     "retry=%llu reset=%llu",
                     policy, i, (unsigned long long)n, (unsigned long long)mw,
                     a.allowed, (unsigned long long)a.remaining,
                     (unsigned long long)a.delay_ns,
                     (unsigned long long)a.retry_after_ns,
                     (unsigned long long)a.reset_after_ns, b.allowed, b.reason,
                     b.error, (unsigned long long)b.remaining,
                     (unsigned long long)b.delay_ns,
                     (unsigned long long)b.retry_after_ns,
                     (unsigned long long)b.reset_after_ns);
    }
    unsigned n = logged(c, "EVALSHA", STEP_ARGS);
    log_none(c);
    redisFree(c);
    rate_limiter_free(lm);
    rate_limiter_free(lr);
    rate_store_free(ms);
    return n;
}

/* lua_can: a limit whose burst (or capacity, or limit of a window; 1 for
 * a sliding log) times its period is 2^49 or more (twice that reaches
 * 2^50) never reaches the script; one just below does, every time.  2^49 ns = 562949.95 s, so a
 * burst of 562950 over 1 s is out and 562949 in.  Either way the answers
 * are memory's. */
static void products_past_the_bound_skip_the_script(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out;
    } pairs[] = {
        {"token-bucket 1/s burst=562949", "token-bucket 1/s burst=562950"},
        {"leaky-bucket 1/s capacity=562949",
         "leaky-bucket 1/s capacity=562950"},
        {"sliding-window 562949/s", "sliding-window 562950/s"},
        {"fixed-window 562949/s", "fixed-window 562950/s"},
        /* A sliding log's rule forms no L * W: its window alone, 2^49
         * ns less one and 2^49, at its largest limit. */
        {"sliding-log 10000/562949953421311ns",
         "sliding-log 10000/562949953421312ns"},
        /* The period's side: 1 * 2^49 ns and one more. */
        {"token-bucket 1/562949953421311ns",
         "token-bucket 1/562949953421312ns"},
        /* A rate of 2^50 a second with a burst of 1: the product is
         * small, the limit itself is not. */
        {"token-bucket 1125899906842623/s burst=1",
         "token-bucket 1125899906842624/s burst=1"},
    };
    rate_store_t *rs = general_store("exact:");
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        char key[8];
        snprintf(key, sizeof key, "i%zu", i);
        assert_int_equal(trace(rs, pairs[i].in, key, 4, 0, 40), 40);
        snprintf(key, sizeof key, "o%zu", i);
        assert_int_equal(trace(rs, pairs[i].out, key, 4, 0, 40), 0);
    }
    drop_store(rs);
}

/* lua_can: permits and max_wait of 2^50 or more are the C step's too (the
 * script would be exact only below). */
static void requests_past_the_bound_skip_the_script(void **state)
{
    (void)state;
    rate_store_t *rs = general_store("exactq:");
    rate_limiter_t *l = limiter_of("token-bucket 10/s burst=10", rs);
    redisContext *c = raw();
    uint64_t big = UINT64_C(1) << 50;
    rate_decision_t d;
    log_all(c);
    assert_int_equal(rate_limiter_check_at(l, "k", 1, big - 1, 0, SEC, &d),
                     RATE_OK);
    assert_int_equal(d.reason, RATE_REASON_NEVER);
    assert_int_equal(rate_limiter_check_at(l, "k", 1, 1, big - 1, SEC, &d),
                     RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(logged(c, "EVALSHA", STEP_ARGS), 2); /* the script's */
    log_all(c);
    assert_int_equal(rate_limiter_check_at(l, "k", 1, big, 0, SEC, &d),
                     RATE_OK);
    assert_int_equal(d.reason, RATE_REASON_NEVER);
    assert_int_equal(d.retry_after_ns, RATE_NEVER);
    assert_int_equal(rate_limiter_check_at(l, "k", 1, 1, big, SEC, &d),
                     RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(rate_limiter_check_at(l, "k", 1, 20, big, SEC, &d),
                     RATE_OK);
    assert_int_equal(d.reason, RATE_REASON_NEVER); /* more than the burst */
    assert_int_equal(logged(c, "EVALSHA", STEP_ARGS), 0);
    log_none(c);
    redisFree(c);
    rate_limiter_free(l);
    drop_store(rs);
}

/* ----------------------------------------- NOSCRIPT, compare-and-set */

/* A policy decided through compare-and-set (a block after a breach is the
 * C step's; so is a burst past the Lua bound): after SCRIPT FLUSH its CAS
 * script is sent again with EVAL, and nothing is lost or doubled. */
static void script_flush_on_the_cas_path(void **state)
{
    (void)state;
    static const char *policies[] = {"fixed-window 5/h block=2h",
                                     "token-bucket 1/h burst=562950"};
    rate_store_t *rs = redis_store("flushc:", true, 0);
    redisContext *c = raw();
    for (int p = 0; p < 2; p++) {
        rate_limiter_t *l = limiter_of(policies[p], rs);
        char key[4] = {'k', (char)('0' + p), 0};
        unsigned ok = 0, first = 0;
        for (int i = 0; i < 12; i++) {
            if (i % 3 == 1) {
                freeReplyObject(redisCommand(c, "SCRIPT FLUSH"));
                log_all(c);
            }
            rate_decision_t d = at(l, key, SEC + (uint64_t)i * MS, 1, 0);
            assert_int_not_equal(d.reason, RATE_REASON_STORE_ERROR);
            assert_int_equal(d.error, 0);
            if (i % 3 == 1 && d.allowed) /* the first write after the flush */
                first += logged(c, "EVAL", 0);
            ok += d.allowed;
        }
        /* 5 of the fixed window; the bucket's 562950 allow all 12. */
        assert_int_equal(ok, p == 0 ? 5 : 12);
        assert_true(first >= (p == 0 ? 2u : 4u));
        rate_limiter_free(l);
    }
    log_none(c);
    redisFree(c);
    drop_store(rs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(products_past_the_bound_skip_the_script),
        cmocka_unit_test(requests_past_the_bound_skip_the_script),
        cmocka_unit_test(script_flush_on_the_cas_path),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
