/* SPDX-License-Identifier: MIT */
/*
 * Helpers shared by the test files (header-only, static).
 */
#ifndef TEST_HELPERS_H
#define TEST_HELPERS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <ratelimit.h>

#include "cas_store.h"

#define MS UINT64_C(1000000)
#define SEC UINT64_C(1000000000)

/* A clock the test moves by hand, for rate_clock_t (ud: the fake_clock_t):
 * a sleep moves it forward and is counted.  Atomic: a limiter's threads
 * (the rules watcher) may read it while the test moves it. */
typedef struct fake_clock {
    _Atomic uint64_t now;
    _Atomic uint64_t slept;   /* the sum of the sleeps */
    _Atomic unsigned sleeps;  /* how many */
} fake_clock_t;

static inline uint64_t fake_now(void *ud)
{
    return ((fake_clock_t *)ud)->now;
}

static inline void fake_sleep(void *ud, uint64_t ns)
{
    fake_clock_t *c = ud;
    c->now += ns;
    c->slept += ns;
    c->sleeps++;
}

static inline rate_policy_t *policy_of(const char *text)
{
    rate_policy_t *p = NULL;
    char err[256] = "";
    int rc = rate_policy_parse(text, &p, err, sizeof err);
    if (rc != RATE_OK)
        fail_msg("policy '%s': %s", text, err);
    return p;
}

/* A limiter for the policy `text` with the rest of `cfg`. */
static inline rate_limiter_t *limiter_cfg(const char *text,
                                          rate_limiter_config_t cfg)
{
    rate_policy_t *p = policy_of(text);
    rate_limiter_t *lim = NULL;
    cfg.policy = p;
    assert_int_equal(rate_limiter_new(&cfg, &lim), RATE_OK);
    rate_policy_free(p); /* the limiter keeps a copy */
    return lim;
}

/* A limiter over `store` (NULL: a private memory store) for `text`. */
static inline rate_limiter_t *limiter_of(const char *text, rate_store_t *store)
{
    rate_limiter_config_t cfg = {0};
    cfg.store = store;
    return limiter_cfg(text, cfg);
}

static inline rate_decision_t at(rate_limiter_t *lim, const char *key,
                                 uint64_t t, uint64_t n, uint64_t max_wait)
{
    rate_decision_t d;
    assert_int_equal(
        rate_limiter_check_at(lim, key, strlen(key), n, max_wait, t, &d),
        RATE_OK);
    return d;
}

/* Checks every field of one decision; line numbers point at the case. */
#define EXPECT(lim, t, n, mw, allow, rem, delay, retry, reset)              \
    do {                                                                    \
        rate_decision_t d_ = at((lim), "k", (t), (n), (mw));                \
        if (d_.allowed != (allow) || d_.remaining != (uint64_t)(rem) ||     \
            d_.delay_ns != (uint64_t)(delay) ||                             \
            d_.retry_after_ns != (uint64_t)(retry) ||                       \
            d_.reset_after_ns != (uint64_t)(reset))                         \
            fail_msg("line %d: got allowed=%d remaining=%llu delay=%llu "   \
                     "retry=%llu reset=%llu",                               \
                     __LINE__, d_.allowed, (unsigned long long)d_.remaining,\
                     (unsigned long long)d_.delay_ns,                       \
                     (unsigned long long)d_.retry_after_ns,                 \
                     (unsigned long long)d_.reset_after_ns);                \
    } while (0)

/* Fails unless two decisions are the same field by field, naming the
 * request (its index, time, permits, max_wait) and every field of both:
 * `a` the memory store's, `b` the store called `other`'s. */
static inline void expect_same_decision(const rate_decision_t *a,
                                        const rate_decision_t *b,
                                        const char *what, const char *other,
                                        int i, uint64_t t, uint64_t n,
                                        uint64_t mw)
{
    if (memcmp(a, b, sizeof *a) == 0)
        return;
    fail_msg("%s, request %d (t=%llu n=%llu mw=%llu): memory allowed=%d "
             "reason=%d comp=%d rem=%llu delay=%llu retry=%llu reset=%llu; "
             "%s allowed=%d reason=%d comp=%d err=%d rem=%llu delay=%llu "
             "retry=%llu reset=%llu",
             what, i, (unsigned long long)t, (unsigned long long)n,
             (unsigned long long)mw, a->allowed, a->reason, a->component,
             (unsigned long long)a->remaining, (unsigned long long)a->delay_ns,
             (unsigned long long)a->retry_after_ns,
             (unsigned long long)a->reset_after_ns, other, b->allowed,
             b->reason, b->component, b->error,
             (unsigned long long)b->remaining,
             (unsigned long long)b->delay_ns,
             (unsigned long long)b->retry_after_ns,
             (unsigned long long)b->reset_after_ns);
}

#endif
