/*
 * ratelimit demo: the same bursty traffic through each algorithm at the same
 * long-run rate (10 per second), on the in-memory store, and what each one
 * admitted.  Time is virtual, so the run is instant and repeatable.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define MS UINT64_C(1000000)

typedef struct req {
    uint64_t t_ns;
} req_t;

/* 10 s of traffic: a steady 8/s, a burst of 40 at 2 s, and 20 just before
 * and 20 just after the edge of second 6 (aimed at fixed windows). */
static size_t make_traffic(req_t *out)
{
    size_t n = 0;
    for (uint64_t t = 0; t < 10000 * MS; t += 125 * MS)
        out[n++] = (req_t){t};
    for (int i = 0; i < 40; i++)
        out[n++] = (req_t){2000 * MS + (uint64_t)i * MS};
    for (int i = 0; i < 20; i++) {
        out[n++] = (req_t){5980 * MS + (uint64_t)i * MS};
        out[n++] = (req_t){6000 * MS + (uint64_t)i * MS};
    }
    return n;
}

static int by_time(const void *a, const void *b)
{
    uint64_t x = ((const req_t *)a)->t_ns, y = ((const req_t *)b)->t_ns;
    return x < y ? -1 : x > y;
}

int cmd_demo(int argc, char **argv)
{
    static const char *policies[] = {
        "token-bucket 10/s burst=10",  "leaky-bucket 10/s capacity=10",
        "fixed-window 10/s",           "sliding-log 10/s",
        "sliding-window 10/s",
    };
    req_t reqs[256];
    size_t n;

    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        puts("usage: ratelimit demo\n\nSends 10 s of bursty traffic for one key "
             "through each algorithm at 10/s\nand prints what each admitted.");
        return 0;
    }
    if (argc > 1)
        return cli_fail("demo: unexpected argument '%s'", argv[1]);
    n = make_traffic(reqs);
    qsort(reqs, n, sizeof reqs[0], by_time);
    printf("%zu requests for one key over 10 s: steady 8/s, a burst of 40 at "
           "2 s,\n20 just before and 20 just after the 6 s edge.  Every policy "
           "allows 10/s.\n\n",
           n);
    printf("%-31s %8s %7s %14s\n", "policy", "admitted", "denied",
           "max in any 1 s");
    for (size_t p = 0; p < sizeof policies / sizeof policies[0]; p++) {
        rate_policy_t *pol;
        rate_limiter_t *lim;
        char err[200];
        uint64_t admitted[256];
        size_t ok = 0, best = 0;
        if (rate_policy_parse(policies[p], &pol, err, sizeof err) != RATE_OK)
            return cli_fail("demo: %s", err);
        rate_limiter_config_t cfg = {.policy = pol};
        if (rate_limiter_new(&cfg, &lim) != RATE_OK)
            return cli_fail("demo: cannot make a limiter");
        for (size_t i = 0; i < n; i++)
            if (rate_try_acquire_at(lim, "client", 1, reqs[i].t_ns))
                admitted[ok++] = reqs[i].t_ns;
        /* Burstiness: the most admitted in any window (t - 1 s, t]. */
        for (size_t i = 0, j = 0; i < ok; i++) {
            while (admitted[j] + 1000 * MS <= admitted[i])
                j++;
            if (i - j + 1 > best)
                best = i - j + 1;
        }
        printf("%-31s %8zu %7zu %14zu\n", policies[p], ok, n - ok, best);
        rate_limiter_free(lim);
        rate_policy_free(pol);
    }
    printf("\n'max in any 1 s' is the most admitted in any one-second span: "
           "the\nsliding log keeps it at the limit, a fixed window can reach "
           "twice the\nlimit across an edge, a token bucket its burst plus "
           "one second of refill.\n");
    return 0;
}
