/* SPDX-License-Identifier: MIT */
/*
 * The scheduler's own delay, measured beside a test that bounds a wall
 * time: a thread sleeps 1 ms at a time and records by how much it woke up
 * late.  On a loaded machine a runnable thread can wait that long for a
 * core, and so can the calls a test times; their bound is then the stated
 * one, plus a fixed slack, plus the worst delay the probe saw in the same
 * run (header-only, static).
 */
#ifndef TEST_SCHED_PROBE_H
#define TEST_SCHED_PROBE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

typedef struct sched_probe {
    pthread_t th;
    atomic_bool stop;
    _Atomic uint64_t worst_ns; /* the longest oversleep seen */
} sched_probe_t;

static inline uint64_t sched_probe_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void *sched_probe_run(void *arg)
{
    sched_probe_t *p = arg;
    const struct timespec ms = {0, 1000000};
    while (!atomic_load(&p->stop)) {
        uint64_t t0 = sched_probe_now();
        nanosleep(&ms, NULL);
        uint64_t late = sched_probe_now() - t0;
        late = late > 1000000u ? late - 1000000u : 0;
        if (late > atomic_load(&p->worst_ns))
            atomic_store(&p->worst_ns, late);
    }
    return NULL;
}

static inline void sched_probe_start(sched_probe_t *p)
{
    atomic_init(&p->stop, false);
    atomic_init(&p->worst_ns, 0);
    pthread_create(&p->th, NULL, sched_probe_run, p);
}

/* Stops the probe; returns the worst delay it saw, in ns. */
static inline uint64_t sched_probe_stop(sched_probe_t *p)
{
    atomic_store(&p->stop, true);
    pthread_join(p->th, NULL);
    return atomic_load(&p->worst_ns);
}

#endif
