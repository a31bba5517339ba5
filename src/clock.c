/* SPDX-License-Identifier: MIT */
/*
 * The library's clocks: CLOCK_MONOTONIC, exact, and its coarse twin, which
 * the kernel updates once a tick (a few ms) and which reads several times
 * faster.  Both count from the same origin, so times of the two may be
 * mixed; a coarse time is at most one tick behind the exact one.
 */
#include <errno.h>
#include <time.h>

#include "internal.h"

static uint64_t read_clock(clockid_t id)
{
    struct timespec ts;

    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * RATE_NS_PER_S + (uint64_t)ts.tv_nsec;
}

/* The calling thread's call scope (internal.h, rate__call_begin). */
_Thread_local uint64_t rate__call_start;

uint64_t rate_clock_monotonic_ns(void)
{
    return read_clock(CLOCK_MONOTONIC);
}

uint64_t rate_clock_coarse_ns(void)
{
    return read_clock(CLOCK_MONOTONIC_COARSE);
}

uint64_t rate__clock_exact(void *ud)
{
    (void)ud;
    return rate_clock_monotonic_ns();
}

uint64_t rate__clock_coarse(void *ud)
{
    (void)ud;
    return rate_clock_coarse_ns();
}

void rate__clock_sleep(void *ud, uint64_t ns)
{
    struct timespec req = {(time_t)(ns / RATE_NS_PER_S),
                           (long)(ns % RATE_NS_PER_S)},
                    rem;

    (void)ud;
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &req, &rem) == EINTR)
        req = rem;
}

const rate_clock_t *rate_clock_coarse(void)
{
    static const rate_clock_t coarse = {rate__clock_coarse, rate__clock_sleep,
                                        NULL};
    return &coarse;
}

uint64_t rate_deadline_begin(void)
{
    return rate__call_begin();
}

void rate_deadline_end(uint64_t token)
{
    rate__call_end(token);
}

void rate_deadline_start(void)
{
    if (rate__call_start != 0)
        (void)rate__call_start_ns();
}
