/* SPDX-License-Identifier: MIT */
/*
 * Traces of the shapes users' traffic has, for the fair suites
 * (docs/fair.md, "Guarantees"): a heavy flow at 50 times the shared limit
 * beside light clients that come rarely at their own moments, page loads,
 * cron jobs in step, a scraper that comes and goes, a daily ramp, clients
 * joining and leaving.  The light clients' numbers scale with the limit
 * (the figures below are for 50 a second); the same limit, span and shape
 * give the same trace on every machine (header-only, static).
 */
#ifndef TEST_LIB_FAIR_SHAPES_H
#define TEST_LIB_FAIR_SHAPES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "rng.h"

#define SHAPE_SEC UINT64_C(1000000000)
#define SHAPE_EVENTS_MAX 200000u

typedef struct shape_ev {
    uint64_t t;
    uint32_t key;  /* 0: the heavy flow; others: light clients */
    bool light;
} shape_ev_t;

typedef enum shape {
    SHAPE_RARE,    /* 60 clients, each once every 6 s at its own moment */
    SHAPE_PAGES,   /* 4 clients, each a burst of 10-30 every few seconds */
    SHAPE_CRON,    /* 10 clients in the same millisecond every 6 s */
    SHAPE_SCRAPER, /* the heavy flow comes and goes; 2 steady light ones */
    SHAPE_DIURNAL, /* rare clients from none to 60 over the trace */
    SHAPE_CHURN,   /* light clients joining and leaving */
    SHAPES
} shape_t;

static const char *const shape_name[SHAPES] = {"rare",    "pages",
                                               "cron",    "scraper",
                                               "diurnal", "churn"};

typedef struct shape_trace {
    shape_ev_t ev[SHAPE_EVENTS_MAX];
    size_t n;
    uint64_t span; /* events fall in [0, span) */
} shape_trace_t;

static void shape_add(shape_trace_t *tr, uint64_t t, uint32_t key, bool light)
{
    if (t >= tr->span)
        return;
    if (tr->n >= SHAPE_EVENTS_MAX)
        abort(); /* a trace longer than the suites need */
    tr->ev[tr->n++] = (shape_ev_t){t, key, light};
}

/* The heavy flow: 50 times the limit, evenly, over [from, to). */
static void shape_heavy(shape_trace_t *tr, uint32_t limit, uint64_t from,
                        uint64_t to)
{
    uint64_t gap = SHAPE_SEC / (50 * (uint64_t)limit);
    for (uint64_t t = from; t < to; t += gap)
        shape_add(tr, t, 0, false);
}

static int shape_by_time(const void *a, const void *b)
{
    const shape_ev_t *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return (x->key > y->key) - (x->key < y->key);
}

/* n scaled from a limit of 50 a second to `limit`, at least 1. */
static uint32_t shape_scaled(uint32_t n, uint32_t limit)
{
    uint32_t m = n * limit / 50;
    return m ? m : 1;
}

/* Fills tr with shape s for a shared limit of `limit` a second over
 * `span` nanoseconds, in time order. */
static void shape_make(shape_trace_t *tr, shape_t s, uint32_t limit,
                       uint64_t span)
{
    tr->n = 0;
    tr->span = span;
    rnd_seed(1 + (uint64_t)s);
    switch (s) {
    case SHAPE_RARE:
        shape_heavy(tr, limit, 0, span);
        for (uint32_t k = 1; k <= shape_scaled(60, limit); k++)
            for (uint64_t t = rnd(6 * SHAPE_SEC); t < span; t += 6 * SHAPE_SEC)
                shape_add(tr, t, k, true);
        break;
    case SHAPE_PAGES:
        shape_heavy(tr, limit, 0, span);
        for (uint32_t k = 1; k <= 4; k++)
            for (uint64_t t = rnd(4 * SHAPE_SEC); t < span;
                 t += 4 * SHAPE_SEC + rnd(6 * SHAPE_SEC)) {
                uint64_t n = shape_scaled((uint32_t)(10 + rnd(21)), limit);
                for (uint64_t i = 0; i < n; i++) /* a request each 2 ms */
                    shape_add(tr, t + i * 2000000, k, true);
            }
        break;
    case SHAPE_CRON:
        shape_heavy(tr, limit, 0, span);
        for (uint64_t t = 3 * SHAPE_SEC + 250000000; t < span; t += 6 * SHAPE_SEC)
            for (uint32_t k = 1; k <= shape_scaled(10, limit); k++)
                shape_add(tr, t + k * 50000, k, true);
        break;
    case SHAPE_SCRAPER: /* 8 s on, 4 s off; light: 8 % of the limit */
        for (uint64_t t = 0; t < span; t += 12 * SHAPE_SEC)
            shape_heavy(tr, limit, t, t + 8 * SHAPE_SEC);
        for (uint32_t k = 1; k <= 2; k++)
            for (uint64_t t = k * 37000000; t < span;
                 t += SHAPE_SEC / 4 * 50 / limit)
                shape_add(tr, t, k, true);
        break;
    case SHAPE_DIURNAL: { /* client k starts at k/n of the trace */
        uint32_t n = shape_scaled(60, limit);
        shape_heavy(tr, limit, 0, span);
        for (uint32_t k = 1; k <= n; k++)
            for (uint64_t t = span / n * k + rnd(6 * SHAPE_SEC); t < span;
                 t += 6 * SHAPE_SEC)
                shape_add(tr, t, k, true);
        break;
    }
    case SHAPE_CHURN: /* each stays 5-10 s, asking once a second */
        shape_heavy(tr, limit, 0, span);
        for (uint32_t k = 1; k <= shape_scaled(20, limit); k++) {
            uint64_t from = rnd(span), to = from + 5 * SHAPE_SEC + rnd(5 * SHAPE_SEC);
            for (uint64_t t = from; t < to; t += SHAPE_SEC + rnd(SHAPE_SEC / 5))
                shape_add(tr, t, k, true);
        }
        break;
    case SHAPES: break;
    }
    qsort(tr->ev, tr->n, sizeof tr->ev[0], shape_by_time);
}

#endif
