/* SPDX-License-Identifier: MIT */
/*
 * ratelimit bench --fair: a fair decision (rate_fair_*, docs/fair.md)
 * beside a plain one on the same shared limit, on the memory and the
 * shared-memory stores, and the waiting call's cost as the number of
 * flows grows.  The shared limit admits everything (a token bucket of
 * 10^9/s), so that every figure is the decision's cost, not a denial's;
 * flows take turns, so that most decisions find their flow ahead of the
 * others and take the longer path (the reserve).  Best of the rounds.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ratelimit_fair.h>
#include <ratelimit_shm.h>

#include "cli.h"

#define FLOWS_MAX 65536
#define OPEN "token-bucket 1000000000/s burst=1000000000"

static char (*flow)[16];

static double per_op(uint64_t t0, uint64_t n)
{
    return (double)(rate_clock_monotonic_ns() - t0) / (double)n;
}

static double plain_ns(rate_limiter_t *lim, uint64_t iters)
{
    uint64_t t0 = rate_clock_monotonic_ns(), ok = 0;
    for (uint64_t i = 0; i < iters; i++)
        ok += rate_try_acquire_len_at(lim, "shared", 6, 1, i);
    if (ok != iters)
        fprintf(stderr, "bench: the open limit denied\n");
    return per_op(t0, iters);
}

static double fair_ns(rate_fair_t *f, unsigned flows, uint64_t iters)
{
    uint64_t t0 = rate_clock_monotonic_ns(), ok = 0;
    for (uint64_t i = 0; i < iters; i++)
        ok += rate_fair_try_acquire_at(f, flow[i % flows], 15, 1, 1, i);
    if (ok != iters)
        fprintf(stderr, "bench: the open limit denied a fair request\n");
    return per_op(t0, iters);
}

static double acquire_ns(rate_fair_t *f, unsigned flows, uint64_t iters)
{
    uint64_t t0 = rate_clock_monotonic_ns();
    for (uint64_t i = 0; i < iters; i++) {
        rate_decision_t d;
        rate_fair_acquire(f, flow[i % flows], 15, 1, 1, 1000000000, &d);
    }
    return per_op(t0, iters);
}

static double lesser(double a, double b) { return a < b ? a : b; }

static rate_limiter_t *open_limiter(rate_store_t *st)
{
    rate_policy_t *p = NULL;
    rate_policy_parse(OPEN, &p, NULL, 0);
    rate_limiter_config_t c = {.policy = p, .store = st};
    rate_limiter_t *lim = NULL;
    rate_limiter_new(&c, &lim);
    rate_policy_free(p);
    return lim;
}

int bench_fair(unsigned rounds, uint64_t iters)
{
    static const unsigned counts[] = {1, 4, 64, 1024, FLOWS_MAX};
    flow = malloc(FLOWS_MAX * sizeof *flow);
    if (flow == NULL)
        return cli_fail("bench: out of memory");
    for (unsigned i = 0; i < FLOWS_MAX; i++)
        snprintf(flow[i], sizeof flow[i], "flow:%010u", i);
    char region[64], table[64], err[256];
    snprintf(region, sizeof region, "/dev/shm/rl-bench-fair-%ld", (long)getpid());
    snprintf(table, sizeof table, "/dev/shm/rl-bench-fairt-%ld", (long)getpid());
    unlink(region);
    unlink(table);
    rate_shm_options_t so = {.max_keys = 1024};
    rate_store_t *shm = NULL;
    if (rate_store_shm_new(region, &so, &shm, err, sizeof err) != RATE_OK)
        return cli_fail("bench: %s", err);
    rate_limiter_t *lim[2] = {open_limiter(NULL), open_limiter(shm)};
    rate_fair_t *fair[2] = {NULL, NULL};
    for (int s = 0; s < 2; s++) {
        rate_fair_config_t fc = {.limiter = lim[s], .key = "shared",
                                 .key_len = 6,
                                 .shm_path = s ? table : NULL};
        if (lim[s] == NULL ||
            rate_fair_new(&fc, &fair[s], err, sizeof err) != RATE_OK)
            return cli_fail("bench: %s", err);
    }
    printf("fair shares beside a plain shared limit (ns/decision)   "
           "plain     fair   ratio  target\n");
    for (int s = 0; s < 2; s++) {
        for (size_t c = 0; c < 3; c++) {
            double p = 1e300, f = 1e300;
            for (unsigned r = 0; r < rounds; r++) {
                p = lesser(p, plain_ns(lim[s], iters));
                f = lesser(f, fair_ns(fair[s], counts[c], iters));
            }
            char what[80];
            snprintf(what, sizeof what, "%s, %u flow%s",
                     s ? "shm" : "memory", counts[c], counts[c] > 1 ? "s" : "");
            printf("  %-52s %8.1f %8.1f %6.2fx  <= 1.5x\n", what, p, f, f / p);
        }
    }
    printf("waiting call (rate_fair_acquire), nothing to wait for   "
           "ns/request  of 1 flow\n");
    for (int s = 0; s < 2; s++) {
        double one = 0;
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            double a = 1e300;
            for (unsigned r = 0; r < rounds; r++)
                a = lesser(a, acquire_ns(fair[s], counts[c], iters / 4));
            if (c == 0)
                one = a;
            char what[80];
            snprintf(what, sizeof what, "%s, %u flow%s",
                     s ? "shm" : "memory", counts[c], counts[c] > 1 ? "s" : "");
            printf("  %-52s %8.1f %8.2fx\n", what, a, a / one);
        }
    }
    for (int s = 0; s < 2; s++) {
        rate_fair_free(fair[s]);
        rate_limiter_free(lim[s]);
    }
    rate_store_free(shm);
    unlink(region);
    unlink(table);
    free(flow);
    return 0;
}
