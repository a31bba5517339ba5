/* SPDX-License-Identifier: MIT */
/*
 * ratelimit bench --fair --redis URL: a fair decision on Redis (the store
 * contract's fair(): the fair script, or RATELIMIT.FAIR when the server
 * has ratelimit.so) beside a plain decision of the same shared limit on
 * the same store, one caller.  The shared limit admits everything (a
 * token bucket of 100,000/s asked 10,000 times a second of trace time,
 * within the scripts' exact range), so that every figure is a
 * decision's round trip and work, not a denial's; 8 flows take turns.  Wall time per
 * decision (a round trip is mostly waiting), best of the rounds.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <ratelimit_fair.h>
#include <ratelimit_redis.h>

#include "cli.h"

#define OPEN "token-bucket 100000/s burst=100000"
#define FLOWS 8

static uint64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * RATE_NS_PER_S + (uint64_t)ts.tv_nsec;
}

typedef struct side {
    rate_store_t *store;
    rate_limiter_t *lim;
    rate_fair_t *fair;
} side_t;

static int side_open(side_t *s, const char *url, bool module,
                     const rate_policy_t *p)
{
    rate_redis_options_t o = {.prefix = module ? "bench-fm:" : "bench-fs:",
                              .pool_size = 1};
    o.module = module ? RATE_REDIS_MODULE_ON : RATE_REDIS_MODULE_OFF;
    char err[256] = "";
    memset(s, 0, sizeof *s);
    if (rate_store_redis_new(url, &o, &s->store, err, sizeof err) != RATE_OK)
        return cli_fail("bench: %s: %s", url, err);
    rate_limiter_config_t cfg = {.policy = p, .store = s->store};
    if (rate_limiter_new(&cfg, &s->lim) != RATE_OK)
        return cli_fail("bench: cannot make a limiter");
    rate_fair_config_t fc = {.limiter = s->lim, .key = "shared", .key_len = 6};
    if (rate_fair_new(&fc, &s->fair, err, sizeof err) != RATE_OK)
        return cli_fail("bench: fair: %s", err);
    return 0;
}

static void side_close(side_t *s)
{
    rate_fair_free(s->fair);
    rate_limiter_free(s->lim);
    rate_store_free(s->store);
}

/* ns per decision, best of `rounds` runs of `n`; fair or plain. */
static double per_decision(side_t *s, bool fair, unsigned rounds, uint64_t n,
                           uint64_t *at)
{
    static const char *const flows[FLOWS] = {"f0", "f1", "f2", "f3",
                                             "f4", "f5", "f6", "f7"};
    double best = 0;
    for (unsigned r = 0; r < rounds; r++) {
        uint64_t t0 = wall_ns();
        for (uint64_t i = 0; i < n; i++) {
            rate_decision_t d;
            *at += 100000; /* 10,000/s: always room */
            if (fair)
                rate_fair_check_at(s->fair, flows[i % FLOWS], 2,
                                   1 + (uint32_t)(i % 3), 1, *at, &d);
            else
                rate_limiter_check_at(s->lim, "shared", 6, 1, 0, *at, &d);
        }
        double ns = (double)(wall_ns() - t0) / (double)n;
        if (r == 0 || ns < best)
            best = ns;
    }
    return best;
}

int bench_fair_redis(const char *url, unsigned rounds)
{
    rate_policy_t *p = NULL;
    char err[256];
    if (rate_policy_parse(OPEN, &p, err, sizeof err) != RATE_OK)
        return cli_fail("bench: %s", err);
    printf("fair shares on Redis (%s), 1 caller, best of %u rounds:\n"
           "%-8s %14s %14s %8s  %s\n", url, rounds, "path", "plain us/dec",
           "fair us/dec", "ratio", "fair decisions made by");
    int rc = 0;
    for (int module = 0; module < 2 && rc == 0; module++) {
        side_t s;
        if ((rc = side_open(&s, url, module, p)) != 0)
            break;
        uint64_t at = 0;
        /* warm: connections, scripts, the module's probe */
        per_decision(&s, true, 1, 50, &at);
        per_decision(&s, false, 1, 50, &at);
        rate_redis_status_t st;
        rate_store_redis_status(s.store, &st);
        if (module && !st.module) {
            printf("%-8s %14s %14s %8s  (the server has no ratelimit.so)\n",
                   "module", "-", "-", "-");
            side_close(&s);
            break;
        }
        double plain = per_decision(&s, false, rounds, 2000, &at);
        double fair = per_decision(&s, true, rounds, 2000, &at);
        rate_store_redis_status(s.store, &st);
        printf("%-8s %14.1f %14.1f %7.2fx  %s\n", module ? "module" : "script",
               plain / 1000, fair / 1000, fair / plain,
               module ? (st.module_fair ? "RATELIMIT.FAIR" : "?")
                      : (st.script_fair ? "the fair script" : "?"));
        side_close(&s);
    }
    rate_policy_free(p);
    return rc;
}
