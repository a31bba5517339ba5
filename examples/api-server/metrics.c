/* SPDX-License-Identifier: MIT */
/*
 * Metrics for the example server, fed by the limiter's listener.
 *
 * Decisions are counted per policy name and per reason in a small table
 * of policies, found by a linear scan of names and added with a
 * compare-and-set on the slot (no lock on the request path: the names are
 * the few of the rules file).  Counters are relaxed atomics; the
 * exposition reads them without stopping anyone, so a scrape is a
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
    atomic_uint_fast64_t allowed[N_REASONS], denied[N_REASONS];
} pslot_t;

/* Latency buckets, upper bounds in ns (and +Inf). */
static const uint64_t bounds_ns[] = {1000,   2000,   5000,    10000,
                                     20000,  50000,  100000,  250000,
                                     500000, 1000000, 5000000, 25000000};
#define N_BOUNDS (sizeof bounds_ns / sizeof bounds_ns[0])

struct metrics {
    pslot_t policy[MAX_POLICIES];
    atomic_uint_fast64_t store_errors, untracked;
    atomic_uint_fast64_t bucket[N_BOUNDS + 1], count, sum_ns;
    atomic_uint_fast64_t reloads, reload_errors;
};

int metrics_new(metrics_t **out)
{
    *out = calloc(1, sizeof **out);
    return *out != NULL ? 0 : -1;
}

void metrics_free(metrics_t *m)
{
    free(m);
}

static pslot_t *slot_for(metrics_t *m, const char *name)
{
    for (size_t i = 0; i < MAX_POLICIES; i++) {
        pslot_t *s = &m->policy[i];
        int st = atomic_load_explicit(&s->state, memory_order_acquire);
        if (st == 0) {
            int zero = 0;
            if (atomic_compare_exchange_strong(&s->state, &zero, 1)) {
                snprintf(s->name, sizeof s->name, "%s", name);
                atomic_store_explicit(&s->state, 2, memory_order_release);
                return s;
            }
            st = zero;
        }
        while (st == 1) /* another thread is writing this name */
            st = atomic_load_explicit(&s->state, memory_order_acquire);
        if (strcmp(s->name, name) == 0)
            return s;
    }
    return NULL;
}

void metrics_listen(void *ud, const rate_event_t *ev)
{
    metrics_t *m = ud;
    pslot_t *s = slot_for(m, ev->policy_name[0] ? ev->policy_name
                                                : "default");
    unsigned r = (unsigned)ev->reason < N_REASONS ? (unsigned)ev->reason : 0;

    if (ev->error != 0)
        atomic_fetch_add_explicit(&m->store_errors, 1, memory_order_relaxed);
    if (s == NULL) {
        atomic_fetch_add_explicit(&m->untracked, 1, memory_order_relaxed);
        return;
    }
    atomic_fetch_add_explicit(ev->allowed ? &s->allowed[r] : &s->denied[r], 1,
                              memory_order_relaxed);
}

void metrics_latency(metrics_t *m, uint64_t ns)
{
    size_t b = 0;

    while (b < N_BOUNDS && ns > bounds_ns[b])
        b++;
    atomic_fetch_add_explicit(&m->bucket[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->sum_ns, ns, memory_order_relaxed);
}

void metrics_reload(metrics_t *m, int ok)
{
    atomic_fetch_add_explicit(ok ? &m->reloads : &m->reload_errors, 1,
                              memory_order_relaxed);
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
            uint64_t a = get(&s->allowed[r]), d = get(&s->denied[r]);
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
        (unsigned long long)get(&m->store_errors));
    put(&o, "# HELP ratelimit_decision_seconds Time to decide a request "
            "(every policy it gets).\n# TYPE ratelimit_decision_seconds "
            "histogram\n");
    uint64_t cum = 0;
    for (size_t b = 0; b < N_BOUNDS; b++) {
        cum += get(&m->bucket[b]);
        put(&o, "ratelimit_decision_seconds_bucket{le=\"%g\"} %llu\n",
            (double)bounds_ns[b] / 1e9, (unsigned long long)cum);
    }
    cum += get(&m->bucket[N_BOUNDS]);
    put(&o, "ratelimit_decision_seconds_bucket{le=\"+Inf\"} %llu\n",
        (unsigned long long)cum);
    put(&o, "ratelimit_decision_seconds_sum %.9f\n",
        (double)get(&m->sum_ns) / 1e9);
    put(&o, "ratelimit_decision_seconds_count %llu\n",
        (unsigned long long)get(&m->count));
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
    return o.full ? 0 : o.used;
}
