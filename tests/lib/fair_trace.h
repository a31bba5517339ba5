/* SPDX-License-Identifier: MIT */
/*
 * The fair suites' traces: flows of evenly spaced requests, merged in time
 * order and decided by the suite's own function (a fair table in this
 * process, a child process's, a host of a Redis fleet), with what each
 * flow asked and was admitted counted (header-only, static).
 */
#ifndef TEST_FAIR_TRACE_H
#define TEST_FAIR_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef FAIR_TRACE_FLOWS_MAX
#define FAIR_TRACE_FLOWS_MAX 8
#endif

typedef struct flow {
    const char *name;
    uint32_t weight;
    uint64_t gap_ns; /* one request every gap_ns (demand) */
    uint64_t start_ns, stop_ns;
    int host;        /* which host decides its requests (a fleet's suite) */
    uint64_t asked, admitted;
    uint64_t asked_late, admitted_late; /* from 1 s on */
} flow_t;

/* Decides flow i's request at t: admitted or not. */
typedef bool (*fair_trace_decide_fn)(void *ctx, int i, const flow_t *fl,
                                     uint64_t t);

/* Runs the n flows' requests merged in time order over [0, end); records
 * the admitted requests' times in adm (if not NULL, room for cap); returns
 * how many it recorded. */
static inline size_t fair_trace_run(fair_trace_decide_fn decide, void *ctx,
                                    flow_t *fl, int n, uint64_t end,
                                    uint64_t *adm, size_t cap)
{
    uint64_t next[FAIR_TRACE_FLOWS_MAX];
    size_t na = 0;
    if (n > FAIR_TRACE_FLOWS_MAX)
        abort(); /* a suite's mistake: raise FAIR_TRACE_FLOWS_MAX */
    for (int i = 0; i < n; i++) {
        next[i] = fl[i].start_ns;
        fl[i].asked = fl[i].admitted = 0;
        fl[i].asked_late = fl[i].admitted_late = 0;
    }
    for (;;) {
        int k = -1;
        for (int i = 0; i < n; i++)
            if (next[i] < end && next[i] < fl[i].stop_ns &&
                (k < 0 || next[i] < next[k]))
                k = i;
        if (k < 0)
            break;
        uint64_t t = next[k];
        next[k] += fl[k].gap_ns;
        fl[k].asked++;
        fl[k].asked_late += t >= 1000000000u;
        if (decide(ctx, k, &fl[k], t)) {
            fl[k].admitted++;
            fl[k].admitted_late += t >= 1000000000u;
            if (adm != NULL && na < cap)
                adm[na++] = t;
        }
    }
    return na;
}

#endif
