/* SPDX-License-Identifier: MIT */
/*
 * ratelimit bench --leases: an in-flight lease (acquire + release) beside
 * one rate decision, on the memory store, a shared-memory region and,
 * with --redis URL, Redis (leases by the general path, the lease script
 * and the module, side by side; then a combined policy's acquire and
 * release as two steps and as one command); 1 and 64 callers (threads) on one key.  Each
 * figure is the calls made in a fixed span by all callers; the best of 3
 * rounds, alternated; the ratio is of the same run (docs/performance.md, "Leases").
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "ratelimit_lease.h"
#include "ratelimit_shm.h"
#ifdef RATE_WITH_REDIS
#include "ratelimit_redis.h"
#endif

#define SPAN_NS (300 * UINT64_C(1000000))
#define MAX_CALLERS 64

typedef struct run {
    rate_limiter_t *lim;
    rate_inflight_t *in;
    atomic_bool go, stop;
    _Atomic uint64_t ops, errors;
} run_t;

static void *caller(void *arg)
{
    run_t *r = arg;
    uint64_t n = 0, errors = 0;
    while (!atomic_load(&r->go))
        ;
    while (!atomic_load_explicit(&r->stop, memory_order_relaxed)) {
        if (r->lim != NULL && r->in != NULL) {
            /* A combined policy as two steps: the lease, then the rate
             * limits (how an acquire went before they were one). */
            rate_lease_t l;
            rate_decision_t d, rd;
            if (rate_inflight_acquire(r->in, "hot", 3, RATE_LEASE_NORMAL, &l,
                                      &d) != RATE_OK || !d.allowed) {
                errors++;
            } else {
                errors += rate_limiter_check(r->lim, "hot", 3, 1, 0, &rd) !=
                              RATE_OK || !rd.allowed;
                errors += rate_inflight_release(r->in, "hot", 3, &l) !=
                          RATE_OK;
            }
        } else if (r->lim != NULL) {
            rate_decision_t d;
            errors += rate_limiter_check(r->lim, "hot", 3, 1, 0, &d) !=
                          RATE_OK || !d.allowed;
        } else {
            rate_lease_t l;
            rate_decision_t d;
            if (rate_inflight_acquire(r->in, "hot", 3, RATE_LEASE_NORMAL, &l,
                                      &d) != RATE_OK || !d.allowed)
                errors++;
            else
                errors += rate_inflight_release(r->in, "hot", 3, &l) !=
                          RATE_OK;
        }
        n++;
    }
    r->ops += n;
    r->errors += errors;
    return NULL;
}

/* Calls per second of `callers` threads for SPAN_NS. */
static double measure(rate_limiter_t *lim, rate_inflight_t *in, int callers,
                      uint64_t *errors)
{
    run_t r = {.lim = lim, .in = in};
    pthread_t th[MAX_CALLERS];
    for (int i = 0; i < callers; i++)
        pthread_create(&th[i], NULL, caller, &r);
    uint64_t t0 = rate_clock_monotonic_ns();
    atomic_store(&r.go, true);
    struct timespec ts = {0, (long)SPAN_NS};
    nanosleep(&ts, NULL);
    atomic_store(&r.stop, true);
    for (int i = 0; i < callers; i++)
        pthread_join(th[i], NULL);
    double s = (double)(rate_clock_monotonic_ns() - t0) / 1e9;
    *errors += r.errors;
    return (double)r.ops / s;
}

/* Way A (a_lim, a_in) and way B (B's lease object alone) measured in
 * turn, best of 3 each, with 1 and 64 callers: a row each of A's rate,
 * B's, and A/B (B/A when b_over_a). */
static void rows(const char *name, rate_limiter_t *a_lim, rate_inflight_t *a_in,
                 rate_inflight_t *b_in, bool b_over_a)
{
    static const int callers[] = {1, 64};
    for (size_t c = 0; c < 2; c++) {
        uint64_t errors = 0;
        double a = 0, b = 0;
        for (int round = 0; round < 3; round++) { /* alternated */
            double x = measure(a_lim, a_in, callers[c], &errors);
            double y = measure(NULL, b_in, callers[c], &errors);
            a = x > a ? x : a;
            b = y > b ? y : b;
        }
        printf("%-14s %7d %14.0f %14.0f %9.2f%s\n", name, callers[c], a, b,
               b_over_a ? b / a : a / b,
               errors ? "  (errors or denials)" : "");
        fflush(stdout);
    }
}

static int row(const char *name, rate_store_t *store)
{
    rate_policy_t *rp;
    rate_inflight_policy_t *ip;
    char err[256];
    if (rate_policy_parse("token-bucket 1000000000/s burst=1000000000", &rp,
                          err, sizeof err) != RATE_OK ||
        rate_inflight_policy_parse("concurrency 64 ttl=1m", &ip, err,
                                   sizeof err) != RATE_OK)
        return cli_fail("bench: %s", err);
    rate_limiter_config_t lc = {.policy = rp, .store = store};
    rate_inflight_config_t ic = {.policy = ip, .store = store};
    rate_limiter_t *lim = NULL;
    rate_inflight_t *in = NULL;
    int rc = rate_limiter_new(&lc, &lim);
    if (rc == RATE_OK)
        rc = rate_inflight_new(&ic, &in);
    if (rc != RATE_OK) {
        rate_limiter_free(lim);
        return cli_fail("bench: %s: %s", name, rate_strerror(rc));
    }
    rows(name, lim, NULL, in, false);
    rate_inflight_free(in);
    rate_limiter_free(lim);
    rate_inflight_policy_free(ip);
    rate_policy_free(rp);
    return 0;
}

#ifdef RATE_WITH_REDIS
/* A combined policy's acquire + release on one Redis store: as two steps
 * (a lease-only object and a limiter, the two round trips an acquire took
 * before) and as one (the combined object: one command). */
static int combined_row(const char *name, rate_store_t *store)
{
    static const char rate[] = "token-bucket 100000/s burst=100000";
    rate_policy_t *rp;
    rate_inflight_policy_t *lp, *cp;
    char err[256];
    if (rate_policy_parse(rate, &rp, err, sizeof err) != RATE_OK ||
        rate_inflight_policy_parse("concurrency 64 ttl=1m", &lp, err,
                                   sizeof err) != RATE_OK ||
        rate_inflight_policy_parse("concurrency 64 ttl=1m; token-bucket "
                                   "100000/s burst=100000",
                                   &cp, err, sizeof err) != RATE_OK)
        return cli_fail("bench: %s", err);
    rate_limiter_config_t lc = {.policy = rp, .store = store};
    rate_inflight_config_t li = {.policy = lp, .store = store};
    rate_inflight_config_t ci = {.policy = cp, .store = store};
    rate_limiter_t *lim = NULL;
    rate_inflight_t *lease = NULL, *both = NULL;
    int rc = rate_limiter_new(&lc, &lim);
    if (rc == RATE_OK)
        rc = rate_inflight_new(&li, &lease);
    if (rc == RATE_OK)
        rc = rate_inflight_new(&ci, &both);
    if (rc != RATE_OK) {
        rate_limiter_free(lim);
        rate_inflight_free(lease);
        return cli_fail("bench: %s: %s", name, rate_strerror(rc));
    }
    rows(name, lim, lease, both, true);
    rate_inflight_free(both);
    rate_inflight_free(lease);
    rate_limiter_free(lim);
    rate_inflight_policy_free(cp);
    rate_inflight_policy_free(lp);
    rate_policy_free(rp);
    return 0;
}
#endif

int bench_leases(const char *redis_url)
{
    rate_store_t *mem = NULL, *shm = NULL;
    char path[64], err[256];
    int status = 0;

#ifndef RATE_WITH_REDIS
    if (redis_url != NULL) /* refused before the other figures, not after */
        return cli_fail("bench: --redis: this build has no Redis store");
#endif
    printf("%-14s %7s %14s %14s %9s\n", "store", "callers", "decisions/s",
           "leases/s", "ratio");
    if (rate_store_memory_new(NULL, &mem) != RATE_OK)
        return cli_fail("bench: cannot make the memory store");
    status |= row("memory", mem);
    rate_store_free(mem);

    snprintf(path, sizeof path, "/dev/shm/rl-bench-lease-%ld", (long)getpid());
    rate_shm_options_t so = {.max_keys = 1024, .state_max = 14 + 24 * 64};
    if (rate_store_shm_new(path, &so, &shm, err, sizeof err) != RATE_OK) {
        unlink(path);
        return cli_fail("bench: shm: %s", err);
    }
    status |= row("shm", shm);
    rate_store_free(shm);
    unlink(path);

    if (redis_url != NULL) {
#ifdef RATE_WITH_REDIS
        /* Leases by the general path (HMGET + compare-and-set: two round
         * trips or more each), by the lease script and by the module (one
         * each), in one run; the module's row only when the server has
         * it (docs/leases.md, "Leases on Redis"). */
        static const struct {
            const char *name;
            bool generic;
            rate_redis_module_t module;
        } paths[] = {{"redis-generic", true, RATE_REDIS_MODULE_OFF},
                     {"redis-script", false, RATE_REDIS_MODULE_OFF},
                     {"redis-module", false, RATE_REDIS_MODULE_ON}};
        for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
            rate_redis_options_t ro = {.prefix = "ratelimit-bench-lease:",
                                       .generic_leases = paths[i].generic,
                                       .module = paths[i].module};
            rate_store_t *rs = NULL;
            if (rate_store_redis_new(redis_url, &ro, &rs, err, sizeof err) !=
                RATE_OK) {
                if (paths[i].module == RATE_REDIS_MODULE_ON) {
                    printf("%-14s (no ratelimit.so on the server)\n",
                           paths[i].name);
                    continue;
                }
                return cli_fail("bench: --redis %s: %s", redis_url, err);
            }
            status |= row(paths[i].name, rs);
            rate_store_redis_drop(rs);
            rate_store_free(rs);
        }
        /* A combined policy: its acquire + release as two steps and as
         * one command (docs/leases.md, "Leases on Redis"). */
        printf("\ncombined policy (concurrency 64; token bucket)\n"
               "%-14s %7s %14s %14s %9s\n", "store", "callers",
               "two steps/s", "one command/s", "ratio");
        for (size_t i = 1; i < sizeof paths / sizeof paths[0]; i++) {
            rate_redis_options_t ro = {.prefix = "ratelimit-bench-lease:",
                                       .module = paths[i].module};
            rate_store_t *rs = NULL;
            if (rate_store_redis_new(redis_url, &ro, &rs, err, sizeof err) !=
                RATE_OK) {
                printf("%-14s (no ratelimit.so on the server)\n",
                       paths[i].name);
                continue;
            }
            status |= combined_row(paths[i].name, rs);
            rate_store_redis_drop(rs);
            rate_store_free(rs);
        }
#endif
    }
    printf("leases/s: acquire + release pairs (concurrency 64, one key);\n"
           "decisions/s: rate_limiter_check (token bucket, one key);\n"
           "ratio: what a pair costs in decisions.\n"
           "redis-generic: leases by HMGET + compare-and-set (2 round trips\n"
           "each, more on a conflict); redis-script, redis-module: by the\n"
           "lease script or RATELIMIT.LEASE (1 round trip each).\n");
    if (redis_url != NULL)
        printf("combined: acquire + release pairs of \"concurrency 64 "
               "ttl=1m; token-bucket\n"
               "100000/s\": two steps, the lease then the rate limits (3\n"
               "round trips a pair); one command, the lease with its rate\n"
               "limits (2 a pair); ratio: one / two.\n");
    return status;
}
