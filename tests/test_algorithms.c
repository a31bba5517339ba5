/* SPDX-License-Identifier: MIT */
/*
 * Exact decisions at the boundaries, one algorithm at a time: a token
 * refilling exactly now, a window edge, a log entry expiring exactly now,
 * zero permits, requests that can never pass, time running backwards.
 * Every expected number was worked out by hand from spec/algorithms.md.
 */
#include "lib/helpers.h"

#define N RATE_NEVER

static void token_bucket(void **state)
{
    (void)state;
    /* 10/s, burst 2: one token per 100 ms. */
    rate_limiter_t *l = limiter_of("token-bucket 10/s burst=2", NULL);
    EXPECT(l, 0, 1, 0, true, 1, 0, 0, 100 * MS);
    EXPECT(l, 0, 1, 0, true, 0, 0, 0, 200 * MS);
    EXPECT(l, 0, 1, 0, false, 0, 0, 100 * MS, 200 * MS);
    EXPECT(l, 100 * MS - 1, 1, 0, false, 0, 0, 1, 100 * MS + 1);
    EXPECT(l, 100 * MS, 1, 0, true, 0, 0, 0, 200 * MS); /* refilled now */
    EXPECT(l, 100 * MS, 3, 0, false, 0, 0, N, 200 * MS); /* never */
    EXPECT(l, 100 * MS, 3, SEC, false, 0, 0, N, 200 * MS);
    EXPECT(l, 100 * MS, 0, 0, true, 0, 0, 0, 200 * MS); /* query */
    /* Backwards: 50 ms counts as t_last = 100 ms. */
    EXPECT(l, 50 * MS, 1, 0, false, 0, 0, 100 * MS, 200 * MS);
    /* Reservation: two tokens are 200 ms away. */
    EXPECT(l, 100 * MS, 2, 200 * MS - 1, false, 0, 0, 200 * MS, 200 * MS);
    EXPECT(l, 100 * MS, 2, 200 * MS, true, 0, 200 * MS, 0, 400 * MS);
    /* In debt: the query still reports no delay and nothing remaining. */
    EXPECT(l, 100 * MS, 0, 0, true, 0, 0, 0, 400 * MS);
    EXPECT(l, 300 * MS, 1, 0, false, 0, 0, 100 * MS, 200 * MS);
    EXPECT(l, 600 * MS, 1, 0, true, 1, 0, 0, 100 * MS);
    rate_limiter_free(l);
}

static void gcra_is_token_bucket(void **state)
{
    (void)state;
    rate_limiter_t *l = limiter_of("gcra 3/500ms burst=1", NULL);
    EXPECT(l, 7, 1, 0, true, 0, 0, 0, 166666667);
    EXPECT(l, 7 + 166666666, 1, 0, false, 0, 0, 1, 1);
    /* 500 ms / 3 is not whole: the token is complete only after the
     * ceiling, never a nanosecond early. */
    EXPECT(l, 7 + 166666667, 1, 0, true, 0, 0, 0, 166666667);
    rate_limiter_free(l);
}

static void leaky_bucket(void **state)
{
    (void)state;
    /* Drains one per 100 ms, holds 2. */
    rate_limiter_t *l = limiter_of("leaky-bucket 10/s capacity=2", NULL);
    EXPECT(l, 0, 1, 0, true, 1, 0, 0, 100 * MS);
    EXPECT(l, 0, 1, 0, false, 1, 0, 100 * MS, 100 * MS); /* strict spacing */
    EXPECT(l, 0, 1, 100 * MS, true, 0, 100 * MS, 0, 200 * MS); /* queued */
    EXPECT(l, 0, 1, SEC, false, 0, 0, 200 * MS, 200 * MS);     /* full */
    EXPECT(l, 0, 3, SEC, false, 0, 0, N, 200 * MS);            /* never */
    EXPECT(l, 199 * MS, 1, 0, false, 1, 0, 1 * MS, 1 * MS);
    EXPECT(l, 200 * MS, 1, 0, true, 1, 0, 0, 100 * MS); /* drained now */
    EXPECT(l, 200 * MS, 0, 0, true, 1, 0, 0, 100 * MS);
    rate_limiter_free(l);
}

static void fixed_window(void **state)
{
    (void)state;
    rate_limiter_t *l = limiter_of("fixed-window 3/s", NULL);
    EXPECT(l, SEC - 1, 3, 0, true, 0, 0, 0, 1);
    EXPECT(l, SEC - 1, 1, 0, false, 0, 0, 1, 1);
    EXPECT(l, SEC, 1, 0, true, 2, 0, 0, SEC); /* the edge: a new window */
    EXPECT(l, SEC, 4, 0, false, 2, 0, N, SEC);
    EXPECT(l, SEC, 2, 0, true, 0, 0, 0, SEC);
    EXPECT(l, 2 * SEC - 1, 1, 0, false, 0, 0, 1, 1);
    EXPECT(l, 5 * SEC + 1, 0, 0, true, 3, 0, 0, 0);
    /* Windows ignore max_wait: no reservation. */
    EXPECT(l, 5 * SEC + 1, 3, SEC, true, 0, 0, 0, SEC - 1);
    EXPECT(l, 5 * SEC + 1, 1, SEC, false, 0, 0, SEC - 1, SEC - 1);
    rate_limiter_free(l);
}

static void sliding_log(void **state)
{
    (void)state;
    rate_limiter_t *l = limiter_of("sliding-log 2/s", NULL);
    EXPECT(l, 0, 1, 0, true, 1, 0, 0, SEC);
    EXPECT(l, 500 * MS, 1, 0, true, 0, 0, 0, SEC);
    EXPECT(l, SEC - 1, 1, 0, false, 0, 0, 1, 500 * MS + 1);
    EXPECT(l, SEC, 1, 0, true, 0, 0, 0, SEC); /* entry at 0 expires now */
    EXPECT(l, SEC, 2, 0, false, 0, 0, SEC, SEC);
    EXPECT(l, SEC, 3, 0, false, 0, 0, N, SEC);
    EXPECT(l, 1500 * MS, 1, 0, true, 0, 0, 0, SEC);
    /* Same time twice shares an entry; still exact. */
    EXPECT(l, 3 * SEC, 1, 0, true, 1, 0, 0, SEC);
    EXPECT(l, 3 * SEC, 1, 0, true, 0, 0, 0, SEC);
    EXPECT(l, 4 * SEC - 1, 1, 0, false, 0, 0, 1, 1);
    EXPECT(l, 4 * SEC, 2, 0, true, 0, 0, 0, SEC);
    rate_limiter_free(l);
}

static void sliding_window(void **state)
{
    (void)state;
    rate_limiter_t *l = limiter_of("sliding-window 10/s", NULL);
    EXPECT(l, 500 * MS, 10, 0, true, 0, 0, 0, 1500 * MS);
    /* Next window: prev=10 weighs fully at its start. */
    EXPECT(l, SEC, 1, 0, false, 0, 0, 100 * MS, SEC);
    EXPECT(l, 1100 * MS - 1, 1, 0, false, 0, 0, 1, 900 * MS + 1);
    EXPECT(l, 1100 * MS, 1, 0, true, 0, 0, 0, 1900 * MS);
    EXPECT(l, 1550 * MS, 1, 0, true, 3, 0, 0, 1450 * MS);
    EXPECT(l, 1550 * MS, 11, 0, false, 3, 0, N, 1450 * MS);
    /* Needs the next window, where curr=2 becomes prev and weighs
     * 2*(W-e)/W: 9 more fit from e = W/2, at 2.5 s. */
    EXPECT(l, 1550 * MS, 9, 0, false, 3, 0, 950 * MS, 1450 * MS);
    /* Two windows later everything is gone. */
    EXPECT(l, 3 * SEC, 10, 0, true, 0, 0, 0, 2 * SEC);
    rate_limiter_free(l);
}

/* The token bucket's arithmetic at its edges, through both the plain
 * try-acquire (the in-place pass) and the full decision: a refill whose
 * product overflows 64 bits, and a reservation's debt paid back. */
static void token_bucket_extremes(void **state)
{
    (void)state;
    /* 2^62 tokens a second, burst 2: 4 ns of refill is exactly 2^64
     * scaled tokens (0 if the product wrapped); 1 ns is 2^62, more than the
     * 2e9 the bucket holds. */
    rate_limiter_t *l = limiter_of("token-bucket 4611686018427387904/s "
                                   "burst=2", NULL);
    assert_true(rate_try_acquire_at(l, "k", 2, 0));
    assert_false(rate_try_acquire_at(l, "k", 1, 0));
    EXPECT(l, 0, 1, 0, false, 0, 0, 1, 1);
    assert_true(rate_try_acquire_at(l, "k", 2, 4)); /* full again */
    EXPECT(l, 8, 2, 0, true, 0, 0, 0, 1);
    assert_false(rate_try_acquire_at(l, "k", 1, 8));
    assert_true(rate_try_acquire_at(l, "k", 2, 9));
    rate_limiter_free(l);

    /* 1/s burst 1: a reservation leaves the bucket a token in debt. */
    l = limiter_of("token-bucket 1/s burst=1", NULL);
    assert_true(rate_try_acquire_at(l, "k", 1, 0));
    EXPECT(l, 0, 1, 10 * SEC, true, 0, SEC, 0, 2 * SEC);
    assert_false(rate_try_acquire_at(l, "k", 1, 2 * SEC - 1));
    EXPECT(l, 2 * SEC - 1, 1, 0, false, 0, 0, 1, 1);
    assert_true(rate_try_acquire_at(l, "k", 1, 2 * SEC));
    rate_limiter_free(l);
}

static rate_limiter_t *limiter_c(rate_limit_t lim)
{
    rate_policy_t *p = NULL;
    rate_limiter_t *l = NULL;
    char err[256] = "";
    rate_limiter_config_t cfg = {0};
    if (rate_policy_new(&lim, 1, &p, err, sizeof err) != RATE_OK)
        fail_msg("policy: %s", err);
    cfg.policy = p;
    assert_int_equal(rate_limiter_new(&cfg, &l), RATE_OK);
    rate_policy_free(p);
    return l;
}

#define TMAX RATE_TIME_MAX

/* A daily quota of 10^5 as a token bucket (B * P = 8.64e18 > 2^62: the
 * wide layout): one token per 864 ms, exactly. */
static void daily_quota(void **state)
{
    (void)state;
    const uint64_t tok = 864 * MS, day = 86400 * SEC;
    rate_limiter_t *l = limiter_of("token-bucket 100000/1d burst=100000", NULL);
    EXPECT(l, 0, 100000, 0, true, 0, 0, 0, day); /* the whole day at once */
    EXPECT(l, 0, 1, 0, false, 0, 0, tok, day);
    EXPECT(l, tok - 1, 1, 0, false, 0, 0, 1, day - tok + 1);
    EXPECT(l, tok, 1, 0, true, 0, 0, 0, day); /* refilled exactly now */
    EXPECT(l, tok, 100001, SEC, false, 0, 0, N, day); /* never */
    /* Reserve two tokens: 1728 ms away. */
    EXPECT(l, tok, 2, 2 * tok - 1, false, 0, 0, 2 * tok, day);
    EXPECT(l, tok, 2, 2 * tok, true, 0, 2 * tok, 0, day + 2 * tok);
    EXPECT(l, tok + day + 2 * tok, 0, 0, true, 100000, 0, 0, 0); /* full */
    rate_limiter_free(l);

    l = limiter_of("leaky-bucket 100000/1d capacity=100000", NULL);
    EXPECT(l, 5, 1, 0, true, 99999, 0, 0, tok);
    EXPECT(l, 5, 1, 0, false, 99999, 0, tok, tok);
    EXPECT(l, 5, 99999, day, true, 0, tok, 0, day); /* queued */
    EXPECT(l, 5, 1, TMAX, false, 0, 0, day, day);   /* full */
    EXPECT(l, 5 + day - 1, 1, 0, false, 99999, 0, 1, 1);
    EXPECT(l, 5 + day, 1, 0, true, 99999, 0, 0, tok);
    rate_limiter_free(l);
}

/* Counts of 2^53 over periods of 2^61 ns: the largest the spec names.  A
 * refill or drain of 2^114 scaled units at 1 per ns is longer than any
 * clock reading: reported as RATE_TIME_MAX. */
static void at_the_bounds(void **state)
{
    (void)state;
    const uint64_t B = UINT64_C(1) << 53, P = UINT64_C(1) << 61;
    rate_limiter_t *l = limiter_c((rate_limit_t){RATE_TOKEN_BUCKET, 1, P, B, 0, {0}});
    EXPECT(l, 0, 1, 0, true, B - 1, 0, 0, P);
    EXPECT(l, 0, B, 0, false, B - 1, 0, P, P);
    EXPECT(l, P - 1, B, 0, false, B - 1, 0, 1, 1);
    EXPECT(l, P, B, 0, true, 0, 0, 0, TMAX);
    EXPECT(l, P, 1, 0, false, 0, 0, P, TMAX);
    EXPECT(l, P, B + 1, 0, false, 0, 0, N, TMAX);
    /* A reservation of one token, P away; a second would pass the debt
     * bound (2^62 scaled tokens: two periods of 2^61). */
    EXPECT(l, P, 1, P, true, 0, P, 0, TMAX);
    EXPECT(l, P, 1, TMAX, true, 0, 2 * P, 0, TMAX);
    EXPECT(l, P, 1, TMAX, false, 0, 0, 3 * P, TMAX);
    EXPECT(l, 3 * P, 1, 0, false, 0, 0, P, TMAX); /* 4P: past the clock */
    rate_limiter_free(l);

    l = limiter_c((rate_limit_t){RATE_LEAKY_BUCKET, 1, P, B, 0, {0}});
    EXPECT(l, 0, 1, 0, true, B - 1, 0, 0, P);
    EXPECT(l, 0, 1, 0, false, B - 1, 0, P, P);
    EXPECT(l, 0, B - 1, TMAX, true, 0, P, 0, TMAX);
    EXPECT(l, 0, 1, TMAX, false, 0, 0, TMAX, TMAX);
    EXPECT(l, 0, B + 1, TMAX, false, 0, 0, N, TMAX);
    rate_limiter_free(l);

    /* The fullest narrow bucket (B * P = 2^62, 8 bytes of state) at 1 per
     * 2^31 ns: two reservations of the whole burst leave the deepest debt,
     * -2^62, and the burst then misses 2^63 scaled tokens, 2^63 ns at 1
     * per ns: past the clock, so RATE_TIME_MAX, as a wide bucket says (the
     * narrow layout's own body once said 2^63). */
    const uint64_t B31 = UINT64_C(1) << 31;
    l = limiter_c((rate_limit_t){RATE_TOKEN_BUCKET, 1, B31, B31, 0, {0}});
    EXPECT(l, 0, B31, TMAX, true, 0, 0, 0, UINT64_C(1) << 62);
    EXPECT(l, 0, B31, TMAX, true, 0, UINT64_C(1) << 62, 0, TMAX);
    EXPECT(l, 0, B31, 0, false, 0, 0, TMAX, TMAX);
    rate_limiter_free(l);

    /* The largest counts the text takes: 2^63-1 per 2^61 ns. */
    l = limiter_c((rate_limit_t){RATE_TOKEN_BUCKET, TMAX, P, TMAX, 0, {0}});
    EXPECT(l, 0, TMAX, 0, true, 0, 0, 0, P);
    /* One ns refills 2^63-1 scaled tokens: 3.99 tokens. */
    EXPECT(l, 1, 1, 0, true, 2, 0, 0, P);
    EXPECT(l, 1, 3, 0, false, 2, 0, 1, P);
    EXPECT(l, 2, 3, 0, true, 3, 0, 0, P);
    rate_limiter_free(l);

    l = limiter_c((rate_limit_t){RATE_FIXED_WINDOW, B, P, 0, 0, {0}});
    EXPECT(l, 2 * P + 3, B, 0, true, 0, 0, 0, P - 3);
    EXPECT(l, 2 * P + 3, 1, 0, false, 0, 0, P - 3, P - 3);
    EXPECT(l, 3 * P, B, 0, true, 0, 0, 0, P);
    rate_limiter_free(l);

    /* A sliding window: all 2^53 on the window's last nanosecond; half way
     * through the next the estimate is 2^52, and 2^52 + 1 more pass once
     * prev weighs (2^52 - 1) / 2^53, 256 ns later. */
    l = limiter_c((rate_limit_t){RATE_SLIDING_WINDOW, B, P, 0, 0, {0}});
    EXPECT(l, P - 1, B, 0, true, 0, 0, 0, P + 1);
    EXPECT(l, P + P / 2, B / 2 + 1, 0, false, B / 2, 0, 256, P / 2);
    EXPECT(l, P + P / 2 + 255, B / 2 + 1, 0, false, B / 2, 0, 1, P / 2 - 255);
    EXPECT(l, P + P / 2 + 256, B / 2 + 1, 0, true, 0, 0, 0,
           2 * P - P / 2 - 256);
    rate_limiter_free(l);
}

/* A retry_after is exact: the same request then passes, a nanosecond
 * earlier it does not (spec: "Rounded up"). */
static void retry_after_is_tight(void **state)
{
    (void)state;
    const char *policies[] = {
        "token-bucket 7/3s burst=3", "leaky-bucket 7/3s capacity=3",
        "fixed-window 3/700ms",      "sliding-log 3/700ms",
        "sliding-window 3/700ms",
    };
    for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++) {
        for (uint64_t t0 = 0; t0 < 2 * SEC; t0 += 123456789) {
            rate_limiter_t *a = limiter_of(policies[i], NULL);
            rate_limiter_t *b = limiter_of(policies[i], NULL);
            uint64_t t = t0;
            rate_decision_t d;
            while ((d = at(a, "k", t, 1, 0)).allowed) {
                at(b, "k", t, 1, 0);
                t += 10 * MS;
            }
            at(b, "k", t, 1, 0); /* b denies too and keeps the same state */
            rate_decision_t early = at(a, "k", t + d.retry_after_ns - 1, 1, 0);
            rate_decision_t then = at(b, "k", t + d.retry_after_ns, 1, 0);
            if (early.allowed || !then.allowed)
                fail_msg("%s from %llu: retry_after %llu is not tight",
                         policies[i], (unsigned long long)t0,
                         (unsigned long long)d.retry_after_ns);
            rate_limiter_free(a);
            rate_limiter_free(b);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(token_bucket),   cmocka_unit_test(gcra_is_token_bucket),
        cmocka_unit_test(leaky_bucket),   cmocka_unit_test(fixed_window),
        cmocka_unit_test(sliding_log),    cmocka_unit_test(sliding_window),
        cmocka_unit_test(token_bucket_extremes),
        cmocka_unit_test(daily_quota),
        cmocka_unit_test(at_the_bounds),
        cmocka_unit_test(retry_after_is_tight),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
