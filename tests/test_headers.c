/* SPDX-License-Identifier: MIT */
/*
 * Policy names, and the HTTP fields of a decision (rate_headers_format):
 * hand-worked cases, each output also parsed as a structured-field list
 * (sf_check.h), and the listener of a limiter.
 */
#include "lib/helpers.h"
#include "lib/sf_check.h"
#include "ratelimit_http.h"

/* ---------------------------------------------------------------- names */

static void names_in_text_and_from_c(void **state)
{
    (void)state;
    char buf[256], err[256];
    rate_policy_t *p = policy_of("name=free token-bucket 10/s burst=20");

    assert_string_equal(rate_policy_name(p), "free");
    rate_policy_format(p, buf, sizeof buf);
    assert_string_equal(buf, "name=free token-bucket 10/s burst=20");
    /* The canonical text parses back to the same, name and all. */
    rate_policy_t *q = policy_of(buf);
    assert_string_equal(rate_policy_name(q), "free");
    assert_int_equal(rate_policy_fingerprint(p), rate_policy_fingerprint(q));
    /* A name is no part of the policy's identity. */
    rate_policy_t *unnamed = policy_of("token-bucket 10/s burst=20");
    assert_string_equal(rate_policy_name(unnamed), "");
    assert_int_equal(rate_policy_fingerprint(p),
                     rate_policy_fingerprint(unnamed));
    rate_policy_format(unnamed, buf, sizeof buf);
    assert_string_equal(buf, "token-bucket 10/s burst=20");
    /* From C: set, replace, clear. */
    assert_int_equal(rate_policy_set_name(unnamed, "pro.v2_x-1", err,
                                          sizeof err),
                     RATE_OK);
    assert_string_equal(rate_policy_name(unnamed), "pro.v2_x-1");
    assert_int_equal(rate_policy_set_name(unnamed, NULL, NULL, 0), RATE_OK);
    assert_string_equal(rate_policy_name(unnamed), "");
    assert_int_equal(rate_policy_set_name(unnamed, "bad name", err,
                                          sizeof err),
                     RATE_EINVAL);
    assert_string_equal(err, "policy name 'bad name' has byte 0x20; a name "
                             "is letters, digits, '.', '_' and '-'");
    assert_int_equal(rate_policy_set_name(NULL, "x", NULL, 0), RATE_EINVAL);
    /* Unlimited and composites take names too; the length needed counts
     * the name. */
    rate_policy_t *u = policy_of("name=enterprise unlimited");
    assert_true(rate_policy_is_unlimited(u));
    assert_int_equal(rate_policy_format(u, buf, 4), strlen("name=enterprise unlimited"));
    rate_policy_format(u, buf, sizeof buf);
    assert_string_equal(buf, "name=enterprise unlimited");
    rate_policy_t *c = policy_of("name=c  gcra 10/s; fixed-window 100/1m");
    rate_policy_format(c, buf, sizeof buf);
    assert_string_equal(buf, "name=c token-bucket 10/s burst=10; "
                             "fixed-window 100/m");
    rate_policy_free(p);
    rate_policy_free(q);
    rate_policy_free(unnamed);
    rate_policy_free(u);
    rate_policy_free(c);
}

static void name_errors(void **state)
{
    (void)state;
    static const struct {
        const char *text, *msg;
    } cases[] = {
        {"name= token-bucket 1/s",
         "name= is empty; write name=NAME before the first limit, or leave "
         "it out"},
        {"name=free", "name=free names no limit; a policy needs at least one "
                      "limit (or 'unlimited')"},
        {"name=free;token-bucket 1/s",
         "name=free is followed by ';'; the name comes before the first "
         "limit, with a space"},
        {"name=fr\"ee token-bucket 1/s",
         "policy name 'fr\"ee' has '\"'; a name is letters, digits, '.', '_' "
         "and '-'"},
        {"name=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
         " token-bucket 1/s",
         "policy name 'aaaaaaaaaaaaaaaa...' is longer than 64 bytes"},
        /* name= anywhere else is an option no algorithm takes */
        {"token-bucket 1/s name=x",
         "limit 1: unknown option 'name' (burst= for token-bucket, "
         "capacity= for leaky-bucket)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rate_policy_t *p = NULL;
        char err[256] = "";
        assert_int_equal(rate_policy_parse(cases[i].text, &p, err, sizeof err),
                         RATE_EPOLICY);
        assert_null(p);
        if (strcmp(err, cases[i].msg) != 0)
            fail_msg("'%s': got '%s'", cases[i].text, err);
    }
}

/* ------------------------------------------------------------ headers */

/* Checks the fields exactly, and that each non-empty one parses as a
 * list of string items with the expected integer parameters. */
static void expect_fields(const rate_headers_t *h, int status,
                          const char *policy, const char *ratelimit,
                          const char *retry, int line)
{
    if (h->status != status || strcmp(h->policy, policy) != 0 ||
        strcmp(h->ratelimit, ratelimit) != 0 ||
        strcmp(h->retry_after, retry) != 0)
        fail_msg("line %d: got status %d, RateLimit-Policy '%s', RateLimit "
                 "'%s', Retry-After '%s'",
                 line, h->status, h->policy, h->ratelimit, h->retry_after);
    sf_list_t pl, rl;
    if (policy[0] != '\0') {
        if (!sf_parse_list(h->policy, &pl))
            fail_msg("line %d: RateLimit-Policy: %s", line, pl.error);
        if (!sf_parse_list(h->ratelimit, &rl))
            fail_msg("line %d: RateLimit: %s", line, rl.error);
        assert_int_equal(pl.count, rl.count);
        for (size_t i = 0; i < pl.count; i++) {
            assert_int_equal(pl.item[i].value.type, SF_STRING);
            assert_int_equal(rl.item[i].value.type, SF_STRING);
            assert_string_equal(pl.item[i].value.text, rl.item[i].value.text);
            assert_true(sf_param_int(&pl.item[i], "q") >= 0);
            assert_true(sf_param_int(&pl.item[i], "w") >= 1);
            assert_true(sf_param_int(&rl.item[i], "r") >= 0);
            assert_true(sf_param_int(&rl.item[i], "t") >= 0);
            assert_true(sf_param_int(&rl.item[i], "r") <=
                        sf_param_int(&pl.item[i], "q"));
        }
    } else {
        assert_string_equal(ratelimit, "");
    }
    if (retry[0] != '\0') /* delay-seconds: 1*DIGIT */
        assert_int_equal(strspn(h->retry_after, "0123456789"),
                         strlen(h->retry_after));
}
#define EXPECT_FIELDS(h, st, pol, rl, ra) \
    expect_fields((h), (st), (pol), (rl), (ra), __LINE__)

static rate_headers_t fields_of(rate_limiter_t *lim, const char *key,
                                uint64_t t, uint64_t n, uint64_t max_wait)
{
    rate_decision_t d = at(lim, key, t, n, max_wait);
    rate_headers_t h;
    assert_int_equal(rate_headers_format(rate_limiter_policy(lim), &d, &h),
                     RATE_OK);
    return h;
}

static void token_bucket_cases(void **state)
{
    (void)state;
    rate_limiter_t *lim =
        limiter_of("name=free token-bucket 10/s burst=20", NULL);
    rate_headers_t h;

    /* q = burst 20, w = 20 tokens at 10/s = 2 s; one spent: r = 19, and a
     * token is back in 100 ms: t = 1 (rounded up). */
    h = fields_of(lim, "k", 0, 1, 0);
    EXPECT_FIELDS(&h, 0, "\"free\";q=20;w=2", "\"free\";r=19;t=1", "");
    for (int i = 0; i < 19; i++)
        (void)fields_of(lim, "k", 0, 1, 0);
    /* Empty: denied, a token back in 100 ms: Retry-After 1; full again in
     * 2 s. */
    h = fields_of(lim, "k", 0, 1, 0);
    EXPECT_FIELDS(&h, 429, "\"free\";q=20;w=2", "\"free\";r=0;t=2", "1");
    /* 19 permits at 1 s: 10 tokens are back, 9 short: 900 ms; rounded up. */
    h = fields_of(lim, "k", SEC, 19, 0);
    EXPECT_FIELDS(&h, 429, "\"free\";q=20;w=2", "\"free\";r=10;t=1", "1");
    /* Can never pass (above the burst): no Retry-After. */
    h = fields_of(lim, "k", SEC, 21, 0);
    EXPECT_FIELDS(&h, 429, "\"free\";q=20;w=2", "\"free\";r=10;t=1", "");
    rate_limiter_free(lim);

    /* Retry-After rounds up, and is exact on a whole second. */
    lim = limiter_of("name=slow token-bucket 1/3s burst=1", NULL);
    h = fields_of(lim, "k", 0, 1, 0);
    EXPECT_FIELDS(&h, 0, "\"slow\";q=1;w=3", "\"slow\";r=0;t=3", "");
    h = fields_of(lim, "k", 500 * MS, 1, 0); /* 2.5 s to wait */
    EXPECT_FIELDS(&h, 429, "\"slow\";q=1;w=3", "\"slow\";r=0;t=3", "3");
    h = fields_of(lim, "k", SEC, 1, 0); /* exactly 2 s */
    EXPECT_FIELDS(&h, 429, "\"slow\";q=1;w=3", "\"slow\";r=0;t=2", "2");
    h = fields_of(lim, "k", SEC + 1, 1, 0); /* 2 s less 1 ns */
    EXPECT_FIELDS(&h, 429, "\"slow\";q=1;w=3", "\"slow\";r=0;t=2", "2");
    /* A reservation: allowed after a wait of 2 s less 1 ns; the caller
     * serves it then, so no Retry-After; the debt repaid in 5 s. */
    h = fields_of(lim, "k", SEC + 1, 1, 3 * SEC);
    EXPECT_FIELDS(&h, 0, "\"slow\";q=1;w=3", "\"slow\";r=0;t=5", "");
    rate_limiter_free(lim);
}

static void other_algorithms_and_composites(void **state)
{
    (void)state;
    rate_limiter_t *lim;
    rate_headers_t h;

    /* A leaky bucket of capacity 10 draining 5/s: w = 2 s. */
    lim = limiter_of("name=pace leaky-bucket 5/s capacity=10", NULL);
    h = fields_of(lim, "k", 0, 4, 0);
    EXPECT_FIELDS(&h, 0, "\"pace\";q=10;w=2", "\"pace\";r=6;t=1", "");
    rate_limiter_free(lim);
    /* Windows: q = L, w = W. */
    lim = limiter_of("name=w sliding-window 100/1m", NULL);
    h = fields_of(lim, "k", 0, 1, 0);
    EXPECT_FIELDS(&h, 0, "\"w\";q=100;w=60", "\"w\";r=99;t=120", "");
    rate_limiter_free(lim);
    /* A window under a second is rounded up to 1 s (a smaller rate
     * advertised than allowed: a client that keeps to it is never
     * denied). */
    lim = limiter_of("fixed-window 10/500ms", NULL);
    h = fields_of(lim, "k", 0, 10, 0);
    EXPECT_FIELDS(&h, 0, "\"default\";q=10;w=1", "\"default\";r=0;t=1", "");
    h = fields_of(lim, "k", 100 * MS, 1, 0);
    EXPECT_FIELDS(&h, 429, "\"default\";q=10;w=1", "\"default\";r=0;t=1",
                  "1");
    rate_limiter_free(lim);
    /* A composite: the limit that denied is described (here the window,
     * component 1), Retry-After its 60 s. */
    lim = limiter_of("name=c token-bucket 10/s burst=10; fixed-window 5/m",
                     NULL);
    for (int i = 0; i < 5; i++)
        (void)fields_of(lim, "k", 0, 1, 0);
    h = fields_of(lim, "k", 0, 1, 0);
    EXPECT_FIELDS(&h, 429, "\"c\";q=5;w=60", "\"c\";r=0;t=60", "60");
    rate_limiter_free(lim);
    /* Admitted, a composite is described by its bucket (the least room),
     * and t is that bucket's: back to whole in a second, not the hour's
     * window the decision's reset_after (the largest of the limits) ends
     * with. */
    lim = limiter_of("name=c token-bucket 10/s burst=5; fixed-window 8/h",
                     NULL);
    h = fields_of(lim, "k", 0, 1, 0);
    EXPECT_FIELDS(&h, 0, "\"c\";q=5;w=1", "\"c\";r=4;t=1", "");
    rate_limiter_free(lim);
    lim = limiter_of("name=p leaky-bucket 5/s capacity=10; fixed-window "
                     "100/h", NULL);
    h = fields_of(lim, "k", 0, 4, 0);
    EXPECT_FIELDS(&h, 0, "\"p\";q=10;w=2", "\"p\";r=6;t=1", "");
    rate_limiter_free(lim);
}

static void unlimited_shadow_and_store_errors(void **state)
{
    (void)state;
    rate_limiter_t *lim;
    rate_headers_t h;

    /* Unlimited: serve, and no field at all. */
    lim = limiter_of("name=enterprise unlimited", NULL);
    h = fields_of(lim, "k", 0, 1000, 0);
    EXPECT_FIELDS(&h, 0, "", "", "");
    rate_limiter_free(lim);

    /* Shadow mode: a denial let through advertises nothing. */
    rate_limiter_config_t cfg = {.shadow = true};
    lim = limiter_cfg("name=try token-bucket 1/s burst=1", cfg);
    h = fields_of(lim, "k", 0, 1, 0);
    EXPECT_FIELDS(&h, 0, "\"try\";q=1;w=1", "\"try\";r=0;t=1", "");
    h = fields_of(lim, "k", 0, 1, 0);
    EXPECT_FIELDS(&h, 0, "", "", "");
    rate_limiter_free(lim);

    /* Store errors, on a store that is down. */
    static const struct {
        rate_fail_mode_t mode;
        int status;
        const char *policy, *ratelimit;
    } modes[] = {
        {RATE_FAIL_CLOSED, 503, "", ""},
        {RATE_FAIL_OPEN, 0, "", ""},
        /* the fallback's own decision, a fresh key there */
        {RATE_FAIL_FALLBACK, 0, "\"f\";q=2;w=2", "\"f\";r=1;t=1"},
    };
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        rate_store_t *store;
        cas_store_t *hs;
        assert_int_equal(cas_store_new(&store, &hs), RATE_OK);
        rate_limiter_config_t c = {.store = store,
                                   .on_store_error = modes[i].mode};
        lim = limiter_cfg("name=f token-bucket 1/s burst=2", c);
        cas_store_set_down(hs, 1);
        rate_decision_t d = at(lim, "k", 0, 1, 0);
        assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
        assert_int_equal(rate_headers_format(rate_limiter_policy(lim), &d, &h),
                         RATE_OK);
        expect_fields(&h, modes[i].status, modes[i].policy,
                      modes[i].ratelimit, "", (int)i);
        if (modes[i].mode == RATE_FAIL_FALLBACK) { /* the fallback denies */
            (void)at(lim, "k", 0, 1, 0);
            d = at(lim, "k", 0, 1, 0);
            assert_int_equal(rate_headers_format(rate_limiter_policy(lim), &d,
                                                 &h),
                             RATE_OK);
            EXPECT_FIELDS(&h, 429, "\"f\";q=2;w=2", "\"f\";r=0;t=2", "1");
        }
        rate_limiter_free(lim);
        rate_store_free(store);
    }
    /* Bad input. */
    rate_policy_t *p = policy_of("token-bucket 1/s");
    rate_decision_t d = {0};
    assert_int_equal(rate_headers_format(NULL, &d, &h), RATE_EINVAL);
    assert_int_equal(rate_headers_format(p, NULL, &h), RATE_EINVAL);
    assert_int_equal(rate_headers_format(p, &d, NULL), RATE_EINVAL);
    /* An outcome filled by hand whose limit is none: refused, no crash. */
    rate_outcome_t o = {0};
    o.count = 1;
    o.applied[0].limit = *rate_policy_limit(p, 0);
    assert_int_equal(rate_outcome_headers(&o, &h), RATE_OK);
    o.applied[0].limit.limit = 0; /* a bucket refilling 0 per period */
    memset(&h, 0xff, sizeof h);
    assert_int_equal(rate_outcome_headers(&o, &h), RATE_EINVAL);
    assert_int_equal(h.status, 0);
    assert_string_equal(h.policy, "");
    o.applied[0].limit.limit = 1;
    o.applied[0].limit.algorithm = (rate_algorithm_t)9;
    assert_int_equal(rate_outcome_headers(&o, &h), RATE_EINVAL);
    o.applied[0].unlimited = true; /* no limit to describe */
    assert_int_equal(rate_outcome_headers(&o, &h), RATE_OK);
    /* a name that fills its array with no NUL: refused, not read past */
    o.applied[0].unlimited = false;
    o.applied[0].limit = *rate_policy_limit(p, 0);
    memset(o.applied[0].policy_name, 'n', sizeof o.applied[0].policy_name);
    assert_int_equal(rate_outcome_headers(&o, &h), RATE_EINVAL);
    rate_policy_free(p);
}

/* The checker itself: it must refuse what is not a list. */
static void checker_refuses_bad_fields(void **state)
{
    (void)state;
    static const char *bad[] = {
        "",
        "\"a\";q=1,",
        "\"a\" \"b\"",
        "\"a;q=1",
        "\"a\";Q=1",
        "\"a\";q=1;q=2",
        "\"a\";q=1.5",
        "\"a\";q=1234567890123456",
        "(\"a\")",
        "\"a\\x\"",
    };
    sf_list_t l;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (sf_parse_list(bad[i], &l))
            fail_msg("'%s' parsed as a list", bad[i]);
    assert_true(sf_parse_list("\"a\";q=1;w=2, tok;r=0 , \"b\\\"\";x", &l));
    assert_int_equal(l.count, 3);
    assert_string_equal(l.item[1].value.text, "tok");
    assert_string_equal(l.item[2].value.text, "b\"");
    assert_int_equal(l.item[2].param[0].type, SF_BOOLEAN);
}

/* ------------------------------------------------------------ listener */

typedef struct heard {
    unsigned count, allowed, denied, errors;
    char last_key[32], last_name[32];
    rate_reason_t last_reason;
    bool last_had_record;
} heard_t;

static void listen(void *ud, const rate_event_t *ev)
{
    heard_t *h = ud;
    h->count++;
    if (ev->allowed)
        h->allowed++;
    else
        h->denied++;
    if (ev->error != 0)
        h->errors++;
    snprintf(h->last_key, sizeof h->last_key, "%.*s", (int)ev->key_len,
             ev->key);
    snprintf(h->last_name, sizeof h->last_name, "%s", ev->policy_name);
    h->last_reason = ev->reason;
    h->last_had_record = ev->decision != NULL;
}

static void listener_hears_every_decision(void **state)
{
    (void)state;
    heard_t h = {0};
    rate_limiter_config_t cfg = {.listener = listen, .listener_ud = &h};
    rate_limiter_t *lim = limiter_cfg("name=free token-bucket 1/s burst=2",
                                      cfg);
    /* The bool calls (the first is the general path: a new key; then the
     * store's acquire()). */
    assert_true(rate_try_acquire_at(lim, "user:1", 1, 0));
    assert_true(rate_try_acquire_at(lim, "user:1", 1, 0));
    assert_false(rate_try_acquire_at(lim, "user:1", 1, 0));
    assert_int_equal(h.count, 3);
    assert_int_equal(h.allowed, 2);
    assert_int_equal(h.denied, 1);
    assert_string_equal(h.last_key, "user:1");
    assert_string_equal(h.last_name, "free");
    assert_int_equal(h.last_reason, RATE_REASON_LIMITED);
    /* The full call: the record comes along. */
    (void)at(lim, "user:2", 0, 5, 0);
    assert_int_equal(h.count, 4);
    assert_int_equal(h.last_reason, RATE_REASON_NEVER);
    assert_true(h.last_had_record);
    /* Bad input is no decision. */
    rate_decision_t d;
    assert_int_equal(rate_limiter_check_at(lim, "", 0, 1, 0, 0, &d),
                     RATE_EKEY);
    assert_int_equal(h.count, 4);
    rate_limiter_free(lim);

    /* Store errors are heard with their code; a shadow denial as allowed. */
    rate_store_t *store;
    cas_store_t *hs;
    assert_int_equal(cas_store_new(&store, &hs), RATE_OK);
    memset(&h, 0, sizeof h);
    cfg = (rate_limiter_config_t){.store = store, .listener = listen,
                                  .listener_ud = &h, .shadow = true};
    lim = limiter_cfg("token-bucket 1/s burst=1", cfg);
    assert_true(rate_try_acquire_at(lim, "k", 1, 0));
    assert_true(rate_try_acquire_at(lim, "k", 1, 0)); /* shadowed */
    assert_int_equal(h.allowed, 2);
    assert_string_equal(h.last_name, "");
    cas_store_set_down(hs, 1);
    assert_true(rate_try_acquire_at(lim, "k", 1, 0));
    assert_int_equal(h.errors, 1);
    assert_int_equal(h.last_reason, RATE_REASON_STORE_ERROR);
    rate_limiter_free(lim);
    rate_store_free(store);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(names_in_text_and_from_c),
        cmocka_unit_test(name_errors),
        cmocka_unit_test(token_bucket_cases),
        cmocka_unit_test(other_algorithms_and_composites),
        cmocka_unit_test(unlimited_shadow_and_store_errors),
        cmocka_unit_test(checker_refuses_bad_fields),
        cmocka_unit_test(listener_hears_every_decision),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
