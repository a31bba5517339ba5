/* SPDX-License-Identifier: MIT */
/*
 * The policy text form and validation: every bad part gets an error that
 * names it.
 */
#include "lib/helpers.h"

/* Two limits field by field (a struct's padding is not data). */
static void expect_same_limit(const rate_limit_t *a, const rate_limit_t *b)
{
    assert_int_equal(a->algorithm, b->algorithm);
    assert_int_equal(a->limit, b->limit);
    assert_int_equal(a->period_ns, b->period_ns);
    assert_int_equal(a->burst, b->burst);
    assert_int_equal(a->block_ns, b->block_ns);
}

static void parses_each_algorithm(void **state)
{
    (void)state;
    struct {
        const char *text;
        rate_algorithm_t algo;
        uint64_t limit, period, burst;
        const char *canonical;
    } cases[] = {
        {"token-bucket 10/s burst=20", RATE_TOKEN_BUCKET, 10, SEC, 20,
         "token-bucket 10/s burst=20"},
        {"gcra 3/500ms burst=1", RATE_TOKEN_BUCKET, 3, 500 * MS, 1,
         "token-bucket 3/500ms burst=1"},
        {"token-bucket 10/s", RATE_TOKEN_BUCKET, 10, SEC, 10,
         "token-bucket 10/s burst=10"},
        {"  leaky-bucket\t5/2s  capacity=7 ", RATE_LEAKY_BUCKET, 5, 2 * SEC, 7,
         "leaky-bucket 5/2s capacity=7"},
        {"fixed-window 100/1m", RATE_FIXED_WINDOW, 100, 60 * SEC, 0,
         "fixed-window 100/m"},
        {"sliding-log 100/90s", RATE_SLIDING_LOG, 100, 90 * SEC, 0,
         "sliding-log 100/90s"},
        {"sliding-window 1000/1h", RATE_SLIDING_WINDOW, 1000, 3600 * SEC, 0,
         "sliding-window 1000/h"},
        {"sliding-window-counter 5/250us", RATE_SLIDING_WINDOW, 5, 250000, 0,
         "sliding-window 5/250us"},
        {"fixed-window 1/7ns", RATE_FIXED_WINDOW, 1, 7, 0,
         "fixed-window 1/7ns"},
        {"fixed-window 2/d", RATE_FIXED_WINDOW, 2, 86400 * SEC, 0,
         "fixed-window 2/d"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rate_policy_t *p = policy_of(cases[i].text);
        const rate_limit_t *l = rate_policy_limit(p, 0);
        char buf[128];
        assert_int_equal(rate_policy_count(p), 1);
        assert_int_equal(l->algorithm, cases[i].algo);
        assert_int_equal(l->limit, cases[i].limit);
        assert_int_equal(l->period_ns, cases[i].period);
        assert_int_equal(l->burst, cases[i].burst);
        rate_policy_format(p, buf, sizeof buf);
        assert_string_equal(buf, cases[i].canonical);
        rate_policy_free(p);
    }
}

static void composite_round_trip(void **state)
{
    (void)state;
    rate_policy_t *p =
        policy_of("token-bucket 10/s burst=10; sliding-window 1000/1h");
    char buf[128];
    assert_int_equal(rate_policy_count(p), 2);
    assert_int_equal(rate_policy_limit(p, 1)->algorithm, RATE_SLIDING_WINDOW);
    assert_null(rate_policy_limit(p, 2));
    size_t need = rate_policy_format(p, buf, sizeof buf);
    assert_string_equal(buf, "token-bucket 10/s burst=10; sliding-window 1000/h");
    assert_int_equal(need, strlen(buf));
    /* Truncation still terminates the string and reports the full size. */
    assert_int_equal(rate_policy_format(p, buf, 8), need);
    assert_int_equal(strlen(buf), 7);
    /* The canonical text parses back to the same policy. */
    rate_policy_format(p, buf, sizeof buf);
    rate_policy_t *q = policy_of(buf);
    expect_same_limit(rate_policy_limit(q, 1), rate_policy_limit(p, 1));
    rate_policy_free(q);
    rate_policy_free(p);
}

static void errors_name_the_bad_part(void **state)
{
    (void)state;
    struct {
        const char *text;
        const char *needle;
    } cases[] = {
        {"token-bucket 0/s burst=1", "count is zero"},
        {"token-bucket 10/0s burst=1", "period is zero"},
        {"fixed-window 10/0ms", "window is zero"},
        {"token-bucket 10/s burst=0", "burst is zero"},
        {"leaky-bucket 10/s capacity=0", "capacity is zero"},
        {"token-bucket 10/fortnight", "'fortnight'"},
        {"token-bucket 10/3x", "'3x'"},
        {"token-bucket 10 burst=1", "not COUNT/DURATION"},
        {"token-bucket x/s", "count 'x'"},
        {"token-bucket -1/s", "count '-1'"},
        {"token-bucket 99999999999999999999/s", "count"},
        {"token-bucket 1/99999999999d", "above 2^63-1"},
        {"token-bucket 10/s capacity=3", "does not belong to token-bucket"},
        {"leaky-bucket 10/s burst=3", "does not belong to leaky-bucket"},
        {"fixed-window 10/s burst=3", "does not belong to fixed-window"},
        {"token-bucket 10/s speed=3", "unknown option 'speed'"},
        {"token-bucket 10/s burst", "not NAME=VALUE"},
        {"token-bucket 10/s burst=1x", "burst value '1x'"},
        {"token-bucket 1/36500d burst=2", "above 2^61 ns"},
        {"leaky-bucket 1/36500d capacity=2", "above 2^61 ns"},
        {"fixed-window 10/36500d", "above 2^61"},
        {"sliding-log 20000/s", "limit 20000 above 10000"},
        {"tocken-bucket 10/s", "unknown algorithm 'tocken-bucket'"},
        {"token-bucket", "needs a rate"},
        {"", "limit 1 is empty"},
        {"fixed-window 1/s;", "limit 2 is empty"},
        {"fixed-window 1/s; fixed-window 1/s; fixed-window 1/s; "
         "fixed-window 1/s; fixed-window 1/s",
         "more than 4 limits"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rate_policy_t *p = (rate_policy_t *)1;
        char err[256] = "";
        int rc = rate_policy_parse(cases[i].text, &p, err, sizeof err);
        if (rc != RATE_EPOLICY || p != NULL ||
            strstr(err, cases[i].needle) == NULL)
            fail_msg("'%s': rc=%d err='%s', wanted '%s'", cases[i].text, rc,
                     err, cases[i].needle);
    }
    rate_policy_t *p;
    assert_int_equal(rate_policy_parse(NULL, &p, NULL, 0), RATE_EPOLICY);
    assert_int_equal(rate_policy_parse("gcra 1/s", NULL, NULL, 0), RATE_EINVAL);
}

static void from_c(void **state)
{
    (void)state;
    rate_limit_t l[2] = {
        {RATE_TOKEN_BUCKET, 5, SEC, 10, 0, {0}},
        {RATE_SLIDING_LOG, 100, 60 * SEC, 0, 0, {0}},
    };
    rate_policy_t *p = NULL;
    char err[200];
    assert_int_equal(rate_policy_new(l, 2, &p, err, sizeof err), RATE_OK);
    assert_int_equal(rate_policy_count(p), 2);
    rate_policy_free(p);
    l[1].burst = 3;
    assert_int_equal(rate_policy_new(l, 2, &p, err, sizeof err), RATE_EPOLICY);
    assert_non_null(strstr(err, "limit 2"));
    l[1].burst = 0;
    l[0].algorithm = (rate_algorithm_t)42;
    assert_int_equal(rate_policy_new(l, 2, &p, err, sizeof err), RATE_EPOLICY);
    assert_non_null(strstr(err, "unknown algorithm"));
    assert_int_equal(rate_policy_new(l, 0, &p, err, sizeof err), RATE_EPOLICY);
    assert_int_equal(rate_policy_new(NULL, 1, &p, err, sizeof err),
                     RATE_EPOLICY);
    rate_policy_free(NULL);
}

/* Every count up to 2^53 (and on to 2^63-1) and every period up to 2^61
 * ns is a policy; a longer bucket period still needs B * P <= 2^62. */
static void bounds(void **state)
{
    (void)state;
    const uint64_t c53 = UINT64_C(1) << 53, p61 = UINT64_C(1) << 61;
    const uint64_t max = (uint64_t)INT64_MAX;
    rate_limit_t ok[] = {
        {RATE_TOKEN_BUCKET, c53, p61, c53, 0, {0}},
        {RATE_LEAKY_BUCKET, c53, p61, c53, 0, {0}},
        {RATE_FIXED_WINDOW, c53, p61, 0, 0, {0}},
        {RATE_SLIDING_WINDOW, c53, p61, 0, 0, {0}},
        {RATE_TOKEN_BUCKET, max, p61, max, 0, {0}},
        {RATE_LEAKY_BUCKET, 1, p61, max, 0, {0}},
        {RATE_FIXED_WINDOW, max, p61, 0, 0, {0}},
        {RATE_TOKEN_BUCKET, 1, UINT64_C(1) << 62, 1, 0, {0}}, /* narrow, as before */
        {RATE_TOKEN_BUCKET, 100000, 86400 * SEC, 100000, 0, {0}},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        rate_policy_t *p = NULL;
        char err[256] = "", buf[160];
        if (rate_policy_new(&ok[i], 1, &p, err, sizeof err) != RATE_OK)
            fail_msg("case %zu: %s", i, err);
        /* The canonical text parses back to the same limit. */
        rate_policy_format(p, buf, sizeof buf);
        rate_policy_t *q = policy_of(buf);
        expect_same_limit(rate_policy_limit(q, 0), &ok[i]);
        rate_policy_free(q);
        rate_policy_free(p);
    }
    rate_limit_t bad[] = {
        {RATE_TOKEN_BUCKET, 1, p61 + 1, 3, 0, {0}},
        {RATE_LEAKY_BUCKET, 1, UINT64_C(1) << 62, 2, 0, {0}},
        {RATE_FIXED_WINDOW, 1, p61 + 1, 0, 0, {0}},
        {RATE_TOKEN_BUCKET, 1, SEC, max + 1, 0, {0}},
        {RATE_TOKEN_BUCKET, max + 1, SEC, 1, 0, {0}},
    };
    const char *why[] = {"above 2^61 ns", "above 2^61 ns", "above 2^61 ns",
                         "above 2^63-1", "above 2^63-1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rate_policy_t *p = (rate_policy_t *)1;
        char err[256] = "";
        int rc = rate_policy_new(&bad[i], 1, &p, err, sizeof err);
        if (rc != RATE_EPOLICY || p != NULL || strstr(err, why[i]) == NULL)
            fail_msg("bad case %zu: rc=%d err='%s'", i, rc, err);
    }
    /* The text forms of the issue. */
    rate_policy_t *p = policy_of("token-bucket 100000/1d burst=100000");
    assert_int_equal(rate_policy_limit(p, 0)->burst, 100000);
    rate_policy_free(p);
    p = policy_of("leaky-bucket 9007199254740992/2305843009213693952ns "
                  "capacity=9007199254740992");
    assert_int_equal(rate_policy_limit(p, 0)->period_ns, p61);
    rate_policy_free(p);
}

/* The wide layout decides as the narrow one does: the same trace under
 * B * P just below 2^62 (narrow) and just above (wide), where the two
 * policies differ only by one token of burst that the trace never
 * reaches. */
static void wide_decides_as_narrow(void **state)
{
    (void)state;
    /* 53375 * 86400 s = 4.61160e18 <= 2^62 < 53376 * 86400 s. */
    const char *pairs[][2] = {
        {"token-bucket 100000/d burst=53375",
         "token-bucket 100000/d burst=53376"},
        {"leaky-bucket 100000/d capacity=53375",
         "leaky-bucket 100000/d capacity=53376"},
    };
    for (size_t k = 0; k < 2; k++) {
        rate_limiter_t *a = limiter_of(pairs[k][0], NULL);
        rate_limiter_t *b = limiter_of(pairs[k][1], NULL);
        uint64_t t = 0, x = 7;
        for (int i = 0; i < 2000; i++) {
            x = x * 6364136223846793005u + 1442695040888963407u;
            t += (x >> 33) % (3 * SEC);
            /* Token bucket: take a few at a time, once the bucket is
             * drained never near the burst.  Leaky: queue with waits. */
            uint64_t n = k == 0 && i < 2 ? 26000 : (x >> 20) % 4;
            uint64_t mw = (x >> 40) % 3 == 0 ? (x >> 8) % (5 * SEC) : 0;
            rate_decision_t da = at(a, "k", t, n, mw);
            rate_decision_t db = at(b, "k", t, n, mw);
            if (da.allowed != db.allowed || da.reason != db.reason ||
                da.delay_ns != db.delay_ns ||
                da.retry_after_ns != db.retry_after_ns ||
                (da.remaining != db.remaining &&
                 da.remaining + 1 != db.remaining))
                fail_msg("%s, step %d: allowed %d/%d delay %llu/%llu retry "
                         "%llu/%llu remaining %llu/%llu",
                         pairs[k][1], i, da.allowed, db.allowed,
                         (unsigned long long)da.delay_ns,
                         (unsigned long long)db.delay_ns,
                         (unsigned long long)da.retry_after_ns,
                         (unsigned long long)db.retry_after_ns,
                         (unsigned long long)da.remaining,
                         (unsigned long long)db.remaining);
        }
        rate_limiter_free(a);
        rate_limiter_free(b);
    }
}

/* A key's tokens carry over between the layouts, both ways. */
static void carries_between_layouts(void **state)
{
    (void)state;
    rate_policy_t *narrow = policy_of("token-bucket 100000/d burst=50000");
    rate_policy_t *wide = policy_of("token-bucket 100000/d burst=100000");
    rate_limiter_config_t cfg = {0};
    rate_limiter_t *l = NULL;
    cfg.policy = narrow;
    assert_int_equal(rate_limiter_new(&cfg, &l), RATE_OK);
    /* 864 ms per token. */
    EXPECT(l, 0, 46625, 0, true, 3375, 0, 0, 46625 * 864 * MS);
    assert_int_equal(rate_limiter_set_policy(l, wide), RATE_OK);
    /* 3375 tokens carried; the day-long bucket is 96625 short. */
    EXPECT(l, 0, 0, 0, true, 3375, 0, 0, 96625 * 864 * MS);
    EXPECT(l, 0, 3375, 0, true, 0, 0, 0, 86400 * SEC);
    /* A reservation's debt: one token, 864 ms away. */
    EXPECT(l, 0, 1, 864 * MS, true, 0, 864 * MS, 0, 86400 * SEC + 864 * MS);
    assert_int_equal(rate_limiter_set_policy(l, narrow), RATE_OK);
    /* The debt carries back: the next token 1728 ms away. */
    EXPECT(l, 0, 1, 0, false, 0, 0, 1728 * MS, 50001 * 864 * MS);
    EXPECT(l, 1728 * MS, 1, 0, true, 0, 0, 0, 50000 * 864 * MS);
    rate_limiter_free(l);
    rate_policy_free(narrow);
    rate_policy_free(wide);
}

/* The unlimited policy: text and C forms, alone only. */
static void unlimited_policy(void **state)
{
    (void)state;
    rate_policy_t *p = policy_of("  unlimited\t"), *q = NULL;
    char buf[64];
    assert_true(rate_policy_is_unlimited(p));
    assert_int_equal(rate_policy_count(p), 0);
    assert_null(rate_policy_limit(p, 0));
    assert_int_equal(rate_policy_format(p, buf, sizeof buf), 9);
    assert_string_equal(buf, "unlimited");
    assert_int_equal(rate_policy_unlimited(&q), RATE_OK);
    assert_true(rate_policy_is_unlimited(q));
    assert_int_equal(rate_policy_fingerprint(p), rate_policy_fingerprint(q));
    rate_policy_t *tb = policy_of("token-bucket 1/s burst=1");
    assert_false(rate_policy_is_unlimited(tb));
    assert_false(rate_policy_is_unlimited(NULL));
    assert_int_not_equal(rate_policy_fingerprint(p), rate_policy_fingerprint(tb));
    rate_policy_free(tb);
    rate_policy_free(q);
    rate_policy_free(p);
    assert_int_equal(rate_policy_unlimited(NULL), RATE_EINVAL);
    const char *bad[][2] = {
        {"unlimited 10/s", "'unlimited' takes no rate"},
        {"unlimited; token-bucket 1/s", "limit 2: 'unlimited' stands alone"},
        {"token-bucket 1/s; unlimited", "limit 2: 'unlimited' stands alone"},
        {"unlimited; unlimited", "stands alone"},
        {"name=a name=b token-bucket 1/s", "name= given twice"},
        {"unlimited;", "limit 2 is empty"},
        {"Unlimited", "unknown algorithm 'Unlimited'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rate_policy_t *x = (rate_policy_t *)1;
        char err[256] = "";
        int rc = rate_policy_parse(bad[i][0], &x, err, sizeof err);
        if (rc != RATE_EPOLICY || x != NULL || strstr(err, bad[i][1]) == NULL)
            fail_msg("'%s': rc=%d err='%s'", bad[i][0], rc, err);
    }
}

static void expect_unlimited(const rate_decision_t *d)
{
    assert_true(d->allowed);
    assert_false(d->shadow);
    assert_int_equal(d->reason, RATE_REASON_ALLOWED);
    assert_int_equal(d->component, -1);
    assert_int_equal(d->limit, RATE_NO_LIMIT);
    assert_int_equal(d->remaining, RATE_NO_LIMIT);
    assert_int_equal(d->delay_ns, 0);
    assert_int_equal(d->retry_after_ns, 0);
    assert_int_equal(d->reset_after_ns, 0);
}

/* A resolver giving the enterprise tier to keys starting with 'e'. */
static const rate_policy_t *tier_of(void *ud, const char *key, size_t len)
{
    return len > 0 && key[0] == 'e' ? ud : NULL;
}

/* Under the unlimited policy every request passes and no store sees a
 * thing (not even the policy's record): the default policy, a resolver's
 * tier, the bool calls, a store that fails. */
static void unlimited_limiter(void **state)
{
    (void)state;
    rate_policy_t *unl = policy_of("unlimited");
    rate_store_t *cas = NULL;
    cas_store_t *cs = NULL;
    assert_int_equal(cas_store_new(&cas, &cs), RATE_OK);
    cas_store_set_down(cs, 1); /* any call to it would be a store error */
    rate_limiter_config_t cfg = {0};
    rate_limiter_t *l = NULL;
    rate_decision_t d;
    cfg.policy = unl;
    cfg.store = cas;
    assert_int_equal(rate_limiter_new(&cfg, &l), RATE_OK);
    for (uint64_t n = 0; n < 4; n++) {
        assert_int_equal(rate_limiter_check_at(l, "k", 1, n * 1000000, n,
                                               n * SEC, &d),
                         RATE_OK);
        expect_unlimited(&d);
        assert_true(rate_try_acquire_at(l, "k", RATE_TIME_MAX, n));
        assert_true(rate_try_acquire(l, "k", 1));
    }
    assert_int_equal(rate_limiter_acquire(l, "k", 1, RATE_TIME_MAX, 0, &d),
                     RATE_OK);
    expect_unlimited(&d);
    /* Bad input is still bad input. */
    assert_int_equal(rate_limiter_check_at(l, "", 0, 1, 0, 0, &d), RATE_EKEY);
    assert_false(rate_try_acquire_at(l, "k", 1, RATE_TIME_MAX + 1));
    cas_store_set_down(cs, 0);
    rate_stats_t st;
    assert_int_equal(rate_limiter_stats(l, &st), RATE_OK);
    assert_int_equal(st.keys, 0); /* no state, no policy record */
    assert_int_equal(st.store_errors, 0);
    assert_int_equal(st.allowed, 13);
    rate_limiter_free(l);

    /* A tier: 'e' keys unlimited, the rest one per second. */
    rate_policy_t *free_tier = policy_of("token-bucket 1/s burst=1");
    cfg.policy = free_tier;
    cfg.resolve = tier_of;
    cfg.resolve_ud = unl;
    assert_int_equal(rate_limiter_new(&cfg, &l), RATE_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(rate_limiter_check_at(l, "ent", 3, 5, 0, 0, &d),
                         RATE_OK);
        expect_unlimited(&d);
        assert_int_equal(rate_limiter_check_at(l, "free", 4, 1, 0, 0, &d),
                         RATE_OK);
        assert_int_equal(d.allowed, i == 0);
    }
    assert_int_equal(rate_limiter_stats(l, &st), RATE_OK);
    assert_int_equal(st.keys, 1); /* "free" alone */
    rate_limiter_free(l);
    rate_store_free(cas);

    /* Set as a limiter's policy later: the key's state stays as it was
     * (nothing charged) and counts again once the policy is back. */
    l = limiter_of("token-bucket 1/s burst=1", NULL);
    assert_true(rate_try_acquire_at(l, "k", 1, 0));
    assert_int_equal(rate_limiter_set_policy(l, unl), RATE_OK);
    assert_true(rate_try_acquire_at(l, "k", 1, 0));
    assert_int_equal(rate_limiter_set_policy(l, free_tier), RATE_OK);
    assert_false(rate_try_acquire_at(l, "k", 1, SEC - 1));
    assert_true(rate_try_acquire_at(l, "k", 1, SEC));
    rate_limiter_free(l);
    rate_policy_free(free_tier);
    rate_policy_free(unl);
}

static void durations(void **state)
{
    (void)state;
    uint64_t ns;
    assert_int_equal(rate_parse_duration("250ms", &ns, NULL, 0), RATE_OK);
    assert_int_equal(ns, 250 * MS);
    assert_int_equal(rate_parse_duration("0", &ns, NULL, 0), RATE_OK);
    assert_int_equal(ns, 0);
    assert_int_equal(rate_parse_duration("2h", &ns, NULL, 0), RATE_OK);
    assert_int_equal(ns, 7200 * SEC);
    assert_int_equal(rate_parse_duration("s", &ns, NULL, 0), RATE_EINVAL);
    assert_int_equal(rate_parse_duration("5", &ns, NULL, 0), RATE_EINVAL);
    assert_int_equal(rate_parse_duration("1.5s", &ns, NULL, 0), RATE_EINVAL);
    assert_int_equal(rate_parse_duration("107000d", &ns, NULL, 0), RATE_ERANGE);
    assert_int_equal(rate_parse_duration(NULL, &ns, NULL, 0), RATE_EINVAL);
}

/* The exported name, rate and unit parsers (the command's), and the
 * strict text form. */
static void names_rates_and_units(void **state)
{
    (void)state;
    struct {
        const char *name;
        rate_algorithm_t a;
    } names[] = {
        {"token-bucket", RATE_TOKEN_BUCKET}, {"gcra", RATE_TOKEN_BUCKET},
        {"leaky-bucket", RATE_LEAKY_BUCKET}, {"fixed-window", RATE_FIXED_WINDOW},
        {"sliding-log", RATE_SLIDING_LOG},
        {"sliding-window-log", RATE_SLIDING_LOG},
        {"sliding-window", RATE_SLIDING_WINDOW},
        {"sliding-window-counter", RATE_SLIDING_WINDOW},
    };
    rate_algorithm_t a;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        assert_int_equal(rate_algorithm_parse(names[i].name, &a), RATE_OK);
        assert_int_equal(a, names[i].a);
    }
    assert_string_equal(rate_algorithm_name(RATE_TOKEN_BUCKET), "token-bucket");
    assert_string_equal(rate_algorithm_name(RATE_SLIDING_WINDOW),
                        "sliding-window");
    assert_null(rate_algorithm_name((rate_algorithm_t)0));
    assert_null(rate_algorithm_name((rate_algorithm_t)6));
    assert_int_equal(rate_algorithm_parse("Gcra", &a), RATE_EINVAL);
    assert_int_equal(rate_algorithm_parse("unlimited", &a), RATE_EINVAL);
    assert_int_equal(rate_algorithm_parse(NULL, &a), RATE_EINVAL);

    struct {
        const char *text;
        uint64_t count, period;
    } rates[] = {
        {"10/sec", 10, SEC},          {"1/min", 1, 60 * SEC},
        {"100/hour", 100, 3600 * SEC}, {"1/day", 1, 86400 * SEC},
        {"5/2days", 5, 2 * 86400 * SEC}, {"3/500msec", 3, 500 * MS},
        {"7/10usec", 7, 10000},       {"1/nsec", 1, 1},
        {"2/3hrs", 2, 3 * 3600 * SEC}, {"4/seconds", 4, SEC},
        {"1/millisecond", 1, MS},     {"9/microseconds", 9, 1000},
        {"1/nanoseconds", 1, 1},      {"6/15minutes", 6, 900 * SEC},
        {"10/s", 10, SEC},            {"3/500ms", 3, 500 * MS},
    };
    for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++) {
        uint64_t c = 0, per = 0;
        if (rate_parse_rate(rates[i].text, &c, &per, NULL, 0) != RATE_OK ||
            c != rates[i].count || per != rates[i].period)
            fail_msg("rate '%s': %llu/%llu", rates[i].text,
                     (unsigned long long)c, (unsigned long long)per);
    }
    uint64_t c, per;
    assert_int_equal(rate_parse_rate("10", &c, &per, NULL, 0), RATE_EINVAL);
    assert_int_equal(rate_parse_rate("0/s", &c, &per, NULL, 0), RATE_EINVAL);
    assert_int_equal(rate_parse_rate("1/0s", &c, &per, NULL, 0), RATE_EINVAL);
    assert_int_equal(rate_parse_rate("1/1.5s", &c, &per, NULL, 0), RATE_EINVAL);
    assert_int_equal(rate_parse_rate("1/Sec", &c, &per, NULL, 0), RATE_EINVAL);
    assert_int_equal(rate_parse_rate("99999999999999999999/s", &c, &per, NULL, 0),
                     RATE_ERANGE);
    assert_int_equal(rate_parse_rate("1/999999999999d", &c, &per, NULL, 0),
                     RATE_ERANGE);
    assert_int_equal(rate_parse_rate(NULL, &c, &per, NULL, 0), RATE_EINVAL);
    uint64_t ns;
    assert_int_equal(rate_parse_duration("2hours", &ns, NULL, 0), RATE_OK);
    assert_int_equal(ns, 7200 * SEC);
    assert_int_equal(rate_parse_duration("90secs", &ns, NULL, 0), RATE_OK);
    assert_int_equal(ns, 90 * SEC);
    assert_int_equal(rate_parse_duration("1day", &ns, NULL, 0), RATE_OK);
    assert_int_equal(ns, 86400 * SEC);
    assert_int_equal(rate_parse_duration("sec", &ns, NULL, 0), RATE_EINVAL);

    /* The text form takes the same words, and prints the short ones. */
    rate_policy_t *p = policy_of("token-bucket 100/hour burst=5");
    char buf[128];
    rate_policy_format(p, buf, sizeof buf);
    assert_string_equal(buf, "token-bucket 100/h burst=5");
    rate_policy_free(p);
    p = policy_of("sliding-window 10/90seconds");
    rate_policy_format(p, buf, sizeof buf);
    assert_string_equal(buf, "sliding-window 10/90s");
    rate_policy_free(p);

    struct {
        const char *text, *needle;
    } bad[] = {
        {"token-bucket 10/s\nburst=3", "a newline in the text"},
        {"token-bucket 10/s\rburst=3", "carriage return"},
        {"token-bucket\v10/s", "vertical tab"},
        {"token-bucket\f10/s", "form feed"},
        {"fixed-window 1/s;\nfixed-window 2/m", "limit 2: a newline"},
        {"token-bucket 10/s burst=3 burst=4", "burst= given twice"},
        {"leaky-bucket 10/s capacity=3 capacity=3", "capacity= given twice"},
        {"token-bucket 10/1.5s", "write '1500ms'"},
        {"token-bucket 10/0.25h", "write '15m'"},
        {"token-bucket 10/2.5ns", "whole numbers of a unit (the smallest is 1ns)"},
        {"token-bucket 10/2.5x", "not a duration: [COUNT]UNIT"},
        {"token-bucket 10/1.5s", "limit 1: rate '10/1.5s': '1.5s' is not a duration"},
        {"token-bucket 10/s burst=x", "limit 1: burst value 'x' is not a whole number up to 2^63-1"},
        {"token-bucket 10/fortnight", "units ns us ms s m h d"},
        {"token-bucket 10r/s burst=5", "(write 10/s: no 'r' before the '/', "
                                       "as nginx's limit_req has)"},
        {"sliding-window 600r/m", "write 600/m"},
        {"tocken-bucket 10/s", "(token-bucket, gcra, leaky-bucket"},
        {"token-bucket 10/s speed=3", "burst= for token-bucket, capacity= "
                                      "for leaky-bucket"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rate_policy_t *x = (rate_policy_t *)1;
        char err[256] = "";
        int rc = rate_policy_parse(bad[i].text, &x, err, sizeof err);
        if (rc != RATE_EPOLICY || x != NULL || strstr(err, bad[i].needle) == NULL)
            fail_msg("'%s': rc=%d err='%s', wanted '%s'", bad[i].text, rc, err,
                     bad[i].needle);
    }
}

/* Every error ratelimit.h documents for the count, duration and rate
 * parsers, with its code and message; the policy text says the same words
 * (one implementation of each rule). */
static void parser_messages(void **state)
{
    (void)state;
    static const struct {
        char kind; /* c count, d duration, r rate */
        const char *text;
        int rc;
        const char *msg;
    } cases[] = {
        {'c', NULL, RATE_EINVAL, "no count (NULL)"},
        {'c', "", RATE_EINVAL, "'' is not a whole number up to 2^63-1"},
        {'c', "x", RATE_EINVAL, "'x' is not a whole number up to 2^63-1"},
        {'c', "-1", RATE_EINVAL, "'-1' is not a whole number up to 2^63-1"},
        {'c', " 1", RATE_EINVAL, "' 1' is not a whole number up to 2^63-1"},
        {'c', "9223372036854775808", RATE_ERANGE,
         "'9223372036854775808' is not a whole number up to 2^63-1"},
        {'d', NULL, RATE_EINVAL, "no duration (NULL)"},
        {'d', "1.5s", RATE_EINVAL,
         "'1.5s' is not a duration: durations are whole numbers of a unit; "
         "write '1500ms'"},
        {'d', "1.5min", RATE_EINVAL,
         "'1.5min' is not a duration: durations are whole numbers of a "
         "unit; write '90s'"},
        {'d', "0.25hours", RATE_EINVAL,
         "'0.25hours' is not a duration: durations are whole numbers of a "
         "unit; write '15m'"},
        {'d', "0.5ns", RATE_EINVAL,
         "'0.5ns' is not a duration: durations are whole numbers of a unit "
         "(the smallest is 1ns)"},
        {'d', "5", RATE_EINVAL,
         "'5' is not a duration: COUNTUNIT, units ns us ms s m h d (or nsec "
         "usec msec sec min hr day, singular or plural), or 0"},
        {'d', "s", RATE_EINVAL, "'s' is not a duration: COUNTUNIT"},
        {'d', "2fortnights", RATE_EINVAL, "'2fortnights' is not a duration"},
        {'d', "1 s", RATE_EINVAL, "'1 s' is not a duration"},
        {'d', "1.s", RATE_EINVAL, "'1.s' is not a duration: COUNTUNIT"},
        {'d', "107000d", RATE_ERANGE,
         "'107000d' is a duration above 2^63-1 ns"},
        {'d', "99999999999999999999s", RATE_ERANGE,
         "'99999999999999999999s' is a duration above 2^63-1 ns"},
        {'d', "106752.5d", RATE_ERANGE,
         "'106752.5d' is a duration above 2^63-1 ns"},
        {'r', NULL, RATE_EINVAL, "no rate (NULL)"},
        {'r', "10", RATE_EINVAL,
         "'10' is not COUNT/DURATION (e.g. 10/s, 100/1m)"},
        {'r', "x/s", RATE_EINVAL,
         "'x/s': count 'x' is not a whole number up to 2^63-1"},
        {'r', "99999999999999999999/s", RATE_ERANGE,
         "'99999999999999999999/s': count '99999999999999999999' is not"},
        {'r', "1/1.5s", RATE_EINVAL,
         "'1/1.5s': '1.5s' is not a duration: durations are whole numbers "
         "of a unit; write '1500ms'"},
        {'r', "10/fortnight", RATE_EINVAL,
         "'10/fortnight': 'fortnight' is not a duration: [COUNT]UNIT, units "
         "ns us ms s m h d (or nsec usec msec sec min hr day, singular or "
         "plural)"},
        {'r', "1/999999999999d", RATE_ERANGE,
         "'1/999999999999d': '999999999999d' is a duration above 2^63-1 ns"},
        {'r', "0/s", RATE_EINVAL, "'0/s' is zero: its count is 0"},
        {'r', "5/0ms", RATE_EINVAL, "'5/0ms' is zero: its period is 0"},
        {'r', "5/0", RATE_EINVAL, "'5/0' is zero: its period is 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[300] = "";
        uint64_t a = 7, b = 7;
        int rc = cases[i].kind == 'c'
                     ? rate_parse_count(cases[i].text, &a, err, sizeof err)
                 : cases[i].kind == 'd'
                     ? rate_parse_duration(cases[i].text, &a, err, sizeof err)
                     : rate_parse_rate(cases[i].text, &a, &b, err, sizeof err);
        if (rc != cases[i].rc || strncmp(err, cases[i].msg,
                                         strlen(cases[i].msg)) != 0 ||
            a != 7 || b != 7)
            fail_msg("%c '%s': rc=%d err='%s', wanted %d '%s'",
                     cases[i].kind, cases[i].text ? cases[i].text : "NULL",
                     rc, err, cases[i].rc, cases[i].msg);
        /* The policy text says "limit 1: rate " and the same message (a
         * duration's, after the rate's subject, up to what differs in a
         * rate: "COUNTUNIT" there is "[COUNT]UNIT"). */
        const char *t = cases[i].text;
        if (t == NULL || cases[i].kind == 'c' || strchr(t, ' ') != NULL ||
            strstr(cases[i].msg, "is zero") != NULL ||
            strcmp(t, "5") == 0 || strcmp(t, "s") == 0)
            continue; /* not a policy's rate, or a good one there */
        char text[128], want[300], perr[300] = "";
        rate_policy_t *p = NULL;
        if (cases[i].kind == 'r') {
            snprintf(text, sizeof text, "fixed-window %s", t);
            snprintf(want, sizeof want, "limit 1: rate %s", cases[i].msg);
        } else {
            snprintf(text, sizeof text, "fixed-window 1/%s", t);
            snprintf(want, sizeof want, "limit 1: rate '1/%s': %s", t,
                     cases[i].msg);
            char *cu = strstr(want, "COUNTUNIT");
            if (cu != NULL)
                *cu = '\0';
        }
        assert_int_equal(rate_policy_parse(text, &p, perr, sizeof perr),
                         RATE_EPOLICY);
        if (strncmp(perr, want, strlen(want)) != 0)
            fail_msg("policy '%s': '%s', wanted '%s'", text, perr, want);
    }
    /* A count may be zero; the outputs are written on success only. */
    uint64_t v = 7, c = 0, per = 0;
    assert_int_equal(rate_parse_count("0", &v, NULL, 0), RATE_OK);
    assert_int_equal(v, 0);
    assert_int_equal(rate_parse_count("9223372036854775807", &v, NULL, 0),
                     RATE_OK);
    assert_int_equal(v, INT64_MAX);
    assert_int_equal(rate_parse_count("1", NULL, NULL, 0), RATE_EINVAL);
    assert_int_equal(rate_parse_rate("3/500ms", &c, &per, NULL, 0), RATE_OK);
    assert_int_equal(c, 3);
    assert_int_equal(per, 500 * MS);
    /* A short buffer is truncated, never overrun. */
    char small[8];
    memset(small, 'z', sizeof small);
    assert_int_equal(rate_parse_duration("1.5s", &v, small, 6), RATE_EINVAL);
    assert_string_equal(small, "'1.5s");
    assert_int_equal(small[6], 'z');
}

static void error_texts(void **state)
{
    (void)state;
    assert_string_equal(rate_strerror(RATE_EKEY),
                        "key is NULL, empty, reserved (begins "
                        "\\xffLEASE\\x01\\0), or longer than RATE_KEY_MAX "
                        "bytes or than the store keeps");
    assert_string_equal(rate_err_name(RATE_ECONFLICT), "RATE_ECONFLICT");
    assert_string_equal(rate_strerror(RATE_OK), "success");
    assert_string_equal(rate_strerror(-999), "unknown error");
    assert_string_equal(rate_err_name(RATE_PENDING), "RATE_PENDING");
    assert_non_null(strstr(rate_strerror(RATE_PENDING), "not an error"));
    assert_string_equal(rate_reason_name(RATE_REASON_NEVER), "never");
}

/* block=DUR: any algorithm's option, once, a whole duration up to 2^61
 * ns; printed back; hashed into the fingerprint only when there is one
 * (a policy without keeps the first edition's fingerprint). */
static void block_option(void **state)
{
    (void)state;
    rate_policy_t *p = policy_of("token-bucket 2/s burst=2 block=10s; "
                                 "fixed-window 100/h block=1h");
    char buf[160];
    rate_policy_format(p, buf, sizeof buf);
    assert_string_equal(buf, "token-bucket 2/s burst=2 block=10s; "
                             "fixed-window 100/h block=1h");
    assert_int_equal(rate_policy_limit(p, 0)->block_ns, 10 * SEC);
    assert_int_equal(rate_policy_limit(p, 1)->block_ns, 3600 * SEC);
    rate_policy_t *q = policy_of("token-bucket 2/s burst=2; "
                                 "fixed-window 100/h");
    assert_int_not_equal(rate_policy_fingerprint(p),
                         rate_policy_fingerprint(q));
    /* Without a block: the fingerprint of the limits alone, as 0.1 made
     * it (this value was 0.1's for this policy). */
    rate_policy_t *r = policy_of("token-bucket 10/s burst=20");
    rate_limit_t l = {RATE_TOKEN_BUCKET, 10, SEC, 20, 0, {0}};
    rate_policy_t *s2;
    assert_int_equal(rate_policy_new(&l, 1, &s2, NULL, 0), RATE_OK);
    assert_int_equal(rate_policy_fingerprint(r), rate_policy_fingerprint(s2));
    static const char *bad[][2] = {
        {"fixed-window 5/s block=0", "block is zero"},
        {"fixed-window 5/s block=1.5s", "write '1500ms'"},
        {"fixed-window 5/s block=1s block=2s", "block= given twice"},
        {"fixed-window 5/s block=100000d", "block above 2^61"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rate_policy_t *x = NULL;
        char err[256] = "";
        assert_int_equal(rate_policy_parse(bad[i][0], &x, err, sizeof err),
                         RATE_EPOLICY);
        if (strstr(err, bad[i][1]) == NULL)
            fail_msg("'%s': '%s', wanted '%s'", bad[i][0], err, bad[i][1]);
    }
    rate_policy_free(p);
    rate_policy_free(q);
    rate_policy_free(r);
    rate_policy_free(s2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parses_each_algorithm),
        cmocka_unit_test(composite_round_trip),
        cmocka_unit_test(errors_name_the_bad_part),
        cmocka_unit_test(from_c),
        cmocka_unit_test(bounds),
        cmocka_unit_test(wide_decides_as_narrow),
        cmocka_unit_test(carries_between_layouts),
        cmocka_unit_test(unlimited_policy),
        cmocka_unit_test(unlimited_limiter),
        cmocka_unit_test(durations),
        cmocka_unit_test(names_rates_and_units),
        cmocka_unit_test(parser_messages),
        cmocka_unit_test(error_texts),
        cmocka_unit_test(block_option),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
