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

/* The calling thread's call scope (call.h, rate__call_begin): 0
 * outside any, CALL_LAZY in one whose start is not taken yet, else the
 * start.  initial-exec: a plain thread-pointer access, no
 * __tls_get_addr call on every decision of the shared library. */
#define CALL_LAZY UINT64_MAX
static _Thread_local uint64_t call_start
    __attribute__((tls_model("initial-exec")));

uint64_t rate__call_begin(void)
{
    uint64_t prev = call_start;
    if (prev == 0)
        call_start = CALL_LAZY;
    return prev;
}

/* The outermost scope forgets its start; an inner one leaves it, taken
 * or not, to the outer one. */
void rate__call_end(uint64_t prev)
{
    if (prev == 0)
        call_start = 0;
}

uint64_t rate__call_start_ns(void)
{
    uint64_t s = call_start;
    if (s == 0 || s == CALL_LAZY) {
        uint64_t now = rate_clock_monotonic_ns();
        if (s == CALL_LAZY)
            call_start = now;
        return now;
    }
    return s;
}

uint64_t rate_clock_monotonic_ns(void)
{
    return read_clock(CLOCK_MONOTONIC);
}

static uint64_t wall_now(void *ud)
{
    (void)ud;
    return read_clock(CLOCK_REALTIME);
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

const rate_clock_t *rate_clock_exact(void)
{
    static const rate_clock_t exact = {rate__clock_exact, rate__clock_sleep,
                                       NULL};
    return &exact;
}

const rate_clock_t *rate_clock_wall(void)
{
    static const rate_clock_t wall = {wall_now, rate__clock_sleep, NULL};
    return &wall;
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
    if (call_start != 0)
        (void)rate__call_start_ns();
}
