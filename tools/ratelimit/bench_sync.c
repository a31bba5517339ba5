/* SPDX-License-Identifier: MIT */
/*
 * ratelimit bench --sync URL: the synced mode (local decisions over
 * leases of a Redis store at URL) beside the memory store and the Redis
 * store, in the same run, one process: decisions/s at one hot key and at
 * 1M keys at random, and the round trips to Redis per 1000 decisions.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ratelimit_redis.h"
#include "ratelimit_synced.h"

#define MS UINT64_C(1000000)
#define NKEYS (1u << 20)
#define KEYLEN 16
#define LEASE 100000 /* L/2 above what a hot key spends per round trip */
#define OPEN "token-bucket 1000000000/s burst=1000000000"

static char (*bkeys)[KEYLEN + 1];

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005u + 1442695040888963407u;
    return *s >> 33;
}

/* One way of deciding, for the loops below. */
typedef struct target {
    rate_limiter_t *lim;
    rate_synced_t *syn;
} target_t;

static bool decide(const target_t *t, const char *key)
{
    if (t->syn != NULL)
        return rate_synced_try_acquire(t->syn, key, KEYLEN, 1);
    return rate_try_acquire_len(t->lim, key, KEYLEN, 1);
}

typedef struct loop {
    const target_t *t;
    bool random;
    uint64_t seed, until_ns, done;
    uint32_t first, count; /* with random NULL: keys first.. in order */
} loop_t;

static void *loop_main(void *arg)
{
    loop_t *l = arg;
    uint64_t s = l->seed, n = 0;
    if (l->count != 0) { /* warm-up: each of its keys once */
        for (uint32_t i = 0; i < l->count; i++)
            decide(l->t, bkeys[l->first + i]);
        l->done = l->count;
        return NULL;
    }
    while (rate_clock_monotonic_ns() < l->until_ns) {
        for (int i = 0; i < 64; i++) {
            const char *k =
                l->random ? bkeys[lcg(&s) & (NKEYS - 1)] : bkeys[42];
            decide(l->t, k);
        }
        n += 64;
    }
    l->done = n;
    return NULL;
}

/* Decisions per second on one thread for ms. */
static double rate_of(const target_t *t, bool random, uint64_t ms)
{
    uint64_t t0 = rate_clock_monotonic_ns();
    loop_t l = {t, random, 7, t0 + ms * MS, 0, 0, 0};
    loop_main(&l);
    return (double)l.done * 1e9 / (double)(rate_clock_monotonic_ns() - t0);
}

/* Every key once, from `threads` threads; seconds taken. */
static double warm(const target_t *t, int threads)
{
    pthread_t th[64];
    loop_t l[64];
    uint64_t t0 = rate_clock_monotonic_ns();
    uint32_t per = NKEYS / (uint32_t)threads;
    for (int i = 0; i < threads; i++) {
        l[i] = (loop_t){t, false, 0, 0, 0, per * (uint32_t)i,
                        i == threads - 1 ? NKEYS - per * (uint32_t)i : per};
        pthread_create(&th[i], NULL, loop_main, &l[i]);
    }
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    return (double)(rate_clock_monotonic_ns() - t0) / 1e9;
}

static rate_limiter_t *make_limiter(rate_store_t *store)
{
    rate_policy_t *p;
    rate_policy_parse(OPEN, &p, NULL, 0);
    rate_limiter_config_t c = {.policy = p, .store = store};
    rate_limiter_t *lim = NULL;
    if (rate_limiter_new(&c, &lim) != RATE_OK)
        exit(cli_fail("bench: cannot make a limiter"));
    rate_policy_free(p);
    return lim;
}

static double best(double a, double b)
{
    return a > b ? a : b;
}

int bench_sync(const char *url)
{
    rate_redis_options_t o = {0};
    rate_store_t *redis = NULL, *mem = NULL;
    char err[256], prefix[64];
    snprintf(prefix, sizeof prefix, "ratelimit:bench-sync:%llu:",
             (unsigned long long)rate_clock_monotonic_ns());
    o.prefix = prefix;
    o.pool_size = 8;
    if (rate_store_redis_new(url, &o, &redis, err, sizeof err) != RATE_OK)
        return cli_fail("bench: --sync: %s", err);
    if (rate_store_memory_new(NULL, &mem) != RATE_OK)
        return cli_fail("bench: out of memory");
    bkeys = malloc((size_t)NKEYS * sizeof *bkeys);
    if (bkeys == NULL)
        return cli_fail("bench: out of memory");
    for (uint32_t i = 0; i < NKEYS; i++)
        snprintf(bkeys[i], KEYLEN + 1, "user:%011u", i);

    rate_policy_t *p;
    rate_policy_parse(OPEN, &p, NULL, 0);
    rate_synced_config_t sc = {0};
    sc.policy = p;
    sc.remote = redis;
    sc.lease = LEASE;
    sc.lease_ttl_ns = 3600 * UINT64_C(1000000000);
    sc.prefetch = true;
    rate_synced_t *syn = NULL;
    if (rate_synced_new(&sc, &syn, err, sizeof err) != RATE_OK)
        return cli_fail("bench: --sync: %s", err);
    target_t tm = {make_limiter(mem), NULL}, tr = {make_limiter(redis), NULL},
             ts = {NULL, syn};

    /* hot key: the three interleaved over three rounds, best of each */
    double m_hot = 0, r_hot = 0, s_hot = 0;
    rate_synced_stats_t a, b;
    rate_synced_stats(syn, &a);
    for (int r = 0; r < 3; r++) {
        m_hot = best(m_hot, rate_of(&tm, false, 300));
        r_hot = best(r_hot, rate_of(&tr, false, 300));
        s_hot = best(s_hot, rate_of(&ts, false, 300));
    }
    rate_synced_stats(syn, &b);
    double s_hot_rt = 1000.0 * (double)(b.round_trips - a.round_trips) /
                      (double)(b.decisions - a.decisions);

    /* 1M keys at random: the memory store warm, Redis as it is, and the
     * synced mode cold (every key's first lease a round trip) then warm
     * (every key holding a lease, borrowed by 64 threads) */
    warm(&tm, 1);
    double m_rnd = 0, r_rnd = 0;
    for (int r = 0; r < 3; r++) {
        m_rnd = best(m_rnd, rate_of(&tm, true, 300));
        r_rnd = best(r_rnd, rate_of(&tr, true, 300));
    }
    rate_synced_stats(syn, &a);
    double s_cold = rate_of(&ts, true, 300);
    rate_synced_stats(syn, &b);
    double s_cold_rt = 1000.0 * (double)(b.round_trips - a.round_trips) /
                       (double)(b.decisions - a.decisions);
    double warm_s = warm(&ts, 64);
    rate_synced_stats(syn, &a);
    double s_rnd = 0;
    for (int r = 0; r < 3; r++)
        s_rnd = best(s_rnd, rate_of(&ts, true, 300));
    rate_synced_stats(syn, &b);
    double s_rnd_rt = 1000.0 * (double)(b.round_trips - a.round_trips) /
                      (double)(b.decisions - a.decisions);
    uint64_t held_keys = b.keys;

    uint64_t t0 = rate_clock_monotonic_ns();
    rate_synced_free(syn); /* the clean exit: every lease handed back */
    double free_s = (double)(rate_clock_monotonic_ns() - t0) / 1e9;

    printf("\nsynced mode over the Redis store (%s), lease L = %d, one "
           "process, one thread\n", url, LEASE);
    printf("  %-44s %12s %8s %8s %10s\n", "", "decisions/s", "x Redis",
           "x memory", "trips/1000");
    printf("  %-44s %12.0f %8.1f %8.2f %10s\n", "hot key: memory store",
           m_hot, m_hot / r_hot, 1.0, "-");
    printf("  %-44s %12.0f %8.1f %8.2f %10.1f\n", "hot key: Redis store",
           r_hot, 1.0, r_hot / m_hot, 1000.0);
    printf("  %-44s %12.0f %8.1f %8.2f %10.2f  targets: >= 50x Redis, "
           ">= 0.5x memory\n", "hot key: synced", s_hot, s_hot / r_hot,
           s_hot / m_hot, s_hot_rt);
    printf("  %-44s %12.0f %8.1f %8.2f %10s\n",
           "1M keys at random: memory store", m_rnd, m_rnd / r_rnd, 1.0, "-");
    printf("  %-44s %12.0f %8.1f %8.2f %10.1f\n",
           "1M keys at random: Redis store", r_rnd, 1.0, r_rnd / m_rnd,
           1000.0);
    printf("  %-44s %12.0f %8.1f %8.2f %10.1f\n",
           "1M keys at random: synced, cold keys", s_cold, s_cold / r_rnd,
           s_cold / m_rnd, s_cold_rt);
    printf("  %-44s %12.0f %8.1f %8.2f %10.2f  targets: >= 50x Redis\n",
           "1M keys at random: synced, leases held", s_rnd, s_rnd / r_rnd,
           s_rnd / m_rnd, s_rnd_rt);
    printf("  %-44s %12.2f s\n", "borrowing 1M leases (64 threads)", warm_s);
    printf("  %-44s %12.2f s  (%llu keys)\n",
           "clean exit: handing every lease back", free_s,
           (unsigned long long)held_keys);

    rate_limiter_free(tm.lim);
    rate_limiter_free(tr.lim);
    rate_store_redis_drop(redis);
    rate_store_free(redis);
    rate_store_free(mem);
    rate_policy_free(p);
    free(bkeys);
    return 0;
}
