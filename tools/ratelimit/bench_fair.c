/* SPDX-License-Identifier: MIT */
/*
 * ratelimit bench --fair: a fair decision (rate_fair_*, docs/fair.md)
 * beside a plain one on the same shared limit, on the memory and the
 * shared-memory stores.  That shared limit admits everything (a token
 * bucket of 10^9/s), so that every figure is the decision's cost, not a
 * denial's;
 * flows take turns, so that most decisions find their flow ahead of the
 * others.  Times are the thread's CPU time (the machine may be shared:
 * time spent preempted is not the decision's), best of the rounds.
 * Then, by table size: a saturated shared limit's not-waiting decision,
 * and the waiting call with threads queued on a limit of 2000/s; last,
 * the waiting call's CPU time per request as the number of flows grows.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ratelimit_fair.h>
#include <ratelimit_shm.h>

#include "cli.h"

#define FLOWS_MAX 4096
#define SIDE_SLOTS 256 /* the side-by-side's table: 4x its 64 flows */
#define OPEN "token-bucket 1000000000/s burst=1000000000"

static char (*flow)[16];

static uint64_t cpu_ns(clockid_t which)
{
    struct timespec ts;
    clock_gettime(which, &ts);
    return (uint64_t)ts.tv_sec * RATE_NS_PER_S + (uint64_t)ts.tv_nsec;
}

static double per_op(uint64_t t0, uint64_t n)
{
    return (double)(cpu_ns(CLOCK_THREAD_CPUTIME_ID) - t0) / (double)n;
}

/* One clock for the open limit's decisions, plain and fair alike, so
 * that no call asks at a time before the key's last. */
static uint64_t at_ns;

static double plain_ns(rate_limiter_t *lim, uint64_t iters)
{
    uint64_t t0 = cpu_ns(CLOCK_THREAD_CPUTIME_ID), ok = 0;
    for (uint64_t i = 0; i < iters; i++)
        ok += rate_try_acquire_len_at(lim, "shared", 6, 1, ++at_ns);
    if (ok != iters)
        fprintf(stderr, "bench: the open limit denied\n");
    return per_op(t0, iters);
}

static double fair_ns(rate_fair_t *f, unsigned flows, uint64_t iters)
{
    uint64_t t0 = cpu_ns(CLOCK_THREAD_CPUTIME_ID), ok = 0;
    unsigned j = 0; /* the flows in turn, without a division per call */
    for (uint64_t i = 0; i < iters; i++, j = j + 1 == flows ? 0 : j + 1)
        ok += rate_fair_try_acquire_at(f, flow[j], 15, 1, 1, ++at_ns);
    if (ok != iters)
        fprintf(stderr, "bench: the open limit denied a fair request\n");
    return per_op(t0, iters);
}

static double lesser(double a, double b) { return a < b ? a : b; }

/* A saturated shared limit: 4 flows taking turns ask as fast as they
 * can of a limit of 1000/s (at the clock), so most decisions are
 * denials and some weigh the reserve. */
static double saturated_ns(rate_fair_t *f, uint64_t iters)
{
    uint64_t t0 = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
    for (uint64_t i = 0; i < iters; i++)
        (void)rate_fair_try_acquire(f, flow[i % 4], 15, 1, 1);
    return per_op(t0, iters);
}

#define WAITERS 4
#define WAIT_EACH 250 /* acquires per thread: 1000 at 2000/s, ~0.5 s */

typedef struct waiter {
    rate_fair_t *fair;
    unsigned idx;
    uint64_t admitted;
} waiter_t;

static void *waiter_run(void *arg)
{
    waiter_t *w = arg;
    for (unsigned i = 0; i < WAIT_EACH; i++) {
        rate_decision_t d;
        if (rate_fair_acquire(w->fair, flow[w->idx], 15, 1, 1, 1000000000,
                              &d) == RATE_OK && d.allowed)
            w->admitted++;
    }
    return NULL;
}

/* WAITERS threads, one flow each, queued on the shared limit: permits
 * admitted per second of the run (the limit's 2000/s at best). */
static double waiting_rate(rate_fair_t *f)
{
    waiter_t w[WAITERS];
    pthread_t th[WAITERS];
    uint64_t t0 = rate_clock_monotonic_ns(), admitted = 0;
    unsigned started = 0;
    for (unsigned i = 0; i < WAITERS; i++) {
        w[i] = (waiter_t){f, i, 0};
        if (pthread_create(&th[i], NULL, waiter_run, &w[i]) == 0)
            started++;
        else
            break;
    }
    for (unsigned i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        admitted += w[i].admitted;
    }
    return (double)admitted * 1e9 /
           (double)(rate_clock_monotonic_ns() - t0);
}

static rate_limiter_t *limiter_of_text(const char *text, rate_store_t *st);

#define BY_FLOWS_THREADS 4
#define BY_FLOWS_EACH 500 /* acquires per thread: 2000 at 4000/s, ~0.5 s */

typedef struct spread {
    rate_fair_t *fair;
    unsigned idx, flows;
} spread_t;

static void *spread_run(void *arg)
{
    spread_t *w = arg;
    for (unsigned i = 0; i < BY_FLOWS_EACH; i++) {
        rate_decision_t d;
        unsigned fl = (i * BY_FLOWS_THREADS + w->idx) % w->flows;
        (void)rate_fair_acquire(w->fair, flow[fl], 15, 1, 1, 1000000000, &d);
    }
    return NULL;
}

/* The waiting call's cost per request as the number of active flows
 * grows: every flow is made active first (one request each), then 4
 * threads queue on a limit of 4000/s, each request of a flow in turn;
 * the process's CPU time per request, beside 1 flow's. */
static int by_flows(void)
{
    static const unsigned counts[] = {1, 10, 100, 1000, RATE_FAIR_SLOTS_MAX};
    double cost[5];
    char err[256];
    for (size_t k = 0; k < 5; k++) {
        rate_limiter_t *lim =
            limiter_of_text("token-bucket 4000/s burst=40", NULL);
        rate_fair_t *f = NULL;
        rate_fair_config_t fc = {.limiter = lim, .key = "shared", .key_len = 6,
                                 .slots = RATE_FAIR_SLOTS_MAX};
        if (lim == NULL || rate_fair_new(&fc, &f, err, sizeof err) != RATE_OK)
            return cli_fail("bench: %s", err);
        for (unsigned i = 0; i < counts[k]; i++)
            (void)rate_fair_try_acquire(f, flow[i], 15, 1, 1);
        spread_t w[BY_FLOWS_THREADS];
        pthread_t th[BY_FLOWS_THREADS];
        unsigned started = 0;
        uint64_t t0 = cpu_ns(CLOCK_PROCESS_CPUTIME_ID);
        for (unsigned i = 0; i < BY_FLOWS_THREADS; i++) {
            w[i] = (spread_t){f, i, counts[k]};
            if (pthread_create(&th[i], NULL, spread_run, &w[i]) != 0)
                break;
            started++;
        }
        for (unsigned i = 0; i < started; i++)
            pthread_join(th[i], NULL);
        cost[k] = (double)(cpu_ns(CLOCK_PROCESS_CPUTIME_ID) - t0) /
                  (double)(started * BY_FLOWS_EACH);
        rate_fair_free(f);
        rate_limiter_free(lim);
    }
    printf("waiting, by active flows (4096 slots)  flows  "
           "CPU ns/request  of 1 flow\n");
    for (size_t k = 0; k < 5; k++)
        printf("  %-36s %5u %15.0f %9.2fx\n",
               k == 0 ? "4 threads queued on 4000/s" : "", counts[k], cost[k],
               cost[k] / cost[0]);
    return 0;
}

static rate_limiter_t *limiter_of_text(const char *text, rate_store_t *st)
{
    rate_policy_t *p = NULL;
    if (rate_policy_parse(text, &p, NULL, 0) != RATE_OK)
        return NULL;
    rate_limiter_config_t c = {.policy = p, .store = st};
    rate_limiter_t *lim = NULL;
    rate_limiter_new(&c, &lim);
    rate_policy_free(p);
    return lim;
}

/* Saturated decisions and queued waiters at the smallest, default and
 * largest tables: the cost of a table's size. */
static int by_slots(unsigned rounds, uint64_t iters)
{
    static const unsigned sizes[] = {64, 1024, RATE_FAIR_SLOTS_MAX};
    double sat[3], rate[3];
    char err[256];
    for (size_t k = 0; k < 3; k++) {
        rate_limiter_t *lim = limiter_of_text("token-bucket 1000/s burst=10", NULL);
        rate_limiter_t *wl =
            limiter_of_text("token-bucket 2000/s burst=20", NULL);
        rate_fair_t *f = NULL, *wf = NULL;
        rate_fair_config_t fc = {.limiter = lim, .key = "shared",
                                 .key_len = 6, .slots = sizes[k]};
        rate_fair_config_t wc = {.limiter = wl, .key = "shared",
                                 .key_len = 6, .slots = sizes[k]};
        if (lim == NULL || wl == NULL ||
            rate_fair_new(&fc, &f, err, sizeof err) != RATE_OK ||
            rate_fair_new(&wc, &wf, err, sizeof err) != RATE_OK)
            return cli_fail("bench: %s", err);
        sat[k] = 1e300;
        rate[k] = 0;
        for (unsigned r = 0; r < rounds; r++) {
            sat[k] = lesser(sat[k], saturated_ns(f, iters / 4));
            double a = waiting_rate(wf);
            rate[k] = a > rate[k] ? a : rate[k];
        }
        rate_fair_free(f);
        rate_fair_free(wf);
        rate_limiter_free(lim);
        rate_limiter_free(wl);
    }
    printf("by table size (memory store)           slots  "
           "saturated ns  of 64   waiting admitted/s  of 64\n");
    for (size_t k = 0; k < 3; k++)
        printf("  %-36s %5u %13.1f %6.2fx %19.0f %6.2fx\n",
               k == 0 ? "4 flows; 4 threads on 2000/s" : "", sizes[k],
               sat[k], sat[k] / sat[0], rate[k], rate[k] / rate[0]);
    return 0;
}

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
    static const unsigned counts[] = {1, 4, 64};
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
                                 .key_len = 6, .slots = SIDE_SLOTS,
                                 .shm_path = s ? table : NULL};
        if (lim[s] == NULL ||
            rate_fair_new(&fc, &fair[s], err, sizeof err) != RATE_OK)
            return cli_fail("bench: %s", err);
    }
    printf("fair shares beside a plain shared limit (CPU ns/decision) "
           "plain     fair   ratio  target\n");
    for (int s = 0; s < 2; s++) {
        for (size_t c = 0; c < 3; c++) {
            double p = 1e300, f = 1e300;
            for (unsigned r = 0; r < rounds; r++) {
                p = lesser(p, plain_ns(lim[s], iters));
                f = lesser(f, fair_ns(fair[s], counts[c], iters));
            }
            char what[80];
            snprintf(what, sizeof what, "%s, %u flow%s (%u slots)",
                     s ? "shm" : "memory", counts[c], counts[c] > 1 ? "s" : "",
                     SIDE_SLOTS);
            printf("  %-52s %8.1f %8.1f %6.2fx  <= 1.5x\n", what, p, f, f / p);
        }
    }
    int rc = by_slots(rounds, iters);
    if (rc == 0)
        rc = by_flows();
    for (int s = 0; s < 2; s++) {
        rate_fair_free(fair[s]);
        rate_limiter_free(lim[s]);
    }
    rate_store_free(shm);
    unlink(region);
    unlink(table);
    free(flow);
    return rc;
}
