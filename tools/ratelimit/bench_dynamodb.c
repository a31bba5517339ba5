/* SPDX-License-Identifier: MIT */
/*
 * ratelimit bench --store dynamodb://...: the DynamoDB store's decisions
 * per second and round trips per decision (the store's own count of its
 * requests), with 1 and 16 callers on distinct keys and 16 on one key (the
 * conditional writes' conflicts, each retried), beside a floor measured in
 * the same run: a denial, which is one GetItem and nothing else.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "ratelimit_dynamodb.h"

#define MS UINT64_C(1000000)

typedef struct dworker {
    rate_limiter_t *lim;
    char key[48];
    uint64_t until_ns, done, allowed, errors;
} dworker_t;

static void *run(void *arg)
{
    dworker_t *w = arg;
    while (rate_clock_monotonic_ns() < w->until_ns) {
        rate_decision_t d;
        rate_limiter_check(w->lim, w->key, strlen(w->key), 1, 0, &d);
        w->done++;
        w->allowed += d.allowed;
        w->errors += d.reason == RATE_REASON_STORE_ERROR;
    }
    return NULL;
}

typedef struct figures {
    double per_s, requests, conflicts, allowed;
    uint64_t decisions, errors;
} figures_t;

/* n callers for ms on nkeys keys (key names under `tag`). */
static figures_t measure(rate_limiter_t *lim, rate_store_t *store,
                         const char *tag, int n, int nkeys, uint64_t ms)
{
    dworker_t *w = calloc((size_t)n, sizeof *w);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    figures_t f = {0};
    rate_dynamodb_counters_t c0, c1;
    if (w == NULL || th == NULL) {
        free(w);
        free(th);
        return f;
    }
    rate_store_dynamodb_counters(store, &c0);
    uint64_t t0 = rate_clock_monotonic_ns(), allowed = 0;
    for (int i = 0; i < n; i++) {
        w[i].lim = lim;
        snprintf(w[i].key, sizeof w[i].key, "%s:%d", tag, i % nkeys);
        w[i].until_ns = t0 + ms * MS;
        pthread_create(&th[i], NULL, run, &w[i]);
    }
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        f.decisions += w[i].done;
        f.errors += w[i].errors;
        allowed += w[i].allowed;
    }
    double secs = (double)(rate_clock_monotonic_ns() - t0) / 1e9;
    rate_store_dynamodb_counters(store, &c1);
    double dn = f.decisions ? (double)f.decisions : 1;
    f.per_s = (double)f.decisions / secs;
    f.requests = (double)(c1.requests - c0.requests) / dn;
    f.conflicts = (double)(c1.conflicts - c0.conflicts) / dn;
    f.allowed = (double)allowed / dn;
    free(w);
    free(th);
    return f;
}

static void row(const char *name, const figures_t *f, double base)
{
    printf("  %-34s %10.0f %7.2f %9.2f %9.3f %7.0f%%\n", name, f->per_s,
           base > 0 ? f->per_s / base : 0, f->requests, f->conflicts,
           100.0 * f->allowed);
    if (f->errors)
        printf("    (%llu store errors)\n", (unsigned long long)f->errors);
}

int bench_dynamodb(const char *url)
{
    char prefix[64], err[768];
    snprintf(prefix, sizeof prefix, "bench:%ld:", (long)getpid());
    rate_dynamodb_options_t o = {.prefix = prefix,
                                 .prefix_len = strlen(prefix),
                                 .create_table = true};
    rate_store_t *store = NULL;
    if (rate_store_dynamodb_new(url, &o, &store, err, sizeof err) != RATE_OK)
        return cli_fail("bench: --store: %s", err);
    /* Admitting: a bucket that never runs dry here (each admission is a
     * GetItem and a PutItem).  Denying: a window of one, used up (a
     * GetItem alone: the floor). */
    static const char *const texts[2] = {"token-bucket 1000000/s burst=1000000",
                                         "fixed-window 1/1h"};
    rate_limiter_t *lim[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        rate_policy_t *p = NULL;
        rate_limiter_config_t cfg = {0};
        if (rate_policy_parse(texts[i], &p, NULL, 0) != RATE_OK)
            return cli_fail("bench: cannot make the policy");
        cfg.policy = p;
        cfg.store = store;
        cfg.max_retries = 1000;
        int rc = rate_limiter_new(&cfg, &lim[i]);
        rate_policy_free(p);
        if (rc != RATE_OK)
            return cli_fail("bench: cannot make the limiter: %s",
                            rate_strerror(rc));
    }
    printf("\nDynamoDB store (%s): a decision = GetItem, then PutItem "
           "conditioned on the version when it writes\n", url);
    printf("  %-34s %10s %7s %9s %9s %8s\n", "", "decisions/s", "x floor",
           "requests", "conflicts", "allowed");
    printf("  %-34s %10s %7s %9s %9s %8s\n", "", "", "",
           "/decision", "/decision", "");
    /* Each row is the best of three rounds of half a second, the rows
     * taken in turn in each round: the machine is shared, and a slow
     * spell should fall on every row alike, not on one. */
    static const struct {
        const char *name, *tag;
        int policy, callers, keys;
    } rows[] = {
        {"floor: 1 caller, denials (GetItem)", "deny", 1, 1, 1},
        {"1 caller, admissions", "solo", 0, 1, 1},
        {"16 callers, distinct keys", "many", 0, 16, 16},
        {"16 callers, one key (retries)", "hot", 0, 16, 1},
        {"16 callers, one key, denials", "hotdeny", 1, 16, 1},
    };
    enum { ROWS = sizeof rows / sizeof rows[0] };
    figures_t fig[ROWS];
    memset(fig, 0, sizeof fig);
    (void)measure(lim[1], store, "deny", 1, 1, 200); /* warm up */
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < ROWS; i++) {
            figures_t f = measure(lim[rows[i].policy], store, rows[i].tag,
                                  rows[i].callers, rows[i].keys, 500);
            if (f.per_s > fig[i].per_s)
                fig[i] = f;
        }
    for (int i = 0; i < ROWS; i++)
        row(rows[i].name, &fig[i], fig[0].per_s);
    rate_stats_t st;
    rate_limiter_stats(lim[0], &st);
    printf("  %-34s %10llu\n", "CAS retries in all (limiter)",
           (unsigned long long)st.retries);
    for (int i = 0; i < 2; i++)
        rate_limiter_free(lim[i]);
    int rc = rate_store_dynamodb_drop(store);
    rate_store_free(store);
    if (rc != RATE_OK)
        return cli_fail("bench: could not remove the bench's items (%s)",
                        rate_strerror(rc));
    return 0;
}
