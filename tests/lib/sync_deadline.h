/* SPDX-License-Identifier: MIT */
/*
 * The synced mode's one deadline per decision, over any remote (the
 * Redis and DynamoDB suites each put their remote behind a delay line).
 */
#ifndef TEST_SYNC_DEADLINE_H
#define TEST_SYNC_DEADLINE_H

#include <stdatomic.h>

#include "helpers.h"
#include "ratelimit_synced.h"

/* Two synced limiters on `remote`: A borrows first (16 of a burst of
 * 20); then, with the delay line answering `delay_ms` late, B needs two
 * borrows (the 4 left, then more) and must return within `timeout` (the
 * remote's own, which the two borrows share) plus `slack`, as a store
 * error RATE_ETIMEDOUT. */
static inline void synced_decision_within(rate_store_t *remote,
                                          atomic_int *delay, int delay_ms,
                                          uint64_t timeout, uint64_t slack)
{
    rate_policy_t *p = NULL;
    assert_int_equal(rate_policy_parse("token-bucket 1/h burst=20", &p, NULL,
                                       0),
                     RATE_OK);
    rate_synced_config_t c = {0};
    c.policy = p;
    c.remote = remote;
    c.lease = 16;
    c.lease_ttl_ns = 60 * SEC;
    c.on_store_error = RATE_FAIL_CLOSED;
    rate_synced_t *a = NULL, *b = NULL;
    assert_int_equal(rate_synced_new(&c, &a, NULL, 0), RATE_OK);
    assert_int_equal(rate_synced_new(&c, &b, NULL, 0), RATE_OK);
    rate_decision_t d;
    assert_int_equal(rate_synced_check(a, "k", 1, 1, &d), RATE_OK);
    assert_true(d.allowed); /* A borrowed 16: 4 are left */

    atomic_store(delay, delay_ms);
    uint64_t t0 = rate_clock_monotonic_ns();
    assert_int_equal(rate_synced_check(b, "k", 1, 1, &d), RATE_OK);
    uint64_t took = rate_clock_monotonic_ns() - t0;
    print_message("B's decision: %llu ms (%s) against a %llu ms timeout\n",
                  (unsigned long long)(took / MS),
                  d.reason == RATE_REASON_STORE_ERROR ? rate_err_name(d.error)
                  : d.allowed                          ? "allowed"
                                                       : "denied",
                  (unsigned long long)(timeout / MS));
    if (took > timeout + slack)
        fail_msg("B's decision took %llu ms, the timeout is %llu ms",
                 (unsigned long long)(took / MS),
                 (unsigned long long)(timeout / MS));
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(d.error, RATE_ETIMEDOUT);

    atomic_store(delay, 0);
    rate_synced_free(a);
    rate_synced_free(b);
    rate_policy_free(p);
}

#endif
