/* SPDX-License-Identifier: MIT */
/*
 * Fair shares (docs/fair.md): a review's regressions, each a defect found
 * by attacking the fair table: virtual time over long runs.
 */
#include "helpers.h"

#include "ratelimit_fair.h"

/* A flow far ahead of V keeps being ahead however long the run: its
 * virtual service must not wrap around 2^64 (it did: a flow admitted
 * 2^64 / 2^20 permits more than another active flow, at weight 1, came
 * back below V, was taken for the most owed flow and took the other's
 * reserve; the active heap, sifted down only, lost its order). */
static void vtime_no_wrap(void **s)
{
    (void)s;
    const uint64_t L = UINT64_C(1) << 42; /* the shared limit, per second */
    char pol[128];
    snprintf(pol, sizeof pol, "token-bucket %llu/s burst=%llu",
             (unsigned long long)L, (unsigned long long)L);
    rate_limiter_t *lim = limiter_of(pol, NULL);
    rate_fair_config_t fc = {.limiter = lim, .key = "shared", .key_len = 6};
    rate_fair_t *f = NULL;
    assert_int_equal(rate_fair_new(&fc, &f, NULL, 0), RATE_OK);
    rate_decision_t d;
    /* Each second the light flow asks a quarter of the limit and the
     * heavy one half: both admitted; the heavy flow's lead over V grows
     * by 2^60 a second (past 2^64 in the 17th).  From the third second
     * on, the heavy flow, far ahead, first asks the whole limit: denied,
     * the light flow's reserve kept, however long the run. */
    for (uint64_t i = 0; i < 40; i++) {
        uint64_t t = i * SEC;
        if (i >= 2) {
            assert_int_equal(rate_fair_check_at(f, "heavy", 5, 1, L, t, &d),
                             RATE_OK);
            if (d.allowed)
                fail_msg("second %llu: the heavy flow took the whole limit",
                         (unsigned long long)i);
            assert_int_equal(d.reason, RATE_REASON_LIMITED);
        }
        assert_int_equal(rate_fair_check_at(f, "light", 5, 1, L / 4, t + 1, &d),
                         RATE_OK);
        assert_true(d.allowed);
        assert_int_equal(rate_fair_check_at(f, "heavy", 5, 1, L / 2, t + 2,
                                            &d), RATE_OK);
        assert_true(d.allowed);
    }
    rate_fair_free(f);
    rate_limiter_free(lim);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(vtime_no_wrap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
