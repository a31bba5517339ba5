/* SPDX-License-Identifier: MIT */
/*
 * Metrics for the example server, fed by the limiter's listener.
 *
 * Decisions are counted per policy name and per reason.  The names are
 * kept in a small shared table, found by a linear scan and added with a
 * compare-and-set on the slot (the names are the few of the rules file);
 * the counts are kept per thread (a shard each, on its own cache lines),
 * so that the server's threads never write a shared line per request,
 * and summed by the exposition, which stops no one: a scrape is a
 * snapshot to within the requests in flight.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

#define MAX_POLICIES 64
#define N_REASONS 4 /* rate_reason_t */

typedef struct pslot {
    _Atomic int state; /* 0 free, 1 being written, 2 ready */
    char name[RATE_POLICY_NAME_MAX + 1];
} pslot_t;

/* Latency buckets, upper bounds in ns (and +Inf). */
static const uint64_t bounds_ns[] = {1000,   2000,   5000,    10000,
                                     20000,  50000,  100000,  250000,
                                     500000, 1000000, 5000000, 25000000};
#define N_BOUNDS (sizeof bounds_ns / sizeof bounds_ns[0])

/* One thread's counts: written by that thread alone. */
typedef struct shard {
    atomic_uint_fast64_t allowed[MAX_POLICIES][N_REASONS];
    atomic_uint_fast64_t denied[MAX_POLICIES][N_REASONS];
    atomic_uint_fast64_t store_errors, untracked;
    atomic_uint_fast64_t bucket[N_BOUNDS + 1], count, sum_ns;
    struct shard *next;
} shard_t;

struct metrics {
    pslot_t policy[MAX_POLICIES];
    shard_t *_Atomic shards;
    atomic_uint_fast64_t reloads, reload_errors;
    /* leases: few requests take them; plain shared counters */
    atomic_uint_fast64_t lease_granted, lease_denied, lease_released,
        lease_expired, lease_release_errors;
};

static _Thread_local struct {
    metrics_t *owner;
    shard_t *shard;
} tls;

/* The calling thread's shard, made (cache-line aligned) and pushed on
 * first use. */
static shard_t *shard_of(metrics_t *m)
{
    if (tls.owner == m)
        return tls.shard;
    size_t size = (sizeof(shard_t) + 63) / 64 * 64;
    shard_t *s = aligned_alloc(64, size);
    if (s == NULL)
        return NULL;
    memset(s, 0, size);
    s->next = atomic_load(&m->shards);
    while (!atomic_compare_exchange_weak(&m->shards, &s->next, s))
        ;
    tls.owner = m;
    tls.shard = s;
    return s;
}

static void bump(atomic_uint_fast64_t *c, uint64_t by)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + by,
                          memory_order_relaxed);
}

int metrics_new(metrics_t **out)
{
    *out = calloc(1, sizeof **out);
    return *out != NULL ? 0 : -1;
}

void metrics_free(metrics_t *m)
{
    if (m == NULL)
        return;
    for (shard_t *s = atomic_load(&m->shards); s != NULL;) {
        shard_t *next = s->next;
        free(s);
        s = next;
    }
    free(m);
}

/* The index of a policy's name in the table (added if new), or -1 when
 * the table is full. */
static int slot_for(metrics_t *m, const char *name)
{
    for (int i = 0; i < MAX_POLICIES; i++) {
        pslot_t *s = &m->policy[i];
        int st = atomic_load_explicit(&s->state, memory_order_acquire);
        if (st == 0) {
            int zero = 0;
            if (atomic_compare_exchange_strong(&s->state, &zero, 1)) {
                snprintf(s->name, sizeof s->name, "%s", name);
                atomic_store_explicit(&s->state, 2, memory_order_release);
                return i;
            }
            st = zero;
        }
        while (st == 1) /* another thread is writing this name */
            st = atomic_load_explicit(&s->state, memory_order_acquire);
        if (strcmp(s->name, name) == 0)
            return i;
    }
    return -1;
}

void metrics_listen(void *ud, const rate_event_t *ev)
{
    metrics_t *m = ud;
    shard_t *sh = shard_of(m);
    int i = slot_for(m, ev->policy_name[0] ? ev->policy_name : "default");
    unsigned r = (unsigned)ev->reason < N_REASONS ? (unsigned)ev->reason : 0;

    if (sh == NULL)
        return; /* out of memory: uncounted */
    if (ev->error != 0)
        bump(&sh->store_errors, 1);
    if (i < 0)
        bump(&sh->untracked, 1);
    else
        bump(ev->allowed ? &sh->allowed[i][r] : &sh->denied[i][r], 1);
}

void metrics_latency(metrics_t *m, uint64_t ns)
{
    shard_t *sh = shard_of(m);
    size_t b = 0;

    if (sh == NULL)
        return;
    while (b < N_BOUNDS && ns > bounds_ns[b])
        b++;
    bump(&sh->bucket[b], 1);
    bump(&sh->count, 1);
    bump(&sh->sum_ns, ns);
}

void metrics_reload(metrics_t *m, int ok)
{
    atomic_fetch_add_explicit(ok ? &m->reloads : &m->reload_errors, 1,
                              memory_order_relaxed);
}

void metrics_lease(metrics_t *m, lease_event_t ev)
{
    atomic_fetch_add_explicit(ev == LEASE_GRANTED ? &m->lease_granted
                                                  : &m->lease_denied,
                              1, memory_order_relaxed);
}

void metrics_lease_released(metrics_t *m, int rc)
{
    atomic_fetch_add_explicit(rc == RATE_OK ? &m->lease_released
                              : rc == RATE_EEXPIRED ? &m->lease_expired
                                                    : &m->lease_release_errors,
                              1, memory_order_relaxed);
}

typedef struct out {
    char *buf;
    size_t len, used;
    int full;
} out_t;

static void put(out_t *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void put(out_t *o, const char *fmt, ...)
{
    va_list ap;

    if (o->full)
        return;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->used, o->len - o->used, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= o->len - o->used)
        o->full = 1;
    else
        o->used += (size_t)n;
}

static uint64_t get(atomic_uint_fast64_t *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

/* A counter summed over the threads' shards: `at` gives its place in one. */
#define SUM(m, expr)                                                          \
    ({                                                                        \
        uint64_t sum_ = 0;                                                    \
        for (shard_t *sh = atomic_load(&(m)->shards); sh != NULL;             \
             sh = sh->next)                                                   \
            sum_ += get(&sh->expr);                                           \
        sum_;                                                                 \
    })

uint64_t metrics_store_errors(metrics_t *m)
{
    return SUM(m, store_errors);
}

size_t metrics_format(metrics_t *m, rate_limiter_t *lim, uint64_t generation,
                      char *buf, size_t len)
{
    static const char *reason[N_REASONS] = {"allowed", "limited", "never",
                                            "store-error"};
    out_t o = {buf, len, 0, 0};
    rate_stats_t st;

    put(&o, "# HELP ratelimit_decisions_total Decisions, by policy, result "
            "and reason.\n# TYPE ratelimit_decisions_total counter\n");
    for (size_t i = 0; i < MAX_POLICIES; i++) {
        pslot_t *s = &m->policy[i];
        if (atomic_load_explicit(&s->state, memory_order_acquire) != 2)
            continue;
        for (unsigned r = 0; r < N_REASONS; r++) {
            uint64_t a = SUM(m, allowed[i][r]), d = SUM(m, denied[i][r]);
            if (a != 0 || r == 0)
                put(&o, "ratelimit_decisions_total{policy=\"%s\",result="
                        "\"allowed\",reason=\"%s\"} %llu\n",
                    s->name, reason[r], (unsigned long long)a);
            if (d != 0 || r == 1)
                put(&o, "ratelimit_decisions_total{policy=\"%s\",result="
                        "\"denied\",reason=\"%s\"} %llu\n",
                    s->name, reason[r], (unsigned long long)d);
        }
    }
    put(&o, "# HELP ratelimit_store_errors_total Decisions the store failed "
            "(the fail mode decided).\n# TYPE ratelimit_store_errors_total "
            "counter\nratelimit_store_errors_total %llu\n",
        (unsigned long long)SUM(m, store_errors));
    put(&o, "# HELP ratelimit_decision_seconds Time to decide a request "
            "(every policy it gets).\n# TYPE ratelimit_decision_seconds "
            "histogram\n");
    uint64_t cum = 0;
    for (size_t b = 0; b < N_BOUNDS; b++) {
        cum += SUM(m, bucket[b]);
        put(&o, "ratelimit_decision_seconds_bucket{le=\"%g\"} %llu\n",
            (double)bounds_ns[b] / 1e9, (unsigned long long)cum);
    }
    cum += SUM(m, bucket[N_BOUNDS]);
    put(&o, "ratelimit_decision_seconds_bucket{le=\"+Inf\"} %llu\n",
        (unsigned long long)cum);
    put(&o, "ratelimit_decision_seconds_sum %.9f\n",
        (double)SUM(m, sum_ns) / 1e9);
    put(&o, "ratelimit_decision_seconds_count %llu\n",
        (unsigned long long)SUM(m, count));
    if (rate_limiter_stats(lim, &st) == RATE_OK)
        put(&o, "# HELP ratelimit_keys Keys the store holds.\n# TYPE "
                "ratelimit_keys gauge\nratelimit_keys %llu\n",
            (unsigned long long)st.keys);
    put(&o, "# HELP ratelimit_rules_generation The rules in use (1 at "
            "start, one more per reload).\n# TYPE ratelimit_rules_generation "
            "gauge\nratelimit_rules_generation %llu\n",
        (unsigned long long)generation);
    put(&o, "# HELP ratelimit_reloads_total Reloads of the rules file, by "
            "outcome.\n# TYPE ratelimit_reloads_total counter\n"
            "ratelimit_reloads_total{result=\"ok\"} %llu\n"
            "ratelimit_reloads_total{result=\"error\"} %llu\n",
        (unsigned long long)get(&m->reloads),
        (unsigned long long)get(&m->reload_errors));
    /* Released before granted counts: a scrape between the two reads
     * must not show a held count below zero. */
    uint64_t rel = get(&m->lease_released) + get(&m->lease_expired) +
                   get(&m->lease_release_errors);
    uint64_t granted = get(&m->lease_granted);
    put(&o, "# HELP ratelimit_leases_held Requests holding in-flight leases "
            "now.\n# TYPE ratelimit_leases_held gauge\n"
            "ratelimit_leases_held %llu\n",
        (unsigned long long)(granted > rel ? granted - rel : 0));
    put(&o, "# HELP ratelimit_leases_total Requests under in-flight "
            "policies, by result.\n# TYPE ratelimit_leases_total counter\n"
            "ratelimit_leases_total{result=\"granted\"} %llu\n"
            "ratelimit_leases_total{result=\"denied\"} %llu\n",
        (unsigned long long)granted,
        (unsigned long long)get(&m->lease_denied));
    put(&o, "# HELP ratelimit_lease_releases_total Held requests' releases, "
            "by result (expired: the lease ran out under its request).\n"
            "# TYPE ratelimit_lease_releases_total counter\n"
            "ratelimit_lease_releases_total{result=\"ok\"} %llu\n"
            "ratelimit_lease_releases_total{result=\"expired\"} %llu\n"
            "ratelimit_lease_releases_total{result=\"error\"} %llu\n",
        (unsigned long long)get(&m->lease_released),
        (unsigned long long)get(&m->lease_expired),
        (unsigned long long)get(&m->lease_release_errors));
    return o.full ? 0 : o.used;
}
