/* SPDX-License-Identifier: MIT */
/*
 * The Redis stores' protocol on its own, with no server
 * (src/store/redis/protocol.c): the names of keys and their escapes, the
 * choice of the command that decides a request (RATELIMIT.STEP, a lean
 * script by FCALL or EVALSHA, the general script, or none) with its
 * arguments, and the parsing of replies fed through hiredis's reader, as
 * the transports get them.
 */
#include <hiredis/hiredis.h>

#include "../src/store/redis/protocol.h"
#include "lib/helpers.h"
#include "lib/redis_reply.h"

static rate__redis_proto_t proto(bool lean)
{
    rate__redis_proto_t p;
    assert_int_equal(
        rate__redis_proto_init(&p, "rl:", true, 0, true, lean), RATE_OK);
    return p;
}

static void name_is(const rate__redis_proto_t *p, const char *bytes,
                    size_t len, rate_space_t space, const char *want)
{
    char buf[64], *k;
    size_t kl;
    rate_key_t key = {bytes, len, space};
    assert_int_equal(rate__redis_key_name(p, &key, buf, sizeof buf, &k, &kl),
                     RATE_OK);
    if (kl != strlen(want) || memcmp(k, want, kl) != 0)
        fail_msg("name '%.*s', not '%s'", (int)kl, k, want);
    assert_true(rate__redis_own_name(p, k, kl));
    if (k != buf)
        free(k);
}

static void key_names(void **state)
{
    (void)state;
    rate__redis_proto_t p = proto(true);
    name_is(&p, "user1", 5, RATE_SPACE_STATE, "rl:{user1}");
    name_is(&p, "user1", 5, RATE_SPACE_SHADOW, "rl:s{user1}");
    name_is(&p, "\x0b\xad\xca\xfe", 4, RATE_SPACE_POLICY, "rl:p{0badcafe}");
    /* a '}' would end the hash tag: escaped, '%' too */
    name_is(&p, "a}b%c", 5, RATE_SPACE_STATE, "rl:e{a%7db%25c}");
    name_is(&p, "a}", 2, RATE_SPACE_SHADOW, "rl:es{a%7d}");
    name_is(&p, "{x", 2, RATE_SPACE_STATE, "rl:{{x}"); /* a '{' stays */
    /* A long key goes to the heap. */
    char big[200];
    memset(big, 'k', sizeof big);
    char buf[16], *k;
    size_t kl;
    rate_key_t key = {big, sizeof big, RATE_SPACE_STATE};
    assert_int_equal(rate__redis_key_name(&p, &key, buf, sizeof buf, &k, &kl),
                     RATE_OK);
    assert_true(k != buf);
    assert_int_equal(kl, 3 + 2 + sizeof big);
    free(k);
    /* no bytes, an unknown space */
    key = (rate_key_t){"", 0, RATE_SPACE_STATE};
    assert_int_equal(rate__redis_key_name(&p, &key, buf, sizeof buf, &k, &kl),
                     RATE_EINVAL);
    key = (rate_key_t){"x", 1, (rate_space_t)7};
    assert_int_equal(rate__redis_key_name(&p, &key, buf, sizeof buf, &k, &kl),
                     RATE_EINVAL);
    /* names that are not the store's */
    static const char *other[] = {"rl:",     "rl:{}",   "rl:x{a}", "xx:{a}",
                                  "rl:{a}b", "rl:{a}}", "rl:sp{a}",
                                  "rl:ps{a}", "rl:{a"};
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
        if (rate__redis_own_name(&p, other[i], strlen(other[i])))
            fail_msg("'%s' taken for the store's own", other[i]);
    rate__redis_proto_free(&p);
}

/* A request for policy text, one permit, acquire. */
typedef struct req {
    rate_policy_t *pol;
    rate_decide_req_t q;
} req_t;

static void req_of(req_t *r, const char *text)
{
    char err[128];
    if (rate_policy_parse(text, &r->pol, err, sizeof err) != RATE_OK)
        fail_msg("%s: %s", text, err);
    memset(&r->q, 0, sizeof r->q);
    r->q.policy = r->pol;
    r->q.policy_id = 7;
    r->q.format = RATE__FORMAT;
    r->q.now_ns = 5 * RATE_NS_PER_S + 250;
    r->q.permits = 1;
    r->q.max_reset_ns = 2 * RATE_NS_PER_S;
    r->q.op = RATE_DECIDE_ACQUIRE;
}

static int cmd_of(const rate__redis_proto_t *p, rate__redis_via_t via,
                  bool fcall, const req_t *r, rate__redis_cmd_t *c)
{
    rate_key_t key = {"k", 1, RATE_SPACE_STATE};
    return rate__redis_decide_cmd(p, via, fcall, &key, &r->q, c);
}

static void word_is(const rate__redis_cmd_t *c, int i, const char *want)
{
    assert_true(i < c->argc);
    if (c->al[i] != strlen(want) || memcmp(c->av[i], want, c->al[i]) != 0)
        fail_msg("word %d: '%.*s', not '%s'", i, (int)c->al[i], c->av[i],
                 want);
}

static void command_choice(void **state)
{
    (void)state;
    rate__redis_proto_t p = proto(true), g = proto(false);
    rate__redis_cmd_t c;
    req_t r;

    /* One token bucket: its lean script, by EVALSHA or FCALL. */
    req_of(&r, "token-bucket 10/s burst=20");
    assert_int_equal(cmd_of(&p, RATE__VIA_SCRIPTS, false, &r, &c), RATE_OK);
    word_is(&c, 0, "EVALSHA");
    word_is(&c, 1, p.lean_sha[RATE__LEAN_TB]);
    word_is(&c, 2, "1");
    word_is(&c, 3, "rl:{k}");
    word_is(&c, 4, "5");         /* the client's time: seconds */
    word_is(&c, 5, "250");       /* and nanoseconds */
    word_is(&c, 6, "1");         /* permits */
    word_is(&c, 8, "0");         /* the operation: a decision */
    /* the policy's numbers in one argument: the expiry (us), the id, the
     * format, the word's width, L/g, P/g, B, g, the debt bound 2^62 / g */
    word_is(&c, 9, "2000000 7 3 8 1 100000000 20 10 461168601842738790");
    assert_int_equal(c.argc, 4 + 6);
    assert_int_equal(c.lean, RATE__LEAN_TB);
    assert_false(c.module);
    assert_non_null(c.script);
    rate__redis_cmd_free(&c);
    assert_int_equal(cmd_of(&p, RATE__VIA_SCRIPTS, true, &r, &c), RATE_OK);
    word_is(&c, 0, "FCALL");
    word_is(&c, 1, p.fn_name[RATE__LEAN_TB]);
    rate__redis_cmd_evalsha(&p, &c); /* a server without the library */
    word_is(&c, 0, "EVALSHA");
    word_is(&c, 1, p.lean_sha[RATE__LEAN_TB]);
    rate__redis_cmd_eval(&c); /* NOSCRIPT: the script's text */
    word_is(&c, 0, "EVAL");
    assert_int_equal(c.al[1], c.script_len);
    rate__redis_cmd_free(&c);
    /* The general script when asked for (general_script). */
    assert_int_equal(cmd_of(&g, RATE__VIA_SCRIPTS, true, &r, &c), RATE_OK);
    word_is(&c, 0, "EVALSHA");
    word_is(&c, 1, g.step_sha);
    assert_int_equal(c.lean, -1);
    rate__redis_cmd_free(&c);
    /* The module: its command, the expiry in ms. */
    assert_int_equal(cmd_of(&p, RATE__VIA_MODULE, true, &r, &c), RATE_OK);
    word_is(&c, 0, "RATELIMIT.STEP");
    word_is(&c, 1, "rl:{k}");
    word_is(&c, 6, "2000");
    word_is(&c, 9, "1");        /* the algorithm: RATE_TOKEN_BUCKET */
    word_is(&c, 10, "10");      /* limit */
    word_is(&c, 12, "20");      /* burst */
    assert_int_equal(c.argc, 2 + 7 + 4);
    assert_true(c.module);
    rate__redis_cmd_free(&c);
    /* A refund: a lean script's, never the module's. */
    r.q.op = RATE_DECIDE_REFUND;
    assert_int_equal(cmd_of(&p, RATE__VIA_MODULE, false, &r, &c),
                     RATE_ENOTSUP);
    assert_int_equal(cmd_of(&p, RATE__VIA_SCRIPTS, false, &r, &c), RATE_OK);
    assert_int_equal(c.lean, RATE__LEAN_TB);
    rate__redis_cmd_free(&c);
    assert_int_equal(cmd_of(&g, RATE__VIA_SCRIPTS, false, &r, &c),
                     RATE_ENOTSUP);
    rate_policy_free(r.pol);

    /* Two limits: the general script, or the module. */
    req_of(&r, "token-bucket 10/s burst=10; sliding-log 100/1m");
    assert_int_equal(cmd_of(&p, RATE__VIA_SCRIPTS, true, &r, &c), RATE_OK);
    word_is(&c, 0, "EVALSHA");
    word_is(&c, 1, p.step_sha);
    assert_int_equal(c.argc, 4 + 7 + 8);
    rate__redis_cmd_free(&c);
    assert_int_equal(cmd_of(&p, RATE__VIA_MODULE, false, &r, &c), RATE_OK);
    assert_int_equal(c.argc, 2 + 7 + 8);
    rate__redis_cmd_free(&c);
    rate_policy_free(r.pol);

    /* A block: the C step's alone. */
    req_of(&r, "fixed-window 10/s block=1m");
    assert_int_equal(cmd_of(&p, RATE__VIA_SCRIPTS, false, &r, &c),
                     RATE_ENOTSUP);
    assert_int_equal(cmd_of(&p, RATE__VIA_MODULE, false, &r, &c),
                     RATE_ENOTSUP);
    rate_policy_free(r.pol);

    /* Past exact doubles: the general script declines before Redis. */
    req_of(&r, "sliding-window 2000000000000000/1s; fixed-window 1/s");
    assert_int_equal(cmd_of(&p, RATE__VIA_SCRIPTS, false, &r, &c),
                     RATE_ENOTSUP);
    assert_int_equal(cmd_of(&p, RATE__VIA_MODULE, false, &r, &c), RATE_OK);
    rate__redis_cmd_free(&c);
    rate_policy_free(r.pol);

    /* One sliding log: its lean script by FCALL, the width 0 (count,
     * sum, then the entries), L and W; a penalty is the script's too. */
    req_of(&r, "sliding-log 10/s");
    assert_int_equal(cmd_of(&p, RATE__VIA_SCRIPTS, true, &r, &c), RATE_OK);
    word_is(&c, 0, "FCALL");
    word_is(&c, 1, p.fn_name[RATE__LEAN_SL]);
    word_is(&c, 8, "0");
    word_is(&c, 9, "2000000 7 3 0 10 1000000000");
    assert_int_equal(c.lean, RATE__LEAN_SL);
    rate__redis_cmd_free(&c);
    r.q.op = RATE_DECIDE_PENALTY;
    assert_int_equal(cmd_of(&p, RATE__VIA_SCRIPTS, false, &r, &c), RATE_OK);
    word_is(&c, 1, p.lean_sha[RATE__LEAN_SL]);
    word_is(&c, 8, "2");
    rate__redis_cmd_free(&c);
    rate_policy_free(r.pol);

    /* One fixed window: its lean script; an old format: the limiter's. */
    req_of(&r, "fixed-window 10/s");
    assert_int_equal(cmd_of(&p, RATE__VIA_SCRIPTS, false, &r, &c), RATE_OK);
    assert_int_equal(c.lean, RATE__LEAN_FW);
    rate__redis_cmd_free(&c);
    r.q.format = 1;
    assert_int_equal(cmd_of(&p, RATE__VIA_SCRIPTS, false, &r, &c),
                     RATE_ENOTSUP);
    r.q.format = RATE__FORMAT;
    /* A policy record's key is no state. */
    rate_key_t rec = {"\0\0\0\1", 4, RATE_SPACE_POLICY};
    assert_int_equal(rate__redis_decide_cmd(&p, RATE__VIA_SCRIPTS, false,
                                            &rec, &r.q, &c),
                     RATE_EINVAL);
    rate_policy_free(r.pol);
    rate__redis_proto_free(&p);
    rate__redis_proto_free(&g);
}

/* Whether the script the command carries starts with NAME's exactness
 * constants as the algorithm's table has them (cmake/lua_range.cmake). */
static void script_has_range(const rate__redis_cmd_t *c, const char *name,
                             const rate__algo_t *a)
{
    char want[160];
    snprintf(want, sizeof want, "local %s_STEP, %s_LEAN = %llu, %llu\n",
             name, name, (unsigned long long)a->lua_step,
             (unsigned long long)a->lua_lean);
    assert_non_null(c->script);
    if (strstr(c->script, want) == NULL)
        fail_msg("the script lacks '%s'", want);
}

/* The ranges in which the scripts decide exactly are the algorithms'
 * table members: the C gate reads them, and the scripts carry them as
 * constants.  A bucket is lean up to B * P / g = lua_lean and no further;
 * a policy is the general script's below lua_step. */
static void exact_ranges_from_tables(void **state)
{
    (void)state;
    rate__redis_proto_t p = proto(true);
    rate__redis_cmd_t c;
    req_t r;
    char text[128];
    const rate__algo_t *tb = rate__algo(RATE_TOKEN_BUCKET);
    const rate__algo_t *fw = rate__algo(RATE_FIXED_WINDOW);
    /* 1000/s: g = 1000, P / g = 10^6 */
    uint64_t top = tb->lua_lean / 1000000;

    assert_true(tb->lua_lean > 0 && tb->lua_step > 0);
    snprintf(text, sizeof text, "token-bucket 1000/s burst=%llu",
             (unsigned long long)top);
    req_of(&r, text);
    assert_int_equal(cmd_of(&p, RATE__VIA_SCRIPTS, false, &r, &c), RATE_OK);
    assert_int_equal(c.lean, RATE__LEAN_TB);
    script_has_range(&c, "TOKEN_BUCKET", tb);
    script_has_range(&c, "SLIDING_LOG", rate__algo(RATE_SLIDING_LOG));
    rate__redis_cmd_free(&c);
    rate_policy_free(r.pol);
    snprintf(text, sizeof text, "token-bucket 1000/s burst=%llu",
             (unsigned long long)top + 1);
    req_of(&r, text);
    assert_int_equal(cmd_of(&p, RATE__VIA_SCRIPTS, false, &r, &c),
                     RATE_ENOTSUP); /* past the general script's too */
    rate_policy_free(r.pol);

    /* A fixed window's count: lean up to lua_lean. */
    snprintf(text, sizeof text, "fixed-window %llu/s",
             (unsigned long long)fw->lua_lean);
    req_of(&r, text);
    assert_int_equal(cmd_of(&p, RATE__VIA_SCRIPTS, false, &r, &c), RATE_OK);
    assert_int_equal(c.lean, RATE__LEAN_FW);
    script_has_range(&c, "FIXED_WINDOW", fw);
    rate__redis_cmd_free(&c);
    rate_policy_free(r.pol);
    snprintf(text, sizeof text, "fixed-window %llu/s",
             (unsigned long long)fw->lua_lean + 1);
    req_of(&r, text);
    assert_int_equal(cmd_of(&p, RATE__VIA_SCRIPTS, false, &r, &c),
                     RATE_ENOTSUP);
    rate_policy_free(r.pol);

    /* A sliding window: lean up to L * W = lua_lean with W at most half
     * of it; past either, the general script's range too. */
    const rate__algo_t *sw = rate__algo(RATE_SLIDING_WINDOW);
    static const struct {
        uint64_t l, w;
        int lean;
    } sws[] = {{1, 0, 1},  /* W = lua_lean / 2 */
               {1, 1, -1}, /* W one more */
               {2, 0, 1},  /* L * W = lua_lean */
               {3, 0, -1}, /* past it */
               {4, 0, -1}}; /* W = lua_lean / 4 + 1 */
    for (size_t i = 0; i < sizeof sws / sizeof sws[0]; i++) {
        /* L and W: (1, 2^51), (1, 2^51 + 1), (2, 2^51), (3, 2^51),
         * (4, 2^50 + 1) */
        uint64_t l = sws[i].l, w = sw->lua_lean / 2 + sws[i].w;
        if (i == 4)
            w = sw->lua_lean / 4 + 1;
        snprintf(text, sizeof text, "sliding-window %llu/%lluns",
                 (unsigned long long)l, (unsigned long long)w);
        req_of(&r, text);
        int rc = cmd_of(&p, RATE__VIA_SCRIPTS, false, &r, &c);
        if (sws[i].lean > 0) {
            assert_int_equal(rc, RATE_OK);
            assert_int_equal(c.lean, RATE__LEAN_SW);
            script_has_range(&c, "SLIDING_WINDOW", sw);
            rate__redis_cmd_free(&c);
        } else if (rc != RATE_ENOTSUP) {
            fail_msg("%s: %d, lean %d, want ENOTSUP", text, rc, c.lean);
        }
        rate_policy_free(r.pol);
    }

    /* A sliding log: the lean script's at any limit up to W = lua_lean
     * (its numbers are times, within W of t); without the lean scripts,
     * the general script's (its rule forms no L * W) while 2 * W stays
     * below lua_step; past both, the C step's. */
    const rate__algo_t *sl = rate__algo(RATE_SLIDING_LOG);
    assert_true(sl->lua_lean > sl->lua_step / 2);
    rate__redis_proto_t pg = proto(false);
    static const struct {
        int w; /* 0: lua_step / 2 - 1, 1: lua_step / 2, 2: lua_lean, 3: + 1 */
        int lean, general; /* 1 taken, 0 not */
    } sls[] = {{0, 1, 1}, {1, 1, 0}, {2, 1, 0}, {3, 0, 0}};
    for (size_t i = 0; i < sizeof sls / sizeof sls[0]; i++) {
        uint64_t w = sls[i].w == 0   ? sl->lua_step / 2 - 1
                     : sls[i].w == 1 ? sl->lua_step / 2
                     : sls[i].w == 2 ? sl->lua_lean
                                     : sl->lua_lean + 1;
        snprintf(text, sizeof text, "sliding-log %u/%lluns",
                 RATE_SLIDING_LOG_MAX, (unsigned long long)w);
        req_of(&r, text);
        int rc = cmd_of(&p, RATE__VIA_SCRIPTS, false, &r, &c);
        if (sls[i].lean) {
            assert_int_equal(rc, RATE_OK);
            assert_int_equal(c.lean, RATE__LEAN_SL);
            script_has_range(&c, "SLIDING_LOG", sl);
            rate__redis_cmd_free(&c);
        } else if (rc != RATE_ENOTSUP) {
            fail_msg("%s: %d, lean %d, want ENOTSUP", text, rc, c.lean);
        }
        rc = cmd_of(&pg, RATE__VIA_SCRIPTS, false, &r, &c);
        if (sls[i].general) {
            assert_int_equal(rc, RATE_OK);
            assert_int_equal(c.lean, -1);
            rate__redis_cmd_free(&c);
        } else if (rc != RATE_ENOTSUP) {
            fail_msg("%s: %d without the lean scripts, want ENOTSUP", text,
                     rc);
        }
        rate_policy_free(r.pol);
    }
    rate__redis_proto_free(&pg);

    /* The general script: permits below the limits' lua_step. */
    req_of(&r, "sliding-window 10/s; fixed-window 5/s");
    r.q.permits = rate__algo(RATE_SLIDING_WINDOW)->lua_step - 1;
    assert_int_equal(cmd_of(&p, RATE__VIA_SCRIPTS, false, &r, &c), RATE_OK);
    assert_int_equal(c.lean, -1);
    script_has_range(&c, "SLIDING_WINDOW", rate__algo(RATE_SLIDING_WINDOW));
    script_has_range(&c, "LEAKY_BUCKET", rate__algo(RATE_LEAKY_BUCKET));
    rate__redis_cmd_free(&c);
    r.q.permits += 1;
    assert_int_equal(cmd_of(&p, RATE__VIA_SCRIPTS, false, &r, &c),
                     RATE_ENOTSUP);
    rate_policy_free(r.pol);
    rate__redis_proto_free(&p);
}

static void replies(void **state)
{
    (void)state;
    rate_decision_t d;
    redisReply *r;

    r = parse_resp("*9\r\n:1\r\n:1\r\n:0\r\n:0\r\n:10\r\n:9\r\n:0\r\n:0\r\n"
             ":100000000\r\n");
    assert_int_equal(rate__redis_decide_parse(r, &d), RATE_OK);
    assert_true(d.allowed);
    assert_int_equal(d.limit, 10);
    assert_int_equal(d.remaining, 9);
    assert_int_equal(d.reset_after_ns, 100000000);
    freeReplyObject(r);
    /* -1: never */
    r = parse_resp("*9\r\n:1\r\n:0\r\n:0\r\n:0\r\n:10\r\n:0\r\n:0\r\n:-1\r\n"
             ":5\r\n");
    assert_int_equal(rate__redis_decide_parse(r, &d), RATE_OK);
    assert_int_equal(d.retry_after_ns, RATE_NEVER);
    freeReplyObject(r);
    r = parse_resp("*1\r\n:0\r\n"); /* declined */
    assert_int_equal(rate__redis_decide_parse(r, &d), RATE_ENOTSUP);
    freeReplyObject(r);
    r = parse_resp("*1\r\n:2\r\n"); /* not a hash */
    assert_int_equal(rate__redis_decide_parse(r, &d), RATE_ECORRUPT);
    freeReplyObject(r);
    r = parse_resp("*9\r\n:1\r\n:1\r\n:0\r\n:0\r\n:10\r\n:-2\r\n:0\r\n:0\r\n:0\r\n");
    assert_int_equal(rate__redis_decide_parse(r, &d), RATE_ECORRUPT);
    freeReplyObject(r);
    /* a reason or a component out of range, before any narrowing */
    r = parse_resp("*9\r\n:1\r\n:1\r\n:4294967297\r\n:0\r\n:10\r\n:9\r\n"
                   ":0\r\n:0\r\n:0\r\n");
    assert_int_equal(rate__redis_decide_parse(r, &d), RATE_ECORRUPT);
    freeReplyObject(r);
    r = parse_resp("*9\r\n:1\r\n:1\r\n:0\r\n:4\r\n:10\r\n:9\r\n:0\r\n"
                   ":0\r\n:0\r\n");
    assert_int_equal(rate__redis_decide_parse(r, &d), RATE_ECORRUPT);
    freeReplyObject(r);

    const char *st;
    size_t len;
    uint64_t v;
    r = parse_resp("*2\r\n$2\r\n42\r\n$3\r\nabc\r\n");
    assert_int_equal(rate__redis_load_parse(r, &st, &len, &v), RATE_OK);
    assert_int_equal(v, 42);
    assert_int_equal(len, 3);
    assert_memory_equal(st, "abc", 3);
    freeReplyObject(r);
    r = parse_resp("*2\r\n$-1\r\n$-1\r\n"); /* absent */
    assert_int_equal(rate__redis_load_parse(r, &st, &len, &v), RATE_OK);
    assert_int_equal(v, 0);
    assert_null(st);
    freeReplyObject(r);
    r = parse_resp("*2\r\n$2\r\nx1\r\n$1\r\na\r\n"); /* a version not a number */
    assert_int_equal(rate__redis_load_parse(r, &st, &len, &v), RATE_ECORRUPT);
    freeReplyObject(r);
    r = parse_resp("*2\r\n$1\r\n5\r\n$0\r\n\r\n"); /* present, no state */
    assert_int_equal(rate__redis_load_parse(r, &st, &len, &v), RATE_ECORRUPT);
    freeReplyObject(r);
    /* The version's text (docs/redis.md, "Versions"): 0 is a new key;
     * a leading zero or 20 characters is no version of ours, which the
     * compare-and-set script, comparing text, would never match. */
    r = parse_resp("*2\r\n$1\r\n0\r\n$3\r\nabc\r\n");
    assert_int_equal(rate__redis_load_parse(r, &st, &len, &v), RATE_OK);
    assert_int_equal(v, 0);
    assert_null(st);
    freeReplyObject(r);
    static const char *const not_ours[] = {
        "*2\r\n$2\r\n05\r\n$3\r\nabc\r\n",
        "*2\r\n$2\r\n00\r\n$3\r\nabc\r\n",
        "*2\r\n$20\r\n01234567890123456789\r\n$3\r\nabc\r\n",
        "*2\r\n$20\r\n18446744073709551614\r\n$3\r\nabc\r\n",
        "*2\r\n$0\r\n\r\n$3\r\nabc\r\n"};
    for (size_t i = 0; i < sizeof not_ours / sizeof not_ours[0]; i++) {
        r = parse_resp(not_ours[i]);
        if (rate__redis_load_parse(r, &st, &len, &v) != RATE_ECORRUPT)
            fail_msg("version of reply %zu: read as %llu", i,
                     (unsigned long long)v);
        freeReplyObject(r);
    }
    r = parse_resp("*2\r\n$19\r\n9999999999999999999\r\n$3\r\nabc\r\n");
    assert_int_equal(rate__redis_load_parse(r, &st, &len, &v), RATE_OK);
    assert_int_equal(v, UINT64_C(9999999999999999999));
    freeReplyObject(r);

    r = parse_resp(":0\r\n");
    assert_int_equal(rate__redis_cas_parse(r), RATE_ECONFLICT);
    freeReplyObject(r);
    r = parse_resp(":17\r\n");
    assert_int_equal(rate__redis_cas_parse(r), RATE_OK);
    freeReplyObject(r);

    r = parse_resp("-WRONGTYPE Operation against a key\r\n");
    assert_int_equal(rate__redis_reply_ok(RATE_OK, r), RATE_ECORRUPT);
    freeReplyObject(r);
    r = parse_resp("-NOSCRIPT No matching script\r\n");
    assert_int_equal(rate__redis_reply_ok(RATE_OK, r), RATE_ESTORE);
    assert_true(rate__redis_noscript(r));
    assert_false(rate__redis_no_function(r));
    freeReplyObject(r);
    r = parse_resp("-ERR Function not found\r\n");
    assert_true(rate__redis_no_function(r));
    freeReplyObject(r);

    uint64_t ns;
    r = parse_resp("*2\r\n$10\r\n1700000000\r\n$6\r\n000250\r\n");
    assert_int_equal(rate__redis_time_parse(r, &ns), RATE_OK);
    assert_int_equal(ns, UINT64_C(1700000000) * RATE_NS_PER_S + 250000);
    freeReplyObject(r);
    r = parse_resp("*2\r\n$1\r\n1\r\n$7\r\n1000000\r\n");
    assert_int_equal(rate__redis_time_parse(r, &ns), RATE_ECORRUPT);
    freeReplyObject(r);

    r = parse_resp("*1\r\n*1\r\n$14\r\nratelimit.step\r\n");
    assert_true(rate__redis_has_module(r));
    freeReplyObject(r);
    r = parse_resp("*1\r\n$-1\r\n"); /* COMMAND INFO of an unknown command */
    assert_false(rate__redis_has_module(r));
    freeReplyObject(r);
}

/* The blocking store's reader of a step's reply without reply objects
 * (rate__redis_ints_parse): the same decision as hiredis's reply object
 * gives for every reply it takes, only what is its own consumed, and any
 * other reply, or one too long for it, left to hiredis's reader. */
static void integer_replies(void **state)
{
    (void)state;
    static const char *mine[] = {
        "*9\r\n:1\r\n:1\r\n:0\r\n:0\r\n:10\r\n:9\r\n:0\r\n:0\r\n"
        ":100000000\r\n",
        "*9\r\n:1\r\n:0\r\n:1\r\n:2\r\n:1000000000\r\n:0\r\n:0\r\n:-1\r\n"
        ":999999999999999999\r\n",
        "*9\r\n:1\r\n:1\r\n:0\r\n:0\r\n:10\r\n:-2\r\n:0\r\n:0\r\n:0\r\n",
        "*9\r\n:1\r\n:1\r\n:7\r\n:0\r\n:10\r\n:0\r\n:0\r\n:0\r\n:0\r\n",
        "*1\r\n:0\r\n", "*1\r\n:2\r\n", "*2\r\n:1\r\n:1\r\n",
    };
    for (size_t i = 0; i < sizeof mine / sizeof *mine; i++) {
        const char *m = mine[i];
        size_t len = strlen(m), n = 0;
        long long v[9];
        char buf[256];
        /* every beginning of it: wait for more */
        for (size_t cut = 0; cut < len; cut++)
            if (rate__redis_ints_parse(m, cut, v, 9, &n) != 0)
                fail_msg("'%s' cut at %zu: not 0", m, cut);
        /* whole, with the next reply behind it */
        snprintf(buf, sizeof buf, "%s+OK\r\n", m);
        assert_int_equal(rate__redis_ints_parse(buf, strlen(buf), v, 9, &n),
                         (long)len);
        redisReply *r = parse_resp(m);
        assert_int_equal(n, r->elements);
        rate_decision_t a, b;
        memset(&a, 0x5a, sizeof a);
        memset(&b, 0xa5, sizeof b);
        int ra = rate__redis_decide_ints(v, n, &a);
        assert_int_equal(ra, rate__redis_decide_parse(r, &b));
        if (ra == RATE_OK)
            assert_memory_equal(&a, &b, sizeof a);
        freeReplyObject(r);
    }
    static const char *other[] = {
        "+OK\r\n", "-ERR unknown command\r\n", "*-1\r\n", "*0\r\n",
        ":1\r\n", "$2\r\nab\r\n",
        "*10\r\n:1\r\n:1\r\n:1\r\n:1\r\n:1\r\n:1\r\n:1\r\n:1\r\n:1\r\n:1\r\n",
        "*2\r\n:1\r\n$1\r\nx\r\n", "*2\r\n:1\r\n*1\r\n:1\r\n",
        "*1\r\n:1234567890123456789\r\n", "*1\r\n:\r\n", "*1\r\n:1x\r\n",
        "*1\r\n:1\n\n", "*1\n:1\r\n", "*2\r\n:1\r\n:-\r\n",
        "*1\r\n:-0\r\n", "*1\r\n:007\r\n", "*1\r\n:-01\r\n", "*01\r\n:1\r\n",
    };
    for (size_t i = 0; i < sizeof other / sizeof *other; i++) {
        long long v[9];
        size_t n = 0;
        if (rate__redis_ints_parse(other[i], strlen(other[i]), v, 9, &n) !=
            -1)
            fail_msg("'%s': not left to hiredis", other[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(key_names),
        cmocka_unit_test(command_choice),
        cmocka_unit_test(exact_ranges_from_tables),
        cmocka_unit_test(replies),
        cmocka_unit_test(integer_replies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
